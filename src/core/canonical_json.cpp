#include <onceproxy/core/canonical_json.hpp>

#include <boost/json/basic_parser_impl.hpp>
#include <boost/json/error.hpp>

#include <algorithm>
#include <array>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <system_error>
#include <utility>
#include <vector>

namespace onceproxy::core {

namespace {

using boost::json::error_code;

/// A decimal number reduced to sign, significant digits (no leading or trailing zero) and
/// the power of ten of the last digit: value = (negative ? -1 : 1) * digits * 10^exponent.
/// Zero has empty digits and no sign.
struct decimal {
    bool negative = false;
    std::string digits;
    long long exponent = 0;

    bool operator==(const decimal&) const = default;
};

/// Parses a JSON number literal (grammar already checked by the parser).
decimal decompose_literal(std::string_view lit, bool& is_integer_literal) {
    decimal d;
    std::size_t i = 0;
    if (i < lit.size() && lit[i] == '-') {
        d.negative = true;
        ++i;
    }
    is_integer_literal = true;
    long long frac_digits = 0;
    bool in_fraction = false;
    for (; i < lit.size(); ++i) {
        const char c = lit[i];
        if (c == '.') {
            in_fraction = true;
            is_integer_literal = false;
        } else if (c == 'e' || c == 'E') {
            is_integer_literal = false;
            break;
        } else {
            d.digits.push_back(c);
            if (in_fraction) {
                ++frac_digits;
            }
        }
    }
    long long exp = 0;
    if (i < lit.size()) {
        ++i; // 'e'
        bool exp_negative = false;
        if (i < lit.size() && (lit[i] == '+' || lit[i] == '-')) {
            exp_negative = lit[i] == '-';
            ++i;
        }
        for (; i < lit.size(); ++i) {
            // Saturate: an exponent this large is out of the double range either way.
            if (exp < 1'000'000'000LL) {
                exp = exp * 10 + (lit[i] - '0');
            }
        }
        if (exp_negative) {
            exp = -exp;
        }
    }
    d.exponent = exp - frac_digits;
    const auto first = d.digits.find_first_not_of('0');
    if (first == std::string::npos) {
        return decimal{}; // zero, whatever its sign and exponent
    }
    d.digits.erase(0, first);
    const auto last = d.digits.find_last_not_of('0');
    d.exponent += static_cast<long long>(d.digits.size() - 1 - last);
    d.digits.erase(last + 1);
    return d;
}

/// The shortest round-trip digits of a finite non-zero double.
decimal decompose_double(double v) {
    std::array<char, 64> buf{};
    const auto res =
        std::to_chars(buf.data(), buf.data() + buf.size(), v, std::chars_format::scientific);
    const std::string_view s(buf.data(), static_cast<std::size_t>(res.ptr - buf.data()));
    decimal d;
    std::size_t i = 0;
    if (s[i] == '-') {
        d.negative = true;
        ++i;
    }
    for (; i < s.size() && s[i] != 'e'; ++i) {
        if (s[i] != '.') {
            d.digits.push_back(s[i]);
        }
    }
    long long exp = 0;
    std::from_chars(s.data() + i + 1 + (s[i + 1] == '+' ? 1 : 0), s.data() + s.size(), exp);
    d.exponent = exp - static_cast<long long>(d.digits.size() - 1);
    const auto last = d.digits.find_last_not_of('0');
    d.exponent += static_cast<long long>(d.digits.size() - 1 - last);
    d.digits.erase(last + 1);
    return d;
}

/// ECMAScript Number::toString (ECMA-262 §6.1.6.1.20) of a non-zero number given by its
/// shortest digits, as RFC 8785 §3.2.2.3 requires.
std::string ecmascript_number(const decimal& d) {
    const auto k = static_cast<long long>(d.digits.size());
    const long long n = d.exponent + k; // value = 0.digits * 10^n
    std::string out;
    if (d.negative) {
        out.push_back('-');
    }
    if (k <= n && n <= 21) {
        out += d.digits;
        out.append(static_cast<std::size_t>(n - k), '0');
    } else if (0 < n && n <= 21) {
        out.append(d.digits, 0, static_cast<std::size_t>(n));
        out.push_back('.');
        out.append(d.digits, static_cast<std::size_t>(n));
    } else if (-6 < n && n <= 0) {
        out += "0.";
        out.append(static_cast<std::size_t>(-n), '0');
        out += d.digits;
    } else {
        out.push_back(d.digits[0]);
        if (k > 1) {
            out.push_back('.');
            out.append(d.digits, 1);
        }
        out.push_back('e');
        out.push_back(n - 1 >= 0 ? '+' : '-');
        out += std::to_string(n - 1 >= 0 ? n - 1 : 1 - n);
    }
    return out;
}

/// The canonical text of one number literal (see number_form for when it stays as written).
std::string canonical_number(std::string_view lit, number_form form) {
    bool is_integer_literal = false;
    const decimal written = decompose_literal(lit, is_integer_literal);
    if (written.digits.empty()) {
        return "0"; // -0, 0.0, 0e5 ...: RFC 8785 writes every zero as 0
    }
    double value = 0;
    const auto res = std::from_chars(lit.data(), lit.data() + lit.size(), value);
    const bool in_range = res.ec == std::errc{} && value != 0 && value - value == 0;
    if (!in_range || written.digits.size() > 17) {
        return std::string(lit);
    }
    const decimal shortest = decompose_double(value);
    if (shortest != written && (is_integer_literal || form == number_form::distinct)) {
        return std::string(lit);
    }
    return ecmascript_number(shortest);
}

/// RFC 8785 §3.2.2.2: only `"`, `\` and C0 controls are escaped, the short forms where JSON
/// has them, otherwise \u00xx in lower case. Everything else is copied as UTF-8.
void append_string(std::string& out, std::string_view s) {
    static constexpr char hex[] = "0123456789abcdef";
    out.push_back('"');
    std::size_t run = 0; // start of the bytes copied as they are
    for (std::size_t i = 0; i < s.size(); ++i) {
        const auto c = static_cast<unsigned char>(s[i]);
        if (c >= 0x20 && c != '"' && c != '\\') {
            continue;
        }
        out.append(s, run, i - run);
        run = i + 1;
        switch (c) {
        case '"':
            out += "\\\"";
            break;
        case '\\':
            out += "\\\\";
            break;
        case '\b':
            out += "\\b";
            break;
        case '\f':
            out += "\\f";
            break;
        case '\n':
            out += "\\n";
            break;
        case '\r':
            out += "\\r";
            break;
        case '\t':
            out += "\\t";
            break;
        default:
            out += "\\u00";
            out.push_back(hex[(c >> 4) & 0xfU]);
            out.push_back(hex[c & 0xfU]);
        }
    }
    out.append(s, run, s.size() - run);
    out.push_back('"');
}

/// RFC 8785 §3.2.3 sorts member names by their UTF-16 code units. For valid UTF-8 (the
/// parser has validated it) that is byte order, except that a supplementary character (4-byte
/// sequence, a surrogate pair 0xD800-0xDBFF in UTF-16) sorts before U+E000-U+FFFF (3-byte
/// sequences led by 0xEE or 0xEF). Both strings agree up to the first differing byte, so
/// that byte starts a character in both, or continues characters with the same lead byte.
bool utf16_less(std::string_view a, std::string_view b) noexcept {
    const std::size_t n = std::min(a.size(), b.size());
    for (std::size_t i = 0; i < n; ++i) {
        const auto x = static_cast<unsigned char>(a[i]);
        const auto y = static_cast<unsigned char>(b[i]);
        if (x == y) {
            continue;
        }
        if (x >= 0xf0 && (y == 0xee || y == 0xef)) {
            return true;
        }
        if (y >= 0xf0 && (x == 0xee || x == 0xef)) {
            return false;
        }
        return x < y;
    }
    return a.size() < b.size();
}

struct member {
    std::string name;  ///< raw UTF-8
    std::string value; ///< canonical text
};

/// One open array or object. Arrays are written as they arrive; object members are kept
/// until the object ends, then sorted.
struct frame {
    bool is_object = false;
    std::string text; ///< array: canonical text so far, without the closing bracket
    std::vector<member> members;
    std::string key; ///< object: name of the member whose value comes next
};

/// basic_parser handler producing the canonical text. Numbers, strings and keys may arrive
/// in parts; the parts are joined before use.
class canonical_handler {
public:
    static constexpr std::size_t max_object_size = static_cast<std::size_t>(-1);
    static constexpr std::size_t max_array_size = static_cast<std::size_t>(-1);
    static constexpr std::size_t max_key_size = static_cast<std::size_t>(-1);
    static constexpr std::size_t max_string_size = static_cast<std::size_t>(-1);

