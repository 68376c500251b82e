#pragma once
// sluice::batch: groups items into batches; records are collated into one contiguous
// buffer with offsets (ragged records need no padding).

#include <sluice/core/bytes.hpp>
#include <sluice/core/detail/cpus.hpp>
#include <sluice/core/record.hpp>
#include <sluice/core/stage.hpp>
#include <sluice/formats/crc32c.hpp>
#include <sluice/ops/map.hpp>
#include <sluice/ops/plan_link.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

namespace sluice {

/// A batch of records collated on the host: record i is
/// data[offsets[i] .. offsets[i+1]).
struct host_batch {
    bytes data;
    std::vector<std::uint64_t> offsets;  // size() + 1 entries, offsets[0] == 0
    std::vector<std::shared_ptr<const shard>> sources;
    std::vector<std::uint64_t> indices;  // each record's ordinal within its shard

    /// Where this batch ends in the sequence: its records belong to `epoch`, and
    /// `position` records of that epoch have been batched up to and including this one
    /// (pipeline::state() saves it).
    std::uint32_t epoch = 0;
    std::uint64_t position = 0;

    /// What `data` is as a tensor, when the stage that made the batch knows
    /// (batch_images: {N, 3, H, W} or {N, H, W, 3} of uint8 or float32): the shape, and the
    /// element type as DLPack's type code and bits. to_dlpack uses them when given no
    /// layout. Empty shape: a batch of records, bytes.
    std::vector<std::int64_t> shape = {};
    std::uint8_t dtype_code = 1;  // kDLUInt
    std::uint8_t dtype_bits = 8;
    /// One label per item (batch_images), or empty.
    std::vector<std::int64_t> labels = {};

    std::size_t size() const noexcept { return offsets.empty() ? 0 : offsets.size() - 1; }
    std::span<const std::byte> operator[](std::size_t i) const noexcept {
        return data.span().subspan(offsets[i], offsets[i + 1] - offsets[i]);
    }
    std::size_t byte_size() const noexcept { return data.size(); }
    /// "url#index" of record i.
    std::string key(std::size_t i) const {
        return (sources[i] ? sources[i]->url : std::string("?")) + "#" + std::to_string(indices[i]);
    }
};

struct batch_options {
    std::size_t size = 32;
    /// Drop each epoch's last batch when it is smaller than `size` (keeps every step the
    /// same shape). Items that know their epoch (records, samples) are batched epoch by
    /// epoch: a batch never mixes two epochs.
    bool drop_last = false;
    /// Where collated batches live. When null: the memory the next stage asks for
    /// (to_device asks for its engine's staging memory, pinned with CUDA), else the
    /// runtime's recycling pool. sluice::pinned_memory() gives a pinned host sink.
    std::shared_ptr<buffer_source> memory = nullptr;
    /// Workers collating batches at once on the CPU pool (output stays in order). Above 1,
    /// grouping and collation become two stages ("group" and "batch"), so the copy into
    /// the batch buffer, the costly part, runs on several cores, each worker holding a
    /// batch of its own. A user's collate function (batch(opts, collate)) is then called
    /// on several threads at once, each worker calling its own copy of the function object.
    /// 0 (the default): one worker; for batch() of records where the process may run
    /// on two CPUs or more (its affinity mask, not the machine's count), a "group" stage
    /// feeds that worker, and a batch of 4 MiB or more is copied by it and one more thread
    /// of the CPU pool when the pool has two or more (the records split between them as
    /// they go, no batch buffer more in memory). Behind a shuffle the copy is what sets the
    /// pace: two threads on it took a first epoch of 100 KiB records from 0.62 to 0.78 x
    /// cat (bench/RESULTS.md, issue 17). 1: one thread copies each batch.
    unsigned concurrency = 0;
    /// Items that do not say their epoch (a user's type without a `source` shard): refused
    /// at start when plan runs several epochs (epoch_policy::apart), or batched as one
    /// stream, epochs mixing (ignore). Records and samples always know their epoch.
    epoch_policy epochs = epoch_policy::apart;
    /// Capacity of the output channel, in batches.
    channel_limits out = {4, 0};
};

namespace detail {
/// batch_options::concurrency with 0 (automatic: one worker, helped where it can be) resolved.
inline batch_options with_collators(batch_options o) {
    if (o.concurrency == 0) o.concurrency = 1;
    return o;
}

/// A group of items on its way to collation, with where it ends in the sequence (batch
/// with concurrency > 1: "group" makes them, "batch" collates them on several workers).
template <class T>
struct item_group {
    std::vector<T> items;
    std::uint32_t epoch = 0;
    std::uint64_t position = 0;
    /// Records only: the buffer the group stage copied the records' bytes into as they
    /// arrived (early_collation), where every record of the group lies, in order; else null.
    std::shared_ptr<const buffer> collated;
    std::size_t byte_size() const noexcept {
        std::size_t n = 0;
        for (auto& v : items) n += byte_size_of(v);
        return n;
    }
};

/// A TFRecord record whose data checksum was left to batch (record::unchecked_crc32c)
/// and does not match `sum`: the parser's error, shard and offset.
[[noreturn]] inline void bad_data_checksum(const record& r) {
    throw source_error(r.source ? r.source->url : std::string("?"),
                       bad_tfrecord_data(r.index) + " in", {}, r.offset);
}
/// Checks the records of a group batch drops (drop_last) that were left for it to check:
/// a corrupt record is an error whether or not its batch is kept, as when the parser checks.
template <class T>
void check_dropped(const std::vector<T>& group) {
    if constexpr (std::is_same_v<T, record>) {
        std::vector<std::byte> read;  // a record of a shard read by call, read from the page cache
        for (auto& r : group) {
            if (!r.unchecked_crc32c) continue;
            const std::byte* p = r.data.data();
            if (r.data.by_call()) {
                read.resize(r.data.size());
                r.data.copy_to(read.data(), 0, r.data.size());
                if (r.data.lost()) throw_lost(*r.data.file(), r.key());
                p = read.data();
            }
            if (crc32c_mask(crc32c(p, r.data.size())) != *r.unchecked_crc32c) bad_data_checksum(r);
        }
    }
}

/// Copies record `r`'s bytes to `p` (with streaming stores where `stream` and the record
/// is 4 KiB or more), summing its TFRecord data checksum as it copies when one was left
/// unchecked; false when that checksum is wrong. Collation and the copy on arrival both
/// copy through it.
/// A record of a shard that read left unmapped (file_mapping::by_call) is read from the
/// page cache with pread instead, then summed where the checksum was left: one copy, and
/// no page of the shard mapped into the process.
inline bool copy_record(std::byte* p, const record& r, bool stream) noexcept {
    const std::size_t size = r.data.size();
    if (r.data.by_call() && size) {
        r.data.copy_to(p, 0, size);  // lost bytes: zeros, marked
        return !r.unchecked_crc32c || crc32c_mask(crc32c(p, size)) == *r.unchecked_crc32c;
    }
    const bool streamed = stream && size >= 4096;
    if (r.unchecked_crc32c) return crc32c_mask(crc32c_copy(p, r.data.data(), size, 0, streamed)) == *r.unchecked_crc32c;
    if (size == 0) return true;
    if (streamed) stream_copy(p, r.data.data(), size);
    else std::memcpy(p, r.data.data(), size);
    return true;
}

/// One batch's copy, shared by the threads that make it: the collating worker and, for a
/// large batch, one helper on another thread of the CPU pool. Records are claimed in
/// blocks from one counter, so a helper that starts late takes only what is left and the
/// worker never waits on a queued task, only on blocks a running helper has claimed. A
/// record that fails (its data lost, or its TFRecord data checksum wrong) is remembered,
/// and the first in record order is reported, whichever thread copied it.
class collate_copy {
public:
    /// `populate`: `dst` is fresh memory (buffer::take_fresh); each thread faults in the
    /// pages of a block just before it copies the block.
    collate_copy(std::vector<record>& rs, std::byte* dst, const std::vector<std::uint64_t>& offsets, bool stream,
                 bool populate = false)
        : rs_(rs.data()), dst_(dst), offsets_(offsets.data()), n_(static_cast<std::uint32_t>(rs.size())),
          block_(std::max<std::uint32_t>(1, (n_ + 15) / 16)), stream_(stream), populate_(populate) {}

