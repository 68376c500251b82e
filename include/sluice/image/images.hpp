#pragma once
// Image stages: decode_images (JPEG/PNG records or WebDataset samples -> augmented RGB
// images, on the CPU pool) and batch_images (images -> one uint8 or float32 tensor per
// batch, NCHW or NHWC, plus labels, collated straight into to_device's staging memory).
//
//   sluice::list("shards/{0000..0099}.tar") | sluice::plan({.epochs = 90, .seed = 17})
//     | sluice::read() | sluice::webdataset()
//     | sluice::decode_images({.size = 224, .concurrency = 6})
//     | sluice::shuffle({.buffer = 4096})
//     | sluice::batch_images({.size = 256, .dtype = sluice::pixel_type::float32,
//                             .mean = {0.485f, 0.456f, 0.406f}, .std = {0.229f, 0.224f, 0.225f}})
//     | sluice::to_device({.ring = 3})
//
// Determinism: an image's crop and flip are drawn from (seed, epoch, key) — key being the
// shard's URL and the sample key (or record index) — so they do not depend on which
// worker decodes it or when; the seed is `.seed`, else plan's.

#include <sluice/core/detail/json.hpp>
#include <sluice/core/record.hpp>
#include <sluice/core/stage.hpp>
#include <sluice/formats/decode.hpp>
#include <sluice/image/augment.hpp>
#include <sluice/image/codec.hpp>
#include <sluice/ops/batch.hpp>
#include <sluice/ops/plan_link.hpp>

#include <array>
#include <charconv>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace sluice {

/// One decoded, augmented image: height x width x 3 bytes of RGB (HWC), with its label
/// and where it came from (its `source` keeps epochs apart in shuffle and batch).
struct image {
    bytes pixels;
    std::uint32_t width = 0, height = 0;
    std::int64_t label = -1;
    std::shared_ptr<const shard> source;
    std::uint64_t index = 0;  // the record's or sample's ordinal in its shard
    std::size_t byte_size() const noexcept { return pixels.size(); }
};

enum class image_mode {
    /// torchvision's RandomResizedCrop(size) + RandomHorizontalFlip().
    train,
    /// Resize(resize) of the shorter side + CenterCrop(size).
    eval,
};

struct image_options {
    image_mode mode = image_mode::train;
    /// Output width and height.
    std::uint32_t size = 224;
    /// eval: the shorter side before the centre crop (torchvision's 256 for 224).
    std::uint32_t resize = 256;
    /// train: the random crop's area and aspect ranges (torchvision's defaults).
    imaging::random_crop crop = {};
    /// train: mirror left-right with probability 1/2.
    bool flip = true;
    /// Unset: plan's seed (0 without plan).
    std::optional<std::uint64_t> seed = std::nullopt;
    /// Samples: the fields that may hold the image, the first present is decoded.
    std::vector<std::string> fields = {"jpg", "jpeg", "png"};
    /// Samples: the field holding the label: a decimal integer ("cls", as WebDataset
    /// writes it), or a JSON object (e.g. "json") whose member `.label_key` is the integer;
    /// empty for none.
    std::string label_field = "cls";
    /// The member of a JSON label field that holds the label.
    std::string label_key = "label";
    /// Records (loose files), and samples when set: the label from the record's URL (or
    /// the sample's key), e.g. its directory's number. Unset: -1 for records.
    std::function<std::int64_t(const std::string&)> label_from = nullptr;
    /// Larger images are refused from their header (a decompression bomb is an error, not
    /// an allocation).
    std::uint64_t max_pixels = imaging::default_max_pixels;
    /// A corrupt, truncated, unsupported or over-large image: an error naming the shard,
    /// the key and the reason, or skipped and counted ("corrupt").
    sluice::on_corrupt on_corrupt = sluice::on_corrupt::error;
    std::function<void(const source_error&)> on_skip = nullptr;
    /// Images decoded at once on the CPU pool.
    unsigned concurrency = 1;
    ordering order = ordering::ordered;
    channel_limits out = {64, 0};
};

