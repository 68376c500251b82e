// The JSON object reader behind labels in WebDataset .json fields.
#include <sluice/core/detail/json.hpp>

#include <catch2/catch.hpp>

using sluice::detail::json_error;
using sluice::detail::json_object_reader;

TEST_CASE("json_object_reader gives a top-level member's raw value and skips everything else", "[json]") {
    const std::string doc = R"( { "a" : "x\"y" , "nested": {"label": 1, "arr": [1, [2, {"label": 2}], "]"]},
                                  "label" : -42 , "after": true } )";
    json_object_reader r(doc);
    CHECK(r.member("label") == std::string_view("-42"));
    CHECK(r.member("a") == std::string_view(R"("x\"y")"));
    CHECK(json_object_reader::string_value(*r.member("a")) == "x\"y");
    CHECK(r.member("nested")->front() == '{');
    CHECK(r.member("after") == std::string_view("true"));
    CHECK_FALSE(r.member("missing").has_value());
    CHECK_FALSE(json_object_reader("{}").member("label").has_value());
}

TEST_CASE("json_object_reader decodes escaped keys and strings, surrogate pairs included", "[json]") {
    json_object_reader r(R"({"l\u0061bel": 5, "s": "tab\tnl\nsnow\u2603 clef\ud834\udd1e"})");
    CHECK(r.member("label") == std::string_view("5"));
    CHECK(json_object_reader::string_value(*r.member("s")) == "tab\tnl\nsnow\xe2\x98\x83 clef\xf0\x9d\x84\x9e");
}

TEST_CASE("json_object_reader refuses malformed documents with the byte offset, never reads past the end", "[json]") {
    for (const char* bad : {"", "[1]", "{", R"({"a")", R"({"a":})", R"({"a": 1,)", R"({"a": "unterminated)",
                            R"({"a": [1, 2})", R"({a: 1})", "{\"a\": \"ctl\x01\"}", R"({"a": "\)"}) {
        INFO(bad);
        CHECK_THROWS_AS(json_object_reader(bad).member("z"), json_error);
    }
    CHECK_THROWS_WITH(json_object_reader(R"({"a": 1 "b": 2})").member("b"), Catch::Contains("expected '}'") && Catch::Contains("at byte 8"));
    std::string deep(100, '[');
    CHECK_THROWS_WITH(json_object_reader("{\"a\": " + deep + "}").member("z"), Catch::Contains("nesting deeper than 64"));
    CHECK_THROWS_AS(json_object_reader::string_value(R"("bad \q")"), json_error);
    CHECK_THROWS_AS(json_object_reader::string_value(R"("\u12")"), json_error);
}
