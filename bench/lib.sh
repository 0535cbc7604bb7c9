# shellcheck shell=bash disable=SC2034  # variables are used by the sourcing scripts
# Shared by bench/run.sh and bench/memory.sh (sourced, not executed): process start-up on
# free loopback ports, bounded readiness waits, and a cleanup that kills everything started.
# Every server is bound to 127.0.0.1; every wait is bounded in time.

bench_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo_dir=$(cd "$bench_dir/.." && pwd)

# PIDs of everything this script started; cleanup kills exactly these.
started_pids=()
declare -A started_names=()
work_dir=""
keep_work_dir=0

log() { printf '[bench] %s\n' "$*" >&2; }
die() { printf '[bench] error: %s\n' "$*" >&2; exit 1; }

cleanup() {
    local pid
    for pid in "${started_pids[@]}"; do
        kill -TERM "$pid" 2>/dev/null || true
    done
    # Bounded wait (3 s), then SIGKILL whatever is left.
    local deadline=$((SECONDS + 3))
    for pid in "${started_pids[@]}"; do
        while kill -0 "$pid" 2>/dev/null && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.1; done
        kill -KILL "$pid" 2>/dev/null || true
    done
    if [ -n "$work_dir" ] && [ "$keep_work_dir" -eq 0 ]; then
        rm -rf "$work_dir"
    fi
}

# make_work_dir: a private temporary directory, removed on exit unless keep_work_dir=1.
make_work_dir() {
    work_dir=$(mktemp -d "${TMPDIR:-/tmp}/onceproxy-bench.XXXXXX")
    trap cleanup EXIT
    trap 'exit 130' INT TERM
}