    /// Copies blocks until none is left; the records this thread copied.
    std::uint32_t work() noexcept {
        std::uint32_t mine = 0;
        for (;;) {
            const std::uint32_t i = next_.fetch_add(block_, std::memory_order_relaxed);
            if (i >= n_) break;  // nothing of the batch is touched past this point
            const std::uint32_t end = std::min(n_, i + block_);
            if (populate_) populate(dst_ + offsets_[i], offsets_[end] - offsets_[i]);
            for (std::uint32_t j = i; j < end; ++j)
                if (!copy_one(rs_[j], dst_ + offsets_[j])) {
                    std::uint32_t seen = bad_.load(std::memory_order_relaxed);
                    while (j < seen && !bad_.compare_exchange_weak(seen, j, std::memory_order_relaxed)) {
                    }
                }
            if (stream_) stream_fence();  // this thread's streaming stores, before they are counted
            mine += end - i;
            copied_.fetch_add(end - i, std::memory_order_release);
        }
        copied_.notify_all();
        return mine;
    }
    /// Returns once every record is copied (the blocks left are being copied by running
    /// threads); then the first record that failed, if one did.
    std::optional<std::size_t> wait() noexcept {
        for (std::uint32_t v; (v = copied_.load(std::memory_order_acquire)) < n_;) copied_.wait(v, std::memory_order_acquire);
        const std::uint32_t b = bad_.load(std::memory_order_relaxed);
        return b < n_ ? std::optional<std::size_t>(b) : std::nullopt;
    }

private:
    bool copy_one(const record& r, std::byte* p) const noexcept {
        const bool checked = copy_record(p, r, stream_);  // TFRecord's data checksum, left here: summed as copied
        return checked && !r.data.lost();                 // (lost: zeros copied)
    }

