#include "onceproxy/redis/redis_url.hpp"

#include <boost/url/parse.hpp>
#include <boost/url/url_view.hpp>

#include <charconv>
#include <limits>

namespace onceproxy::redis {
namespace {

// One parser behind both entry points, so the reason and the verdict never disagree.
std::string parse_into(std::string_view text, redis_url& out) {
    auto parsed = boost::urls::parse_uri(text);
    if (!parsed) {
        return "not a valid URL: " + parsed.error().message();
    }
    const boost::urls::url_view& u = *parsed;
    const std::string scheme = u.scheme();
    if (scheme == "redis") {
        out.tls = false;
    } else if (scheme == "rediss") {
        out.tls = true;
    } else {
        return "scheme must be redis:// or rediss://, not " + scheme + "://";
    }
    if (!u.has_authority()) {
        return "missing host";
    }
    out.host = u.host_address();
    if (out.host.empty()) {
        return "missing host";
    }
    if (u.host_type() == boost::urls::host_type::ipv6 && out.host.front() == '[') {
        out.host = out.host.substr(1, out.host.size() - 2);
    }
    if (u.has_port()) {
        const auto port_text = u.port();
        unsigned long value = 0;
        auto [ptr, ec] =
            std::from_chars(port_text.data(), port_text.data() + port_text.size(), value);
        if (port_text.empty() || ec != std::errc{} || ptr != port_text.data() + port_text.size() ||
            value == 0 || value > std::numeric_limits<std::uint16_t>::max()) {
            return "port must be 1..65535, not '" + std::string(port_text) + "'";
        }
        out.port = static_cast<std::uint16_t>(value);
    }
    if (u.has_userinfo()) {
        out.user = u.user();
        if (u.has_password()) {
            out.password = u.password();
        } else if (!out.user.empty()) {
            // redis://secret@host: a lone userinfo is the password, as redis-cli -u reads it.
            out.password = std::move(out.user);
            out.user.clear();
        }
    }
    const std::string path = u.path();
    if (!path.empty() && path != "/") {
        std::string_view digits(path);
        digits.remove_prefix(1);
        unsigned value = 0;
        auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
        if (path.front() != '/' || ec != std::errc{} || ptr != digits.data() + digits.size()) {
            return "path must be /<database index>, not '" + path + "'";
        }
        out.db = value;
    }
    if (u.has_query() || u.has_fragment()) {
        return "query and fragment are not supported";
    }
    return {};
}

} // namespace

boost::system::result<redis_url> parse_redis_url(std::string_view text) {
    redis_url out;
    if (!parse_into(text, out).empty()) {
        return boost::system::errc::make_error_code(boost::system::errc::invalid_argument);
    }
    return out;
}

std::string describe_redis_url_error(std::string_view text) {
    redis_url out;
    return parse_into(text, out);
}

} // namespace onceproxy::redis
