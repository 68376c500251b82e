#pragma once
// What every record parser shares: a cursor over one shard's chunks, and the policy for
// corrupt input. No Asio here: the fuzz targets build the parsers alone.

#include <sluice/core/bytes.hpp>
#include <sluice/core/error.hpp>
#include <sluice/core/record.hpp>
#include <sluice/formats/detail/held.hpp>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include <sys/stat.h>

namespace sluice {

/// What a parser does with a corrupt record (bad checksum, truncated record, bad tar
/// header, broken gzip stream, garbage).
enum class on_corrupt {
    /// Fail the pipeline with a sluice::source_error naming the shard and byte offset
    /// (records before it are delivered first).
    error,
    /// Skip it, count it in the stage's "corrupt" counter, call on_skip, and go on with
    /// the next intact record (parsers scan forward for the next valid header).
    skip,
};

namespace detail {

/// A format's record boundaries in the files it has parsed whole, kept for the next
/// epoch, so that it need not read each header again (TFRecord from shards read by call:
/// one pread per record, which in a shuffled epoch of 100 KiB records was the parse's
/// largest cost; bench/RESULTS.md, issue 17, thirtieth session). A file is known by its
/// path, device, inode, size, and modification and status-change times (nanoseconds;
/// a write moves the second, which no program can set back): a file changed between
/// epochs is parsed afresh. One format worker uses it, made in its stage's body (no
/// lock: it must not move to state the workers of a run share). Bounded: at most
/// max_records entries of 16 bytes in all, each file charged its bookkeeping too (16
/// MiB); a parser collects a file's entries only while they fit (room()), and a file that
/// does not fit is parsed every epoch as before.
struct record_index {
    struct entry {
        std::uint64_t start = 0;   // the record's offset (its header)
        std::uint32_t length = 0;  // of its data
        std::uint32_t crc = 0;     // its stored (masked) data checksum
    };
    struct file_key {
        std::string path;
        std::uint64_t dev = 0, ino = 0, size = 0;
        std::int64_t mtime_ns = 0, ctime_ns = 0;
        bool operator==(const file_key&) const = default;
    };
    static constexpr std::size_t max_records = std::size_t{1} << 20;

