# shellcheck shell=bash disable=SC2034  # variables are used by the sourcing scripts
# Shared by bench/run.sh and bench/memory.sh (sourced, not executed): process start-up on
# free loopback ports, bounded readiness waits, and a cleanup that kills everything started.
# Every server is bound to 127.0.0.1; every wait is bounded in time.

bench_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo_dir=$(cd "$bench_dir/.." && pwd)

# PIDs of everything this script started; cleanup kills exactly these.
started_pids=()
declare -A started_names=()
# The signal that stops a started process, where it is not TERM.
declare -A started_stop_signals=()
work_dir=""
keep_work_dir=0

log() { printf '[bench] %s\n' "$*" >&2; }
die() { printf '[bench] error: %s\n' "$*" >&2; exit 1; }

cleanup() {
    local pid
    for pid in "${started_pids[@]}"; do
        kill "-${started_stop_signals[$pid]:-TERM}" "$pid" 2>/dev/null || true
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

# find_binaries BUILD_DIR: sets onceproxy_bin and upstream_bin (release build expected), and
# grpc_load_bin (the gRPC load generator, built by Release builds only; checked where used).
find_binaries() {
    local build=$1
    onceproxy_bin="$build/src/onceproxy"
    upstream_bin="$build/tools/test_upstream/onceproxy_test_upstream"
    grpc_load_bin="$build/bench/onceproxy_grpc_load"
    syscall_cost_bin="$build/bench/onceproxy_syscall_cost"
    floor_bin="$build/bench/onceproxy_floor_proxy"
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

# start_floor_as NAME WHAT [ARG...]: starts floor_proxy.cpp in front of the test upstream with
# ARG (its log and port file NAME.*, WHAT in messages); sets started_floor_pid and
# started_floor_port.
start_floor_as() {
    local name=$1 what=$2
    shift 2
    "$floor_bin" --upstream "$upstream_port" "$@" --port-file "$work_dir/$name.port" \
        >"$work_dir/$name.log" 2>&1 &
    started_floor_pid=$!
    started_pids+=("$started_floor_pid")
    started_names[$started_floor_pid]=$what
    wait_file "$work_dir/$name.port" $started_floor_pid "$what"
    started_floor_port=$(cat "$work_dir/$name.port")
    wait_tcp "$started_floor_port" $started_floor_pid "$what"
}

# start_floor: the floor row's byte relay; sets floor_port and floor_pid.
start_floor() {
    start_floor_as floor "the floor relay"
    floor_pid=$started_floor_pid
    floor_port=$started_floor_port
}

# start_floor_first: the floor of a first execution (the relay plus the hashes, the claim and
# the record through the Redis of start_redis); sets floor_first_port and floor_first_pid.
start_floor_first() {
    start_floor_as floor-first "the first execution's floor" --redis "$redis_port"
    floor_first_pid=$started_floor_pid
    floor_first_port=$started_floor_port
}

# write_grpc_files: the gRPC rows' fixed bytes. The answer the h2c upstream nginx gives every
# unary call ($work_dir/grpc-answer.bin: a small protobuf-shaped message of 33 bytes behind
# its 5-byte gRPC prefix), and the request body h2load sends ($work_dir/grpc-request.bin: one
# message of $grpc_message_bytes bytes, the bytes onceproxy_grpc_load and grpc_check.py send).
write_grpc_files() {
    python3 -c 'import struct, sys
msg = b"\x0a\x0bex-grpc-up1\x10\x01\x1a\x10" + b"0123456789abcdef"
sys.stdout.buffer.write(b"\0" + struct.pack(">I", len(msg)) + msg)' >"$work_dir/grpc-answer.bin"
    python3 -c 'import struct, sys
n = int(sys.argv[1])
msg = bytes(ord("a") + i % 26 for i in range(n))
sys.stdout.buffer.write(b"\0" + struct.pack(">I", n) + msg)' "${grpc_message_bytes:-64}" \
        >"$work_dir/grpc-request.bin"
}

# start_h2c_upstream PORT WORKERS: starts the h2c upstream nginx (nginx-h2c-upstream.conf.in)
# on 127.0.0.1:PORT with WORKERS worker processes; sets h2c_upstream_pid.
start_h2c_upstream() {
    local port=$1 workers=$2 user_line=""
    local echo_module=/usr/lib/nginx/modules/ngx_http_echo_module.so
    [ -f "$echo_module" ] ||
        die "no $echo_module (libnginx-mod-http-echo, which nginx-light depends on; scripts/install-deps.sh)"
    # As root, nginx workers would switch to `nobody`, which cannot enter the private work dir.
    [ "$(id -u)" -eq 0 ] && user_line="user root root;"
    sed -e "s|@USER@|$user_line|" -e "s|@WORKERS@|$workers|" -e "s|@DIR@|$work_dir|g" \
        -e "s|@PORT@|$port|" -e "s|@ECHO_MODULE@|$echo_module|" "$bench_dir/nginx-h2c-upstream.conf.in" >"$work_dir/nginx-h2c-upstream.conf"
    nginx -c "$work_dir/nginx-h2c-upstream.conf" -p "$work_dir" \
        -e "$work_dir/nginx-h2c-upstream-error.log" >"$work_dir/nginx-h2c-upstream.log" 2>&1 &
    h2c_upstream_pid=$!
    started_pids+=("$h2c_upstream_pid")
    started_names[$h2c_upstream_pid]="the h2c upstream nginx"
    wait_tcp "$port" $h2c_upstream_pid "the h2c upstream nginx"
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

# start_postgres [NAME=VALUE...]: a private PostgreSQL 15 cluster (Debian's postgresql-15;
# BENCH_POSTGRES_BIN for another bin directory) initdb'd into $work_dir/pg and started on a free
# loopback port, its socket in the same folder. As root, initdb and the server run as the
# `postgres` user (PostgreSQL refuses root): setpriv execs in place, so the process started is
# the postmaster, whose children are the backends and auxiliary processes (its CPU time counts
# them all), and it is killed if this script dies without its cleanup. The server's settings
# are its defaults (fsync, synchronous_commit and full_page_writes on: what users run) but the
# NAME=VALUE given (each passed as -c), trust authentication on 127.0.0.1 only. Sets
# postgres_bin, postgres_port, postgres_pid and postgres_pids (the postmasters started).
start_postgres() {
    postgres_bin=${BENCH_POSTGRES_BIN:-/usr/lib/postgresql/15/bin}
    postgres_as_user=()
    postgres_pids=()
    [ -x "$postgres_bin/postgres" ] ||
        die "no $postgres_bin/postgres: postgresql-15 is not installed (scripts/install-deps.sh)"
    if [ "$(id -u)" -eq 0 ]; then
        id postgres >/dev/null 2>&1 || die "no postgres user to run the PostgreSQL server as (postgresql-15)"
        command -v setpriv >/dev/null || die "setpriv is not installed (util-linux)"
        chmod 0711 "$work_dir" # the server's user reaches its data folders, lists nothing else
        postgres_as_user=(setpriv --reuid=postgres --regid=postgres --init-groups --pdeathsig=KILL --)
    fi
    postgres_data_dir pg
    # --no-sync: initdb's own files only; the server then runs with fsync on.
    if ! "${postgres_as_user[@]}" "$postgres_bin/initdb" -D "$work_dir/pg" -U postgres \
        --auth=trust -E UTF8 --locale=C --no-sync >"$work_dir/initdb.log" 2>&1; then
        keep_work_dir=1
        die "initdb failed (see $work_dir/initdb.log)"
    fi
    start_postgres_server pg "$@"
    postgres_port=$started_postgres_port
    postgres_pid=$started_postgres_pid
}

# start_postgres_standby [NAME=VALUE...]: a synchronous standby of the server of start_postgres
# (pg_basebackup -R into $work_dir/pg-standby, started on a free loopback port with
# cluster_name=standby), then synchronous_standby_names = 'standby' on the primary; waits up to
# 20 s until the primary reports it as `sync`. From then on every commit on the primary waits
# for the standby's WAL flush too (synchronous_commit = on). Sets standby_port.
start_postgres_standby() {
    local i state
    postgres_data_dir pg-standby
    if ! "${postgres_as_user[@]}" "$postgres_bin/pg_basebackup" -h 127.0.0.1 -p "$postgres_port" \
        -U postgres -D "$work_dir/pg-standby" -R -X stream --no-sync \
        >"$work_dir/pg_basebackup.log" 2>&1; then
        keep_work_dir=1
        die "pg_basebackup failed (see $work_dir/pg_basebackup.log)"
    fi
    start_postgres_server pg-standby cluster_name=standby "$@"
    standby_port=$started_postgres_port
    if ! psql_bench "ALTER SYSTEM SET synchronous_standby_names = 'standby'" >/dev/null ||
        ! psql_bench "SELECT pg_reload_conf()" >/dev/null; then
        die "cannot make the standby synchronous"
    fi
    for ((i = 0; i < 200; i++)); do
        state=$(psql_bench "SELECT sync_state FROM pg_stat_replication WHERE application_name = 'standby'" || true)
        [ "$state" = sync ] && return 0
        sleep 0.1
    done
    die "the standby did not become synchronous within 20 s (state '${state:-none}')"
}

# postgres_data_dir NAME: an empty $work_dir/NAME (0700) that the server's user owns.
postgres_data_dir() {
    mkdir -m 0700 "$work_dir/$1"
    [ "$(id -u)" -ne 0 ] || chown postgres:postgres "$work_dir/$1"
}

# start_postgres_server NAME [NAME=VALUE...]: starts the server of $work_dir/NAME on a free
# loopback port (log NAME.log) and waits up to 10 s until it accepts connections; sets
# started_postgres_port and started_postgres_pid, and adds the pid to postgres_pids.
start_postgres_server() {
    local name=$1 port settings=() s i pid
    shift
    for s in "$@"; do settings+=(-c "$s"); done
    port=$(free_port)
    "${postgres_as_user[@]}" "$postgres_bin/postgres" -D "$work_dir/$name" -p "$port" \
        -k "$work_dir/$name" -c listen_addresses=127.0.0.1 "${settings[@]}" \
        >"$work_dir/$name.log" 2>&1 &
    pid=$!
    started_pids+=("$pid")
    started_names[$pid]="postgres ($name)"
    # Its fast shutdown: TERM would wait for the onceproxies' sessions to end.
    started_stop_signals[$pid]=INT
    postgres_pids+=("$pid")
    for ((i = 0; i < 100; i++)); do
        if "$postgres_bin/pg_isready" -q -h 127.0.0.1 -p "$port"; then
            started_postgres_port=$port
            started_postgres_pid=$pid
            return 0
        fi
        kill -0 "$pid" 2>/dev/null || die "postgres ($name) exited during start-up (see $work_dir/$name.log)"
        sleep 0.1
    done
    die "postgres ($name) did not accept connections on 127.0.0.1:$port within 10 s"
}

# psql_bench SQL: runs SQL on the bench's PostgreSQL server, unaligned tuples only.
psql_bench() {
    "$postgres_bin/psql" -X -q -A -t -h 127.0.0.1 -p "$postgres_port" -U postgres -d postgres \
        -v ON_ERROR_STOP=1 -c "$1"
}

# start_redis_cluster MASTERS TAG: starts a private Redis Cluster of MASTERS cluster-enabled,
# non-persistent redis-servers without replicas (slots split evenly, config epochs 1..MASTERS,
# joined with CLUSTER MEET) and waits up to 20 s until every node reports cluster_state:ok and
# knows all the others. Sets cluster_pids, cluster_nodes ("127.0.0.1:P1,127.0.0.1:P2,...") and
# cluster_ports. TAG names the logs ($work_dir/cluster<TAG>-<i>.log).
start_redis_cluster() {
    local masters=$1 tag=$2 i port bus dir from to first
    command -v redis-server >/dev/null || die "redis-server is not installed (scripts/install-deps.sh)"
    command -v redis-cli >/dev/null || die "redis-cli is not installed (scripts/install-deps.sh)"
    cluster_ports=()
    cluster_pids=()
    local bus_ports=()
    for ((i = 0; i < masters; i++)); do
        port=$(free_port)
        bus=$(free_port)
        while [ "$bus" = "$port" ]; do bus=$(free_port); done
        dir="$work_dir/cluster$tag-$i"
        mkdir -p "$dir"
        # The bus port is given: the default (port + 10000) may be taken, or past 65535.
        redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$dir" \
            --logfile "$work_dir/cluster$tag-$i.log" --cluster-enabled yes \
            --cluster-config-file nodes.conf --cluster-port "$bus" --cluster-node-timeout 5000 &
        started_pids+=("$!")
        cluster_pids+=("$!")
        started_names[$!]="redis-server (cluster $tag, node $i)"
        wait_tcp "$port" $! "redis-server (cluster $tag, node $i)"
        cluster_ports+=("$port")
        bus_ports+=("$bus")
    done
    ccli() { timeout 10 redis-cli -h 127.0.0.1 -p "$@"; }
    for ((i = 0; i < masters; i++)); do
        from=$((i * 16384 / masters))
        to=$(((i + 1) * 16384 / masters - 1))
        [ "$(ccli "${cluster_ports[i]}" CLUSTER ADDSLOTSRANGE "$from" "$to")" = OK ] ||
            die "cluster $tag: CLUSTER ADDSLOTSRANGE $from $to failed on node $i"
        [ "$(ccli "${cluster_ports[i]}" CLUSTER SET-CONFIG-EPOCH $((i + 1)))" = OK ] ||
            die "cluster $tag: CLUSTER SET-CONFIG-EPOCH failed on node $i"
    done
    first=${cluster_ports[0]}
    for ((i = 1; i < masters; i++)); do
        [ "$(ccli "$first" CLUSTER MEET 127.0.0.1 "${cluster_ports[i]}" "${bus_ports[i]}")" = OK ] ||
            die "cluster $tag: CLUSTER MEET of node $i failed"
    done
    local deadline=$((SECONDS + 20)) ok info
    while :; do
        ok=1
        for port in "${cluster_ports[@]}"; do
            info=$(ccli "$port" CLUSTER INFO | tr -d '\r' || true)
            grep -qx 'cluster_state:ok' <<<"$info" && grep -qx "cluster_known_nodes:$masters" <<<"$info" ||
                ok=0
        done
        [ "$ok" -eq 1 ] && break
        [ "$SECONDS" -lt "$deadline" ] || die "cluster $tag ($masters masters) not ready within 20 s"
        sleep 0.2
    done
    cluster_nodes=$(printf '127.0.0.1:%s,' "${cluster_ports[@]}")
    cluster_nodes=${cluster_nodes%,}
}

# write_proxy_config WORKERS STORE [NAME]: writes $work_dir/NAME.yaml (default onceproxy) from
# the template ($redis_extra, when set, is added to the store.redis settings, $postgres_extra to
# store.postgres; $proxy_ttl, when set, is defaults.ttl, else 1h). STORE is memory, redis (the redis-server of start_redis), cluster (the nodes
# of the last start_redis_cluster) or postgres (the server of start_postgres).
write_proxy_config() {
    local workers=$1 store=$2 name=${3:-onceproxy} store_block nodes=() node_list
    case "$store" in
    # Every bench request comes from one holder (127.0.0.1, no scope header): it may fill the
    # whole store, not the default sixteenth of it (the first rows of a long run were refused).
    memory) store_block="{ type: memory, memory: { max_bytes: 2GiB, max_bytes_per_holder: 2GiB } }" ;;
    redis) store_block="{ type: redis, redis: { url: \"redis://127.0.0.1:$redis_port/0\"${redis_extra:+, $redis_extra} } }" ;;
    cluster)
        IFS=, read -r -a nodes <<<"$cluster_nodes"
        node_list=$(printf '"%s", ' "${nodes[@]}")
        store_block="{ type: redis, redis: { cluster: { nodes: [ ${node_list%, } ] }${redis_extra:+, $redis_extra} } }" ;;
    postgres) store_block="{ type: postgres, postgres: { url: \"postgresql://postgres@127.0.0.1:$postgres_port/postgres\"${postgres_extra:+, $postgres_extra} } }" ;;
    *) die "unknown store '$store' (memory|redis|cluster|postgres)" ;;
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
    # The h2c route's upstream: the h2c upstream nginx where run.sh starts one, else a port
    # nobody listens on (the route is not used then).
    sed -e "s|@WORKERS@|$workers|" -e "s|@UPSTREAM_PORT@|$upstream_port|" \
        -e "s|@H2C_UPSTREAM_PORT@|${h2c_upstream_port:-$(free_port)}|" \
        -e "s|@STORE@|$store_block|" -e "s|@DIR@|$work_dir|g" -e "s|@TTL@|${proxy_ttl:-1h}|" \
        "$bench_dir/onceproxy.yaml.in" >"$work_dir/$name.yaml"
}

# start_proxy_as NAME: starts onceproxy on $work_dir/NAME.yaml (log NAME.log); sets
# started_proxy_pid, started_proxy_port, started_admin_port, started_tls_port.
start_proxy_as() {
    local name=$1
    "$onceproxy_bin" --config "$work_dir/$name.yaml" --port-file "$work_dir/$name.port" \
        >"$work_dir/$name.log" 2>&1 &
    started_proxy_pid=$!
    started_pids+=("$started_proxy_pid")
    started_names[$started_proxy_pid]="$name"
    wait_file "$work_dir/$name.port" $started_proxy_pid "$name"
    read -r started_proxy_port started_admin_port started_tls_port <"$work_dir/$name.port"
    wait_tcp "$started_proxy_port" $started_proxy_pid "$name"
}

# start_proxy: starts onceproxy on $work_dir/onceproxy.yaml; sets proxy_port, admin_port,
# proxy_tls_port, proxy_pid.
start_proxy() {
    start_proxy_as onceproxy
    proxy_pid=$started_proxy_pid
    proxy_port=$started_proxy_port
    admin_port=$started_admin_port
    proxy_tls_port=$started_tls_port
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
