#include "wire/message_reader_impl.hpp"

namespace onceproxy::wire {

template net::awaitable<error_code>
async_read<net::ip::tcp::socket, true>(net::ip::tcp::socket&, boost::beast::flat_buffer&,
                                       message_parser<true>&, read_until);
template net::awaitable<error_code>
async_read<net::ip::tcp::socket, false>(net::ip::tcp::socket&, boost::beast::flat_buffer&,
                                        message_parser<false>&, read_until);

} // namespace onceproxy::wire