    /// The key of the file an open descriptor reads; nullopt where fstat fails.
    static std::optional<file_key> key_of(const std::string& path, int fd) {
        struct stat st {};
        if (::fstat(fd, &st) != 0) return std::nullopt;
        auto ns = [](const timespec& t) { return std::int64_t{t.tv_sec} * 1'000'000'000 + t.tv_nsec; };
        return file_key{path, static_cast<std::uint64_t>(st.st_dev), static_cast<std::uint64_t>(st.st_ino),
                        static_cast<std::uint64_t>(st.st_size), ns(st.st_mtim), ns(st.st_ctim)};
    }
    /// The boundaries kept for `k`'s file, if they were kept for this very version of it.
    std::shared_ptr<const std::vector<entry>> find(const file_key& k) const {
        auto it = files_.find(k.path);
        return it != files_.end() && it->second.key == k ? it->second.entries : nullptr;
    }
    /// How many more entries a file parsed now could keep, its own bookkeeping charged.
    std::size_t room(const std::string& path) const noexcept {
        const std::size_t cost = overhead(path);
        return held_ + cost < max_records ? max_records - held_ - cost : 0;
    }
    /// Keeps a file's boundaries (a file parsed whole, without a fault), replacing what
    /// an older version of it left, if they fit. Best effort: what cannot be kept is
    /// dropped (a failed allocation too).
    void keep(const file_key& k, std::vector<entry> e) noexcept {
        if (auto it = files_.find(k.path); it != files_.end()) {
            held_ -= it->second.charged;
            files_.erase(it);
        }
        if (e.size() > room(k.path)) return;
        try {
            const std::size_t charged = e.size() + overhead(k.path);
            files_.emplace(k.path, kept{k, std::make_shared<const std::vector<entry>>(std::move(e)), charged});
            held_ += charged;
        } catch (...) {
        }
    }
    /// Entries held, each file's bookkeeping counted as entries.
    std::size_t records_held() const noexcept { return held_; }

private:
    struct kept {
        file_key key;
        std::shared_ptr<const std::vector<entry>> entries;
        std::size_t charged = 0;
    };
    // A file's map node, key, control block and vector, in entries of 16 bytes.
    static std::size_t overhead(const std::string& path) noexcept { return (256 + 2 * path.size()) / sizeof(entry); }
    std::unordered_map<std::string, kept> files_;
    std::size_t held_ = 0;
};

/// The part of a format's options the parser sees.
struct parse_policy {
    on_corrupt corrupt = on_corrupt::error;
    bool verify = true;  // checksums where the format has them
    /// TFRecord: leave the data checksum of records read in place (not inflated) to the
    /// batch that collates them (record::unchecked_crc32c; only under on_corrupt::error,
    /// see detail::records_checked_after), counting each in `deferred`.
    bool defer_data_crc = false;
    std::atomic<std::uint64_t>* deferred = nullptr;
    /// TFRecord, where it defers data checksums: boundaries kept from an earlier epoch
    /// (record_index), and the records given from them (the stage's "indexed" counter).
    std::shared_ptr<record_index> index;
    std::atomic<std::uint64_t>* indexed = nullptr;
    std::size_t max_record_bytes = std::size_t{1} << 30;
    std::atomic<std::uint64_t>* skipped = nullptr;  // the stage's "corrupt" counter
    std::atomic<std::uint64_t>* ignored = nullptr;  // WebDataset: files with no extension
    std::atomic<std::uint64_t>* incomplete = nullptr;  // WebDataset: samples dropped as cut by a loss
    std::vector<std::string> required;  // WebDataset: fields every sample must have
    /// gunzip: the most bytes one member may inflate to (no limit by default).
    std::uint64_t max_member_bytes = ~std::uint64_t{0};
    held_meter held;  // bytes held between chunks: the stage's "held_bytes" counters
    std::function<void(const source_error&)> on_skip;
    buffer_source* mem = nullptr;  // where records that straddle chunks are assembled
};

/// One shard's bytes as they arrive, chunk by chunk, read as one stream: gives views
/// that are slices of the current chunk when the bytes lie in it, and assembles them
/// (the only copy) when they straddle chunks, unless the chunks are windows of one
/// mapped file laid end to end (read's default), where the record is a view across them. Logical offsets count from the shard's start.
class byte_cursor {
public:
    /// Starts reading a new chunk. What the previous one left (a partial header in the
    /// stash, a partial record) carries over.
    void feed(const bytes& data) {
        cur_ = data;
        pos_ = 0;
        near_.clear();
        if (skip_) {
            const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(skip_, cur_.size()));
            pos_ = n;
            skip_ -= n;
        }
    }
    /// Offset of the next unread byte (of a record being assembled: of its first byte).
    std::uint64_t offset() const noexcept { return offset_; }
    /// The mapped file the current chunk is a window of, or null.
    const file_mapping* file() const noexcept { return cur_.file(); }
    /// The current chunk (a slice of it keeps its memory or mapping alive).
    const bytes& chunk_bytes() const noexcept { return cur_; }
    std::size_t chunk_left() const noexcept { return cur_.size() - pos_; }
    /// Nothing held between chunks: at the end of a shard, anything else is a truncation.
    bool empty() const noexcept { return stash_.empty() && !assembling_ && skip_ == 0; }

    /// A view of the next `n` bytes without consuming them, or nullptr when fewer have
    /// arrived (they are kept; call again after the next feed). For headers: small n.
    /// Valid until the next call of any kind (of a shard read by call it is a copy).
    const std::byte* peek(std::size_t n) {
        if (stash_.empty()) {
            if (chunk_left() >= n) return here(n);
            const std::byte* p = here(chunk_left());
            stash_.assign(p, p + chunk_left());
            pos_ = cur_.size();
            return nullptr;
        }
        if (stash_.size() < n) {
            const std::size_t add = std::min(n - stash_.size(), chunk_left());
            const std::byte* p = here(add);
            stash_.insert(stash_.end(), p, p + add);
            pos_ += add;
        }
        return stash_.size() >= n ? stash_.data() : nullptr;
    }