# free_port: prints a loopback TCP port that was free a moment ago (for servers that cannot
# bind port 0 and report it: nginx, redis-server).
free_port() {
    python3 -c 'import socket
s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

# wait_file PATH PID WHAT: waits up to 10 s for PATH to exist while PID is alive.
wait_file() {
    local path=$1 pid=$2 what=$3 i
    for ((i = 0; i < 100; i++)); do
        [ -s "$path" ] && return 0
        kill -0 "$pid" 2>/dev/null || die "$what exited during start-up (see $work_dir/*.log)"
        sleep 0.1
    done
    die "$what did not start within 10 s"
}

# wait_tcp PORT PID WHAT: waits up to 10 s until 127.0.0.1:PORT accepts connections.
wait_tcp() {
    local port=$1 pid=$2 what=$3 i
    for ((i = 0; i < 100; i++)); do
        if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then return 0; fi
        kill -0 "$pid" 2>/dev/null || die "$what exited during start-up (see $work_dir/*.log)"
        sleep 0.1
    done
    die "$what did not listen on 127.0.0.1:$port within 10 s"
}

# find_binaries BUILD_DIR: sets onceproxy_bin and upstream_bin (release build expected).
find_binaries() {
    local build=$1
    onceproxy_bin="$build/src/onceproxy"
    upstream_bin="$build/tools/test_upstream/onceproxy_test_upstream"
    [ -x "$onceproxy_bin" ] || die "no $onceproxy_bin: build it (see bench/README.md)"
    [ -x "$upstream_bin" ] || die "no $upstream_bin: build it (see bench/README.md)"
    if [ -f "$build/CMakeCache.txt" ] &&
        ! grep -q '^CMAKE_BUILD_TYPE:[A-Z]*=Release' "$build/CMakeCache.txt"; then
        log "warning: $build is not a Release build: figures will not be representative"
    fi
}

# start_upstream THREADS: starts the test upstream; sets upstream_port.
start_upstream() {
    local threads=$1
    "$upstream_bin" --listen 127.0.0.1:0 --threads "$threads" \
        --port-file "$work_dir/upstream.port" >"$work_dir/upstream.log" 2>&1 &
    upstream_pid=$!
    started_pids+=("$!")
    started_names[$!]="the test upstream"
    wait_file "$work_dir/upstream.port" $! "test upstream"
    upstream_port=$(cat "$work_dir/upstream.port")
    wait_tcp "$upstream_port" $! "test upstream"
}

# start_redis: starts a private, non-persistent redis-server; sets redis_port and redis_pid.
start_redis() {
    command -v redis-server >/dev/null || die "redis-server is not installed (scripts/install-deps.sh)"
    redis_port=$(free_port)
    redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no \
        --dir "$work_dir" --logfile "$work_dir/redis.log" &
    redis_pid=$!
    started_pids+=("$!")
    started_names[$!]="redis-server"
    wait_tcp "$redis_port" $! "redis-server"
}

# write_proxy_config WORKERS STORE: writes $work_dir/onceproxy.yaml from the template
# ($redis_extra, when set, is added to the store.redis settings).
write_proxy_config() {
    local workers=$1 store=$2 store_block
    case "$store" in
    memory) store_block="{ type: memory, memory: { max_bytes: 2GiB } }" ;;
    redis) store_block="{ type: redis, redis: { url: \"redis://127.0.0.1:$redis_port/0\"${redis_extra:+, $redis_extra} } }" ;;
    *) die "unknown store '$store' (memory|redis)" ;;
    esac
    # A self-signed ECDSA P-256 certificate for the TLS rows (nginx serves the same pair).
    if [ ! -f "$work_dir/tls.crt" ]; then
        openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
            -subj /CN=localhost -addext subjectAltName=IP:127.0.0.1,DNS:localhost \
            -keyout "$work_dir/tls.key" -out "$work_dir/tls.crt" >/dev/null 2>&1 ||
            die "openssl could not make the bench certificate"
    fi
    if [ "${BENCH_ENCRYPT:-0}" = 1 ]; then
        # Encryption at rest with one key (a fixed one: the bench measures cost, not secrecy).
        printf '%064d\n' 0 | tr 0 7 >"$work_dir/bench.key"
        store_block="${store_block%\}}, encryption: { keys: [ { id: bench, file: $work_dir/bench.key } ] } }"
    fi
    sed -e "s|@WORKERS@|$workers|" -e "s|@UPSTREAM_PORT@|$upstream_port|" \
        -e "s|@STORE@|$store_block|" -e "s|@DIR@|$work_dir|g" \
        "$bench_dir/onceproxy.yaml.in" >"$work_dir/onceproxy.yaml"
}

# start_proxy: starts onceproxy on $work_dir/onceproxy.yaml; sets proxy_port, admin_port,
# proxy_tls_port, proxy_pid.
start_proxy() {
    "$onceproxy_bin" --config "$work_dir/onceproxy.yaml" --port-file "$work_dir/onceproxy.port" \
        >"$work_dir/onceproxy.log" 2>&1 &
    proxy_pid=$!
    started_pids+=("$proxy_pid")
    started_names[$proxy_pid]="onceproxy"
    wait_file "$work_dir/onceproxy.port" $proxy_pid "onceproxy"
    read -r proxy_port admin_port proxy_tls_port <"$work_dir/onceproxy.port"
    wait_tcp "$proxy_port" $proxy_pid "onceproxy"
}

# check_alive WHEN: exits non-zero (keeping the logs) when a started process has died.
check_alive() {
    local pid
    for pid in "${started_pids[@]}"; do
        if ! kill -0 "$pid" 2>/dev/null; then
            keep_work_dir=1
            tail -n 5 "$work_dir"/*.log >&2 2>/dev/null || true
            die "${started_names[$pid]:-process $pid} died $1; logs kept in $work_dir"
        fi
    done
}

# duration_seconds TEXT: "10", "10s", "2m" -> seconds.
duration_seconds() {
    case "$1" in
    *[!0-9smh]* | "") die "bad duration '$1'" ;;
    *m) echo $((${1%m} * 60)) ;;
    *h) echo $((${1%h} * 3600)) ;;
    *s) echo "${1%s}" ;;
    *) echo "$1" ;;
    esac
}
