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
        [](std::shared_ptr<sluice::detail::parse_policy> pol, std::vector<sluice::chunk> chunks, auto emit) {
            sluice::detail::gunzip_decoder z(pol, sluice::compression::detect, 4096);
            std::vector<sluice::chunk> out;
            for (auto& c : chunks) {
                out.clear();
                try {
                    z(std::move(c), out);
                } catch (...) {
                    for (auto& o : out) emit(o);
                    throw;
                }
                for (auto& o : out) emit(o);
            }
        },
        describe_chunk, &fuzz::same_when_sound);
}
