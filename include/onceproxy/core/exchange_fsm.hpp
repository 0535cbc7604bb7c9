#pragma once
// The idempotency exchange state machine (SPEC §1-§3): what one guarded request does with its key.
//
// Pure: no sockets, no store, no clock reads. The session feeds it events, each with `now`, and
// carries out the action it returns; the model is Boost.Redis's exec_fsm. Typical driver:
//
//   exchange_fsm fsm(route.idempotency);
//   action a = fsm.start(facts, now());
//   while (a.kind != action_kind::done) {
//     switch (a.kind) {
//     claim:        a = fsm.on_claim(event_of(co_await store.async_claim(...)), now());
//     forward:      start the upstream call; then as wait_until
//     stream:       pass the answer's head on and relay its body beside the driver; then as
//                   wait_until until on_upstream says how the body ended
//     wait_until:   wait for the pending upstream call (if any) or a.wake_at, then
//                   a = fsm.on_upstream(...) or a = fsm.on_tick(now())
//     extend_lease: a = fsm.on_extend(event_of(co_await store.async_extend(...)), now());
//     complete:     a = fsm.on_complete(event_of(co_await store.async_complete(...)), now());
//     release:      a = fsm.on_release(event_of(co_await store.async_release(...)), now());
//     replay, respond, reject, passthrough:
//                   answer the client; a = fsm.on_responded(now());
//     }
//   }
//   metrics.count(*fsm.outcome());
//
// Driving rules (the contract):
//   - Exactly one store operation is outstanding at a time: after claim, extend_lease, complete
//     or release, the next event must be that operation's result.
//   - The upstream call started by `forward` is the only operation that may be pending across
//     other actions: while it runs the fsm may ask for extend_lease (await it, feed on_extend,
//     then go on waiting). Its outcome is fed with on_upstream once, in state forwarding.
//   - A response whose body outgrows max_record_bytes may be reported as `streaming` (head and
//     the first bytes arrived, the rest still coming) instead of whole. For a recordable status
//     the fsm answers `stream`: the session sends the head at once and relays the body while
//     the lease is still held and extended; once the body has ended (or broken) the session
//     feeds on_upstream again, once, with `response` (total body bytes) or the failure. The
//     client-facing action that follows was already carried out by the stream (its head said
//     `stored`; a broken body cut the connection): the session skips it and calls on_responded.
//   - `wake_at` of forward / stream / wait_until: call on_tick(now) at or after that time unless
//   another
//     event comes first. time_point::max() means "no timer: wait for the pending upstream call".
//     An early tick is harmless: the same wait_until comes back.
//   - After a client-facing action (replay, respond, reject, passthrough) call on_responded,
//     whether or not the client could be written to. When on_responded does not return done,
//     the remaining actions are store-only (background completion retry): the session may move
//     the fsm into a detached coroutine and go on serving the connection.
//   - Late answers (issue 26): with upstream_deadlines whose late_answer_timeout is above the
//     timeout, the session gives the upstream call late_answer_timeout as its deadline, and the
//     fsm asks for the client's 504 upstream.timeout by itself (a reject out of on_tick in
//     forwarding) once `timeout` has passed since forward. After that answer's on_responded
//     the exchange goes back to forwarding without its client: it keeps the lease extended and
//     waits for the call, whose outcome (fed with on_upstream as usual) is recorded or released
//     with no client-facing action; only a call that still fails (timed_out at
//     late_answer_timeout, reset, ...) meets on_upstream_uncertain. The session may move the
//     fsm into a detached coroutine at that on_responded, as for a background completion.
//   - on_client_gone() may be called at any time. The exchange still records or releases what
//     the upstream answered; client-facing actions are skipped from then on, and a duplicate
//     waiting for the first attempt (concurrent: wait) stops waiting.
//   - Events that do not fit the current state are driver bugs (asserted).
//
// Observe mode (`mode: observe`): the exchange claims, forwards, extends, completes and releases
// exactly as `required` does, so the first attempt of a key is recorded. Where `required` would
// block, reject or replay (no key, a malformed key, a duplicate in flight, a completed record, a
// fingerprint mismatch) the fsm answers passthrough instead and observed() says what
// enforcement would have done. Such a duplicate claims nothing (the claim that found the
// other attempt's lease or record changed nothing), so it never blocks the first attempt, and
// its own answer is not recorded: the first record stays. A store error on the claim always
// passes through (observe mode never fails closed). No answer carries Idempotency-Status.

