// train-libtorch: a small CNN trained with libtorch on image shards that sluice reads,
// decodes, augments and batches. Each batch reaches torch without a copy: the tensor is
// made from the batch's DLPack (at::fromDLPack) and releases the batch when torch drops it.
//
//   train-libtorch SHARDS [--steps N] [--batch B] [--size S] [--classes C] [--lr LR]
//                  [--checkpoint DIR [--resume]] [--print-labels]
//
// SHARDS: WebDataset shards of .jpg + .cls (sluice-gen DIR --images --format tar makes
// them; their label sets each photo's hue, so a small model can learn it), local paths,
// http(s):// or s3:// URLs. --checkpoint DIR saves the model, the optimizer and the
// pipeline's state (its data position: a few hundred bytes) there at the end; --resume
// loads them and goes on from the next batch the saved run had not taken. Prints the
// loss as it goes, the mean loss of the first and the last 20 steps, images/s and the
// pipeline's per-stage table. --print-labels prints a line per step with a hash of the
// batch's labels (the tests compare a resumed run's with an uninterrupted one's).
#include <sluice/image.hpp>
#include <sluice/sluice.hpp>

#include <ATen/DLConvertor.h>
#include <torch/torch.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

namespace {

struct net : torch::nn::Module {
    explicit net(int classes)
        : c1(register_module("c1", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 16, 3).stride(2).padding(1)))),
          c2(register_module("c2", torch::nn::Conv2d(torch::nn::Conv2dOptions(16, 32, 3).stride(2).padding(1)))),
          fc(register_module("fc", torch::nn::Linear(32, classes))) {}
    torch::Tensor forward(torch::Tensor x) {
        x = torch::relu(c1->forward(x));
        x = torch::relu(c2->forward(x));
        return fc->forward(x.mean({2, 3}));  // global average pooling
    }
    torch::nn::Conv2d c1, c2;
    torch::nn::Linear fc;
};

struct args {
    std::string shards, checkpoint;
    long steps = 300, batch = 32, size = 64, classes = 10;
    double lr = 0.01;
    bool resume = false, print_labels = false;
};

args parse(int argc, char** argv) {
    args a;
    for (int i = 1; i < argc; ++i) {
        const std::string s = argv[i];
        auto value = [&] {
            if (i + 1 >= argc) throw std::invalid_argument(s + " needs a value");
            return std::string(argv[++i]);
        };
        if (s == "--steps") a.steps = std::stol(value());
        else if (s == "--batch") a.batch = std::stol(value());
        else if (s == "--size") a.size = std::stol(value());
        else if (s == "--classes") a.classes = std::stol(value());
        else if (s == "--lr") a.lr = std::stod(value());
        else if (s == "--checkpoint") a.checkpoint = value();
        else if (s == "--resume") a.resume = true;
        else if (s == "--print-labels") a.print_labels = true;
        else if (a.shards.empty() && !s.starts_with("--")) a.shards = s;
        else throw std::invalid_argument("unknown argument '" + s + "'");
    }
    if (a.shards.empty()) throw std::invalid_argument("no shards given");
    if (a.resume && a.checkpoint.empty()) throw std::invalid_argument("--resume needs --checkpoint DIR");
    return a;
}

std::string slurp(const std::filesystem::path& p) {
    std::ifstream in(p, std::ios::binary);
    if (!in) throw std::runtime_error("cannot read '" + p.string() + "'");
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
}

// The source stage for local paths or URLs: read() or fetch(), both giving chunks.
sluice::stage<sluice::shard, sluice::chunk> source_for(const std::string& shards) {
    const bool remote = shards.starts_with("http://") || shards.starts_with("https://") || shards.starts_with("s3://");
    return remote ? sluice::fetch({.order = sluice::ordering::ordered}) : sluice::read();
}

/// What the loop reports: the loss now and then, that the first batch's memory is torch's
/// tensor's, each step's labels (--print-labels), and at the end the mean loss of the
/// first and last 20 steps and images/s.
struct training_log {
    explicit training_log(bool labels) : print_labels(labels) {}
    void step(long step, const sluice::device_batch& b, const torch::Tensor& x, const torch::Tensor& y,
              const torch::Tensor& loss) {
        if (losses.empty()) std::cout << "batch memory shared with torch: " << (x.data_ptr() == b.data() ? "yes" : "no") << "\n";
        losses.push_back(loss.item<double>());
        if (print_labels)  // the batch's labels, hashed by position, and the loss
            std::cout << "labels " << step << " " << torch::dot(y, torch::arange(y.size(0), y.options()) + 1).item<long>()
                      << " loss " << losses.back() << "\n";
        if (step % 50 == 0) std::cout << "step " << step << " loss " << losses.back() << "\n";
        images += long(b.size());
    }
    void summary(long step) const {
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        const std::size_t n = losses.size(), k = std::min<std::size_t>(20, n);
        const double first = k ? std::accumulate(losses.begin(), losses.begin() + long(k), 0.0) / double(k) : 0.0;
        const double last = k ? std::accumulate(losses.end() - long(k), losses.end(), 0.0) / double(k) : 0.0;
        std::cout << "steps " << n << " (to step " << step << "): loss first 20 " << first << ", last 20 " << last << "; "
                  << images << " images in " << s << " s: " << double(images) / s << " images/s\n";
    }
    bool print_labels;
    std::vector<double> losses;
    long images = 0;
    std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
};

