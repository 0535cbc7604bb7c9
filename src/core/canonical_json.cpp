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

/// Appends the ECMAScript Number::toString (ECMA-262 §6.1.6.1.20) of a non-zero number given
/// by its shortest digits, as RFC 8785 §3.2.2.3 requires.
void append_ecmascript_number(std::string& out, const decimal& d) {
    const auto k = static_cast<long long>(d.digits.size());
    const long long n = d.exponent + k; // value = 0.digits * 10^n
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
}

/// True for an integer literal (no fraction, no exponent) of at most 15 digits other than
/// zero. Such a value is exact as a double (below 2^53) and its own shortest round-trip
/// form, so its canonical text is the literal itself (JSON allows no leading zero).
bool is_short_integer(std::string_view lit) noexcept {
    const std::string_view digits = lit.starts_with('-') ? lit.substr(1) : lit;
    return !digits.empty() && digits.size() <= 15 && digits != "0" &&
           std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; });
}

/// Appends the canonical text of one number literal (see number_form for when it stays as
/// written).
void append_number(std::string& out, std::string_view lit, number_form form) {
    if (is_short_integer(lit)) {
        out += lit;
        return;
    }
    bool is_integer_literal = false;
    const decimal written = decompose_literal(lit, is_integer_literal);
    if (written.digits.empty()) {
        out.push_back('0'); // -0, 0.0, 0e5 ...: RFC 8785 writes every zero as 0
        return;
    }
    double value = 0;
    const auto res = std::from_chars(lit.data(), lit.data() + lit.size(), value);
    const bool in_range = res.ec == std::errc{} && value != 0 && value - value == 0;
    if (!in_range || written.digits.size() > 17) {
        out += lit;
        return;
    }
    const decimal shortest = decompose_double(value);
    if (shortest != written && (is_integer_literal || form == number_form::distinct)) {
        out += lit;
        return;
    }
    append_ecmascript_number(out, shortest);
}

