#pragma once
// A minimal JSON writer for reports (objects, arrays, strings, numbers), and a reader of
// one object's top-level members (a label in a WebDataset .json field): it checks the
// structure it walks and never builds a tree.

#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

namespace sluice::detail {

class json_writer {
public:
    json_writer& begin_object() { return open('{'); }
    json_writer& end_object() { return close('}'); }
    json_writer& begin_array() { return open('['); }
    json_writer& end_array() { return close(']'); }
    json_writer& key(std::string_view k) {
        comma();
        string(k);
        out_ += ':';
        after_key_ = true;
        return *this;
    }
    json_writer& value(std::string_view s) {
        comma();
        string(s);
        return *this;
    }
    json_writer& value(const char* s) { return value(std::string_view(s)); }
    json_writer& value(const std::string& s) { return value(std::string_view(s)); }
    json_writer& value(std::uint64_t v) {
        comma();
        out_ += std::to_string(v);
        return *this;
    }
    json_writer& value(std::int64_t v) {
        comma();
        out_ += std::to_string(v);
        return *this;
    }
    json_writer& value(int v) { return value(static_cast<std::int64_t>(v)); }
    json_writer& value(unsigned v) { return value(static_cast<std::uint64_t>(v)); }
    json_writer& value(bool v) {
        comma();
        out_ += v ? "true" : "false";
        return *this;
    }
    json_writer& value(double v) {
        comma();
        if (!std::isfinite(v)) {
            out_ += "null";
            return *this;
        }
        char buf[64];
        std::snprintf(buf, sizeof buf, "%.6g", v);
        out_ += buf;
        return *this;
    }
    /// A number with `decimals` digits after the point (a trace's microseconds, where
    /// value(double)'s six significant digits would round a long run's times).
    json_writer& fixed(double v, int decimals) {
        comma();
        if (!std::isfinite(v)) {
            out_ += "null";
            return *this;
        }
        char buf[64];
        std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
        out_ += buf;
        return *this;
    }
    const std::string& str() const noexcept { return out_; }

private:
    json_writer& open(char c) {
        comma();
        out_ += c;
        first_ = true;
        return *this;
    }
    json_writer& close(char c) {
        out_ += c;
        first_ = false;
        return *this;
    }
    void comma() {
        if (after_key_) {
            after_key_ = false;
            return;
        }
        if (!first_ && !out_.empty()) out_ += ',';
        first_ = false;
    }
    void string(std::string_view s) {
        out_ += '"';
        for (unsigned char c : s) {
            switch (c) {
                case '"': out_ += "\\\""; break;
                case '\\': out_ += "\\\\"; break;
                case '\n': out_ += "\\n"; break;
                case '\r': out_ += "\\r"; break;
                case '\t': out_ += "\\t"; break;
                default:
                    if (c < 0x20) {
                        char buf[8];
                        std::snprintf(buf, sizeof buf, "\\u%04x", c);
                        out_ += buf;
                    } else {
                        out_ += static_cast<char>(c);
                    }
            }
        }
        out_ += '"';
    }
    std::string out_;
    bool first_ = true;
    bool after_key_ = false;
};

/// Malformed JSON: what was expected, and the byte offset.
class json_error : public std::runtime_error {
public:
    json_error(const std::string& what, std::size_t offset)
        : std::runtime_error(what + " at byte " + std::to_string(offset)), offset_(offset) {}
    std::size_t offset() const noexcept { return offset_; }

private:
    std::size_t offset_;
};

/// Reads the top-level members of one JSON object. `member(key)` gives the raw text of
/// the value of the first member named `key` (a string with its quotes, a number, an
/// object...), or nothing when the object has no such member; `string_value` decodes a
/// raw string. Whatever is walked is checked; nesting deeper than 64 is refused.
class json_object_reader {
public:
    explicit json_object_reader(std::string_view doc) : d_(doc) {}

    std::optional<std::string_view> member(std::string_view key) {
        i_ = 0;
        ws();
        expect('{');
        ws();
        if (peek() == '}') return std::nullopt;
        for (;;) {
            ws();
            std::size_t k0 = i_;
            skip_string();
            bool match = string_value(d_.substr(k0, i_ - k0)) == key;
            ws();
            expect(':');
            ws();
            std::size_t v0 = i_;
            skip_value(1);
            if (match) return d_.substr(v0, i_ - v0);
            ws();
            if (peek() == ',') {
                ++i_;
                continue;
            }
            expect('}');
            return std::nullopt;
        }
    }

