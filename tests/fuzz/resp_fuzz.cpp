// RESP replies as the Redis client reads them: bytes fed in pieces (the first byte sets the
// piece size), replies taken until more bytes are needed or the stream is refused. Each reply
// also goes through the Redis Cluster parsers (redirects, CLUSTER SHARDS, CLUSTER SLOTS).
#include "redis/resp_reader.hpp"

#include "onceproxy/redis/redis_cluster.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    using onceproxy::redis::resp_reader;
    if (size == 0) {
        return 0;
    }
    const std::size_t piece = 1 + data[0] % 64;
    resp_reader reader;
    onceproxy::redis::redis_reply reply;
    for (std::size_t at = 1; at < size; at += piece) {
        const auto n = std::min(piece, size - at);
        if (reader.feed(reinterpret_cast<const char*>(data + at), n) ==
            resp_reader::status::protocol_error) {
            return 0;
        }
        for (;;) {
            const auto st = reader.next(reply);
            if (st == resp_reader::status::protocol_error) {
                return 0;
            }
            if (st == resp_reader::status::need_more) {
                break;
            }
            const onceproxy::redis::redis_node_address asked{"127.0.0.1", 6379};
            (void)onceproxy::redis::parse_redirect(reply);
            (void)onceproxy::redis::parse_cluster_shards(reply, asked, data[0] % 2 == 0);
            (void)onceproxy::redis::parse_cluster_slots(reply, asked);
        }
    }
    return 0;
}
