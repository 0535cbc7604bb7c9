#include "app/admin.hpp"

#include "app/key_admin.hpp"
#include "app/status.hpp"
#include "http/auth_throttle.hpp"
#include "onceproxy/asio/use_tuple.hpp"
#include "onceproxy/config/upstream_tls.hpp"
#include "onceproxy/core/fingerprint.hpp"
#include "onceproxy/core/problem.hpp"
#include "onceproxy/http/loop_guard.hpp"
#include "onceproxy/http/problem.hpp"
#include "onceproxy/wire/message_parser.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/ssl/stream.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/string.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/empty_body.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/write.hpp>
#include <boost/url/parse.hpp>

#include <openssl/crypto.h>
#include <openssl/ssl.h>

#include <array>
#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace onceproxy::app {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace bhttp = beast::http;
using tcp = net::ip::tcp;
using core::problem_code;

namespace {
using admin_response = bhttp::response<bhttp::string_body>;

constexpr std::string_view keys_path = "/admin/v1/keys";

/// Wrong tokens one client address may send at once, then one per second (issue 26: 500 wrong
/// tokens took 0.02 s). Addresses told apart: beyond them, new ones share one budget.
constexpr unsigned failed_auth_burst = 10;
constexpr std::chrono::seconds failed_auth_refill{1};
constexpr std::size_t failed_auth_addresses = 4096;

/// The bearer token against the configured one in constant time (digests of equal length, so
/// neither the content nor the length of the token leaks through timing).
bool token_matches(std::string_view given, const std::string& expected) {
    const std::string a = core::sha256(given);
    const std::string b = core::sha256(expected);
    return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

/// The token of an `Authorization: Bearer TOKEN` header; nullopt when there is none.
std::optional<std::string_view> bearer_token(const bhttp::request<bhttp::string_body>& req) {
    const auto it = req.find(bhttp::field::authorization);
    if (it == req.end()) {
        return std::nullopt;
    }
    std::string_view v = it->value();
    constexpr std::string_view scheme = "bearer ";
    if (v.size() <= scheme.size() || !beast::iequals(v.substr(0, scheme.size()), scheme)) {
        return std::nullopt;
    }
    v.remove_prefix(scheme.size());
    while (!v.empty() && v.front() == ' ') {
        v.remove_prefix(1);
    }
    return v;
}
} // namespace

struct admin_server::impl : std::enable_shared_from_this<impl> {
    impl(net::io_context& c, std::vector<net::any_io_executor> w,
         std::shared_ptr<const config::config> cf, metrics::registry& r,
         std::shared_ptr<store::store> s)
        : ioc(c), workers(std::move(w)), probe_ex(workers.front()), cfg(std::move(cf)), reg(r),
          st(std::move(s)), acceptor(c), store_probe_timer(probe_ex), upstream_probe_timer(c),
          history_timer(c), serving(cfg) {}

    net::io_context& ioc;
    std::vector<net::any_io_executor> workers;
    net::any_io_executor probe_ex; ///< where the probe loop itself runs
    std::shared_ptr<const config::config> cfg;
    metrics::registry& reg;
    std::shared_ptr<store::store> st;
    tcp::acceptor acceptor;
    // Written by the probe on a worker, read by the admin loop.
    std::atomic<bool> store_answered{false}; ///< the store has answered at least once
    std::atomic<bool> store_ok{false};       ///< the last probe succeeded
    std::atomic<bool> stopped{false};
    /// The probes' sleeps between checks, on the probes' own executors: stop() cancels them.
    net::steady_timer store_probe_timer;
    net::steady_timer upstream_probe_timer;
    std::atomic<bool> draining{false}; ///< SIGTERM received: /readyz fails from now on
    // Written by the upstream check on the admin loop.
    std::atomic<bool> upstream_checked{false}; ///< at least one check finished
    std::atomic<bool> upstream_ok{false};      ///< the last check succeeded
    std::string upstream_detail;               ///< admin loop only: what the last check saw
    /// Admin loop only: the TLS context of an https:// upstream's check, and what it was built
    /// from (its settings, the stamps of their files).
    std::unique_ptr<net::ssl::context> check_tls;
    config::upstream_tls_config check_tls_settings;
    std::array<config::file_stamp, 3> check_tls_stamps{};
    /// Admin loop only: the status page's samples (one a minute, the last hour), and the config
    /// now serving (a reload replaces it; the admin settings themselves come from `cfg`).
    metrics::history past{61};
    net::steady_timer history_timer;
    std::shared_ptr<const config::config> serving;
    const std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();