namespace detail {

struct image_run {
    image_options o;  // with the seed in effect
};

/// What decode_images needs of its input: the encoded image, its key, its label.
inline const bytes* image_field(const record& r, const image_options&) { return &r.data; }
inline const bytes* image_field(const sample& s, const image_options& o) {
    for (auto& f : o.fields)
        if (auto* b = s.find(f)) return b;
    return nullptr;
}
inline std::string image_key(const record& r) { return r.key(); }
inline std::string image_key(const sample& s) { return (s.source ? s.source->url : std::string("?")) + "#" + s.key; }
inline std::int64_t parse_label(const bytes& b, const image_options& o, const std::string& key) {
    auto v = b.view();
    auto trim = [](std::string_view& t) {
        while (!t.empty() && (t.back() == '\n' || t.back() == '\r' || t.back() == ' ' || t.back() == '\t')) t.remove_suffix(1);
        while (!t.empty() && (t.front() == '\n' || t.front() == '\r' || t.front() == ' ' || t.front() == '\t')) t.remove_prefix(1);
    };
    trim(v);
    std::string where = "label field '" + o.label_field + "' of " + key;
    if (!v.empty() && v.front() == '{') {
        std::optional<std::string_view> m;
        try {
            m = detail::json_object_reader(v).member(o.label_key);
        } catch (const detail::json_error& e) {
            throw imaging::bad_image(where + " is not valid JSON: " + e.what());
        }
        if (!m) throw imaging::bad_image(where + " has no member \"" + o.label_key + "\"");
        v = *m;
        where += " member \"" + o.label_key + "\"";
    }
    std::int64_t x = 0;
    auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
    if (ec != std::errc{} || p != v.data() + v.size() || v.empty()) throw imaging::bad_image(where + " is not an integer");
    return x;
}
inline std::int64_t image_label(const record& r, const image_options& o) {
    return o.label_from ? o.label_from(r.source ? r.source->url : std::string()) : -1;
}
inline std::int64_t image_label(const sample& s, const image_options& o) {
    if (o.label_from) return o.label_from(s.key);
    if (o.label_field.empty()) return -1;
    const bytes* b = s.find(o.label_field);
    if (!b) throw imaging::bad_image("sample " + image_key(s) + " has no label field '" + o.label_field + "'");
    return parse_label(*b, o, image_key(s));
}

/// Per worker: the decoder's scratch and the decoded crop, reused image after image.
struct image_worker_state {
    imaging::scratch scratch;
    imaging::plane crop;
};

template <class In>
image decode_one(const In& in, const image_options& o, image_worker_state& w, buffer_source& mem) {
    const bytes* data = image_field(in, o);
    if (!data) {
        std::string want;
        for (auto& f : o.fields) want += (want.empty() ? "" : ", ") + f;
        throw imaging::bad_image("no image field (looked for " + want + ")");
    }
    const auto encoded = std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(data->data()), data->size());
    const std::uint32_t epoch = in.source ? in.source->epoch : 0;
    auto r = imaging::image_rng(o.seed.value_or(0), epoch, image_key(in));
    // The crop comes from the header's size; the decoder reads the header once.
    auto region = [&](const imaging::header& h) {
        return o.mode == image_mode::train ? imaging::choose_random_crop(h.width, h.height, o.crop, r)
                                           : imaging::choose_center_crop(h.width, h.height, o.resize, o.size, o.size);
    };
    imaging::decode(encoded, region, o.size, o.size, w.crop, w.scratch, o.max_pixels);
    image out;
    out.width = out.height = o.size;
    const std::size_t n = std::size_t(o.size) * o.size * 3;
    auto buf = mem.allocate(n);
    buf->will_write(n);
    imaging::resize(w.crop, o.size, o.size, reinterpret_cast<std::uint8_t*>(buf->data()));
    if (o.mode == image_mode::train && o.flip && (r.next() >> 63))
        imaging::flip_horizontal(reinterpret_cast<std::uint8_t*>(buf->data()), o.size, o.size);
    out.pixels = bytes(std::move(buf), n);
    out.label = image_label(in, o);
    out.source = in.source;
    out.index = in.index;
    return out;
}

template <class In>
task<void> decode_images_worker(stage_context<In, image>& ctx, image_run& run) {
    const image_options& o = run.o;
    image_worker_state w;
    auto& corrupt = ctx.stats.counter("corrupt");
    co_await item_worker(ctx, [&](In&& in, std::vector<image>& out) {
        try {
            out.push_back(decode_one(in, o, w, *ctx.memory));
        } catch (const imaging::bad_image& e) {
            const std::string url = in.source ? in.source->url : std::string("?");
            source_error err(url, "image " + image_key(in) + ": " + e.what(), {}, in.offset);
            if (o.on_corrupt == sluice::on_corrupt::error) throw err;
            ++corrupt;
            if (o.on_skip) o.on_skip(err);
        }
    });
}

}  // namespace detail

