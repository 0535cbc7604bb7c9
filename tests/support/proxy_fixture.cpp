#include "support/proxy_fixture.hpp"

#include "support/wait.hpp"

#include <signal.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace onceproxy::test {

namespace {

/// Waits for `path` to hold a complete line while `proc` runs; "" on exit or timeout.
std::string wait_for_port_file(process& proc, const std::string& path) {
    std::string text;
    eventually(
        [&] {
            text = read_file(path);
            // Both binaries write PATH.tmp then rename, so a non-empty file is complete.
            return !text.empty() || !proc.running();
        },
        start_timeout, std::chrono::milliseconds(10));
    return text;
}

[[noreturn]] void fail_start(const std::string& what, const process& proc) {
    throw std::runtime_error(what + " did not start within " +
                             std::to_string(start_timeout.count()) + " ms; its log:\n" +
                             proc.log());
}

void replace_all(std::string& text, const std::string& from, const std::string& to) {
    if (from.empty()) {
        return;
    }
    for (auto pos = text.find(from); pos != std::string::npos;
         pos = text.find(from, pos + to.size())) {
        text.replace(pos, from.size(), to);
    }
}

std::string percent_encode(const std::string& s) {
    static constexpr char hex[] = "0123456789ABCDEF";
    std::string out;
    for (const char c : s) {
        const auto u = static_cast<unsigned char>(c);
        const bool plain = (u >= '0' && u <= '9') || (u >= 'a' && u <= 'z') ||
                           (u >= 'A' && u <= 'Z') || u == '-' || u == '_' || u == '.' || u == '~';
        if (plain) {
            out += c;
        } else {
            out += '%';
            out += hex[u >> 4];
            out += hex[u & 0xf];
        }
    }
    return out;
}

/// The unsigned number after `"name":` in a flat JSON text; throws when absent.
std::uint64_t json_number(const std::string& json, const std::string& name) {
    const std::string needle = "\"" + name + "\":";
    const auto pos = json.find(needle);
    if (pos == std::string::npos) {
        throw std::runtime_error("no " + name + " in " + json);
    }
    return std::stoull(json.substr(pos + needle.size()));
}

} // namespace

upstream_process::upstream_process(int threads) {
    const auto port_file = dir.file("port");
    proc = process({TEST_UPSTREAM_BIN, "--listen", "127.0.0.1:0", "--port-file", port_file,
                    "--threads", std::to_string(threads)},
                   dir.file("upstream.log"));
    const auto text = wait_for_port_file(proc, port_file);
    if (text.empty()) {
        fail_start("onceproxy_test_upstream", proc);
    }
    port = static_cast<unsigned short>(std::stoul(text));
}

std::uint64_t upstream_process::count(const std::string& key) const {
    const auto r = fetch(port, "GET", "/__count?key=" + percent_encode(key));
    if (r.status != 200) {
        throw std::runtime_error("GET /__count answered " + std::to_string(r.status));
    }
    return json_number(r.body, "count");
}

std::uint64_t upstream_process::total() const {
    const auto r = fetch(port, "GET", "/__counts");
    if (r.status != 200) {
        throw std::runtime_error("GET /__counts answered " + std::to_string(r.status));
    }
    return json_number(r.body, "total");
}

std::vector<double> upstream_process::attempts(const std::string& key) const {
    const auto r = fetch(port, "GET", "/__attempts?key=" + percent_encode(key));
    if (r.status != 200) {
        throw std::runtime_error("GET /__attempts answered " + std::to_string(r.status));
    }
    // {"key":"...","at_ms":[1.5,2.25]}: the numbers after the last '['.
    std::vector<double> times;
    const auto open = r.body.rfind('[');
    const auto close = r.body.rfind(']');
    if (open == std::string::npos || close == std::string::npos || close < open) {
        throw std::runtime_error("no at_ms in " + r.body);
    }
    std::istringstream in(r.body.substr(open + 1, close - open - 1));
    double t = 0;
    while (in >> t) {
        times.push_back(t);
        char comma = 0;
        in >> comma;
    }
    return times;
}

void upstream_process::reset() const {
    const auto r = fetch(port, "POST", "/__reset");
    if (r.status != 204) {
        throw std::runtime_error("POST /__reset answered " + std::to_string(r.status));
    }
}

proxy_process::proxy_process(const std::string& yaml, unsigned short upstream_port,
                             const substitutions& extra, const std::vector<std::string>& launcher,
                             const std::vector<std::string>& args) {
    std::string text = yaml;
    replace_all(text, "{UPSTREAM_PORT}", std::to_string(upstream_port));
    for (const auto& [from, to] : extra) {
        replace_all(text, from, to);
    }
    config_file = dir.write("config.yaml", text);
    const auto port_file = dir.file("ports");
    std::vector<std::string> argv = launcher;
    argv.insert(argv.end(), {ONCEPROXY_BIN, "--config", config_file, "--port-file", port_file});
    argv.insert(argv.end(), args.begin(), args.end());
    proc = process(std::move(argv), dir.file("proxy.log"));
    const auto ports = wait_for_port_file(proc, port_file);
    if (ports.empty()) {
        fail_start("onceproxy (config:\n" + text + ")", proc);
    }
    // "LISTEN ADMIN [TLS]", then "egress PORT" when the config has an egress listener.
    std::istringstream in(ports);
    std::string line;
    std::getline(in, line);
    std::istringstream first(line);
    unsigned listen = 0;
    unsigned admin_listen = 0;
    unsigned tls_listen = 0;
    first >> listen >> admin_listen >> tls_listen;
    tls_port = static_cast<unsigned short>(tls_listen);
    port = static_cast<unsigned short>(listen);
    admin_port = static_cast<unsigned short>(admin_listen);
    while (std::getline(in, line)) {
        std::istringstream words(line);
        std::string name;
        unsigned value = 0;
        if (words >> name >> value && name == "egress") {
            egress_port = static_cast<unsigned short>(value);
        }
    }
}

