#pragma once
// gzip, one shard: inflates the shard's chunks into new chunks with zlib, member after
// member (a multi-member file, like `cat a.gz b.gz`, is one stream); zero bytes after a
// member are ignored, as gzip(1) does. Shards that are not gzip pass through untouched.

#include <sluice/formats/detail/cursor.hpp>

#include <zlib.h>

#include <cstring>
#include <span>
#include <string>
#include <system_error>

namespace sluice {

/// zlib's return codes (Z_DATA_ERROR for a broken stream, Z_BUF_ERROR for one cut short):
/// the code of a gzip failure's `error::code()`.
inline const std::error_category& zlib_category() noexcept {
    struct category final : std::error_category {
        const char* name() const noexcept override { return "zlib"; }
        std::string message(int c) const override { return zError(c); }
    };
    static const category c;
    return c;
}

/// Whether a format stage inflates its input.
enum class compression {
    /// Inflate shards whose name ends in ".gz" or whose bytes start with the gzip magic
    /// (1f 8b 08); pass the others through.
    detect,
    /// Never inflate.
    none,
    /// Always inflate (a shard that is not gzip is an error).
    gzip,
};

namespace detail {

inline bool ends_with_gz(const std::string& url) {
    std::string_view u(url);
    const auto q = u.find_first_of("?#");  // an URL's query is not part of the name
    if (q != std::string_view::npos) u = u.substr(0, q);
    return u.size() >= 3 && u.substr(u.size() - 3) == ".gz";
}

/// A gzip member's first bytes (magic, and deflate as the method).
inline constexpr unsigned char gzip_magic[3] = {0x1f, 0x8b, 0x08};
/// Whether bytes begin with gzip_magic, as compression::detect decides.
inline bool starts_gzip(std::span<const std::byte> head) noexcept {
    return head.size() >= 3 && std::memcmp(head.data(), gzip_magic, 3) == 0;
}

class gzip_inflater {
public:
    gzip_inflater() = default;
    gzip_inflater(const gzip_inflater&) = delete;
    gzip_inflater& operator=(const gzip_inflater&) = delete;
    ~gzip_inflater() {
        if (z_ready_) inflateEnd(&z_);
    }

    const parse_policy* pol = nullptr;
    std::shared_ptr<const shard> src;
    compression mode = compression::detect;
    std::size_t out_chunk = 4u << 20;

    /// Takes the shard's next chunk. A shard that is not gzip passes to `out` at once;
    /// otherwise call step() until it returns false.
    void start(chunk&& c, std::vector<chunk>& out) {
        if (state_ == state::undecided) {
            if (mode == compression::none) state_ = state::pass;
            else if (mode == compression::gzip || ends_with_gz(src->url)) state_ = state::inflate;
            else {
                // Decide on the first three bytes, which the first chunks may cut: head_
                // holds all of the earlier chunks (fewer than three bytes).
                std::byte probe[3] = {};
                std::size_t k = 0;
                for (std::size_t i = 0; i < head_.size() && k < 3; ++i) probe[k++] = head_[i];
                const std::size_t n = std::min<std::size_t>(3 - k, c.data.size());
                c.data.copy_to(probe + k, 0, n);  // by pread where read by call: its pages stay out of the process
                k += n;
                if (k < 3 && !c.last) {
                    head_.insert(head_.end(), c.data.data(), c.data.data() + c.data.size());
                    return;
                }
                state_ = starts_gzip(std::span<const std::byte>(probe, k)) ? state::inflate : state::pass;
            }
        }
        if (state_ == state::pass) {
            if (!head_.empty()) {  // the bytes held while deciding
                chunk h{src, 0, bytes::copy_of(head_, pol->mem), false, false};
                head_.clear();
                out.push_back(std::move(h));
            }
            out.push_back(std::move(c));
            return;
        }
        if (!z_ready_) {
            if (inflateInit2(&z_, 15 + 16) != Z_OK) throw error("sluice: zlib cannot start (out of memory?)");
            z_ready_ = true;
        }
        in_offset_ = c.offset - head_.size();
        if (!head_.empty()) {  // rare: the first chunks were tiny
            head_.insert(head_.end(), c.data.data(), c.data.data() + c.data.size());
            in_ = bytes::copy_of(head_);
            head_.clear();
        } else {
            in_ = std::move(c.data);
        }
        in_pos_ = 0;
        last_ = c.last;
        pending_ = true;
    }

