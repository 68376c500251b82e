#pragma once
// Image decoding: JPEG with libjpeg-turbo (its libjpeg API), PNG with libspng.
//
// What the augmentation stages need of a decoder is a region, not an image: a random
// crop of a 500x375 photo to 224x224 needs about half the pixels, at half the scale when
// the crop is at least twice the output. So decode() takes the crop (in the image's
// displayed orientation) and a minimum output size, and for JPEG
// - reads the header only, to know the size (read_header),
// - decodes at 1/2, 1/4 or 1/8 scale with libjpeg's DCT scaling when the crop stays at
//   least the minimum size at that scale (the cheapest way to shrink: fewer coefficients
//   transformed, fewer pixels converted),
// - decodes only the crop's columns (jpeg_crop_scanline, from the iMCU boundary before
//   them) and skips the rows above it (jpeg_skip_scanlines) and stops below it.
// PNG has no such shortcut: it is decoded whole and the crop copied out.
//
// Colour: everything becomes 8-bit RGB. JPEG grayscale is expanded by libjpeg, CMYK and
// YCCK (Adobe, inverted) are converted here; PNG palette, grayscale, 16-bit and alpha by
// libspng (alpha is dropped, as PIL's convert("RGB") does). EXIF orientation (JPEG APP1,
// PNG eXIf) is applied: sizes and crops are in the displayed orientation.
//
// Bad input never ends the process: libjpeg's error_exit (which calls exit() by default)
// returns here through longjmp from functions that hold no C++ objects, and becomes an
// imaging::bad_image naming the reason. A JPEG that libjpeg warns about damaged data
// (premature end, corrupt Huffman data: it would fill the rest with grey) is an error too,
// stricter than PIL; warnings about metadata in the header are not (see emit_message).
// Sizes over `max_pixels` are refused from the header, before the image is decoded.

#include <sluice/core/error.hpp>

#include <algorithm>
#include <csetjmp>
#include <cstddef>
#include <cstdint>
#include <cstdio>  // jpeglib.h needs FILE
#include <cstring>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include <jpeglib.h>
#include <jerror.h>  // the warning codes (JWRN_*) told apart in emit_message
// jerror.h's macros (ERREXIT, WARNMS, TRACEMS...) are libjpeg's internals: not for users.
#undef MAKESTMT
#undef ERREXIT
#undef ERREXIT1
#undef ERREXIT2
#undef ERREXIT3
#undef ERREXIT4
#undef ERREXIT6
#undef ERREXITS
#undef WARNMS
#undef WARNMS1
#undef WARNMS2
#undef TRACEMS
#undef TRACEMS1
#undef TRACEMS2
#undef TRACEMS3
#undef TRACEMS4
#undef TRACEMS5
#undef TRACEMS8
#undef TRACEMSS
#include <spng.h>

