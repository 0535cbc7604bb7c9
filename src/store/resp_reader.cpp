#include "store/resp_reader.hpp"

#include <hiredis/hiredis.h>

namespace onceproxy::store {

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

} // namespace

void resp_reader::deleter::operator()(redisReader* r) const noexcept {
    redisReaderFree(r);
}

resp_reader::resp_reader() : reader_(redisReaderCreate()) {}

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

} // namespace onceproxy::store
