#include <sluice/io/list.hpp>

#include "support/test_support.hpp"

#include <sluice/core/pipeline.hpp>

using sluice::detail::expand_braces;
using expansions = std::vector<std::string>;

TEST_CASE("brace ranges expand as WebDataset writes them", "[list]") {
    REQUIRE(expand_braces("shard-{000..003}.tar") == expansions{"shard-000.tar", "shard-001.tar", "shard-002.tar", "shard-003.tar"});
    REQUIRE(expand_braces("s{8..11}") == expansions{"s8", "s9", "s10", "s11"});
    REQUIRE(expand_braces("s{3..1}") == expansions{"s3", "s2", "s1"});
    REQUIRE(expand_braces("{train,val}/p{0..1}") == expansions{"train/p0", "train/p1", "val/p0", "val/p1"});
    REQUIRE(expand_braces("{a,b{1,2}}x") == expansions{"ax", "b1x", "b2x"});
    REQUIRE(expand_braces("plain.txt") == expansions{"plain.txt"});
    REQUIRE(expand_braces("lit{x}eral") == expansions{"lit{x}eral"});
    REQUIRE(expand_braces("s3://bucket/shard-{0..1}.tar") == expansions{"s3://bucket/shard-0.tar", "s3://bucket/shard-1.tar"});
    REQUIRE(expand_braces("shard-{000000..127999}.tar").size() == 128000);
    REQUIRE(expand_braces("x{y{a,b}") == expansions{"x{ya", "x{yb"});  // an unmatched '{' is literal
    REQUIRE_THROWS_WITH(expand_braces("{0..9999}{0..9999}"), Catch::Contains("more than 10 million"));
    REQUIRE_THROWS_WITH(expand_braces("{0..99999999999}"), Catch::Contains("more than 10 million"));
    REQUIRE(sluice::detail::expansion_count("{a,b{1..3}}-{00..09}") == 40);
}

TEST_CASE("globs and directories expand sorted, URLs pass through", "[list]") {
    sluice_test::temp_dir d;
    for (auto n : {"b.txt", "a.txt", "c.bin", "sub/z.txt"}) d.write(n, "x");
    REQUIRE(sluice::expand({d / "*.txt"}) == expansions{d / "a.txt", d / "b.txt"});
    REQUIRE(sluice::expand({d.path().string()}) == expansions{d / "a.txt", d / "b.txt", d / "c.bin", d / "sub/z.txt"});
    REQUIRE(sluice::expand({"file://" + d / "{a,b}.txt"}) == expansions{d / "a.txt", d / "b.txt"});
    REQUIRE(sluice::expand({"http://host/x-{1..2}"}) == expansions{"http://host/x-1", "http://host/x-2"});
    REQUIRE(sluice::expand({d / "missing.txt"}) == expansions{d / "missing.txt"});  // named when read
    REQUIRE(sluice::expand({d / "s*"}) == expansions{d / "sub/z.txt"});  // a matched directory is expanded
}

TEST_CASE("a glob matching nothing is an error naming the pattern", "[list]") {
    sluice_test::temp_dir d;
    const auto pattern = d / "nothing-*.tar";
    REQUIRE_THROWS_WITH(sluice::expand({pattern}), Catch::Contains("no file matches '" + pattern + "'"));
    sluice::pipeline p(sluice::list(pattern));
    REQUIRE_THROWS_WITH(p.next_blocking(), Catch::Contains(pattern));
}

TEST_CASE("list is a source of paths", "[list]") {
    sluice_test::temp_dir d;
    d.write("x1", "");
    d.write("x2", "");
    expansions got;
    for (auto& s : sluice::pipeline(sluice::list({d / "x{1..2}"}))) got.push_back(s);
    REQUIRE(got == expansions{d / "x1", d / "x2"});
}

TEST_CASE("@FILE lists paths and URLs, one pattern per line", "[list]") {
    sluice_test::temp_dir d;
    d.write("a.txt", "x");
    d.write("b.txt", "y");
    const auto listing = d.write("urls.txt", "# the training set\nhttp://h/{0..1}.tar\n\n  " + (d / "*.txt") + "  \r\n");
    const auto got = sluice::expand({"@" + listing});
    REQUIRE(got == std::vector<std::string>{"http://h/0.tar", "http://h/1.tar", d / "a.txt", d / "b.txt", d / "urls.txt"});
    REQUIRE_THROWS_WITH(sluice::expand({"@" + (d / "missing.txt")}),
                        "sluice: cannot read the list file '" + (d / "missing.txt") + "': No such file or directory");
}

TEST_CASE("@FILE: relative entries are relative to the list file, a loop is an error", "[list]") {
    sluice_test::temp_dir d;
    d.write("sub/x.bin", "x");
    d.write("sub/list.txt", "x.bin\n");
    REQUIRE(sluice::expand({"@" + (d / "sub/list.txt")}) == std::vector<std::string>{d / "sub/x.bin"});
    d.write("loop.txt", "@" + (d / "loop.txt") + "\n");
    REQUIRE_THROWS_WITH(sluice::expand({"@" + (d / "loop.txt")}),
                        Catch::Matchers::StartsWith("sluice: list files nested too deep (a loop?) at '"));
}

TEST_CASE("an empty listing is an error naming the directory or pattern, never 0 items", "[list]") {
    sluice_test::temp_dir d;
    std::filesystem::create_directories(d / "empty/sub");  // no file anywhere below
    REQUIRE_THROWS_WITH(sluice::expand({d / "empty"}), "sluice: no file in directory '" + (d / "empty") +
                                                           "': No such file or directory");
    sluice::pipeline p(sluice::list(d / "empty"));
    REQUIRE_THROWS_WITH(p.next_blocking(), Catch::Contains("no file in directory '" + (d / "empty") + "'"));
    // A glob that matches only empty directories: the pattern is named.
    REQUIRE_THROWS_WITH(sluice::expand({d / "emp*"}), Catch::Contains("no file matches (only empty directories) '" +
                                                                      (d / "emp*") + "'"));
    // An empty directory beside files adds nothing and is no error.
    d.write("full/a.txt", "x");
    REQUIRE(sluice::expand({d / "*"}) == expansions{d / "full/a.txt"});
}