    record* rs_;
    std::byte* dst_;
    const std::uint64_t* offsets_;
    std::uint32_t n_, block_;
    bool stream_, populate_;
    std::atomic<std::uint32_t> next_{0}, copied_{0}, bad_{~std::uint32_t{0}};
};

/// Whether the collating workers take batch memory from their runtime's own pool (not a
/// device's staging memory, whose slots the group stage must not hold), shared between the
/// group and batch stages of one batch() recipe: the collating stage's setup notes its
/// runtime's pool here, and the group stage's setup, which runs after it (setups run last
/// stage first), asks once whether its own runtime's pool is noted; records are copied on
/// arrival only where it is (otherwise nothing is copied early). A recipe
/// may run in several pipelines, one after another or at once, so pools are kept per
/// runtime, weakly: a finished pipeline's pool is not kept alive.
class collation_memory {
public:
    void note(const std::shared_ptr<buffer_source>& pool) {
        std::lock_guard lock(m_);
        std::erase_if(pools_, [](const std::weak_ptr<buffer_source>& w) { return w.expired(); });
        for (auto& w : pools_)
            if (w.lock() == pool) return;
        pools_.push_back(pool);
    }
    bool noted(const std::shared_ptr<buffer_source>& pool) {
        std::lock_guard lock(m_);
        for (auto& w : pools_)
            if (w.lock() == pool) return true;
        return false;
    }

private:
    std::mutex m_;
    std::vector<std::weak_ptr<buffer_source>> pools_;
};

/// Batches this large are written with streaming stores (detail::stream_copy): they pay
/// off once the batch is well beyond the L2 cache.
inline constexpr std::size_t streamed_batch_bytes = std::size_t{4} << 20;

/// Copies each record into its batch's buffer as it joins the group, on the group
/// stage's thread, when the record alone holds a buffer of its own (a fetched object, a
/// file read whole; not a slice of a shared chunk or of a mapped file). Such a record
/// otherwise holds its buffer until the group is full: 256 of them, 25 MB for 100 KB
/// objects, which the fetch must then take fresh from the system (page faults on
/// libcurl's threads, which set the pace: bench/RESULTS.md, issue 17). Copied on arrival,
/// its bytes are still in the cache and its buffer goes back to the pool for the next
/// object. Records are copied in the order they join, so the batch is the buffer's first
/// bytes and collate_records has nothing left to copy. The buffer is sized from the last
/// whole group's bytes, in any epoch (the first: its first record times the batch size, at
/// most 64 MiB; allocate_varying adds a size class) and grows by half, moving what is in
/// it, when a group is larger.
/// Records that share or map their bytes (tar and TFRecord shards, behind a shuffle too)
/// are left to collation, which copies them on two threads, and so is a record that fails
/// its TFRecord checksum (collation reports it). Once one record of a group is left, so
/// is the rest of the group: the batch is copied whole, as before.
class early_collation {
public:
    /// How long a group waits for the last batch's buffer once its first eighth has
    /// joined (see add).
    static constexpr std::chrono::milliseconds wait_for_last{5};

    early_collation() = default;
    early_collation(const early_collation&) = default;
    early_collation(early_collation&&) = default;
    early_collation& operator=(const early_collation&) = default;
    early_collation& operator=(early_collation&&) = default;
    /// A buffer still held (a group cut short by a stop or dropped at an epoch's end) goes
    /// back to the pool with its streamed bytes ordered.
    ~early_collation() { stream_fence(); }
    /// `pool`: the group stage's runtime's pool, which the collator allocates from too
    /// (collation_memory says so before any stage runs; a default-made one copies nothing).
    /// `wait`: wait_for_last, other than in tests.
    early_collation(std::shared_ptr<buffer_source> pool, std::atomic<std::uint64_t>* copied,
                    std::chrono::steady_clock::duration wait = wait_for_last)
        : mem_(std::move(pool)), copied_(copied), wait_(wait) {}

