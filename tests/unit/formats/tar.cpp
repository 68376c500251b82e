#include <sluice/formats/tar.hpp>

#include "support/decode_support.hpp"
#include "support/test_support.hpp"

#include <sluice/core/pipeline.hpp>
#include <sluice/formats/writers.hpp>
#include <sluice/ops/from.hpp>

#include <zlib.h>

#include <fstream>
#include <sstream>

using sluice_test::cut;
using tar_p = sluice::detail::tar_parser;

namespace {
// Archives written by Python's tarfile in its three formats, with what each regular file
// holds ("name<TAB>size<TAB>crc32" per line, in archive order).
const char* make_archives = R"PY(
import io, os, random, sys, tarfile, zlib
out = sys.argv[1]
rnd = random.Random(int(sys.argv[2]))
def blob(n): return bytes(rnd.getrandbits(8) for _ in range(n))
long_dir = "d" * 60 + "/" + "e" * 80            # 141 bytes: ustar splits it into prefix + name
very_long = "v" * 150 + "/" + "w" * 150 + ".bin"  # 305 bytes: GNU long name or pax path
for fmt, tag, names in [(tarfile.USTAR_FORMAT, "ustar", [long_dir + ".txt"]),
                        (tarfile.GNU_FORMAT, "gnu", [long_dir + ".txt", very_long]),
                        (tarfile.PAX_FORMAT, "pax", [long_dir + ".txt", very_long])]:
    manifest = []
    for mode, suffix in [("w", ".tar"), ("w:gz", ".tar.gz")]:
        rnd.seed(int(sys.argv[2]))
        with tarfile.open(os.path.join(out, tag + suffix), mode, format=fmt, encoding="utf-8") as t:
            def add(name, data):
                info = tarfile.TarInfo(name); info.size = len(data); info.mtime = 1700000000
                t.addfile(info, io.BytesIO(data))
                if suffix == ".tar": manifest.append("%s\t%d\t%d" % (name, len(data), zlib.crc32(data)))
            d = tarfile.TarInfo("train"); d.type = tarfile.DIRTYPE; t.addfile(d)
            for i in range(20):
                add("train/%06d.jpg" % i, blob(rnd.randrange(0, 5000)))
                add("train/%06d.cls" % i, str(i % 10).encode())
            add("données/été.txt", "non-ASCII: é, ü, 日本".encode())
            for n in names: add(n, blob(777))
            s = tarfile.TarInfo("link"); s.type = tarfile.SYMTYPE; s.linkname = "x" * (50 if fmt == tarfile.USTAR_FORMAT else 120); t.addfile(s)
            h = tarfile.TarInfo("hard"); h.type = tarfile.LNKTYPE; h.linkname = "train/000001.jpg"; t.addfile(h)
            f = tarfile.TarInfo("fifo"); f.type = tarfile.FIFOTYPE; t.addfile(f)
            add("empty.txt", b"")
            add("big.bin", blob(300000))
    with open(os.path.join(out, tag + ".manifest"), "w", encoding="utf-8") as m:
        m.write("\n".join(manifest) + "\n")
)PY";

struct member {
    std::string name;
    std::size_t size;
    unsigned long crc;
    bool operator==(const member&) const = default;
};
std::ostream& operator<<(std::ostream& os, const member& m) { return os << m.name << " (" << m.size << ")"; }

std::vector<member> manifest(const std::string& path) {
    std::ifstream f(path);
    std::vector<member> v;
    std::string line;
    while (std::getline(f, line)) {
        if (line.empty()) continue;
        std::istringstream is(line);
        member m;
        std::getline(is, m.name, '\t');
        is >> m.size >> m.crc;
        v.push_back(m);
    }
    return v;
}
std::vector<member> members(const std::vector<sluice::record>& rs) {
    std::vector<member> v;
    for (auto& r : rs)
        v.push_back({r.name, r.data.size(), crc32_z(0, reinterpret_cast<const Bytef*>(r.data.data()), r.data.size())});
    return v;
}
std::string slurp(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
}
struct archives {
    sluice_test::temp_dir dir;
    archives() {
        auto r = sluice_test::run({"/usr/bin/env", "python3", "-c", make_archives, dir.path().string(),
                                   std::to_string(sluice_test::test_seed())});
        INFO(r.err);
        REQUIRE(r.status == 0);
    }
};
}  // namespace