    /// One check of admin.readiness.upstream: connect (and GET http_path, 2xx/3xx), bounded by
    /// its timeout. Returns an empty string on success, else what failed.
    net::awaitable<std::string> check_upstream_once(const config::upstream_check_config& check) {
        const auto& up = cfg->upstreams[check.upstream_index];
        beast::tcp_stream stream(ioc);
        stream.expires_after(check.timeout);
        tcp::resolver resolver(ioc);
        auto [rec, results] =
            co_await resolver.async_resolve(up.host, std::to_string(up.port), use_tuple);
        if (rec) {
            co_return "cannot resolve " + up.host + ": " + rec.message();
        }
        auto [cec, ep] = co_await stream.async_connect(results, use_tuple);
        (void)ep;
        if (cec) {
            co_return "connect to " + up.host + ":" + std::to_string(up.port) + ": " +
                cec.message();
        }
        if (check.http_path.empty()) {
            co_return std::string{};
        }
        if (!up.tls) {
            co_return co_await get_status(stream, check, up);
        }
        // https://: the handshake the forwarder makes (the upstream's tls settings, SNI, chain
        // and name checks), with a context rebuilt when its files change, so a rotation is
        // checked too (and the system trust store is not reloaded at every check).
        const auto stamps = config::upstream_tls_stamps(up.tls_settings);
        if (!check_tls || stamps != check_tls_stamps || !(up.tls_settings == check_tls_settings)) {
            auto built = config::make_upstream_tls_context(up.tls_settings);
            if (!built.ctx) {
                check_tls.reset();
                co_return "TLS settings: " + built.error;
            }
            check_tls = std::make_unique<net::ssl::context>(built.ctx.release()); // owns it
            check_tls_stamps = stamps;
            check_tls_settings = up.tls_settings;
        }
        net::ssl::stream<beast::tcp_stream&> tls(stream, *check_tls);
        if (!config::set_upstream_peer_name(tls.native_handle(), up)) {
            co_return "cannot check the certificate against '" + config::upstream_peer_name(up) +
                "'";
        }
        auto [hec] = co_await tls.async_handshake(net::ssl::stream_base::client, use_tuple);
        if (hec) {
            std::string reason = "TLS handshake: " + hec.message();
            if (const long verify = SSL_get_verify_result(tls.native_handle());
                verify != X509_V_OK) {
                reason += std::string(": ") + X509_verify_cert_error_string(verify);
            }
            co_return reason;
        }
        co_return co_await get_status(tls, check, up);
    }

    /// GET http_path on `stream` (connected; TLS done): empty when the status is 2xx or 3xx,
    /// else what failed.
    template <class Stream>
    net::awaitable<std::string> get_status(Stream& stream,
                                           const config::upstream_check_config& check,
                                           const config::upstream_config& up) {
        bhttp::request<bhttp::empty_body> req{bhttp::verb::get, check.http_path, 11};
        const bool v6 = up.host.find(':') != std::string::npos;
        req.set(bhttp::field::host,
                (v6 ? "[" + up.host + "]" : up.host) + ":" + std::to_string(up.port));
        req.set(bhttp::field::user_agent, "onceproxy-readiness");
        req.keep_alive(false);
        auto [wec, wn] = co_await bhttp::async_write(stream, req, use_tuple);
        (void)wn;
        if (wec) {
            co_return "GET " + check.http_path + ": " + wec.message();
        }
        beast::flat_buffer buffer;
        bhttp::response_parser<bhttp::string_body> parser;
        parser.header_limit(16 * 1024);
        parser.body_limit(64 * 1024);
        auto [rec2, rn] = co_await bhttp::async_read_header(stream, buffer, parser, use_tuple);
        (void)rn;
        if (rec2) {
            co_return "GET " + check.http_path + ": " + rec2.message();
        }
        const auto status = parser.get().result_int();
        if (status < 200 || status > 399) {
            co_return "GET " + check.http_path + ": status " + std::to_string(status);
        }
        co_return std::string{};
    }