    /// Consumes `n` bytes; those not yet arrived are skipped as they come.
    void consume(std::uint64_t n) {
        offset_ += n;
        const std::size_t s = static_cast<std::size_t>(std::min<std::uint64_t>(n, stash_.size()));
        stash_.erase(stash_.begin(), stash_.begin() + static_cast<std::ptrdiff_t>(s));
        n -= s;
        const std::size_t c = static_cast<std::size_t>(std::min<std::uint64_t>(n, chunk_left()));
        pos_ += c;
        skip_ += n - c;
    }

    /// The next `n` bytes as one slice: of the chunk when they lie in it, else assembled
    /// in a buffer of their own once all have arrived (until then the pieces are held as
    /// slices of their chunks: a corrupt length field costs no allocation beyond the bytes
    /// that actually come). False while not all have arrived; call again with the same
    /// `n` after the next feed.
    bool take(std::size_t n, bytes& out) {
        if (!assembling_) {
            if (stash_.empty() && skip_ == 0 && chunk_left() >= n) {
                out = cur_.slice(pos_, n);
                pos_ += n;
                offset_ += n;
                return true;
            }
            // Nothing of it here yet: wait, so that a record lying whole in the next chunk
            // is a slice of it rather than a copy.
            if (stash_.empty() && chunk_left() == 0) return false;
            assembling_ = true;
            have_ = std::min(n, stash_.size());
            held_.set(have_);
            if (have_) parts_.push_back(bytes::copy_of(std::span(stash_.data(), have_)));
            stash_.erase(stash_.begin(), stash_.begin() + static_cast<std::ptrdiff_t>(have_));
        }
        const std::size_t add = std::min(n - have_, chunk_left());
        if (add) parts_.push_back(cur_.slice(pos_, add));
        have_ += add;
        pos_ += add;
        held_.set(have_);
        if (have_ < n) return false;
        if (bytes in_place = bytes::joined_in_place(parts_); in_place.file()) {
            out = std::move(in_place);  // consecutive windows of one mapped file: no copy
        } else {
            auto joined = mem_ ? mem_->allocate(n ? n : 1) : std::make_shared<buffer>(n ? n : 1);
            std::byte* d = joined->data();
            for (auto& part : parts_) {
                if (part.size()) std::memcpy(d, part.data(), part.size());
                d += part.size();
            }
            out = bytes(std::move(joined), n);
        }
        parts_.clear();
        assembling_ = false;
        have_ = 0;
        held_.set(0);
        offset_ += n;
        return true;
    }

    /// Bytes were lost before the next chunk (upstream skipped a corruption): forget
    /// everything held and count offsets on from `offset`.
    void restart(std::uint64_t offset) {
        stash_.clear();
        parts_.clear();
        assembling_ = false;
        have_ = 0;
        held_.set(0);
        skip_ = 0;
        offset_ = offset;
    }

    /// Consumed bytes that have not arrived yet are being skipped (a member's data or
    /// padding past the end of what was read).
    bool skipping() const noexcept { return skip_ != 0; }

    /// Where assembled records are allocated, and where the bytes held for one are counted.
    void use(buffer_source* mem, const held_meter* held = nullptr) noexcept {
        mem_ = mem;
        held_.use(held);
    }

private:
    /// The chunk's next `n` bytes (n <= chunk_left()). A window of a mapped file read
    /// by_call (file_mapping) is read with pread, at least near_bytes at a time, not through
    /// the mapping, whose pages are meant to stay out of the process: a header of each
    /// record is then a copy of a few hundred bytes, not a page mapped in (a tfrecord
    /// record's footer and the next header come in one read). Valid until the next call.
    const std::byte* here(std::size_t n) {
        if (!cur_.by_call() || n == 0) return cur_.data() + pos_;
        if (pos_ >= near_at_ && pos_ + n <= near_at_ + near_.size()) return near_.data() + (pos_ - near_at_);
        const std::size_t want = std::min(chunk_left(), std::max(n, near_bytes));
        near_.resize(want);
        // Bytes the file lost read as zeros, and the mapping is marked: decode_worker's
        // check after the parse reports them, as for a fault in the mapping.
        cur_.copy_to(near_.data(), pos_, want);
        near_at_ = pos_;
        return near_.data();
    }
    static constexpr std::size_t near_bytes = 512;