    explicit canonical_handler(number_form form) : form_(form) {}

    std::string& result() noexcept { return result_; }

    bool on_document_begin(error_code&) { return true; }
    bool on_document_end(error_code&) { return true; }

    bool on_array_begin(error_code&) {
        open_frame(false).text.push_back('[');
        return true;
    }
    bool on_array_end(std::size_t, error_code&) {
        frame& f = stack_[--depth_];
        f.text.push_back(']');
        add_value(f.text);
        return true;
    }

    bool on_object_begin(error_code&) {
        open_frame(true);
        return true;
    }
    bool on_object_end(std::size_t, error_code& ec) {
        frame& f = stack_[--depth_];
        std::sort(f.members.begin(), f.members.end(),
                  [](const member& a, const member& b) { return utf16_less(a.name, b.name); });
        f.text.push_back('{');
        for (std::size_t i = 0; i < f.members.size(); ++i) {
            // Duplicate names make the document ambiguous (RFC 8785 §3.1 requires unique
            // names): which value would the upstream use?
            if (i > 0 && f.members[i].name == f.members[i - 1].name) {
                ec = boost::json::error::syntax;
                return false;
            }
            if (i > 0) {
                f.text.push_back(',');
            }
            append_string(f.text, f.members[i].name);
            f.text.push_back(':');
            f.text += f.members[i].value;
        }
        f.text.push_back('}');
        add_value(f.text);
        return true;
    }