    /// Runs on the admin loop: checks the app every interval until stopped.
    net::awaitable<void> probe_upstream() {
        auto self = shared_from_this();
        const auto& check = *cfg->admin.readiness.upstream;
        while (!stopped) {
            auto failure = co_await check_upstream_once(check);
            upstream_ok = failure.empty();
            upstream_detail = std::move(failure);
            upstream_checked = true;
            if (stopped) {
                break;
            }
            upstream_probe_timer.expires_after(check.interval);
            co_await upstream_probe_timer.async_wait(use_tuple);
        }
    }

    net::awaitable<void> probe_store() {
        auto self = shared_from_this();
        // The pings run on every worker: no worker loop runs out of work while the probe runs.
        // A ping handed to a loop that had already ended would never complete, and this
        // worker would wait for it forever, holding up the exit.
        std::vector<net::executor_work_guard<net::any_io_executor>> keep;
        for (const auto& ex : workers) {
            keep.push_back(net::make_work_guard(ex));
        }
        while (!stopped) {
            if (!st) {
                store_answered = true;
                store_ok = true;
            } else {
                bool all = true;
                for (const auto& ex : workers) {
                    // Run the ping on that worker: its store connection lives there.
                    auto r = co_await net::co_spawn(ex, st->async_ping(), net::use_awaitable);
                    all = all && r.has_value();
                }
                store_ok = all;
                if (store_ok) {
                    store_answered = true;
                }
            }
            if (stopped) {
                break;
            }
            // A sleeping probe does not hold up the drain of its worker: stop() cancels the
            // sleep (after `stopped` is set, so the check above and the wait cannot miss it).
            store_probe_timer.expires_after(store_answered ? std::chrono::milliseconds(2000)
                                                           : std::chrono::milliseconds(200));
            co_await store_probe_timer.async_wait(use_tuple);
        }
    }

    /// Runs on the admin loop: a sample for the status page now, then every minute.
    net::awaitable<void> sample_history() {
        auto self = shared_from_this();
        while (!stopped) {
            past.add(metrics::sample_of(reg, std::chrono::steady_clock::now()));
            history_timer.expires_after(std::chrono::minutes(1));
            co_await history_timer.async_wait(use_tuple);
        }
    }

    std::atomic<std::size_t> next_worker{0}; ///< key administration: round robin
    /// Admin loop only: wrong tokens by client address.
    http::auth_throttle failed_auth{failed_auth_burst, failed_auth_refill, failed_auth_addresses};
    std::size_t open_sessions = 0; ///< admin loop only: connections being served

