#include "redis/resp_reader.hpp"

#include <hiredis/hiredis.h>

#include <new>

namespace onceproxy::redis {

namespace {

redis_reply convert(const redisReply& r) {
    redis_reply out;
    switch (r.type) {
    case REDIS_REPLY_STRING:
        out.type = redis_reply::kind::string;
        out.str.assign(r.str, r.len);
        break;
    case REDIS_REPLY_STATUS:
        out.type = redis_reply::kind::status;
        out.str.assign(r.str, r.len);
        break;
    case REDIS_REPLY_ERROR:
        out.type = redis_reply::kind::error;
        out.str.assign(r.str, r.len);
        break;
    case REDIS_REPLY_INTEGER:
        out.type = redis_reply::kind::integer;
        out.integer = r.integer;
        break;
    case REDIS_REPLY_ARRAY:
        out.type = redis_reply::kind::array;
        out.elements.reserve(r.elements);
        for (std::size_t i = 0; i < r.elements; ++i) {
            out.elements.push_back(convert(*r.element[i]));
        }
        break;
    default:
        out.type = redis_reply::kind::nil;
        break;
    }
    return out;
}

/// hiredis' own array constructor, which the bounded one below calls.
void* (*default_create_array)(const redisReadTask*, int) = nullptr;

/// An array header announcing more elements than this is refused as a protocol error before
/// anything is allocated: hiredis 0.14 (Debian 12) allocates the element table from the count
/// alone, so `*977777777` would ask for 7.8 GB (found by resp_fuzz). The store never reads
/// arrays of more than a few elements.
constexpr int max_array_elements = 1 << 20;

void* create_bounded_array(const redisReadTask* task, int elements) {
    if (elements < 0 || elements > max_array_elements) {
        return nullptr; // hiredis turns it into a reader error
    }
    return default_create_array(task, elements);
}

/// hiredis' default reply functions with the bounded array constructor; made once from those
/// of a default reader (the defaults themselves are not exported).
redisReplyObjectFunctions* bounded_functions(const redisReplyObjectFunctions& defaults) {
    static redisReplyObjectFunctions fns = [&] {
        redisReplyObjectFunctions f = defaults;
        default_create_array = defaults.createArray;
        f.createArray = create_bounded_array;
        return f;
    }();
    return &fns;
}

} // namespace

void resp_reader::deleter::operator()(redisReader* r) const noexcept {
    redisReaderFree(r);
}

resp_reader::resp_reader() : reader_(redisReaderCreate()) {
    if (reader_ == nullptr) {
        throw std::bad_alloc();
    }
    reader_->fn = bounded_functions(*reader_->fn);
}

resp_reader::~resp_reader() = default;

resp_reader::status resp_reader::feed(const char* data, std::size_t n) {
    return redisReaderFeed(reader_.get(), data, n) == REDIS_OK ? status::need_more
                                                               : status::protocol_error;
}

resp_reader::status resp_reader::next(redis_reply& out) {
    void* raw = nullptr;
    if (redisReaderGetReply(reader_.get(), &raw) != REDIS_OK) {
        return status::protocol_error;
    }
    if (raw == nullptr) {
        return status::need_more;
    }
    auto* reply = static_cast<redisReply*>(raw);
    out = convert(*reply);
    freeReplyObject(reply);
    return status::reply;
}

} // namespace onceproxy::redis
