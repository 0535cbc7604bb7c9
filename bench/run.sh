#!/usr/bin/env bash
# onceproxy end-to-end benchmark: the test upstream, nginx and onceproxy side by side on this
# machine, under the same wrk load, in one run. See bench/README.md for what each figure means.
#
#   bench/run.sh [--duration 10s] [--connections 64] [--rounds 2] [--workers 1]
#                [--upstream-threads 1] [--store redis|memory] [--keys 1000]
#                [--scenarios direct,floor,nginx,proxy,nginx_tls,proxy_tls,proxy_post,replay,first,
#                             floor_post,floor_first,
#                             observe,first_cluster,replay_cluster,half,upload,download,
#                             nginx_h2c,proxy_h2c,nginx_h2,proxy_h2,nginx_h2c_h2c,
#                             proxy_h2c_h2c,nginx_grpc,proxy_grpc,grpc_first,grpc_replay,
#                             pg_first,pg_replay,pg_first_lookup,pg_replay_lookup |
#                             default | h2 | grpc | pg]
#                [--cluster-masters 1,3] [--h2-connections 2] [--h2-streams 100]
#                [--grpc-message-bytes 64] [--grpc-load onceproxy_grpc_load|h2load]
#                [--bulk-bytes 1073741824] [--commandstats] [--commandstats-requests 1000]
#                [--warmup 1] [--encrypt] [--pg-pool N] [--pg-setting NAME=VALUE]...
#                [--pg-standby] [--ttl 1h] [--syscalls]
#                [--build-dir build/rel] [--out DIR]
#
# Every option also reads an environment variable (BENCH_DURATION, BENCH_CONNECTIONS,
# BENCH_ROUNDS, BENCH_WORKERS, BENCH_UPSTREAM_THREADS, BENCH_STORE, BENCH_KEYS, BENCH_SCENARIOS,
# BENCH_BULK_BYTES, BENCH_CLUSTER_MASTERS, BENCH_H2_CONNECTIONS, BENCH_H2_STREAMS,
# BENCH_GRPC_MESSAGE_BYTES, BENCH_TTL, BENCH_BUILD_DIR, BENCH_ENCRYPT=1). In --scenarios,
# `default` stands for the default list, `h2` for the HTTP/2 rows (h2load), `grpc` for the
# unary gRPC rows (the build's bench/onceproxy_grpc_load, which counts grpc-status; --grpc-load
# h2load loads all but grpc_first with h2load, which sees HTTP statuses only) and `pg` for
# first/replay on the PostgreSQL store (a private PostgreSQL 15 with its default durability,
# and one more onceproxy on it per value of lookup_before_claim); none is in the default list,
# `make bench` adds them all. --encrypt turns on store.encryption (one AES-256-GCM key) to
# compare against a run without it.
# --pg-pool sets store.postgres.pool (connections per worker) of the pg rows' onceproxies, and
# each --pg-setting (BENCH_PG_SETTINGS, comma-separated) is passed to the PostgreSQL server as
# -c NAME=VALUE (e.g. synchronous_commit=off): the pg rows otherwise run both at their defaults.
# --pg-standby (BENCH_PG_STANDBY=1) adds a synchronous standby of that server on this machine.
# --ttl sets defaults.ttl of every onceproxy: with a short one (e.g. 2s) the records of `first`
# expire about as fast as they are made, so the store reuses its memory instead of growing.
# --syscalls (BENCH_SYSCALLS=1) counts the system calls of the proxy under test during each load
# with `perf stat` (tracepoints; root or a low perf_event_paranoid) and prints them per request.
# The report's header always gives what one system call costs on this machine
# (bench/onceproxy_syscall_cost of the release build, when built).
# first_cluster and replay_cluster (with --store redis) run first/replay against a local Redis
# Cluster of each size in --cluster-masters, through a second onceproxy. Exits non-zero when a
# component fails to start or dies during the run.
set -euo pipefail
# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

duration=${BENCH_DURATION:-10s}
connections=${BENCH_CONNECTIONS:-64}
rounds=${BENCH_ROUNDS:-2}
workers=${BENCH_WORKERS:-1}
upstream_threads=${BENCH_UPSTREAM_THREADS:-1}
store=${BENCH_STORE:-redis}
keys=${BENCH_KEYS:-1000}
default_scenarios=direct,floor,nginx,proxy,nginx_tls,proxy_tls,proxy_post,replay,first,floor_post,floor_first,observe,first_cluster,replay_cluster,half,upload,download
h2_scenarios=nginx_h2c,proxy_h2c,nginx_h2,proxy_h2,nginx_h2c_h2c,proxy_h2c_h2c
grpc_scenarios=nginx_grpc,proxy_grpc,grpc_first,grpc_replay
pg_scenarios=pg_first,pg_replay,pg_first_lookup,pg_replay_lookup
scenarios=${BENCH_SCENARIOS:-default}
cluster_masters=${BENCH_CLUSTER_MASTERS:-1,3}
h2_connections=${BENCH_H2_CONNECTIONS:-2}
h2_streams=${BENCH_H2_STREAMS:-100}
grpc_message_bytes=${BENCH_GRPC_MESSAGE_BYTES:-64}
grpc_load=${BENCH_GRPC_LOAD:-onceproxy_grpc_load}
bulk_bytes=${BENCH_BULK_BYTES:-1073741824}
build_dir=${BENCH_BUILD_DIR:-$repo_dir/build/rel}
pg_pool=${BENCH_PG_POOL:-}
pg_settings=()
pg_standby=${BENCH_PG_STANDBY:-0}
proxy_ttl=${BENCH_TTL:-1h}
[ -n "${BENCH_PG_SETTINGS:-}" ] && IFS=, read -r -a pg_settings <<<"$BENCH_PG_SETTINGS"
commandstats=0
count_syscalls=${BENCH_SYSCALLS:-0}
commandstats_requests=1000
warmup=1
out_dir=""