TEST_CASE("tar: archives written by Python's tarfile (USTAR, GNU, PAX) at every chunk size", "[tar][streaming]") {
    archives a;
    const auto seed = sluice_test::test_seed();
    INFO("seed " << seed);
    sluice::detail::rng r(seed);
    for (std::string fmt : {"ustar", "gnu", "pax"}) {
        INFO("format " << fmt);
        const auto want = manifest(a.dir / (fmt + ".manifest"));
        REQUIRE(want.size() == 44 + (fmt == "ustar" ? 0 : 1));
        const std::string file = slurp(a.dir / (fmt + ".tar"));
        for (int t = 0; t < 6; ++t) {
            auto p = sluice_test::parse_chunks<tar_p, sluice::record>(cut(file, sluice_test::random_sizes(r, 1u << 20)));
            REQUIRE(p.error.empty());
            REQUIRE(members(p.out) == want);
            REQUIRE(p.slices_of_chunks);
        }
        auto bytewise = sluice_test::parse_chunks<tar_p, sluice::record>(cut(file, {1}));
        REQUIRE(members(bytewise.out) == want);
        // The same archive gzip'd by Python, through the inflater.
        auto gz = sluice_test::parse_chunks<tar_p, sluice::record>(cut(slurp(a.dir / (fmt + ".tar.gz")), {1000}, "a.tar.gz"),
                                                               {.gunzip = true});
        REQUIRE(gz.error.empty());
        REQUIRE(members(gz.out) == want);
    }
}

TEST_CASE("webdataset: files grouped into samples by key, one field per extension", "[tar][webdataset]") {
    archives a;
    std::vector<sluice::sample> got;
    sluice::pipeline p(sluice::from(cut(slurp(a.dir / "pax.tar"), {4096}, "pax.tar")) | sluice::webdataset());
    for (auto& s : p) got.push_back(std::move(s));
    // 20 jpg+cls samples, then données/été (txt), the two long names, empty, big.
    REQUIRE(got.size() == 25);
    for (std::size_t i = 0; i < 20; ++i) {
        char key[32];
        std::snprintf(key, sizeof key, "train/%06zu", i);
        REQUIRE(got[i].key == key);
        REQUIRE(got[i].fields.size() == 2);
        REQUIRE(got[i].fields[0].name == "jpg");
        REQUIRE(sluice_test::bytes_str(got[i].at("cls")) == std::to_string(i % 10));
        REQUIRE(got[i].index == i);
    }
    REQUIRE(got[20].key == "données/été");
    REQUIRE(sluice_test::bytes_str(got[20].at("txt")) == "non-ASCII: é, ü, 日本");
    REQUIRE_THROWS_WITH(got[0].at("png"), "sluice: sample 'train/000000' of 'pax.tar' has no field 'png' (it has: jpg, cls)");
}

TEST_CASE("webdataset: keys, extensions, ignored and repeated files", "[tar][webdataset]") {
    std::string key, ext;
    REQUIRE(sluice::detail::webdataset_key("a/b.c/000.seg.PNG", key, ext));
    REQUIRE(key == "a/b.c/000");
    REQUIRE(ext == "seg.png");
    REQUIRE_FALSE(sluice::detail::webdataset_key("dir/README", key, ext));
    REQUIRE_FALSE(sluice::detail::webdataset_key("dir/.hidden", key, ext));

    std::string t;
    sluice::append_tar_file(t, "s1.jpg", "J1");
    sluice::append_tar_file(t, "s1.json", "{}");
    sluice::append_tar_file(t, "README", "ignored");
    sluice::append_tar_file(t, "s2.jpg", "J2");
    sluice::append_tar_file(t, "s2.jpg", "again");
    sluice::append_tar_file(t, "s3.jpg", "J3");
    sluice::end_tar(t);
    using W = sluice::detail::webdataset_parser;
    auto e = sluice_test::parse_chunks<W, sluice::sample>(cut(t, {100}, "w.tar"));
    REQUIRE(e.error == "sluice: duplicate file 's2.jpg' in WebDataset sample 's2' in 'w.tar' at byte 4608");
    REQUIRE(e.out.size() == 1);  // s1, complete before the error
    auto s = sluice_test::parse_chunks<W, sluice::sample>(cut(t, {100}), {.corrupt = sluice::on_corrupt::skip});
    REQUIRE(s.skipped == 1);
    REQUIRE(s.out.size() == 3);
    REQUIRE(s.out[1].fields.size() == 1);
    REQUIRE(sluice_test::bytes_str(s.out[1].at("jpg")) == "J2");
    REQUIRE(s.out[2].key == "s3");
}

