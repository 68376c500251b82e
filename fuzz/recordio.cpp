// libFuzzer target: the recordio parser (see fuzz_common.hpp).
#include "fuzz_common.hpp"

#include <sluice/formats/detail/recordio_parser.hpp>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    return fuzz::check(data, size, fuzz::drive_parser<sluice::detail::recordio_parser, sluice::record>(),
                       fuzz::describe_record);
}
