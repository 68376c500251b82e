// The loop a trainer writes: batches of shuffled lines from local shards.
//   trainer-loop "data/shard-{000000..000007}.txt"
#include <sluice/sluice.hpp>

#include <iostream>

int main(int argc, char** argv) try {
    if (argc < 2) return std::cerr << "usage: trainer-loop SHARDS\n", 2;
    // One seed, given once: plan's orders the shards and seeds the shuffle.
    auto batches = sluice::list(argv[1]) | sluice::plan({.epochs = 2, .seed = 17}) | sluice::read() |
                   sluice::lines() | sluice::shuffle({.buffer = 1000}) |
                   sluice::batch({.size = 64, .drop_last = true});
    std::size_t steps = 0, records = 0;
    for (auto& b : sluice::pipeline(batches)) {  // the pipeline runs behind this loop
        records += b.size();                       // a training step would use b[i] here
        ++steps;
    }
    std::cout << "steps " << steps << " records " << records << "\n";
    return 0;
} catch (const sluice::error& e) {  // a missing file, a glob matching nothing...: its text, exit 1
    std::cerr << e.what() << "\n";
    return 1;
} catch (const std::exception& e) {
    std::cerr << "trainer-loop: " << e.what() << "\n";
    return 1;
}
