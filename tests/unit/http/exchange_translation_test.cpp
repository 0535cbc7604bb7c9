#include "http/exchange_translation.hpp"
#include "onceproxy/store/error.hpp"
#include "onceproxy/wire/head_writer.hpp"

#include <doctest/doctest.h>

#include <boost/asio/io_context.hpp>
#include <boost/beast/http/field.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/value.hpp>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

namespace core = onceproxy::core;
namespace config = onceproxy::config;
namespace store = onceproxy::store;
using namespace onceproxy::http;
using onceproxy::upstream::forward_status;
namespace bhttp = boost::beast::http;

namespace {

std::string code_of(const response& res) {
    return std::string(boost::json::parse(res.body()).as_object().at("code").as_string());
}

std::string detail_of(const response& res) {
    return std::string(boost::json::parse(res.body()).as_object().at("detail").as_string());
}

response upstream_answer() {
    response res{bhttp::status::created, 11};
    res.set(bhttp::field::content_type, "application/json");
    res.set(bhttp::field::date, "Mon, 01 Jan 2024 00:00:00 GMT");
    res.set(bhttp::field::set_cookie, "s=1");
    res.set("X-Trace", "abc");
    res.set("X-Order", "7");
    res.body() = R"({"id":7})";
    res.prepare_payload();
    return res;
}

/// The fields of `res` as the forwarder keeps them on the HTTP/1.1 path, with hop-by-hop ones
/// an upstream may send (Keep-Alive, Proxy-*, and X-Hop because Connection names it) among
/// them.
onceproxy::wire::raw_header_store as_received(const response& res) {
    onceproxy::wire::raw_header_store raw;
    raw.reason(res.reason());
    raw.append(bhttp::field::keep_alive, "Keep-Alive", "timeout=5");
    for (const auto& f : res) {
        raw.append(f.name(), f.name_string(), f.value());
        raw.append(bhttp::field::unknown, "X-Hop", "1");
    }
    raw.append(bhttp::field::connection, "Connection", "X-Hop");
    raw.append(bhttp::field::unknown, "Proxy-Note", "p");
    return raw;
}

core::action reject_of(core::problem_code c, unsigned status, std::chrono::seconds retry = {}) {
    core::action a;
    a.kind = core::action_kind::reject;
    a.problem = c;
    a.http_status = status;
    a.retry_after = retry;
    return a;
}

} // namespace