/// Takes: records (loose JPEG/PNG files through raw(), or tar members) or samples
/// (webdataset()). Gives: sluice::image, `size` x `size` RGB, augmented per `mode`.
/// Runs `concurrency` decoders on the CPU pool; ordered by default.
/// Backpressure: each worker holds one encoded image and its decoded crop; then `out`.
/// Errors: a bad image is a sluice::source_error naming the shard, the key, the byte
/// offset and the reason (or, under on_corrupt::skip, counted in "corrupt").
/// Example: `| sluice::decode_images({.size = 224, .concurrency = 6})`
inline auto decode_images(image_options o = {}) {
    if (o.size == 0) throw error("sluice: decode_images: .size must be at least 1 pixel");
    auto make = [o]<class In>() {
        static_assert(std::is_same_v<In, record> || std::is_same_v<In, sample>,
                      "sluice::decode_images takes records (raw(), tar()) or samples (webdataset())");
        return detail::gated_stage(make_stage<In, image>(
            "decode_images", {.concurrency = std::max(1u, o.concurrency), .order = o.order, .on = pool::cpu, .out = o.out},
            [o](stage_setup& s) {
                auto run = std::make_shared<detail::image_run>();
                run->o = o;
                if (!o.seed)
                    detail::listen_for_plan(s, [run](const detail::plan_facts& f, detail::run_state&) {
                        run->o.seed = f.seed.value_or(0);
                    });
                // The stage's workers are the parallelism: OpenCV's own threads would
                // only compete with them.
                cv::setNumThreads(0);
                return run;
            },
            [](stage_context<In, image>& ctx, detail::image_run& run) { return detail::decode_images_worker<In>(ctx, run); }));
    };
    return detail::deferred<decltype(make)>{make};
}

enum class tensor_layout_kind { nchw, nhwc };
enum class pixel_type { uint8, float32 };

struct image_batch_options {
    std::size_t size = 256;
    bool drop_last = false;
    /// NCHW (PyTorch's) or NHWC.
    tensor_layout_kind layout = tensor_layout_kind::nchw;
    /// uint8 as decoded, or float32 normalised: (pixel / 255 - mean) / std per channel.
    pixel_type dtype = pixel_type::uint8;
    std::array<float, 3> mean = {0.f, 0.f, 0.f};
    std::array<float, 3> std = {1.f, 1.f, 1.f};
    /// As batch_options: where batches live (null: to_device's staging memory when it
    /// follows, else the runtime's pool), collating workers, epochs, output channel.
    std::shared_ptr<buffer_source> memory = nullptr;
    unsigned concurrency = 1;
    epoch_policy epochs = epoch_policy::apart;
    channel_limits out = {4, 0};
};