    /// GET/DELETE /admin/v1/keys (README "Key administration"); 404 unless keys_api.enabled.
    /// `peer`: the client's address (wrong tokens are throttled by it).
    net::awaitable<admin_response> answer_keys(const bhttp::request<bhttp::string_body>& req,
                                               const std::string& peer) {
        const unsigned v = req.version();
        const auto& api = cfg->admin.keys_api;
        if (!api.enabled) {
            admin_response res{bhttp::status::not_found, v};
            res.set(bhttp::field::content_type, "text/plain; charset=utf-8");
            res.body() = "not found\n";
            co_return res;
        }
        const auto token = bearer_token(req);
        const auto now = http::auth_throttle::clock::now();
        if (const auto wait = failed_auth.retry_after(peer, now); wait.count() > 0) {
            // Refused before the token is compared: a right guess now would not be told apart.
            reg.counter(metrics::family::admin_auth_throttled).inc();
            const auto seconds = std::chrono::ceil<std::chrono::seconds>(wait).count();
            co_return http::make_problem(
                problem_code::admin_too_many_attempts,
                {.retry_after_s = static_cast<unsigned>(std::max<long long>(1, seconds)),
                 .http_version = v});
        }
        const bool authorized = token && token_matches(*token, api.token);
        if (token && !authorized) {
            failed_auth.note_failure(peer, now);
        }
        if (!authorized) {
            auto res =
                token ? http::make_problem(problem_code::admin_unauthorized,
                                           "the bearer token is not the one in "
                                           "admin.keys_api.token_file",
                                           {.http_version = v})
                      : http::make_problem(problem_code::admin_unauthorized, {.http_version = v});
            res.set(bhttp::field::www_authenticate, "Bearer realm=\"onceproxy-admin\"");
            co_return res;
        }
        const bool inspect = req.method() == bhttp::verb::get;
        if (!inspect && req.method() != bhttp::verb::delete_) {
            auto res =
                http::make_problem(problem_code::admin_method_not_allowed, {.http_version = v});
            res.set(bhttp::field::allow, "GET, DELETE");
            co_return res;
        }
        const auto bad = [v](std::string_view detail) {
            return http::make_problem(problem_code::admin_bad_request, detail, {.http_version = v});
        };
        auto url = boost::urls::parse_origin_form(req.target());
        if (!url) {
            co_return bad("the request target is not a valid origin-form URL");
        }
        key_address address;
        bool force = false;
        for (const auto& p : url->params()) {
            if (p.key == "route") {
                address.route = p.value;
            } else if (p.key == "key") {
                address.key = p.value;
            } else if (p.key == "principal") {
                address.principal.push_back(p.value);
            } else if (p.key == "force") {
                if (p.value == "true" || p.value == "1") {
                    force = true;
                } else if (p.value != "false" && p.value != "0") {
                    co_return bad("force is true or false");
                }
            } else {
                co_return bad("unknown parameter '" + p.key +
                              "' (route, key, principal and, for DELETE, force)");
            }
        }
        auto resolved = resolve_key(*cfg, address);
        if (auto* why = std::get_if<std::string>(&resolved)) {
            co_return bad(*why);
        }
        const auto& k = std::get<resolved_key>(resolved);
        const auto store_down = [v](const boost::system::error_code& ec) {
            return http::make_problem(problem_code::admin_store_unavailable,
                                      "the store did not answer: " + ec.message(),
                                      {.http_version = v});
        };
        if (!st) {
            co_return store_down(
                boost::system::errc::make_error_code(boost::system::errc::not_supported));
        }
        // On a worker: the Redis store keeps its connections there.
        auto ex = workers[next_worker.fetch_add(1, std::memory_order_relaxed) % workers.size()];
        admin_response res{bhttp::status::ok, v};
        res.set(bhttp::field::content_type, "application/json");
        res.set(bhttp::field::cache_control, "no-store");
        if (inspect) {
            auto r = co_await net::co_spawn(ex, st->async_inspect(k.store_key), net::use_awaitable);
            if (!r) {
                co_return store_down(r.error());
            }
            res.body() =
                describe_key(k, *r, std::chrono::system_clock::now(), cfg->store.encryption);
            co_return res;
        }
        auto r =
            co_await net::co_spawn(ex, st->async_purge(k.store_key, force), net::use_awaitable);
        if (!r) {
            co_return store_down(r.error());
        }
        note_purge(k, *r, "admin_api", &reg);
        if (*r == store::purge_status::in_flight) {
            co_return http::make_problem(problem_code::admin_key_in_flight, {.http_version = v});
        }
        res.body() = describe_purge(k, *r, force);
        co_return res;
    }