    bytes cur_;
    std::size_t pos_ = 0;
    std::uint64_t offset_ = 0;
    std::uint64_t skip_ = 0;
    std::vector<std::byte> stash_;  // the start of a header cut by a chunk boundary
    std::vector<std::byte> near_;   // read by_call: the chunk's bytes from near_at_ on
    std::size_t near_at_ = 0;
    std::vector<bytes> parts_;  // of a record cut by chunk boundaries
    std::size_t have_ = 0;
    bool assembling_ = false;
    buffer_source* mem_ = nullptr;
    held_count held_;  // have_, in the stage's held_bytes
};

/// `b` as bytes a parser may read: itself, or, for a slice of a file mapped by call, a
/// copy read with pread, so that the file's pages stay out of the process (a member's
/// body that the parser reads: a tar long name or pax header). Lost bytes read as zeros
/// and mark the mapping, which decode_worker then reports.
inline bytes readable(const bytes& b) {
    if (!b.by_call() || b.empty()) return b;
    auto copy = std::make_shared<buffer>(b.size());
    b.copy_to(copy->data(), 0, b.size());
    return bytes(std::move(copy), b.size());
}

inline std::uint32_t le32(const std::byte* p) noexcept {
    const auto* u = reinterpret_cast<const unsigned char*>(p);
    return std::uint32_t{u[0]} | std::uint32_t{u[1]} << 8 | std::uint32_t{u[2]} << 16 | std::uint32_t{u[3]} << 24;
}
inline std::uint64_t le64(const std::byte* p) noexcept {
    return std::uint64_t{le32(p)} | std::uint64_t{le32(p + 4)} << 32;
}

/// Reports a corruption: throws under on_corrupt::error; under skip, counts it, tells
/// on_skip and returns so the parser can resynchronise.
inline void corrupt(const parse_policy& pol, const shard& src, bool inflated, const std::string& what,
                    std::uint64_t offset) {
    source_error e(src.url, what + " in", {}, offset, inflated ? "of the uncompressed stream" : "");
    if (pol.corrupt == on_corrupt::error) throw e;
    if (pol.skipped) pol.skipped->fetch_add(1, std::memory_order_relaxed);
    if (pol.on_skip) pol.on_skip(e);
}

/// What each format's parser of one shard has: the policy, the shard, its cursor.
/// A parser adds `void parse(std::vector<Out>&)` (consume what the cursor holds),
/// `void finish(std::vector<Out>&)` (the shard ended) and `void reset()` (bytes were lost
/// upstream: drop the record in progress and expect a header next).
struct parser_base {
    const parse_policy* pol = nullptr;
    std::shared_ptr<const shard> src;
    bool inflated = false;
    byte_cursor cur;

    void bad(const std::string& what, std::uint64_t offset) const { corrupt(*pol, *src, inflated, what, offset); }
};

/// Runs one parser per shard, so chunks of several shards may interleave.
template <class Parser, class Out>
class shard_parsers {
public:
    explicit shard_parsers(std::shared_ptr<const parse_policy> pol) : pol_(std::move(pol)) {}

    void operator()(chunk&& c, std::vector<Out>& out) {
        auto [it, fresh] = parsers_.try_emplace(c.source.get());
        Parser& p = it->second;
        if (fresh) {
            p.pol = pol_.get();
            p.src = c.source;
            p.inflated = c.inflated;
            p.cur.use(pol_->mem, &pol_->held);
        }
        try {
            if (c.gap) {  // upstream lost bytes (and counted it): start afresh here
                p.cur.restart(c.offset);
                p.reset();
            }
            p.cur.feed(c.data);
            p.parse(out);
            if (c.last) p.finish(out);
        } catch (...) {
            parsers_.erase(it);
            throw;
        }
        if (c.last) parsers_.erase(it);
    }

private:
    std::shared_ptr<const parse_policy> pol_;
    std::unordered_map<const shard*, Parser> parsers_;
};

}  // namespace detail
}  // namespace sluice