    /// Inflates until one output chunk is full or the input chunk is used up (then, for
    /// the shard's last chunk, finishes). True when there is more to do: the caller
    /// delivers `out` between calls, so one input chunk never holds more than one output
    /// chunk in memory, however well it compresses.
    bool step(std::vector<chunk>& out) {
        if (!pending_) return false;
        while (in_pos_ < in_.size()) {
            const std::size_t before = out.size();
            const std::byte* p = in_.data() + in_pos_;
            const std::size_t n = in_.size() - in_pos_;
            const std::size_t used = state_ == state::scan ? scan(p, n) : inflate_some(p, n, out);
            in_pos_ += used;
            if (used == 0 && out.size() == before && state_ == state::inflate) {
                broken(out, "gzip stream makes no progress in", in_offset_);  // a guard: zlib always moves
                state_ = state::scan;
            }
            if (out.size() > before) return true;
        }
        pending_ = false;
        in_ = {};
        if (last_) finish(out);
        return false;
    }

private:
    enum class state { undecided, pass, inflate, scan } state_ = state::undecided;
    z_stream z_{};
    bool z_ready_ = false;
    bool member_open_ = false;
    bool pending_ = false;  // in_ has bytes to inflate
    bool last_ = false;     // in_ is the shard's last chunk
    bool gap_next_ = false; // the next output chunk follows lost bytes
    std::uint64_t member_start_ = 0;
    std::uint64_t member_out_ = 0;  // bytes the open member inflated to so far
    std::uint64_t in_offset_ = 0;   // compressed offset of the next input byte
    std::uint64_t out_offset_ = 0;  // uncompressed offset of out_[0]
    std::vector<std::byte> head_;
    bytes in_;
    std::size_t in_pos_ = 0;
    std::shared_ptr<buffer> out_;
    std::size_t fill_ = 0;
    int match_ = 0;  // bytes of the magic matched while scanning


    // After a skipped break: looks for the next member's magic; returns the bytes used.
    std::size_t scan(const std::byte* p, std::size_t n) {
        std::size_t i = 0;
        for (; i < n && match_ < 3; ++i) {
            const auto b = static_cast<unsigned char>(p[i]);
            match_ = b == gzip_magic[match_] ? match_ + 1 : (b == gzip_magic[0] ? 1 : 0);
        }
        in_offset_ += i;
        if (match_ < 3) return i;
        match_ = 0;
        state_ = state::inflate;
        inflateReset(&z_);
        const std::uint64_t resume = in_offset_;
        in_offset_ -= 3;  // the member starts at its magic
        std::vector<chunk> none;  // three header bytes give no output
        inflate_some(reinterpret_cast<const std::byte*>(gzip_magic), 3, none);
        in_offset_ = resume;
        return i;
    }

    // Inflates until the input is used up, an output chunk is full, or the stream
    // breaks; returns the bytes used.
    std::size_t inflate_some(const std::byte* p, std::size_t n, std::vector<chunk>& out) {
        std::size_t used = 0;
        if (!member_open_) {  // between members: skip zero padding
            while (used < n && p[used] == std::byte{0}) ++used;
            in_offset_ += used;
            if (used == n) return used;
            member_open_ = true;
            member_start_ = in_offset_;
            member_out_ = 0;
        }
        z_.next_in = reinterpret_cast<Bytef*>(const_cast<std::byte*>(p + used));
        z_.avail_in = static_cast<uInt>(std::min<std::size_t>(n - used, 1u << 30));
        const std::size_t given = z_.avail_in;
        if (!out_) {
            out_ = pol->mem ? pol->mem->allocate(out_chunk) : std::make_shared<buffer>(out_chunk);
            fill_ = 0;
        }
        z_.next_out = reinterpret_cast<Bytef*>(out_->data() + fill_);
        z_.avail_out = static_cast<uInt>(out_chunk - fill_);
        const int r = ::inflate(&z_, Z_NO_FLUSH);
        const std::size_t before = fill_;
        fill_ = out_chunk - z_.avail_out;
        member_out_ += fill_ - before;
        const std::size_t took = given - z_.avail_in;
        in_offset_ += took;
        if (member_out_ > pol->max_member_bytes && (r == Z_OK || r == Z_BUF_ERROR || r == Z_STREAM_END)) {
            // The output is given out one chunk at a time whatever the ratio, so this
            // bounds time and what one member may make, not memory.
            fill_ -= static_cast<std::size_t>(std::min<std::uint64_t>(fill_, member_out_ - pol->max_member_bytes));
            member_open_ = false;
            broken(out,
                   "gzip member inflating to more than " + std::to_string(pol->max_member_bytes) +
                       " bytes (raise it with gunzip's max_record_bytes) in",
                   member_start_);
            state_ = state::scan;
            match_ = 0;
        } else if (r == Z_STREAM_END) {
            member_open_ = false;
            inflateReset(&z_);
        } else if (r != Z_OK && r != Z_BUF_ERROR) {
            const std::string why = z_.msg ? z_.msg : zError(r);
            member_open_ = false;
            broken(out,
                   "broken gzip stream (" + why + ") in the member starting at byte " + std::to_string(member_start_) +
                       " of",
                   in_offset_, {r == Z_NEED_DICT ? Z_DATA_ERROR : r, zlib_category()});
            state_ = state::scan;  // skip policy: look for the next member
            match_ = 0;
        }
        if (fill_ == out_chunk) emit(out, false);
        return used + took;
    }

