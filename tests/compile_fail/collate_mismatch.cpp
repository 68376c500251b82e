// Must NOT compile: batch's collate takes groups of `oranges`, the stage before it gives
// `apples`. tests/compile_fail/check.cmake compiles it and checks the error names both
// types through pipe_type_mismatch<apples, oranges>; with -DSLUICE_CONTROL the types
// match and it must compile (so the failure is the mismatch).
#include <sluice/sluice.hpp>

#include <vector>

struct apples {};
struct oranges {};

int main() {
    auto src = sluice::from<apples>({apples{}});
#ifdef SLUICE_CONTROL
    auto stage = sluice::batch({.size = 2}, [](std::vector<apples>& g) { return g.size(); });
#else
    auto stage = sluice::batch({.size = 2}, [](std::vector<oranges>& g) { return g.size(); });
#endif
    auto composed = src | stage;
    (void)composed;
}
