// sluice-gen: writes a synthetic dataset for the demo, the tests and the benchmarks, and
// prints what a reader must find in it as JSON: {"files", "records", "payload_bytes",
// "crc_sum"} where crc_sum is the sum of zlib crc32 over every record (as sluice-probe
// computes it).
//
//   sluice-gen DIR [--files N] [--records R] [--record-size B] [--vary] [--uneven]
//                  [--format lines|raw|tar|tfrecord|recordio] [--gzip] [--seed S]
//                  [--counts FILE] [--fields EXT,EXT...] [--classes C] [--images [--jpeg-only]]
//
// lines:    each file holds R lines of B letters (with --vary, lengths vary from 0 to 2B);
// raw:      each file is one record of R*B random bytes;
// tar:      R files of B letters each (000000.bin, 000001.bin...: one WebDataset sample
//           each), in a tar archive; with --fields jpg,cls each of the R samples is one
//           member per field, in that order (000000.jpg, 000000.cls, 000001.jpg...): a
//           `cls` field holds a decimal label below C (--classes, default 10), any other
//           field B letters (so "records", "payload_bytes" and "crc_sum" count every
//           member, as sluice-probe --format tar reads them; "samples" counts samples,
//           and --counts writes samples per shard, as sluice::webdataset() yields them);
// tfrecord, recordio: R records of B letters each.
// Files are named shard-000000.txt, .bin, .tar, .tfrecord or .rec; --gzip compresses
// each (zlib level 6, as gzip(1)) and adds .gz. --uneven: file i holds R*(3+i%5)/5
// records instead of R (shards of different sizes, as real datasets have). --counts FILE:
// also write each file's record count ("COUNT NAME" lines, for sluice::plan's counts).
// --images (built with the image layer): synthetic photos instead (examples/
// synthetic_images.hpp): with --format raw, N loose files in ImageFolder's layout,
// DIR/class-LLL/NNNNNN.jpg (or .png; LLL the label); with --format tar, N WebDataset
// shards of R samples, NNNNNN.jpg (or .png) + NNNNNN.cls. "records" counts images,
// "payload_bytes" and "crc_sum" cover the encoded images (not the .cls members).
// --jpeg-only: no PNG variant (every image a JPEG).

#include <sluice/core/detail/random.hpp>
#include <sluice/formats/writers.hpp>
#if defined(SLUICE_HAVE_IMAGE)
#include "synthetic_images.hpp"
#endif

#include <zlib.h>

#include <sluice/core/error.hpp>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <string>
#include <string_view>
#include <vector>

