#include "request_facts.hpp"

#include <boost/beast/core/string.hpp>

#include <charconv>

namespace onceproxy::test_upstream {

namespace {

using boost::beast::iequals;

bool parse_u64(std::string_view text, std::uint64_t& out) {
    auto const* end = text.data() + text.size();
    auto [ptr, ec] = std::from_chars(text.data(), end, out);
    return ec == std::errc{} && ptr == end && !text.empty();
}

std::string_view trim(std::string_view s) {
    while (!s.empty() && (s.front() == ' ' || s.front() == '\t'))
        s.remove_prefix(1);
    while (!s.empty() && (s.back() == ' ' || s.back() == '\t'))
        s.remove_suffix(1);
    return s;
}

char to_lower(char c) {
    return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
}

// RFC 9110 §5.6.2 token characters.
bool is_token(std::string_view s) {
    if (s.empty())
        return false;
    for (char c : s) {
        bool ok = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                  std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
        if (!ok)
            return false;
    }
    return true;
}

void append_joined(std::string& to, bool& present, std::string_view value) {
    if (present)
        to += ", ";
    to += value;
    present = true;
}

// Appends `name` (lowercase) to the comma list `list` unless it is already there.
void add_hop(std::string& list, std::string_view name) {
    std::size_t pos = 0;
    while (pos <= list.size()) {
        std::size_t end = list.find(',', pos);
        if (end == std::string::npos)
            end = list.size();
        if (list.compare(pos, end - pos, name) == 0 && !list.empty())
            return;
        pos = end + 1;
    }
    if (!list.empty())
        list += ',';
    list += name;
}

} // namespace

void request_facts::clear() {
    method.clear();
    target.clear();
    version = 11;
    body_bytes = 0;
    body_fnv1a = fnv1a_offset_basis;
    expect_continue = false;
    has_key = false;
    key.clear();
    has_forwarded_for = false;
    forwarded_for.clear();
    has_forwarded_proto = false;
    forwarded_proto.clear();
    has_forwarded_host = false;
    forwarded_host.clear();
    has_forwarded = false;
    forwarded.clear();
    has_connection = false;
    connection.clear();
    hop.clear();
    all_names.assign(1, ',');
    upgrade.clear();
    ws_key.clear();
    ws_version.clear();
    bad_test_header = false;
    status = 200;
    delay_ms.reset();
    drop_after_ms.reset();
    drop = false;
    close_after_reply = false;
    stray_after_ms.reset();
    body_size.reset();
    binary = false;
    chunked = false;
    trailer_bytes = 0;
    malformed = false;
    extra_headers.clear();
    events.reset();
    stream_id.clear();
    pause_after_bytes.reset();
    cut_after_bytes.reset();
    slow_body_ms.reset();
    fault_id.clear();
    fail_times.reset();
    fail_with = fault::status;
    fail_status = 503;
    fail_hang_ms = 5000;
}

bool request_facts::wants_websocket() const {
    if (!iequals(trim(upgrade), "websocket") || ws_key.empty())
        return false;
    std::string_view rest = connection;
    while (!rest.empty()) {
        auto const comma = rest.find(',');
        if (iequals(trim(rest.substr(0, comma)), "upgrade"))
            return true;
        rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
    }
    return false;
}

void request_reader::on_request_impl(http::verb, boost::beast::string_view method_str,
                                     boost::beast::string_view target, int version,
                                     boost::beast::error_code&) {
    facts_.method.assign(method_str);
    facts_.target.assign(target);
    facts_.version = version;
}

void request_reader::on_response_impl(int, boost::beast::string_view, int,
                                      boost::beast::error_code&) {}

void request_reader::on_field_impl(http::field name, boost::beast::string_view name_in,
                                   boost::beast::string_view value_in, boost::beast::error_code&) {
    std::string_view const name_string = name_in;
    std::string_view const value = value_in;
    auto& f = facts_;
    std::size_t const start = f.all_names.size();
    for (char c : name_string)
        f.all_names += to_lower(c);
    f.all_names += ',';
    // Taken after the last append: an earlier view could dangle on reallocation.
    std::string_view const lower(f.all_names.data() + start, name_string.size());

    switch (name) {
    case http::field::upgrade:
        if (!f.upgrade.empty())
            f.upgrade += ", ";
        f.upgrade += value;
        add_hop(f.hop, lower);
        return;
    case http::field::sec_websocket_key:
        f.ws_key.assign(value);
        return;
    case http::field::sec_websocket_version:
        f.ws_version.assign(value);
        return;
    case http::field::te:
    case http::field::trailer:
    case http::field::keep_alive:
    case http::field::proxy_authorization:
        add_hop(f.hop, lower);
        return;
    case http::field::connection:
        append_joined(f.connection, f.has_connection, value);
        return;
    case http::field::expect:
        f.expect_continue = iequals(value, "100-continue");
        return;
    default:
        break;
    }

    // Everything below is rare except the key; compare on the lowercase copy.
    if (lower == "idempotency-key") {
        f.key.assign(value);
        f.has_key = true;
    } else if (lower == "x-forwarded-for") {
        append_joined(f.forwarded_for, f.has_forwarded_for, value);
    } else if (lower == "x-forwarded-proto") {
        append_joined(f.forwarded_proto, f.has_forwarded_proto, value);
    } else if (lower == "x-forwarded-host") {
        append_joined(f.forwarded_host, f.has_forwarded_host, value);
    } else if (lower == "forwarded") {
        append_joined(f.forwarded, f.has_forwarded, value);
    } else if (lower.starts_with("x-test-")) {
        std::uint64_t n = 0;
        std::string_view const which = lower.substr(7);
        if (which == "status") {
            // 101 and 600-999 too: answers a proxy must refuse as unusable (issue 26).
            f.bad_test_header |= !parse_u64(value, n) || (n != 101 && (n < 200 || n > 999));
            f.status = static_cast<unsigned>(n);
        } else if (which == "delay-ms") {
            f.bad_test_header |= !parse_u64(value, n);
            f.delay_ms = n;
        } else if (which == "stray-after-ms") {
            f.bad_test_header |= !parse_u64(value, n);
            f.stray_after_ms = n;
        } else if (which == "drop-after-ms") {
            f.bad_test_header |= !parse_u64(value, n);
            f.drop_after_ms = n;
        } else if (which == "body-bytes") {
            // Bodies above 1 MiB are generated piece by piece, so 4 GiB costs no memory.
            f.bad_test_header |= !parse_u64(value, n) || n > (std::uint64_t{4} << 30);
            f.body_size = n;
        } else if (which == "drop") {
            f.drop = value == "1";
        } else if (which == "close-after-reply") {
            f.close_after_reply = value == "1";
        } else if (which == "binary") {
            f.binary = value == "1";
        } else if (which == "chunked") {
            f.chunked = value == "1";
        } else if (which == "trailer-bytes") {
            f.bad_test_header |= !parse_u64(value, n) || n > (std::uint64_t{64} << 20);
            f.trailer_bytes = n;
            f.chunked = true;
        } else if (which == "events") {
            f.bad_test_header |= !parse_u64(value, n) || n > 1000;
            f.events = n;
        } else if (which == "pause-after-bytes") {
            f.bad_test_header |= !parse_u64(value, n);
            f.pause_after_bytes = n;
        } else if (which == "cut-after-bytes") {
            f.bad_test_header |= !parse_u64(value, n);
            f.cut_after_bytes = n;
        } else if (which == "slow-body-ms") {
            f.bad_test_header |= !parse_u64(value, n) || n > 10'000;
            f.slow_body_ms = n;
        } else if (which == "fault-id") {
            f.fault_id.assign(value);
        } else if (which == "fail-times") {
            f.bad_test_header |= !parse_u64(value, n);
            f.fail_times = n;
        } else if (which == "fail-with") {
            if (value == "status")
                f.fail_with = request_facts::fault::status;
            else if (value == "reset")
                f.fail_with = request_facts::fault::reset;
            else if (value == "hang")
                f.fail_with = request_facts::fault::hang;
            else
                f.bad_test_header = true;
        } else if (which == "fail-status") {
            f.bad_test_header |= !parse_u64(value, n) || n < 200 || n > 999;
            f.fail_status = static_cast<unsigned>(n);
        } else if (which == "fail-hang-ms") {
            f.bad_test_header |= !parse_u64(value, n);
            f.fail_hang_ms = n;
        } else if (which == "stream-id") {
            f.stream_id.assign(value);
        } else if (which == "malformed") {
            f.malformed = value == "1";
        } else if (which == "header") {
            auto const colon = value.find(':');
            std::string_view const hname = trim(value.substr(0, colon));
            if (colon == std::string_view::npos || !is_token(hname)) {
                f.bad_test_header = true;
                return;
            }
            f.extra_headers.append(hname).append(": ");
            f.extra_headers.append(trim(value.substr(colon + 1))).append("\r\n");
        }
    }
}

void request_reader::on_header_impl(boost::beast::error_code&) {
    auto& f = facts_;
    // Failing "the first N executions" needs something to count them by.
    if (f.fail_times && !f.has_key && f.fault_id.empty())
        f.bad_test_header = true;
    if (!f.has_connection)
        return;
    // Any field named by Connection is hop-by-hop too (RFC 9110 §7.6.1).
    std::string_view rest = f.connection;
    std::string token;
    while (!rest.empty()) {
        auto const comma = rest.find(',');
        std::string_view const raw = trim(rest.substr(0, comma));
        rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
        token.assign(1, ',');
        for (char c : raw)
            token += to_lower(c);
        token += ',';
        if (raw.empty() || f.all_names.find(token) == std::string::npos)
            continue;
        add_hop(f.hop, std::string_view(token).substr(1, raw.size()));
    }
}

void request_reader::on_body_init_impl(boost::optional<std::uint64_t> const&,
                                       boost::beast::error_code&) {}

std::size_t request_reader::on_body_impl(boost::beast::string_view body,
                                         boost::beast::error_code&) {
    facts_.body_bytes += body.size();
    facts_.body_fnv1a = fnv1a_update(facts_.body_fnv1a, body);
    return body.size();
}

void request_reader::on_chunk_header_impl(std::uint64_t, boost::beast::string_view,
                                          boost::beast::error_code&) {}

std::size_t request_reader::on_chunk_body_impl(std::uint64_t, boost::beast::string_view body,
                                               boost::beast::error_code&) {
    facts_.body_bytes += body.size();
    facts_.body_fnv1a = fnv1a_update(facts_.body_fnv1a, body);
    return body.size();
}

void request_reader::on_finish_impl(boost::beast::error_code&) {}

} // namespace onceproxy::test_upstream
