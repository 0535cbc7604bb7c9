#!/usr/bin/env bash
# Instructions per proxied request, counted by valgrind's callgrind: unlike req/s, the count
# does not move with the noise of a shared machine, so it compares two builds reliably.
#
#   bench/callgrind.sh [--build-dir build/release] [--seconds 10] [--connections 8]
#                      [--mode plain|post|first|replay] [--store memory|redis|cluster]
#                      [--cluster-masters 1] [--count proxy|redis] [--binary PATH] [--out DIR]
#
# Starts the test upstream and onceproxy (one worker, config of bench/run.sh) with onceproxy
# under callgrind, sends one warm-up second of wrk load, zeroes the counters, runs wrk for
# --seconds, dumps, and prints instructions per request (the proxy's whole process: user-space
# instructions, system calls not included). --mode: GETs on the plain route (default), POSTs
# with a fresh Idempotency-Key on the plain route (post: the unguarded baseline), first
# executions or replays (of a pool of 100 keys) on the guarded route, with --store's store
# (cluster: a local Redis Cluster of --cluster-masters masters, no replicas).
# --count redis puts the Redis server under callgrind instead (the proxy runs natively): the
# instructions Redis spends per guarded request, scripts included (implies --store redis).
# Build with -g (e.g. -DCMAKE_CXX_FLAGS=-g1) for annotated output;
# `callgrind_annotate OUT/callgrind.out.*` then shows where they go.
set -euo pipefail
bench_dir=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=bench/lib.sh
. "$bench_dir/lib.sh"

build=${BENCH_BUILD_DIR:-build/release}
seconds=10
conns=8
mode=plain
store=memory
cluster_masters=1
binary=
out=
keep_work_dir=0
count=proxy
while [ $# -gt 0 ]; do
    case "$1" in
    --build-dir) build=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --connections) conns=$2; shift 2 ;;
    --mode) mode=$2; shift 2 ;;
    --store) store=$2; shift 2 ;;
    --cluster-masters) cluster_masters=$2; shift 2 ;;
    --binary) binary=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --count) count=$2; shift 2 ;;
    -h | --help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option $1" ;;
    esac
done
case "$mode" in plain | post | first | replay) ;; *) die "--mode must be plain, post, first or replay" ;; esac
case "$store" in memory | redis | cluster) ;; *) die "--store must be memory, redis or cluster" ;; esac
[[ "$cluster_masters" =~ ^[1-9][0-9]*$ ]] || die "--cluster-masters must be a number >= 1"
case "$count" in
proxy) ;;
redis)
    [ "$store" = cluster ] && die "--count redis counts one redis-server: not with --store cluster"
    store=redis ;;
*) die "--count must be proxy or redis" ;;
esac
command -v valgrind >/dev/null || die "valgrind is not installed"
find_binaries "$build"
[ -n "$binary" ] && onceproxy_bin=$binary
make_work_dir
[ -n "$out" ] || out=$work_dir
mkdir -p "$out"

start_upstream 1
if [ "$count" = redis ]; then
    redis_port=$(free_port)
    valgrind --tool=callgrind --callgrind-out-file="$out/callgrind.out.%p" \
        redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no \
        --dir "$work_dir" --logfile "$work_dir/redis.log" >"$work_dir/redis-valgrind.log" 2>&1 &
    counted_pid=$!
    started_pids+=("$counted_pid")
    started_names[$counted_pid]="redis-server (callgrind)"
    wait_tcp "$redis_port" $counted_pid "redis-server"
elif [ "$store" = redis ]; then
    start_redis
fi
[ "$store" = cluster ] && start_redis_cluster "$cluster_masters" "$cluster_masters"
# Under valgrind a command takes far longer than Redis's default 250 ms budget allows.
redis_extra="command_timeout: 5s, connect_timeout: 10s"
write_proxy_config 1 "$store"
if [ "$count" = redis ]; then
    start_proxy
else
    # Under callgrind the proxy starts slowly: wait_file/wait_tcp below are bounded anyway.
    valgrind --tool=callgrind --callgrind-out-file="$out/callgrind.out.%p" \
        "$onceproxy_bin" --config "$work_dir/onceproxy.yaml" \
        --port-file "$work_dir/onceproxy.port" >"$work_dir/onceproxy.log" 2>&1 &
    proxy_pid=$!
    counted_pid=$proxy_pid
    started_pids+=("$proxy_pid")
    started_names[$proxy_pid]="onceproxy (callgrind)"
    for ((i = 0; i < 600; i++)); do # up to 60 s: valgrind starts slowly on a busy machine
        [ -s "$work_dir/onceproxy.port" ] && break
        kill -0 "$proxy_pid" 2>/dev/null || die "onceproxy exited during start-up"
        sleep 0.1
    done
    read -r proxy_port _ <"$work_dir/onceproxy.port"
    wait_tcp "$proxy_port" $proxy_pid "onceproxy"
fi

url="http://127.0.0.1:$proxy_port/bench"
script=()
case "$mode" in
post)
    url="http://127.0.0.1:$proxy_port/plain"
    script=(-s "$bench_dir/lua/fresh.lua") ;;
first)
    url="http://127.0.0.1:$proxy_port/pay/first"
    script=(-s "$bench_dir/lua/fresh.lua") ;;
replay)
    url="http://127.0.0.1:$proxy_port/pay/replay"
    python3 "$bench_dir/http_loop.py" --port "$proxy_port" --path /pay/replay --prefix "cg-" \
        --count 100 --expect stored --time-limit 120 >"$work_dir/pool.txt" 2>&1 ||
        die "recording the replay keys failed: $(tail -n1 "$work_dir/pool.txt")"
    script=(-s "$bench_dir/lua/replay.lua") ;;
esac
args=()
[ "$mode" = replay ] && args=(-- cg- 100)
[ "$mode" = first ] || [ "$mode" = post ] && args=(-- "cg-$$")
timeout 30 wrk -t1 -c"$conns" -d1s "${script[@]}" "$url" "${args[@]}" >/dev/null 2>&1 || true
callgrind_control -z "$counted_pid" >/dev/null
timeout $((seconds + 30)) wrk -t1 -c"$conns" -d"${seconds}s" "${script[@]}" "$url" "${args[@]}" \
    >"$work_dir/wrk.txt" 2>&1
callgrind_control -d "$counted_pid" >/dev/null
requests=$(awk '/requests in/ {print $1}' "$work_dir/wrk.txt")
errors=$(awk '/Non-2xx|Socket errors/' "$work_dir/wrk.txt")
[ -n "$errors" ] && die "wrk reported: $errors (the count would mix in failed requests)"
[ "${requests:-0}" -gt 0 ] 2>/dev/null || die "wrk sent no request: $(tail -n1 "$work_dir/wrk.txt")"
dump=$(ls -t "$out"/callgrind.out."$counted_pid".* 2>/dev/null | head -n1)
[ -n "$dump" ] || die "no callgrind dump in $out"
ir=$(awk '/^summary:/ {print $2}' "$dump")
echo "$requests" >"$dump.requests" # for bench/callgrind_components.py
echo "requests $requests"
echo "instructions $ir"
echo "instructions/request $((ir / requests))"
echo "dump $dump"
