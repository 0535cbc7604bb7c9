#include <onceproxy/core/exchange_fsm.hpp>

#include <algorithm>
#include <cassert>

namespace onceproxy::core {

namespace {

using std::chrono::seconds;

/// Retry-After from a remaining time: whole seconds rounded up, at least 1 (RFC 9110 §10.2.3
/// has no sub-second values, and 0 would invite an immediate retry into the same lease).
seconds retry_after_from(duration remaining) {
    return std::max(std::chrono::ceil<seconds>(remaining), seconds{1});
}

duration doubled(duration d, duration cap) {
    return std::min(d * 2, cap);
}

bool in_set(const config::status_set& set, unsigned status) {
    return status < set.size() && set.test(status);
}

} // namespace

bool guards_method(const config::idempotency_config& policy, std::string_view method) noexcept {
    if (policy.mode == config::idempotency_mode::off) {
        return false;
    }
    // Safe methods never take effect, so there is nothing to protect (SPEC §1).
    if (method == "GET" || method == "HEAD" || method == "OPTIONS") {
        return false;
    }
    return std::find(policy.methods.begin(), policy.methods.end(), method) != policy.methods.end();
}

exchange_fsm::exchange_fsm(const config::idempotency_config& policy, exchange_timing timing,
                           upstream_deadlines deadlines)
    : policy_{policy.mode,
              policy.ttl,
              policy.lease,
              policy.concurrent,
              policy.wait_timeout,
              policy.mismatch_status,
              policy.record,
              policy.release,
              policy.grpc_record,
              policy.grpc_release,
              policy.on_upstream_uncertain,
              policy.on_store_error,
              policy.max_record_bytes},
      timing_(timing), wait_backoff_(timing.wait_backoff_initial),
      extend_backoff_(timing.retry_backoff_initial), retry_backoff_(timing.retry_backoff_initial),
      // Not on `fail` routes: there the outcome_unknown record is written at the timeout,
      // as before, so a proxy killed while it waited on cannot leave the key to lapse and run
      // again (the soak's strict route caught exactly that).
      answer_window_(policy.on_upstream_uncertain != config::uncertain_policy::fail &&
                             deadlines.timeout > duration{0} &&
                             deadlines.late_answer_timeout > deadlines.timeout
                         ? deadlines.timeout
                         : duration{0}) {
    if (deadlines.client_deadline > duration{0}) {
        policy_.wait_timeout = std::min(policy_.wait_timeout, deadlines.client_deadline);
    }
    if (deadlines.timeout > duration{0}) {
        give_up_after_ =
            deadlines.connect_timeout +
            (answer_window_ > duration{0} ? deadlines.late_answer_timeout : deadlines.timeout) +
            std::chrono::seconds(1);
    }
}

std::optional<late_answer> exchange_fsm::late() const noexcept {
    if (!overdue_ || !outcome_) {
        return std::nullopt;
    }
    if (!late_arrived_) {
        return late_answer::unanswered;
    }
    switch (*outcome_) {
    case exchange_outcome::stored:
    case exchange_outcome::not_replayable:
        return late_answer::recorded;
    case exchange_outcome::released:
        return late_answer::released;
    default:
        return late_answer::unrecorded;
    }
}

time_point exchange_fsm::forwarding_wake() const noexcept {
    if (streaming_) {
        return next_extend_;
    }
    return std::min({next_extend_, give_up_at_, overdue_ ? time_point::max() : answer_due_});
}

// The upstream is past its timeout: the client gets its 504 now, as it always did, but the
// call goes on (issue 26: an answer thrown away here made the retry after the lease execute
// again). The lease stays held and extended until the call ends.
action exchange_fsm::answer_overdue(time_point now) {
    overdue_ = true;
    awaiting_late_ = true;
    pending_answer_ = reject(problem_code::upstream_timeout, idempotency_status::none);
    if (!lease_lost_) {
        pending_answer_.retry_after =
            retry_after_from(std::chrono::ceil<duration>(lease_deadline_ - now));
    }
    pending_outcome_ = exchange_outcome::held; // so far: the call decides
    return answer(pending_answer_, now);
}

action exchange_fsm::finish(exchange_outcome o) {
    state_ = state::finished;
    outcome_ = o;
    return action{};
}

action exchange_fsm::wait(time_point wake_at) {
    wake_at_ = wake_at;
    action a;
    a.kind = action_kind::wait_until;
    a.wake_at = wake_at;
    return a;
}

action exchange_fsm::reject(problem_code code, idempotency_status header, seconds retry_after) {
    action a;
    a.kind = action_kind::reject;
    a.problem = code;
    a.http_status = default_status(code);
    a.status_header = header;
    a.retry_after = retry_after;
    return a;
}

// Every client-facing action goes through here: once the client is gone there is nobody to
// answer, and the exchange goes straight to what follows the answer.
action exchange_fsm::answer(action a, time_point now) {
    if (observing()) {
        // Observe mode stays out of the answers: the route behaves, for its clients, as if no
        // idempotency layer were there (a `stored` would promise a replay that never comes).
        a.status_header = idempotency_status::none;
    }
    if (client_gone_) {
        state_ = state::answering;
        return on_responded(now);
    }
    state_ = state::answering;
    return a;
}

// Observe mode, where enforcement would block, reject or replay: forward unprotected instead,
// holding nothing in the store, and remember what would have happened.
action exchange_fsm::observe_instead(observation o, time_point now) {
    observed_ = o;
    pending_outcome_ = exchange_outcome::passthrough;
    action a;
    a.kind = action_kind::passthrough;
    return answer(a, now);
}

action exchange_fsm::issue_claim(time_point now) {
    state_ = state::claiming;
    issued_at_ = now;
    action a;
    a.kind = action_kind::claim;
    a.lease = policy_.lease;
    return a;
}

action exchange_fsm::complete_action() const {
    action a;
    a.kind = action_kind::complete;
    a.record = pending_record_;
    a.replayable = pending_replayable_;
    a.ttl = policy_.ttl;
    return a;
}

action exchange_fsm::unexpected([[maybe_unused]] const char* event) {
    // A driver bug: the event does not belong to this state. Never reached from network input.
    assert(false && "exchange_fsm: event does not fit the current state");
    // Without asserts, end the exchange rather than act twice on the store.
    return finish(exchange_outcome::store_error);
}

action exchange_fsm::start(const request_facts& facts, time_point now) {
    if (state_ != state::idle) {
        return unexpected("start");
    }
    if (!facts.guarded || policy_.mode == config::idempotency_mode::off) {
        pending_outcome_ = exchange_outcome::passthrough;
        action a;
        a.kind = action_kind::passthrough;
        return answer(a, now);
    }
    switch (facts.key) {
    case key_presence::invalid:
        if (observing()) {
            return observe_instead(observation::invalid_key, now);
        }
        pending_outcome_ = exchange_outcome::invalid_key;
        return answer(reject(problem_code::invalid_key, idempotency_status::none), now);
    case key_presence::missing:
        if (observing()) {
            return observe_instead(observation::missing_key, now);
        }
        if (policy_.mode == config::idempotency_mode::optional) {
            pending_outcome_ = exchange_outcome::passthrough;
            action a;
            a.kind = action_kind::passthrough;
            return answer(a, now);
        }
        pending_outcome_ = exchange_outcome::missing_key;
        return answer(reject(problem_code::missing_key, idempotency_status::none), now);
    case key_presence::present:
        break;
    }
    wait_deadline_ = now + policy_.wait_timeout;
    return issue_claim(now);
}

action exchange_fsm::on_claim(const claim_event& ev, time_point now) {
    if (state_ != state::claiming) {
        return unexpected("on_claim");
    }
    switch (ev.kind) {
    case claim_result_kind::acquired: {
        // The store set its expiry no earlier than when we asked: counting from the issue time
        // keeps our view of the lease end on the safe (early) side.
        lease_deadline_ = issued_at_ + policy_.lease;
        next_extend_ = issued_at_ + policy_.lease / 3;
        if (answer_window_ > duration{0}) {
            answer_due_ = now + answer_window_;
        }
        if (give_up_after_ > duration{0}) {
            give_up_at_ = now + give_up_after_;
        }
        state_ = state::forwarding;
        wake_at_ = forwarding_wake();
        action a;
        a.kind = action_kind::forward;
        a.wake_at = wake_at_;
        return a;
    }
    case claim_result_kind::in_flight: {
        if (observing()) {
            return observe_instead(observation::conflict, now); // never waits either
        }
        const duration remaining = std::max(ev.remaining_lease, duration{1});
        const bool may_wait = policy_.concurrent == config::concurrent_policy::wait &&
                              !client_gone_ && now < wait_deadline_;
        if (!may_wait) {
            pending_outcome_ = exchange_outcome::in_progress;
            return answer(reject(problem_code::in_progress, idempotency_status::none,
                                 retry_after_from(remaining)),
                          now);
        }
        // Re-claim after the backoff, or as soon as the other lease lapses, and once more at
        // the deadline; SPEC §3.6: bounded backoff, never a tight loop on the store.
        const time_point wake = std::min({now + wait_backoff_, now + remaining, wait_deadline_});
        wait_backoff_ = doubled(wait_backoff_, timing_.wait_backoff_max);
        seen_in_flight_ = true;
        state_ = state::waiting;
        return wait(wake);
    }
    case claim_result_kind::completed:
        if (observing()) {
            return observe_instead(
                ev.replayable ? observation::replay : observation::not_replayable, now);
        }
        if (ev.replayable) {
            pending_outcome_ = exchange_outcome::replayed;
            action a;
            a.kind = action_kind::replay;
            return answer(a, now);
        }
        pending_outcome_ = exchange_outcome::not_replayable;
        return answer(reject(problem_code::response_not_replayable, idempotency_status::none), now);
    case claim_result_kind::mismatch: {
        if (observing()) {
            return observe_instead(observation::mismatch, now);
        }
        pending_outcome_ = exchange_outcome::mismatch;
        action a = reject(problem_code::payload_mismatch, idempotency_status::none);
        a.http_status = policy_.mismatch_status; // 422 by default, 409 by config (SPEC §3.2)
        return answer(a, now);
    }
    case claim_result_kind::store_error:
        pending_outcome_ = exchange_outcome::store_error;
        // A waiting duplicate already saw the first attempt in flight: failing open now would
        // run the request a second time next to it.
        // Observe mode must never make a route fail that works without it: it always fails
        // open (it never waits, so it has never seen another attempt in flight either).
        if ((policy_.on_store_error == config::store_error_policy::fail_open || observing()) &&
            !seen_in_flight_) {
            action a;
            a.kind = action_kind::passthrough;
            return answer(a, now);
        }
        return answer(reject(problem_code::store_unavailable, idempotency_status::none,
                             timing_.store_unavailable_retry_after),
                      now);
    }
    return unexpected("on_claim");
}

exchange_fsm::answer_verdict exchange_fsm::verdict_of(const upstream_event& ev) const noexcept {
    if (ev.grpc_status) {
        const auto code = *ev.grpc_status;
        const bool known = code < policy_.grpc_record.size();
        if (known && policy_.grpc_release.test(code)) {
            return answer_verdict::release;
        }
        return known && policy_.grpc_record.test(code) ? answer_verdict::record
                                                       : answer_verdict::uncertain;
    }
    return in_set(policy_.record, ev.status) && !in_set(policy_.release, ev.status)
               ? answer_verdict::record
               : answer_verdict::release;
}

exchange_fsm::step exchange_fsm::on_uncertain(time_point now, bool answered) {
    switch (policy_.on_upstream_uncertain) {
    case config::uncertain_policy::hold:
        // Keep the lease: retries see 409 until it lapses; tell this client when (a problem
        // answer; an answer of the upstream's own is passed on as it is).
        if (!lease_lost_ && !answered) {
            pending_answer_.retry_after =
                retry_after_from(std::chrono::ceil<duration>(lease_deadline_ - now));
        }
        pending_outcome_ = exchange_outcome::held;
        return step::none;
    case config::uncertain_policy::release:
        pending_outcome_ = exchange_outcome::released;
        return step::release;
    case config::uncertain_policy::fail:
        // Consume the key with the problem; this client gets what retries will replay.
        pending_answer_ = reject(problem_code::upstream_outcome_unknown, idempotency_status::none);
        pending_record_ = record_kind::outcome_unknown_problem;
        pending_replayable_ = true;
        pending_outcome_ = exchange_outcome::outcome_unknown;
        return step::complete;
    }
    return step::none;
}

action exchange_fsm::on_upstream(const upstream_event& ev, time_point now) {
    if (state_ != state::forwarding) {
        return unexpected("on_upstream");
    }
    wake_at_ = time_point::max();

    // The answer for the client and the store step that must happen first.
    step next = step::none;

    if (ev.kind == upstream_result::streaming && streaming_) {
        return unexpected("on_upstream(streaming) twice");
    }
    if (overdue_) {
        late_arrived_ = ev.kind == upstream_result::response ||
                        ev.kind == upstream_result::streaming ||
                        ev.kind == upstream_result::not_sent;
    }

    switch (ev.kind) {
    case upstream_result::response:
    case upstream_result::streaming: {
        action respond;
        respond.kind = action_kind::respond;
        pending_answer_ = respond;
        const auto verdict = verdict_of(ev);
        const bool recordable = verdict == answer_verdict::record;
        if (verdict == answer_verdict::uncertain) {
            // A complete answer that says the outcome is unknown (a gRPC DEADLINE_EXCEEDED,
            // INTERNAL, ...): passed on as it is, the key handled as for a reset.
            next = on_uncertain(now, true);
            break;
        }
        // Nobody to stream to once the client is gone (or has its 504): kept head-only below.
        if (ev.kind == upstream_result::streaming && recordable && !lease_lost_ && !client_gone_) {
            // Too large to hold: the client gets it as it comes, while the lease is kept (and
            // extended) until the body has ended; only then is the key completed, or, if the
            // body breaks, handled as an unknown outcome (issue 8).
            streaming_ = true;
            wake_at_ = next_extend_;
            action a;
            a.kind = action_kind::stream;
            a.wake_at = next_extend_;
            a.status_header = observing() ? idempotency_status::none : idempotency_status::stored;
            return a;
        }
        if (!recordable) {
            // Not recordable (release list wins over record): free the key, a retry runs again.
            pending_outcome_ = exchange_outcome::released;
            next = step::release;
        } else {
            // Too large to keep: the first caller gets it, retries get 409, never a re-run.
            pending_replayable_ =
                ev.kind == upstream_result::response && ev.body_bytes <= policy_.max_record_bytes;
            pending_record_ = record_kind::upstream_response;
            pending_outcome_ =
                pending_replayable_ ? exchange_outcome::stored : exchange_outcome::not_replayable;
            next = step::complete;
        }
        break;
    }
    case upstream_result::not_sent:
        // Nothing reached the upstream: no effect, the key must not be consumed.
        pending_answer_ = reject(problem_code::upstream_unavailable, idempotency_status::none);
        pending_outcome_ = exchange_outcome::released;
        next = step::release;
        break;
    case upstream_result::timed_out:
    case upstream_result::reset:
    case upstream_result::bad_response: {
        // Outcome unknown: the effect may have happened (SPEC §2).
        switch (ev.kind) {
        case upstream_result::timed_out:
            pending_answer_ = reject(problem_code::upstream_timeout, idempotency_status::none);
            break;
        case upstream_result::bad_response:
            pending_answer_ = reject(problem_code::upstream_bad_response, idempotency_status::none);
            break;
        default:
            pending_answer_ = reject(problem_code::upstream_unavailable, idempotency_status::none);
            break;
        }
        next = on_uncertain(now, false);
        break;
    }
    }

    if (lease_lost_ && next != step::none) {
        // An extension already told us the lease is someone else's: touching the key could
        // only fail (fencing) or, worse, act on the new owner's behalf.
        pending_outcome_ = exchange_outcome::lease_lost;
        pending_answer_.status_header =
            next == step::complete ? idempotency_status::unrecorded : idempotency_status::none;
        return answer(pending_answer_, now);
    }
    if (lease_lost_) {
        pending_outcome_ = exchange_outcome::lease_lost;
    }
    switch (next) {
    case step::complete:
        state_ = state::completing;
        return complete_action();
    case step::release: {
        state_ = state::releasing;
        action a;
        a.kind = action_kind::release;
        return a;
    }
    case step::none:
        break;
    }
    return answer(pending_answer_, now);
}

action exchange_fsm::on_extend(fence_event ev, time_point now) {
    if (state_ != state::extending) {
        return unexpected("on_extend");
    }
    state_ = state::forwarding;
    switch (ev) {
    case fence_event::ok:
        lease_deadline_ = issued_at_ + policy_.lease;
        next_extend_ = issued_at_ + policy_.lease / 3;
        extend_backoff_ = timing_.retry_backoff_initial;
        break;
    case fence_event::not_owner:
        // Lost: the upstream call goes on (it may have taken effect), but the key is not ours.
        lease_lost_ = true;
        next_extend_ = time_point::max();
        break;
    case fence_event::store_error:
        // Maybe extended, maybe not: try again soon; the lease still has two thirds to run
        // when the first extension is due.
        next_extend_ = now + extend_backoff_;
        extend_backoff_ = doubled(extend_backoff_, timing_.retry_backoff_max);
        break;
    }
    return wait(forwarding_wake());
}

action exchange_fsm::on_complete(fence_event ev, time_point now) {
    if (state_ != state::completing) {
        return unexpected("on_complete");
    }
    if (background_) {
        switch (ev) {
        case fence_event::ok:
            return finish(pending_outcome_);
        case fence_event::not_owner:
            return finish(exchange_outcome::lease_lost);
        case fence_event::store_error:
            return schedule_completion_retry(now);
        }
    }
    switch (ev) {
    case fence_event::ok:
        pending_answer_.status_header = idempotency_status::stored;
        return answer(pending_answer_, now);
    case fence_event::not_owner:
        pending_outcome_ = exchange_outcome::lease_lost;
        pending_answer_.status_header = idempotency_status::unrecorded;
        return answer(pending_answer_, now);
    case fence_event::store_error:
        // The client must learn the effect happened; the record is retried in the background
        // until the lease ends (SPEC §1.5). Until then retries see 409, never a second run.
        background_ = true;
        pending_answer_.status_header = idempotency_status::unrecorded;
        return answer(pending_answer_, now);
    }
    return unexpected("on_complete");
}

action exchange_fsm::on_release(fence_event ev, time_point now) {
    if (state_ != state::releasing) {
        return unexpected("on_release");
    }
    switch (ev) {
    case fence_event::ok:
        break;
    case fence_event::not_owner:
        pending_outcome_ = exchange_outcome::lease_lost;
        break;
    case fence_event::store_error:
        // The lease stays until it lapses: retries see 409 meanwhile, then run again.
        pending_outcome_ = exchange_outcome::store_error;
        break;
    }
    pending_answer_.status_header = idempotency_status::none;
    return answer(pending_answer_, now);
}

action exchange_fsm::schedule_completion_retry(time_point now) {
    const time_point wake = now + retry_backoff_;
    retry_backoff_ = doubled(retry_backoff_, timing_.retry_backoff_max);
    // Past the lease end the key may belong to someone else: a late record would be refused by
    // fencing anyway, and the key must not stay blocked by our retries.
    if (wake >= lease_deadline_) {
        return finish(exchange_outcome::record_failed);
    }
    state_ = state::retry_wait;
    return wait(wake);
}

action exchange_fsm::on_responded(time_point now) {
    if (state_ != state::answering) {
        return unexpected("on_responded");
    }
    if (awaiting_late_) {
        // The 504 went out (or the client had left): wait on for the call, store-only now.
        awaiting_late_ = false;
        client_gone_ = true;
        state_ = state::forwarding;
        return wait(forwarding_wake());
    }
    if (background_) {
        return schedule_completion_retry(now);
    }
    return finish(pending_outcome_);
}

action exchange_fsm::on_tick(time_point now) {
    switch (state_) {
    case state::waiting:
        if (client_gone_) {
            return finish(exchange_outcome::in_progress);
        }
        if (now < wake_at_) {
            return wait(wake_at_);
        }
        return issue_claim(now);
    case state::forwarding:
        if (!streaming_ && now >= give_up_at_) {
            // The call outlived every deadline it had: an unknown outcome (see
            // upstream_deadlines); a late answer is no longer awaited.
            return on_upstream({upstream_result::timed_out, 0, 0}, now);
        }
        if (!overdue_ && !streaming_ && now >= answer_due_) {
            return answer_overdue(now);
        }
        if (now < next_extend_) {
            return wait(forwarding_wake());
        }
        {
            state_ = state::extending;
            issued_at_ = now;
            action a;
            a.kind = action_kind::extend_lease;
            a.lease = policy_.lease;
            return a;
        }
    case state::retry_wait:
        if (now < wake_at_) {
            return wait(wake_at_);
        }
        if (now >= lease_deadline_) {
            return finish(exchange_outcome::record_failed);
        }
        state_ = state::completing;
        return complete_action();
    default:
        return unexpected("on_tick");
    }
}

std::string_view to_string(state s) noexcept {
    switch (s) {
    case state::idle:
        return "idle";
    case state::claiming:
        return "claiming";
    case state::waiting:
        return "waiting";
    case state::forwarding:
        return "forwarding";
    case state::extending:
        return "extending";
    case state::completing:
        return "completing";
    case state::releasing:
        return "releasing";
    case state::answering:
        return "answering";
    case state::retry_wait:
        return "retry_wait";
    case state::finished:
        return "finished";
    }
    return "?";
}

std::string_view to_string(action_kind k) noexcept {
    switch (k) {
    case action_kind::claim:
        return "claim";
    case action_kind::forward:
        return "forward";
    case action_kind::stream:
        return "stream";
    case action_kind::extend_lease:
        return "extend_lease";
    case action_kind::complete:
        return "complete";
    case action_kind::release:
        return "release";
    case action_kind::replay:
        return "replay";
    case action_kind::respond:
        return "respond";
    case action_kind::reject:
        return "reject";
    case action_kind::passthrough:
        return "passthrough";
    case action_kind::wait_until:
        return "wait_until";
    case action_kind::done:
        return "done";
    }
    return "?";
}

std::string_view to_string(idempotency_status s) noexcept {
    switch (s) {
    case idempotency_status::none:
        return "";
    case idempotency_status::stored:
        return "stored";
    case idempotency_status::unrecorded:
        return "unrecorded";
    }
    return "";
}

} // namespace onceproxy::core