TEST_CASE("tar: bad header checksums, garbage, truncation, data after the end", "[tar][corrupt]") {
    std::string t;
    std::vector<std::size_t> at;
    for (int i = 0; i < 10; ++i) {
        at.push_back(t.size());
        sluice::append_tar_file(t, "f" + std::to_string(i) + ".txt", std::string(static_cast<std::size_t>(100 * i), 'a' + char(i)));
    }
    const std::size_t end = t.size();
    sluice::end_tar(t);
    {
        std::string bad = t;
        bad[at[4] + 3] ^= 1;  // the name of member 4: the checksum no longer holds
        auto e = sluice_test::parse_chunks<tar_p, sluice::record>(cut(bad, {333}, "b.tar"));
        REQUIRE(e.error == "sluice: bad tar header checksum in 'b.tar' at byte " + std::to_string(at[4]));
        REQUIRE(e.out.size() == 4);
        auto s = sluice_test::parse_chunks<tar_p, sluice::record>(cut(bad, {333}), {.corrupt = sluice::on_corrupt::skip});
        REQUIRE(s.error.empty());
        REQUIRE(s.skipped == 1);
        REQUIRE(s.out.size() == 9);
        REQUIRE(s.out[4].name == "f5.txt");
    }
    {
        std::string bad = t;
        bad[at[2] + 124] = 'x';  // size field
        for (int i = 148; i < 156; ++i) bad[at[2] + static_cast<std::size_t>(i)] = ' ';
        unsigned sum = 0;
        for (int i = 0; i < 512; ++i) sum += static_cast<unsigned char>(bad[at[2] + static_cast<std::size_t>(i)]);
        std::snprintf(&bad[at[2] + 148], 8, "%06o", sum);
        auto e = sluice_test::parse_chunks<tar_p, sluice::record>(cut(bad, {512}, "s.tar"));
        REQUIRE(e.error == "sluice: bad tar header (size field) in 's.tar' at byte " + std::to_string(at[2]));
    }
    for (std::size_t keep : {at[9] + 100, at[9] + 512, at[9] + 600}) {
        INFO("kept " << keep);
        auto e = sluice_test::parse_chunks<tar_p, sluice::record>(cut(t.substr(0, keep), {100}, "t.tar"));
        REQUIRE(e.error.starts_with("sluice: truncated tar archive"));
        REQUIRE(e.error.ends_with("in 't.tar' at byte " + std::to_string(at[9])));
        REQUIRE(e.out.size() == 9);
    }
    {
        // Cut at a member boundary without the end marker: every member is whole.
        auto p = sluice_test::parse_chunks<tar_p, sluice::record>(cut(t.substr(0, end), {100}));
        REQUIRE(p.error.empty());
        REQUIRE(p.out.size() == 10);
    }
    {
        std::string after = t;
        sluice::append_tar_file(after, "late.txt", "late");
        auto e = sluice_test::parse_chunks<tar_p, sluice::record>(cut(after, {1000}, "a.tar"));
        REQUIRE(e.error == "sluice: tar member after the end-of-archive marker in 'a.tar' at byte " + std::to_string(end + 1024));
        auto s = sluice_test::parse_chunks<tar_p, sluice::record>(cut(after, {1000}), {.corrupt = sluice::on_corrupt::skip});
        REQUIRE(s.out.size() == 11);  // nothing lost
        REQUIRE(s.skipped == 1);
    }
    std::string garbage(4096, '\0');
    sluice::detail::rng r(3);
    for (auto& c : garbage) c = static_cast<char>(r.next());
    auto g = sluice_test::parse_chunks<tar_p, sluice::record>(cut(garbage, {1000}, "g.tar"));
    REQUIRE(g.error == "sluice: bad tar header checksum in 'g.tar' at byte 0");
}

TEST_CASE("tar stage: gzip'd archives by name and by magic, in a pipeline", "[tar][gzip]") {
    std::string t;
    sluice::append_tar_file(t, "x/a.txt", "alpha");
    sluice::append_tar_file(t, std::string(150, 'n') + ".txt", "long");
    sluice::end_tar(t);
    auto chunks = cut(sluice_test::gzip(t), {10}, "one.tgz");  // by magic
    for (auto& c : cut(t, {10}, "two.tar")) chunks.push_back(std::move(c));
    std::vector<std::string> got;
    for (auto& r : sluice::pipeline(sluice::from(std::move(chunks)) | sluice::tar()))
        got.push_back(r.name + "=" + sluice_test::bytes_str(r.data));
    const std::string n150 = std::string(150, 'n') + ".txt=long";
    REQUIRE(got == std::vector<std::string>{"x/a.txt=alpha", n150, "x/a.txt=alpha", n150});
}