usage() { sed -n '2,39p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }
while [ $# -gt 0 ]; do
    case "$1" in
    --duration) duration=$2; shift 2 ;;
    --connections) connections=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --workers) workers=$2; shift 2 ;;
    --upstream-threads) upstream_threads=$2; shift 2 ;;
    --store) store=$2; shift 2 ;;
    --keys) keys=$2; shift 2 ;;
    --scenarios) scenarios=$2; shift 2 ;;
    --bulk-bytes) bulk_bytes=$2; shift 2 ;;
    --cluster-masters) cluster_masters=$2; shift 2 ;;
    --h2-connections) h2_connections=$2; shift 2 ;;
    --h2-streams) h2_streams=$2; shift 2 ;;
    --grpc-message-bytes) grpc_message_bytes=$2; shift 2 ;;
    --grpc-load) grpc_load=$2; shift 2 ;;
    --commandstats) commandstats=1; shift ;;
    --syscalls) count_syscalls=1; shift ;;
    --commandstats-requests) commandstats_requests=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --encrypt) BENCH_ENCRYPT=1; shift ;;
    --pg-pool) pg_pool=$2; shift 2 ;;
    --pg-setting) pg_settings+=("$2"); shift 2 ;;
    --pg-standby) pg_standby=1; shift ;;
    --ttl) proxy_ttl=$2; shift 2 ;;
    --build-dir) build_dir=$2; shift 2 ;;
    --out) out_dir=$2; shift 2 ;;
    -h | --help) usage 0 ;;
    *) echo "unknown option: $1" >&2; usage 2 ;;
    esac
done

seconds=$(duration_seconds "$duration")
[ "$seconds" -ge 1 ] || die "--duration must be at least 1s"
require_int() { [[ "$2" =~ ^[0-9]+$ && "$2" -ge "$3" ]] || die "--$1 must be an integer >= $3"; }
require_int connections "$connections" 2
require_int rounds "$rounds" 1
require_int keys "$keys" 1
require_int upstream-threads "$upstream_threads" 1
require_int commandstats-requests "$commandstats_requests" 1
require_int warmup "$warmup" 0
require_int bulk-bytes "$bulk_bytes" 1
require_int h2-connections "$h2_connections" 1
require_int h2-streams "$h2_streams" 1
require_int grpc-message-bytes "$grpc_message_bytes" 0
[ -z "$pg_pool" ] || require_int pg-pool "$pg_pool" 1
[[ "$pg_standby" =~ ^[01]$ ]] || die "BENCH_PG_STANDBY must be 0 or 1"
[[ "$proxy_ttl" =~ ^[1-9][0-9]*(ms|s|m|h|d)$ ]] || die "--ttl must be a duration such as 2s or 1h"
for setting in "${pg_settings[@]}"; do
    [[ "$setting" =~ ^[a-z_.]+=[^[:space:]]*$ ]] || die "--pg-setting must be NAME=VALUE, not '$setting'"
done
[[ "$workers" == auto || "$workers" =~ ^[1-9][0-9]*$ ]] || die "--workers must be auto or N >= 1"
case "$store" in memory | redis) ;; *) die "--store must be memory or redis" ;; esac
case "$grpc_load" in onceproxy_grpc_load | h2load) ;; *) die "--grpc-load must be onceproxy_grpc_load or h2load" ;; esac
[[ "$cluster_masters" =~ ^[1-9][0-9]*(,[1-9][0-9]*)*$ ]] ||
    die "--cluster-masters must be a list of master counts >= 1, e.g. 1,3"
IFS=, read -r -a cluster_sizes <<<"$cluster_masters"
if [ "$commandstats" -eq 1 ] && [ "$store" != redis ]; then
    die "--commandstats counts Redis commands: use it with --store redis"
fi
for tool in wrk nginx curl python3 openssl; do
    command -v "$tool" >/dev/null || die "$tool is not installed (scripts/install-deps.sh)"
done
find_binaries "$build_dir"

scenarios=$(sed -e "s/\bdefault\b/$default_scenarios/" -e "s/\bh2\b/$h2_scenarios/" \
    -e "s/\bgrpc\b/$grpc_scenarios/" -e "s/\bpg\b/$pg_scenarios/" <<<"$scenarios")
IFS=, read -r -a scenario_list <<<"$scenarios"
kept=()
for s in "${scenario_list[@]}"; do
    case "$s" in
    floor | floor_post | floor_first)
        if [ ! -x "$floor_bin" ]; then
            log "skipping $s: no $floor_bin (build onceproxy_floor_proxy, bench/README.md)"
            continue
        fi
        if [ "$s" = floor_first ] && [ "$store" != redis ]; then
            log "skipping floor_first: it is the floor of a first execution on Redis (--store redis)"
            continue
        fi ;;
    direct | nginx | proxy | nginx_tls | proxy_tls | proxy_post | replay | first | observe | half | upload | download) ;;
    nginx_h2c | proxy_h2c | nginx_h2 | proxy_h2 | nginx_h2c_h2c | proxy_h2c_h2c)
        command -v h2load >/dev/null || die "h2load is not installed (nghttp2-client; scripts/install-deps.sh)" ;;
    nginx_grpc | proxy_grpc | grpc_replay | grpc_first)
        command -v h2load >/dev/null || die "h2load is not installed (nghttp2-client; scripts/install-deps.sh)"
        /usr/bin/python3 -c 'import grpc' 2>/dev/null ||
            die "python3-grpcio is not installed (the gRPC rows' answer check; scripts/install-deps.sh)"
        if { [ "$s" = grpc_first ] || [ "$grpc_load" = onceproxy_grpc_load ]; } && [ ! -x "$grpc_load_bin" ]; then
            die "no $grpc_load_bin (the gRPC rows' load generator): build the release preset (bench/README.md)"
        fi ;;
    pg_first | pg_replay | pg_first_lookup | pg_replay_lookup) ;;
    first_cluster | replay_cluster)
        # Cluster / single-node ratios: the single node is the run's own Redis store.
        if [ "$store" != redis ]; then
            log "skipping $s: the Cluster scenarios compare against --store redis"
            continue
        fi ;;
    *) die "unknown scenario '$s' ($default_scenarios,$h2_scenarios,$grpc_scenarios,$pg_scenarios; default; h2; grpc; pg)" ;;
    esac
    kept+=("$s")
done
scenario_list=("${kept[@]}")
scenarios=$(IFS=,; echo "${scenario_list[*]}")
want() { [[ ",$scenarios," == *",$1,"* ]]; }
want_cluster() { want first_cluster || want replay_cluster; }
want_grpc() { want nginx_grpc || want proxy_grpc || want grpc_first || want grpc_replay; }
# The PostgreSQL rows' onceproxy variants: `claim` (every claim a write, the default) and
# `lookup` (lookup_before_claim: true, a replay is a read).
pg_variants=()
{ want pg_first || want pg_replay; } && pg_variants+=(claim)
{ want pg_first_lookup || want pg_replay_lookup; } && pg_variants+=(lookup)
pg_variant_of() { [[ "$1" == *_lookup ]] && echo lookup || echo claim; }
half_connections=$((connections / 2))
cpus=$(nproc)
nginx_workers=$workers
[ "$workers" = auto ] && nginx_workers=$cpus
run_id="$(date +%s)-$$"

make_work_dir
results="$work_dir/results"
if [ -n "$out_dir" ]; then
    mkdir -p "$out_dir"
    results=$(cd "$out_dir" && pwd)
