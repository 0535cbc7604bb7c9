#include "support/postgres_server.hpp"

#include <dirent.h>
#include <pwd.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <stdexcept>

namespace onceproxy::test {

namespace {

const std::string bin_dir = POSTGRES_BIN_DIR;

/// The prefix that runs a command as the `postgres` user when we are root. setpriv execs the
/// command in place (runuser would fork and stay the parent), so signals to the process we
/// started reach the server itself; and the server is killed when the test process dies
/// without its destructor (a crash, CTest's timeout).
std::vector<std::string> as_postgres() {
    if (::geteuid() != 0) {
        return {};
    }
    return {SETPRIV_BIN,     "--reuid=postgres", "--regid=postgres",
            "--init-groups", "--pdeathsig=KILL", "--"};
}

/// Runs `argv` to its end (at most 60 s) with its output in `log`; throws unless it exits 0.
void run_to_end(const std::string& what, std::vector<std::string> argv, const std::string& log) {
    process p(std::move(argv), log);
    const int status = p.wait(std::chrono::seconds(60));
    if (status != 0) {
        throw std::runtime_error(what + " failed (status " + std::to_string(status) + "):\n" +
                                 p.log());
    }
}

/// The ids of the processes whose parent is `parent` (the server's backends).
std::vector<int> children_of(int parent) {
    std::vector<int> out;
    DIR* proc = ::opendir("/proc");
    if (proc == nullptr) {
        return out;
    }
    while (const dirent* e = ::readdir(proc)) {
        const std::string name = e->d_name;
        if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) {
            continue;
        }
        // /proc/PID/stat: "pid (comm) state ppid ...", comm may hold spaces: parse after ')'.
        const std::string stat = read_file("/proc/" + name + "/stat");
        const auto close = stat.rfind(')');
        if (close == std::string::npos) {
            continue;
        }
        int ppid = 0;
        char state = 0;
        if (std::sscanf(stat.c_str() + close + 1, " %c %d", &state, &ppid) == 2 && ppid == parent) {
            out.push_back(std::stoi(name));
        }
    }
    ::closedir(proc);
    return out;
}

/// True while `pid` exists and is not a zombie.
bool alive(int pid) {
    const std::string stat = read_file("/proc/" + std::to_string(pid) + "/stat");
    const auto close = stat.rfind(')');
    return close != std::string::npos && stat.size() > close + 2 && stat[close + 2] != 'Z';
}

} // namespace

postgres_server::postgres_server(postgres_server_options options)
    : options_(std::move(options)), port_(free_port()) {
    const std::string data = data_dir();
    if (::geteuid() == 0) {
        const passwd* pw = ::getpwnam("postgres");
        if (pw == nullptr) {
            throw std::runtime_error("no `postgres` user to run the PostgreSQL server as "
                                     "(scripts/install-deps.sh installs postgresql-15)");
        }
        // The server's user must reach its data directory inside our (0700) temporary one.
        ::chmod(dir_.path().c_str(), 0711);
        if (::mkdir(data.c_str(), 0700) != 0 ||
            ::chown(data.c_str(), pw->pw_uid, pw->pw_gid) != 0) {
            throw std::runtime_error("cannot create " + data + " for the postgres user");
        }
    }
    const std::string pwfile = dir_.write("superuser.pw", "postgres\n");
    ::chmod(pwfile.c_str(), 0644);
    auto initdb = as_postgres();
    initdb.insert(initdb.end(), {bin_dir + "/initdb", "-D", data, "-U", "postgres", "--pwfile",
                                 pwfile, "--auth-local=trust", "--auth-host=scram-sha-256", "-E",
                                 "UTF8", "--locale=C", "--no-sync", "--no-instructions"});
    run_to_end("initdb", initdb, dir_.file("initdb.log"));
    // The port is free when chosen, but another process may bind it before the server does.
    for (int attempt = 1; !launch(); ++attempt) {
        if (attempt == 5) {
            throw std::runtime_error("postgres found its port taken " + std::to_string(attempt) +
                                     " times:\n" + proc_.log());
        }
        port_ = free_port();
    }
    psql("CREATE ROLE " + user() + " LOGIN PASSWORD '" + password() + "'", "postgres");
    psql("CREATE DATABASE " + database() + " OWNER " + user(), "postgres");
}

