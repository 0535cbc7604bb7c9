#include "app/cli.hpp"

#include "app/config_errors_log.hpp"
#include "app/key_admin.hpp"
#include "app/runtime.hpp"
#include "app/store_factory.hpp"
#include "onceproxy/config/load.hpp"
#include "onceproxy/store/error.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

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
       onceproxy keys inspect|purge --config FILE --route R --key K [--principal P]... [--force]
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

keys inspect|purge: look up or delete the record of one idempotency key in the configured Redis
store, as the admin API's /admin/v1/keys does (README "Key administration"); prints JSON.
  --route R            the route name        --key K   the idempotency key as the client sends it
  --principal P        a scope header value ("Authorization: Bearer x", or a bare value of the
                       route's first scope header; on a scope.principal: client_cert route, a
                       bare value is the certificate subject, "CN=billing,O=acme"); repeat for
                       several; none: anonymous
  --force              purge: delete a lease in flight too, fencing its owner
The memory store lives inside the proxy process: reach it through the admin API instead.
)";

/// --check-config: for a person at a terminal.
void print_errors(const config::config_errors& e) {
    for (const auto& err : e.errors()) {
        std::fprintf(stderr, "%s\n", err.to_string().c_str());
    }
    std::fprintf(stderr, "%zu error%s\n", e.errors().size(), e.errors().size() == 1 ? "" : "s");
}

/// `onceproxy keys inspect|purge ...`: argv[1] is "keys".
int run_keys(int argc, char** argv) {
    if (argc < 3 || (std::strcmp(argv[2], "inspect") != 0 && std::strcmp(argv[2], "purge") != 0)) {
        std::fprintf(stderr, "onceproxy keys: give inspect or purge\n%s", usage);
        return 2;
    }
    const bool purge = std::strcmp(argv[2], "purge") == 0;
    std::string config_file;
    key_address address;
    bool force = false;
    for (int i = 3; i < argc; ++i) {
        const std::string a = argv[i];
        const auto value = [&](std::string& into) {
            if (i + 1 >= argc) {
                std::fprintf(stderr, "onceproxy keys: %s needs a value\n", a.c_str());
                return false;
            }
            into = argv[++i];
            return true;
        };
        bool ok = true;
        if (a == "--config" || a == "-c") {
            ok = value(config_file);
        } else if (a == "--route") {
            ok = value(address.route);
        } else if (a == "--key") {
            ok = value(address.key);
        } else if (a == "--principal") {
            ok = value(address.principal.emplace_back());
        } else if (a == "--force" && purge) {
            force = true;
        } else {
            std::fprintf(stderr, "onceproxy keys: unknown argument '%s'\n%s", a.c_str(), usage);
            return 2;
        }
        if (!ok) {
            return 2;
        }
    }
    if (config_file.empty()) {
        std::fprintf(stderr, "onceproxy keys: --config FILE is required\n");
        return 2;
    }
    std::shared_ptr<const config::config> cfg;
    try {
        cfg = config::load_file(config_file);
    } catch (const config::config_errors& e) {
        print_errors(e);
        return 1;
    }
    auto resolved = resolve_key(*cfg, address);
    if (auto* why = std::get_if<std::string>(&resolved)) {
        std::fprintf(stderr, "onceproxy keys: %s\n", why->c_str());
        return 2;
    }
    const auto& k = std::get<resolved_key>(resolved);
    if (cfg->store.type == config::store_type::memory) {
        std::fprintf(stderr,
                     "onceproxy keys: %s uses the memory store, which lives inside the running "
                     "proxy process: this command cannot reach it. Use the admin API "
                     "(admin.keys_api: GET or DELETE /admin/v1/keys) instead.\n",
                     config_file.c_str());
        return 2;
    }
    boost::asio::io_context ioc;
    std::shared_ptr<store::store> st;
    try {
        st = make_store(*cfg, {ioc.get_executor()});
    } catch (const std::exception& e) {
        std::fprintf(stderr, "onceproxy keys: %s\n", e.what());
        return 1;
    }
    int status = 1;
    bool finished = false;
    // The store's connection comes up in the background once opened: until it is there an
    // operation fails with errc::unavailable (nothing was sent), so it is tried again, bounded
    // by the connect timeout.
    auto with_connection = [&](auto op) -> decltype(op()) {
        const auto connect_timeout = cfg->store.type == config::store_type::postgres
                                         ? cfg->store.postgres.connect_timeout
                                         : cfg->store.redis.connect_timeout;
        const auto until =
            std::chrono::steady_clock::now() + connect_timeout + std::chrono::seconds(1);
        boost::asio::steady_timer pause(ioc);
        for (;;) {
            auto r = co_await op();
            if (r || r.error() != store::errc::unavailable ||
                std::chrono::steady_clock::now() >= until) {
                co_return r;
            }
            pause.expires_after(std::chrono::milliseconds(20));
            co_await pause.async_wait(boost::asio::use_awaitable);
        }
    };
    auto work = [&]() -> boost::asio::awaitable<void> {
        auto opened = co_await st->async_open();
        if (opened.ec || opened.degraded) {
            std::fprintf(stderr, "onceproxy keys: cannot use the store: %s\n",
                         (opened.message.empty() ? opened.ec.message() : opened.message).c_str());
        } else if (!purge) {
            auto r = co_await with_connection([&] { return st->async_inspect(k.store_key); });
            if (!r) {
                std::fprintf(stderr, "onceproxy keys: inspect failed: %s\n",
                             r.error().message().c_str());
            } else {
                std::printf("%s\n", describe_key(k, *r, std::chrono::system_clock::now(),
                                                 cfg->store.encryption)
                                        .c_str());
                status = 0;
            }
        } else {
            auto r = co_await with_connection([&] { return st->async_purge(k.store_key, force); });
            if (!r) {
                std::fprintf(stderr, "onceproxy keys: purge failed: %s\n",
                             r.error().message().c_str());
            } else {
                note_purge(k, *r, "cli", nullptr);
                std::printf("%s\n", describe_purge(k, *r, force).c_str());
                if (*r == store::purge_status::in_flight) {
                    std::fprintf(stderr,
                                 "onceproxy keys: a request with this key is in flight; not "
                                 "purged (--force deletes its lease and fences its owner)\n");
                } else {
                    status = 0;
                }
            }
        }
        st->close();
        finished = true;
    };
    boost::asio::co_spawn(ioc, work(), boost::asio::detached);
    // Bounded: the store's own connect and command timeouts end every step well before.
    ioc.run_for(cfg->store.redis.connect_timeout + cfg->store.redis.command_timeout * 2 +
                std::chrono::seconds(5));
    if (!finished) {
        st->close();
        ioc.run_for(std::chrono::seconds(2)); // let the connections wind down
        std::fprintf(stderr, "onceproxy keys: the store did not answer in time\n");
        return 1;
    }
    return status;
}

} // namespace

int run_cli(int argc, char** argv) {
    if (argc >= 2 && std::strcmp(argv[1], "keys") == 0) {
        return run_keys(argc, argv);
    }
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
