#pragma once
// The completion token of every awaited Asio operation: `auto [ec, n] = co_await
// op(..., use_tuple)` hands failures back as values (STYLE.md §4, `net::as_tuple`) instead of
// throwing them. Only Asio here, so any module with sockets (the Redis driver too) may use it.

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/use_awaitable.hpp>

namespace onceproxy::wire {

inline constexpr auto use_tuple = boost::asio::as_tuple(boost::asio::use_awaitable);

} // namespace onceproxy::wire