namespace sluice::imaging {

/// An image the decoder cannot read: corrupt, truncated, unsupported, or too large. The
/// message says why; the stage adds the shard and sample key.
class bad_image : public error {
public:
    using error::error;
};

enum class format { jpeg, png };

inline const char* format_name(format f) { return f == format::jpeg ? "JPEG" : "PNG"; }

/// What the header says. `width` and `height` are as displayed (after EXIF orientation);
/// `orientation` is the EXIF value, 1 (as stored) to 8.
struct header {
    format fmt = format::jpeg;
    std::uint32_t width = 0, height = 0;
    int orientation = 1;
};

/// A rectangle in displayed coordinates.
struct rect {
    std::uint32_t x = 0, y = 0, w = 0, h = 0;
};

/// 8-bit RGB pixels, rows of w * 3 bytes, no padding.
struct plane {
    std::vector<std::uint8_t> px;
    std::uint32_t w = 0, h = 0;
};

/// The default limit on decoded pixels: 256 megapixels (16384 x 16384), far above any
/// training photo and far below what a decompression bomb asks for.
inline constexpr std::uint64_t default_max_pixels = 256ull << 20;

namespace detail {

inline bool is_jpeg(std::span<const std::uint8_t> d) { return d.size() >= 3 && d[0] == 0xFF && d[1] == 0xD8 && d[2] == 0xFF; }
inline bool is_png(std::span<const std::uint8_t> d) {
    static constexpr std::uint8_t sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
    return d.size() >= 8 && std::memcmp(d.data(), sig, 8) == 0;
}

inline std::string what_it_is(std::span<const std::uint8_t> d) {
    if (d.empty()) return "empty (0 bytes)";
    if (d.size() >= 4 && std::memcmp(d.data(), "GIF8", 4) == 0) return "a GIF, which is not supported (JPEG and PNG are)";
    if (d.size() >= 12 && std::memcmp(d.data(), "RIFF", 4) == 0 && std::memcmp(d.data() + 8, "WEBP", 4) == 0)
        return "a WebP image, which is not supported (JPEG and PNG are)";
    if (d.size() >= 2 && d[0] == 'B' && d[1] == 'M') return "a BMP image, which is not supported (JPEG and PNG are)";
    if (d.size() >= 4 && (std::memcmp(d.data(), "II*\0", 4) == 0 || std::memcmp(d.data(), "MM\0*", 4) == 0))
        return "a TIFF image, which is not supported (JPEG and PNG are)";
    return "neither JPEG nor PNG (first bytes do not match either)";
}

// ---- EXIF orientation -------------------------------------------------------------------

/// The orientation tag (0x0112) of IFD0 in an APP1 "Exif\0\0" payload; 1 when absent or
/// malformed (a bad EXIF block does not make the image unreadable).
inline int tiff_orientation(const std::uint8_t* p, std::size_t n);
inline int exif_orientation(const std::uint8_t* p, std::size_t n) {
    if (n < 14 || std::memcmp(p, "Exif\0\0", 6) != 0) return 1;
    return tiff_orientation(p + 6, n - 6);
}
/// The same from the TIFF structure itself (PNG's eXIf chunk holds it without the prefix).
inline int tiff_orientation(const std::uint8_t* p, std::size_t n) {
    if (n < 8) return 1;
    bool le;
    if (p[0] == 'I' && p[1] == 'I') le = true;
    else if (p[0] == 'M' && p[1] == 'M') le = false;
    else return 1;
    auto u16 = [&](std::size_t at) -> std::uint32_t {
        return le ? std::uint32_t(p[at] | p[at + 1] << 8) : std::uint32_t(p[at] << 8 | p[at + 1]);
    };
    auto u32 = [&](std::size_t at) -> std::uint32_t {
        return le ? (std::uint32_t(p[at]) | std::uint32_t(p[at + 1]) << 8 | std::uint32_t(p[at + 2]) << 16 |
                     std::uint32_t(p[at + 3]) << 24)
                  : (std::uint32_t(p[at]) << 24 | std::uint32_t(p[at + 1]) << 16 | std::uint32_t(p[at + 2]) << 8 |
                     std::uint32_t(p[at + 3]));
    };
    const std::uint32_t ifd = u32(4);
    if (ifd > n || n - ifd < 2) return 1;
    const std::uint32_t count = u16(ifd);
    for (std::uint32_t i = 0; i < count; ++i) {
        const std::size_t e = ifd + 2 + std::size_t(i) * 12;
        if (e + 12 > n) return 1;
        if (u16(e) == 0x0112) {
            const std::uint32_t v = u16(e + 8);
            return v >= 1 && v <= 8 ? int(v) : 1;
        }
    }
    return 1;
}

/// Orientations 5-8 swap width and height.
inline bool swaps_axes(int o) { return o >= 5; }

/// Where displayed pixel (x, y) of a w x h displayed image lies in the stored image.
inline void stored_at(int o, std::uint32_t w, std::uint32_t h, std::uint32_t x, std::uint32_t y, std::uint32_t& sx,
                      std::uint32_t& sy) {
    // Stored size: (w, h), or (h, w) for 5-8.
    const std::uint32_t W = swaps_axes(o) ? h : w, H = swaps_axes(o) ? w : h;
    switch (o) {
        default: sx = x, sy = y; break;
        case 2: sx = W - 1 - x, sy = y; break;
        case 3: sx = W - 1 - x, sy = H - 1 - y; break;
        case 4: sx = x, sy = H - 1 - y; break;
        case 5: sx = y, sy = x; break;
        case 6: sx = y, sy = H - 1 - x; break;
        case 7: sx = W - 1 - y, sy = H - 1 - x; break;
        case 8: sx = W - 1 - y, sy = x; break;
    }
}

/// The stored rectangle holding displayed rectangle r of a w x h displayed image.
inline rect stored_rect(int o, std::uint32_t w, std::uint32_t h, rect r) {
    std::uint32_t x0, y0, x1, y1;
    stored_at(o, w, h, r.x, r.y, x0, y0);
    stored_at(o, w, h, r.x + r.w - 1, r.y + r.h - 1, x1, y1);
    return {std::min(x0, x1), std::min(y0, y1), (x0 > x1 ? x0 - x1 : x1 - x0) + 1, (y0 > y1 ? y0 - y1 : y1 - y0) + 1};
}

/// Turns `in` (a stored region) into its displayed orientation.
inline void orient(int o, const plane& in, plane& out) {
    const bool swap = swaps_axes(o);
    out.w = swap ? in.h : in.w;
    out.h = swap ? in.w : in.h;
    out.px.resize(std::size_t(out.w) * out.h * 3);
    for (std::uint32_t y = 0; y < out.h; ++y) {
        std::uint8_t* d = out.px.data() + std::size_t(y) * out.w * 3;
        for (std::uint32_t x = 0; x < out.w; ++x, d += 3) {
            std::uint32_t sx, sy;
            stored_at(o, out.w, out.h, x, y, sx, sy);
            std::memcpy(d, in.px.data() + (std::size_t(sy) * in.w + sx) * 3, 3);
        }
    }
}

// ---- JPEG ---------------------------------------------------------------------------------

struct jpeg_errors {
    jpeg_error_mgr pub;
    std::jmp_buf jump;
    char message[JMSG_LENGTH_MAX];
    int warnings;    // those that mean damaged or missing pixels
    int max_scans;   // more scans is an error (see scratch::max_scans)
    bool in_header;  // reading the markers before the first scan
};

extern "C" {
// libjpeg calls these; error_exit must not return (it would exit() the process).
inline void sluice_jpeg_error_exit(j_common_ptr c) {
    auto* e = reinterpret_cast<jpeg_errors*>(c->err);
    (*c->err->format_message)(c, e->message);
    std::longjmp(e->jump, 1);
}
// A warning that means the pixels are not what the file meant (data missing: libjpeg fills
// the rest with grey; a bad Huffman code; a broken progression) is counted and fails the
// image; one about metadata, or about stray bytes between the header's markers, after
// which libjpeg decodes the same pixels, is ignored, as PIL ignores it. Stray bytes found
// after the first scan began are not ignored: there they can mean entropy-coded data
// that ended early (an interval decoded short).
inline void sluice_jpeg_emit_message(j_common_ptr c, int level) {
    if (level >= 0) return;  // trace messages
    const int code = c->err->msg_code;
    auto* e = reinterpret_cast<jpeg_errors*>(c->err);
    if (code == JWRN_JFIF_MAJOR || code == JWRN_ADOBE_XFORM || (code == JWRN_EXTRANEOUS_DATA && e->in_header)) return;
    if (e->warnings++ == 0) (*c->err->format_message)(c, e->message);
}
// A progressive JPEG of a few kilobytes can hold thousands of scans, each a pass over the
// whole image: minutes of CPU for one image. libjpeg calls this as it reads; past the
// limit the decode fails as on an error (TurboJPEG's TJFLAG_LIMITSCANS does the same).
inline void sluice_jpeg_progress(j_common_ptr c) {
    if (!c->is_decompressor) return;
    auto* e = reinterpret_cast<jpeg_errors*>(c->err);
    const int scan = reinterpret_cast<j_decompress_ptr>(c)->input_scan_number;
    if (scan > e->max_scans) {
        std::snprintf(e->message, sizeof e->message, "more than %d scans", e->max_scans);
        std::longjmp(e->jump, 1);
    }
}
}

/// A decompressor with its error handler. The functions below that call into libjpeg
/// set the longjmp target first and hold only plain data, so a longjmp out of them skips
/// no destructor.
struct jpeg_reader {
    jpeg_decompress_struct cinfo;
    jpeg_errors err;
    jpeg_progress_mgr progress;
    bool created = false;

