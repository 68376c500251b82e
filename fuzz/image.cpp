// libFuzzer target: the image decoder (include/sluice/image/codec.hpp) on any bytes.
// Whatever the input, decoding either gives pixels of the size the header promised or
// throws imaging::bad_image: never a crash, a leak, a read out of bounds or an exit()
// from libjpeg. A crop at a reduced scale goes through libjpeg's crop, skip and DCT
// scaling paths too. max_pixels is kept small so a valid huge header is refused quickly.
#include <sluice/image/codec.hpp>

#include <cstdlib>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    namespace im = sluice::imaging;
    const std::span<const std::uint8_t> in(data, size);
    constexpr std::uint64_t max_pixels = 4u << 20;
    try {
        const im::header h = im::read_header(in, max_pixels);
        im::plane p;
        im::scratch s;
        im::decode(in, {0, 0, h.width, h.height}, h.width, h.height, p, s, max_pixels);
        if (p.w != h.width || p.h != h.height || p.px.size() != std::size_t(p.w) * p.h * 3) std::abort();
        const im::rect r{h.width / 4, h.height / 3, std::max(1u, h.width / 2), std::max(1u, h.height / 2)};
        im::decode(in, r, std::max(1u, r.w / 4), std::max(1u, r.h / 4), p, s, max_pixels);
        if (p.w == 0 || p.h == 0 || p.w > r.w || p.h > r.h) std::abort();
    } catch (const im::bad_image&) {
    }
    return 0;
}