int proxy_process::terminate(std::chrono::milliseconds timeout) {
    proc.signal(SIGTERM);
    return proc.wait(timeout);
}

http_response proxy_process::admin(const std::string& path) const {
    if (admin_port == 0) {
        throw std::runtime_error("the proxy has no admin listener");
    }
    return fetch(admin_port, "GET", path);
}

long long proxy_process::metric(const std::string& series) const {
    return metric_value(admin("/metrics").body, series);
}

std::pair<int, std::string> run_cli(const std::vector<std::string>& args) {
    temp_dir dir;
    std::vector<std::string> argv{ONCEPROXY_BIN};
    argv.insert(argv.end(), args.begin(), args.end());
    process p(argv, dir.file("out.log"));
    const int status = p.wait(std::chrono::seconds(20));
    return {status, p.log()};
}

long long metric_value(const std::string& text, const std::string& series) {
    const auto at = text.find("\n" + series + " ");
    if (at == std::string::npos) {
        return -1;
    }
    return std::stoll(text.substr(at + series.size() + 2));
}

std::string proxy_config::yaml() const {
    const std::string up =
        upstream_port == 0 ? std::string("{UPSTREAM_PORT}") : std::to_string(upstream_port);
    std::string y;
    y += "listen: 127.0.0.1:0\n";
    if (admin) {
        y += "admin:\n  listen: 127.0.0.1:0\n";
        for (const auto& l : admin_settings) {
            y += "  " + l + "\n";
        }
    }
    y += "workers: " + std::to_string(workers) + "\n";
    y += std::string("access_log: ") + (access_log ? "true" : "false") + "\n";
    // Tests stop their proxies with SIGTERM: no shutdown delay unless a test asks for one.
    y += "limits:\n";
    if (std::none_of(limits.begin(), limits.end(),
                     [](const std::string& l) { return l.rfind("shutdown_delay:", 0) == 0; })) {
        y += "  shutdown_delay: 0\n";
    }
    for (const auto& l : limits) {
        y += "  " + l + "\n";
    }
    y += "upstreams:\n  app:\n    url: http://127.0.0.1:" + up + "\n";
    for (const auto& s : upstream_settings) {
        y += "    " + s + "\n";
    }
    y += "store:\n";
    if (store.empty()) {
        y += "  type: memory\n";
    }
    for (const auto& s : store) {
        y += "  " + s + "\n";
    }
    if (ingress_routes) {
        y += "routes:\n";
        y += routes;
        if (!routes.empty() && routes.back() != '\n') {
            y += "\n";
        }
        if (catch_all) {
            y += "  - name: everything-else\n    match: { prefix: / }\n    upstream: app\n";
        }
    }
    y += top;
    if (!top.empty() && top.back() != '\n') {
        y += "\n";
    }
    return y;
}

std::string basic_config(unsigned short upstream_port, std::string extra_routes,
                         std::string extra_top) {
    proxy_config c;
    c.upstream_port = upstream_port;
    c.routes = std::move(extra_routes);
    c.top = std::move(extra_top);
    return c.yaml();
}

header_list idempotency_headers(const std::string& key, header_list extra) {
    header_list h{{"Idempotency-Key", key}, {"Content-Type", "application/json"}};
    h.insert(h.end(), extra.begin(), extra.end());
    return h;
}

http_response post_keyed_payment(unsigned short port, const std::string& path,
                                 const std::string& key, header_list extra) {
    return fetch(port, "POST", path, idempotency_headers(key, std::move(extra)),
                 keyed_payment_json);
}

std::string guarded_route(const std::string& name, const std::string& prefix,
                          const std::string& settings) {
    return "  - name: " + name + "\n    match: { prefix: " + prefix +
           " }\n    upstream: app\n    idempotency: { mode: required" +
           (settings.empty() ? "" : ", " + settings) + " }\n";
}

void wait_store_answering(const proxy_process& p, std::chrono::milliseconds bound) {
    const bool ready = eventually(
        [&] {
            const auto r = p.admin("/readyz");
            return r.status == 200 && r.body.find("store: answering") != std::string::npos;
        },
        bound);
    if (!ready) {
        throw std::runtime_error("/readyz did not report the store answering within " +
                                 std::to_string(bound.count()) + " ms; proxy log:\n" + p.log());
    }
}

} // namespace onceproxy::test