#include <onceproxy/config/config.hpp>
#include <onceproxy/core/outcome.hpp>
#include <onceproxy/core/problem.hpp>
#include <onceproxy/core/request_facts.hpp>

#include <chrono>
#include <cstddef>
#include <optional>
#include <string_view>

namespace onceproxy::core {

using time_point = std::chrono::steady_clock::time_point;
using duration = std::chrono::milliseconds;

/// Where the exchange is.
enum class state {
    idle,       ///< start() not called yet
    claiming,   ///< claim issued, waiting for on_claim
    waiting,    ///< concurrent: wait, backing off before the next claim of a busy key
    forwarding, ///< lease held, request at the upstream; ticks extend the lease
    extending,  ///< extend_lease issued while forwarding, waiting for on_extend
    completing, ///< complete issued, waiting for on_complete
    releasing,  ///< release issued, waiting for on_release
    answering,  ///< client-facing action issued, waiting for on_responded
    retry_wait, ///< answered unrecorded; backing off before retrying the completion
    finished,   ///< done; outcome() is final
};

/// What the session must do next.
enum class action_kind {
    claim,   ///< claim the key in the store with `lease`; feed on_claim
    forward, ///< send the request upstream; then as wait_until (lease ticks at `wake_at`)
    /// pass the streaming upstream answer's head on with `status_header` and relay its body;
    /// then as wait_until (lease ticks at `wake_at`) until on_upstream tells how the body ended
    stream,
    extend_lease, ///< extend the lease by `lease`; feed on_extend
    complete,     ///< record `record` (with `replayable`, `ttl`) under the lease; feed on_complete
    release,      ///< delete the lease so a retry may run; feed on_release
    replay,       ///< answer with the record the claim returned, Idempotency-Status: replayed
    respond,      ///< pass the upstream response on, with `status_header`
    reject,       ///< answer the problem `problem` (status, code, Retry-After), `status_header`
    passthrough,  ///< plain proxying: forward unprotected and pass the answer on
    wait_until,   ///< nothing to do until `wake_at` or the pending upstream outcome
    done,         ///< the exchange is over; outcome() is final
};

/// The Idempotency-Status header of a respond or reject.
enum class idempotency_status {
    none,       ///< no header: nothing recorded (released, held, or not an idempotent answer)
    stored,     ///< the answer is recorded and will be replayed
    unrecorded, ///< the effect happened but could not be recorded (store error, lost lease)
};

/// What a complete action records.
enum class record_kind {
    upstream_response,       ///< the upstream response just received
    outcome_unknown_problem, ///< the 502 upstream.outcome_unknown problem (uncertain: fail)
};

/// The one final result of an exchange, for metrics and logs (core::outcome; an exchange never
/// ends `rejected`, which the proxy gives requests refused before the exchange).
using exchange_outcome = outcome;

/// Result of a claim, as the store reported it.
enum class claim_result_kind {
    acquired,    ///< the key was free, the lease is ours
    in_flight,   ///< another attempt holds the lease (same fingerprint)
    completed,   ///< a record exists (same fingerprint)
    mismatch,    ///< a lease or record with another fingerprint
    store_error, ///< the store failed (unreachable, timeout, full)
};

struct claim_event {
    claim_result_kind kind = claim_result_kind::acquired;
    duration remaining_lease{0}; ///< in_flight: time until the other lease lapses
    bool replayable = true;      ///< completed: the record can be replayed (decoded by the session)
};

/// Result of a fenced store operation (extend, complete, release).
enum class fence_event {
    ok,          ///< done, we owned the lease
    not_owner,   ///< the lease is lost: expired or taken over
    store_error, ///< the store failed; whether it took effect is unknown
};

/// How the upstream call ended.
enum class upstream_result {
    response, ///< a complete response arrived (`status`, `body_bytes`)
    /// the head and more than max_record_bytes of body arrived, the rest is still coming
    /// (`status`, `body_bytes` so far); reported at most once, before the final event
    streaming,
    not_sent,     ///< failed before anything was sent (connect failure): certainly no effect
    timed_out,    ///< outcome unknown: the request was sent, no complete response in time
    reset,        ///< outcome unknown: the request was sent, the connection broke before a response
    bad_response, ///< outcome unknown: the request was sent, the answer was unusable (malformed)
};

struct upstream_event {
    upstream_result kind = upstream_result::response;
    unsigned status = 0;        ///< response: HTTP status
    std::size_t body_bytes = 0; ///< response: body size, compared with max_record_bytes
    /// response of a gRPC call: its grpc-status, which decides instead of the HTTP status
    /// (grpc_record, grpc_release; any other code is an uncertain outcome).
    std::optional<unsigned> grpc_status = std::nullopt;
};

/// The upstream's deadlines as the exchange sees them (issue 26). With late_answer_timeout above
/// timeout, a call that has not answered `timeout` after forward gets the client its 504 while
/// the answer is still awaited, up to late_answer_timeout after forward (the call's deadline,
/// which the session sets). Otherwise (the defaults) the call's own outcome is all there is.
///
/// Whatever the session's call does, the engine itself gives up on it at connect_timeout + the
/// call's deadline (late_answer_timeout when late answers are on, else timeout) + 1 s, as an
/// unknown outcome: a call that never ends (a bug, a stall the forwarder does not bound) cannot
/// leave the client unanswered or the lease extended for ever (issue 26, item 7b). 0 timeout:
/// no bound (unit tests of other paths).
struct upstream_deadlines {
    duration timeout{0};
    duration late_answer_timeout{0};
    duration connect_timeout{0};
    /// The client's own deadline (gRPC's grpc-timeout), 0 when it sent none: it caps
    /// wait_timeout (concurrent: wait); the session caps `timeout` with it too.
    duration client_deadline{0};
};

/// Backoffs; the defaults are the product's, tests may shorten them.
struct exchange_timing {
    duration wait_backoff_initial{10};  ///< concurrent: wait, first re-claim delay
    duration wait_backoff_max{250};     ///< ... doubling up to this
    duration retry_backoff_initial{50}; ///< failed completion or extension: first retry delay
    duration retry_backoff_max{1'000};  ///< ... doubling up to this
    std::chrono::seconds store_unavailable_retry_after{1}; ///< Retry-After of the 503
};

struct action {
    action_kind kind = action_kind::done;
    /// forward, wait_until: tick at this time (time_point::max(): no timer).
    time_point wake_at = time_point::max();
    /// claim, extend_lease: lease length to ask for.
    duration lease{0};
    /// complete: what to record, whether it is replayable, and how long to keep it.
    record_kind record = record_kind::upstream_response;
    bool replayable = true;
    duration ttl{0};
    /// respond, reject: the Idempotency-Status header.
    idempotency_status status_header = idempotency_status::none;
    /// reject: the problem, its HTTP status (the table's default or the route's override);
    /// retry_after 0 = no Retry-After header.
    problem_code problem = problem_code::missing_key;
    unsigned http_status = 0;
    std::chrono::seconds retry_after{0};
};

/// True when `policy` protects requests with `method` (upper case): the mode is not off, the
/// method is listed, and it is not GET, HEAD or OPTIONS (never guarded, SPEC §1).
bool guards_method(const config::idempotency_config& policy, std::string_view method) noexcept;

class exchange_fsm {
public:
    /// Copies what it needs from `policy` (a config reload cannot pull it away mid-exchange).
    explicit exchange_fsm(const config::idempotency_config& policy, exchange_timing timing = {},
                          upstream_deadlines deadlines = {});