    void finish(std::vector<chunk>& out) {
        if (member_open_ && state_ == state::inflate)
            broken(out,
                   "truncated gzip stream (the shard ends inside the member starting at byte " +
                       std::to_string(member_start_) + ") in",
                   in_offset_, {Z_BUF_ERROR, zlib_category()});
        emit(out, true);
    }

    // A break: what was inflated before it goes out first; then the error, or under the
    // skip policy the count, and the next output chunk is flagged as following a gap.
    void broken(std::vector<chunk>& out, const std::string& what, std::uint64_t at, std::error_code code = {}) {
        emit(out, false);
        const source_error e = source_error(src->url, what, {}, at).with_code(code);  // the message stays as it is
        if (pol->corrupt == on_corrupt::error) throw e;
        if (pol->skipped) pol->skipped->fetch_add(1, std::memory_order_relaxed);
        if (pol->on_skip) pol->on_skip(e);
        gap_next_ = true;
    }

    void emit(std::vector<chunk>& out, bool last) {
        if (!last && !(out_ && fill_)) return;  // nothing to say
        bytes data;
        if (out_ && fill_) {
            // A small tail would pin a whole out_chunk buffer: copy it out.
            data = fill_ < out_chunk / 4 ? bytes::copy_of(std::span(out_->data(), fill_), pol->mem)
                                         : bytes(std::move(out_), fill_);
        }
        out_.reset();
        fill_ = 0;
        chunk c{src, out_offset_, std::move(data), last, true, gap_next_};
        gap_next_ = false;
        out_offset_ += c.data.size();
        out.push_back(std::move(c));
    }
};

/// Runs one inflater per shard.
class gunzip_decoder {
public:
    gunzip_decoder(std::shared_ptr<const parse_policy> pol, compression mode, std::size_t out_chunk)
        : pol_(std::move(pol)), mode_(mode), out_chunk_(out_chunk ? out_chunk : (4u << 20)) {}

    /// See gzip_inflater::start and step.
    void start(chunk&& c, std::vector<chunk>& out) {
        auto [it, fresh] = inflaters_.try_emplace(c.source.get());
        gzip_inflater& z = it->second;
        if (fresh) {
            z.pol = pol_.get();
            z.src = c.source;
            z.mode = mode_;
            z.out_chunk = out_chunk_;
        }
        current_ = it;
        last_ = c.last;
        guard([&] { z.start(std::move(c), out); });
    }
    bool step(std::vector<chunk>& out) {
        bool more = false;
        guard([&] { more = current_->second.step(out); });
        if (!more && last_) inflaters_.erase(current_);
        return more;
    }
    /// All of one input chunk at once (tests and fuzzers).
    void operator()(chunk&& c, std::vector<chunk>& out) {
        start(std::move(c), out);
        while (step(out)) {
        }
    }

private:
    template <class F>
    void guard(F f) {
        try {
            f();
        } catch (...) {
            inflaters_.erase(current_);
            throw;
        }
    }
    std::shared_ptr<const parse_policy> pol_;
    compression mode_;
    std::size_t out_chunk_;
    std::unordered_map<const shard*, gzip_inflater> inflaters_;
    std::unordered_map<const shard*, gzip_inflater>::iterator current_;
    bool last_ = false;
};

}  // namespace detail
}  // namespace sluice