/// A torch tensor over a DLPack tensor's memory, without a copy: torch owns it (and calls
/// its deleter, which lets the batch go) once fromDLPack has succeeded, not before.
torch::Tensor take(sluice::dlpack_ptr t) {
    torch::Tensor x = at::fromDLPack(t.get());
    (void)t.release();
    return x;
}

/// The model, the optimizer and the pipeline's data position, together in `dir`.
void save(const std::filesystem::path& dir, const std::shared_ptr<net>& model, const torch::optim::SGD& opt,
          const std::string& state, long step) {
    std::filesystem::create_directories(dir);
    torch::save(model, (dir / "model.pt").string());
    torch::save(opt, (dir / "optimizer.pt").string());
    std::ofstream(dir / "data.state", std::ios::binary) << state;
    std::ofstream(dir / "step") << step;
}

}  // namespace

int main(int argc, char** argv) try {
    const args a = parse(argc, argv);
    const auto dir = std::filesystem::path(a.checkpoint);
    const unsigned cores = sluice::usable_cpus();  // the CPUs this process may run on
    torch::manual_seed(17);
    // A GPU where libtorch has CUDA and sluice was built with it: batches are copied there
    // by the CUDA engine; else host memory (Debian's libtorch is CPU only).
    std::shared_ptr<sluice::copy_engine> engine = std::make_shared<sluice::host_engine>();
    torch::Device dev = torch::kCPU;
#if defined(SLUICE_HAVE_CUDA)
    if (torch::cuda::is_available()) engine = std::make_shared<sluice::cuda_engine>(0), dev = torch::Device(torch::kCUDA, 0);
#endif
    auto model = std::make_shared<net>(int(a.classes));
    model->to(dev);
    torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(a.lr).momentum(0.9));
    long step = 0;
    std::string state;  // the pipeline's data position, saved beside the model
    if (a.resume) {
        torch::load(model, (dir / "model.pt").string(), dev);
        torch::load(opt, (dir / "optimizer.pt").string());
        state = slurp(dir / "data.state");
        step = std::stol(slurp(dir / "step"));
    }
    if (step >= a.steps) {  // nothing left to train: the checkpoint stays as it is
        std::cout << "at step " << step << " already (--steps " << a.steps << "): nothing to do\n";
        return 0;
    }

    training_log log(a.print_labels);
    // README, "In a C++ trainer (libtorch)", quotes from here ...
    auto batches = sluice::list(a.shards)
                 | sluice::plan({.epochs = 1000, .seed = 17})
                 | source_for(a.shards)                   // read() or fetch()
                 | sluice::webdataset()
                 | sluice::decode_images({.size = std::uint32_t(a.size), .concurrency = cores})
                 | sluice::shuffle({.buffer = 1024})
                 | sluice::batch_images({.size = std::size_t(a.batch), .drop_last = true,
                                         .dtype = sluice::pixel_type::float32,
                                         .mean = {0.485f, 0.456f, 0.406f}, .std = {0.229f, 0.224f, 0.225f}})
                 | sluice::to_device({.ring = 3}, engine);
    sluice::pipeline p(batches, {.resume = state});      // state: "" or the checkpoint's
    for (auto& b : p) {
        b.synchronize();                                         // the copy into the ring slot is done
        torch::Tensor x = take(b.dlpack());                      // [B, 3, S, S] float32, no copy
        torch::Tensor y = take(sluice::labels_to_dlpack(b.host())).to(dev);  // [B] int64
        opt.zero_grad();
        torch::Tensor loss = torch::nn::functional::cross_entropy(model->forward(x), y);
        loss.backward();
        opt.step();
        log.step(step, b, x, y, loss);
        if (++step >= a.steps) break;
    }
    if (!a.checkpoint.empty()) save(dir, model, opt, p.state(), step);  // the data position beside the model
    // ... to here.
    log.summary(step);
    std::cout << p.figures().table();
    return 0;
} catch (const sluice::error& e) {  // a missing shard, a corrupt image...: its text, exit 1
    std::cerr << e.what() << "\n";
    return 1;
} catch (const c10::Error& e) {  // libtorch's own, without its C++ backtrace
    std::cerr << "train-libtorch: " << e.what_without_backtrace() << "\n";
    return 1;
} catch (const std::exception& e) {
    std::cerr << "train-libtorch: " << e.what() << "\n";
    return 1;
}
