// image-input: the input side of an image classifier's training loop. Reads WebDataset
// shards of JPEGs and labels (sluice-gen DIR --images --format tar makes some), decodes
// and augments them on every core, batches them into float32 NCHW tensors normalised
// with ImageNet's statistics, and hands each batch on as DLPack (what torch.from_dlpack
// or at::fromDLPack take without a copy). Prints one batch's shape and the images/s.
//
//   image-input 'DIR/shard-*.tar' [EPOCHS]
#include <sluice/image.hpp>
#include <sluice/sluice.hpp>

#include <chrono>
#include <cstdio>
#include <string>

int main(int argc, char** argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: image-input SHARDS [EPOCHS]\n");
        return 2;
    }
    const unsigned epochs = argc > 2 ? unsigned(std::stoul(argv[2])) : 1;
    const unsigned cores = sluice::usable_cpus();  // the CPUs this process may run on
    try {
        auto batches = sluice::list(argv[1])
                     | sluice::plan({.epochs = epochs, .seed = 17})
                     | sluice::read()
                     | sluice::webdataset()
                     | sluice::decode_images({.size = 224, .concurrency = cores})
                     | sluice::shuffle({.buffer = 2048})
                     | sluice::batch_images({.size = 64,
                                             .dtype = sluice::pixel_type::float32,
                                             .mean = {0.485f, 0.456f, 0.406f},
                                             .std = {0.229f, 0.224f, 0.225f}})
                     | sluice::to_device({.ring = 3}, std::make_shared<sluice::host_engine>());
        sluice::pipeline p(batches);
        std::size_t images = 0;
        const auto t0 = std::chrono::steady_clock::now();
        for (auto& b : p) {
            auto x = b.dlpack();                              // [N, 3, 224, 224] float32
            auto y = sluice::labels_to_dlpack(b.host());      // [N] int64
            if (images == 0) {
                const auto& t = x->dl_tensor;
                std::printf("batch: images [%lld, %lld, %lld, %lld] float%d, labels [%lld], first label %lld\n",
                            (long long)t.shape[0], (long long)t.shape[1], (long long)t.shape[2], (long long)t.shape[3],
                            int(t.dtype.bits), (long long)y->dl_tensor.shape[0],
                            (long long)static_cast<const std::int64_t*>(y->dl_tensor.data)[0]);
            }
            images += b.size();
        }
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        std::printf("%zu images in %.2f s: %.0f images/s on %u cores\n%s", images, s, double(images) / s, cores,
                    p.figures().table().c_str());
    } catch (const sluice::error& e) {
        std::fprintf(stderr, "%s\n", e.what());
        return 1;
    }
}