    /// `group.back()` just joined a group of `n` records at most.
    void add(std::vector<record>& group, std::size_t n) {
        if (!mem_ || off_) return;
        whole_ = group.size() == n;
        if (!buf_) {
            // A group whose first record shares or maps its bytes is left whole to
            // collation: no memory is taken for it. Held from the pool until the group is
            // full, such memory kept a third batch buffer from the batch stage (tar shards
            // read by call: three batch buffers faulted in where two serve).
            if (!has_own_buffer(group.front())) {
                off_ = true;
                return;
            }
            // The first group's guess is bounded: one large record among small ones must
            // not ask for hundreds of times its size.
            const std::size_t first = std::max<std::size_t>(group.front().data.size(), 1);
            const std::size_t want = last_ ? last_ : std::min(first * n, std::max(first, first_guess_max));
            buf_ = mem_->allocate_kept(want);
            // None kept: the last batch's buffer is usually back in the pool once its
            // consumer has taken it, which happens while this group's first records arrive.
            // The group waits for it (its records held in their own buffers) until its
            // first eighth has joined and wait_ has passed since its first record, or
            // until half of it has joined; only then is fresh memory faulted in. Where the
            // consumer keeps up, a run then holds one batch buffer, not two (2,000 objects
            // of 100 KB: peak RSS 60 MB against 87 by medians). A count alone was not
            // enough: records that queued while the last group was collated join within a
            // fraction of a millisecond, and 10 runs of 14 over 2,000 objects faulted in a
            // second buffer, once 0.14 ms after the last batch went, its buffer back 0.5
            // ms later (0.2-2 ms in other runs; bench/RESULTS.md, issue 17, twenty-sixth
            // session). Not below the sizes a pool keeps (none would come back).
            if (!buf_ && !waiting_since_) waiting_since_ = std::chrono::steady_clock::now();  // cleared by take()
            if (!buf_ && last_ >= buffer_pool::min_pooled && !waited_enough(group.size(), n)) return;
            if (!buf_) buf_ = mem_->allocate_varying(want);
            // Sized from the last whole group (ragged records or an epoch's last group may
            // come out somewhat smaller), fresh memory is faulted in at once
            // (buffer::will_write); not from the first group's guess, which may be far above.
            if (last_) buf_->will_write(want);
            // Streamed (see copy_in) by the batch's expected size, as collation decides by
            // its size, not by the capacity the pool happened to give.
            stream_ = want >= streamed_batch_bytes;
            used_ = 0;
            for (std::size_t i = 0; i + 1 < group.size(); ++i)  // those that came before the memory
                if (!copy_in(group, i)) return;
        }
        copy_in(group, group.size() - 1);
    }
    /// After each batch of any epoch: an epoch opened later starts as a copy of this one,
    /// so its first group is sized from the last whole batch and waits for its buffer
    /// like any later group (from its first record's guess it faulted in a fresh buffer
    /// each epoch: bench/RESULTS.md, issue 17, seventeenth session).
    void size_from(const early_collation& last) noexcept {
        if (last.last_) last_ = last.last_;
    }
    /// The group is complete: the buffer its records lie in, in order (null when some were
    /// left for collation to copy). The next group starts a buffer of its own.
    std::shared_ptr<const buffer> take() {
        stream_fence();  // the streaming stores, before another thread reads the batch
        // Sized from whole groups: a short one (an epoch's last) counts only while there is
        // no other, so it does not mislead the next epoch's first group.
        if (!off_ && buf_ && (whole_ || !last_)) last_ = used_;
        whole_ = false;
        std::shared_ptr<const buffer> b = off_ ? nullptr : std::move(buf_);
        buf_.reset();
        used_ = 0;
        off_ = false;
        waiting_since_.reset();
        return b;
    }

private:
    // Whether a group of `size` records of `n` at most has waited long enough for the last
    // batch's buffer (see add).
    bool waited_enough(std::size_t size, std::size_t n) const {
        if (size >= std::max<std::size_t>(1, n / 2)) return true;
        return size >= std::max<std::size_t>(1, n / 8) && std::chrono::steady_clock::now() - *waiting_since_ >= wait_;
    }
    // Whether the record holds a buffer of its own, the records a group starts copying on
    // arrival with: it alone holds it, or it is more than half of it (at most one record of
    // a buffer is), and it is not a mapped file. Empty records hold none and pass. The
    // second case is a one-file shard's record while its parser still holds the chunk
    // until the shard's (empty) last one: by the count alone, whether the group saw the
    // record before or after the parser let go decided it, and a group that met one such
    // record left all its records to collation, holding their chunks meanwhile (2,000
    // one-file tars over HTTP: 1,825-1,832 of 2,000 copied on arrival and 97-109 MB peak
    // RSS in one run of four and one of eight, and 905-1,006 and 127-133 MB where tar read
    // straight from fetch; bench/RESULTS.md, issue 17, twenty-eighth session).
    static bool has_own_buffer(const record& r) {
        return r.data.size() == 0 ||
               (!r.data.file() && (r.data.owner_use_count() == 1 || r.data.size() * 2 > r.data.owner_capacity()));
    }
    bool copy_in(std::vector<record>& group, std::size_t i) {
        record& r = group[i];
        const std::size_t size = r.data.size();
        if (size == 0) {  // nothing to copy; a checksum left to batch is still checked
            if (r.unchecked_crc32c && crc32c_mask(crc32c(nullptr, 0)) != *r.unchecked_crc32c) {
                off_ = true;
                return false;
            }
            r.unchecked_crc32c.reset();
            return true;
        }
        // A record that shares its buffer leaves its group to collation while nothing is
        // copied yet (the buffer goes back at once). Once copies are made the buffer is the
        // group's either way, and collation would take a second one while this one waits
        // for nothing, so such a record is copied too (a one-sample shard's small file after
        // its large one, both slices of one chunk), and lets go of its chunk as collation
        // would have. A mapped file's records are always collation's (it reads them by call).
        if (!has_own_buffer(r) && (used_ == 0 || r.data.file())) {
            off_ = true;
            if (used_ == 0) buf_.reset();  // nothing copied yet (empty records before it): not held
            return false;
        }
        if (used_ + size > buf_->capacity()) grow(group, std::max(buf_->capacity() + buf_->capacity() / 2, used_ + size));
        std::byte* p = buf_->data() + used_;
        if (!copy_record(p, r, stream_)) {  // a wrong TFRecord checksum: left to collation, which reports it
            off_ = true;
            return false;
        }
        r.data = bytes(buf_, p, size);
        r.unchecked_crc32c.reset();  // checked as copied
        used_ += size;
        if (copied_) copied_->fetch_add(1, std::memory_order_relaxed);
        return true;
    }
    void grow(std::vector<record>& group, std::size_t want) {
        stream_fence();  // the old buffer goes back to the pool, for any thread to take
        auto bigger = mem_->allocate_varying(want);
        std::memcpy(bigger->data(), buf_->data(), used_);
        for (auto& r : group)
            if (r.data.owner() == buf_) r.data = bytes(bigger, bigger->data() + (r.data.data() - buf_->data()), r.data.size());
        buf_ = std::move(bigger);
    }