TEST_CASE("tar: pax size and path override the header, base-256 sizes", "[tar]") {
    std::string t;
    const std::string recs = "10 size=5\n" "17 path=pax/name\n";
    sluice::detail::tar_header(t, "././@PaxHeader", recs.size(), 'x');
    t += recs;
    sluice::detail::tar_pad(t);
    sluice::detail::tar_header(t, "short", 0, '0');  // the header says 0 bytes; pax says 5
    t += "hello";
    sluice::detail::tar_pad(t);
    // A GNU base-256 size field: top bit set, big-endian value.
    std::string b;
    sluice::detail::tar_header(b, "b256.txt", 0, '0');
    std::memset(&b[124], 0, 12);
    b[124] = static_cast<char>(0x80);
    b[135] = 3;
    std::memset(&b[148], ' ', 8);
    unsigned sum = 0;
    for (unsigned char c : b) sum += c;
    std::snprintf(&b[148], 8, "%06o", sum);
    t += b + "abc";
    sluice::detail::tar_pad(t);
    sluice::end_tar(t);
    auto p = sluice_test::parse_chunks<tar_p, sluice::record>(cut(t, {100}));
    REQUIRE(p.error.empty());
    REQUIRE(members(p.out) == std::vector<member>{{"pax/name", 5, crc32_z(0, reinterpret_cast<const Bytef*>("hello"), 5)},
                                                  {"b256.txt", 3, crc32_z(0, reinterpret_cast<const Bytef*>("abc"), 3)}});
    std::string bad = t;
    bad.replace(512, 2, "99");  // the pax record's length no longer fits
    auto e = sluice_test::parse_chunks<tar_p, sluice::record>(cut(bad, {100}, "p.tar"));
    REQUIRE(e.error == "sluice: bad pax extended header in 'p.tar' at byte 0");
}

TEST_CASE("tar: a shard cut inside padding or a skipped member names that member, not a byte past the end", "[tar][corrupt]") {
    std::string t;
    sluice::append_tar_file(t, "a.txt", "abc");  // 3 bytes of data, 509 of padding
    const std::size_t dir_at = t.size();
    sluice::detail::tar_header(t, "big-link", 5000, '2');  // a skipped member with data
    t += std::string(5000, 'x');
    sluice::detail::tar_pad(t);
    sluice::end_tar(t);
    auto pad = sluice_test::parse_chunks<tar_p, sluice::record>(cut(t.substr(0, 512 + 100), {64}, "p.tar"));
    REQUIRE(pad.error == "sluice: truncated tar archive (the shard ends inside the data or padding of member 'a.txt') in 'p.tar' at byte 0");
    REQUIRE(pad.out.size() == 1);  // its data was whole
    auto skipped = sluice_test::parse_chunks<tar_p, sluice::record>(cut(t.substr(0, dir_at + 512 + 1000), {64}, "s.tar"));
    REQUIRE(skipped.error == "sluice: truncated tar archive (the shard ends inside the data or padding of member 'big-link') in 's.tar' at byte " +
                                 std::to_string(dir_at));
}