    bhttp::response<bhttp::string_body> answer(const bhttp::request<bhttp::string_body>& req) {
        bhttp::response<bhttp::string_body> res{bhttp::status::ok, req.version()};
        res.set(bhttp::field::content_type, "text/plain; charset=utf-8");
        const auto target = req.target();
        const auto path = target.substr(0, target.find('?'));
        if (path == "/") {
            // The status page: inline script and style only, and it reads nothing but the
            // status JSON of this listener.
            res.set(bhttp::field::content_type, "text/html; charset=utf-8");
            res.set("Content-Security-Policy",
                    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
                    "connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; "
                    "frame-ancestors 'none'");
            res.set("X-Content-Type-Options", "nosniff");
            res.set("Referrer-Policy", "no-referrer");
            res.set(bhttp::field::cache_control, "no-store");
            res.body() = status_page_html();
        } else if (path == "/admin/v1/status") {
            res.set(bhttp::field::content_type, "application/json");
            res.set(bhttp::field::cache_control, "no-store");
            res.set("X-Content-Type-Options", "nosniff");
            res.body() = status_json({.cfg = *serving,
                                      .reg = reg,
                                      .past = past,
                                      .store_answered = store_answered,
                                      .store_answering = store_ok,
                                      .draining = draining,
                                      .started = started});
        } else if (path == "/metrics") {
            res.set(bhttp::field::content_type, "text/plain; version=0.0.4; charset=utf-8");
            res.body() = reg.render();
        } else if (path == "/healthz") {
            res.body() = "ok\n";
        } else if (path == "/readyz") {
            // The store counts only with require_store: a store outage must not pull the pod
            // out of its Service and take the plain routes down with it (SPEC §6, issue 9).
            const bool require = cfg->admin.readiness.require_store;
            const bool store_ready = !require || store_ok;
            const auto& check = cfg->admin.readiness.upstream;
            const bool upstream_ready = !check || upstream_ok;
            const bool shutting_down = draining;
            const bool ready = store_ready && upstream_ready && !shutting_down;
            res.result(ready ? bhttp::status::ok : bhttp::status::service_unavailable);
            std::string body = shutting_down ? "draining: shutting down (SIGTERM)\n" : "";
            body += "config: loaded\nlisteners: up\nstore: ";
            body += store_ok ? "answering"
                             : (store_answered ? "not answering (was up)" : "not answered yet");
            body += require ? " (required)\n" : " (not required)\n";
            if (check) {
                body += "upstream " + check->upstream + ": ";
                if (!upstream_checked) {
                    body += "not checked yet";
                } else if (upstream_ok) {
                    body += check->http_path.empty() ? "accepts connections"
                                                     : "answers " + check->http_path;
                } else {
                    body += "not answering (" + upstream_detail + ")";
                }
                body += "\n";
            }
            body += ready ? "ready\n" : "not ready\n";
            res.body() = std::move(body);
        } else {
            res.result(bhttp::status::not_found);
            res.body() = "not found\n";
        }
        res.prepare_payload();
        res.keep_alive(req.keep_alive());
        return res;
    }

    /// One of open_sessions, taken at accept and given back when its session ends (admin loop
    /// only). It keeps the server alive, so a session frame destroyed late still gives it back.
    class session_slot {
    public:
        explicit session_slot(std::shared_ptr<impl> owner) noexcept : owner_(std::move(owner)) {
            ++owner_->open_sessions;
        }
        session_slot(session_slot&& o) noexcept = default;
        session_slot& operator=(session_slot&&) = delete;
        ~session_slot() {
            if (owner_) {
                --owner_->open_sessions;
            }
        }

    private:
        std::shared_ptr<impl> owner_;
    };

    net::awaitable<void> session(tcp::socket sock, [[maybe_unused]] session_slot slot) {
        constexpr std::size_t header_limit = 16 * 1024;
        boost::system::error_code pec;
        const std::string peer = sock.remote_endpoint(pec).address().to_string();
        beast::tcp_stream stream(std::move(sock));
        // The same bounded parser and buffer as the proxy listener: a hostile request on the
        // admin port is an error answer, never an exception out of the event loop.
        beast::flat_buffer buffer(wire::read_buffer_limit(header_limit));
        for (bool first = true;; first = false) {
            if (!first && buffer.size() == 0) {
                // Keep-alive: the next request may start within admin.idle_timeout.
                stream.expires_after(cfg->admin.idle_timeout);
                auto [iec, in] = co_await stream.async_read_some(buffer.prepare(1024), use_tuple);
                if (iec) {
                    co_return;
                }
                buffer.commit(in);
            }
            wire::request_parser parser;
            parser.header_limit(header_limit);
            parser.trailer_limit(header_limit);
            parser.body_limit(64 * 1024);
            // A whole request (head and its small body) within admin.header_timeout: an idle
            // or trickling connection cannot hold one of the admin.max_connections for long.
            stream.expires_after(cfg->admin.header_timeout);
            auto [ec, n] = co_await bhttp::async_read(stream, buffer, parser, use_tuple);
            (void)n;
            if (ec) {
                co_return;
            }
            const auto& req = parser.get();
            const auto target = req.target();
            admin_response res;
            if (target.substr(0, target.find('?')) == keys_path) {
                res = co_await answer_keys(req, peer);
                res.prepare_payload();
                res.keep_alive(req.keep_alive());
            } else {
                res = answer(req);
            }
            auto [wec, wn] = co_await bhttp::async_write(stream, res, use_tuple);
            (void)wn;
            if (wec || !res.keep_alive()) {
                co_return;
            }
        }
    }