    static constexpr std::size_t first_guess_max = std::size_t{64} << 20;
    std::shared_ptr<buffer_source> mem_;            // null: nothing is copied early
    std::atomic<std::uint64_t>* copied_ = nullptr;  // the group stage's figure
    std::shared_ptr<buffer> buf_;
    std::size_t used_ = 0, last_ = 0;  // last_: the bytes of the last whole group (else the first)
    std::chrono::steady_clock::duration wait_ = wait_for_last;
    // When this group began to wait for the last batch's buffer: at its first record, which
    // found none kept; none while it has a buffer.
    std::optional<std::chrono::steady_clock::time_point> waiting_since_;
    bool whole_ = false;  // this group has reached the batch size
    bool off_ = false;
    bool stream_ = false;  // copy_in writes with streaming stores
};

/// Batches this large are copied by two threads when a helper is offered (the copy runs
/// well beyond the cache; below this a hand-off costs more than it saves).
inline constexpr std::size_t helped_collation_bytes = std::size_t{4} << 20;

/// `helper`: an executor (the CPU pool) on which one more thread may join a large batch's
/// copy; `helped`, where given, counts the records it copied.
inline host_batch collate_records(std::vector<record>& rs, buffer_source& mem, const executor* helper = nullptr,
                                  std::atomic<std::uint64_t>* helped = nullptr,
                                  std::shared_ptr<const buffer> collated = nullptr) {
    host_batch b;
    b.offsets.reserve(rs.size() + 1);
    b.sources.reserve(rs.size());
    b.indices.reserve(rs.size());
    std::uint64_t total = 0;
    b.offsets.push_back(0);
    bool ragged = false;
    for (auto& r : rs) {
        ragged = ragged || r.data.size() != rs.front().data.size();
        total += r.data.size();
        b.offsets.push_back(total);
    }
    // Copied as they arrived (early_collation): the batch is that buffer, nothing to copy.
    std::shared_ptr<const buffer> buf = std::move(collated);
    if (!buf) {
        // Records of different sizes make batches of different sizes: memory that may also
        // serve the next, larger batch (buffer_source::allocate_varying).
        auto fresh = ragged ? mem.allocate_varying(total) : mem.allocate(total);
        const bool stream = total >= streamed_batch_bytes;
        // Fresh memory is faulted in a block at a time by the thread that copies the block
        // (rather than all of it first, by this thread alone: where fresh pages are dear,
        // 2 s/GiB on a VM with paravirtual paging, that left the helper idle for most of a
        // first epoch's new batch buffers; bench/RESULTS.md, issue 17, thirtieth session).
        auto copy = std::make_shared<collate_copy>(rs, fresh->data(), b.offsets, stream, fresh->take_fresh());
        if (helper && total >= helped_collation_bytes && rs.size() >= 2)
            asio::post(*helper, [copy, helped] {
                const std::uint32_t n = copy->work();
                if (helped && n) helped->fetch_add(n, std::memory_order_relaxed);
            });
        copy->work();
        if (auto bad = copy->wait()) {
            const record& r = rs[*bad];
            if (r.data.lost()) throw_lost(*r.data.file(), r.key());
            bad_data_checksum(r);
        }
        buf = std::move(fresh);
    }
    for (auto& r : rs) {
        b.sources.push_back(std::move(r.source));
        b.indices.push_back(r.index);
    }
    b.data = bytes(std::move(buf), total);
    return b;
}

/// The batch stage's part in resuming: its settings define the sequence, and without a
/// shuffle before it, it is the stage that says which records are needed again. Items
/// that cannot keep epochs apart fail the start when plan runs several.
template <class T>
std::function<void(stage_setup&)> batch_setup(const batch_options& o) {
    return [o](stage_setup& s) {
        s.internal.run->note("batch", "size=" + std::to_string(o.size) + " drop_last=" + std::to_string(int(o.drop_last)));
        check_epochs_at_start<T>(s, "batch", o.epochs);
        if (auto at = s.internal.run->resume()) s.internal.run->request({at->epoch, {}, at->position});
        // A change of world size (merge_states) without a shuffle: each old rank had
        // delivered the first records of its share (a shuffle's setup, after this, says
        // otherwise).
        if (auto& rs = s.internal.run->resharded(); rs && rs->any_delivered()) {
            std::vector<detail::run_state::replay> old;
            for (auto p : rs->positions) old.push_back({rs->epoch, {}, p});
            s.internal.run->set_undelivered(std::move(old));
        }
    };
}

/// What a collate function that cannot take std::vector<T>& expects, for the compile
/// error: its element type when it takes a vector of something else, else its parameter
/// (or, for a generic one, the function itself).
template <class F, class T>
struct collate_mismatch {
    using produced = std::vector<T>&;
    using expected = F;
};
template <class F, class T>
    requires has_sole_arg<F>
struct collate_mismatch<F, T> {
    using arg = typename sole_arg<F>::type;
    template <class P>
    struct element {
        using type = void;
    };
    template <class E, class A>
    struct element<std::vector<E, A>> {
        using type = E;
    };
    using elem = typename element<std::remove_cvref_t<arg>>::type;
    static constexpr bool other_element = !std::is_void_v<elem> && !std::is_same_v<elem, T>;
    using produced = std::conditional_t<other_element, T, std::vector<T>&>;
    using expected = std::conditional_t<other_element, elem, arg>;
};

// `collate(group, epoch, position)` makes one output. `one_at_a_time`: after each send,
// wait until the output was taken before taking more input, so that the worker holds one
// group and the channel at most one (see collating_batch).
/// No copy on arrival (early_collation's stand-in for items that are not records).
struct no_early_collation {};

template <class T, class Out, class F, class Early = no_early_collation>
task<void> batch_worker(stage_context<T, Out>& ctx, batch_options o, F collate, bool one_at_a_time = false,
                        Early early = {}) {  // by value: a coroutine
    const std::size_t n = o.size ? o.size : 1;
    // Each open epoch: its partial batch and how many of its records arrived. In order
    // (deterministic) one is open at a time. With an unordered stage above, an epoch's
    // last records can arrive after the next epoch's first; when the epoch's size is known
    // (plan with record counts) its group stays open until all have arrived, so every
    // epoch still gives exactly ceil(size / n) batches (floor with drop_last) on every
    // rank, whatever the timing.
    struct open_epoch {
        std::vector<T> group;
        std::uint64_t seen = 0;       // records of the epoch arrived (= its position)
        std::uint64_t skip_below = 0;  // on resume without a replay plan: already delivered
        Early early;
    };
    constexpr bool copies_early = std::is_same_v<Early, early_collation>;
    std::map<std::uint32_t, open_epoch> open;
    auto open_at = [&](std::uint32_t e) -> open_epoch& {
        auto [it, fresh] = open.try_emplace(e);
        if (fresh) it->second.early = early;
        return it->second;
    };
    if (ctx.internal.run && ctx.internal.run->resume()) {
        auto& r = open_at(ctx.internal.run->resume()->epoch);
        if (ctx.internal.run->served()) r.seen = ctx.internal.run->resume()->position;
        else r.skip_below = ctx.internal.run->resume()->position;
    }
    if constexpr (!has_epoch<T>)
        if (ctx.internal.run)
            ctx.internal.run->epochs_unknown("the items reaching batch do not say which epoch they belong to; give them a "
                                    "`std::shared_ptr<const sluice::shard> source` member (copied from the record or "
                                    "sample they came from)");
    auto flush = [&](std::uint32_t e, open_epoch& g) -> Out {
        Out out = [&] {
            if constexpr (copies_early) {
                auto collated = g.early.take();
                early.size_from(g.early);  // an epoch opened later starts from the last whole batch's size
                return collate(g.group, e, g.seen, std::move(collated));
            } else {
                return collate(g.group, e, g.seen);
            }
        }();
        g.group.clear();
        if (ctx.internal.run) ctx.internal.run->push_stamp({e, g.seen});  // see pipeline::state()
        return out;
    };
    auto send = [&](Out v) -> task<void> {
        co_await ctx.out.send(std::move(v));
        if (one_at_a_time) co_await ctx.out.drained();
    };
    auto size_of = [&](std::uint32_t e) { return ctx.internal.run ? ctx.internal.run->epoch_records(e) : std::nullopt; };
    while (auto item = co_await ctx.in.next()) {
        const std::uint32_t e = epoch_of(*item).value_or(0);
        // Size unknown: an epoch ends when a later one begins.
        if (!size_of(e))
            while (!open.empty() && open.begin()->first < e) {
                auto& [f, g] = *open.begin();
                if (!g.group.empty() && !o.drop_last) co_await send(flush(f, g));
                else check_dropped(g.group);
                open.erase(open.begin());
            }
        auto& g = open_at(e);
        ++g.seen;
        if (g.seen > g.skip_below) {
            g.group.reserve(n);
            g.group.push_back(std::move(*item));
            if constexpr (copies_early) g.early.add(g.group, n);
            if (g.group.size() == n) co_await send(flush(e, g));
        }
        if (auto size = size_of(e); size && g.seen >= *size) {  // the epoch's last record
            if (!g.group.empty() && !o.drop_last) co_await send(flush(e, g));
            else check_dropped(g.group);
            open.erase(e);
        }
    }
    for (auto& [e, g] : open)
        if (!g.group.empty() && !o.drop_last) co_await send(flush(e, g));
        else check_dropped(g.group);
}
}  // namespace detail

namespace detail {
/// batch() for items collated into memory: `collate(std::vector<T>&, buffer_source&)`
/// gives the host_batch (its epoch and position are stamped here). One stage, or with
/// concurrency above 1 a "group" stage and `concurrency` ordered "batch" workers. The
/// memory: o.memory, else what the next stage asks for (to_device: its staging memory).
/// `checks`: collate checks record::unchecked_crc32c, and says so at setup. A collate that
/// also takes `(const executor* helper, std::atomic<std::uint64_t>* helped)` is offered the
/// CPU pool for a second thread on one batch when concurrency is automatic (0) and the
/// pool has two threads or more.
template <class T, class C>
stage<T, host_batch> collating_batch(batch_options o, C collate, bool checks = false) {
    // Records copied as they join their group (early_collation), where collate takes the
    // buffer they were copied into.
    constexpr bool copies_early = std::is_same_v<T, record> &&
                                  std::is_invocable_v<const C&, std::vector<T>&, buffer_source&, const executor*,
                                                      std::atomic<std::uint64_t>*, std::shared_ptr<const buffer>>;
    constexpr bool can_help = copies_early || std::is_invocable_v<const C&, std::vector<T>&, buffer_source&,
                                                                  const executor*, std::atomic<std::uint64_t>*>;
    const bool automatic = o.concurrency == 0;
    o = with_collators(o);
    auto stamped = [collate](std::vector<T>& g, buffer_source& mem, const executor* helper, std::atomic<std::uint64_t>* helped,
                             std::uint32_t e, std::uint64_t pos, std::shared_ptr<const buffer> collated = nullptr) {
        host_batch b;
        if constexpr (copies_early) b = collate(g, mem, helper, helped, std::move(collated));
        else if constexpr (can_help) b = collate(g, mem, helper, helped);
        else b = collate(g, mem);
        b.epoch = e;
        b.position = pos;
        return b;
    };
    // Automatic, where a batch's copy can be shared: grouping and one collating worker,
    // which a second thread of the CPU pool joins on large batches. Grouping (a channel
    // receive per record) then overlaps the copy, and the copy runs on two cores, with one
    // batch being collated as with one stage.
    const bool helped = automatic && can_help && detail::usable_cpus() >= 2;
    if (o.concurrency > 1 || helped) {
        using G = item_group<T>;
        struct group_run {
            bool one_at_a_time;
            bool early;
        };
        auto memory = std::make_shared<collation_memory>();
        auto group = make_stage<T, G>(
            // Room for one group when helped, the least that keeps the worker busy
            // (grouping is cheap) and the least held beside it.
            "group", {.on = pool::cpu, .out = {helped ? 1 : o.concurrency, 0}},
            [o, checks, helped, memory](stage_setup& s) {
                batch_setup<T>(o)(s);
                if (checks) note_record_checks(s.internal.run, s.internal.at, false);  // passes them on whole
                // Under a memory budget, helped: the next group is
                // filled only once the last one is being collated, so two groups' records
                // are held (the one collated, the one filled) and not a third waiting
                // between them. The collator still finds the next group ready.
                // Under a memory budget records are not copied on arrival: the batch
                // buffer would be taken while the group fills, which the budget's shares
                // do not foresee. The collator's setup, before this one, has noted its pool
                // if it allocates from this runtime's: asked once here, not per record.
                return std::make_shared<group_run>(
                    group_run{helped && s.internal.budgeted(), !s.internal.budgeted() && memory->noted(s.rt.buffers())});
            },
            [o](stage_context<T, G>& ctx, group_run& run) {
                if constexpr (copies_early)
                    return batch_worker<T, G>(
                        ctx, o,
                        [](std::vector<T>& g, std::uint32_t e, std::uint64_t pos, std::shared_ptr<const buffer> collated) {
                            return G{std::move(g), e, pos, std::move(collated)};
                        },
                        run.one_at_a_time,
                        run.early ? early_collation(ctx.rt.buffers(), &ctx.stats.counter("copied_on_arrival"))
                                  : early_collation());
                else
                    return batch_worker<T, G>(
                        ctx, o, [](std::vector<T>& g, std::uint32_t e, std::uint64_t pos) { return G{std::move(g), e, pos, {}}; },
                        run.one_at_a_time);
            });
        auto collated = gated_stage(make_stage<G, host_batch>(
            "batch", {.concurrency = o.concurrency, .order = ordering::ordered, .on = pool::cpu, .out = o.out},
            [checks, o, memory](stage_setup& s) {
                if (checks) note_record_checks(s.internal.run, s.internal.at, true);  // checks as it copies
                // Noted here, before any stage runs, so that the group stage copies on
                // arrival from its first group whenever the collator allocates from the
                // same pool (a note taken when a collating worker first ran came after two
                // whole groups once, on a busy machine).
                std::shared_ptr<buffer_source> mem = o.memory ? o.memory : s.internal.memory;
                if (!mem || mem == s.rt.buffers()) memory->note(s.rt.buffers());
            },
            [o, stamped, helped](stage_context<G, host_batch>& ctx) {
                std::shared_ptr<buffer_source> mem = o.memory ? o.memory : ctx.memory;
                std::optional<executor> helper;
                std::atomic<std::uint64_t>* count = nullptr;
                if (helped && ctx.rt.cpu_threads() >= 2) {
                    helper = ctx.rt.cpu_executor();
                    count = &ctx.stats.counter("helped_records");  // copied by the second thread
                }
                return item_worker(ctx, [mem, stamped, helper, count](G&& in, std::vector<host_batch>& out) {
                    G g = std::move(in);  // its records go once copied, not after the batch is sent
                    out.push_back(stamped(g.items, *mem, helper ? &*helper : nullptr, count, g.epoch, g.position,
                                          std::move(g.collated)));
                });
            }));
        return group | collated;
    }
    return make_stage<T, host_batch>(
        "batch", {.on = pool::cpu, .out = o.out},
        [o, checks](stage_setup& s) {
            batch_setup<T>(o)(s);
            if (checks) note_record_checks(s.internal.run, s.internal.at, true);
        },
        [o, stamped](stage_context<T, host_batch>& ctx) {
            std::shared_ptr<buffer_source> mem = o.memory ? o.memory : ctx.memory;
            return batch_worker<T, host_batch>(ctx, o, [mem, stamped](std::vector<T>& g, std::uint32_t e, std::uint64_t pos) {
                return stamped(g, *mem, nullptr, nullptr, e, pos);
            });
        });
}
}  // namespace detail

/// Takes: records. Gives: host_batch, `size` records collated into one contiguous buffer
/// with offsets, plus each record's source and index. Records of a shard that read left
/// unmapped (read by call, where nothing before batch reads their bytes: see io/local.hpp)
/// are read from the page cache straight into the batch.
/// Backpressure: holds one batch being filled plus `out` finished batches; with a "group"
/// stage (the automatic setting where the process may run on 2 CPUs or more, or
/// batch_options::concurrency above 1), also the group each worker collates and the full
/// groups waiting for them (one when automatic, else up to `concurrency`; under a memory
/// budget, automatic, the next group is filled only once the collator has taken the last):
/// records that keep their chunks or mapped pages alive.
/// Errors: upstream errors pass through after the batches before them; the partial batch
/// being filled is dropped with the error. A TFRecord record whose data checksum was left
/// to it (see tfrecord()) and fails is the parser's sluice::source_error, shard and offset,
/// in place of the batch that holds it (or, dropped by drop_last, when it is dropped).
/// Cancellation: stops at the next send; the partial batch is freed.
/// Example: `| sluice::batch({.size = 256, .drop_last = true})`
template <class = void>  // compiled only where used (see make_stage)
stage<record, host_batch> batch(batch_options o = {}) {
    return detail::collating_batch<record>(
        o,
        [](std::vector<record>& g, buffer_source& mem, const executor* helper, std::atomic<std::uint64_t>* helped,
           std::shared_ptr<const buffer> collated) {
            return detail::collate_records(g, mem, helper, helped, std::move(collated));
        },
        /*checks=*/true);
}

/// Takes: items of any type T. Gives: collate(std::vector<T>&) for each group of `size`
/// items (the vector is cleared afterwards; move out of it freely).
/// `concurrency` above 1: groups are collated on that many workers of the CPU pool, batches
/// still sent in order; each worker calls its own copy of `collate`, so copies must not
/// share unsynchronised state.
/// Epochs: as with records, a batch never mixes two epochs when T carries its `source`
/// shard (see shuffle); a T without one fails the start when plan runs several epochs,
/// unless `.epochs = sluice::epoch_policy::ignore`.
/// A collate that cannot take std::vector<T>& fails to compile with
/// sluice::detail::pipe_type_mismatch<T, E> (E: the element type it takes).
/// Example: `| sluice::batch({.size = 64}, [](std::vector<int>& v) { return sum(v); })`
template <class F>
auto batch(batch_options o, F collate) {
    o = detail::with_collators(o);
    auto make = [o, collate]<class T>() {
        if constexpr (!std::is_invocable_v<F&, std::vector<T>&>) {
            using why = detail::collate_mismatch<F, T>;
            static_assert(detail::pipe_type_mismatch<typename why::produced, typename why::expected>::value);
            return stage<T, T>{};
        } else {
            using Out = std::remove_cvref_t<std::invoke_result_t<F&, std::vector<T>&>>;
            static_assert(!std::is_void_v<Out>, "sluice::batch: the collate function must return the batch");
            if (o.concurrency > 1) {
                using G = detail::item_group<T>;
                auto group = make_stage<T, G>(
                    "group", {.on = pool::cpu, .out = {o.concurrency, 0}}, detail::batch_setup<T>(o),
                    [o](stage_context<T, G>& ctx) {
                        return detail::batch_worker<T, G>(ctx, o, [](std::vector<T>& g, std::uint32_t e, std::uint64_t pos) {
                            return G{std::move(g), e, pos, {}};
                        });
                    });
                auto collated = make_item_stage<G, Out>(
                    "batch", {.concurrency = o.concurrency, .order = ordering::ordered, .on = pool::cpu, .out = o.out},
                    [collate](G&& g, std::vector<Out>& out) mutable { out.push_back(collate(g.items)); });
                return group | collated;
            }
            return make_stage<T, Out>("batch", {.on = pool::cpu, .out = o.out}, detail::batch_setup<T>(o),
                                      [o, collate](stage_context<T, Out>& ctx) {
                                          return detail::batch_worker<T, Out>(
                                              ctx, o, [collate](std::vector<T>& g, std::uint32_t, std::uint64_t) mutable {
                                                  return collate(g);
                                              });
                                      });
        }
    };
    return detail::deferred<decltype(make)>{make};
}

template <class A>
stage<A, host_batch> batch(stage<A, record> upstream, batch_options o = {}) {
    return std::move(upstream) | batch(o);
}

}  // namespace sluice