    /// First event. Returns passthrough, reject (missing/invalid key) or claim.
    action start(const request_facts& facts, time_point now);

    /// Result of the claim action.
    action on_claim(const claim_event& ev, time_point now);

    /// How the upstream call started by forward ended (state forwarding only).
    action on_upstream(const upstream_event& ev, time_point now);

    /// Result of extend_lease.
    action on_extend(fence_event ev, time_point now);

    /// Result of complete (first attempt or background retry).
    action on_complete(fence_event ev, time_point now);

    /// Result of release.
    action on_release(fence_event ev, time_point now);

    /// A timer fired (see wake_at). Drives lease extension, wait re-claims, completion retries,
    /// and the client's 504 when the upstream is late (see upstream_deadlines).
    action on_tick(time_point now);

    /// The client-facing action was carried out (or skipped because the client left).
    action on_responded(time_point now);

    /// The client went away; see the driving rules above.
    void on_client_gone() noexcept { client_gone_ = true; }

    state current_state() const noexcept { return state_; }
    /// Set once the exchange is done.
    std::optional<exchange_outcome> outcome() const noexcept { return outcome_; }
    /// Our conservative view of when the lease ends (issue time of the last successful claim or
    /// extension + lease); time_point::min() before a lease is held.
    time_point lease_deadline() const noexcept { return lease_deadline_; }
    bool lease_lost() const noexcept { return lease_lost_; }
    bool client_gone() const noexcept { return client_gone_; }
    /// Observe mode: what enforcement would have done instead of the passthrough this exchange
    /// answered; set at most once, before that passthrough. Always empty in other modes.
    std::optional<observation> observed() const noexcept { return observed_; }
    /// The client got its 504 while the upstream answer was still awaited (issue 26): once the
    /// exchange is done, what became of that answer. Empty otherwise.
    std::optional<late_answer> late() const noexcept;
    /// Late answers are on for this exchange: the upstream call is bounded by
    /// late_answer_timeout, and the engine itself answers 504 at the timeout (never on `fail`
    /// routes, whose outcome_unknown record is written at the timeout).
    bool awaits_late_answers() const noexcept { return answer_window_ > duration{0}; }

private:
    struct policy_values {
        config::idempotency_mode mode;
        duration ttl;
        duration lease;
        config::concurrent_policy concurrent;
        duration wait_timeout;
        unsigned mismatch_status;
        config::status_set record;
        config::status_set release;
        config::grpc_status_set grpc_record;
        config::grpc_status_set grpc_release;
        config::uncertain_policy on_upstream_uncertain;
        config::store_error_policy on_store_error;
        std::size_t max_record_bytes;
    };

