#include "redis/resp_reader.hpp"

#include <hiredis/hiredis.h>

#include <algorithm>
#include <new>
#include <utility>

namespace onceproxy::redis {

namespace {

/// An array header announcing more elements than this is refused as a protocol error before
/// anything is allocated (found by resp_fuzz: `*977777777` once made hiredis allocate 7.8 GB).
/// The store never reads arrays of more than a few elements.
constexpr int max_array_elements = 1 << 20;
/// Elements reserved up front: a header alone does not reserve memory for a million.
constexpr int reserved_elements = 1024;

// hiredis's reader parses; these functions build the reply straight into a redis_reply (no
// redisReply made, copied and freed). A top-level reply is the reader's own (its privdata); an
// element is appended to its parent's array, which hiredis fills in order. Growing that array
// moves only finished elements: hiredis holds pointers to the unfinished ones only (the
// element being read and its ancestors).
redis_reply* place(const redisReadTask* task) {
    if (task->parent == nullptr) {
        auto* top = static_cast<redis_reply*>(task->privdata);
        *top = redis_reply{};
        return top;
    }
    auto* parent = static_cast<redis_reply*>(task->parent->obj);
    return &parent->elements.emplace_back();
}

void* create_string(const redisReadTask* task, char* str, std::size_t len) {
    redis_reply* r = place(task);
    switch (task->type) {
    case REDIS_REPLY_ERROR:
        r->type = redis_reply::kind::error;
        break;
    case REDIS_REPLY_STATUS:
        r->type = redis_reply::kind::status;
        break;
    default:
        r->type = redis_reply::kind::string;
        break;
    }
    r->str.assign(str, len);
    return r;
}

void* create_array(const redisReadTask* task, int elements) {
    if (elements < 0 || elements > max_array_elements) {
        return nullptr; // hiredis turns it into a reader error
    }
    redis_reply* r = place(task);
    r->type = redis_reply::kind::array;
    r->elements.reserve(static_cast<std::size_t>(std::min(elements, reserved_elements)));
    return r;
}

void* create_integer(const redisReadTask* task, long long value) {
    redis_reply* r = place(task);
    r->type = redis_reply::kind::integer;
    r->integer = value;
    return r;
}

void* create_nil(const redisReadTask* task) {
    return place(task); // kind::nil
}

// Only ever called with a top-level reply (a stream error mid-reply, or the reader freed).
void free_object(void* reply) {
    *static_cast<redis_reply*>(reply) = redis_reply{};
}

redisReplyObjectFunctions functions{create_string, create_array, create_integer, create_nil,
                                    free_object};

} // namespace

void resp_reader::deleter::operator()(redisReader* r) const noexcept {
    redisReaderFree(r);
}

resp_reader::resp_reader() : reader_(redisReaderCreateWithFunctions(&functions)) {
    if (reader_ == nullptr) {
        throw std::bad_alloc();
    }
    reader_->privdata = &reply_;
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
    out = std::move(reply_); // raw == &reply_
    return status::reply;
}

} // namespace onceproxy::redis
