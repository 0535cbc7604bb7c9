#pragma once
// The validated, immutable configuration (SPEC §4). Produced once by config::load_file();
// every other module receives std::shared_ptr<const config::config> and reads resolved values
// only: route idempotency blocks already carry the inherited defaults.

#include <array>
#include <bitset>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace onceproxy::config {

using duration = std::chrono::milliseconds;

/// host:port to bind or to connect to.
struct endpoint {
    std::string host = "127.0.0.1";
    std::uint16_t port = 0;

    friend bool operator==(const endpoint&, const endpoint&) = default;
};

/// Inbound TLS termination (README "TLS: inbound"). Files are PEM; the certificate file holds
/// the leaf first, then its chain.
struct tls_files {
    /// Set: a TLS listener at this address, next to the plain `listen`. Unset: `listen` itself
    /// serves TLS (and no plain listener exists).
    std::optional<endpoint> listen;
    std::string cert_file;
    std::string key_file;
    /// Set: clients are asked for a certificate, verified against these CAs (mTLS).
    std::string client_ca_file;
    bool require_client_cert = false; ///< no verified client certificate: handshake refused
    /// How often the files are checked for a change (inode, size, mtime); 0: on SIGHUP only.
    duration reload_interval{5'000};
    /// ALPN offers h2 before http/1.1 (http2.tls, copied here by the reader).
    bool http2 = true;

    friend bool operator==(const tls_files&, const tls_files&) = default;
};

/// http2: which listeners speak HTTP/2 and its per-connection limits (docs/http2.md).
struct http2_config {
    bool cleartext = true; ///< h2c with prior knowledge on the plain `listen`
    bool tls = true;       ///< ALPN h2 on the TLS listener
    std::uint32_t max_concurrent_streams = 100;

    friend bool operator==(const http2_config&, const http2_config&) = default;
};

/// /readyz also checks that the app behind the proxy answers (issue 9 item 7).
struct upstream_check_config {
    std::string upstream;           ///< upstream name
    std::size_t upstream_index = 0; ///< index into config::upstreams
    std::string http_path;          ///< empty: a TCP connect is the check; else GET it, 2xx/3xx
    duration interval{2'000};       ///< time between two checks
    duration timeout{1'000};        ///< bound on one check (connect, and the answer's head)

    friend bool operator==(const upstream_check_config&, const upstream_check_config&) = default;
};

struct readiness_config {
    /// false: /readyz does not depend on the store (guarded routes follow on_store_error while
    /// it is down). true: /readyz is 200 only while the store answers.
    bool require_store = false;
    std::optional<upstream_check_config> upstream; ///< unset: the app is not checked

    friend bool operator==(const readiness_config&, const readiness_config&) = default;
};

/// An address block of `trusted_proxies` (CIDR). IPv4 blocks are kept as IPv4-mapped IPv6
/// (::ffff:a.b.c.d/96+n), so one comparison covers both families.
struct cidr {
    std::array<std::uint8_t, 16> address{}; ///< network address, host bits zero
    unsigned prefix_length = 0;             ///< 0..128, over the 16 bytes

    friend bool operator==(const cidr&, const cidr&) = default;
};

/// admin.keys_api: key administration on the admin listener (GET/DELETE /admin/v1/keys).
struct keys_api_config {
    bool enabled = false;   ///< off: the endpoint answers 404
    std::string token_file; ///< a mounted Secret holding the bearer token; required when enabled
    std::string token;      ///< its content, read at load (one trailing line break dropped)

