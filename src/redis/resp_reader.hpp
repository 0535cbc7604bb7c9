#pragma once
// RESP2 replies out of a byte stream: hiredis's reply reader, building each reply straight into
// an owned `redis_reply` so that hiredis stays private to this module. Pure: no sockets.

#include "onceproxy/redis/redis_reply.hpp"

#include <cstddef>
#include <memory>

struct redisReader;

namespace onceproxy::redis {

class resp_reader {
public:
    resp_reader();
    ~resp_reader();
    resp_reader(const resp_reader&) = delete; // nor moved: hiredis points at reply_
    resp_reader& operator=(const resp_reader&) = delete;

    enum class status {
        reply,          ///< `out` holds the next reply
        need_more,      ///< no complete reply buffered yet
        protocol_error, ///< the stream is not RESP: the reader is unusable, drop the connection
    };

    /// Appends bytes read from the connection. protocol_error when hiredis refuses them.
    status feed(const char* data, std::size_t n);

    /// Takes the next complete reply, if any.
    status next(redis_reply& out);

private:
    struct deleter {
        void operator()(redisReader* r) const noexcept;
    };
    redis_reply reply_; // the reply being read (before reader_: hiredis may free into it)
    std::unique_ptr<redisReader, deleter> reader_;
};

} // namespace onceproxy::redis