namespace detail {
inline host_batch collate_images(std::vector<image>& g, buffer_source& mem, const image_batch_options& o) {
    host_batch b;
    const std::uint32_t w = g.empty() ? 0 : g.front().width, h = g.empty() ? 0 : g.front().height;
    const std::size_t px = std::size_t(w) * h;
    const std::size_t elem = o.dtype == pixel_type::uint8 ? 1 : 4;
    const std::size_t per = px * 3 * elem;
    auto buf = mem.allocate(per * g.size());
    buf->will_write(per * g.size());
    std::byte* base = buf->data();
    std::array<float, 3> scale{}, shift{};
    for (int c = 0; c < 3; ++c) {
        scale[c] = 1.f / (255.f * o.std[c]);
        shift[c] = -o.mean[c] / o.std[c];
    }
    b.offsets.reserve(g.size() + 1);
    b.offsets.push_back(0);
    std::vector<std::uint8_t> planes;  // float32 NCHW: the image's planes before conversion
    for (std::size_t i = 0; i < g.size(); ++i) {
        const image& im = g[i];
        if (im.width != w || im.height != h)
            throw error("sluice: batch_images: images of different sizes in one batch (" + std::to_string(w) + "x" +
                        std::to_string(h) + " and " + std::to_string(im.width) + "x" + std::to_string(im.height) + ")");
        const auto* src = reinterpret_cast<const std::uint8_t*>(im.pixels.data());
        std::byte* dst = base + i * per;
        if (o.dtype == pixel_type::uint8) {
            if (o.layout == tensor_layout_kind::nhwc) {
                std::memcpy(dst, src, per);
            } else {  // HWC -> CHW: OpenCV's split deinterleaves with SIMD
                auto* d = reinterpret_cast<std::uint8_t*>(dst);
                const cv::Mat hwc(int(h), int(w), CV_8UC3, const_cast<std::uint8_t*>(src));
                cv::Mat planes[3] = {cv::Mat(int(h), int(w), CV_8UC1, d), cv::Mat(int(h), int(w), CV_8UC1, d + px),
                                     cv::Mat(int(h), int(w), CV_8UC1, d + 2 * px)};
                cv::split(hwc, planes);
            }
        } else {
            // (pixel / 255 - mean) / std. NCHW: OpenCV's SIMD split, then a SIMD conversion
            // per plane (71 -> 28 us an image at 224 x 224 against the scalar loop).
            auto* d = reinterpret_cast<float*>(dst);
            const cv::Mat hwc(int(h), int(w), CV_8UC3, const_cast<std::uint8_t*>(src));
            if (o.layout == tensor_layout_kind::nhwc) {
                // Blocks of 16 pixels against the channel pattern repeated: a fixed, contiguous
                // inner loop that compilers vectorise at -O3 (52 -> 38 us an image); OpenCV's
                // split + convert + merge measured slower here.
                constexpr std::size_t block = 48;
                float sc[block], sh[block];
                for (std::size_t j = 0; j < block; ++j) sc[j] = scale[j % 3], sh[j] = shift[j % 3];
                const std::size_t n = px * 3, whole = n / block * block;
                for (std::size_t k = 0; k < whole; k += block)
                    for (std::size_t j = 0; j < block; ++j) d[k + j] = float(src[k + j]) * sc[j] + sh[j];
                for (std::size_t k = whole; k < n; ++k) d[k] = float(src[k]) * sc[k % 3] + sh[k % 3];
            } else {
                planes.resize(px * 3);
                cv::Mat p8[3] = {cv::Mat(int(h), int(w), CV_8UC1, planes.data()),
                                 cv::Mat(int(h), int(w), CV_8UC1, planes.data() + px),
                                 cv::Mat(int(h), int(w), CV_8UC1, planes.data() + 2 * px)};
                cv::split(hwc, p8);
                for (int c = 0; c < 3; ++c) {
                    cv::Mat f(int(h), int(w), CV_32FC1, d + std::size_t(c) * px);
                    p8[c].convertTo(f, CV_32F, scale[c], shift[c]);
                }
            }
        }
        b.offsets.push_back((i + 1) * per);
        b.labels.push_back(im.label);
        b.sources.push_back(im.source);
        b.indices.push_back(im.index);
    }
    b.data = bytes(std::move(buf), per * g.size());
    const auto n = std::int64_t(g.size());
    b.shape = o.layout == tensor_layout_kind::nchw ? std::vector<std::int64_t>{n, 3, h, w}
                                                   : std::vector<std::int64_t>{n, h, w, 3};
    b.dtype_code = o.dtype == pixel_type::uint8 ? 1 /* kDLUInt */ : 2 /* kDLFloat */;
    b.dtype_bits = o.dtype == pixel_type::uint8 ? 8 : 32;
    return b;
}
}  // namespace detail

/// Takes: images. Gives: host_batch holding one tensor (shape and element type in
/// b.shape / b.dtype_*, which to_dlpack and device_batch::dlpack use) and b.labels.
/// Collated straight into to_device's staging memory when to_device follows. Epochs
/// never mix (as batch()); resumable.
/// Example: `| sluice::batch_images({.size = 256, .layout = sluice::tensor_layout_kind::nchw})`
template <class = void>  // compiled only where used (see make_stage)
stage<image, host_batch> batch_images(image_batch_options o = {}) {
    const batch_options bo{.size = o.size, .drop_last = o.drop_last, .memory = o.memory, .concurrency = o.concurrency,
                           .epochs = o.epochs, .out = o.out};
    return detail::collating_batch<image>(bo, [o](std::vector<image>& g, buffer_source& mem) {
        return detail::collate_images(g, mem, o);
    });
}

}  // namespace sluice
