// libFuzzer target: tar parsing grouped into WebDataset samples (see fuzz_common.hpp).
#include "fuzz_common.hpp"

#include <sluice/formats/detail/tar_parser.hpp>

namespace {
std::string describe_sample(const sluice::sample& s) {
    std::string t = s.key + "@" + std::to_string(s.offset) + ":";
    for (auto& f : s.fields) t += f.name + "=" + std::string(f.data.view()) + ";";
    return t + "\n";
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    return fuzz::check(
        data, size,
        fuzz::drive_parser<sluice::detail::webdataset_parser, sluice::sample>(),
        describe_sample);
}