    explicit jpeg_reader(int max_scans = 500) {
        std::memset(&cinfo, 0, sizeof cinfo);
        std::memset(&err, 0, sizeof err);
        std::memset(&progress, 0, sizeof progress);
        cinfo.err = jpeg_std_error(&err.pub);
        err.pub.error_exit = sluice_jpeg_error_exit;
        err.pub.emit_message = sluice_jpeg_emit_message;
        err.max_scans = max_scans;
        progress.progress_monitor = sluice_jpeg_progress;
    }
    jpeg_reader(const jpeg_reader&) = delete;
    jpeg_reader& operator=(const jpeg_reader&) = delete;
    ~jpeg_reader() {
        if (created) jpeg_destroy_decompress(&cinfo);
    }
};

/// Reads the header (and APP1 markers). False on error, the reason in r.err.message.
inline bool jpeg_open(jpeg_reader& r, const std::uint8_t* data, std::size_t n) {
    if (setjmp(r.err.jump)) return false;
    jpeg_create_decompress(&r.cinfo);
    r.created = true;
    r.cinfo.progress = &r.progress;
    jpeg_mem_src(&r.cinfo, data, static_cast<unsigned long>(n));
    jpeg_save_markers(&r.cinfo, JPEG_APP0 + 1, 0xFFFF);
    r.err.in_header = true;
    jpeg_read_header(&r.cinfo, TRUE);
    r.err.in_header = false;
    return true;
}

/// What one decode asks of libjpeg: the scale, and the stored region at that scale.
struct jpeg_job {
    unsigned denom;       // 1, 2, 4 or 8
    std::uint32_t x, w;   // columns, at the scale
    std::uint32_t y, h;   // rows, at the scale
    bool cmyk;            // decode as CMYK and convert here
    std::uint8_t* out;    // h rows of w * 3 bytes
    std::uint8_t* row;    // scratch: one row of the cropped width at 4 bytes per pixel
};

/// Scratch needed by jpeg_decode for an image w pixels wide at the scale: a crop's row
/// is never wider than the image's.
inline std::size_t jpeg_row_bytes(std::uint32_t w) { return std::size_t(w) * 4; }

inline void cmyk_to_rgb(const std::uint8_t* in, std::uint8_t* out, std::uint32_t n, bool inverted) {
    for (std::uint32_t i = 0; i < n; ++i, in += 4, out += 3) {
        // Adobe writes inverted CMYK (what libjpeg returns is 255 - ink); R = (1-C)(1-K).
        const unsigned c = inverted ? in[0] : 255 - in[0], m = inverted ? in[1] : 255 - in[1],
                       y = inverted ? in[2] : 255 - in[2], k = inverted ? in[3] : 255 - in[3];
        out[0] = std::uint8_t((c * k + 127) / 255);
        out[1] = std::uint8_t((m * k + 127) / 255);
        out[2] = std::uint8_t((y * k + 127) / 255);
    }
}

/// Decodes the job's region. False on error, the reason in r.err.message.
inline bool jpeg_decode(jpeg_reader& r, const jpeg_job& j) {
    if (setjmp(r.err.jump)) return false;
    jpeg_decompress_struct& c = r.cinfo;
    c.scale_num = 1;
    c.scale_denom = j.denom;
    c.out_color_space = j.cmyk ? JCS_CMYK : JCS_RGB;
    c.dct_method = JDCT_ISLOW;  // as PIL decodes (SIMD in libjpeg-turbo)
    jpeg_start_decompress(&c);
    // Decode one iMCU more on each side than asked: libjpeg-turbo's crop starts at an
    // iMCU boundary, and its fancy upsampling treats a crop's edges as the image's (it
    // replicates the edge column), so the columns next to them differ from a full decode.
    const JDIMENSION imcu = JDIMENSION(c.max_h_samp_factor) * JDIMENSION(c.min_DCT_scaled_size);
    JDIMENSION xoff = j.x > imcu ? j.x - imcu : 0;
    JDIMENSION cw = std::min<JDIMENSION>(c.output_width, j.x + j.w + imcu) - xoff;
    if (xoff != 0 || cw != c.output_width) jpeg_crop_scanline(&c, &xoff, &cw);  // xoff down to an iMCU boundary
    const std::uint32_t skip_cols = j.x - xoff;
    if (j.y > 0) jpeg_skip_scanlines(&c, j.y);
    const bool inverted = c.saw_Adobe_marker;
    for (std::uint32_t i = 0; i < j.h; ++i) {
        JSAMPROW rows[1] = {j.row};
        if (jpeg_read_scanlines(&c, rows, 1) != 1) {
            std::snprintf(r.err.message, sizeof r.err.message, "no scanline %u of %u", j.y + i, c.output_height);
            return false;
        }
        std::uint8_t* dst = j.out + std::size_t(i) * j.w * 3;
        if (j.cmyk) cmyk_to_rgb(j.row + std::size_t(skip_cols) * 4, dst, j.w, inverted);
        else std::memcpy(dst, j.row + std::size_t(skip_cols) * 3, std::size_t(j.w) * 3);
    }
    jpeg_abort_decompress(&c);  // the rows below the crop are not needed
    return true;
}

inline header jpeg_header(jpeg_reader& r, std::span<const std::uint8_t> d, std::uint64_t max_pixels) {
    if (!jpeg_open(r, d.data(), d.size())) throw bad_image(std::string("corrupt JPEG: ") + r.err.message);
    const auto& c = r.cinfo;
    if (c.image_width == 0 || c.image_height == 0) throw bad_image("corrupt JPEG: zero width or height");
    if (std::uint64_t(c.image_width) * c.image_height > max_pixels)
        throw bad_image("JPEG of " + std::to_string(c.image_width) + "x" + std::to_string(c.image_height) +
                        " pixels is over max_pixels (" + std::to_string(max_pixels) + "): refused before decoding");
    if (c.jpeg_color_space != JCS_GRAYSCALE && c.jpeg_color_space != JCS_YCbCr && c.jpeg_color_space != JCS_RGB &&
        c.jpeg_color_space != JCS_CMYK && c.jpeg_color_space != JCS_YCCK)
        throw bad_image("JPEG colour space " + std::to_string(int(c.jpeg_color_space)) + " is not supported");
    header h;
    h.fmt = format::jpeg;
    for (auto* m = c.marker_list; m; m = m->next)
        if (m->marker == JPEG_APP0 + 1) {
            h.orientation = exif_orientation(m->data, m->data_length);
            if (h.orientation != 1) break;
        }
    h.width = swaps_axes(h.orientation) ? c.image_height : c.image_width;
    h.height = swaps_axes(h.orientation) ? c.image_width : c.image_height;
    return h;
}

inline std::uint32_t scaled(std::uint32_t v, unsigned denom) { return (v + denom - 1) / denom; }

// ---- PNG ----------------------------------------------------------------------------------

struct spng_holder {
    spng_ctx* ctx = spng_ctx_new(0);
    spng_holder() = default;
    spng_holder(const spng_holder&) = delete;
    spng_holder& operator=(const spng_holder&) = delete;
    ~spng_holder() {
        if (ctx) spng_ctx_free(ctx);
    }
};

inline void spng_check(int rc, const char* what) {
    if (rc != 0) throw bad_image(std::string("corrupt PNG (") + what + "): " + spng_strerror(rc));
}

inline header png_header(spng_holder& s, std::span<const std::uint8_t> d, std::uint64_t max_pixels) {
    if (!s.ctx) throw error("sluice: libspng could not allocate a context");
    // libspng's own limits stop a huge IHDR before it allocates; ours is checked below.
    spng_set_image_limits(s.ctx, 1u << 24, 1u << 24);
    spng_set_chunk_limits(s.ctx, 64u << 20, 64u << 20);
    spng_check(spng_set_png_buffer(s.ctx, d.data(), d.size()), "buffer");
    spng_ihdr ihdr{};
    spng_check(spng_get_ihdr(s.ctx, &ihdr), "header");
    if (std::uint64_t(ihdr.width) * ihdr.height > max_pixels)
        throw bad_image("PNG of " + std::to_string(ihdr.width) + "x" + std::to_string(ihdr.height) +
                        " pixels is over max_pixels (" + std::to_string(max_pixels) + "): refused before decoding");
    header h;
    h.fmt = format::png;
    // eXIf (before the image data): its orientation, as for JPEG. A malformed one, which
    // libspng refuses, leaves the image as stored.
    spng_exif exif{};
    if (spng_get_exif(s.ctx, &exif) == 0 && exif.data)
        h.orientation = exif.length >= 6 && std::memcmp(exif.data, "Exif\0\0", 6) == 0
                            ? exif_orientation(reinterpret_cast<const std::uint8_t*>(exif.data), exif.length)
                            : tiff_orientation(reinterpret_cast<const std::uint8_t*>(exif.data), exif.length);
    h.width = swaps_axes(h.orientation) ? ihdr.height : ihdr.width;
    h.height = swaps_axes(h.orientation) ? ihdr.width : ihdr.height;
    return h;
}

}  // namespace detail

/// The format and displayed size, from the header only. Throws bad_image.
inline header read_header(std::span<const std::uint8_t> data, std::uint64_t max_pixels = default_max_pixels) {
    if (detail::is_jpeg(data)) {
        detail::jpeg_reader r;
        return detail::jpeg_header(r, data, max_pixels);
    }
    if (detail::is_png(data)) {
        detail::spng_holder s;
        return detail::png_header(s, data, max_pixels);
    }
    throw bad_image("not an image: " + detail::what_it_is(data));
}

/// Scratch a worker keeps between images, so decoding allocates (and first-touches)
/// nothing in the steady state.
struct scratch {
    plane stored;              // the stored region, before orientation
    plane region;              // PNG: the crop's stored region, before orientation
    std::vector<std::uint8_t> row;
    /// A JPEG with more scans is a bad image: a few kilobytes of progressive scans can
    /// cost minutes of CPU. Ordinary progressive JPEGs have about 10.
    int max_scans = 500;
};

/// Decodes region `crop` (displayed coordinates, inside the image) of `data` into `out`:
/// at full scale, or for JPEG at 1/2, 1/4 or 1/8 when the region stays at least
/// min_w x min_h at that scale (out.w, out.h tell which). Throws bad_image.
/// The same with the region chosen from the header, `rect choose(const header&)`: the
/// header is read once (augmentation picks its crop from the image's size).
template <class Choose>
    requires std::is_invocable_r_v<rect, Choose&, const header&>
void decode(std::span<const std::uint8_t> data, Choose choose, std::uint32_t min_w, std::uint32_t min_h, plane& out,
            scratch& s, std::uint64_t max_pixels = default_max_pixels) {
    auto checked = [&](const header& h) {
        const rect crop = choose(h);
        if (crop.w == 0 || crop.h == 0) throw bad_image("empty crop");
        if (crop.x + crop.w > h.width || crop.y + crop.h > h.height) throw bad_image("crop outside the image");
        return crop;
    };
    if (detail::is_jpeg(data)) {
        detail::jpeg_reader r(s.max_scans);
        const header h = detail::jpeg_header(r, data, max_pixels);
        const rect crop = checked(h);
        unsigned denom = 1;
        while (denom < 8 && crop.w / (denom * 2) >= min_w && crop.h / (denom * 2) >= min_h) denom *= 2;
        const rect st = detail::stored_rect(h.orientation, h.width, h.height, crop);
        // The region at the scale: from the first scaled pixel it touches to the last.
        const std::uint32_t x0 = st.x / denom, y0 = st.y / denom;
        const std::uint32_t x1 = detail::scaled(st.x + st.w, denom), y1 = detail::scaled(st.y + st.h, denom);
        detail::jpeg_job j{};
        j.denom = denom;
        j.x = x0, j.w = x1 - x0, j.y = y0, j.h = y1 - y0;
        j.cmyk = r.cinfo.jpeg_color_space == JCS_CMYK || r.cinfo.jpeg_color_space == JCS_YCCK;
        plane& target = h.orientation == 1 ? out : s.stored;
        target.w = j.w, target.h = j.h;
        target.px.resize(std::size_t(j.w) * j.h * 3);
        s.row.resize(detail::jpeg_row_bytes(detail::scaled(r.cinfo.image_width, denom)));
        j.out = target.px.data();
        j.row = s.row.data();
        if (!detail::jpeg_decode(r, j)) throw bad_image(std::string("corrupt JPEG: ") + r.err.message);
        if (r.err.warnings > 0) throw bad_image(std::string("corrupt JPEG: ") + r.err.message);
        if (h.orientation != 1) detail::orient(h.orientation, s.stored, out);
        return;
    }
    if (detail::is_png(data)) {
        detail::spng_holder p;
        const header h = detail::png_header(p, data, max_pixels);
        const rect crop = checked(h);
        std::size_t n = 0;
        detail::spng_check(spng_decoded_image_size(p.ctx, SPNG_FMT_RGB8, &n), "size");
        // The stored image is decoded whole; the crop (in stored coordinates) is copied out
        // of it and, when the eXIf orientation says so, turned.
        const std::uint32_t sw = detail::swaps_axes(h.orientation) ? h.height : h.width;
        const std::uint32_t sh = detail::swaps_axes(h.orientation) ? h.width : h.height;
        const rect st = detail::stored_rect(h.orientation, h.width, h.height, crop);
        const bool whole = st.x == 0 && st.y == 0 && st.w == sw && st.h == sh;
        plane& full = whole && h.orientation == 1 ? out : s.stored;
        full.px.resize(n);
        full.w = sw, full.h = sh;
        detail::spng_check(spng_decode_image(p.ctx, full.px.data(), n, SPNG_FMT_RGB8, 0), "data");
        const plane* region = &full;
        if (!whole) {
            plane& r = h.orientation == 1 ? out : s.region;
            r.w = st.w, r.h = st.h;
            r.px.resize(std::size_t(st.w) * st.h * 3);
            for (std::uint32_t y = 0; y < st.h; ++y)
                std::memcpy(r.px.data() + std::size_t(y) * st.w * 3, full.px.data() + (std::size_t(st.y + y) * sw + st.x) * 3,
                            std::size_t(st.w) * 3);
            region = &r;
        }
        if (h.orientation != 1) detail::orient(h.orientation, *region, out);
        return;
    }
    throw bad_image("not an image: " + detail::what_it_is(data));
}

/// Decodes region `crop` (displayed coordinates, inside the image); see above.
inline void decode(std::span<const std::uint8_t> data, rect crop, std::uint32_t min_w, std::uint32_t min_h, plane& out,
                   scratch& s, std::uint64_t max_pixels = default_max_pixels) {
    decode(data, [crop](const header&) { return crop; }, min_w, min_h, out, s, max_pixels);
}

/// The whole image at full scale, displayed orientation.
inline plane decode(std::span<const std::uint8_t> data, std::uint64_t max_pixels = default_max_pixels) {
    plane out;
    scratch s;
    // min = the whole size: never scaled (no crop is larger than the image).
    decode(data, [](const header& h) { return rect{0, 0, h.width, h.height}; }, ~0u, ~0u, out, s, max_pixels);
    return out;
}

}  // namespace sluice::imaging