    net::awaitable<void> accept_loop() {
        auto self = shared_from_this();
        http::accept_backoff backoff;
        net::steady_timer t(ioc);
        while (acceptor.is_open()) {
            auto [ec, sock] = co_await acceptor.async_accept(use_tuple);
            if (ec) {
                if (ec == net::error::operation_aborted || !acceptor.is_open()) {
                    co_return;
                }
                // Out of descriptors (a flood on the proxy port) is transient: the probes must
                // answer again as soon as descriptors are free.
                reg.counter(metrics::family::accept_errors, metrics::listener::admin).inc();
                t.expires_after(backoff.on_error("admin", ec));
                co_await t.async_wait(use_tuple);
                continue;
            }
            backoff.reset();
            if (open_sessions >= cfg->admin.max_connections) {
                // Closed at once: the admin listener keeps to its share of the descriptors,
                // whatever a client opens (issue 26), and the proxy listener is not starved.
                reg.counter(metrics::family::admin_connections_refused).inc();
                boost::system::error_code ignored;
                sock.close(ignored);
                continue;
            }
            net::co_spawn(ioc, session(std::move(sock), session_slot(self)),
                          [this, self](std::exception_ptr e) {
                              http::report_exception(e, "admin session",
                                                     reg.counter(metrics::family::internal_errors));
                          });
        }
    }
};

admin_server::admin_server(net::io_context& ioc, std::vector<net::any_io_executor> workers,
                           std::shared_ptr<const config::config> cfg, metrics::registry& reg,
                           std::shared_ptr<store::store> st)
    : impl_(std::make_shared<impl>(ioc, std::move(workers), std::move(cfg), reg, std::move(st))) {}

admin_server::~admin_server() = default;

unsigned short admin_server::listen() {
    const auto& l = impl_->cfg->admin.listen;
    if (!l) {
        return 0;
    }
    tcp::endpoint ep(net::ip::make_address(l->host), l->port);
    auto& a = impl_->acceptor;
    a.open(ep.protocol());
    a.set_option(tcp::acceptor::reuse_address(true));
    a.bind(ep);
    a.listen();
    return a.local_endpoint().port();
}

void admin_server::start() {
    net::co_spawn(impl_->probe_ex, impl_->probe_store(), net::detached);
    if (impl_->cfg->admin.readiness.upstream) {
        net::co_spawn(impl_->ioc, impl_->probe_upstream(), net::detached);
    }
    if (impl_->acceptor.is_open()) {
        net::co_spawn(impl_->ioc, impl_->sample_history(), net::detached);
        net::co_spawn(impl_->ioc, impl_->accept_loop(), net::detached);
    }
}

void admin_server::set_config(std::shared_ptr<const config::config> serving) {
    impl_->serving = std::move(serving);
}

void admin_server::set_draining() {
    impl_->draining = true;
}

void admin_server::stop() {
    impl_->stopped = true;
    impl_->upstream_probe_timer.cancel();
    impl_->history_timer.cancel();
    // The store probe sleeps on a worker: cancelled there, its timer is not thread-safe.
    net::post(impl_->probe_ex, [self = impl_] { self->store_probe_timer.cancel(); });
    boost::system::error_code ec;
    impl_->acceptor.close(ec);
}

} // namespace onceproxy::app
