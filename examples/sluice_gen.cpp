// sluice-gen: writes a synthetic dataset for the demo, the tests and the benchmarks, and
// prints what a reader must find in it as JSON: {"files", "records", "payload_bytes",
// "crc_sum"} where crc_sum is the sum of zlib crc32 over every record (as sluice-probe
// computes it).
//
//   sluice-gen DIR [--files N] [--records R] [--record-size B] [--vary] [--format lines|raw]
//                  [--seed S]
//
// lines: each file holds R lines of B letters (with --vary, lengths vary from 0 to 2B);
// raw:   each file is one record of R*B random bytes.
// Files are named shard-000000.txt, shard-000001.txt... (or .bin for raw).

#include <sluice/core/detail/random.hpp>

#include <zlib.h>

#include <charconv>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <string>
#include <string_view>
#include <vector>

int main(int argc, char** argv) {
    std::string dir, format = "lines";
    std::uint64_t files = 8, records = 1000, record_size = 100, seed = 1;
    bool vary = false;
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
        else if (a == "--records") records = num();
        else if (a == "--record-size") record_size = num();
        else if (a == "--seed") seed = num();
        else if (a == "--vary") vary = true;
        else if (a == "--format" && i + 1 < argc) format = argv[++i];
        else if (!a.empty() && a[0] != '-' && dir.empty()) dir = a;
        else {
            std::cerr << "usage: sluice-gen DIR [--files N] [--records R] [--record-size B] [--vary] "
                         "[--format lines|raw] [--seed S]\n";
            return 2;
        }
    }
    if (dir.empty() || (format != "lines" && format != "raw")) {
        std::cerr << "usage: sluice-gen DIR [--files N] [--records R] [--record-size B] [--vary] "
                     "[--format lines|raw] [--seed S]\n";
        return 2;
    }
    std::filesystem::create_directories(dir);
    sluice::detail::rng r(seed);
    std::uint64_t n_records = 0, payload = 0, crc_sum = 0;
    std::string rec;
    for (std::uint64_t f = 0; f < files; ++f) {
        char name[64];
        std::snprintf(name, sizeof name, "shard-%06llu.%s", static_cast<unsigned long long>(f),
                      format == "lines" ? "txt" : "bin");
        const auto path = std::filesystem::path(dir) / name;
        std::FILE* out = std::fopen(path.c_str(), "wb");
        if (!out) {
            std::perror(path.c_str());
            return 1;
        }
        if (format == "lines") {
            for (std::uint64_t k = 0; k < records; ++k) {
                const auto len = vary ? r.below(2 * record_size + 1) : record_size;
                rec.resize(len);
                for (auto& c : rec) c = static_cast<char>('a' + r.below(26));
                crc_sum += crc32_z(0L, reinterpret_cast<const Bytef*>(rec.data()), rec.size());
                payload += rec.size();
                rec.push_back('\n');
                std::fwrite(rec.data(), 1, rec.size(), out);
            }
            n_records += records;
        } else {
            rec.resize(records * record_size);
            for (auto& c : rec) c = static_cast<char>(r.next());
            std::fwrite(rec.data(), 1, rec.size(), out);
            crc_sum += crc32_z(0L, reinterpret_cast<const Bytef*>(rec.data()), rec.size());
            payload += rec.size();
            ++n_records;
        }
        if (std::fclose(out) != 0) {
            std::perror(path.c_str());
            return 1;
        }
    }
    std::cout << "{\"files\":" << files << ",\"records\":" << n_records << ",\"payload_bytes\":" << payload
              << ",\"crc_sum\":" << crc_sum << "}" << std::endl;
}
