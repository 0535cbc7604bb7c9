#include "app/cli.hpp"

#include "app/config_errors_log.hpp"
#include "app/runtime.hpp"
#include "onceproxy/config/load.hpp"

#include <charconv>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

// Both come from CMake (cmake/version.cmake); the fallbacks only serve builds outside it.
#ifndef ONCEPROXY_VERSION
#define ONCEPROXY_VERSION "dev"
#endif
#ifndef ONCEPROXY_COMMIT
#define ONCEPROXY_COMMIT "unknown"
#endif

namespace onceproxy::app {

namespace {

constexpr const char* usage =
    R"(usage: onceproxy [--config FILE] [--port-file PATH] [--watch-config SECONDS]
       onceproxy --check-config FILE...
       onceproxy --version | --help

A reverse proxy that makes retries safe: for the routes its YAML config guards, a request with
the same idempotency key takes effect at most once and every retry gets the first answer.

  --config FILE        configuration to serve with (default: conf/example.yaml)
  --check-config FILE  validate one or more files, print every error, and exit
  --port-file PATH     write "LISTEN_PORT ADMIN_PORT" to PATH once the listeners are bound
                       (then TLS_PORT when tls is configured)
  --watch-config SECONDS
                       check the config file every SECONDS (1 to 3600) and reload it when it
                       changed, as SIGHUP does (a ConfigMap update swaps a symlink); default off
  --version            print the version and the git commit it was built from
  --help               print this text
)";

/// --check-config: for a person at a terminal.
void print_errors(const config::config_errors& e) {
    for (const auto& err : e.errors()) {
        std::fprintf(stderr, "%s\n", err.to_string().c_str());
    }
    std::fprintf(stderr, "%zu error%s\n", e.errors().size(), e.errors().size() == 1 ? "" : "s");
}

} // namespace

int run_cli(int argc, char** argv) {
    std::string config_file = "conf/example.yaml";
    run_options opts;
    std::vector<std::string> check;
    bool checking = false;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        auto next = [&](const char* what) -> const char* {
            if (i + 1 >= argc) {
                std::fprintf(stderr, "onceproxy: %s needs a value\n%s", what, usage);
                return nullptr;
            }
            return argv[++i];
        };
        if (a == "--help" || a == "-h") {
            std::fputs(usage, stdout);
            return 0;
        } else if (a == "--version") {
            std::printf("onceproxy %s (commit %s)\n", ONCEPROXY_VERSION, ONCEPROXY_COMMIT);
            return 0;
        } else if (a == "--config" || a == "-c") {
            const char* v = next("--config");
            if (!v) {
                return 2;
            }
            config_file = v;
        } else if (a == "--port-file") {
            const char* v = next("--port-file");
            if (!v) {
                return 2;
            }
            opts.port_file = v;
        } else if (a == "--watch-config") {
            const char* v = next("--watch-config");
            if (!v) {
                return 2;
            }
            int seconds = 0;
            const std::string_view sv(v);
            const auto [end, ec] = std::from_chars(sv.data(), sv.data() + sv.size(), seconds);
            if (ec != std::errc{} || end != sv.data() + sv.size() || seconds < 1 ||
                seconds > 3600) {
                std::fprintf(stderr,
                             "onceproxy: --watch-config needs a number of seconds from 1 "
                             "to 3600, got '%s'\n",
                             v);
                return 2;
            }
            opts.watch_interval = std::chrono::seconds(seconds);
        } else if (a == "--check-config") {
            checking = true;
        } else if (checking && !a.starts_with("-")) {
            check.push_back(a);
        } else {
            std::fprintf(stderr, "onceproxy: unknown argument '%s'\n%s", a.c_str(), usage);
            return 2;
        }
    }
    if (checking) {
        if (check.empty()) {
            std::fprintf(stderr, "onceproxy: --check-config needs at least one file\n");
            return 2;
        }
        int status = 0;
        for (const auto& f : check) {
            try {
                config::load_file(f);
                std::printf("%s: ok\n", f.c_str());
            } catch (const config::config_errors& e) {
                print_errors(e);
                status = 1;
            }
        }
        return status;
    }
    std::shared_ptr<const config::config> cfg;
    try {
        cfg = config::load_file(config_file);
    } catch (const config::config_errors& e) {
        log_config_errors(e, "invalid configuration; not starting");
        return 1;
    }
    return run(cfg, opts);
}

} // namespace onceproxy::app
