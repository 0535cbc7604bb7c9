#pragma once
// Parsing of the `store.redis.url` setting (SPEC §4, §5):
//   redis://[[user]:password@]host[:port][/db]     plain TCP
//   rediss://...                                   TLS (OpenSSL, verified against tls_ca_file)
// The user name and password are percent-decoded, so a password may hold any byte.

#include <boost/system/result.hpp>

#include <cstdint>
#include <string>
#include <string_view>

namespace onceproxy::redis {

/// A parsed Redis URL. An empty `user` with a non-empty `password` means `AUTH password`
/// (the `default` user); both set means `AUTH user password` (ACL user).
struct redis_url {
    bool tls = false;          ///< rediss://
    std::string host;          ///< host name or IP literal (IPv6 without brackets)
    std::uint16_t port = 6379; ///< default 6379
    std::string user;          ///< ACL user, percent-decoded; empty: none
    std::string password;      ///< percent-decoded; empty: no AUTH
    unsigned db = 0;           ///< database index from the path; default 0
};

/// Parses `text`. Errors (as boost::system::errc::invalid_argument, with no further detail):
/// a scheme other than redis/rediss, no host, a port out of range, a path that is not `/`
/// followed by a decimal database index, a query or a fragment.
/// `describe_redis_url_error` gives the human reason for the same input.
boost::system::result<redis_url> parse_redis_url(std::string_view text);

/// The reason `parse_redis_url(text)` fails, for start-up messages; empty when it succeeds.
std::string describe_redis_url_error(std::string_view text);

} // namespace onceproxy::redis