TEST_CASE("tar.gz under skip: a broken member loses what it held, the next member is read in step", "[tar][gzip][corrupt]") {
    // One gzip member per tar member (as appendable archives are written).
    std::string files[3], gz;
    for (int i = 0; i < 3; ++i) {
        sluice::append_tar_file(files[i], "f" + std::to_string(i) + ".txt", std::string(3000 + static_cast<std::size_t>(i), 'a' + char(i)));
        gz += sluice_test::gzip(files[i]);
    }
    const std::string tail = sluice_test::gzip(std::string(1024, '\0'));
    gz += tail;
    const std::size_t first = sluice_test::gzip(files[0]).size();
    gz[first + 10] = 0x07;  // the second member's first deflate block: an invalid block type
    for (std::size_t size : {1ul, 100ul, 1ul << 20}) {
        INFO("chunk size " << size);
        auto p = sluice_test::parse_chunks<tar_p, sluice::record>(cut(gz, {size}, "x.tar.gz"),
                                                              {.corrupt = sluice::on_corrupt::skip, .gunzip = true});
        REQUIRE(p.error.empty());
        REQUIRE(members(p.out).size() == 2);
        REQUIRE(p.out[0].name == "f0.txt");
        REQUIRE(p.out[1].name == "f2.txt");
        REQUIRE(p.skipped == 1);
    }
    // A break that left half a member: the chunk after the loss is flagged, and the tar
    // parser drops the cut member and reads the next one in step.
    auto chunks = cut(files[0] + files[1].substr(0, 700), {100000}, "y.tar.gz");
    chunks.back().last = false;
    auto after = cut(files[2], {100000}, "y.tar.gz");
    after[0].source = chunks[0].source;
    after[0].offset = files[0].size() + 700;
    after[0].gap = true;
    chunks.push_back(std::move(after[0]));
    auto g = sluice_test::parse_chunks<tar_p, sluice::record>(std::move(chunks));
    REQUIRE(g.error.empty());
    REQUIRE(g.out.size() == 2);
    REQUIRE(g.out[1].name == "f2.txt");
    REQUIRE(g.out[1].offset == files[0].size() + 700 + 512);
}

namespace {
// Samples s0..s<n-1>, each "jpg" and "cls", as one tar; `at[i]` is where member i's header starts.
std::string samples_tar(int n, std::vector<std::size_t>& at, std::size_t jpg_size = 700) {
    std::string t;
    for (int i = 0; i < n; ++i) {
        at.push_back(t.size());
        sluice::append_tar_file(t, "s" + std::to_string(i) + ".jpg", std::string(jpg_size + i, char('a' + i)));
        at.push_back(t.size());
        sluice::append_tar_file(t, "s" + std::to_string(i) + ".cls", std::to_string(i));
    }
    sluice::end_tar(t);
    return t;
}
std::vector<std::string> keys(const std::vector<sluice::sample>& ss) {
    std::vector<std::string> k;
    for (auto& s : ss) k.push_back(s.key);
    return k;
}
using W = sluice::detail::webdataset_parser;
using K = std::vector<std::string>;
}  // namespace

TEST_CASE("tar: a member over max_record_bytes is an error naming shard, offset and limit, and skip reads on", "[tar][corrupt][limit]") {
    std::string t;
    sluice::append_tar_file(t, "a.txt", "small");
    const std::size_t big_at = t.size();
    sluice::append_tar_file(t, "b.bin", std::string(5000, 'b'));
    sluice::append_tar_file(t, "c.txt", "after");
    sluice::end_tar(t);
    for (std::size_t size : {1, 100, 512, 100000}) {
        INFO("chunk size " << size);
        auto e = sluice_test::parse_chunks<tar_p, sluice::record>(cut(t, {size}, "m.tar"), {.max_record_bytes = 1000});
        REQUIRE(sluice_test::strings(e.out) == std::vector<std::string>{"small"});
        REQUIRE(e.error == "sluice: tar member 'b.bin' of 5000 bytes over the limit of 1000 bytes (raise it with "
                           "max_record_bytes) in 'm.tar' at byte " + std::to_string(big_at));
        auto s = sluice_test::parse_chunks<tar_p, sluice::record>(cut(t, {size}, "m.tar"),
                                                              {.corrupt = sluice::on_corrupt::skip, .max_record_bytes = 1000});
        REQUIRE(s.error.empty());
        REQUIRE(s.skipped == 1);
        REQUIRE(sluice_test::strings(s.out) == std::vector<std::string>{"small", "after"});
        REQUIRE(s.held_peak <= 1000);  // the big member was never held
        REQUIRE(s.held_after == 0);
    }
}

TEST_CASE("tar: a member cut by chunk boundaries shows in held_bytes while it is assembled", "[tar][limit]") {
    std::string t;
    sluice::append_tar_file(t, "a.bin", std::string(3000, 'a'));
    sluice::end_tar(t);
    auto r = sluice_test::parse_chunks<tar_p, sluice::record>(cut(t, {700}));
    REQUIRE(r.out.size() == 1);
    REQUIRE(r.held_peak >= 2000);
    REQUIRE(r.held_peak <= 3000);
    REQUIRE(r.held_after == 0);
    sluice::pipeline p(sluice::from(cut(t, {700})) | sluice::tar());
    for (auto& rec : p) REQUIRE(rec.data.size() == 3000);
    std::uint64_t peak = 0;
    for (auto& st : p.figures().stages)
        for (auto& [n, v] : st.counters)
            if (st.name == "tar" && n == "held_bytes_peak") peak = v;
    REQUIRE(peak >= 2000);
}

