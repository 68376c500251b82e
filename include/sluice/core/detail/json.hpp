#pragma once
// A minimal JSON writer for reports (objects, arrays, strings, numbers); no parser.

#include <cmath>
#include <cstdint>
#include <cstdio>
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

}  // namespace sluice::detail
