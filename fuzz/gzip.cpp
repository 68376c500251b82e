// libFuzzer target: the gzip inflater (see fuzz_common.hpp). Output chunks are joined, so
// the comparison is of the inflated bytes, whatever the chunking.
#include "fuzz_common.hpp"

namespace {
std::string describe_chunk(const sluice::chunk& c) {
    return std::string(c.data.view()) + (c.last ? "<last>" : "");
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    return fuzz::check(
        data, size,
        fuzz::drive<sluice::chunk>([](auto pol) {
            return sluice::detail::gunzip_decoder(pol, sluice::compression::detect, 4096);
        }),
        describe_chunk, &fuzz::same_when_sound);
}