postgres_server::~postgres_server() {
    kill();
}

std::string postgres_server::url() const {
    return "postgresql://" + user() + ":" + password() + "@127.0.0.1:" + std::to_string(port_) +
           "/" + database();
}

void postgres_server::start() {
    if (!launch()) {
        throw std::runtime_error("postgres cannot bind port " + std::to_string(port_) + ":\n" +
                                 proc_.log());
    }
}

bool postgres_server::launch() {
    auto argv = as_postgres();
    argv.insert(argv.end(), {bin_dir + "/postgres", "-D", data_dir(), "-p", std::to_string(port_),
                             "-k", data_dir(), "-c", "listen_addresses=127.0.0.1"});
    if (!options_.durable) {
        argv.insert(argv.end(), {"-c", "fsync=off", "-c", "synchronous_commit=off", "-c",
                                 "full_page_writes=off"});
    }
    for (const auto& s : options_.settings) {
        argv.insert(argv.end(), {"-c", s});
    }
    const auto log_before = read_file(dir_.file("postgres.log")).size();
    proc_ = process(argv, dir_.file("postgres.log"));
    // Through the server's own socket directory: on the TCP port, another server that took
    // the port would answer in its place.
    const std::vector<std::string> ready{bin_dir + "/pg_isready", "-q", "-h", data_dir(), "-p",
                                         std::to_string(port_)};
    const bool up = eventually(
        [&] {
            if (!proc_.running()) {
                return true;
            }
            process probe(ready, dir_.file("pg_isready.log"));
            return probe.wait(std::chrono::seconds(5)) == 0;
        },
        std::chrono::seconds(30), std::chrono::milliseconds(20));
    if (!proc_.running()) {
        const auto log = proc_.log();
        if (log.find("Address already in use", log_before) != std::string::npos) {
            return false;
        }
        throw std::runtime_error("postgres exited at start-up:\n" + log);
    }
    if (!up) {
        throw std::runtime_error("postgres did not accept connections within 30 s:\n" +
                                 proc_.log());
    }
    return true;
}

void postgres_server::stop() {
    if (!proc_.running()) {
        return;
    }
    proc_.signal(SIGINT);
    if (proc_.wait(std::chrono::seconds(10)) == -1) {
        kill();
    }
}

void postgres_server::kill() {
    if (!proc_.running()) {
        return;
    }
    // Backends end themselves when the postmaster dies, but not at once: kill them too, so a
    // restart finds no old process holding the shared memory, and clients see the loss now.
    const auto backends = children_of(proc_.pid());
    proc_.signal(SIGKILL);
    for (const int pid : backends) {
        ::kill(pid, SIGKILL);
    }
    proc_.wait(std::chrono::seconds(5));
    eventually(
        [&] {
            for (const int pid : backends) {
                if (alive(pid)) {
                    return false;
                }
            }
            return true;
        },
        std::chrono::seconds(5), std::chrono::milliseconds(5));
}

std::string postgres_server::psql(const std::string& sql, const std::string& db) const {
    // As an administrator: also on a server made read-only through its settings.
    const auto r =
        run_command({"env", "PGOPTIONS=-c default_transaction_read_only=off", bin_dir + "/psql",
                     "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1", "-h", data_dir(), "-p",
                     std::to_string(port_), "-U", "postgres", "-d", db, "-c", sql});
    if (r.status != 0) {
        throw std::runtime_error("psql failed: " + sql + "\n" + r.output);
    }
    return r.output;
}

} // namespace onceproxy::test
