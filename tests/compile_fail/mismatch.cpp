// Must NOT compile: a stage producing `apples` piped into one expecting `oranges`.
// tests/compile_fail/check.cmake compiles it and checks the error names both types; with
// -DSLUICE_CONTROL the types match and it must compile (so the failure is the mismatch).
#include <sluice/sluice.hpp>

struct apples {};
struct oranges {};

int main() {
    auto src = sluice::from<apples>({apples{}});
#ifdef SLUICE_CONTROL
    auto stage = sluice::map([](apples) { return oranges{}; });
#else
    auto stage = sluice::map([](oranges) { return apples{}; });
#endif
    auto composed = src | stage;
    (void)composed;
}