    bool on_key_part(boost::json::string_view s, std::size_t, error_code&) {
        part_.append(s.data(), s.size());
        return true;
    }
    bool on_key(boost::json::string_view s, std::size_t, error_code&) {
        part_.append(s.data(), s.size());
        stack_[depth_ - 1].key.swap(part_);
        part_.clear();
        return true;
    }

    bool on_string_part(boost::json::string_view s, std::size_t, error_code&) {
        part_.append(s.data(), s.size());
        return true;
    }
    bool on_string(boost::json::string_view s, std::size_t, error_code&) {
        part_.append(s.data(), s.size());
        scratch_.clear();
        append_string(scratch_, part_);
        part_.clear();
        add_value(scratch_);
        return true;
    }

    bool on_number_part(boost::json::string_view s, error_code&) {
        part_.append(s.data(), s.size());
        return true;
    }
    bool on_int64(std::int64_t, boost::json::string_view s, error_code&) { return on_number(s); }
    bool on_uint64(std::uint64_t, boost::json::string_view s, error_code&) { return on_number(s); }
    bool on_double(double, boost::json::string_view s, error_code&) { return on_number(s); }

    bool on_bool(bool b, error_code&) {
        add_value(b ? "true" : "false");
        return true;
    }
    bool on_null(error_code&) {
        add_value("null");
        return true;
    }
    bool on_comment_part(boost::json::string_view, error_code&) { return true; }
    bool on_comment(boost::json::string_view, error_code&) { return true; }

private:
    bool on_number(boost::json::string_view s) {
        part_.append(s.data(), s.size());
        const std::string text = canonical_number(part_, form_);
        part_.clear();
        add_value(text);
        return true;
    }

    /// Frames are reused across siblings so their buffers keep their capacity.
    frame& open_frame(bool is_object) {
        if (depth_ == stack_.size()) {
            stack_.emplace_back();
        }
        frame& f = stack_[depth_++];
        f.is_object = is_object;
        f.text.clear();
        f.members.clear();
        f.key.clear();
        return f;
    }

    /// Adds a finished value to the innermost open container (or makes it the document).
    void add_value(std::string_view text) {
        if (depth_ == 0) {
            result_.assign(text);
            return;
        }
        frame& top = stack_[depth_ - 1];
        if (top.is_object) {
            top.members.push_back(member{std::move(top.key), std::string(text)});
            top.key.clear();
        } else {
            if (top.text.size() > 1) {
                top.text.push_back(',');
            }
            top.text += text;
        }
    }

    number_form form_;
    std::vector<frame> stack_; ///< [0, depth_) are open; the rest are kept for reuse
    std::size_t depth_ = 0;
    std::string part_;
    std::string scratch_;
    std::string result_;
};

} // namespace

std::optional<std::string> canonicalize_json(std::string_view json, number_form form) {
    boost::json::parse_options opts;
    opts.max_depth = 128;
    boost::json::basic_parser<canonical_handler> parser(opts, form);
    error_code ec;
    const std::size_t used = parser.write_some(false, json.data(), json.size(), ec);
    if (ec || used != json.size() || !parser.done()) {
        return std::nullopt;
    }
    return std::move(parser.handler().result());
}

} // namespace onceproxy::core