fi
mkdir -p "$results"
# What one system call costs here, measured before anything else runs.
if [ -x "$syscall_cost_bin" ]; then
    "$syscall_cost_bin" >"$results/syscall-cost.json" || rm -f "$results/syscall-cost.json"
fi
if [ "$count_syscalls" -eq 1 ] && ! command -v perf >/dev/null; then
    die "--syscalls needs perf (linux-perf)"
fi

# ---- components -------------------------------------------------------------------------
start_upstream "$upstream_threads"
log "test upstream on 127.0.0.1:$upstream_port ($upstream_threads thread(s))"
# The h2c upstream of the h2c-in, h2c-out rows: an nginx of its own (its CPU time is the
# upstream's, never the front nginx's), one worker per test upstream thread.
h2c_upstream_port=$(free_port)
if want nginx_h2c_h2c || want proxy_h2c_h2c || want_grpc; then
    write_grpc_files
    start_h2c_upstream "$h2c_upstream_port" "$upstream_threads"
    log "h2c upstream nginx on 127.0.0.1:$h2c_upstream_port ($upstream_threads worker(s))"
fi
if [ "$store" = redis ]; then
    start_redis
    log "redis-server on 127.0.0.1:$redis_port"
fi
write_proxy_config "$workers" "$store"
start_proxy
log "onceproxy on 127.0.0.1:$proxy_port (admin $admin_port), workers=$workers, store=$store, ttl=$proxy_ttl"
# One local Redis Cluster (no replicas) and one more onceproxy per size in --cluster-masters,
# the same config but store.redis.cluster; indexed by the number of masters.
declare -A cluster_proxy_port=() cluster_admin_port=() cluster_proxy_pid=() cluster_engine=()
declare -A cluster_redis_pids=()
if want_cluster; then
    for n in "${cluster_sizes[@]}"; do
        [ -z "${cluster_proxy_port[$n]:-}" ] || continue
        start_redis_cluster "$n" "$n"
        log "Redis Cluster of $n master(s): $cluster_nodes"
        write_proxy_config "$workers" cluster "onceproxy-cluster$n"
        start_proxy_as "onceproxy-cluster$n"
        cluster_proxy_port[$n]=$started_proxy_port
        cluster_admin_port[$n]=$started_admin_port
        cluster_proxy_pid[$n]=$started_proxy_pid
        cluster_redis_pids[$n]="${cluster_pids[*]}"
        log "onceproxy on 127.0.0.1:$started_proxy_port (admin $started_admin_port), store=cluster of $n"
    done
