// sluice::compiled: the stage factories and pipelines of the library's own types,
// compiled once (see include/sluice/detail/compiled_parts.hpp).
#define SLUICE_COMPILING 1
#include <sluice/sluice.hpp>

namespace sluice {
#define SLUICE_INSTANTIATE_PART(...) template __VA_ARGS__;
SLUICE_COMPILED_PARTS(SLUICE_INSTANTIATE_PART)
#undef SLUICE_INSTANTIATE_PART
}  // namespace sluice
