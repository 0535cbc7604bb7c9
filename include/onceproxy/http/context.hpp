#pragma once
// The plain types a request travels with through the http module, shared by the server, the
// handler and the two paths below it (plain_relay, exchange_runner): the facts about its
// connection, the client side lent for its answer, and the environment of the config it runs
// on. Declared here, below all of them, so no part of the module includes one above it.

#include "onceproxy/config/config.hpp"
#include "onceproxy/core/record_cipher.hpp"
#include "onceproxy/http/task_tracker.hpp"
#include "onceproxy/metrics/registry.hpp"
#include "onceproxy/store/store.hpp"
#include "onceproxy/upstream/forwarder.hpp"
#include "onceproxy/wire/deadline_watch.hpp"
#include "onceproxy/wire/stream.hpp"

#include <boost/beast/core/flat_buffer.hpp>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace onceproxy::http {

using request = upstream::request;
using response = upstream::response;

/// Facts about the connection a request arrived on.
struct request_context {
    std::string client_ip;
    std::string_view protocol = "HTTP/1.1"; ///< as the client spoke: HTTP/1.1 or HTTP/2
    bool tls = false;
    /// TLS with a verified client certificate: its subject (RFC 2253); else empty.
    std::string client_cert_subject;
    std::chrono::steady_clock::time_point received{};
};

/// The client side of one session, lent for one request to whatever streams its answer.
struct client_side {
    wire::stream& sock;                ///< plain or TLS
    boost::beast::flat_buffer& buffer; ///< may hold the start of the next (pipelined) request
    wire::deadline_watch::slot& dl;
    std::string& scratch; ///< a reusable buffer for serialised heads
    const bool& draining; ///< the worker is draining: answer with Connection: close
    bool last = false;    ///< the connection's request cap is reached: Connection: close too
    /// The answer is given whole, never streamed from the exchange (an HTTP/2 stream: the
    /// connection is shared), however large, up to the route's max_response_bytes.
    bool whole_answer = false;
};

/// Everything the exchange runner needs for one config (one handler's), shared with the
/// exchanges that run on it: an exchange still completing in the background after a reload
/// keeps its config, forwarder and store alive.
struct exchange_env {
    std::shared_ptr<const config::config> cfg;
    std::shared_ptr<upstream::forwarder> fwd;
    std::shared_ptr<store::store> st;
    metrics::registry& reg;
    task_tracker& tracker; ///< the worker's: background completions hold a token
    std::vector<metrics::route_metrics*> route_series; ///< index = route index in `cfg`
    /// Encryption at rest of records, from cfg->store.encryption; null when off.
    std::shared_ptr<const core::record_cipher> cipher = nullptr;
};

} // namespace onceproxy::http
