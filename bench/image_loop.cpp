// The limit for an image pipeline on these cores: a bare loop over the same files making
// the same calls as sluice's decode_images stage — read the file, choose the random crop
// from the header, decode it (crop + DCT scaling), resize, flip — on T threads, with no
// pipeline around it (no channels, no batching). bench/run.sh images runs it beside
// sluice-probe --images and PyTorch's DataLoader.
//
//   image_loop [--threads T] [--size S] FILE...     (or a directory, read recursively)
//
// A FILE ending in .tar is a WebDataset shard: it is mapped, its members walked, and each
// .jpg/.jpeg/.png member decoded with the random crop of its key ("SHARD#KEY", as
// decode_images draws it), so the loop makes the same calls on the same bytes as sluice
// reading the shards.
//
// Prints one JSON object: images, seconds, images_per_s, cpu_ms_per_image.
#include <sluice/image/augment.hpp>
#include <sluice/image/codec.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

int main(int argc, char** argv) {
    unsigned threads = 2;
    std::uint32_t size = 224;
    std::vector<std::string> files;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--threads" && i + 1 < argc) threads = unsigned(std::stoul(argv[++i]));
        else if (a == "--size" && i + 1 < argc) size = std::uint32_t(std::stoul(argv[++i]));
        else if (std::filesystem::is_directory(a)) {
            for (auto& e : std::filesystem::recursive_directory_iterator(a))
                if (e.is_regular_file()) files.push_back(e.path().string());
        } else files.push_back(a);
    }
    std::sort(files.begin(), files.end());
    // The images: a whole file each, or a member of a mapped tar shard.
    struct item {
        std::string key;
        const std::uint8_t* data = nullptr;  // in a mapped shard; null: read the file `key`
        std::size_t size = 0;
    };
    std::vector<item> items;
    const auto t0 = std::chrono::steady_clock::now();
    for (auto& f : files) {
        if (!f.ends_with(".tar")) {
            items.push_back({f});
            continue;
        }
        const int fd = ::open(f.c_str(), O_RDONLY);
        struct stat st {};
        if (fd < 0 || ::fstat(fd, &st) != 0) {
            std::perror(f.c_str());
            return 2;
        }
        const std::size_t n = std::size_t(st.st_size);
        auto* m = static_cast<const std::uint8_t*>(::mmap(nullptr, n, PROT_READ, MAP_PRIVATE, fd, 0));
        ::close(fd);
        if (m == MAP_FAILED) {
            std::perror(f.c_str());
            return 2;
        }
        for (std::size_t at = 0; at + 512 <= n;) {
            const char* h = reinterpret_cast<const char*>(m + at);
            if (h[0] == 0) break;  // the end-of-archive blocks
            std::string name(h, strnlen(h, 100));
            const std::size_t size = std::strtoull(std::string(h + 124, 12).c_str(), nullptr, 8);
            const std::size_t slash = name.rfind('/'), dot = name.find('.', slash == std::string::npos ? 0 : slash + 1);
            const std::string ext = dot == std::string::npos ? "" : name.substr(dot + 1);
            if ((h[156] == '0' || h[156] == 0) && (ext == "jpg" || ext == "jpeg" || ext == "png") && at + 512 + size <= n)
                items.push_back({f + "#" + name.substr(0, dot), m + at + 512, size});
            at += 512 + (size + 511) / 512 * 512;
        }
    }
    std::atomic<std::size_t> next{0}, done{0}, failed{0};
    std::vector<std::thread> pool;
    for (unsigned t = 0; t < threads; ++t)
        pool.emplace_back([&] {
            namespace im = sluice::imaging;
            im::scratch s;
            im::plane crop;
            std::vector<std::uint8_t> out(std::size_t(size) * size * 3), data;
            const im::random_crop rc;
            for (std::size_t i; (i = next.fetch_add(1)) < items.size();) {
                const item& it = items[i];
                std::span<const std::uint8_t> d(it.data, it.size);
                if (!it.data) {
                    std::ifstream f(it.key, std::ios::binary | std::ios::ate);
                    data.resize(std::size_t(f.tellg()));
                    f.seekg(0);
                    f.read(reinterpret_cast<char*>(data.data()), std::streamsize(data.size()));
                    d = std::span<const std::uint8_t>(data.data(), data.size());
                }
                try {
                    auto r = im::image_rng(1, 0, it.key);
                    auto region = [&](const im::header& h) { return im::choose_random_crop(h.width, h.height, rc, r); };
                    im::decode(d, region, size, size, crop, s);
                    im::resize(crop, size, size, out.data());
                    if (r.next() >> 63) im::flip_horizontal(out.data(), size, size);
                    ++done;
                } catch (const im::bad_image&) {
                    ++failed;
                }
            }
        });
    for (auto& t : pool) t.join();
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    rusage ru{};
    ::getrusage(RUSAGE_SELF, &ru);
    const double cpu = double(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) + double(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
    std::printf("{\"images\":%zu,\"failed\":%zu,\"threads\":%u,\"seconds\":%.3f,\"images_per_s\":%.1f,\"cpu_ms_per_image\":%.3f}\n",
                done.load(), failed.load(), threads, secs, double(done) / secs, done ? cpu * 1e3 / double(done) : 0.0);
    return failed ? 1 : 0;
}
