// A user's own stage: parse "key value" lines into a struct on the CPU pool, with four
// threads, composed between the library's stages, then batched with the user's collate.
//   custom-stage FILE...
#include <sluice/sluice.hpp>

#include <iostream>
#include <numeric>
#include <string>
#include <vector>

// The user's item type. `source`, copied from the record, says which shard and epoch the
// item belongs to, so shuffle and batch keep epochs apart and pipeline::state() can save a
// position; without it a plan of several epochs refuses to start.
struct sample {
    std::shared_ptr<const sluice::shard> source;
    std::string text;
    std::size_t letters = 0;  // the user's "feature": how many a..z it holds
};

// The user's decode/augment step: any plain function of one record.
sample featurize(const sluice::record& r) {
    sample s{r.source, std::string(r.data.view()), 0};
    for (char c : s.text) s.letters += (c >= 'a' && c <= 'z');
    return s;
}

int main(int argc, char** argv) try {
    if (argc < 2) return std::cerr << "usage: custom-stage FILE...\n", 2;
    // A reusable partial pipeline: decode, then the user's stage, then batches of 32.
    auto decode_and_batch = sluice::lines() | sluice::map(featurize, {.concurrency = 4}) |
                            sluice::batch({.size = 32}, [](std::vector<sample>& group) {
                                return std::accumulate(group.begin(), group.end(), std::size_t{0},
                                                       [](std::size_t n, const sample& s) { return n + s.letters; });
                            });
    auto src = sluice::list(std::vector<std::string>(argv + 1, argv + argc)) | sluice::plan() | sluice::read();
    sluice::pipeline p(src | decode_and_batch);
    std::size_t letters = 0, batches = 0;
    for (std::size_t n : p) letters += n, ++batches;
    std::cout << "batches " << batches << " letters " << letters << "\n";
    std::cerr << p.figures().table();
    return 0;
} catch (const sluice::error& e) {  // a missing file, a glob matching nothing...: its text, exit 1
    std::cerr << e.what() << "\n";
    return 1;
} catch (const std::exception& e) {
    std::cerr << "custom-stage: " << e.what() << "\n";
    return 1;
}