/// RFC 8785 §3.2.2.2: only `"`, `\` and C0 controls are escaped, the short forms where JSON
/// has them, otherwise \u00xx in lower case. Everything else is copied as UTF-8.
void append_string(std::string& out, std::string_view s) {
    static constexpr char hex[] = "0123456789abcdef";
    out.push_back('"');
    const char* run = s.data(); // start of the bytes copied as they are
    const char* const end = s.data() + s.size();
    for (const char* p = run; p != end; ++p) {
        const auto c = static_cast<unsigned char>(*p);
        if (c >= 0x20 && c != '"' && c != '\\') {
            continue;
        }
        out.append(run, static_cast<std::size_t>(p - run));
        run = p + 1;
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
    out.append(run, static_cast<std::size_t>(end - run));
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

/// A member of an open object: its name (raw UTF-8, in workspace::names) and where its
/// canonical text (`"name":value`) starts and ends in the output.
struct member {
    std::size_t name_offset = 0;
    std::size_t name_size = 0;
    std::size_t text_begin = 0;
    std::size_t text_end = 0; ///< set when the object ends
};

/// One open array or object. Its canonical text goes to the output as it arrives; an
/// object's members are put in order when it ends.
struct frame {
    bool is_object = false;
    std::size_t begin = 0;        ///< offset of its '[' or '{' in the output
    std::size_t first_member = 0; ///< object: its first entry in workspace::members
    std::size_t names_begin = 0;  ///< object: where its names start in workspace::names
};

/// Buffers one canonicalisation needs besides its output. Each thread keeps one set, so a
/// document costs no allocation once they have grown to its size.
struct workspace {
    std::vector<frame> stack;    ///< the open containers, innermost last
    std::vector<member> members; ///< members of the open objects, object after object
    std::string names;           ///< their names, in the same order
    std::string part;            ///< a string, key or number arriving in parts
    std::string scratch;         ///< an object's members in arrival order, while sorted

    void clear() noexcept {
        stack.clear();
        members.clear();
        names.clear();
        part.clear();
    }
};

/// basic_parser handler writing the canonical text to `out`. Numbers, strings and keys may
/// arrive in parts; the parts are joined before use.
class canonical_handler {
public:
    static constexpr std::size_t max_object_size = static_cast<std::size_t>(-1);
    static constexpr std::size_t max_array_size = static_cast<std::size_t>(-1);
    static constexpr std::size_t max_key_size = static_cast<std::size_t>(-1);
    static constexpr std::size_t max_string_size = static_cast<std::size_t>(-1);

    canonical_handler(number_form form, std::string& out, workspace& ws)
        : form_(form), out_(out), ws_(ws) {}

    bool on_document_begin(error_code&) { return true; }
    bool on_document_end(error_code&) { return true; }

    bool on_array_begin(error_code&) {
        open(false, '[');
        return true;
    }
    bool on_array_end(std::size_t, error_code&) {
        ws_.stack.pop_back();
        out_.push_back(']');
        return true;
    }

    bool on_object_begin(error_code&) {
        open(true, '{');
        return true;
    }
    bool on_object_end(std::size_t, error_code& ec) {
        const frame f = ws_.stack.back();
        ws_.stack.pop_back();
        if (!sort_members(f)) {
            // Duplicate names make the document ambiguous (RFC 8785 §3.1 requires unique
            // names): which value would the upstream use?
            ec = boost::json::error::syntax;
            return false;
        }
        ws_.members.resize(f.first_member);
        ws_.names.resize(f.names_begin);
        out_.push_back('}');
        return true;
    }

    bool on_key_part(boost::json::string_view s, std::size_t, error_code&) {
        ws_.part.append(s.data(), s.size());
        return true;
    }
    bool on_key(boost::json::string_view s, std::size_t, error_code&) {
        const std::string_view name = joined(s);
        if (out_.size() > ws_.stack.back().begin + 1) {
            out_.push_back(',');
        }
        ws_.members.push_back(member{ws_.names.size(), name.size(), out_.size()});
        ws_.names += name;
        append_string(out_, name);
        out_.push_back(':');
        ws_.part.clear();
        return true;
    }

    bool on_string_part(boost::json::string_view s, std::size_t, error_code&) {
        ws_.part.append(s.data(), s.size());
        return true;
    }
    bool on_string(boost::json::string_view s, std::size_t, error_code&) {
        begin_value();
        append_string(out_, joined(s));
        ws_.part.clear();
        return true;
    }

    bool on_number_part(boost::json::string_view s, error_code&) {
        ws_.part.append(s.data(), s.size());
        return true;
    }
    bool on_int64(std::int64_t, boost::json::string_view s, error_code&) { return on_number(s); }
    bool on_uint64(std::uint64_t, boost::json::string_view s, error_code&) { return on_number(s); }
    bool on_double(double, boost::json::string_view s, error_code&) { return on_number(s); }

    bool on_bool(bool b, error_code&) {
        begin_value();
        out_ += b ? "true" : "false";
        return true;
    }
    bool on_null(error_code&) {
        begin_value();
        out_ += "null";
        return true;
    }
    bool on_comment_part(boost::json::string_view, error_code&) { return true; }
    bool on_comment(boost::json::string_view, error_code&) { return true; }

private:
    bool on_number(boost::json::string_view s) {
        begin_value();
        append_number(out_, joined(s), form_);
        ws_.part.clear();
        return true;
    }

    /// The whole string, key or number whose last part is `last`.
    std::string_view joined(boost::json::string_view last) {
        if (ws_.part.empty()) {
            return {last.data(), last.size()};
        }
        ws_.part.append(last.data(), last.size());
        return ws_.part;
    }

    /// A value starts: in an array, after a comma unless it is the first. (In an object the
    /// comma comes before the member's name.)
    void begin_value() {
        if (!ws_.stack.empty() && !ws_.stack.back().is_object &&
            out_.size() > ws_.stack.back().begin + 1) {
            out_.push_back(',');
        }
    }

    void open(bool is_object, char bracket) {
        begin_value();
        ws_.stack.push_back(frame{is_object, out_.size(), ws_.members.size(), ws_.names.size()});
        out_.push_back(bracket);
    }

    /// Puts the members of the object `f`, written after its '{' in arrival order, in
    /// RFC 8785 order. False when two have the same name.
    bool sort_members(const frame& f) {
        const auto first = ws_.members.begin() + static_cast<std::ptrdiff_t>(f.first_member);
        const auto last = ws_.members.end();
        for (auto m = first; m != last; ++m) {
            m->text_end = m + 1 != last ? (m + 1)->text_begin - 1 : out_.size(); // before ','
        }
        const auto name = [this](const member& m) {
            return std::string_view(ws_.names).substr(m.name_offset, m.name_size);
        };
        const auto by_name = [&name](const member& a, const member& b) {
            return utf16_less(name(a), name(b));
        };
        const bool in_order = std::is_sorted(first, last, by_name);
        if (!in_order) {
            std::sort(first, last, by_name);
        }
        if (std::adjacent_find(first, last, [&name](const member& a, const member& b) {
                return name(a) == name(b);
            }) != last) {
            return false;
        }
        if (!in_order) {
            // Same members, same commas: the sorted text has the length of the written one.
            const std::size_t body = f.begin + 1;
            ws_.scratch.assign(out_, body);
            char* p = out_.data() + body;
            for (auto m = first; m != last; ++m) {
                if (m != first) {
                    *p++ = ',';
                }
                const std::size_t size = m->text_end - m->text_begin;
                ws_.scratch.copy(p, size, m->text_begin - body);
                p += size;
            }
        }
        return true;
    }

    number_form form_;
    std::string& out_;
    workspace& ws_;
};

/// Buffers kept beyond this size are given back after the document (a large body once must
/// not pin its memory to the thread).
constexpr std::size_t kept_workspace_bytes = 64 * 1024;

workspace& thread_workspace() {
    thread_local workspace ws;
    return ws;
}

void trim(workspace& ws) {
    if (ws.members.capacity() * sizeof(member) > kept_workspace_bytes) {
        ws.members = {};
    }
    if (ws.stack.capacity() * sizeof(frame) > kept_workspace_bytes) {
        ws.stack = {};
    }
    for (std::string* s : {&ws.names, &ws.part, &ws.scratch}) {
        if (s->capacity() > kept_workspace_bytes) {
            *s = {};
        }
    }
}

} // namespace

bool canonicalize_json_into(std::string_view json, number_form form, std::string& out) {
    // Not reentrant, and need not be: the handler calls nothing that canonicalises.
    workspace& ws = thread_workspace();
    ws.clear();
    out.clear();
    out.reserve(json.size()); // the usual size: whitespace goes, numbers rarely grow
    boost::json::parse_options opts;
    opts.max_depth = 128;
    boost::json::basic_parser<canonical_handler> parser(opts, form, out, ws);
    error_code ec;
    const std::size_t used = parser.write_some(false, json.data(), json.size(), ec);
    trim(ws);
    return !ec && used == json.size() && parser.done();
}

std::optional<std::string> canonicalize_json(std::string_view json, number_form form) {
    std::string out;
    if (!canonicalize_json_into(json, form, out)) {
        return std::nullopt;
    }
    return out;
}

} // namespace onceproxy::core