TEST_CASE("webdataset under skip: a sample cut by a corruption is dropped and counted, never given partial", "[tar][webdataset][corrupt]") {
    std::vector<std::size_t> at;
    std::string t = samples_tar(6, at);
    t[at[5] + 148] ^= 0x11;  // s2.cls's header checksum: which sample it belonged to is unknown
    for (std::size_t size : {1, 300, 100000}) {
        INFO("chunk size " << size);
        auto s = sluice_test::parse_chunks<W, sluice::sample>(cut(t, {size}, "w.tar"), {.corrupt = sluice::on_corrupt::skip});
        REQUIRE(s.error.empty());
        REQUIRE(s.skipped == 1);
        // s2 lost its cls; s3 began right after the lost bytes and might have lost files too.
        REQUIRE(keys(s.out) == K{"s0", "s1", "s4", "s5"});
        REQUIRE(s.incomplete == 2);
        for (auto& x : s.out) REQUIRE(x.fields.size() == 2);
        REQUIRE(s.out[2].index == 4);
    }
    // A member over max_record_bytes is known by name: only its sample is dropped.
    std::string v;
    for (int i = 0; i < 4; ++i) {
        sluice::append_tar_file(v, "s" + std::to_string(i) + ".jpg", std::string(i == 1 ? 5000 : 100, 'j'));
        sluice::append_tar_file(v, "s" + std::to_string(i) + ".cls", std::to_string(i));
    }
    sluice::end_tar(v);
    auto k = sluice_test::parse_chunks<W, sluice::sample>(cut(v, {256}), {.corrupt = sluice::on_corrupt::skip, .max_record_bytes = 1000});
    REQUIRE(keys(k.out) == K{"s0", "s2", "s3"});
    REQUIRE(k.skipped == 1);
    REQUIRE(k.incomplete == 1);
}

TEST_CASE("webdataset: required fields: a sample without one is an error, or under skip dropped and counted", "[tar][webdataset][corrupt]") {
    std::string t;
    sluice::append_tar_file(t, "a.jpg", "J");
    sluice::append_tar_file(t, "a.cls", "1");
    sluice::append_tar_file(t, "b.jpg", "J");  // no cls
    sluice::append_tar_file(t, "c.jpg", "J");
    sluice::append_tar_file(t, "c.cls", "3");
    sluice::end_tar(t);
    auto e = sluice_test::parse_chunks<W, sluice::sample>(cut(t, {100}, "r.tar"), {.required = {"jpg", "cls"}});
    REQUIRE(keys(e.out) == K{"a"});
    REQUIRE(e.error == "sluice: WebDataset sample 'b' has no 'cls' file (a required field) in 'r.tar' at byte 2560");
    auto s = sluice_test::parse_chunks<W, sluice::sample>(cut(t, {100}, "r.tar"),
                                                          {.corrupt = sluice::on_corrupt::skip, .required = {"jpg", "cls"}});
    REQUIRE(keys(s.out) == K{"a", "c"});
    REQUIRE(s.skipped == 1);
    REQUIRE(s.out[1].index == 2);
    // Without required fields the same samples are all given.
    REQUIRE(keys(sluice_test::parse_chunks<W, sluice::sample>(cut(t, {100})).out) == K{"a", "b", "c"});
}

TEST_CASE("webdataset stage: required fields and the incomplete counter in a pipeline", "[tar][webdataset][corrupt]") {
    std::vector<std::size_t> at;
    std::string t = samples_tar(5, at);
    t[at[3] + 148] ^= 0x11;  // s1.cls
    sluice::pipeline p(sluice::from(cut(t, {1000}, "w.tar")) |
                       sluice::webdataset({.on_corrupt = sluice::on_corrupt::skip, .required = {"jpg", "cls"}}));
    std::vector<sluice::sample> got;
    for (auto& s : p) got.push_back(std::move(s));
    REQUIRE(keys(got) == K{"s0", "s3", "s4"});
    std::uint64_t incomplete = 0, corrupt = 0;
    for (auto& st : p.figures().stages)
        for (auto& [n, v] : st.counters) {
            if (st.name == "webdataset" && n == "incomplete") incomplete = v;
            if (st.name == "webdataset" && n == "corrupt") corrupt = v;
        }
    REQUIRE(incomplete == 2);
    REQUIRE(corrupt == 1);
}