    /// A raw JSON string (with its quotes) decoded to UTF-8.
    static std::string string_value(std::string_view raw) {
        if (raw.size() < 2 || raw.front() != '"' || raw.back() != '"') throw json_error("expected a string", 0);
        std::string out;
        for (std::size_t i = 1; i + 1 < raw.size(); ++i) {
            char c = raw[i];
            if (c != '\\') {
                out += c;
                continue;
            }
            if (++i + 1 >= raw.size()) throw json_error("bad escape", i);
            switch (raw[i]) {
                case '"': out += '"'; break;
                case '\\': out += '\\'; break;
                case '/': out += '/'; break;
                case 'b': out += '\b'; break;
                case 'f': out += '\f'; break;
                case 'n': out += '\n'; break;
                case 'r': out += '\r'; break;
                case 't': out += '\t'; break;
                case 'u': {
                    std::uint32_t cp = hex4(raw, i + 1);
                    i += 4;
                    if (cp >= 0xd800 && cp < 0xdc00 && i + 6 < raw.size() && raw[i + 1] == '\\' && raw[i + 2] == 'u') {
                        std::uint32_t lo = hex4(raw, i + 3);
                        if (lo >= 0xdc00 && lo < 0xe000) {
                            cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
                            i += 6;
                        }
                    }
                    utf8(out, cp);
                    break;
                }
                default: throw json_error("bad escape", i);
            }
        }
        return out;
    }

private:
    char peek() const { return i_ < d_.size() ? d_[i_] : '\0'; }
    void ws() {
        while (i_ < d_.size() && (d_[i_] == ' ' || d_[i_] == '\t' || d_[i_] == '\n' || d_[i_] == '\r')) ++i_;
    }
    void expect(char c) {
        if (peek() != c || i_ >= d_.size()) throw json_error(std::string("expected '") + c + "'", i_);
        ++i_;
    }
    void skip_string() {
        expect('"');
        while (i_ < d_.size() && d_[i_] != '"') {
            if (static_cast<unsigned char>(d_[i_]) < 0x20) throw json_error("control character in a string", i_);
            i_ += d_[i_] == '\\' ? 2 : 1;
        }
        expect('"');
    }
    void skip_value(int depth) {
        if (depth > 64) throw json_error("nesting deeper than 64", i_);
        char c = peek();
        if (c == '"') return skip_string();
        if (c == '{' || c == '[') {
            char close = c == '{' ? '}' : ']';
            ++i_;
            ws();
            if (peek() == close) {
                ++i_;
                return;
            }
            for (;;) {
                ws();
                if (c == '{') {
                    skip_string();
                    ws();
                    expect(':');
                    ws();
                }
                skip_value(depth + 1);
                ws();
                if (peek() == ',') {
                    ++i_;
                    continue;
                }
                expect(close);
                return;
            }
        }
        std::size_t v0 = i_;
        while (i_ < d_.size() && (std::isalnum(static_cast<unsigned char>(d_[i_])) || d_[i_] == '-' || d_[i_] == '+' || d_[i_] == '.'))
            ++i_;
        if (i_ == v0) throw json_error("expected a value", i_);
    }
    static std::uint32_t hex4(std::string_view s, std::size_t at) {
        if (at + 4 > s.size()) throw json_error("bad \\u escape", at);
        std::uint32_t v = 0;
        for (std::size_t k = at; k < at + 4; ++k) {
            char h = s[k];
            v <<= 4;
            if (h >= '0' && h <= '9') v |= static_cast<std::uint32_t>(h - '0');
            else if (h >= 'a' && h <= 'f') v |= static_cast<std::uint32_t>(h - 'a' + 10);
            else if (h >= 'A' && h <= 'F') v |= static_cast<std::uint32_t>(h - 'A' + 10);
            else throw json_error("bad \\u escape", k);
        }
        return v;
    }
    static void utf8(std::string& out, std::uint32_t cp) {
        if (cp < 0x80) {
            out += static_cast<char>(cp);
        } else if (cp < 0x800) {
            out += static_cast<char>(0xc0 | (cp >> 6));
            out += static_cast<char>(0x80 | (cp & 0x3f));
        } else if (cp < 0x10000) {
            out += static_cast<char>(0xe0 | (cp >> 12));
            out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
            out += static_cast<char>(0x80 | (cp & 0x3f));
        } else {
            out += static_cast<char>(0xf0 | (cp >> 18));
            out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
            out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
            out += static_cast<char>(0x80 | (cp & 0x3f));
        }
    }

    std::string_view d_;
    std::size_t i_ = 0;
};

}  // namespace sluice::detail