TEST_SUITE("exchange translation") {

    TEST_CASE("forward results become upstream events (SPEC §2)") {
        using core::upstream_result;
        const auto ev = to_upstream_event(forward_status::ok, 201, 12);
        CHECK(ev.kind == upstream_result::response);
        CHECK(ev.status == 201);
        CHECK(ev.body_bytes == 12);
        CHECK(to_upstream_event(forward_status::connect_failed, 0, 0).kind ==
              upstream_result::not_sent);
        CHECK(to_upstream_event(forward_status::pool_exhausted, 0, 0).kind ==
              upstream_result::not_sent);
        CHECK(to_upstream_event(forward_status::tunnel_limit, 0, 0).kind ==
              upstream_result::not_sent);
        // A failed TLS handshake sent nothing: the key is released like a refused connect.
        CHECK(to_upstream_event(forward_status::tls_failed, 0, 0).kind ==
              upstream_result::not_sent);
        CHECK(to_upstream_event(forward_status::timeout_after_send, 0, 0).kind ==
              upstream_result::timed_out);
        CHECK(to_upstream_event(forward_status::reset_after_send, 0, 0).kind ==
              upstream_result::reset);
        CHECK(to_upstream_event(forward_status::response_too_large, 0, 0).kind ==
              upstream_result::bad_response);
        CHECK(to_upstream_event(forward_status::bad_response, 0, 0).kind ==
              upstream_result::bad_response);

        onceproxy::upstream::forward_result r;
        r.res = upstream_answer();
        const auto whole = to_upstream_event(r);
        CHECK(whole.status == 201);
        CHECK(whole.body_bytes == r.res.body().size());
        CHECK(whole.kind == upstream_result::response);

        // The body outgrew the hold limit: the rest is still on the connection.
        boost::asio::io_context ioc;
        onceproxy::wire::deadline_watch watch(ioc.get_executor());
        r.rest = std::make_unique<onceproxy::upstream::unread_body>(
            std::make_unique<onceproxy::upstream::connection>(ioc.get_executor(), watch),
            onceproxy::wire::response_parser{});
        const auto streaming = to_upstream_event(r);
        CHECK(streaming.kind == upstream_result::streaming);
        CHECK(streaming.status == 201);
        CHECK(streaming.body_bytes == r.res.body().size());
        r.rest.reset();
    }

    TEST_CASE("claim results become claim events") {
        using core::claim_result_kind;
        store::result<store::claim_result> err =
            boost::system::errc::make_error_code(boost::system::errc::connection_refused);
        std::string record = "left from before";
        auto t = to_claim_event(std::move(err), record);
        CHECK(record.empty());
        CHECK(t.event.kind == claim_result_kind::store_error);
        CHECK(t.store_error);

        store::claim_result busy;
        busy.status = store::claim_status::in_flight;
        busy.remaining_lease = std::chrono::milliseconds(1500);
        t = to_claim_event(busy, record);
        CHECK(t.event.kind == claim_result_kind::in_flight);
        CHECK(t.event.remaining_lease == std::chrono::milliseconds(1500));
        CHECK_FALSE(t.store_error);

        store::claim_result other;
        other.status = store::claim_status::mismatch;
        CHECK(to_claim_event(other, record).event.kind == claim_result_kind::mismatch);
        other.status = store::claim_status::acquired;
        CHECK(to_claim_event(other, record).event.kind == claim_result_kind::acquired);

        store::claim_result done;
        done.status = store::claim_status::completed;
        done.record = core::encode_record(core::response_record{200, {}, "hi", true});
        const auto encoded = done.record;
        t = to_claim_event(done, record);
        CHECK(t.event.kind == claim_result_kind::completed);
        CHECK(t.event.replayable);
        CHECK(record == encoded);
        REQUIRE(t.view);
        CHECK(t.view->body == "hi");
        CHECK(t.view->body.data() >= record.data()); // a view of `record`
        CHECK(t.view->body.data() + t.view->body.size() <= record.data() + record.size());

        done.record = core::encode_record(core::response_record{200, {}, "", false});
        t = to_claim_event(done, record);
        CHECK_FALSE(t.event.replayable);

        // Unreadable: it ran once, so never again; not replayable, counted as a store error.
        done.record = "garbage";
        t = to_claim_event(done, record);
        CHECK(t.event.kind == claim_result_kind::completed);
        CHECK_FALSE(t.event.replayable);
        CHECK(t.unreadable);
        CHECK(record.empty());
        CHECK_FALSE(t.view);
    }

    TEST_CASE("fenced store results become fence events") {
        CHECK(to_fence_event(store::fence_status::ok) == core::fence_event::ok);
        CHECK(to_fence_event(store::fence_status::not_owner) == core::fence_event::not_owner);
        store::result<store::fence_status> err =
            boost::system::errc::make_error_code(boost::system::errc::timed_out);
        CHECK(to_fence_event(err) == core::fence_event::store_error);
    }

    TEST_CASE("store errors are counted by cause") {
        using onceproxy::metrics::store_error_cause;
        CHECK(store_error_cause_of(store::errc::unavailable) == store_error_cause::unavailable);
        CHECK(store_error_cause_of(store::errc::timeout) == store_error_cause::timeout);
        CHECK(store_error_cause_of(store::errc::not_replicated) ==
              store_error_cause::not_replicated);
        CHECK(store_error_cause_of(store::errc::store_full) == store_error_cause::store_full);
        CHECK(store_error_cause_of(store::errc::auth_failed) == store_error_cause::auth_failed);
        CHECK(store_error_cause_of(store::errc::tls_failed) == store_error_cause::tls_failed);
        CHECK(store_error_cause_of(store::errc::protocol) == store_error_cause::protocol);
        CHECK(store_error_cause_of(store::errc::script_missing) == store_error_cause::protocol);
        CHECK(store_error_cause_of(boost::system::errc::make_error_code(
                  boost::system::errc::timed_out)) == store_error_cause::other);
    }

    TEST_CASE("records leave out regenerated, cookie and excluded headers (SPEC §3.7)") {
        config::idempotency_config p;
        p.exclude_headers = {"x-trace"};
        const auto rec = record_of(upstream_answer(), p, true);
        CHECK(rec.status == 201);
        CHECK(rec.replayable);
        CHECK(rec.body == R"({"id":7})");
        REQUIRE(rec.headers.size() == 2);
        CHECK(rec.headers[0].first == "Content-Type");
        CHECK(rec.headers[1].first == "X-Order");

        p.record_set_cookie = true;
        CHECK(record_of(upstream_answer(), p, true).headers.size() == 3);

        const auto big = record_of(upstream_answer(), p, false);
        CHECK_FALSE(big.replayable);
        CHECK(big.body.empty());
        CHECK(excluded_from_record(p, "DATE"));
        CHECK(excluded_from_record(p, "content-length"));
        CHECK_FALSE(excluded_from_record(p, "Set-Cookie"));
    }

    TEST_CASE("record payloads: the upstream answer or the outcome_unknown problem") {
        config::idempotency_config p;
        core::action a;
        a.kind = core::action_kind::complete;
        a.record = core::record_kind::upstream_response;
        a.replayable = true;
        const auto up = upstream_answer();
        auto rec = core::decode_record(record_payload(a, &up, p, ""));
        REQUIRE(rec);
        CHECK(rec->status == 201);
        CHECK(rec->body == up.body());

        // Fields as received: the same record, without the hop-by-hop ones.
        const auto raw = as_received(up);
        const response bare{up.result(), 11, up.body()};
        const auto from_raw =
            core::decode_record(record_payload(a, &bare, p, "", nullptr, {}, nullptr, &raw));
        REQUIRE(from_raw);
        CHECK(from_raw->status == 201);
        CHECK(from_raw->body == up.body());
        CHECK(from_raw->headers == rec->headers);

        a.replayable = false;
        rec = core::decode_record(record_payload(a, &up, p, ""));
        REQUIRE(rec);
        CHECK_FALSE(rec->replayable);

        a.record = core::record_kind::outcome_unknown_problem;
        rec = core::decode_record(record_payload(a, nullptr, p, ""));
        REQUIRE(rec);
        CHECK(rec->status == 502);
        CHECK(rec->replayable);
        CHECK(rec->body.find("upstream.outcome_unknown") != std::string::npos);
        CHECK(record_expires(*rec).empty()); // none asked for: none recorded
    }

    TEST_CASE("the record keeps its Idempotency-Expires; the upstream's own is not recorded") {
        config::idempotency_config p;
        core::action a;
        a.kind = core::action_kind::complete;
        a.record = core::record_kind::upstream_response;
        a.replayable = true;
        auto up = upstream_answer();
        up.set("Idempotency-Expires", "Mon, 01 Jan 2001 00:00:00 GMT"); // not the proxy's
        CHECK(excluded_from_record(p, "idempotency-expires"));
        const std::string when = "Wed, 01 May 2024 12:00:00 GMT";
        const auto encoded = record_payload(a, &up, p, when);
        auto rec = core::decode_record(encoded);
        REQUIRE(rec);
        CHECK(record_expires(*rec) == when);
        CHECK(std::count_if(rec->headers.begin(), rec->headers.end(),
                            [](const auto& h) { return h.first == "Idempotency-Expires"; }) == 1);

        // A replay states it as recorded, once.
        const auto res = replay_response(encoded, false, "Thu, 02 May 2024 00:00:00 GMT");
        CHECK(res["Idempotency-Expires"] == when);
        CHECK(res.count("Idempotency-Expires") == 1);

        // A claim that finds the record hands it over, also for a record kept without its body.
        a.replayable = false;
        store::claim_result done;
        done.status = store::claim_status::completed;
        done.record = record_payload(a, &up, p, when);
        std::string record;
        auto t = to_claim_event(done, record);
        CHECK_FALSE(t.event.replayable);
        CHECK(t.expires == when);

        // The problem record of a `fail` route carries it too.
        a.record = core::record_kind::outcome_unknown_problem;
        rec = core::decode_record(record_payload(a, nullptr, p, when));
        REQUIRE(rec);
        CHECK(record_expires(*rec) == when);
    }

    TEST_CASE("a record written before Idempotency-Expires existed replays without it") {
        // The encoding of such a record: headers as the upstream sent them, nothing added.
        const core::response_record old{200, {{"Content-Type", "text/plain"}}, "ok", true};
        const auto encoded = core::encode_record(old);
        store::claim_result done;
        done.status = store::claim_status::completed;
        done.record = encoded;
        std::string record;
        const auto t = to_claim_event(done, record);
        CHECK(t.event.replayable);
        CHECK(t.expires.empty());
        const auto res = replay_response(encoded, false, "Thu, 02 May 2024 00:00:00 GMT");
        CHECK(res.result_int() == 200);
        CHECK_FALSE(res.count("Idempotency-Expires"));
    }

    TEST_CASE("set_idempotency_expires sets the proxy's value or removes the upstream's") {
        response res{bhttp::status::ok, 11};
        res.set("Idempotency-Expires", "Mon, 01 Jan 2001 00:00:00 GMT");
        set_idempotency_expires(res, "");
        CHECK_FALSE(res.count("Idempotency-Expires"));
        set_idempotency_expires(res, "Wed, 01 May 2024 12:00:00 GMT");
        CHECK(res["Idempotency-Expires"] == "Wed, 01 May 2024 12:00:00 GMT");
        set_idempotency_expires(res, "Thu, 02 May 2024 12:00:00 GMT");
        CHECK(res.count("Idempotency-Expires") == 1);
    }

    TEST_CASE("replays carry the record, a fresh Date and Idempotency-Status: replayed") {
        core::response_record r{201, {{"Content-Type", "application/json"}}, "{}", true};
        auto res = replay_response(core::encode_record(r), false, "Tue, 02 Jan 2024 00:00:00 GMT");
        CHECK(res.result_int() == 201);
        CHECK(res["Idempotency-Status"] == "replayed");
        CHECK(res[bhttp::field::date] == "Tue, 02 Jan 2024 00:00:00 GMT");
        CHECK(res[bhttp::field::content_length] == "2");
        CHECK(res.body() == "{}");
        CHECK_FALSE(res.count("Idempotent-Replayed"));
        res = replay_response(core::encode_record(r), true, "d");
        CHECK(res["Idempotent-Replayed"] == "true");

        // Binary bodies of any length come back byte for byte, and an empty one stays empty
        // (the answer's body reuses the encoding's buffer).
        for (const std::string& body :
             {std::string("\0a\r\n\xff", 5), std::string(100'000, 'x'), std::string()}) {
            const core::response_record b{200, {{"X-A", "1"}, {"X-B", ""}}, body, true};
            res = replay_response(core::encode_record(b), false, "d");
            CHECK(res.body() == body);
            CHECK(res[bhttp::field::content_length] == std::to_string(body.size()));
            CHECK(res["X-A"] == "1");
            CHECK(res.count("X-B") == 1);
        }

        res = replay_response("garbage", false, "d");
        CHECK(res.result_int() == 503);
        CHECK(code_of(res) == "idempotency.store_unavailable");
        CHECK(res[bhttp::field::retry_after] == "1");
    }

    TEST_CASE("an HTTP/1.1 replay's head, written from the record, is replay_response's") {
        // The answer an HTTP/2 stream gets (replay_response), framed and serialised as the
        // server writes a whole answer, against the head written straight from the record.
        const std::vector<core::response_record> records{
            {201, {{"Content-Type", "application/json"}, {"X-Execution-Id", "e-1"}}, "{}", true},
            // Repeated fields side by side, as recorded from a parsed answer (a header map keeps
            // same-named fields together; the head from the record keeps the record's order).
            {200, {{"X-A", "1"}, {"X-A", "2"}, {"X-B", ""}}, std::string("\0a\r\n\xff", 5), true},
            // An upstream's own Idempotency-Status and Idempotent-Replayed are stated afresh.
            {200,
             {{"idempotency-status", "mine"}, {"Idempotent-Replayed", "no"}, {"X-C", "c"}},
             "body",
             true},
            {204, {{"X-D", "d"}}, "", true},
            {404, {}, std::string(70'000, 'x'), true},
        };
        for (const auto& r : records) {
            for (const bool stripe : {false, true}) {
                for (const bool keep : {false, true}) {
                    CAPTURE(r.status);
                    CAPTURE(stripe);
                    CAPTURE(keep);
                    const auto encoded = core::encode_record(r);
                    auto res = replay_response(encoded, stripe, "Tue, 02 Jan 2024 00:00:00 GMT");
                    // A 204 says no Content-Length (RFC 9110 §8.6); the others their body's.
                    CHECK(res.has_content_length() == (r.status != 204));
                    res.keep_alive(keep);
                    std::string expected;
                    onceproxy::wire::serialize_head(res, expected);

                    const auto view = core::decode_record_view(encoded);
                    REQUIRE(view);
                    std::string head = "left over from an earlier answer";
                    const auto body = serialize_replay_head(
                        *view, stripe, "Tue, 02 Jan 2024 00:00:00 GMT", keep, false, head);
                    CHECK(head == expected);
                    CHECK(body == res.body());
                    // A HEAD request gets the same head and no body.
                    CHECK(serialize_replay_head(*view, stripe, "Tue, 02 Jan 2024 00:00:00 GMT",
                                                keep, true, head)
                              .empty());
                    CHECK(head == expected);
                }
            }
        }
    }

    TEST_CASE("an answer's head for an HTTP/1.1 client is the upstream's as edited and framed") {
        // The reference: the upstream's head edited by set_idempotency_status and
        // set_idempotency_expires, framed as the server's write step and the stream do.
        std::vector<response> heads;
        response a{bhttp::status::created, 11};
        a.set(bhttp::field::content_type, "application/json");
        a.insert("X-A", "1");
        a.insert("X-A", "2");
        heads.push_back(a);
        response own{bhttp::status::ok, 11}; // the upstream's own idempotency fields
        own.insert("Idempotency-Status", "theirs");
        own.insert("idempotency-expires", "Mon, 01 Jan 2001 00:00:00 GMT");
        own.insert("X-B", "");
        heads.push_back(own);
        response sized{bhttp::status::not_found, 11};
        sized.reason("Nowhere");
        sized.content_length(7);
        heads.push_back(sized);
        heads.emplace_back(bhttp::status::no_content, 11);
        using st = core::idempotency_status;
        for (const auto& up : heads) {
            for (const auto status : {st::none, st::stored, st::unrecorded}) {
                for (const bool chunked : {false, true}) {
                    for (const bool keep : {false, true}) {
                        for (const auto length :
                             {std::optional<std::size_t>(), std::optional<std::size_t>(42)}) {
                            if (chunked && length) {
                                continue; // one framing or the other
                            }
                            CAPTURE(up.result_int());
                            CAPTURE(static_cast<int>(status));
                            CAPTURE(chunked);
                            CAPTURE(keep);
                            CAPTURE(length.has_value());
                            const std::string_view expires =
                                status == st::stored ? "Wed, 01 May 2024 12:00:00 GMT" : "";
                            response ref = up;
                            set_idempotency_status(ref, status);
                            set_idempotency_expires(ref, expires);
                            if (chunked) {
                                ref.set(bhttp::field::transfer_encoding, "chunked");
                            }
                            if (length && !ref.has_content_length()) {
                                ref.content_length(*length);
                            }
                            ref.keep_alive(keep);
                            std::string expected;
                            onceproxy::wire::serialize_head(ref, expected);
                            std::string head = "left over";
                            serialize_answer_head(up, status, expires, chunked, length, keep, head);
                            CHECK(head == expected);
                            // The same fields as received, hop-by-hop ones among them: the
                            // same head.
                            const auto raw = as_received(up);
                            const response bare{up.result(), 11};
                            head = "left over";
                            serialize_answer_head(bare, status, expires, chunked, length, keep,
                                                  head, &raw);
                            CHECK(head == expected);
                        }
                    }
                }
            }
        }
    }

    TEST_CASE("reject actions become problems with their status, Retry-After and header") {
        auto a = reject_of(core::problem_code::in_progress, 409, std::chrono::seconds(3));
        auto res = reject_response(a, std::nullopt);
        CHECK(res.result_int() == 409);
        CHECK(code_of(res) == "idempotency.in_progress");
        CHECK(res[bhttp::field::retry_after] == "3");
        CHECK_FALSE(res.count("Idempotency-Status"));

        a = reject_of(core::problem_code::payload_mismatch, 409);
        CHECK(reject_response(a, std::nullopt).result_int() == 409);
        a.http_status = 0; // no override: the table's default
        CHECK(reject_response(a, std::nullopt).result_int() == 422);

        a = reject_of(core::problem_code::upstream_timeout, 504);
        a.status_header = core::idempotency_status::unrecorded;
        res = reject_response(a, forward_status::timeout_after_send);
        CHECK(res["Idempotency-Status"] == "unrecorded");
        CHECK(detail_of(res) == core::info(core::problem_code::upstream_timeout).detail);

        a = reject_of(core::problem_code::upstream_unavailable, 502);
        CHECK(detail_of(reject_response(a, forward_status::connect_failed)) ==
              core::info(core::problem_code::upstream_unavailable).detail);
        CHECK(detail_of(reject_response(a, forward_status::reset_after_send))
                  .find("after the request was sent") != std::string::npos);
        // Same release path, its own code (SPEC §3.2).
        res = reject_response(a, forward_status::tls_failed);
        CHECK(code_of(res) == "upstream.tls_error");
        CHECK(res.result_int() == 502);
        CHECK(detail_of(res) == core::info(core::problem_code::upstream_tls_error).detail);
    }

    TEST_CASE("failed plain forwards become upstream problems (SPEC §3.2)") {
        CHECK(code_of(upstream_failure_problem(forward_status::timeout_after_send)) ==
              "upstream.timeout");
        CHECK(upstream_failure_problem(forward_status::timeout_after_send).result_int() == 504);
        for (auto s : {forward_status::response_too_large, forward_status::bad_response}) {
            CHECK(code_of(upstream_failure_problem(s)) == "upstream.bad_response");
        }
        CHECK(code_of(upstream_failure_problem(forward_status::tls_failed)) ==
              "upstream.tls_error");
        CHECK(upstream_failure_problem(forward_status::tls_failed).result_int() == 502);
        for (auto s : {forward_status::connect_failed, forward_status::pool_exhausted,
                       forward_status::reset_after_send}) {
            const auto res = upstream_failure_problem(s);
            CHECK(code_of(res) == "upstream.unavailable");
            CHECK(res.result_int() == 502);
        }
    }

    TEST_CASE("a full pool and a full tunnel budget name the upstream and the limit (issue 26)") {
        // Ordinary slots exhausted: still 502 upstream.unavailable, but not "could not reach".
        auto res = upstream_failure_problem(forward_status::pool_exhausted, "app");
        CHECK(code_of(res) == "upstream.unavailable");
        CHECK(res.result_int() == 502);
        CHECK(detail_of(res).find("connection limit of upstream 'app' reached") !=
              std::string::npos);
        auto a = reject_of(core::problem_code::upstream_unavailable, 502);
        CHECK(detail_of(reject_response(a, forward_status::pool_exhausted, "app"))
                  .find("connection limit of upstream 'app' reached") != std::string::npos);
        // Tunnels have their own budget and their own code: 503 + Retry-After, nothing sent.
        CHECK(onceproxy::upstream::nothing_sent(forward_status::tunnel_limit));
        res = upstream_failure_problem(forward_status::tunnel_limit, "app");
        CHECK(code_of(res) == "upstream.tunnel_limit");
        CHECK(res.result_int() == 503);
        CHECK(res[bhttp::field::retry_after] == "1");
        CHECK(detail_of(res).find("tunnel limit of upstream 'app' reached") != std::string::npos);
    }

    TEST_CASE("Idempotency-Status and dates") {
        response res{bhttp::status::ok, 11};
        set_idempotency_status(res, core::idempotency_status::none);
        CHECK_FALSE(res.count("Idempotency-Status"));
        set_idempotency_status(res, core::idempotency_status::stored);
        CHECK(res["Idempotency-Status"] == "stored");
        CHECK(http_date(0) == "Thu, 01 Jan 1970 00:00:00 GMT");
        CHECK(http_date(1700000000) == "Tue, 14 Nov 2023 22:13:20 GMT");
    }

    TEST_CASE("encryption at rest: records sealed on complete, opened on claim, never replayed "
              "when they do not open") {
        using core::claim_result_kind;
        const core::record_cipher k1({{"k1", std::string(32, 'a')}});
        const core::record_cipher k2_k1(
            {{"k2", std::string(32, 'b')}, {"k1", std::string(32, 'a')}});
        const core::record_cipher other({{"k1", std::string(32, 'z')}});
        config::idempotency_config p;
        core::action a;
        a.kind = core::action_kind::complete;
        a.record = core::record_kind::upstream_response;
        a.replayable = true;
        const auto up = upstream_answer();

        const auto sealed = record_payload(a, &up, p, "", &k1, {"route:hash-1"});
        CHECK(core::is_sealed(sealed));
        CHECK(sealed.find(up.body()) == std::string::npos);

        store::claim_result done;
        done.status = store::claim_status::completed;
        done.record = sealed;
        std::string record;
        auto t = to_claim_event(done, record, &k1, "route:hash-1");
        CHECK(t.event.kind == claim_result_kind::completed);
        CHECK(t.event.replayable);
        CHECK_FALSE(t.open_failure);
        CHECK(record == record_payload(a, &up, p, "")); // the plaintext encoding, replayable
        CHECK(replay_response(record, false, "d").body() == up.body());

        // Rotation: the new key set opens what the old one sealed.
        done.record = sealed;
        CHECK(to_claim_event(done, record, &k2_k1, "route:hash-1").event.replayable);

        const auto refused = [&](const core::record_cipher* c, std::string_view key,
                                 std::string stored, core::record_open_failure why) {
            done.record = std::move(stored);
            const auto r = to_claim_event(done, record, c, key);
            CHECK(r.event.kind == claim_result_kind::completed); // it ran: never again
            CHECK_FALSE(r.event.replayable);                     // and never replayed
            CHECK(r.unreadable);
            CHECK(record.empty());
            REQUIRE(r.open_failure);
            CHECK(*r.open_failure == why);
        };
        refused(&k1, "route:hash-2", sealed, core::record_open_failure::authentication);
        refused(&other, "route:hash-1", sealed, core::record_open_failure::authentication);
        refused(&k1, "route:hash-1", record_payload(a, &up, p, "", &k2_k1, {"route:hash-1"}),
                core::record_open_failure::unknown_key);
        refused(&k1, "route:hash-1", record_payload(a, &up, p, ""),
                core::record_open_failure::plaintext);
        refused(nullptr, "route:hash-1", sealed, core::record_open_failure::unknown_key);
    }
}