    friend bool operator==(const keys_api_config&, const keys_api_config&) = default;
};

/// Minimum length of admin.keys_api's token: 32 bytes (256 bits from a random source).
inline constexpr std::size_t min_admin_token_bytes = 32;

struct admin_config {
    std::optional<endpoint> listen; ///< unset: no admin listener
    /// Admin connections open at once; a connection above it is closed at once (the admin
    /// listener cannot take the descriptors the proxy listener needs).
    std::size_t max_connections = 16;
    duration header_timeout{5'000}; ///< a request must arrive in full within this
    duration idle_timeout{30'000};  ///< keep-alive admin connection left unused
    readiness_config readiness;
    keys_api_config keys_api;
};

struct limits_config {
    /// Upper bound of max_header_bytes: below the 64 KiB a single header field can take.
    static constexpr std::size_t max_header_bytes_cap = 60 * 1024;

    std::size_t max_request_bytes = 1024 * 1024;
    std::size_t max_header_bytes = 16 * 1024; ///< request header; also bounds trailers
    /// Client connections open at once, all workers together; above it a new connection gets
    /// 503 and is closed. Lowered at start-up to what the descriptor limit allows.
    std::size_t max_connections = 10'000;
    std::size_t max_response_bytes = 64 * 1024 * 1024; ///< upstream responses are buffered
    duration header_timeout{10'000};
    duration body_timeout{30'000}; ///< longest wait for the next bytes of a request body
    /// Once a request body has taken longer than body_timeout, it must have averaged at least
    /// this many bytes per second (slow-body defence); 0 would disable it (not configurable).
    std::size_t min_body_rate = 1024;
    /// A request body read whole (a guarded route's) must be complete within this time from
    /// its first awaited byte, however steadily it comes (408 request.timeout).
    duration max_body_time{60'000};
    /// Process-wide budget of buffered bodies, all workers together: request bodies read whole
    /// and upstream answers held for recording. A request body that does not fit gets
    /// 503 proxy.memory_limit; at least max_request_bytes (checked).
    std::size_t max_buffered_bytes = 64 * 1024 * 1024;
    /// Requests on one client connection; the last one is answered with Connection: close.
    std::size_t max_requests_per_connection = 10'000;
    duration idle_timeout{60'000};
    /// SIGTERM: /readyz fails at once, but the listeners keep accepting and serving for this
    /// long (load balancers and Kubernetes endpoints take seconds to stop sending traffic);
    /// then they close and the drain begins. 0: close at once. A second signal cuts it short.
    duration shutdown_delay{5'000};
    /// SIGTERM: bound on finishing in-flight requests once the listeners are closed; at least
    /// the longest upstream timeout (checked), so a request already sent upstream can end.
    duration drain_timeout{30'000};

    friend bool operator==(const limits_config&, const limits_config&) = default;
};

/// TLS to an https:// upstream (`upstreams.<name>.tls`). Verification is on by default.
struct upstream_tls_config {
    bool verify = true;           ///< check the certificate chain and the host name
    std::string ca_file;          ///< PEM CA bundle; empty: the system's trust store
    std::string server_name;      ///< SNI and the name checked; empty: the url's host
    std::string client_cert_file; ///< PEM chain presented to the upstream; empty: none
    std::string client_key_file;  ///< its private key (PEM)
    /// How often ca_file, client_cert_file and client_key_file are checked for a change (inode,
    /// size, mtime); a change that loads is used for new connections. 0: on SIGHUP only.
    duration reload_interval{5'000};

    /// The settings a connection is made with: reload_interval only says how often the files
    /// are looked at, so changing it alone keeps the pool (its connections and TLS session) and
    /// needs no restart.
    friend bool operator==(const upstream_tls_config& a, const upstream_tls_config& b) {
        return a.verify == b.verify && a.ca_file == b.ca_file && a.server_name == b.server_name &&
               a.client_cert_file == b.client_cert_file && a.client_key_file == b.client_key_file;
    }
};

/// How the proxy speaks to an upstream (docs/http2.md).
enum class upstream_protocol {
    http1, ///< HTTP/1.1, plain or TLS (https://)
    h2,    ///< HTTP/2 over TLS (https://, ALPN h2)
    h2c,   ///< HTTP/2 over plain TCP, prior knowledge (http://)
};

struct upstream_config {
    std::string name;
    std::string url;  ///< as written, e.g. http://127.0.0.1:3000
    bool tls = false; ///< https:// → TLS with verification and SNI
    std::string host;
    std::uint16_t port = 0;
    duration connect_timeout{1'000};
    duration timeout{30'000}; ///< whole-response deadline once the request is sent
    /// Guarded routes: an answer not in by `timeout` (the client gets its 504) is still read
    /// until this long after the request was sent, and recorded so a retry replays it
    /// (issue 26). 0 (or at most `timeout`): off. Unset in the file: 3 x timeout.
    duration late_answer_timeout{90'000};
    std::size_t max_connections = 256; ///< per worker, ordinary exchanges
    /// Per worker: connections lent for upgrades (WebSocket tunnels) and held by transfers
    /// that last over 1 s, counted apart from max_connections; 0 refuses every upgrade.
    std::size_t max_tunnels = 256;
    duration idle_timeout{60'000};    ///< pooled connection kept this long unused
    upstream_tls_config tls_settings; ///< used when `tls`
    upstream_protocol protocol = upstream_protocol::http1;

    friend bool operator==(const upstream_config&, const upstream_config&) = default;
};

enum class store_type {
    memory,   ///< embedded, one process only
    redis,    ///< shared by every replica
    postgres, ///< shared by every replica, in a PostgreSQL database (synchronous standbys)
};

enum class maxmemory_check {
    refuse, ///< refuse to start when Redis could evict live records (allkeys-*)
    warn,   ///< log and go on
};

/// `store.redis.sentinel`: the master is found through these sentinels instead of `url`. The
/// fields here are the sentinels' own; the data nodes use store.redis's credentials.
struct redis_sentinel_config {
    std::string master;          ///< the name the sentinels monitor the master under
    std::vector<endpoint> nodes; ///< host:port of each sentinel (at least one)
    std::string username;        ///< the sentinels' ACL user; empty: none
    std::string password;        ///< resolved: `password`, or the content of password_file
    std::string password_file;   ///< the file password was read from at start; empty: none
    bool tls = false;            ///< TLS to the sentinels (CA: store.redis.tls_ca_file)

    friend bool operator==(const redis_sentinel_config&, const redis_sentinel_config&) = default;
};

enum class redis_durability {
    async,      ///< a write is acknowledged by the master alone (Redis's replication is async)
    replicated, ///< after claim and complete, WAIT for `replicas` replicas within wait_timeout
};

/// store.redis.cluster: a Redis Cluster instead of one node (`url` is not used then).
struct redis_cluster_config {
    std::vector<std::string> nodes; ///< seed nodes, "host:port" ("[v6]:port"); empty: no cluster
    bool tls = false;               ///< TLS to every node (as rediss:// does for `url`)

    friend bool operator==(const redis_cluster_config&, const redis_cluster_config&) = default;
};

struct redis_config {
    std::string url = "redis://127.0.0.1:6379/0";
    std::optional<redis_sentinel_config> sentinel; ///< set: discover the master (url unused)
    redis_durability durability = redis_durability::async;
    std::size_t replicas = 1;     ///< durability replicated: replicas that must acknowledge
    duration wait_timeout{50};    ///< durability replicated: WAIT's bound (< command_timeout)
    redis_cluster_config cluster; ///< nodes set: Cluster mode (url unused)
    std::string key_prefix = "onceproxy:";
    duration connect_timeout{500};
    duration command_timeout{250};
    std::size_t connections_per_worker = 1;
    duration health_check_interval{5'000};
    maxmemory_check maxmemory_policy = maxmemory_check::refuse;
    std::string tls_ca_file; ///< rediss://: CA bundle; empty = system default
    /// Credentials as fields of their own (no percent-encoding); they win over the URL's.
    std::string username;      ///< ACL user; empty: the URL's user, else the default user
    std::string password;      ///< resolved: `password`, or the content of password_file
    std::string password_file; ///< the file password was read from at start; empty: none

    friend bool operator==(const redis_config&, const redis_config&) = default;
};

/// The name of a store type as written in the config.
constexpr const char* store_type_name(store_type t) noexcept {
    switch (t) {
    case store_type::memory:
        return "memory";
    case store_type::redis:
        return "redis";
    case store_type::postgres:
        return "postgres";
    }
    return "unknown";
}

/// store.postgres.migrate: what the proxy does with the schema at start.
enum class postgres_migrate {
    automatic, ///< `auto`: create or upgrade the table to this build's version (idempotent)
    check,     ///< only check the version; a missing or older schema refuses to start
};

/// store.postgres: a PostgreSQL database (or one that speaks its protocol) holds the records.
struct postgres_config {
    /// libpq URL: postgresql://user@host:port/db; several hosts (host1:p1,host2:p2) with
    /// ?target_session_attrs=read-write find the primary after a failover.
    std::string url = "postgresql://onceproxy@127.0.0.1:5432/onceproxy";
    std::string password;      ///< resolved: `password`, or the content of password_file
    std::string password_file; ///< the file password was read from at start; empty: none
    /// disable | allow | prefer | require | verify-ca | verify-full; empty: the URL's, else
    /// libpq's default (prefer).
    std::string sslmode;
    std::string ssl_root_cert;               ///< CA bundle for verify-ca / verify-full
    std::string table = "onceproxy_records"; ///< [schema.]table, at most one dot
    std::string key_prefix = "onceproxy:";   ///< starts every key this proxy writes
    std::size_t pool = 2;                    ///< connections per worker
    duration connect_timeout{2'000};         ///< one connection attempt, statements prepared
    duration statement_timeout{2'000};       ///< server side; the client waits 1 s more
    postgres_migrate migrate = postgres_migrate::automatic;
    duration sweep_interval{10'000}; ///< expired rows deleted in batches this often
    /// true: a read-only look-up answers replays before the claim (fewer commits, but a replay
    /// may show a record not yet on a synchronous standby); false: every claim is one write.
    bool lookup_before_claim = false;

    friend bool operator==(const postgres_config&, const postgres_config&) = default;
};

struct memory_store_config {
    std::size_t max_bytes = 256 * 1024 * 1024; ///< records + leases; full → claims refused
    /// What one holder (a principal, or the client address of an anonymous request) may hold;
    /// over it, that holder's oldest non-2xx records go first, then its claims are refused.
    /// Default (when not set): max_bytes / 16. Never above max_bytes.
    std::size_t max_bytes_per_holder = 256 * 1024 * 1024 / 16;

    friend bool operator==(const memory_store_config&, const memory_store_config&) = default;
};

/// One key of store.encryption: its id (stored in every record it seals) and its 32 bytes,
/// read from `file` at load (and again at each reload).
struct encryption_key {
    std::string id;
    std::string file;
    std::string bytes;

    friend bool operator==(const encryption_key&, const encryption_key&) = default;
};

/// Encryption at rest of records (AES-256-GCM). No keys: records are stored in plaintext.
struct encryption_config {
    std::vector<encryption_key> keys; ///< the first encrypts, every one decrypts

    friend bool operator==(const encryption_config&, const encryption_config&) = default;
};

struct store_config {
    store_type type = store_type::memory;
    memory_store_config memory;
    redis_config redis;
    postgres_config postgres;
    encryption_config encryption;

    friend bool operator==(const store_config&, const store_config&) = default;
};

enum class idempotency_mode {
    required, ///< a guarded request without a key → 400 idempotency.missing_key
    optional, ///< a guarded request without a key → plain proxying
    off,      ///< the route is plain proxying
    /// claims, fingerprints and records as `required` does, but never blocks, rejects or
    /// replays: every request goes to the upstream, and what enforcement would have done is
    /// counted and logged (issue 13)
    observe,
};

/// The name of a mode as written in the config.
constexpr const char* idempotency_mode_name(idempotency_mode m) noexcept {
    switch (m) {
    case idempotency_mode::required:
        return "required";
    case idempotency_mode::optional:
        return "optional";
    case idempotency_mode::off:
        return "off";
    case idempotency_mode::observe:
        return "observe";
    }
    return "unknown";
}

enum class key_syntax {
    lenient, ///< sf-string or bare token; "abc" and abc are the same key
    strict,  ///< RFC 9651 sf-string only
};

enum class concurrent_policy {
    conflict, ///< 409 idempotency.in_progress + Retry-After
    wait,     ///< hold the duplicate until the first completes (bounded by wait_timeout)
};

enum class uncertain_policy {
    hold,    ///< keep the lease until it expires
    release, ///< free the key at once
    fail,    ///< record 502 upstream.outcome_unknown; the key is consumed
};

/// Who a key belongs to, besides the scope headers (SPEC §3.3).
enum class principal_source {
    headers,     ///< the scope headers alone
    client_cert, ///< also the subject of the verified TLS client certificate (mTLS)
};

enum class store_error_policy {
    fail_closed, ///< 503 idempotency.store_unavailable
    fail_open,   ///< forward unprotected, logged and counted
};

/// A set of HTTP status codes (100..599), from entries like 2xx, 404.
using status_set = std::bitset<600>;

/// Built-in `record` set: 2xx, 3xx, 4xx.
inline status_set default_record_statuses() {
    status_set s;
    for (std::size_t code = 200; code <= 499; ++code) {
        s.set(code);
    }
    return s;
}

/// Built-in `release` set: 408, 425, 429, 5xx.
inline status_set default_release_statuses() {
    status_set s;
    s.set(408);
    s.set(425);
    s.set(429);
    for (std::size_t code = 500; code <= 599; ++code) {
        s.set(code);
    }
    return s;
}

/// The gRPC status codes by number, as `grpc.record` and `grpc.release` name them.
inline constexpr std::array<const char*, 17> grpc_status_names{
    "OK",        "CANCELLED",      "UNKNOWN",           "INVALID_ARGUMENT",   "DEADLINE_EXCEEDED",
    "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
    "ABORTED",   "OUT_OF_RANGE",   "UNIMPLEMENTED",     "INTERNAL",           "UNAVAILABLE",
    "DATA_LOSS", "UNAUTHENTICATED"};

/// A set of gRPC status codes (0 OK .. 16 UNAUTHENTICATED), from names or numbers.
using grpc_status_set = std::bitset<17>;

/// Built-in `grpc.record` set: OK and the definitive errors (docs/grpc.md).
inline grpc_status_set default_grpc_record_statuses() {
    grpc_status_set s;
    for (const std::size_t code : {0, 3, 5, 6, 7, 9, 11, 12, 16}) {
        s.set(code);
    }
    return s;
}

/// Built-in `grpc.release` set: UNAVAILABLE, RESOURCE_EXHAUSTED, ABORTED (nothing was done, or
/// the server asks for a retry). Every other code is an uncertain outcome.
inline grpc_status_set default_grpc_release_statuses() {
    grpc_status_set s;
    for (const std::size_t code : {8, 10, 14}) {
        s.set(code);
    }
    return s;
}

/// Where the idempotency key comes from.
struct key_config {
    std::string header = "Idempotency-Key"; ///< header name (also a natural-key header)
    std::string json_pointer;               ///< non-empty: natural key from the JSON body
    std::size_t max_length = 255;
    key_syntax syntax = key_syntax::lenient;
    bool forward = true; ///< forward the key header to the upstream unchanged

    friend bool operator==(const key_config&, const key_config&) = default;
};

/// Fully resolved idempotency settings of one route (defaults merged in). The member initialisers
/// below are THE built-in defaults: conf/example.yaml documents the same values, and a unit test
/// (load_test.cpp) fails when the two disagree.
struct idempotency_config {
    idempotency_mode mode = idempotency_mode::off;
    std::vector<std::string> methods{"POST", "PATCH"}; ///< guarded methods (upper case)
    key_config key;
    // Cookie too: an app that authenticates with a session cookie must not put every user in one
    // scope, where user B's retry of A's key and body would replay A's answer (and its cookie).
    std::vector<std::string> scope_headers{"Authorization", "Cookie"};
    principal_source principal = principal_source::headers;
    std::vector<std::string> fingerprint_headers{"Content-Type"};
    bool json_canonical = true;
    duration ttl{24LL * 3600 * 1000};
    duration lease{30'000};
    concurrent_policy concurrent = concurrent_policy::conflict;
    duration wait_timeout{10'000};
    unsigned mismatch_status = 422; ///< 422 or 409
    status_set record = default_record_statuses();
    status_set release = default_release_statuses(); ///< wins over record
    /// gRPC calls: their grpc-status decides instead of the HTTP status; a code in neither set
    /// is an uncertain outcome (on_upstream_uncertain). Release wins over record.
    grpc_status_set grpc_record = default_grpc_record_statuses();
    grpc_status_set grpc_release = default_grpc_release_statuses();
    uncertain_policy on_upstream_uncertain = uncertain_policy::hold;
    store_error_policy on_store_error = store_error_policy::fail_closed;
    std::size_t max_record_bytes = 1024 * 1024;
    bool stripe_compat = false;                 ///< also send Idempotent-Replayed: true
    std::vector<std::string> exclude_headers{}; ///< extra response headers never recorded
    /// Set-Cookie is left out of the record (the first caller still gets it) unless this is
    /// true: a replay handing out a session cookie is a session handed to whoever sends the key.
    bool record_set_cookie = false;

    friend bool operator==(const idempotency_config&, const idempotency_config&) = default;
};

enum class path_match_kind {
    exact,   ///< path == value
    prefix,  ///< path starts with value
    pattern, ///< template with {param} segments, each matching one non-empty segment
};

/// How a route reads `;params` in a path segment (`/pay;jsessionid=1`, also spelled `%3B`).
/// Tomcat, Jetty and Spring strip them before routing; Express, Rails and Go keep them.
enum class path_params_match {
    guard,   ///< the route matches the path with every segment's `;params` removed
    refuse,  ///< as `guard`, and a matching path with `;params` is refused with 400
    literal, ///< `;` is an ordinary character (the app keeps parameters as part of the path)
};

/// Whether `/pay/` is the route `/pay` (Spring before 6, Express and Rails by default say yes).
enum class trailing_slash_match {
    ignore, ///< one trailing '/' of the path (and of the route) is not compared
    exact,  ///< `/pay/` is not `/pay`
};

/// Whether `/PAY` is the route `/pay` (IIS, ASP.NET and Express by default say yes).
enum class case_match {
    insensitive, ///< ASCII letters compare case-insensitively
    exact,       ///< byte for byte
};

struct route_match {
    std::vector<std::string> methods; ///< empty: any method
    path_match_kind kind = path_match_kind::prefix;
    std::string path; ///< the exact path, prefix or template as written
    path_params_match path_params = path_params_match::guard;
    trailing_slash_match trailing_slash = trailing_slash_match::ignore;
    case_match letter_case = case_match::insensitive; ///< `case:` in YAML
    /// `grpc: "pkg.Service/Method"` or `"pkg.Service/*"`: the route matches gRPC calls only
    /// (content-type application/grpc[+...]), the path being /pkg.Service/Method (exact) or
    /// /pkg.Service/ (prefix), byte for byte. Empty: an HTTP route.
    std::string grpc;
    /// gRPC methods of the service that stream (`streaming:`): forwarded unguarded as they come.
    std::vector<std::string> streaming;
};

/// Body limits of one route, resolved (the global `limits:` values unless the route sets its
/// own). nullopt: no limit, allowed only where the route never buffers (no idempotency).
struct route_limits {
    std::optional<std::size_t> max_request_bytes;
    std::optional<std::size_t> max_response_bytes;
    /// Upgrades (tunnels) open on this route at once, all workers together; unset: only the
    /// upstream's max_tunnels bounds them.
    std::optional<std::size_t> max_tunnels;
    bool operator==(const route_limits&) const = default;
};

/// How an egress route retries (docs/egress.md). Resolved: every field has its value.
struct retry_config {
    unsigned attempts = 3;     ///< sends in all, the first included (1: never retried)
    duration deadline{10'000}; ///< all attempts and waits of one request
    duration base_delay{100};  ///< full jitter: uniform in [0, min(max_delay, base * 2^(n-1))]
    duration max_delay{2'000}; ///< the cap of one wait
    duration max_retry_after{30'000}; ///< a longer Retry-After is not waited for: no retry
    status_set statuses = default_retry_statuses(); ///< answers retried
    bool on_connect_failure = true;                 ///< nothing was sent
    bool on_reset = true;                     ///< the connection failed before any answer byte
    bool on_timeout = false;                  ///< no answer within the upstream's timeout
    std::size_t max_body_bytes = 1024 * 1024; ///< larger request bodies are sent once
    bool generate_key = true; ///< a non-idempotent request without a key gets a UUIDv7
    std::string key_header = "Idempotency-Key";

    friend bool operator==(const retry_config&, const retry_config&) = default;

    /// 408, 425, 429, 502, 503, 504.
    static status_set default_retry_statuses() {
        status_set s;
        for (unsigned c : {408U, 425U, 429U, 502U, 503U, 504U}) {
            s.set(c);
        }
        return s;
    }
};

struct route_config {
    std::string name;
    route_match match;
    route_limits limits;
    std::string upstream;           ///< upstream name
    std::size_t upstream_index = 0; ///< index into config::upstreams
    idempotency_config idempotency;
    /// Set on egress routes only (egress.routes): they retry instead of guarding.
    std::optional<retry_config> retry;
};

/// Retries at most `ratio` of the requests plus `min_per_second` per second, over `window`,
/// per upstream (Finagle's RetryBudget).
struct retry_budget_config {
    double ratio = 0.2;
    double min_per_second = 10;
    duration window{10'000};
    friend bool operator==(const retry_budget_config&, const retry_budget_config&) = default;
};

/// Per upstream: `failures` consecutive failed attempts open it for `cool_down`, then `probes`
/// attempts at once test the upstream (half-open).
struct breaker_config {
    bool enabled = true;
    unsigned failures = 5;
    duration cool_down{10'000};
    unsigned probes = 1;
    friend bool operator==(const breaker_config&, const breaker_config&) = default;
};

/// The outbound side: the app calls `listen`, onceproxy retries for it (docs/egress.md).
struct egress_config {
    endpoint listen{"127.0.0.1", 9000};
    retry_budget_config budget;
    breaker_config breaker;
    std::vector<route_config> routes; ///< each with `retry` set and idempotency off
};

enum class log_level {
    debug, ///< everything, including detail meant for debugging the proxy
    info,  ///< lifecycle events (listening, signals, reloads, store connections) and worse
    warn,  ///< degraded operation and worse
    error, ///< failures only
};

/// The process log (JSON lines on stderr); requests have the access log instead.
struct log_config {
    log_level level = log_level::info; ///< lines below it are dropped

    friend bool operator==(const log_config&, const log_config&) = default;
};

struct config {
    std::string source_file;
    std::string source_text; ///< the file as read (before ${VAR} substitution): its digest names it
    endpoint listen{"0.0.0.0", 8080};
    std::optional<tls_files> tls; ///< inbound TLS termination
    http2_config http2;
    admin_config admin;
    unsigned workers = 0; ///< resolved: `auto` → hardware concurrency
    limits_config limits;
    std::vector<upstream_config> upstreams;
    store_config store;
    std::vector<route_config> routes;
    std::optional<egress_config> egress; ///< unset: no egress listener
    bool access_log = true;              ///< one JSON line per request on stdout
    log_config log;
    /// Peers whose X-Forwarded-* and Forwarded headers are extended; any other peer's are
    /// replaced (an untrusted client cannot forge an earlier hop). Empty: trust no one.
    std::vector<cidr> trusted_proxies;
};

/// The config the egress listener serves: `cfg` with `listen` = egress.listen, no TLS, and the
/// egress routes as its routes (the upstreams, limits and http2 settings as they are).
/// Precondition: cfg.egress is set.
std::shared_ptr<const config> egress_view(const config& cfg);

} // namespace onceproxy::config