fi
# A private PostgreSQL server and one more onceproxy on it per variant, the same config but
# store.postgres (pool, timeouts and the rest at their defaults); indexed by variant.
declare -A pg_proxy_port=() pg_admin_port=() pg_proxy_pid=() pg_engine=()
if [ ${#pg_variants[@]} -gt 0 ]; then
    start_postgres "${pg_settings[@]}"
    log "postgres on 127.0.0.1:$postgres_port ($("$postgres_bin/postgres" --version))"
    if [ "$pg_standby" = 1 ]; then
        start_postgres_standby "${pg_settings[@]}"
        log "synchronous standby on 127.0.0.1:$standby_port"
    fi
    # The settings that decide what a commit costs, as the server runs them.
    psql_bench "SELECT name || ' = ' || setting || coalesce(' ' || unit, '') FROM pg_settings
        WHERE name IN ('fsync', 'synchronous_commit', 'full_page_writes', 'wal_sync_method',
                       'commit_delay', 'shared_buffers', 'max_wal_size', 'synchronous_standby_names')
        UNION ALL SELECT 'standby ' || application_name || ': ' || sync_state FROM pg_stat_replication
        ORDER BY 1" >"$results/postgres-settings.txt" ||
        die "postgres does not answer queries (see $work_dir/pg.log)"
    "$postgres_bin/postgres" --version >>"$results/postgres-settings.txt"
    for v in "${pg_variants[@]}"; do
        postgres_extra=${pg_pool:+pool: $pg_pool}
        [ "$v" = lookup ] && postgres_extra="${postgres_extra:+$postgres_extra, }lookup_before_claim: true"
        write_proxy_config "$workers" postgres "onceproxy-pg-$v"
        start_proxy_as "onceproxy-pg-$v"
        pg_proxy_port[$v]=$started_proxy_port
        pg_admin_port[$v]=$started_admin_port
        pg_proxy_pid[$v]=$started_proxy_pid
        log "onceproxy on 127.0.0.1:$started_proxy_port (admin $started_admin_port), store=postgres${postgres_extra:+, $postgres_extra}"
    done
    postgres_extra=""
fi
load_start=$(cut -d' ' -f1-3 /proc/loadavg)

nginx_port=$(free_port)
nginx_tls_port=$(free_port)
nginx_h2_port=$(free_port)
nginx_h2c_port=$(free_port)
user_line=""
# As root, nginx workers would switch to `nobody`, which cannot enter the private work dir.
[ "$(id -u)" -eq 0 ] && user_line="user root root;"
sed -e "s|@USER@|$user_line|" -e "s|@WORKERS@|$nginx_workers|" -e "s|@DIR@|$work_dir|g" \
    -e "s|@UPSTREAM_PORT@|$upstream_port|" -e "s|@PORT@|$nginx_port|" \
    -e "s|@TLS_PORT@|$nginx_tls_port|" -e "s|@H2_PORT@|$nginx_h2_port|" \
    -e "s|@H2C_PORT@|$nginx_h2c_port|" -e "s|@H2C_UPSTREAM_PORT@|$h2c_upstream_port|" \
    "$bench_dir/nginx.conf.in" >"$work_dir/nginx.conf"
nginx -c "$work_dir/nginx.conf" -p "$work_dir" -e "$work_dir/nginx-error.log" \
    >"$work_dir/nginx.log" 2>&1 &
nginx_pid=$!
started_pids+=("$nginx_pid")
started_names[$nginx_pid]="nginx"
wait_tcp "$nginx_port" $nginx_pid "nginx"
log "nginx on 127.0.0.1:$nginx_port (worker_processes $nginx_workers)"

# The floor rows: a byte relay in front of the test upstream (bench/floor_proxy.cpp), and the
# same with a first execution's claim and record through Redis.
if want floor || want floor_post; then
    start_floor
    floor_url="http://127.0.0.1:$floor_port/bench"
    log "floor relay on 127.0.0.1:$floor_port"
fi
if want floor_first; then
    start_floor_first
    log "first execution's floor on 127.0.0.1:$floor_first_port"
fi
direct_url="http://127.0.0.1:$upstream_port/bench"
nginx_url="http://127.0.0.1:$nginx_port/bench"
proxy_url="http://127.0.0.1:$proxy_port/bench"
nginx_tls_url="https://127.0.0.1:$nginx_tls_port/bench"
proxy_tls_url="https://127.0.0.1:$proxy_tls_port/bench"
for url in "$direct_url" "$nginx_url" "$proxy_url" "$nginx_tls_url" "$proxy_tls_url"; do
    code=$(curl -s -o /dev/null -w '%{http_code}' --cacert "$work_dir/tls.crt" --max-time 5 "$url" || true)
    [ "$code" = 200 ] || die "GET $url answered '$code', expected 200"
done
# The HTTP/2 rows: h2c with prior knowledge on the plain listeners, ALPN h2 over TLS; /h2c/
# goes on to the h2c upstream nginx over h2c.
nginx_h2c_url="http://127.0.0.1:$nginx_h2c_port/bench"
proxy_h2c_url=$proxy_url
nginx_h2_url="https://127.0.0.1:$nginx_h2_port/bench"
proxy_h2_url=$proxy_tls_url
nginx_h2c_h2c_url="http://127.0.0.1:$nginx_h2c_port/h2c/bench"
proxy_h2c_h2c_url="http://127.0.0.1:$proxy_port/h2c/bench"
h2_urls=()
for s in nginx_h2c proxy_h2c nginx_h2 proxy_h2 nginx_h2c_h2c proxy_h2c_h2c; do
    want "$s" || continue
    url_var="${s}_url"
    h2_urls+=("${!url_var}")
done
# The gRPC rows: unary calls of bench.Payments (plain route) and bench.GuardedPayments (guarded
# route) on the h2c listeners; one call each through grpcio proves a real gRPC OK answer (the
# loads only count grpc-status).
grpc_method=/bench.Payments/Charge
grpc_guarded_method=/bench.GuardedPayments/Charge
grpc_targets=()
want nginx_grpc && grpc_targets+=("127.0.0.1:$nginx_h2c_port")
want proxy_grpc && grpc_targets+=("127.0.0.1:$proxy_port")
for target in "${grpc_targets[@]}"; do
    answer=$(timeout 20 /usr/bin/python3 "$bench_dir/grpc_check.py" "$target" "$grpc_method" \
        "$grpc_message_bytes" 2>&1) || die "gRPC call $grpc_method on $target failed: $answer"
done
for url in "${h2_urls[@]}"; do
    flag=--http2
    [[ "$url" == http:* ]] && flag=--http2-prior-knowledge
    answer=$(curl -s -o /dev/null -w '%{http_code} HTTP/%{http_version}' "$flag" \
        --cacert "$work_dir/tls.crt" --max-time 5 "$url" || true)
    [ "$answer" = "200 HTTP/2" ] || die "GET $url ($flag) answered '$answer', expected '200 HTTP/2'"
done

# ---- idempotency engine check -----------------------------------------------------------
# A guarded route answers even without the engine (it is proxied), so a replay figure would
# silently measure plain proxying. Prove a replay first.
# check_engine PORT POOL_PREFIX: prints "available", or why the engine is not; with
# POOL_PREFIX, records the replay key pool (POOL_PREFIX1..N) once the engine answered.
check_engine() {
    local port=$1 pool=$2 first_headers second_headers executions first_mark status_line
    local probe_key="probe-$port-$run_id"
    probe() {
        curl -s -o /dev/null -D - --max-time 5 -X POST -H 'Content-Type: application/json' \
            -H "Idempotency-Key: $probe_key" --data '{"probe":1}' \
            "http://127.0.0.1:$port/pay/probe" | tr -d '\r'
    }
    first_headers=$(probe || true)
    second_headers=$(probe || true)
    executions=$(curl -s --max-time 5 "http://127.0.0.1:$upstream_port/__count?key=$probe_key" || true)
    if ! grep -qi '^idempotency-status: *replayed' <<<"$second_headers"; then
        first_mark=$(grep -i '^idempotency-status:' <<<"$first_headers" || echo "no Idempotency-Status")
        status_line=$(head -n1 <<<"$second_headers")
        echo "not available: a repeated key was not replayed (first answer: '$first_mark'; second answer: '${status_line:-none}' without 'Idempotency-Status: replayed'; upstream executions: $executions)"
        return 0
    fi
    if [ "$keys" -gt 0 ] && [ -n "$pool" ]; then
        log "recording the replay key pool ($keys keys) on 127.0.0.1:$port"
        if ! python3 "$bench_dir/http_loop.py" --port "$port" --path /pay/replay \
            --prefix "$pool" --count "$keys" --expect stored --time-limit 120 \
            >"$work_dir/warmup-$port.txt" 2>&1; then
            echo "not available: recording the key pool failed ($(tail -n1 "$work_dir/warmup-$port.txt"))"
            return 0
        fi
    fi
    echo available
}
engine="available"
if want replay || want first || want observe || [ "$commandstats" -eq 1 ]; then
    pool=""
    want replay && pool="rp-$run_id-"
    engine=$(check_engine "$proxy_port" "$pool")
    log "idempotency engine: $engine"
    check_alive "while checking the idempotency engine"
fi
if want_cluster; then
    for n in "${!cluster_proxy_port[@]}"; do
        pool=""
        want replay_cluster && pool="rc$n-$run_id-"
        cluster_engine[$n]=$(check_engine "${cluster_proxy_port[$n]}" "$pool")
        log "idempotency engine, Cluster of $n: ${cluster_engine[$n]}"
        printf '%s\n' "${cluster_engine[$n]}" >"$results/engine-cluster$n.txt"
    done
    check_alive "while checking the idempotency engine on the Cluster"
fi
for v in "${pg_variants[@]}"; do
    pool=""
    { want "pg_replay" && [ "$v" = claim ]; } || { want pg_replay_lookup && [ "$v" = lookup ]; } &&
        pool="pr$v-$run_id-"
    pg_engine[$v]=$(check_engine "${pg_proxy_port[$v]}" "$pool")
    log "idempotency engine, PostgreSQL ($v): ${pg_engine[$v]}"
    printf '%s\n' "${pg_engine[$v]}" >"$results/engine-pg-$v.txt"
    check_alive "while checking the idempotency engine on PostgreSQL"
done
printf '%s\n' "$engine" >"$results/engine.txt"
# The same proof for the guarded gRPC route, with grpcio: a key stored, then replayed. That key
# is grpc_replay's: every one of its calls replays it.
grpc_replay_key="grpc-replay-$run_id"
if want grpc_first || want grpc_replay; then
    grpc_check() {
        timeout 20 /usr/bin/python3 "$bench_dir/grpc_check.py" "127.0.0.1:$proxy_port" \
            "$grpc_guarded_method" "$grpc_message_bytes" "$grpc_replay_key" 2>&1
    }
    first_answer=$(grpc_check || true)
    second_answer=$(grpc_check || true)
    if [[ "$first_answer" == "OK stored "* && "$second_answer" == "OK replayed "* ]]; then
        grpc_engine=available
    else
        grpc_engine="not available: a repeated gRPC call was not replayed (first answer: '$first_answer'; second: '$second_answer')"
    fi
    log "idempotency engine for gRPC: $grpc_engine"
    printf '%s\n' "$grpc_engine" >"$results/engine-grpc.txt"
    check_alive "while checking the idempotency engine for gRPC"
fi
grpc_engine_ok=0
[ "${grpc_engine:-}" = available ] && grpc_engine_ok=1
engine_ok=0
[ "$engine" = available ] && engine_ok=1

# ---- load -------------------------------------------------------------------------------
# CPU time (user+system clock ticks) of the process under test: a figure that the noise of a
# shared machine disturbs much less than req/s. nginx counts its master and workers.
#
# proc_counters PID...: "USER_TICKS SYSTEM_TICKS MINOR_FAULTS SLEEPS" summed over the PIDs:
# fields 14, 15 and 10 of /proc/PID/stat (with CHILDREN=1, the waited-for children's too: 16, 17
# and 11), and the voluntary context switches of their threads (/proc/PID/task/*/status: each one
# a thread that went to sleep for want of work, and had to be woken again; live threads only).
proc_counters() {
    local pid
    for pid in "$@"; do
        [ -r "/proc/$pid/stat" ] || continue
        # Field N of /proc/PID/stat is $(N-2) after the parenthesised command name.
        echo "stat $(sed 's/^.*) //' "/proc/$pid/stat")"
        awk '/^voluntary_ctxt_switches/{print "sleeps", $2}' /proc/"$pid"/task/*/status 2>/dev/null || true
    done | awk -v children="${CHILDREN:-0}" '
        $1 == "sleeps" { z += $2; next }
        { u += $13; s += $14; f += $9
          if (children) { u += $15; s += $16; f += $10 } }
        END { print u + 0, s + 0, f + 0, z + 0 }'
}
# record_cpu OUT KIND BEFORE AFTER: from two proc_counters readings, OUT.KINDcpu ("TICKS
# TICKS_PER_SECOND", user plus system: the figure of the main table) and OUT.KINDsplit
# ("USER_TICKS SYSTEM_TICKS MINOR_FAULTS SLEEPS TICKS_PER_SECOND").
record_cpu() {
    local out=$1 kind=$2 u0 s0 f0 z0 u1 s1 f1 z1 hz
    read -r u0 s0 f0 z0 <<<"$3"
    read -r u1 s1 f1 z1 <<<"$4"
    hz=$(getconf CLK_TCK)
    echo "$((u1 - u0 + s1 - s0)) $hz" >"$out.${kind}cpu"
    echo "$((u1 - u0)) $((s1 - s0)) $((f1 - f0)) $((z1 - z0)) $hz" >"$out.${kind}split"
}
# machine_ticks: "IDLE TOTAL" jiffies of all CPUs so far (/proc/stat; idle counts iowait too).
machine_ticks() {
    awk '/^cpu /{print $5 + $6, $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9}' /proc/stat
}
measured_pids() {
    case "$1" in
    nginx | nginx_tls | nginx_h2c | nginx_h2 | nginx_h2c_h2c | nginx_grpc | half_nginx) echo "$nginx_pid" $(pgrep -P "$nginx_pid" || true) ;;
    direct | half_direct) echo "$upstream_pid" ;;
    floor | floor_post | half_floor) echo "$floor_pid" ;;
    floor_first) echo "$floor_first_pid" ;;
    first_cluster* | replay_cluster*) echo "${cluster_proxy_pid[${1##*_cluster}]}" ;;
    pg_*) echo "${pg_proxy_pid[$(pg_variant_of "$1")]}" ;;
    *) echo "$proxy_pid" ;;
    esac
}
# The upstream a scenario's proxy forwards to: the h2c upstream nginx (master and workers)
# for the h2c-out rows, else the test upstream.
upstream_pids_of() {
    case "$1" in
    *_h2c_h2c | *_grpc | grpc_*) echo "$h2c_upstream_pid" $(pgrep -P "$h2c_upstream_pid" || true) ;;
    *) echo "$upstream_pid" ;;
    esac
}
# The Redis servers a scenario's proxy uses (none with the memory store).
redis_pids_of() {
    case "$1" in
    first_cluster* | replay_cluster*) echo "${cluster_redis_pids[${1##*_cluster}]}" ;;
    pg_*) ;;
    *) echo "${redis_pid:-}" ;;
    esac
}

# postgres_proc_counters: proc_counters of the whole PostgreSQL server so far (and of its
# standby, with --pg-standby): each postmaster, the children it has waited for (backends and
# autovacuum workers that exited) and its live children (backends, checkpointer, WAL writer,
# background writer, autovacuum; WAL sender and receiver, startup process).
postgres_proc_counters() {
    local pid
    {
        CHILDREN=1 proc_counters "${postgres_pids[@]}"
        for pid in "${postgres_pids[@]}"; do
            # shellcheck disable=SC2046
            proc_counters $(pgrep -P "$pid" || true)
        done
    } | awk '{ u += $1; s += $2; f += $3; z += $4 } END { print u, s, f, z }'
}
# postgres_counters: "NEXT_XID WAL_BYTES": the transaction id the server will assign next (one
# per transaction that wrote) and the WAL written so far, in bytes.
postgres_counters() {
    psql_bench "SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint || ' ' ||
        pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint" 2>/dev/null || echo "0 0"
}

# run_wrk ROUND NAME CONNECTIONS URL [SCRIPT ARGS...]: one bounded wrk run into the results.
run_wrk() {
    local round=$1 name=$2 conns=$3 url=$4 script=${5:-}
    shift 4 || true
    [ $# -gt 0 ] && shift
    local cmd=(wrk -t1 "-c$conns" "-d${seconds}s" --latency --timeout 5s)
    [ -n "$script" ] && cmd+=(-s "$bench_dir/lua/$script")
    cmd+=("$url")
    [ $# -gt 0 ] && cmd+=(-- "$@")
    run_load "$round" "$name" "${cmd[@]}"
}

# run_h2load ROUND NAME URL: one bounded h2load run (one thread, --h2-connections connections
# of --h2-streams concurrent streams each; h2c with prior knowledge for http://, ALPN h2 for
# https://) into the results, measured as run_wrk's loads are.
run_h2load() {
    local round=$1 name=$2 url=$3
    run_load "$round" "$name" h2load -t1 "-c$h2_connections" "-m$h2_streams" "-D$seconds" "$url"
}

# run_grpc ROUND NAME PORT METHOD [--key KEY | --key-prefix PREFIX]: unary gRPC calls, one
# message of grpc-request.bin's bytes each, --h2-connections x --h2-streams in flight for
# --duration, without a key, with KEY on every call, or with a new key per call (PREFIX0,
# PREFIX1, ...). onceproxy_grpc_load counts the calls by grpc-status; with --grpc-load h2load
# (content-type application/grpc, te: trailers) only HTTP statuses are seen, and a new key per
# call still needs onceproxy_grpc_load.
run_grpc() {
    local round=$1 name=$2 port=$3 method=$4
    shift 4
    if [ "$grpc_load" = h2load ] && [ "${1:-}" != --key-prefix ]; then
        local cmd=(h2load -t1 "-c$h2_connections" "-m$h2_streams" "-D$seconds"
            -d "$work_dir/grpc-request.bin" -H 'content-type: application/grpc' -H 'te: trailers')
        [ "${1:-}" = --key ] && cmd+=(-H "idempotency-key: $2")
        run_load "$round" "$name" "${cmd[@]}" "http://127.0.0.1:$port$method"
        return
    fi
    run_load "$round" "$name" "$grpc_load_bin" --port "$port" --path "$method" \
        --connections "$h2_connections" --streams "$h2_streams" --duration "$seconds" \
        --message-bytes "$grpc_message_bytes" "$@"
}

# sample_spread NAME FILE: with more than one worker, the client connections each worker holds
# halfway through NAME's load, worker after worker on one line: onceproxy's
# onceproxy_worker_connections{worker} (the plain-port rows), nginx's established connections on
# its port by worker process (ss). Nothing for other rows, or without curl or ss.
sample_spread() {
    local name=$1 file=$2
    sleep "$(awk -v s="$seconds" 'BEGIN { print s / 2 }')"
    case "$name" in
    nginx)
        command -v ss >/dev/null || return 0
        ss -Htnp state established "( sport = :$nginx_port )" 2>/dev/null |
            grep -o 'pid=[0-9]*' | sort | uniq -c | awk '{ printf "%s ", $1 } END { print "" }' \
            >"$file" ;;
    *)
        [ "$(measured_pids "$name")" = "$proxy_pid" ] || return 0
        curl -s --max-time 5 "http://127.0.0.1:$admin_port/metrics" |
            awk '/^onceproxy_worker_connections\{/ { printf "%s ", $2 } END { print "" }' \
            >"$file" ;;
    esac
}

# run_load ROUND NAME COMMAND...: runs the load generator COMMAND, bounded in time, with the
# CPU time of the processes under test (measured_pids NAME), of Redis, of the upstream
# (upstream_pids_of NAME) and of the load generator itself taken around it; the proxy's, the
# store server's and the upstream's also split into user and system time, with their minor
# page faults (the .split files).
run_load() {
    local round=$1 name=$2
    shift 2
    local cmd=("$@")
    check_alive "before the $name load"
    local out="$results/r$round-$name.txt"
    [ "$round" = warmup ] && out="$work_dir/warmup-$name.txt"
    local pids before
    pids=$(measured_pids "$name")
    local redis_before="" redis_pids
    redis_pids=$(redis_pids_of "$name")
    # shellcheck disable=SC2086
    before=$(proc_counters $pids)
    # shellcheck disable=SC2086
    [ -n "$redis_pids" ] && redis_before=$(proc_counters $redis_pids)
    # The PostgreSQL rows: its counters (read by a session of its own, outside the CPU window)
    # and the CPU time of all its processes.
    local pg_counters_before="" pg_before=""
    if [[ "$name" == pg_* ]]; then
        pg_counters_before=$(postgres_counters)
        pg_before=$(postgres_proc_counters)
    fi
    local up_before machine_before up_pids
    up_pids=$(upstream_pids_of "$name")
    # shellcheck disable=SC2086
    up_before=$(proc_counters $up_pids)
    machine_before=$(machine_ticks)
    # In a subshell whose `times` reports wrk's own CPU time (the load generator's share of
    # the cores).
    # --syscalls: the proxy's system calls over the load (perf stops with the load).
    local perf_pid=""
    if [ "$count_syscalls" -eq 1 ]; then
        # shellcheck disable=SC2086
        perf stat -x, -o "$out.syscalls" -p "$(echo $pids | tr ' ' ',')" \
            -e 'syscalls:sys_enter_recvfrom,syscalls:sys_enter_read,syscalls:sys_enter_sendto,syscalls:sys_enter_sendmsg,syscalls:sys_enter_writev,syscalls:sys_enter_write,syscalls:sys_enter_epoll_ctl,syscalls:sys_enter_epoll_wait' \
            2>/dev/null &
        perf_pid=$!
    fi
    local spread_pid=""
    if [ "$workers" != 1 ] && [ "$round" != warmup ]; then
        sample_spread "$name" "$out.spread" &
        spread_pid=$!
    fi
    if ! (timeout $((seconds + 30)) "${cmd[@]}" >"$out" 2>&1 && times >"$out.wrk-times"); then
        log "${cmd[0]} failed for $name (round $round): $(tail -n1 "$out")"
    fi
    [ -z "$spread_pid" ] || wait "$spread_pid" 2>/dev/null || true
    if [ -n "$perf_pid" ]; then
        kill -INT "$perf_pid" 2>/dev/null || true
        wait "$perf_pid" 2>/dev/null || true
    fi
    # shellcheck disable=SC2086
    record_cpu "$out" "" "$before" "$(proc_counters $pids)"
    if [ -n "$pg_counters_before" ]; then
        record_cpu "$out" postgres- "$pg_before" "$(postgres_proc_counters)"
        echo "$pg_counters_before $(postgres_counters)" >"$out.postgres-counters"
    fi
    # shellcheck disable=SC2086
    record_cpu "$out" upstream- "$up_before" "$(proc_counters $up_pids)"
    echo "$machine_before $(machine_ticks)" >"$out.machine"
    # The Redis server's CPU time too: on this machine it shares the cores with the proxy.
    if [ -n "$redis_pids" ]; then
        # shellcheck disable=SC2086
        record_cpu "$out" redis- "$redis_before" "$(proc_counters $redis_pids)"
    fi
    check_alive "during the $name load"
    if [ "$round" != warmup ]; then
        log "round $round $name: $(grep -E 'Requests/sec|^finished in|^\{' "$out" | tr -s ' ' || echo 'no result')"
    fi
}

# run_bulk ROUND MODE: one streamed transfer of bulk_bytes each to the upstream directly,
# through nginx and through onceproxy (/bulk/: no body limit on either, no request or response
# buffering in nginx, a streamed plain route in onceproxy), with the peak RSS of the proxy.
run_bulk() {
    local round=$1 mode=$2 target port pids out
    for target in direct nginx proxy; do
        case "$target" in
        direct) port=$upstream_port ;;
        nginx) port=$nginx_port ;;
        proxy) port=$proxy_port ;;
        esac
        pids=$(measured_pids "$target" | tr ' ' ',')
        check_alive "before the $mode $target transfer"
        out="$results/r$round-bulk_${mode}_$target.json"
        if ! python3 "$bench_dir/bulk.py" --mode "$mode" --url "http://127.0.0.1:$port/bulk/$mode" \
            --bytes "$bulk_bytes" --pids "$pids" --file "$work_dir/bulk-upload.bin" \
            --time-limit 300 --label "round $round $mode $target" >"$out"; then
            log "$mode through $target failed: $(cat "$out")"
        fi
        check_alive "during the $mode $target transfer"
    done
    rm -f "$work_dir/bulk-upload.bin" "$work_dir/bulk-upload.bin.reply"
}

# run_scenario ROUND NAME
run_scenario() {
    local round=$1 name=$2
    case "$name" in
    direct) run_wrk "$round" direct "$connections" "$direct_url" ;;
    floor) run_wrk "$round" floor "$connections" "$floor_url" ;;
    floor_post)
        # The POSTs of proxy_post and first, through the byte relay.
        run_wrk "$round" floor_post "$connections" "$floor_url" fresh.lua "fp-$run_id-$round" ;;
    floor_first)
        run_wrk "$round" floor_first "$connections" "http://127.0.0.1:$floor_first_port/pay/first" \
            fresh.lua "ff-$run_id-$round" ;;
    nginx) run_wrk "$round" nginx "$connections" "$nginx_url" ;;
    proxy) run_wrk "$round" proxy "$connections" "$proxy_url" ;;
    nginx_tls) run_wrk "$round" nginx_tls "$connections" "$nginx_tls_url" ;;
    proxy_tls) run_wrk "$round" proxy_tls "$connections" "$proxy_tls_url" ;;
    nginx_h2c) run_h2load "$round" nginx_h2c "$nginx_h2c_url" ;;
    proxy_h2c) run_h2load "$round" proxy_h2c "$proxy_h2c_url" ;;
    nginx_h2) run_h2load "$round" nginx_h2 "$nginx_h2_url" ;;
    proxy_h2) run_h2load "$round" proxy_h2 "$proxy_h2_url" ;;
    nginx_h2c_h2c) run_h2load "$round" nginx_h2c_h2c "$nginx_h2c_h2c_url" ;;
    proxy_h2c_h2c) run_h2load "$round" proxy_h2c_h2c "$proxy_h2c_h2c_url" ;;
    nginx_grpc) run_grpc "$round" nginx_grpc "$nginx_h2c_port" "$grpc_method" ;;
    proxy_grpc) run_grpc "$round" proxy_grpc "$proxy_port" "$grpc_method" ;;
    grpc_replay)
        # Every call with the key the engine check stored: each one is a replay.
        [ "$grpc_engine_ok" -eq 1 ] || return 0
        run_grpc "$round" grpc_replay "$proxy_port" "$grpc_guarded_method" --key "$grpc_replay_key" ;;
    grpc_first)
        # Every call with a new key: each one is executed and stored.
        [ "$grpc_engine_ok" -eq 1 ] || return 0
        run_grpc "$round" grpc_first "$proxy_port" "$grpc_guarded_method" \
            --key-prefix "gf-$run_id-$round-" ;;
    proxy_post)
        run_wrk "$round" proxy_post "$connections" "http://127.0.0.1:$proxy_port/plain" \
            fresh.lua "pp-$run_id-$round" ;;
    replay)
        [ "$engine_ok" -eq 1 ] || return 0
        run_wrk "$round" replay "$connections" "http://127.0.0.1:$proxy_port/pay/replay" \
            replay.lua "rp-$run_id-" "$keys" ;;
    first)
        [ "$engine_ok" -eq 1 ] || return 0
        run_wrk "$round" first "$connections" "http://127.0.0.1:$proxy_port/pay/first" \
            fresh.lua "fe-$run_id-$round" ;;
    pg_first | pg_first_lookup | pg_replay | pg_replay_lookup)
        # The same loads as first/replay, through the onceproxy on PostgreSQL of the variant.
        local v
        v=$(pg_variant_of "$name")
        [ "${pg_engine[$v]}" = available ] || return 0
        if [[ "$name" == pg_first* ]]; then
            run_wrk "$round" "$name" "$connections" "http://127.0.0.1:${pg_proxy_port[$v]}/pay/first" \
                fresh.lua "pf$v-$run_id-$round"
        else
            run_wrk "$round" "$name" "$connections" "http://127.0.0.1:${pg_proxy_port[$v]}/pay/replay" \
                replay.lua "pr$v-$run_id-" "$keys"
        fi ;;
    first_cluster | replay_cluster)
        # The same loads as first/replay, through the onceproxy of each Cluster.
        local n path=${name%_cluster}
        for n in "${cluster_sizes[@]}"; do
            [ "${cluster_engine[$n]}" = available ] || continue
            if [ "$path" = first ]; then
                run_wrk "$round" "first_cluster$n" "$connections" \
                    "http://127.0.0.1:${cluster_proxy_port[$n]}/pay/first" fresh.lua "fc$n-$run_id-$round"
            else
                run_wrk "$round" "replay_cluster$n" "$connections" \
                    "http://127.0.0.1:${cluster_proxy_port[$n]}/pay/replay" replay.lua "rc$n-$run_id-" "$keys"
            fi
        done ;;
    observe)
        # The same first executions as `first`, on a route in observe mode: the cost of
        # observing against the cost of enforcing.
        [ "$engine_ok" -eq 1 ] || return 0
        run_wrk "$round" observe "$connections" "http://127.0.0.1:$proxy_port/observe/first" \
            fresh.lua "ob-$run_id-$round" ;;
    half)
        # Paced to half of onceproxy's measured peak (see half_delay_ms), the same offered rate
        # for both, so the p99 difference is the latency onceproxy adds below saturation.
        # nginx at the same pacing is the reference: what any proxy's extra hop costs here.
        run_wrk "$round" half_direct "$half_connections" "$direct_url" paced.lua "$half_delay_ms"
        run_wrk "$round" half_nginx "$half_connections" "$nginx_url" paced.lua "$half_delay_ms"
        if want floor; then
            run_wrk "$round" half_floor "$half_connections" "$floor_url" paced.lua "$half_delay_ms"
        fi
        run_wrk "$round" half_proxy "$half_connections" "$proxy_url" paced.lua "$half_delay_ms" ;;
    upload | download) run_bulk "$round" "$name" ;;
    *) die "unknown scenario '$name'" ;;
    esac
}

# Half of peak load: a short closed-loop run of onceproxy gives its peak; each of the
# half_connections connections then waits so that together they offer about half of it. wrk's
# timers fire late by a millisecond or more here, so a short paced run measures how long one
# connection's cycle really takes, and the connection count is scaled to reach half the peak.
half_delay_ms=1
half_peak=0
if want half; then
    peak_out="$work_dir/peak.txt"
    timeout 30 wrk -t1 "-c$connections" -d3s "$proxy_url" >"$peak_out" 2>&1 || true
    peak=$(awk '/Requests\/sec/ {print int($2)}' "$peak_out")
    if [ -n "$peak" ] && [ "$peak" -gt 0 ]; then
        half_peak=$peak
        half_delay_ms=$(python3 -c "print(max(1, round($half_connections * 1000 / ($peak / 2))))")
        timeout 30 wrk -t1 "-c$half_connections" -d2s -s "$bench_dir/lua/paced.lua" "$proxy_url" \
            -- "$half_delay_ms" >"$peak_out" 2>&1 || true
        paced=$(awk '/Requests\/sec/ {print int($2)}' "$peak_out")
        if [ -n "$paced" ] && [ "$paced" -gt 0 ]; then
            half_connections=$(python3 -c "import math; print(min($connections * 4, max(1, math.ceil($half_connections * ($peak / 2) / $paced))))")
        fi
    fi
    log "half load: peak ${peak:-unknown} req/s, $half_connections connections pacing ${half_delay_ms} ms"
    echo "${peak:-0} $half_delay_ms" >"$results/half.txt"
fi

n_warm=0
if [ "$warmup" -gt 0 ]; then
    saved=$seconds
    seconds=$warmup
    for url in "$direct_url" "$nginx_url" "$proxy_url" "$nginx_tls_url" "$proxy_tls_url"; do
        run_wrk warmup "w$((++n_warm))" "$connections" "$url"
    done
    want nginx_grpc && run_grpc warmup "w$((++n_warm))" "$nginx_h2c_port" "$grpc_method"
    want proxy_grpc && run_grpc warmup "w$((++n_warm))" "$proxy_port" "$grpc_method"
    for url in "${h2_urls[@]}"; do
        run_load warmup "w$((++n_warm))" h2load -t1 "-c$h2_connections" "-m$h2_streams" \
            "-D$seconds" "$url"
    done
    seconds=$saved
fi

for ((round = 1; round <= rounds; round++)); do
    # The machine is shared: alternate the order so drift does not favour one contender.
    order=("${scenario_list[@]}")
    if ((round % 2 == 0)); then
        order=()
        for ((i = ${#scenario_list[@]} - 1; i >= 0; i--)); do order+=("${scenario_list[i]}"); done
    fi
    for s in "${order[@]}"; do run_scenario "$round" "$s"; done
done

# onceproxy's own count of store round trips per guarded request, over the whole run.
curl -s --max-time 5 "http://127.0.0.1:$admin_port/metrics" >"$results/metrics.txt" || true
for n in "${!cluster_admin_port[@]}"; do
    curl -s --max-time 5 "http://127.0.0.1:${cluster_admin_port[$n]}/metrics" \
        >"$results/metrics-cluster$n.txt" || true
done
for v in "${!pg_admin_port[@]}"; do
    curl -s --max-time 5 "http://127.0.0.1:${pg_admin_port[$v]}/metrics" \
        >"$results/metrics-pg-$v.txt" || true
done
load_end=$(cut -d' ' -f1-3 /proc/loadavg)

# ---- Redis commands per request ---------------------------------------------------------
if [ "$commandstats" -eq 1 ]; then
    if [ "$engine_ok" -eq 1 ]; then
        rcli() { timeout 10 redis-cli -p "$redis_port" "$@"; }
        prefix="cs-$run_id-"
        # Redis 7 counts the commands a script runs in INFO commandstats too, so round trips are
        # counted from MONITOR, which marks script-internal commands with [db lua].
        # measure_path NAME EXPECTED_STATUS
        measure_path() {
            local name=$1 expect=$2 mon i
            rcli CONFIG RESETSTAT >/dev/null
            timeout 300 redis-cli -p "$redis_port" MONITOR >"$results/monitor-$name.txt" 2>&1 &
            mon=$!
            started_pids+=("$mon")
            for ((i = 0; i < 50; i++)); do
                grep -q '^OK' "$results/monitor-$name.txt" && break
                sleep 0.1
            done
            python3 "$bench_dir/http_loop.py" --port "$proxy_port" --path /pay/cs \
                --prefix "$prefix" --count "$commandstats_requests" --expect "$expect" \
                >"$results/cs-$name-requests.txt" 2>&1 ||
                log "commandstats: not every $name answer was '$expect': $(cat "$results/cs-$name-requests.txt")"
            sleep 0.5
            rcli INFO commandstats >"$results/commandstats-$name.txt"
            kill "$mon" 2>/dev/null || true
            wait "$mon" 2>/dev/null || true
        }
        measure_path first stored
        measure_path replay replayed
    else
        printf '%s\n' "$engine" >"$results/commandstats-unavailable.txt"
    fi
fi

# ---- report -----------------------------------------------------------------------------
cat >"$results/meta.json" <<JSON
{"duration": $seconds, "connections": $connections, "half_connections": $half_connections,
 "half_peak": $half_peak,
 "rounds": $rounds, "workers": "$workers", "nginx_workers": $nginx_workers,
 "upstream_threads": $upstream_threads, "store": "$store", "keys": $keys, "cpus": $cpus,
 "scenarios": "$scenarios", "commandstats_requests": $commandstats_requests,
 "bulk_bytes": $bulk_bytes, "cluster_masters": [$cluster_masters],
 "h2_connections": $h2_connections, "h2_streams": $h2_streams,
 "grpc_message_bytes": $grpc_message_bytes, "grpc_load": "$grpc_load",
 "ttl": "$proxy_ttl", "pg_pool": "${pg_pool:-default}", "pg_standby": $pg_standby, "pg_settings": "$(IFS=' '; echo "${pg_settings[*]}")",
 "load_start": "$load_start", "load_end": "$load_end"}
JSON
status=0
python3 "$bench_dir/report.py" "$results" || status=1
[ -n "$out_dir" ] && log "raw wrk outputs and summary.json in $results"
exit $status
