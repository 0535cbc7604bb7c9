#pragma once
// Integration fixtures: the real test upstream and the real onceproxy binary as child processes,
// each in its own temporary directory with its log, plus a YAML builder for onceproxy configs.
//
// Every start is bounded (10 s for the port file); a process that does not come up throws a
// std::runtime_error carrying its log, so a test FAILS with the reason. Destructors SIGKILL and
// reap whatever is still running.

#include "support/http_client.hpp"
#include "support/process.hpp"

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace onceproxy::test {

/// How long a fixture waits for a child to write its port file.
inline constexpr std::chrono::milliseconds start_timeout{10'000};

/// onceproxy_test_upstream on 127.0.0.1:<ephemeral>.
struct upstream_process {
    temp_dir dir; ///< declared first: outlives `proc`, which logs into it
    process proc;
    unsigned short port = 0;

    explicit upstream_process(int threads = 1);

    /// Executions recorded for Idempotency-Key `key` since the last reset (GET /__count).
    std::uint64_t count(const std::string& key) const;
    /// Every execution since the last reset, keyed or not (GET /__counts "total").
    std::uint64_t total() const;
    /// Clears the counts and the attempt log (POST /__reset).
    void reset() const;
    /// When each request with Idempotency-Key (or X-Test-Fault-Id) `key` arrived, in ms of the
    /// upstream's steady clock, in order, failed ones included (GET /__attempts).
    std::vector<double> attempts(const std::string& key) const;
};

/// Placeholder replacements applied to a config before it is written, e.g. {"{REDIS_URL}", url}.
using substitutions = std::vector<std::pair<std::string, std::string>>;

/// onceproxy with a given YAML config, started with --port-file.
struct proxy_process {
    temp_dir dir; ///< holds config.yaml, the port file and proxy.log
    process proc;
    unsigned short port = 0;        ///< the proxy listener
    unsigned short admin_port = 0;  ///< 0 when the config has no admin listener
    unsigned short tls_port = 0;    ///< the TLS port (config `tls`); 0 without TLS
    unsigned short egress_port = 0; ///< the egress listener (config `egress`); 0 without one
    std::string config_file;

    /// Writes `yaml` (a full config; "{UPSTREAM_PORT}" replaced by `upstream_port`, then each
    /// `extra` pair applied in order) and starts onceproxy. Waits for the port file (bounded by
    /// start_timeout); throws std::runtime_error with the log when the proxy exits or stays
    /// silent.
    /// `launcher`: words put before the binary, e.g. {"prlimit", "--nofile=128", "--"}.
    /// `args`: further command-line arguments of onceproxy, e.g. {"--watch-config", "1"}.
    explicit proxy_process(const std::string& yaml, unsigned short upstream_port = 0,
                           const substitutions& extra = {},
                           const std::vector<std::string>& launcher = {},
                           const std::vector<std::string>& args = {});

    /// SIGTERM, then waits up to `timeout`; returns the exit status (-1: still running).
    int terminate(std::chrono::milliseconds timeout = std::chrono::seconds(10));
    /// The proxy's stdout+stderr so far.
    std::string log() const { return proc.log(); }
    /// GET `path` on the admin listener (requires one).
    http_response admin(const std::string& path) const;
    /// The value of the /metrics line `series` (name and labels, e.g.
    /// `onceproxy_store_errors_total`), or -1 when there is no such line.
    long long metric(const std::string& series) const;
};

/// Runs the onceproxy binary with `args` (no fixture around it: --check-config, --version, the
/// CLI), waits for it (bounded: 20 s) and returns {exit status (-1: still running), its
/// stdout+stderr}.
std::pair<int, std::string> run_cli(const std::vector<std::string>& args);

/// The value of the line `series` (name and labels) in a /metrics exposition `text`, or -1 when
/// there is no such line.
long long metric_value(const std::string& text, const std::string& series);

/// Knobs of the config written by `proxy_config::yaml()`. Text fields are YAML fragments that are
/// pasted in as they are; indentation is added where stated.
struct proxy_config {
    unsigned short upstream_port = 0; ///< 0 keeps the {UPSTREAM_PORT} placeholder
    unsigned workers = 2;
    bool admin = true; ///< admin listener on 127.0.0.1:0
    /// Lines under `admin:` after `listen:` (indented for you), e.g. "keys_api: {...}".
    std::vector<std::string> admin_settings;
    bool access_log = false; ///< off by default: keeps the test output readable
    /// Lines under `upstreams: app:` (indented for you), e.g. "timeout: 300ms".
    std::vector<std::string> upstream_settings;
    /// Lines under `limits:` (indented for you), e.g. "max_request_bytes: 1KiB".
    std::vector<std::string> limits;
    /// Lines under `store:` (indented for you); empty = `type: memory`.
    std::vector<std::string> store;
    /// Routes (full `  - name: ...` YAML list items) placed before the catch-all.
    std::string routes;
    /// Adds `- name: everything-else, match: { prefix: / }, upstream: app` last.
    bool catch_all = true;
    /// false: no `routes:` at all (`routes` and `catch_all` are ignored), e.g. for a config with
    /// only `egress:` (in `top`) and `upstreams:`.
    bool ingress_routes = true;
    /// Extra top-level YAML (e.g. a `defaults:` block).
    std::string top;

    std::string yaml() const;
};

/// The common case: proxy_config{upstream_port} with `extra_routes` before the catch-all and
/// `extra_top` appended at top level.
std::string basic_config(unsigned short upstream_port, std::string extra_routes = "",
                         std::string extra_top = "");

/// The JSON body of the keyed payment the store suites send (one fingerprint for every retry).
inline constexpr const char* keyed_payment_json = R"({"amount":100,"currency":"EUR"})";

/// `Idempotency-Key: key` and a JSON content type, then `extra`.
header_list idempotency_headers(const std::string& key, header_list extra = {});

/// POST of keyed_payment_json to `path` with idempotency_headers(key, extra).
http_response post_keyed_payment(unsigned short port, const std::string& path,
                                 const std::string& key, header_list extra = {});

/// A guarded route (a YAML list item for proxy_config::routes) on path prefix `prefix` to
/// upstream `app`, `idempotency: { mode: required[, settings] }`.
std::string guarded_route(const std::string& name, const std::string& prefix,
                          const std::string& settings = "");

/// Waits (bounded) until the proxy's /readyz says the store answers: the port file is written
/// before the per-worker store connections are up. Throws with the proxy's log after `bound`.
void wait_store_answering(const proxy_process& p,
                          std::chrono::milliseconds bound = std::chrono::seconds(20));

} // namespace onceproxy::test
