#include "wire/message_reader_impl.hpp"

#include "onceproxy/wire/client_stream.hpp"

namespace onceproxy::wire {

template net::awaitable<error_code> async_read<true>(net::ip::tcp::socket&,
                                                     boost::beast::flat_buffer&,
                                                     message_parser<true>&, read_until);
template net::awaitable<error_code> async_read<false>(net::ip::tcp::socket&,
                                                      boost::beast::flat_buffer&,
                                                      message_parser<false>&, read_until);
template net::awaitable<error_code> async_read<true>(client_stream&, boost::beast::flat_buffer&,
                                                     message_parser<true>&, read_until);
template net::awaitable<error_code> async_read<false>(client_stream&, boost::beast::flat_buffer&,
                                                      message_parser<false>&, read_until);

} // namespace onceproxy::wire