    /// What a complete answer asks of the key: record it, release it, or (a gRPC status
    /// outside both sets) treat it as an uncertain outcome.
    enum class answer_verdict { record, release, uncertain };
    /// The store step that must happen before the client is answered.
    enum class step { none, complete, release };

    answer_verdict verdict_of(const upstream_event& ev) const noexcept;
    /// on_upstream_uncertain applied to pending_answer_/pending_outcome_ (`answered`: the
    /// upstream's own answer is passed on); returns the store step.
    step on_uncertain(time_point now, bool answered);
    action issue_claim(time_point now);
    action answer(action a, time_point now);
    action observe_instead(observation o, time_point now);
    bool observing() const noexcept { return policy_.mode == config::idempotency_mode::observe; }
    action reject(problem_code code, idempotency_status header,
                  std::chrono::seconds retry_after = std::chrono::seconds{0});
    action finish(exchange_outcome o);
    action wait(time_point wake_at);
    action schedule_completion_retry(time_point now);
    action complete_action() const;
    action unexpected(const char* event);
    action answer_overdue(time_point now);
    time_point forwarding_wake() const noexcept;

    policy_values policy_;
    exchange_timing timing_;
    state state_ = state::idle;
    std::optional<exchange_outcome> outcome_;
    std::optional<observation> observed_;

    time_point issued_at_{};     ///< when the outstanding claim or extend was issued
    time_point wait_deadline_{}; ///< concurrent: wait gives up here
    duration wait_backoff_{0};
    time_point lease_deadline_ = time_point::min();
    time_point next_extend_ = time_point::max();
    duration extend_backoff_{0};
    duration retry_backoff_{0};
    time_point wake_at_ = time_point::max();
    bool lease_lost_ = false;
    bool seen_in_flight_ = false; ///< a claim reported another attempt in flight (wait mode)
    bool client_gone_ = false;
    bool background_ = false; ///< the client was answered; completing in the background
    bool streaming_ = false;  ///< a `stream` action went out: the body is being relayed
    /// Late answers (upstream_deadlines): when the client gets its 504 if the call has not
    /// ended (time_point::max(): never); whether it got it; whether the call then answered.
    time_point answer_due_ = time_point::max();
    duration answer_window_{0};                 ///< timeout, when late answers are on; 0 otherwise
    duration give_up_after_{0};                 ///< the engine's own bound on the call; 0: none
    time_point give_up_at_ = time_point::max(); ///< forward + give_up_after_
    bool overdue_ = false;                      ///< the client got its 504 while the call went on
    bool awaiting_late_ = false;                ///< ... and that answer's on_responded is still due
    bool late_arrived_ = false; ///< the call then ended with an answer (or nothing sent)

    // What the exchange answers once its store step (complete/release) is done.
    action pending_answer_{};
    exchange_outcome pending_outcome_ = exchange_outcome::stored;
    record_kind pending_record_ = record_kind::upstream_response;
    bool pending_replayable_ = true;
};

std::string_view to_string(state s) noexcept;
std::string_view to_string(action_kind k) noexcept;
std::string_view to_string(idempotency_status s) noexcept;

} // namespace onceproxy::core
