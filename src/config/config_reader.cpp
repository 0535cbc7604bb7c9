#include "config/config_reader.hpp"

#include "config/idempotency_block.hpp"
#include "config/yaml_walker.hpp"
#include "onceproxy/config/cidr.hpp"
#include "onceproxy/config/tls_material.hpp"
#include "onceproxy/config/upstream_tls.hpp"
#include "onceproxy/text/hex.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <set>
#include <string_view>
#include <thread>
#include <vector>

namespace onceproxy::config {
namespace {

using text::hex_value;

// RFC 9110 §5.6.2 tchar: header names and methods are tokens.
bool is_tchar(char c) {
    if (std::isalnum(static_cast<unsigned char>(c)) != 0) {
        return true;
    }
    return std::string_view{"!#$%&'*+-.^_`|~"}.find(c) != std::string_view::npos;
}

bool is_token(std::string_view s) {
    return !s.empty() && std::all_of(s.begin(), s.end(), is_tchar);
}

// Route and upstream names appear in metric labels, logs and (hashed) store keys: keep them
// to characters that need no escaping anywhere.
bool is_name(std::string_view s) {
    if (s.empty() || s.size() > 64 || std::isalnum(static_cast<unsigned char>(s.front())) == 0) {
        return false;
    }
    return std::all_of(s.begin(), s.end(), [](char c) {
        return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '-' || c == '_' || c == '.';
    });
}

bool is_identifier(std::string_view s) {
    if (s.empty() ||
        !(std::isalpha(static_cast<unsigned char>(s.front())) != 0 || s.front() == '_')) {
        return false;
    }
    return std::all_of(s.begin(), s.end(), [](char c) {
        return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_';
    });
}

std::optional<std::uint16_t> parse_port(std::string_view s, std::uint16_t min) {
    if (s.empty() || s.size() > 5) {
        return std::nullopt;
    }
    unsigned value = 0;
    const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
    if (ec != std::errc{} || ptr != s.data() + s.size() || value < min || value > 65535) {
        return std::nullopt;
    }
    return static_cast<std::uint16_t>(value);
}

/// "host:port", "[v6]:port". The host is returned without brackets.
std::optional<endpoint> parse_host_port(std::string_view s, std::uint16_t min_port) {
    std::string_view host;
    std::string_view port;
    if (!s.empty() && s.front() == '[') {
        const auto close = s.find(']');
        if (close == std::string_view::npos || close + 1 >= s.size() || s[close + 1] != ':') {
            return std::nullopt;
        }
        host = s.substr(1, close - 1);
        port = s.substr(close + 2);
    } else {
        const auto colon = s.rfind(':');
        if (colon == std::string_view::npos) {
            return std::nullopt;
        }
        host = s.substr(0, colon);
        port = s.substr(colon + 1);
        if (host.find(':') != std::string_view::npos) {
            return std::nullopt; // an IPv6 address needs brackets
        }
    }
    const bool host_ok = !host.empty() && std::none_of(host.begin(), host.end(), [](char c) {
        return std::isspace(static_cast<unsigned char>(c)) != 0 || c == '/' || c == '@' ||
               c == '?' || c == '#' || c == '[' || c == ']';
    });
    const auto p = parse_port(port, min_port);
    if (!host_ok || !p) {
        return std::nullopt;
    }
    return endpoint{std::string{host}, *p};
}

std::string to_upper(std::string s) {
    std::transform(s.begin(), s.end(), s.begin(),
                   [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
    return s;
}

std::string format_duration(duration d) {
    const auto ms = d.count();
    if (ms % 1000 != 0) {
        return std::to_string(ms) + "ms";
    }
    return std::to_string(ms / 1000) + "s";
}

std::vector<std::string_view> split_segments(std::string_view path) {
    std::vector<std::string_view> out;
    std::size_t start = 1; // skip the leading '/'
    while (true) {
        const auto slash = path.find('/', start);
        if (slash == std::string_view::npos) {
            out.push_back(path.substr(start));
            return out;
        }
        out.push_back(path.substr(start, slash - start));
        start = slash + 1;
    }
}

/// One trailing line break (LF or CRLF) is not part of a secret read from a file: files
/// written by editors and `echo` end with one.
void drop_line_break(std::string& text) {
    if (text.ends_with("\n")) {
        text.pop_back();
        if (text.ends_with("\r")) {
            text.pop_back();
        }
    }
}

/// Marks of the idempotency fields that cross-field checks may have to blame.
struct block_marks {
    yaml_field lease;
    yaml_field principal; ///< scope.principal
};

class reader {
public:
    reader(const std::string& file, std::vector<config_error>& errors) : w_(file, errors) {}

    config read(const YAML::Node& root_node) {
        config cfg;
        const yaml_field root = w_.root(root_node);
        if (root_node.IsNull()) {
            w_.error(root, "the document is empty; expected a mapping with at least "
                           "'upstreams' and 'routes'");
            return cfg;
        }
        if (!w_.mapping(root, {"listen", "tls", "http2", "admin", "workers", "limits", "upstreams",
                               "store", "defaults", "routes", "egress", "access_log", "log",
                               "trusted_proxies"})) {
            return cfg;
        }
        if (auto ep = read_endpoint(w_.get(root, "listen"))) {
            cfg.listen = *ep;
        }
        read_tls(w_.get(root, "tls"), cfg);
        read_http2(w_.get(root, "http2"), cfg.http2);
        if (cfg.tls) {
            cfg.tls->http2 = cfg.http2.tls;
        }
        read_admin(w_.get(root, "admin"), cfg);
        read_workers(w_.get(root, "workers"), cfg);
        read_limits(w_.get(root, "limits"), cfg.limits);
        read_upstreams(w_.require(root, "upstreams"), cfg);
        check_drain_timeout(cfg);
        resolve_upstream_check(cfg);
        read_store(w_.get(root, "store"), cfg.store);
        read_trusted_proxies(w_.get(root, "trusted_proxies"), cfg);
        block_marks defaults_marks;
        const yaml_field defaults = w_.get(root, "defaults");
        idempotency_block defaults_block;
        if (defaults.present()) {
            defaults_block = read_idempotency(defaults, defaults_marks);
        }
        const yaml_field egress = w_.get(root, "egress");
        // A sidecar for outbound calls only needs no inbound routes.
        read_routes(egress.present() ? w_.get(root, "routes") : w_.require(root, "routes"),
                    defaults_block, defaults_marks, cfg);
        read_egress(egress, cfg);
        if (auto b = w_.boolean(w_.get(root, "access_log"))) {
            cfg.access_log = *b;
        }
        read_log(w_.get(root, "log"), cfg.log);
        if (cfg.admin.listen && cfg.admin.listen->port != 0 &&
            cfg.admin.listen->port == cfg.listen.port &&
            cfg.admin.listen->host == cfg.listen.host) {
            w_.error(admin_listen_mark_, "admin.listen must differ from listen");
        }
        if (cfg.tls && cfg.tls->listen) {
            const auto& tl = *cfg.tls->listen;
            if (tl.port != 0 && tl == cfg.listen) {
                w_.error(tls_listen_mark_, "tls.listen must differ from listen (omit tls.listen "
                                           "to serve TLS on listen itself)");
            } else if (tl.port != 0 && cfg.admin.listen && tl == *cfg.admin.listen) {
                w_.error(tls_listen_mark_, "tls.listen must differ from admin.listen");
            }
        }
        return cfg;
    }

private:
    std::optional<endpoint> read_endpoint(const yaml_field& f) {
        const auto text = w_.scalar(f, "host:port");
        if (!text) {
            return std::nullopt;
        }
        auto ep = parse_host_port(*text, 0);
        if (!ep) {
            w_.error(f, "invalid address '" + *text +
                            "'; expected host:port, e.g. 0.0.0.0:8080 or [::1]:8080");
        }
        return ep;
    }

    void read_http2(const yaml_field& f, http2_config& h) {
        if (!f.present() || !w_.mapping(f, {"cleartext", "tls", "max_concurrent_streams"})) {
            return;
        }
        set(h.cleartext, w_.boolean(w_.get(f, "cleartext")));
        set(h.tls, w_.boolean(w_.get(f, "tls")));
        if (auto n = w_.integer(w_.get(f, "max_concurrent_streams"), 1, 10'000)) {
            h.max_concurrent_streams = static_cast<std::uint32_t>(*n);
        }
    }

    /// tls: the files are loaded as the running proxy loads them, so that a file that would
    /// not serve is an error here, blamed on its key.
    void read_tls(const yaml_field& f, config& cfg) {
        tls_present_ = f.present();
        if (!f.present() || !w_.mapping(f, {"listen", "cert_file", "key_file", "client_ca_file",
                                            "require_client_cert", "reload_interval"})) {
            return;
        }
        tls_files t;
        const yaml_field listen = w_.get(f, "listen");
        tls_listen_mark_ = listen;
        if (listen.present()) {
            t.listen = read_endpoint(listen);
        }
        const yaml_field cert = w_.require(f, "cert_file");
        const yaml_field key = w_.require(f, "key_file");
        const yaml_field ca = w_.get(f, "client_ca_file");
        const yaml_field require = w_.get(f, "require_client_cert");
        auto cert_path = w_.string(cert);
        auto key_path = w_.string(key);
        set(t.client_ca_file, w_.string(ca));
        if (auto b = w_.boolean(require)) {
            t.require_client_cert = *b;
            if (*b && !ca.present()) {
                w_.error(require, "require_client_cert needs client_ca_file (the CAs that "
                                  "client certificates are verified against)");
            }
        }
        set(t.reload_interval, w_.duration_or_zero(w_.get(f, "reload_interval")));
        if (!cert_path || !key_path) {
            return;
        }
        t.cert_file = std::move(*cert_path);
        t.key_file = std::move(*key_path);
        if (ca.present() && t.client_ca_file.empty()) {
            return; // blamed already
        }
        const auto material = load_server_tls(t);
        if (material.error) {
            const auto& at = material.error->file == tls_file_kind::cert  ? cert
                             : material.error->file == tls_file_kind::key ? key
                                                                          : ca;
            w_.error(at, material.error->message);
        }
        cfg.tls = std::move(t);
    }

    void read_admin(const yaml_field& f, config& cfg) {
        if (!f.present() || !w_.mapping(f, {"listen", "max_connections", "header_timeout",
                                            "idle_timeout", "readiness", "keys_api"})) {
            return;
        }
        const yaml_field listen = w_.get(f, "listen");
        admin_listen_mark_ = listen;
        cfg.admin.listen = read_endpoint(listen);
        if (auto n = w_.integer(w_.get(f, "max_connections"), 1, 1024)) {
            cfg.admin.max_connections = static_cast<std::size_t>(*n);
        }
        set(cfg.admin.header_timeout, w_.positive_duration(w_.get(f, "header_timeout")));
        set(cfg.admin.idle_timeout, w_.positive_duration(w_.get(f, "idle_timeout")));
        const yaml_field readiness = w_.get(f, "readiness");
        if (readiness.present() && w_.mapping(readiness, {"require_store", "upstream"})) {
            if (auto b = w_.boolean(w_.get(readiness, "require_store"))) {
                cfg.admin.readiness.require_store = *b;
            }
            read_upstream_check(w_.get(readiness, "upstream"), cfg.admin.readiness);
        }
        read_keys_api(w_.get(f, "keys_api"), cfg.admin.keys_api);
    }

    /// admin.keys_api: { enabled, token_file }. Enabled needs a readable, non-empty token file
    /// (read once at start; a change needs a restart).
    void read_keys_api(const yaml_field& f, keys_api_config& k) {
        if (!f.present() || !w_.mapping(f, {"enabled", "token_file"})) {
            return;
        }
        const yaml_field enabled = w_.get(f, "enabled");
        if (auto b = w_.boolean(enabled)) {
            k.enabled = *b;
        }
        const yaml_field token_file = w_.get(f, "token_file");
        if (token_file.present()) {
            if (auto path = w_.string(token_file)) {
                k.token_file = *path;
            }
        }
        if (!k.enabled) {
            return;
        }
        if (!token_file.present()) {
            w_.error(enabled.present() ? enabled : f,
                     "admin.keys_api is enabled but has no token_file (the bearer token that "
                     "protects it)");
            return;
        }
        if (k.token_file.empty()) {
            return; // not a string: already reported
        }
        auto read = read_secret_file(token_file, k.token_file, "token_file");
        if (!read) {
            return;
        }
        std::string text = std::move(*read);
        drop_line_break(text);
        if (text.empty()) {
            w_.error(token_file, "token_file '" + k.token_file + "' is empty");
            return;
        }
        if (text.size() < min_admin_token_bytes) {
            // A short token falls to guessing (issue 26): 32 bytes at least.
            w_.error(token_file, "the token in token_file '" + k.token_file + "' has " +
                                     std::to_string(text.size()) + " bytes; expected at least " +
                                     std::to_string(min_admin_token_bytes) +
                                     " (e.g. openssl rand -hex 32)");
            return;
        }
        k.token = std::move(text);
    }

    /// admin.readiness.upstream: { name, http_path, interval, timeout }. The name is resolved
    /// once the upstreams are read (resolve_upstream_check).
    void read_upstream_check(const yaml_field& f, readiness_config& readiness) {
        if (!f.present() || !w_.mapping(f, {"name", "http_path", "interval", "timeout"})) {
            return;
        }
        upstream_check_config check;
        upstream_check_name_ = w_.require(f, "name");
        set(check.upstream, w_.string(upstream_check_name_));
        const yaml_field path = w_.get(f, "http_path");
        if (auto text = w_.string(path)) {
            if (text->front() != '/' || text->find_first_of(" \t\r\n#") != std::string::npos) {
                w_.error(path, "invalid http_path '" + *text +
                                   "'; expected an absolute path such as /healthz");
            }
            check.http_path = *text;
        }
        set(check.interval, w_.positive_duration(w_.get(f, "interval")));
        const yaml_field timeout = w_.get(f, "timeout");
        set(check.timeout, w_.positive_duration(timeout));
        if (check.timeout > check.interval) {
            w_.error(timeout.present() ? timeout : f, "the check timeout (" +
                                                          format_duration(check.timeout) +
                                                          ") must not exceed its interval (" +
                                                          format_duration(check.interval) + ")");
        }
        readiness.upstream = std::move(check);
    }

    void resolve_upstream_check(config& cfg) {
        auto& check = cfg.admin.readiness.upstream;
        if (!check || check->upstream.empty()) {
            return;
        }
        const auto it =
            std::find_if(cfg.upstreams.begin(), cfg.upstreams.end(),
                         [&](const upstream_config& u) { return u.name == check->upstream; });
        if (it == cfg.upstreams.end()) {
            w_.error(upstream_check_name_, "unknown upstream '" + check->upstream + "'");
            return;
        }
        check->upstream_index = static_cast<std::size_t>(it - cfg.upstreams.begin());
    }

    void read_trusted_proxies(const yaml_field& f, config& cfg) {
        const auto list = w_.string_list(f);
        if (!list) {
            return;
        }
        for (std::size_t i = 0; i < list->size(); ++i) {
            if (auto block = parse_cidr((*list)[i])) {
                cfg.trusted_proxies.push_back(*block);
            } else {
                w_.error(w_.item(f, i), "invalid address block '" + (*list)[i] +
                                            "'; expected an address or CIDR with no host bits "
                                            "set, e.g. 10.0.0.0/8, 127.0.0.1 or fd00::/8");
            }
        }
    }

    /// `egress:` (docs/egress.md): the listener, the budget and breaker every upstream it
    /// calls gets, and its routes.
    void read_egress(const yaml_field& f, config& cfg) {
        if (!f.present() || !w_.mapping(f, {"listen", "budget", "breaker", "routes"})) {
            return;
        }
        egress_config e;
        if (auto ep = read_endpoint(w_.require(f, "listen"))) {
            e.listen = *ep;
            if (ep->port != 0 && *ep == cfg.listen) {
                w_.error(w_.get(f, "listen"), "egress.listen must differ from listen");
            } else if (ep->port != 0 && cfg.admin.listen && *ep == *cfg.admin.listen) {
                w_.error(w_.get(f, "listen"), "egress.listen must differ from admin.listen");
            }
        }
        if (const yaml_field b = w_.get(f, "budget");
            b.present() && w_.mapping(b, {"ratio", "min_per_second", "window"})) {
            set(e.budget.ratio, read_ratio(w_.get(b, "ratio")));
            if (const yaml_field m = w_.get(b, "min_per_second"); m.present()) {
                if (auto n = w_.integer(m, 0, 1'000'000)) {
                    e.budget.min_per_second = static_cast<double>(*n);
                }
            }
            set(e.budget.window, w_.positive_duration(w_.get(b, "window")));
        }
        if (const yaml_field b = w_.get(f, "breaker");
            b.present() && w_.mapping(b, {"enabled", "failures", "cool_down", "probes"})) {
            set(e.breaker.enabled, w_.boolean(w_.get(b, "enabled")));
            if (auto n = w_.integer(w_.get(b, "failures"), 1, 1'000'000)) {
                e.breaker.failures = static_cast<unsigned>(*n);
            }
            set(e.breaker.cool_down, w_.positive_duration(w_.get(b, "cool_down")));
            if (auto n = w_.integer(w_.get(b, "probes"), 1, 1'000)) {
                e.breaker.probes = static_cast<unsigned>(*n);
            }
        }
        const yaml_field routes = w_.require(f, "routes");
        if (routes.present() && w_.sequence(routes)) {
            if (routes.node.size() == 0) {
                w_.error(routes, "expected at least one egress route");
            }
            std::map<std::string, int, std::less<>> names;
            for (std::size_t i = 0; i < routes.node.size(); ++i) {
                const yaml_field rf = w_.item(routes, i);
                if (!w_.mapping(rf, {"name", "match", "upstream", "limits", "retry"})) {
                    continue;
                }
                route_config route;
                const yaml_field upstream = w_.require(rf, "upstream");
                read_route_head(rf, upstream, names, cfg, route);
                if (!route.match.grpc.empty()) {
                    w_.error(w_.get(rf, "match"), "egress routes do not match gRPC calls");
                }
                read_route_limits(w_.get(rf, "limits"), cfg.limits, route);
                if (!route.limits.max_request_bytes || !route.limits.max_response_bytes) {
                    // Bodies are held for retries and answers read whole before they are
                    // passed on (docs/egress.md).
                    w_.error(w_.get(rf, "limits"), "an egress route buffers requests and "
                                                   "responses, so its limits need a size, not "
                                                   "none");
                }
                route.retry = read_retry(w_.get(rf, "retry"));
                e.routes.push_back(std::move(route));
            }
        }
        cfg.egress = std::move(e);
    }

    /// `20%` or a fraction such as `0.2`, from 0 to 1000%.
    std::optional<double> read_ratio(const yaml_field& f) {
        const auto text = w_.scalar(f, "a percentage such as 20%");
        if (!text) {
            return std::nullopt;
        }
        const bool percent = !text->empty() && text->back() == '%';
        const std::string number = percent ? text->substr(0, text->size() - 1) : *text;
        char* end = nullptr;
        const double v = std::strtod(number.c_str(), &end);
        const double ratio = percent ? v / 100 : v;
        if (number.empty() || end != number.c_str() + number.size() || !(ratio >= 0) ||
            ratio > 10) {
            w_.error(f, "invalid ratio '" + *text + "'; expected a percentage such as 20%");
            return std::nullopt;
        }
        return ratio;
    }

    /// An egress route's `retry:` over the built-in defaults.
    retry_config read_retry(const yaml_field& f) {
        retry_config r;
        if (!f.present() ||
            !w_.mapping(f, {"attempts", "deadline", "base_delay", "max_delay", "max_retry_after",
                            "on", "max_body_bytes", "generate_key", "key_header"})) {
            return r;
        }
        if (auto n = w_.integer(w_.get(f, "attempts"), 1, 100)) {
            r.attempts = static_cast<unsigned>(*n);
        }
        set(r.deadline, w_.positive_duration(w_.get(f, "deadline")));
        set(r.base_delay, w_.positive_duration(w_.get(f, "base_delay")));
        set(r.max_delay, w_.positive_duration(w_.get(f, "max_delay")));
        set(r.max_retry_after, w_.duration_or_zero(w_.get(f, "max_retry_after")));
        if (r.max_delay < r.base_delay) {
            w_.error(w_.get(f, "max_delay"), "max_delay " + format_duration(r.max_delay) +
                                                 " is below base_delay " +
                                                 format_duration(r.base_delay));
        }
        if (const yaml_field on = w_.get(f, "on"); on.present() && w_.sequence(on)) {
            r.statuses.reset();
            r.on_connect_failure = r.on_reset = r.on_timeout = false;
            for (std::size_t i = 0; i < on.node.size(); ++i) {
                const yaml_field item = w_.item(on, i);
                const auto text =
                    w_.scalar(item, "a status code or connect_failure, reset, timeout");
                if (!text) {
                    continue;
                }
                if (*text == "connect_failure") {
                    r.on_connect_failure = true;
                    continue;
                }
                if (*text == "reset") {
                    r.on_reset = true;
                    continue;
                }
                if (*text == "timeout") {
                    r.on_timeout = true;
                    continue;
                }
                unsigned code = 0;
                const auto [ptr, ec] =
                    std::from_chars(text->data(), text->data() + text->size(), code);
                if (ec != std::errc{} || ptr != text->data() + text->size() || code < 400 ||
                    code > 599) {
                    w_.error(item, "invalid retry condition '" + *text +
                                       "'; expected a status code from 400 to 599, "
                                       "connect_failure, reset or timeout");
                    continue;
                }
                r.statuses.set(code);
            }
        }
        set(r.max_body_bytes, w_.positive_size(w_.get(f, "max_body_bytes")));
        set(r.generate_key, w_.boolean(w_.get(f, "generate_key")));
        if (const yaml_field h = w_.get(f, "key_header"); h.present()) {
            if (auto v = w_.string(h)) {
                if (!is_token(*v)) {
                    w_.error(h, "invalid header name '" + *v + "'");
                } else {
                    r.key_header = *v;
                }
            }
        }
        return r;
    }

    void read_log(const yaml_field& f, log_config& log) {
        if (!f.present() || !w_.mapping(f, {"level"})) {
            return;
        }
        if (auto l = w_.enumeration<log_level>(w_.get(f, "level"), {{"debug", log_level::debug},
                                                                    {"info", log_level::info},
                                                                    {"warn", log_level::warn},
                                                                    {"error", log_level::error}})) {
            log.level = *l;
        }
    }

    void read_workers(const yaml_field& f, config& cfg) {
        cfg.workers = std::max(1U, std::thread::hardware_concurrency());
        if (!f.present()) {
            return;
        }
        const auto text = w_.scalar(f, "auto or a positive integer");
        if (!text || *text == "auto") {
            return;
        }
        unsigned n = 0;
        const auto [ptr, ec] = std::from_chars(text->data(), text->data() + text->size(), n);
        if (text->empty() || ec != std::errc{} || ptr != text->data() + text->size() || n < 1 ||
            n > 1024) {
            w_.error(f, "invalid workers value '" + *text +
                            "'; expected auto or an integer from 1 to 1024");
            return;
        }
        cfg.workers = n;
    }

    void read_limits(const yaml_field& f, limits_config& limits) {
        if (!f.present() ||
            !w_.mapping(f, {"max_request_bytes", "max_header_bytes", "max_response_bytes",
                            "header_timeout", "idle_timeout", "shutdown_delay", "drain_timeout",
                            "max_connections", "body_timeout", "min_body_rate", "max_body_time",
                            "max_buffered_bytes", "max_requests_per_connection"})) {
            return;
        }
        set(limits.max_request_bytes, w_.positive_size(w_.get(f, "max_request_bytes")));
        const auto header_field = w_.get(f, "max_header_bytes");
        if (auto n = w_.positive_size(header_field)) {
            if (*n > limits_config::max_header_bytes_cap) {
                // Beast stores a field in at most 64 KiB; a larger section could not be parsed
                // safely (and no real client needs it).
                w_.error(header_field, "max_header_bytes " + std::to_string(*n) +
                                           " is too large; expected at most 60KiB (" +
                                           std::to_string(limits_config::max_header_bytes_cap) +
                                           " bytes)");
            } else {
                limits.max_header_bytes = *n;
            }
        }
        if (auto n = w_.integer(w_.get(f, "max_connections"), 1, 10'000'000)) {
            limits.max_connections = static_cast<std::size_t>(*n);
        }
        set(limits.max_response_bytes, w_.positive_size(w_.get(f, "max_response_bytes")));
        set(limits.header_timeout, w_.positive_duration(w_.get(f, "header_timeout")));
        set(limits.body_timeout, w_.positive_duration(w_.get(f, "body_timeout")));
        set(limits.min_body_rate, w_.positive_size(w_.get(f, "min_body_rate")));
        set(limits.max_body_time, w_.positive_duration(w_.get(f, "max_body_time")));
        const auto buffered_field = w_.get(f, "max_buffered_bytes");
        set(limits.max_buffered_bytes, w_.positive_size(buffered_field));
        if (limits.max_buffered_bytes < limits.max_request_bytes) {
            // A body the budget could never hold would always be refused.
            w_.error(buffered_field.present() ? buffered_field : w_.get(f, "max_request_bytes"),
                     "max_buffered_bytes " + std::to_string(limits.max_buffered_bytes) +
                         " is below max_request_bytes " + std::to_string(limits.max_request_bytes) +
                         "; expected at least max_request_bytes");
        }
        if (auto n = w_.integer(w_.get(f, "max_requests_per_connection"), 1, 1'000'000'000)) {
            limits.max_requests_per_connection = static_cast<std::size_t>(*n);
        }
        set(limits.idle_timeout, w_.positive_duration(w_.get(f, "idle_timeout")));
        set(limits.shutdown_delay, w_.duration_or_zero(w_.get(f, "shutdown_delay")));
        drain_timeout_mark_ = w_.get(f, "drain_timeout");
        drain_timeout_given_ = drain_timeout_mark_.present();
        set(limits.drain_timeout, w_.positive_duration(drain_timeout_mark_));
    }

    // The drain must outlast the longest upstream timeout: a request sent upstream just before
    // the listeners close then still ends (answered, or timed out and handled by its route's
    // on_upstream_uncertain) before the deadline, instead of being cut off mid-exchange.
    void check_drain_timeout(const config& cfg) {
        const upstream_config* longest = nullptr;
        std::size_t longest_index = 0;
        for (std::size_t i = 0; i < cfg.upstreams.size(); ++i) {
            if (longest == nullptr || cfg.upstreams[i].timeout > longest->timeout) {
                longest = &cfg.upstreams[i];
                longest_index = i;
            }
        }
        if (longest == nullptr || cfg.limits.drain_timeout >= longest->timeout) {
            return;
        }
        // With drain_timeout absent (the default) the upstream's timeout is what was raised.
        const yaml_field& blame =
            drain_timeout_given_ || longest_index >= upstream_timeout_marks_.size()
                ? drain_timeout_mark_
                : upstream_timeout_marks_[longest_index];
        w_.error(blame, "drain_timeout " + format_duration(cfg.limits.drain_timeout) +
                            " is shorter than the timeout " + format_duration(longest->timeout) +
                            " of upstream '" + longest->name +
                            "'; expected a drain_timeout at least as long as every upstream "
                            "timeout, so a request in flight at SIGTERM can end before the "
                            "deadline");
    }

    /// protocol: h2 needs TLS (https://), h2c plain TCP (http://).
    void read_upstream_protocol(const yaml_field& f, bool url_ok, upstream_config& up) {
        const auto p = w_.enumeration<upstream_protocol>(f, {{"http1", upstream_protocol::http1},
                                                             {"h2", upstream_protocol::h2},
                                                             {"h2c", upstream_protocol::h2c}});
        if (!p) {
            return;
        }
        up.protocol = *p;
        if (url_ok && *p == upstream_protocol::h2 && !up.tls) {
            w_.error(f, "protocol h2 needs an https:// url (HTTP/2 over TLS); use h2c for "
                        "HTTP/2 over plain TCP");
        } else if (url_ok && *p == upstream_protocol::h2c && up.tls) {
            w_.error(f, "protocol h2c is HTTP/2 over plain TCP and needs an http:// url; use h2 "
                        "for HTTP/2 over TLS");
        }
    }

    void read_upstreams(const yaml_field& f, config& cfg) {
        if (!f.present() || !w_.named_mapping(f)) {
            return;
        }
        if (f.node.size() == 0) {
            w_.error(f, "expected at least one upstream");
        }
        for (const auto& [name, uf] : w_.entries(f)) {
            upstream_config up;
            up.name = name;
            upstream_timeout_marks_.emplace_back();
            if (!is_name(name)) {
                w_.error(uf, "invalid upstream name '" + name +
                                 "'; expected up to 64 letters, digits, '-', '_' or '.', "
                                 "starting with a letter or digit");
            }
            if (w_.mapping(uf,
                           {"url", "protocol", "connect_timeout", "timeout", "late_answer_timeout",
                            "max_connections", "max_tunnels", "idle_timeout", "tls"})) {
                const yaml_field url = w_.require(uf, "url");
                bool url_ok = false;
                if (auto text = w_.string(url)) {
                    url_ok = parse_upstream_url(url, *text, up);
                }
                read_upstream_tls(w_.get(uf, "tls"), url_ok, up);
                read_upstream_protocol(w_.get(uf, "protocol"), url_ok, up);
                set(up.connect_timeout, w_.positive_duration(w_.get(uf, "connect_timeout")));
                upstream_timeout_marks_.back() = w_.get(uf, "timeout");
                set(up.timeout, w_.positive_duration(upstream_timeout_marks_.back()));
                read_late_answer_timeout(w_.get(uf, "late_answer_timeout"), up);
                if (auto n = w_.integer(w_.get(uf, "max_connections"), 1, 1'000'000)) {
                    up.max_connections = static_cast<std::size_t>(*n);
                }
                if (auto n = w_.integer(w_.get(uf, "max_tunnels"), 0, 1'000'000)) {
                    up.max_tunnels = static_cast<std::size_t>(*n);
                }
                set(up.idle_timeout, w_.positive_duration(w_.get(uf, "idle_timeout")));
            }
            cfg.upstreams.push_back(std::move(up));
        }
    }

    /// `upstreams.<name>.late_answer_timeout`: 0 (off) or at least the timeout; unset, three
    /// times the timeout (issue 26: slow upstreams answer a little late, not never).
    void read_late_answer_timeout(const yaml_field& f, upstream_config& up) {
        up.late_answer_timeout = 3 * up.timeout;
        set(up.late_answer_timeout, w_.duration_or_zero(f));
        if (f.present() && up.late_answer_timeout > duration{0} &&
            up.late_answer_timeout < up.timeout) {
            w_.error(f, "late_answer_timeout " + format_duration(up.late_answer_timeout) +
                            " is shorter than the timeout " + format_duration(up.timeout) +
                            " of upstream '" + up.name +
                            "'; expected 0s (no late answers) or at least the timeout");
        }
    }

    /// `upstreams.<name>.tls`: settings of an https:// upstream. The files are loaded here as
    /// the forwarder will load them, so a bad one is an error at its key (and --check-config
    /// agrees with a start). Without the key, an https:// upstream verifies against the
    /// system's trust store.
    void read_upstream_tls(const yaml_field& f, bool url_ok, upstream_config& up) {
        auto& t = up.tls_settings;
        if (f.present() && w_.mapping(f, {"verify", "ca_file", "server_name", "client_cert_file",
                                          "client_key_file", "reload_interval"})) {
            if (url_ok && !up.tls) {
                w_.error(f, "tls settings on upstream '" + up.name + "' with the http:// url '" +
                                up.url + "'; use an https:// url or remove tls");
            }
            bool ok = url_ok && up.tls;
            const auto read = [&](const char* key, auto& into, auto value) {
                const yaml_field field = w_.get(f, key);
                if (field.present() && !value) {
                    ok = false;
                }
                set(into, std::move(value));
            };
            read("verify", t.verify, w_.boolean(w_.get(f, "verify")));
            read("reload_interval", t.reload_interval,
                 w_.duration_or_zero(w_.get(f, "reload_interval")));
            const yaml_field ca = w_.get(f, "ca_file");
            read("ca_file", t.ca_file, w_.string(ca));
            const yaml_field server_name = w_.get(f, "server_name");
            if (auto name = w_.string(server_name)) {
                if (name->find_first_of(" \t/:") != std::string::npos) {
                    w_.error(server_name, "invalid server_name '" + *name +
                                              "'; expected a host name, e.g. payments.internal");
                } else {
                    t.server_name = *name;
                }
            }
            const yaml_field cert = w_.get(f, "client_cert_file");
            const yaml_field key = w_.get(f, "client_key_file");
            read("client_cert_file", t.client_cert_file, w_.string(cert));
            read("client_key_file", t.client_key_file, w_.string(key));
            if (cert.present() != key.present()) {
                w_.error(cert.present() ? cert : key,
                         "client_cert_file and client_key_file go together; set both or neither");
                ok = false;
            }
            if (!ok) {
                return;
            }
            const auto built = make_upstream_tls_context(t);
            if (!built.ctx) {
                switch (built.failed) {
                case upstream_tls_field::ca_file:
                    w_.error(ca, built.error);
                    break;
                case upstream_tls_field::client_cert_file:
                    w_.error(cert, built.error);
                    break;
                case upstream_tls_field::client_key_file:
                    w_.error(key, built.error);
                    break;
                case upstream_tls_field::none:
                    w_.error(f, built.error);
                    break;
                }
            }
        } else if (!f.present() && url_ok && up.tls) {
            // The system's trust store must load: otherwise nothing would ever verify.
            const auto built = make_upstream_tls_context(t);
            if (!built.ctx) {
                w_.error(f, built.error);
            }
        }
    }

    /// http(s)://host[:port][/]: the upstream is an origin; the request path is the client's.
    /// False when the url is invalid (error recorded).
    bool parse_upstream_url(const yaml_field& f, const std::string& url, upstream_config& up) {
        up.url = url;
        std::string_view rest = url;
        if (rest.starts_with("http://")) {
            up.tls = false;
            rest.remove_prefix(7);
        } else if (rest.starts_with("https://")) {
            up.tls = true;
            rest.remove_prefix(8);
        } else {
            w_.error(f, "invalid upstream url '" + url + "'; expected http:// or https://");
            return false;
        }
        if (rest.ends_with("/")) {
            rest.remove_suffix(1);
        }
        const std::uint16_t default_port = up.tls ? 443 : 80;
        const bool has_port =
            !rest.empty() && (rest.back() != ']') &&
            rest.find(':', rest.starts_with("[") ? rest.find(']') : 0) != std::string_view::npos;
        std::optional<endpoint> ep;
        if (rest.find_first_of("/?#@") == std::string_view::npos) {
            if (has_port) {
                ep = parse_host_port(rest, 1);
            } else if (rest.starts_with("[") && rest.ends_with("]") && rest.size() > 2) {
                ep = endpoint{std::string{rest.substr(1, rest.size() - 2)}, default_port};
            } else if (!rest.empty() && rest.find_first_of("[]: \t") == std::string_view::npos) {
                ep = endpoint{std::string{rest}, default_port};
            }
        }
        if (!ep) {
            w_.error(f, "invalid upstream url '" + url +
                            "'; expected scheme://host[:port] with no path, query or user "
                            "info, e.g. http://127.0.0.1:3000");
            return false;
        }
        up.host = ep->host;
        up.port = ep->port;
        return true;
    }

    void read_store(const yaml_field& f, store_config& store) {
        if (!f.present() || !w_.mapping(f, {"type", "memory", "redis", "postgres", "encryption"})) {
            return;
        }
        read_encryption(w_.get(f, "encryption"), store.encryption);
        set(store.type,
            w_.enumeration<store_type>(w_.get(f, "type"), {{"memory", store_type::memory},
                                                           {"redis", store_type::redis},
                                                           {"postgres", store_type::postgres}}));
        const yaml_field memory = w_.get(f, "memory");
        if (memory.present() && w_.mapping(memory, {"max_bytes", "max_bytes_per_holder"})) {
            set(store.memory.max_bytes, w_.positive_size(w_.get(memory, "max_bytes")));
            const yaml_field per_holder = w_.get(memory, "max_bytes_per_holder");
            store.memory.max_bytes_per_holder = store.memory.max_bytes / 16;
            set(store.memory.max_bytes_per_holder, w_.positive_size(per_holder));
            if (store.memory.max_bytes_per_holder > store.memory.max_bytes) {
                w_.error(per_holder, "max_bytes_per_holder must not exceed max_bytes");
            }
        }
        const yaml_field redis = w_.get(f, "redis");
        if (redis.present() &&
            w_.mapping(redis,
                       {"url", "key_prefix", "connect_timeout", "command_timeout",
                        "connections_per_worker", "health_check_interval", "maxmemory_policy",
                        "tls_ca_file", "username", "password", "password_file", "sentinel",
                        "durability", "replicas", "wait_timeout", "cluster"})) {
            redis_config& r = store.redis;
            const yaml_field url = w_.get(redis, "url");
            if (auto text = w_.string(url)) {
                if (!text->starts_with("redis://") && !text->starts_with("rediss://")) {
                    // The value may hold a password: do not echo it.
                    w_.error(url, "invalid redis url; expected redis://[user:password@]host[:port]"
                                  "[/db] or rediss:// for TLS");
                } else {
                    r.url = *text;
                }
            }
            read_key_prefix(w_.get(redis, "key_prefix"), r.key_prefix, true);
            set(r.connect_timeout, w_.positive_duration(w_.get(redis, "connect_timeout")));
            set(r.command_timeout, w_.positive_duration(w_.get(redis, "command_timeout")));
            if (auto n = w_.integer(w_.get(redis, "connections_per_worker"), 1, 64)) {
                r.connections_per_worker = static_cast<std::size_t>(*n);
            }
            set(r.health_check_interval,
                w_.positive_duration(w_.get(redis, "health_check_interval")));
            set(r.maxmemory_policy,
                w_.enumeration<maxmemory_check>(
                    w_.get(redis, "maxmemory_policy"),
                    {{"refuse", maxmemory_check::refuse}, {"warn", maxmemory_check::warn}}));
            set(r.tls_ca_file, w_.string(w_.get(redis, "tls_ca_file")));
            read_redis_credentials(redis, url, r);
            read_sentinel(w_.get(redis, "sentinel"), url, r);
            read_durability(redis, r);
            read_redis_cluster(w_.get(redis, "cluster"), url, r);
        }
        read_postgres(w_.get(f, "postgres"), store.postgres);
    }

    /// store.postgres: read and checked whatever store.type is (as store.redis is), used when
    /// it is postgres.
    void read_postgres(const yaml_field& f, postgres_config& p) {
        if (!f.present() ||
            !w_.mapping(f, {"url", "password", "password_file", "sslmode", "ssl_root_cert", "table",
                            "key_prefix", "pool", "connect_timeout", "statement_timeout", "migrate",
                            "sweep_interval", "lookup_before_claim"})) {
            return;
        }
        const yaml_field url = w_.get(f, "url");
        const bool url_ok = read_postgres_url(url, p);
        if (read_password(f, p.password, p.password_file) && url_ok &&
            postgres_url_has_password(p.url)) {
            w_.error(url, "the url carries a password and password/password_file is set too; "
                          "keep one of them");
        }
        const yaml_field sslmode = w_.get(f, "sslmode");
        bool sslmode_ok = !sslmode.present();
        if (auto mode = w_.scalar(sslmode, "a string")) {
            sslmode_ok = valid_sslmode(*mode);
            if (sslmode_ok) {
                p.sslmode = *mode;
            } else {
                w_.error(sslmode, "invalid sslmode '" + *mode + "'; expected one of " +
                                      std::string{sslmodes});
            }
        }
        const yaml_field root_cert = w_.get(f, "ssl_root_cert");
        if (auto path = w_.string(root_cert); path && sslmode_ok) {
            // The mode in force: the field, else the url's own sslmode parameter.
            const std::string mode = sslmode.present()
                                         ? p.sslmode
                                         : postgres_url_parameter(p.url, "sslmode").value_or("");
            if (mode != "verify-ca" && mode != "verify-full") {
                w_.error(root_cert, "ssl_root_cert needs sslmode verify-ca or verify-full (the "
                                    "only modes that check the server's certificate)");
            } else if (load_ca_file(root_cert, *path)) {
                p.ssl_root_cert = *path;
            }
        }
        read_postgres_table(w_.get(f, "table"), p);
        read_key_prefix(w_.get(f, "key_prefix"), p.key_prefix, false);
        if (auto n = w_.integer(w_.get(f, "pool"), 1, 64)) {
            p.pool = static_cast<std::size_t>(*n);
        }
        set(p.connect_timeout, w_.positive_duration(w_.get(f, "connect_timeout")));
        const yaml_field statement_timeout = w_.get(f, "statement_timeout");
        if (auto d = w_.positive_duration(statement_timeout)) {
            if (*d > duration{60'000}) {
                w_.error(statement_timeout, "statement_timeout is " + format_duration(*d) +
                                                "; at most 60s is allowed");
            } else {
                p.statement_timeout = *d;
            }
        }
        set(p.migrate, w_.enumeration<postgres_migrate>(w_.get(f, "migrate"),
                                                        {{"auto", postgres_migrate::automatic},
                                                         {"check", postgres_migrate::check}}));
        const yaml_field sweep = w_.get(f, "sweep_interval");
        if (auto d = w_.positive_duration(sweep)) {
            if (*d < duration{1'000}) {
                w_.error(sweep,
                         "sweep_interval is " + format_duration(*d) + "; at least 1s is allowed");
            } else {
                p.sweep_interval = *d;
            }
        }
        set(p.lookup_before_claim, w_.boolean(w_.get(f, "lookup_before_claim")));
    }

    /// libpq's sslmode values, weakest first.
    static constexpr std::string_view sslmodes =
        "disable, allow, prefer, require, verify-ca, verify-full";

    static bool valid_sslmode(std::string_view mode) {
        for (const std::string_view m :
             {"disable", "allow", "prefer", "require", "verify-ca", "verify-full"}) {
            if (mode == m) {
                return true;
            }
        }
        return false;
    }

    /// url: libpq's URL form, postgresql:// or postgres://; a sslmode parameter in it must be
    /// one libpq knows. True when the url is usable (or absent: the default is).
    bool read_postgres_url(const yaml_field& f, postgres_config& p) {
        const auto text = w_.string(f);
        if (!text) {
            return !f.present();
        }
        // The value may hold a password: it is never echoed.
        if (!text->starts_with("postgresql://") && !text->starts_with("postgres://")) {
            w_.error(f, "invalid postgres url; expected postgresql://[user[:password]@]host"
                        "[:port][,host2[:port2]...][/dbname][?parameter=value...] (or "
                        "postgres://)");
            return false;
        }
        const auto mode = postgres_url_parameter(*text, "sslmode");
        if (mode && !valid_sslmode(*mode)) {
            w_.error(f, "invalid sslmode '" + *mode + "' in the url; expected one of " +
                            std::string{sslmodes});
            return false;
        }
        p.url = *text;
        return true;
    }

    /// The value of parameter `name` in the query of a libpq URL, as written (not
    /// percent-decoded: the parameters looked at here have plain values); nullopt when absent.
    static std::optional<std::string> postgres_url_parameter(std::string_view url,
                                                             std::string_view name) {
        const auto question = url.find('?');
        if (question == std::string_view::npos) {
            return std::nullopt;
        }
        std::string_view query = url.substr(question + 1);
        while (!query.empty()) {
            const auto amp = query.find('&');
            const std::string_view pair = query.substr(0, amp);
            const auto eq = pair.find('=');
            if (eq != std::string_view::npos && pair.substr(0, eq) == name) {
                return std::string{pair.substr(eq + 1)};
            }
            query = amp == std::string_view::npos ? std::string_view{} : query.substr(amp + 1);
        }
        return std::nullopt;
    }

    /// Whether a libpq URL carries a password: user:password@ before the hosts (libpq takes the
    /// user information up to the first '@' before any '/'), or a password parameter.
    static bool postgres_url_has_password(std::string_view url) {
        const auto scheme_end = url.find("://");
        if (scheme_end == std::string_view::npos) {
            return false;
        }
        const std::string_view rest = url.substr(scheme_end + 3);
        const auto at = rest.find_first_of("@/");
        if (at != std::string_view::npos && rest[at] == '@' &&
            rest.substr(0, at).find(':') != std::string_view::npos) {
            return true;
        }
        return postgres_url_parameter(url, "password").has_value();
    }

    /// table: [schema.]table, at most one dot, each part 1 to 63 bytes (PostgreSQL's
    /// NAMEDATALEN - 1), no NUL. The store quotes each part, so any other character is kept.
    void read_postgres_table(const yaml_field& f, postgres_config& p) {
        const auto text = w_.string(f);
        if (!text) {
            return;
        }
        constexpr std::size_t max_identifier_bytes = 63;
        if (text->find('\0') != std::string::npos) {
            w_.error(f, "table contains a NUL byte");
            return;
        }
        const auto dot = text->find('.');
        if (dot != std::string::npos && text->find('.', dot + 1) != std::string::npos) {
            w_.error(f, "invalid table '" + *text +
                            "'; expected [schema.]table, with at most one dot");
            return;
        }
        const std::string_view name = *text;
        const auto check_part = [&](std::string_view part, const char* what) {
            if (part.empty()) {
                w_.error(f, "invalid table '" + *text + "'; the " + what + " name is empty");
                return false;
            }
            if (part.size() > max_identifier_bytes) {
                w_.error(f, "the " + std::string{what} + " name is " + std::to_string(part.size()) +
                                " bytes; at most " + std::to_string(max_identifier_bytes) +
                                " are allowed (PostgreSQL's identifier length)");
                return false;
            }
            return true;
        };
        const bool ok = dot == std::string::npos ? check_part(name, "table")
                                                 : check_part(name.substr(0, dot), "schema") &&
                                                       check_part(name.substr(dot + 1), "table");
        if (ok) {
            p.table = *text;
        }
    }

    /// A CA bundle loaded as a TLS client would load it; false (error at `f`) when it cannot
    /// be read or holds no usable certificate.
    bool load_ca_file(const yaml_field& f, const std::string& path) {
        upstream_tls_config settings;
        settings.ca_file = path;
        const auto built = make_upstream_tls_context(settings);
        if (!built.ctx) {
            w_.error(f, built.error);
            return false;
        }
        return true;
    }

    /// sentinel: { master, nodes, username, password | password_file, tls }, instead of url.
    void read_sentinel(const yaml_field& f, const yaml_field& url, redis_config& r) {
        if (!f.present() ||
            !w_.mapping(f, {"master", "nodes", "username", "password", "password_file", "tls"})) {
            return;
        }
        if (url.present()) {
            w_.error(f, "set either url or sentinel, not both");
        }
        redis_sentinel_config s;
        const yaml_field master = w_.get(f, "master");
        if (!master.present()) {
            w_.error(f, "sentinel needs master (the name the sentinels monitor it under)");
        } else if (auto name = w_.string(master)) {
            if (name->empty()) {
                w_.error(master, "master is empty");
            }
            s.master = *name;
        }
        const yaml_field nodes = w_.get(f, "nodes");
        if (!nodes.present()) {
            w_.error(f, "sentinel needs nodes (host:port of each sentinel)");
        } else if (auto list = w_.string_list(nodes)) {
            if (list->empty()) {
                w_.error(nodes, "nodes is empty; list at least one sentinel as host:port");
            }
            for (std::size_t i = 0; i < list->size(); ++i) {
                auto ep = parse_host_port((*list)[i], 1);
                if (!ep) {
                    w_.error(w_.item(nodes, i),
                             "invalid sentinel address '" + (*list)[i] +
                                 "'; expected host:port, e.g. 10.0.0.5:26379 or [::1]:26379");
                } else {
                    s.nodes.push_back(*ep);
                }
            }
        }
        read_credentials(f, s.username, s.password, s.password_file);
        set(s.tls, w_.boolean(w_.get(f, "tls")));
        r.sentinel = std::move(s);
    }

    /// durability: async | replicated, replicas, wait_timeout (below command_timeout: a WAIT
    /// holds the connection's later replies back until it returns).
    void read_durability(const yaml_field& redis, redis_config& r) {
        set(r.durability,
            w_.enumeration<redis_durability>(w_.get(redis, "durability"),
                                             {{"async", redis_durability::async},
                                              {"replicated", redis_durability::replicated}}));
        if (auto n = w_.integer(w_.get(redis, "replicas"), 1, 64)) {
            r.replicas = static_cast<std::size_t>(*n);
        }
        const yaml_field wait = w_.get(redis, "wait_timeout");
        set(r.wait_timeout, w_.positive_duration(wait));
        if (r.durability == redis_durability::replicated && r.wait_timeout >= r.command_timeout) {
            w_.error(wait.present() ? wait : w_.get(redis, "command_timeout"),
                     "wait_timeout (" + std::to_string(r.wait_timeout.count()) +
                         " ms) must be below command_timeout (" +
                         std::to_string(r.command_timeout.count()) + " ms)");
        }
    }

    /// store.encryption: {keys: [{id, file}, ...]}, the first key encrypts. Each file holds
    /// the key as 32 raw bytes or 64 hexadecimal digits (one trailing line break allowed).
    void read_encryption(const yaml_field& f, encryption_config& enc) {
        if (!f.present() || !w_.mapping(f, {"keys"})) {
            return;
        }
        const yaml_field keys = w_.require(f, "keys");
        if (!keys.present() || !w_.sequence(keys)) {
            return;
        }
        if (keys.node.size() == 0) {
            w_.error(keys, "expected at least one key (remove encryption to store plaintext)");
            return;
        }
        for (std::size_t i = 0; i < keys.node.size(); ++i) {
            const yaml_field item = w_.item(keys, i);
            if (!w_.mapping(item, {"id", "file"})) {
                continue;
            }
            encryption_key k;
            const yaml_field id = w_.require(item, "id");
            const yaml_field file = w_.require(item, "file");
            if (auto text = w_.string(id)) {
                if (!valid_key_id(*text)) {
                    w_.error(id, "invalid key id '" + *text +
                                     "'; expected 1 to 64 of A-Z a-z 0-9 . _ -");
                    continue;
                }
                for (const auto& other : enc.keys) {
                    if (other.id == *text) {
                        w_.error(id, "key id '" + *text + "' is used twice");
                    }
                }
                k.id = *text;
            }
            if (auto path = w_.string(file)) {
                k.file = *path;
                read_key_file(file, k);
            }
            if (!k.id.empty() && !k.bytes.empty()) {
                enc.keys.push_back(std::move(k));
            }
        }
    }

    static bool valid_key_id(std::string_view id) {
        if (id.empty() || id.size() > 64) {
            return false;
        }
        for (const char c : id) {
            const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                            (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
            if (!ok) {
                return false;
            }
        }
        return true;
    }

    /// The whole content of the secret file at `path` (a mounted Secret, read once at start),
    /// or nullopt after reporting at `f` that the `what` cannot be read. The content is never
    /// echoed in an error.
    std::optional<std::string> read_secret_file(const yaml_field& f, const std::string& path,
                                                std::string_view what) {
        std::ifstream in(path, std::ios::binary);
        if (!in) {
            w_.error(f, "cannot read " + std::string(what) + " '" + path + "'");
            return std::nullopt;
        }
        return std::string{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    }

    /// 32 raw bytes, or 64 hex digits with at most one trailing line break. The content is
    /// never echoed: it is a secret.
    void read_key_file(const yaml_field& f, encryption_key& k) {
        auto read = read_secret_file(f, k.file, "key file");
        if (!read) {
            return;
        }
        std::string text = std::move(*read);
        const auto file_size = text.size();
        if (file_size == 32) {
            k.bytes = std::move(text);
            return;
        }
        drop_line_break(text);
        if (text.size() == 64) {
            std::string bytes;
            for (std::size_t i = 0; i < 64; i += 2) {
                const int hi = hex_value(text[i]);
                const int lo = hex_value(text[i + 1]);
                if (hi < 0 || lo < 0) {
                    bytes.clear();
                    break;
                }
                bytes.push_back(static_cast<char>((hi << 4) | lo));
            }
            if (bytes.size() == 32) {
                k.bytes = std::move(bytes);
                return;
            }
        }
        w_.error(f, "key file '" + k.file + "' holds " + std::to_string(file_size) +
                        " bytes; expected 32 raw bytes or 64 hexadecimal digits (e.g. "
                        "openssl rand -hex 32)");
    }

    /// cluster: { nodes: [host:port, ...], tls: bool }, instead of url.
    void read_redis_cluster(const yaml_field& f, const yaml_field& url, redis_config& r) {
        if (!f.present() || !w_.mapping(f, {"nodes", "tls"})) {
            return;
        }
        if (url.present()) {
            w_.error(f, "set either url (one Redis) or cluster (a Redis Cluster), not both");
        }
        if (r.sentinel) {
            w_.error(f, "set either sentinel or cluster, not both");
        }
        set(r.cluster.tls, w_.boolean(w_.get(f, "tls")));
        const yaml_field nodes = w_.require(f, "nodes");
        auto list = w_.string_list(nodes);
        if (!list) {
            return;
        }
        if (list->empty()) {
            w_.error(nodes, "a cluster needs at least one node (host:port)");
            return;
        }
        for (std::size_t i = 0; i < list->size(); ++i) {
            const std::string& node = (*list)[i];
            if (auto why = cluster_node_error(node); !why.empty()) {
                w_.error(w_.item(nodes, i), "invalid cluster node '" + node + "': " + why);
            }
        }
        r.cluster.nodes = std::move(*list);
    }

    /// Why `node` is not "host:port" (an IPv6 host in brackets), or "" when it is.
    static std::string cluster_node_error(std::string_view node) {
        const auto colon = node.rfind(':');
        if (colon == std::string_view::npos) {
            return "expected host:port, e.g. 10.0.0.5:6379";
        }
        std::string_view host = node.substr(0, colon);
        const std::string_view port = node.substr(colon + 1);
        if (host.starts_with('[') && host.ends_with(']') && host.size() > 2) {
            host = host.substr(1, host.size() - 2);
        } else if (host.find(':') != std::string_view::npos) {
            return "an IPv6 address goes in brackets, e.g. [::1]:6379";
        }
        if (host.empty()) {
            return "missing host";
        }
        for (const char c : host) {
            const auto u = static_cast<unsigned char>(c);
            if (u <= 0x20 || u == 0x7f || c == '/' || c == '@' || c == '[' || c == ']') {
                return "the host holds a character not allowed in a host name";
            }
        }
        unsigned value = 0;
        auto [ptr, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
        if (port.empty() || ec != std::errc{} || ptr != port.data() + port.size() || value == 0 ||
            value > 65535) {
            return "port must be 1..65535";
        }
        return {};
    }

    /// key_prefix starts every store key of this proxy; services that share one Redis (or one
    /// records table) tell their keys apart (and purge them with SCAN MATCH prefix*) by it. It
    /// is written into keys and MATCH patterns as it is, so it must be visible text: no
    /// whitespace or control bytes. With `hash_tags` (Redis), `{` and `}` are refused because a
    /// Redis Cluster layout will put every key of one record under one hash tag, and a brace in
    /// the prefix would become (or break) that tag; a PostgreSQL key is plain text.
    void read_key_prefix(const yaml_field& f, std::string& key_prefix, bool hash_tags) {
        constexpr std::size_t max_key_prefix_bytes = 64;
        const auto text = w_.scalar(f, "a string");
        if (!text) {
            return;
        }
        if (text->empty()) {
            w_.error(f, "key_prefix is empty; every key needs a prefix, e.g. \"onceproxy:\"");
            return;
        }
        if (text->size() > max_key_prefix_bytes) {
            w_.error(f, "key_prefix is " + std::to_string(text->size()) + " bytes; at most " +
                            std::to_string(max_key_prefix_bytes) + " are allowed");
            return;
        }
        for (const char c : *text) {
            const auto u = static_cast<unsigned char>(c);
            if (u <= 0x20 || u == 0x7f) {
                w_.error(f, "key_prefix contains whitespace or a control character");
                return;
            }
            if (hash_tags && (c == '{' || c == '}')) {
                w_.error(f, "key_prefix contains '{' or '}', which are reserved for Redis "
                            "Cluster hash tags");
                return;
            }
        }
        key_prefix = *text;
    }

    /// username, password, password_file of `block` (store.redis, or its sentinel block):
    /// credentials as plain fields (no URL encoding). True when any of them is set.
    bool read_credentials(const yaml_field& block, std::string& username, std::string& password,
                          std::string& password_file) {
        const yaml_field user = w_.get(block, "username");
        set(username, w_.string(user));
        const bool any_password = read_password(block, password, password_file);
        if (user.present() && !any_password) {
            w_.error(user, "a username needs password or password_file");
        }
        return user.present() || any_password;
    }

    /// password, password_file of `block`: one or the other, never both. True when either is
    /// set.
    bool read_password(const yaml_field& block, std::string& password, std::string& password_file) {
        const yaml_field pass = w_.get(block, "password");
        const yaml_field pass_file = w_.get(block, "password_file");
        // Values are never echoed: they are secrets.
        if (pass.present()) {
            if (auto text = w_.scalar(pass, "a string")) {
                if (text->empty()) {
                    w_.error(pass, "the password is empty; omit the key for no password");
                }
                password = *text;
            }
        }
        if (auto path = w_.string(pass_file)) {
            if (pass.present()) {
                w_.error(pass_file, "set either password or password_file, not both");
            } else {
                read_password_file(pass_file, *path, password, password_file);
            }
        }
        return pass.present() || pass_file.present();
    }

    /// store.redis's credentials; the url may not carry credentials too.
    void read_redis_credentials(const yaml_field& redis, const yaml_field& url, redis_config& r) {
        const bool any = read_credentials(redis, r.username, r.password, r.password_file);
        if (url.present() && any) {
            const std::string_view u = r.url;
            const auto scheme_end = u.find("://");
            const auto authority =
                scheme_end == std::string_view::npos
                    ? std::string_view{}
                    : u.substr(scheme_end + 3, u.find('/', scheme_end + 3) - (scheme_end + 3));
            if (authority.find('@') != std::string_view::npos) {
                w_.error(url, "the url carries credentials and username/password/password_file "
                              "are set too; keep one of them");
            }
        }
    }

    /// A mounted Secret, read once at start (drop_line_break).
    void read_password_file(const yaml_field& f, const std::string& path, std::string& password,
                            std::string& password_file) {
        auto read = read_secret_file(f, path, "password_file");
        if (!read) {
            return;
        }
        std::string text = std::move(*read);
        drop_line_break(text);
        if (text.empty()) {
            w_.error(f, "password_file '" + path + "' is empty");
            return;
        }
        password = std::move(text);
        password_file = path;
    }

    std::optional<std::vector<std::string>> read_header_list(const yaml_field& f) {
        auto list = w_.string_list(f);
        if (!list) {
            return list;
        }
        for (std::size_t i = 0; i < list->size(); ++i) {
            if (!is_token((*list)[i])) {
                w_.error(w_.item(f, i), "invalid header name '" + (*list)[i] +
                                            "'; expected an HTTP token such as Content-Type");
            }
        }
        return list;
    }

    /// A list of methods, upper-cased. `guarded`: the list of idempotency.methods, where safe
    /// methods are refused (they are never guarded, SPEC §1).
    std::optional<std::vector<std::string>> read_methods(const yaml_field& f, bool guarded) {
        auto list = w_.string_list(f);
        if (!list) {
            return list;
        }
        if (guarded && list->empty()) {
            w_.error(f, "expected at least one method (set mode: off to guard nothing)");
        }
        for (std::size_t i = 0; i < list->size(); ++i) {
            std::string& m = (*list)[i];
            m = to_upper(m);
            const yaml_field item = w_.item(f, i);
            if (!is_token(m)) {
                w_.error(item, "invalid method '" + m + "'; expected an HTTP method such as POST");
            } else if (guarded && (m == "GET" || m == "HEAD" || m == "OPTIONS" || m == "TRACE")) {
                w_.error(item, "method " + m +
                                   " cannot be guarded: safe methods are always proxied as is; "
                                   "expected POST, PUT, PATCH or DELETE");
            }
        }
        return list;
    }

    std::optional<status_set> read_statuses(const yaml_field& f) {
        if (!f.present() || !w_.sequence(f)) {
            return std::nullopt;
        }
        status_set set;
        for (std::size_t i = 0; i < f.node.size(); ++i) {
            const yaml_field item = w_.item(f, i);
            const auto text = w_.scalar(item, "a status class like 2xx or a status code");
            if (!text) {
                continue;
            }
            if (text->size() == 3 && (*text)[0] >= '1' && (*text)[0] <= '5' &&
                ((*text)[1] == 'x' || (*text)[1] == 'X') &&
                ((*text)[2] == 'x' || (*text)[2] == 'X')) {
                const std::size_t base = static_cast<std::size_t>((*text)[0] - '0') * 100;
                for (std::size_t s = base; s < base + 100; ++s) {
                    set.set(s);
                }
                continue;
            }
            unsigned code = 0;
            const auto [ptr, ec] = std::from_chars(text->data(), text->data() + text->size(), code);
            if (ec != std::errc{} || ptr != text->data() + text->size() || code < 100 ||
                code > 599) {
                w_.error(item, "invalid status '" + *text +
                                   "'; expected a class 1xx..5xx or a code from 100 to 599");
                continue;
            }
            set.set(code);
        }
        return set;
    }

    /// A list of gRPC status codes: names (any case) or numbers 0..16.
    std::optional<grpc_status_set> read_grpc_statuses(const yaml_field& f) {
        if (!f.present() || !w_.sequence(f)) {
            return std::nullopt;
        }
        grpc_status_set set;
        for (std::size_t i = 0; i < f.node.size(); ++i) {
            const yaml_field item = w_.item(f, i);
            const auto text = w_.scalar(item, "a gRPC status name like UNAVAILABLE or a number");
            if (!text) {
                continue;
            }
            std::string upper = *text;
            std::transform(upper.begin(), upper.end(), upper.begin(), [](char c) {
                return static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
            });
            std::optional<std::size_t> code;
            for (std::size_t c = 0; c < grpc_status_names.size(); ++c) {
                if (upper == grpc_status_names[c]) {
                    code = c;
                }
            }
            std::size_t n = 0;
            const auto [ptr, ec] = std::from_chars(text->data(), text->data() + text->size(), n);
            if (!code && ec == std::errc{} && ptr == text->data() + text->size() &&
                n < grpc_status_names.size()) {
                code = n;
            }
            if (!code) {
                w_.error(item, "invalid gRPC status '" + *text +
                                   "'; expected a name like OK, UNAVAILABLE or "
                                   "DEADLINE_EXCEEDED, or a number from 0 to 16");
                continue;
            }
            set.set(*code);
        }
        return set;
    }

    idempotency_block read_idempotency(const yaml_field& f, block_marks& marks) {
        idempotency_block b;
        if (!w_.mapping(f, {"mode", "methods", "key", "scope", "fingerprint", "ttl", "lease",
                            "concurrent", "wait_timeout", "mismatch_status", "record", "release",
                            "on_upstream_uncertain", "on_store_error", "max_record_bytes",
                            "stripe_compat", "exclude_headers", "record_set_cookie", "grpc"})) {
            return b;
        }
        b.mode = w_.enumeration<idempotency_mode>(w_.get(f, "mode"),
                                                  {{"required", idempotency_mode::required},
                                                   {"optional", idempotency_mode::optional},
                                                   {"observe", idempotency_mode::observe},
                                                   {"off", idempotency_mode::off}});
        b.methods = read_methods(w_.get(f, "methods"), true);
        read_key(w_.get(f, "key"), b);
        const yaml_field scope = w_.get(f, "scope");
        if (scope.present() && w_.mapping(scope, {"headers", "principal"})) {
            b.scope_headers = read_header_list(w_.get(scope, "headers"));
            marks.principal = w_.get(scope, "principal");
            b.principal = w_.enumeration<principal_source>(
                marks.principal, {{"headers", principal_source::headers},
                                  {"client_cert", principal_source::client_cert}});
        }
        const yaml_field fp = w_.get(f, "fingerprint");
        if (fp.present() && w_.mapping(fp, {"headers", "json_canonical"})) {
            b.fingerprint_headers = read_header_list(w_.get(fp, "headers"));
            b.json_canonical = w_.boolean(w_.get(fp, "json_canonical"));
        }
        b.ttl = w_.positive_duration(w_.get(f, "ttl"));
        marks.lease = w_.get(f, "lease");
        b.lease = w_.positive_duration(marks.lease);
        b.concurrent = w_.enumeration<concurrent_policy>(
            w_.get(f, "concurrent"),
            {{"conflict", concurrent_policy::conflict}, {"wait", concurrent_policy::wait}});
        b.wait_timeout = w_.positive_duration(w_.get(f, "wait_timeout"));
        const yaml_field mismatch = w_.get(f, "mismatch_status");
        if (auto code = w_.integer(mismatch, 100, 599)) {
            if (*code == 409 || *code == 422) {
                b.mismatch_status = static_cast<unsigned>(*code);
            } else {
                w_.error(mismatch, "invalid mismatch_status " + std::to_string(*code) +
                                       "; expected 422 or 409");
            }
        }
        b.record = read_statuses(w_.get(f, "record"));
        b.release = read_statuses(w_.get(f, "release"));
        const yaml_field grpc = w_.get(f, "grpc");
        if (grpc.present() && w_.mapping(grpc, {"record", "release"})) {
            b.grpc_record = read_grpc_statuses(w_.get(grpc, "record"));
            b.grpc_release = read_grpc_statuses(w_.get(grpc, "release"));
        }
        b.on_upstream_uncertain = w_.enumeration<uncertain_policy>(
            w_.get(f, "on_upstream_uncertain"), {{"hold", uncertain_policy::hold},
                                                 {"release", uncertain_policy::release},
                                                 {"fail", uncertain_policy::fail}});
        b.on_store_error = w_.enumeration<store_error_policy>(
            w_.get(f, "on_store_error"), {{"fail_closed", store_error_policy::fail_closed},
                                          {"fail_open", store_error_policy::fail_open}});
        b.max_record_bytes = w_.positive_size(w_.get(f, "max_record_bytes"));
        b.stripe_compat = w_.boolean(w_.get(f, "stripe_compat"));
        b.exclude_headers = read_header_list(w_.get(f, "exclude_headers"));
        b.record_set_cookie = w_.boolean(w_.get(f, "record_set_cookie"));
        return b;
    }

    void read_key(const yaml_field& f, idempotency_block& b) {
        if (!f.present() ||
            !w_.mapping(f, {"header", "json_pointer", "max_length", "syntax", "forward"})) {
            return;
        }
        const yaml_field header = w_.get(f, "header");
        const yaml_field pointer = w_.get(f, "json_pointer");
        if (header.present() && pointer.present()) {
            w_.error(pointer, "key takes either 'header' or 'json_pointer', not both");
        }
        if (auto h = w_.string(header)) {
            if (is_token(*h)) {
                b.key_header = std::move(*h);
            } else {
                w_.error(header, "invalid header name '" + *h + "'; expected an HTTP token");
            }
        }
        if (auto p = w_.string(pointer)) {
            // RFC 6901: "/" separated tokens; "~" only as the escapes ~0 and ~1.
            bool ok = p->front() == '/';
            for (std::size_t i = 0; ok && i < p->size(); ++i) {
                if ((*p)[i] == '~') {
                    ok = i + 1 < p->size() && ((*p)[i + 1] == '0' || (*p)[i + 1] == '1');
                }
            }
            if (ok) {
                b.key_json_pointer = std::move(*p);
            } else {
                w_.error(pointer, "invalid JSON pointer '" + *p +
                                      "'; expected an RFC 6901 pointer such as /id or "
                                      "/data/object/id");
            }
        }
        if (auto n = w_.integer(w_.get(f, "max_length"), 1, 8192)) {
            b.key_max_length = static_cast<std::size_t>(*n);
        }
        b.key_syntax_value =
            w_.enumeration<key_syntax>(w_.get(f, "syntax"), {{"lenient", key_syntax::lenient},
                                                             {"strict", key_syntax::strict}});
        b.key_forward = w_.boolean(w_.get(f, "forward"));
    }

    void read_routes(const yaml_field& f, const idempotency_block& defaults,
                     const block_marks& defaults_marks, config& cfg) {
        if (!f.present() || !w_.sequence(f)) {
            return;
        }
        if (f.node.size() == 0) {
            w_.error(f, "expected at least one route");
        }
        std::map<std::string, int, std::less<>> names;
        for (std::size_t i = 0; i < f.node.size(); ++i) {
            const yaml_field rf = w_.item(f, i);
            if (!w_.mapping(rf, {"name", "match", "upstream", "limits", "idempotency"})) {
                continue;
            }
            route_config route;
            const yaml_field upstream = w_.require(rf, "upstream");
            const upstream_config* up = read_route_head(rf, upstream, names, cfg, route);
            block_marks marks;
            idempotency_block own;
            const yaml_field idem = w_.get(rf, "idempotency");
            if (idem.present()) {
                own = read_idempotency(idem, marks);
            }
            // The one merge step: route over defaults over built-ins.
            route.idempotency = resolve(merge(defaults, own));
            read_route_limits(w_.get(rf, "limits"), cfg.limits, route);
            if (up != nullptr) {
                check_lease(route, *up, marks, defaults_marks, upstream);
            }
            check_principal(route, cfg, marks, defaults_marks);
            check_grpc_route(route, up, upstream);
            cfg.routes.push_back(std::move(route));
        }
    }

    /// What every route has, inbound or egress: its name (unique among `names`), match and
    /// upstream (null when unknown).
    const upstream_config* read_route_head(const yaml_field& rf, const yaml_field& upstream,
                                           std::map<std::string, int, std::less<>>& names,
                                           const config& cfg, route_config& route) {
        const yaml_field name = w_.require(rf, "name");
        if (auto n = w_.string(name)) {
            route.name = *n;
            if (!is_name(*n)) {
                w_.error(name, "invalid route name '" + *n +
                                   "'; expected up to 64 letters, digits, '-', '_' or '.', "
                                   "starting with a letter or digit");
            } else if (const auto prev = names.find(*n); prev != names.end()) {
                w_.error(name, "duplicate route name '" + *n + "' (first used at line " +
                                   std::to_string(prev->second) + ")");
            } else {
                names.emplace(*n, yaml_walker::line_of(name.mark));
            }
        }
        read_match(w_.require(rf, "match"), route.match);
        const upstream_config* up = nullptr;
        if (auto u = w_.string(upstream)) {
            route.upstream = *u;
            const auto it = std::find_if(cfg.upstreams.begin(), cfg.upstreams.end(),
                                         [&](const upstream_config& c) { return c.name == *u; });
            if (it == cfg.upstreams.end()) {
                std::string known;
                for (const auto& c : cfg.upstreams) {
                    known += known.empty() ? "" : ", ";
                    known += c.name;
                }
                w_.error(upstream, "unknown upstream '" + *u + "'; defined upstreams: " +
                                       (known.empty() ? "(none)" : known));
            } else {
                route.upstream_index = static_cast<std::size_t>(it - cfg.upstreams.begin());
                up = &*it;
            }
        }
        return up;
    }

    /// A route's own body limits over the global ones. `none` lifts a limit; a route that
    /// guards requests buffers them (fingerprint, record), so it must keep both.
    void read_route_limits(const yaml_field& f, const limits_config& global, route_config& route) {
        route.limits.max_request_bytes = global.max_request_bytes;
        route.limits.max_response_bytes = global.max_response_bytes;
        if (!f.present() ||
            !w_.mapping(f, {"max_request_bytes", "max_response_bytes", "max_tunnels"})) {
            return;
        }
        if (auto n = w_.integer(w_.get(f, "max_tunnels"), 0, 1'000'000)) {
            route.limits.max_tunnels = static_cast<std::size_t>(*n);
        }
        const auto read = [&](const char* key, std::optional<std::size_t>& out) {
            const yaml_field v = w_.get(f, key);
            if (!v.present()) {
                return;
            }
            if (v.node.IsScalar() && v.node.Scalar() == "none") {
                if (route.idempotency.mode != idempotency_mode::off) {
                    w_.error(v, std::string(key) +
                                    ": none is only allowed on a route without idempotency; a "
                                    "guarded route buffers requests and responses, so it needs "
                                    "a size");
                    return;
                }
                out.reset();
                return;
            }
            if (auto n = w_.positive_size(v)) {
                out = *n;
            }
        };
        read("max_request_bytes", route.limits.max_request_bytes);
        read("max_response_bytes", route.limits.max_response_bytes);
        if (route.idempotency.mode != idempotency_mode::off && route.limits.max_request_bytes &&
            *route.limits.max_request_bytes > global.max_buffered_bytes) {
            w_.error(w_.get(f, "max_request_bytes"),
                     "max_request_bytes " + std::to_string(*route.limits.max_request_bytes) +
                         " of a guarded route is above limits.max_buffered_bytes " +
                         std::to_string(global.max_buffered_bytes) +
                         "; expected at most limits.max_buffered_bytes");
        }
    }

    // The lease must not be shorter than the upstream timeout. While the proxy lives it extends
    // the lease every lease/3, so a short lease never expires under a slow request; but the lease
    // is also the only bound when the proxy dies mid-request. Then nobody extends it, the
    // upstream may still be working on the request for up to `timeout`, and a lease that lapses
    // earlier lets a retry run concurrently with the first execution. Equal values are accepted
    // (the built-in defaults are both 30s): by the time the lease lapses the first attempt's
    // deadline has passed too.
    void check_lease(const route_config& route, const upstream_config& up, const block_marks& own,
                     const block_marks& defaults, const yaml_field& upstream_field) {
        const idempotency_config& idem = route.idempotency;
        if (idem.mode == idempotency_mode::off || idem.lease >= up.timeout) {
            return;
        }
        const yaml_field& blame = own.lease.present()        ? own.lease
                                  : defaults.lease.present() ? defaults.lease
                                                             : upstream_field;
        w_.error(blame, "lease " + format_duration(idem.lease) + " of route '" + route.name +
                            "' is shorter than the timeout " + format_duration(up.timeout) +
                            " of upstream '" + up.name +
                            "'; expected a lease at least as long as the upstream timeout, so "
                            "the key of a crashed proxy stays held until its request has ended");
    }

    // principal: client_cert scopes keys by the subject of a verified client certificate. Without
    // tls.client_ca_file no client is ever asked for one: every request would have the same
    // empty subject, and clients that scoping was meant to keep apart would share their keys.
    void check_principal(const route_config& route, const config& cfg, const block_marks& own,
                         const block_marks& defaults) {
        const idempotency_config& idem = route.idempotency;
        if (idem.mode == idempotency_mode::off || idem.principal != principal_source::client_cert ||
            (cfg.tls && !cfg.tls->client_ca_file.empty()) || (!cfg.tls && tls_present_)) {
            return; // a tls block that did not load has its own error already
        }
        if (!own.principal.present()) {
            if (defaults_principal_blamed_) {
                return; // one error for the defaults, not one per route inheriting them
            }
            defaults_principal_blamed_ = true;
        }
        w_.error(own.principal.present() ? own.principal : defaults.principal,
                 "principal client_cert on route '" + route.name +
                     "' needs tls.client_ca_file: without it no client certificate is asked "
                     "for, every request would share one empty principal, and clients would "
                     "see each other's keys");
    }

    void read_match(const yaml_field& f, route_match& match) {
        if (!f.present() || !w_.mapping(f, {"methods", "path", "prefix", "template", "path_params",
                                            "trailing_slash", "case", "grpc", "streaming"})) {
            return;
        }
        if (const yaml_field grpc = w_.get(f, "grpc"); grpc.present()) {
            read_grpc_match(f, grpc, match);
            return;
        }
        if (const yaml_field streaming = w_.get(f, "streaming"); streaming.present()) {
            w_.error(streaming, "streaming names gRPC methods: it needs a grpc match");
        }
        set(match.methods, read_methods(w_.get(f, "methods"), false));
        set(match.path_params,
            w_.enumeration<path_params_match>(w_.get(f, "path_params"),
                                              {{"guard", path_params_match::guard},
                                               {"refuse", path_params_match::refuse},
                                               {"literal", path_params_match::literal}}));
        set(match.trailing_slash,
            w_.enumeration<trailing_slash_match>(w_.get(f, "trailing_slash"),
                                                 {{"ignore", trailing_slash_match::ignore},
                                                  {"exact", trailing_slash_match::exact}}));
        set(match.letter_case,
            w_.enumeration<case_match>(w_.get(f, "case"), {{"insensitive", case_match::insensitive},
                                                           {"exact", case_match::exact}}));
        const yaml_field path = w_.get(f, "path");
        const yaml_field prefix = w_.get(f, "prefix");
        const yaml_field tmpl = w_.get(f, "template");
        const int count = int{path.present()} + int{prefix.present()} + int{tmpl.present()};
        if (count != 1) {
            w_.error(f, count == 0
                            ? "match needs one of path, prefix or template"
                            : "match takes exactly one of path, prefix or template, not several");
            return;
        }
        const yaml_field& chosen = path.present() ? path : prefix.present() ? prefix : tmpl;
        match.kind = path.present()     ? path_match_kind::exact
                     : prefix.present() ? path_match_kind::prefix
                                        : path_match_kind::pattern;
        const auto text = w_.string(chosen);
        if (!text) {
            return;
        }
        match.path = *text;
        if (text->front() != '/' || text->find_first_of("?# \t") != std::string::npos) {
            w_.error(chosen, "invalid path '" + *text +
                                 "'; expected an absolute path starting with / and without "
                                 "query, fragment or spaces");
            return;
        }
        if (match.kind == path_match_kind::pattern) {
            check_template(chosen, *text);
        }
    }

    /// `grpc: "pkg.Service/Method"` or `"pkg.Service/*"`, read as the path it stands for:
    /// POST only, compared byte for byte (gRPC paths are case-sensitive), no path parameters.
    void read_grpc_match(const yaml_field& f, const yaml_field& grpc, route_match& match) {
        for (const char* other :
             {"methods", "path", "prefix", "template", "path_params", "trailing_slash", "case"}) {
            if (const yaml_field o = w_.get(f, other); o.present()) {
                w_.error(o, std::string("a grpc match takes no '") + other +
                                "': a gRPC call is POST /package.Service/Method");
            }
        }
        const auto text = w_.string(grpc);
        if (!text) {
            return;
        }
        const auto slash = text->find('/');
        const auto service = std::string_view(*text).substr(0, slash);
        const auto method = slash == std::string::npos ? std::string_view()
                                                       : std::string_view(*text).substr(slash + 1);
        const auto valid_name = [](std::string_view n, bool dots) {
            return !n.empty() && std::all_of(n.begin(), n.end(), [&](char c) {
                return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_' ||
                       (dots && c == '.');
            });
        };
        if (!valid_name(service, true) || (method != "*" && !valid_name(method, false))) {
            w_.error(grpc, "invalid grpc match '" + *text +
                               "'; expected \"package.Service/Method\" or \"package.Service/*\"");
            return;
        }
        match.grpc = *text;
        match.methods = {"POST"};
        match.path_params = path_params_match::literal;
        match.trailing_slash = trailing_slash_match::exact;
        match.letter_case = case_match::exact;
        if (method == "*") {
            match.kind = path_match_kind::prefix;
            match.path = "/" + std::string(service) + "/";
        } else {
            match.kind = path_match_kind::exact;
            match.path = "/" + *text;
        }
        const yaml_field streaming = w_.get(f, "streaming");
        if (streaming.present() && w_.sequence(streaming)) {
            for (std::size_t i = 0; i < streaming.node.size(); ++i) {
                const yaml_field item = w_.item(streaming, i);
                if (auto m = w_.string(item)) {
                    if (!valid_name(*m, false)) {
                        w_.error(item, "invalid gRPC method name '" + *m +
                                           "'; expected the method alone, like Watch");
                        continue;
                    }
                    match.streaming.push_back(*m);
                }
            }
        }
        streaming_mark_ = streaming;
    }

    /// A gRPC route needs an HTTP/2 upstream, and a method it names explicitly cannot be one it
    /// also declares streaming while it guards: the route would guard nothing.
    void check_grpc_route(const route_config& route, const upstream_config* up,
                          const yaml_field& upstream_field) {
        if (route.match.grpc.empty()) {
            return;
        }
        if (up != nullptr && up->protocol == upstream_protocol::http1) {
            w_.error(upstream_field, "route '" + route.name +
                                         "' matches gRPC calls, which need "
                                         "HTTP/2: upstream '" +
                                         up->name +
                                         "' needs protocol h2c (http://) or h2 (https://)");
        }
        const auto slash = route.match.grpc.find('/');
        const auto method = std::string_view(route.match.grpc).substr(slash + 1);
        if (route.idempotency.mode != idempotency_mode::off && method != "*" &&
            std::find(route.match.streaming.begin(), route.match.streaming.end(), method) !=
                route.match.streaming.end()) {
            w_.error(streaming_mark_, "route '" + route.name + "' guards " + route.match.grpc +
                                          " and declares it streaming: a streaming call is "
                                          "never guarded; use a route without idempotency");
        }
    }

    void check_template(const yaml_field& f, const std::string& text) {
        std::set<std::string_view> params;
        for (const auto segment : split_segments(text)) {
            if (segment.find_first_of("{}") == std::string_view::npos) {
                continue;
            }
            const bool whole = segment.size() > 2 && segment.front() == '{' &&
                               segment.back() == '}' &&
                               is_identifier(segment.substr(1, segment.size() - 2));
            if (!whole) {
                w_.error(f, "invalid template segment '" + std::string{segment} +
                                "'; a parameter must be a whole segment {name} with name made "
                                "of letters, digits and _");
                return;
            }
            if (!params.insert(segment.substr(1, segment.size() - 2)).second) {
                w_.error(f, "template parameter " + std::string{segment} + " appears twice");
                return;
            }
        }
    }

    template <class T>
    static void set(T& out, std::optional<T> value) {
        if (value) {
            out = std::move(*value);
        }
    }

    yaml_walker w_;
    yaml_field admin_listen_mark_;
    yaml_field tls_listen_mark_;
    bool defaults_principal_blamed_ = false;
    bool tls_present_ = false; ///< a tls block is written (cfg.tls stays unset when it fails)
    yaml_field drain_timeout_mark_;
    bool drain_timeout_given_ = false;               ///< limits.drain_timeout is written
    std::vector<yaml_field> upstream_timeout_marks_; ///< one per upstream, in order
    yaml_field upstream_check_name_;
    yaml_field streaming_mark_; ///< the last route's match.streaming (check_grpc_route)
};

} // namespace

config read_config(const YAML::Node& root, const std::string& file,
                   std::vector<config_error>& errors) {
    reader r{file, errors};
    config cfg = r.read(root);
    cfg.source_file = file;
    return cfg;
}

} // namespace onceproxy::config