namespace {
constexpr const char* usage =
    "usage: sluice-gen DIR [--files N] [--records R] [--record-size B] [--vary] [--uneven] "
    "[--format lines|raw|tar|tfrecord|recordio] [--gzip] [--seed S] [--counts FILE] [--fields EXT,EXT...] "
    "[--classes C] [--images [--jpeg-only]]\n";

// "jpg,cls" -> {"jpg", "cls"}; empty names, '/', and repeats are refused.
std::vector<std::string> parse_fields(std::string_view v) {
    std::vector<std::string> out;
    for (std::size_t at = 0; at <= v.size();) {
        const auto comma = std::min(v.find(',', at), v.size());
        std::string f(v.substr(at, comma - at));
        if (f.empty() || f.find('/') != std::string::npos || f.front() == '.' ||
            std::find(out.begin(), out.end(), f) != out.end())
            throw sluice::error("sluice-gen: bad --fields '" + std::string(v) +
                                "': give extensions separated by commas, each once (e.g. jpg,cls)");
        out.push_back(std::move(f));
        at = comma + 1;
    }
    return out;
}

bool write_file(const std::string& path, const std::string& data) {
    std::FILE* out = std::fopen(path.c_str(), "wb");
    bool ok = out && std::fwrite(data.data(), 1, data.size(), out) == data.size();
    ok = out && std::fclose(out) == 0 && ok;
    if (!ok) std::perror(path.c_str());
    return ok;
}

int write_images(const std::string& dir, const std::string& format, std::uint64_t files, std::uint64_t per_shard,
                 std::uint64_t seed, std::uint64_t classes, bool jpeg_only, const std::string& counts_file) {
#if defined(SLUICE_HAVE_IMAGE)
    if (format != "raw" && format != "tar") {
        std::cerr << "sluice-gen: --images needs --format raw (loose files) or tar (WebDataset shards)\n";
        return 2;
    }
    std::uint64_t n = 0, payload = 0, crc_sum = 0;
    std::string counts;
    auto add = [&](const sluice_gen::synthetic_image& im) {
        ++n;
        payload += im.bytes.size();
        crc_sum += crc32_z(0L, reinterpret_cast<const Bytef*>(im.bytes.data()), im.bytes.size());
    };
    if (format == "raw") {
        for (std::uint64_t i = 0; i < files; ++i) {
            const auto im = sluice_gen::make_image(seed, i, classes, jpeg_only);
            char rel[64];
            std::snprintf(rel, sizeof rel, "class-%03llu/%06llu.%s", static_cast<unsigned long long>(im.label),
                          static_cast<unsigned long long>(i), im.ext.c_str());
            const auto path = std::filesystem::path(dir) / rel;
            std::filesystem::create_directories(path.parent_path());
            if (!write_file(path.string(), im.bytes)) return 1;
            add(im);
            counts += std::string("1 ") + rel + "\n";
        }
    } else {
        std::string shard;
        for (std::uint64_t f = 0; f < files; ++f) {
            shard.clear();
            for (std::uint64_t k = 0; k < per_shard; ++k) {
                const auto im = sluice_gen::make_image(seed, f * per_shard + k, classes, jpeg_only);
                char key[32];
                std::snprintf(key, sizeof key, "%06llu.", static_cast<unsigned long long>(k));
                sluice::append_tar_file(shard, key + im.ext, im.bytes);
                sluice::append_tar_file(shard, std::string(key) + "cls", std::to_string(im.label));
                add(im);
            }
            sluice::end_tar(shard);
            char name[64];
            std::snprintf(name, sizeof name, "shard-%06llu.tar", static_cast<unsigned long long>(f));
            if (!write_file((std::filesystem::path(dir) / name).string(), shard)) return 1;
            counts += std::to_string(per_shard) + " " + name + "\n";
        }
    }
    if (!counts_file.empty() && !write_file(counts_file, counts)) return 1;
    std::cout << "{\"files\":" << (format == "raw" ? n : files) << ",\"records\":" << n << ",\"payload_bytes\":" << payload
              << ",\"crc_sum\":" << crc_sum << ",\"samples\":" << n << ",\"classes\":" << classes << "}" << std::endl;
    return 0;
#else
    (void)dir, (void)format, (void)files, (void)per_shard, (void)seed, (void)classes, (void)jpeg_only, (void)counts_file;
    std::cerr << "sluice-gen: --images needs the image layer (libjpeg62-turbo-dev, libspng-dev, "
                 "libopencv-imgproc-dev), which this build was made without\n";
    return 2;
#endif
}

int run(int argc, char** argv) {
    std::string dir, format = "lines";
    std::uint64_t files = 8, records_each = 1000, record_size = 100, seed = 1, classes = 10;
    std::vector<std::string> fields;  // empty: one .bin member per tar sample, as always
    bool vary = false, gzip = false, uneven = false, images = false, jpeg_only = false;
    std::string counts_file;
    for (int i = 1; i < argc; ++i) {
        std::string_view a = argv[i];
        auto num = [&]() {
            if (i + 1 >= argc) {
                std::cerr << "sluice-gen: " << a << " needs a value\n";
                std::exit(2);
            }
            std::string_view v = argv[++i];
            std::uint64_t out = 0;
            auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
            if (ec != std::errc{} || p != v.data() + v.size()) {
                std::cerr << "sluice-gen: bad value for " << a << "\n";
                std::exit(2);
            }
            return out;
        };
        if (a == "--files") files = num();
        else if (a == "--records") records_each = num();
        else if (a == "--record-size") record_size = num();
        else if (a == "--seed") seed = num();
        else if (a == "--classes") classes = num();
        else if (a == "--fields" && i + 1 < argc) fields = parse_fields(argv[++i]);
        else if (a == "--vary") vary = true;
        else if (a == "--images") images = true;
        else if (a == "--jpeg-only") jpeg_only = true;
        else if (a == "--uneven") uneven = true;
        else if (a == "--counts" && i + 1 < argc) counts_file = argv[++i];
        else if (a == "--gzip") gzip = true;
        else if (a == "--format" && i + 1 < argc) format = argv[++i];
        else if (!a.empty() && a[0] != '-' && dir.empty()) dir = a;
        else {
            std::cerr << usage;
            return 2;
        }
    }
    const std::string ext = format == "lines" ? "txt" : format == "raw" ? "bin" : format == "recordio" ? "rec" : format;
    if (dir.empty() || (ext != "txt" && ext != "bin" && ext != "tar" && ext != "tfrecord" && ext != "rec")) {
        std::cerr << usage;
        return 2;
    }
    if (!fields.empty() && format != "tar") {
        std::cerr << "sluice-gen: --fields needs --format tar (WebDataset samples of several members)\n";
        return 2;
    }
    if (classes == 0) {
        std::cerr << "sluice-gen: --classes must be at least 1\n";
        return 2;
    }
    std::filesystem::create_directories(dir);
    if (images) return write_images(dir, format, files, records_each, seed, classes, jpeg_only, counts_file);
    sluice::detail::rng r(seed);
    std::uint64_t n_records = 0, n_samples = 0, payload = 0, crc_sum = 0;
    std::string rec, shard, counts;
    for (std::uint64_t f = 0; f < files; ++f) {
        const std::uint64_t records = uneven ? std::max<std::uint64_t>(1, records_each * (3 + f % 5) / 5) : records_each;
        char name[64];
        std::snprintf(name, sizeof name, "shard-%06llu.%s%s", static_cast<unsigned long long>(f), ext.c_str(),
                      gzip ? ".gz" : "");
        const auto path = (std::filesystem::path(dir) / name).string();
        shard.clear();
        if (format == "raw") {
            rec.resize(records * record_size);
            for (auto& c : rec) c = static_cast<char>(r.next());
            shard = rec;
            crc_sum += crc32_z(0L, reinterpret_cast<const Bytef*>(rec.data()), rec.size());
            payload += rec.size();
            ++n_records;
            ++n_samples;
            counts += "1 " + std::string(name) + "\n";
        } else if (!fields.empty()) {  // WebDataset samples: one member per field
            for (std::uint64_t k = 0; k < records; ++k) {
                for (auto& field : fields) {
                    if (field == "cls") {
                        rec = std::to_string(r.below(classes));
                    } else {
                        rec.resize(vary ? r.below(2 * record_size + 1) : record_size);
                        for (auto& c : rec) c = static_cast<char>('a' + r.below(26));
                    }
                    crc_sum += crc32_z(0L, reinterpret_cast<const Bytef*>(rec.data()), rec.size());
                    payload += rec.size();
                    char key[32];
                    std::snprintf(key, sizeof key, "%06llu.", static_cast<unsigned long long>(k));
                    sluice::append_tar_file(shard, key + field, rec);
                }
            }
            sluice::end_tar(shard);
            n_records += records * fields.size();
            n_samples += records;
            counts += std::to_string(records) + " " + name + "\n";
        } else {
            for (std::uint64_t k = 0; k < records; ++k) {
                const auto len = vary ? r.below(2 * record_size + 1) : record_size;
                rec.resize(len);
                for (auto& c : rec) c = static_cast<char>('a' + r.below(26));
                crc_sum += crc32_z(0L, reinterpret_cast<const Bytef*>(rec.data()), rec.size());
                payload += rec.size();
                if (format == "lines") {
                    shard += rec;
                    shard += '\n';
                } else if (format == "tar") {
                    char member[32];
                    std::snprintf(member, sizeof member, "%06llu.bin", static_cast<unsigned long long>(k));
                    sluice::append_tar_file(shard, member, rec);
                } else if (format == "tfrecord") {
                    sluice::append_tfrecord(shard, rec);
                } else {
                    sluice::append_recordio(shard, rec);
                }
            }
            if (format == "tar") sluice::end_tar(shard);
            n_records += records;
            n_samples += records;
            counts += std::to_string(records) + " " + name + "\n";
        }
        bool ok;
        if (gzip) {
            gzFile out = gzopen(path.c_str(), "wb6");
            ok = out && gzwrite(out, shard.data(), static_cast<unsigned>(shard.size())) == static_cast<int>(shard.size());
            ok = out && gzclose(out) == Z_OK && ok;
        } else {
            std::FILE* out = std::fopen(path.c_str(), "wb");
            ok = out && std::fwrite(shard.data(), 1, shard.size(), out) == shard.size();
            ok = out && std::fclose(out) == 0 && ok;
        }
        if (!ok) {
            std::perror(path.c_str());
            return 1;
        }
    }
    if (!counts_file.empty()) {
        std::FILE* out = std::fopen(counts_file.c_str(), "wb");
        if (!out || std::fwrite(counts.data(), 1, counts.size(), out) != counts.size() || std::fclose(out) != 0) {
            std::perror(counts_file.c_str());
            return 1;
        }
    }
    std::cout << "{\"files\":" << files << ",\"records\":" << n_records << ",\"payload_bytes\":" << payload
              << ",\"crc_sum\":" << crc_sum;
    if (!fields.empty()) std::cout << ",\"samples\":" << n_samples;  // the default output stays as it was
    std::cout << "}" << std::endl;
    return 0;
}
}  // namespace

int main(int argc, char** argv) {
    try {
        return run(argc, argv);
    } catch (const sluice::error& e) {
        std::cerr << e.what() << "\n";
    } catch (const std::exception& e) {
        std::cerr << "sluice-gen: " << e.what() << "\n";
    }
    return 1;
}
