// The loop a trainer writes: batches of shuffled lines from local shards.
//   trainer-loop "data/shard-{000000..000007}.txt"
#include <sluice/sluice.hpp>

#include <iostream>

int main(int argc, char** argv) {
    if (argc < 2) return std::cerr << "usage: trainer-loop SHARDS\n", 2;
    auto batches = sluice::list(argv[1]) | sluice::plan({.epochs = 2, .seed = 17}) | sluice::read() |
                   sluice::lines() | sluice::shuffle({.buffer = 1000, .seed = 17}) |
                   sluice::batch({.size = 64, .drop_last = true});
    std::size_t steps = 0, records = 0;
    for (auto& b : sluice::pipeline(batches)) {  // the pipeline runs behind this loop
        records += b.size();                       // a training step would use b[i] here
        ++steps;
    }
    std::cout << "steps " << steps << " records " << records << "\n";
}
