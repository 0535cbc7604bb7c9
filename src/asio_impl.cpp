// Compiles Asio, Asio.SSL and Beast once for the whole program (separate compilation).
#include <boost/asio/impl/src.hpp>
#include <boost/asio/ssl/impl/src.hpp>
#include <boost/beast/src.hpp>
