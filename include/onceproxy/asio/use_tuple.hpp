#pragma once
// The completion token of every awaited Asio operation: `auto [ec, n] = co_await
// op(..., use_tuple)` hands failures back as values (STYLE.md §4, `net::as_tuple`) instead of
// throwing them. Only Asio here: the header of the onceproxy_asio target, which every module
// with sockets links (the Redis driver too, which knows nothing of the others).

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/use_awaitable.hpp>

namespace onceproxy {

inline constexpr auto use_tuple = boost::asio::as_tuple(boost::asio::use_awaitable);

} // namespace onceproxy
