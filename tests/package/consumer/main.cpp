#include <sluice/sluice.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>

#include <unistd.h>

int main() {
    auto squares = sluice::from<int>({1, 2, 3, 4}) | sluice::map([](int x) { return x * x; });
    int sum = 0;
    for (int v : sluice::pipeline(squares)) sum += v;
    std::cout << "sum " << sum << "\n";

    // Stages that sluice::compiled compiles (list, plan, read, lines, batch,
    // pipeline<host_batch>): with it, this TU only refers to them and the link must find
    // them in the target's compiled part.
    const auto path = std::filesystem::temp_directory_path() / ("sluice-consumer-" + std::to_string(::getpid()) + ".txt");
    std::ofstream(path) << "a\nbb\nccc\ndddd\n";
    std::size_t records = 0, bytes = 0;
    for (auto& b : sluice::pipeline(sluice::list(path.string()) | sluice::plan() | sluice::read() | sluice::lines() |
                                    sluice::batch({.size = 3}))) {
        records += b.size();
        bytes += b.data.size();
    }
    std::filesystem::remove(path);
#if defined(SLUICE_COMPILED)
    const char* how = "compiled part";
#else
    const char* how = "headers only";
#endif
    std::cout << "lines " << records << " bytes " << bytes << " (" << how << ")\n";
    return sum == 30 && records == 4 && bytes == 10 ? 0 : 1;
}
