#pragma once
// How plan counts records itself (plan_options::counts unset, world > 1): the stages after
// it offer what each knows, at setup, through the run's state (run_state::slot):
// - the reader (read, fetch) offers access to a shard's bytes by offset: its size and
//   version (mtime, ETag), and ranged reads (pread, an HTTP Range request);
// - the decoder (tar, webdataset, tfrecord, recordio, lines, raw) offers a counter that
//   walks one shard through that access, reading only what locates its records (tar
//   headers, TFRecord and RecordIO length fields; every byte only for lines).
// Plan (ops/plan.hpp) runs them at its start and keeps what they count in a counts file
// (ops/counting.hpp). Setups run last stage first, so both are there by plan's setup.
// A layer's concerns stay in that layer: core holds only these interfaces.

#include <sluice/core/error.hpp>
#include <sluice/core/state.hpp>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <map>
#include <mutex>
#include <stop_token>
#include <string>
#include <system_error>
#include <vector>

namespace sluice::detail {

/// What identifies one version of a shard: its size and a version (a local file's mtime,
/// an object's ETag or Last-Modified; empty when the store gives none).
struct shard_facts {
    std::uint64_t size = 0;
    std::string version;
};

/// A reader's access to shards by offset. One per counting thread (a remote one keeps its
/// connection); calls block. Errors are sluice::source_error naming the URL.
class shard_access {
public:
    virtual ~shard_access() = default;
    virtual shard_facts facts(const std::string& url) = 0;
    /// Reads [offset, offset + n) into `into`; fewer bytes only where the shard ends.
    virtual std::size_t read(const std::string& url, std::uint64_t offset, std::byte* into, std::size_t n) = 0;
    /// Bytes worth asking for at once: a local read of 64 KiB costs about what one of
    /// 512 bytes does; a remote request's bytes cross a network link the job shares, so
    /// remote access asks for less (and runs more shards at once to hide the latency).
    virtual std::size_t window() const { return 64u << 10; }
    /// Shards worth counting at once.
    virtual unsigned parallel() const { return 8; }
};

/// The bytes of one shard as a counter sees them: at(offset, n) gives n bytes there
/// (nullptr where the shard ends first), reading a window at a time, so that headers
/// close together cost one read and a skipped record's data none.
class shard_reader {
public:
    shard_reader(shard_access& a, std::string url, std::uint64_t size, std::stop_token stop = {})
        : a_(a), url_(std::move(url)), size_(size), stop_(std::move(stop)) {}

    const std::string& url() const noexcept { return url_; }
    std::uint64_t size() const noexcept { return size_; }
    /// Bytes read so far, for the figures ("count_bytes").
    std::uint64_t bytes_read() const noexcept { return read_; }

    const std::byte* at(std::uint64_t offset, std::size_t n) {
        if (offset > size_ || n > size_ - offset) return nullptr;
        if (offset >= from_ && offset + n <= from_ + buf_.size()) return buf_.data() + (offset - from_);
        if (stop_.stop_requested()) throw stopped{};
        const std::size_t want = static_cast<std::size_t>(
            std::min<std::uint64_t>(std::max(n, a_.window()), size_ - offset));
        buf_.resize(want);
        const std::size_t got = a_.read(url_, offset, buf_.data(), want);
        read_ += got;
        buf_.resize(got);
        from_ = offset;
        if (got < n)
            throw source_error(url_, "cannot count records: the shard ended early (it was " + std::to_string(size_) +
                               " bytes when counting began; changed meanwhile?) in", {}, offset + got);
        return buf_.data();
    }

private:
    shard_access& a_;
    std::string url_;
    std::uint64_t size_;
    std::stop_token stop_;
    std::vector<std::byte> buf_;
    std::uint64_t from_ = 0;
    std::uint64_t read_ = 0;
};

/// A decoder's counter: the records `r`'s shard yields, as that decoder numbers them.
using record_counter = std::function<std::uint64_t(shard_reader& r)>;

/// From a reader's setup (stage_setup::internal.at is `at`): offers its access (the
/// reader nearest plan, whose setup runs last, is the one plan uses).
inline void offer_access(run_state* run, std::size_t at, std::string reader,
                         std::function<std::unique_ptr<shard_access>(std::stop_token)> f, std::string cache_dir = {});

/// What the stages after plan offered, in the run's state under "counting".
struct counting_board {
    std::mutex m;
    /// The reader's: a fresh access per counting thread (its blocking calls end soon
    /// after `stop`); null when no reader offered one.
    std::function<std::unique_ptr<shard_access>(std::stop_token stop)> access;
    std::string reader;  // "read", "fetch"
    /// fetch's cache directory, where plan keeps its counts file unless told otherwise.
    std::string cache_dir;
    /// The first decoder's (nearest plan): its name keys the counts ("tar" and
    /// "webdataset" count the same file differently).
    record_counter count;
    std::string format;
    /// Where they sit in the chain: the counter walks the reader's bytes, so it is used
    /// only when the decoder takes them as read, or through stages that pass the bytes
    /// of the shards they can count untouched (`passing`, by place: a gunzip, which
    /// passes shards that are not gzip'd, and whose check refuses the gzip'd ones). Any
    /// other stage between them (a decryption, a stage of the user's) may change the
    /// bytes: then plan cannot count.
    std::size_t access_at = 0, count_at = 0;
    std::map<std::size_t, std::function<void(shard_reader&)>> passing;
    bool adjacent() const {
        if (!access || !count || count_at <= access_at) return false;
        for (std::size_t i = access_at + 1; i < count_at; ++i)
            if (!passing.count(i)) return false;
        return true;
    }
    /// The checks of the stages between reader and decoder, for one shard (throw to refuse it).
    std::vector<std::function<void(shard_reader&)>> checks_between() const {
        std::vector<std::function<void(shard_reader&)>> out;
        for (auto& [at, check] : passing)
            if (at > access_at && at < count_at) out.push_back(check);
        return out;
    }
};

inline void offer_access(run_state* run, std::size_t at, std::string reader,
                         std::function<std::unique_ptr<shard_access>(std::stop_token)> f, std::string cache_dir) {
    if (!run) return;
    auto b = run->slot<counting_board>("counting");
    std::lock_guard lock(b->m);
    b->access = std::move(f);
    b->access_at = at;
    b->reader = std::move(reader);
    b->cache_dir = std::move(cache_dir);
}

/// From a decoder's setup (at `at`): offers its counter (the decoder nearest plan wins,
/// as above).
inline void offer_counter(run_state* run, std::size_t at, std::string format, record_counter count) {
    if (!run) return;
    auto b = run->slot<counting_board>("counting");
    std::lock_guard lock(b->m);
    b->count = std::move(count);
    b->count_at = at;
    b->format = std::move(format);
}

/// From the setup of a stage (at `at`) that passes the bytes of the shards a counter can
/// count untouched; `check` refuses (throws for) a shard it would change.
inline void offer_passing(run_state* run, std::size_t at, std::function<void(shard_reader&)> check) {
    if (!run) return;
    auto b = run->slot<counting_board>("counting");
    std::lock_guard lock(b->m);
    b->passing[at] = std::move(check);
}

}  // namespace sluice::detail
