#pragma once
// Address blocks (CIDR) of `trusted_proxies`: parsing and membership. Standard library and
// POSIX inet_pton only.

#include "onceproxy/config/config.hpp"

#include <optional>
#include <span>
#include <string_view>

namespace onceproxy::config {

/// Parses "a.b.c.d[/n]" (n ≤ 32) or an IPv6 address "x::y[/n]" (n ≤ 128); no prefix: the single
/// address. nullopt when `text` is not an address block, or has host bits set below the prefix
/// (10.0.0.1/8 is a mistake worth reporting, not a block to guess).
std::optional<cidr> parse_cidr(std::string_view text);

/// True when the textual address `ip` (IPv4, IPv6, IPv4-mapped IPv6, optionally with a zone
/// id) lies in one of `blocks`. An unparsable address is in none.
bool address_in(std::string_view ip, std::span<const cidr> blocks);

} // namespace onceproxy::config
