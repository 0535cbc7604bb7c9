#!/usr/bin/env bash
# Resident memory of onceproxy (VmRSS from /proc/PID/status), idle and under wrk load.
#
#   bench/memory.sh [--idle 5] [--load 30] [--connections 64] [--workers auto]
#                   [--mode plain|replay|first] [--store memory|redis] [--build-dir build/rel]
#
# Samples every second: --idle seconds with no traffic, then --load seconds of
# `wrk -t1 -c<connections>`, then 3 s after the load stops. Prints idle / peak / final in MiB
# (final = after the load). plain = GET on a plain route; first = a fresh key per request
# (the memory store grows by one record per request, by design); replay = a fixed pool of
# recorded keys. Every phase is bounded in time.
set -euo pipefail
# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

idle=5
load=30
connections=64
workers=auto
mode=plain
store=memory
keys=1000
build_dir=${BENCH_BUILD_DIR:-$repo_dir/build/rel}

usage() { sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }
while [ $# -gt 0 ]; do
    case "$1" in
    --idle) idle=$2; shift 2 ;;
    --load) load=$2; shift 2 ;;
    --connections) connections=$2; shift 2 ;;
    --workers) workers=$2; shift 2 ;;
    --mode) mode=$2; shift 2 ;;
    --store) store=$2; shift 2 ;;
    --build-dir) build_dir=$2; shift 2 ;;
    -h | --help) usage 0 ;;
    *) echo "unknown option: $1" >&2; usage 2 ;;
    esac
done
idle=$(duration_seconds "$idle")
load=$(duration_seconds "$load")
case "$mode" in plain | replay | first) ;; *) die "--mode must be plain, replay or first" ;; esac
command -v wrk >/dev/null || die "wrk is not installed (scripts/install-deps.sh)"
find_binaries "$build_dir"

make_work_dir
start_upstream 1
[ "$store" = redis ] && start_redis
write_proxy_config "$workers" "$store"
start_proxy
log "onceproxy pid $proxy_pid on 127.0.0.1:$proxy_port, workers=$workers, store=$store, mode=$mode"

rss_kib() { awk '/^VmRSS:/ { print $2 }' "/proc/$proxy_pid/status" 2>/dev/null || echo 0; }
mib() { awk -v k="$1" 'BEGIN { printf "%.1f", k / 1024 }'; }

url="http://127.0.0.1:$proxy_port/bench"
wrk_args=()
run_id="$(date +%s)-$$"
case "$mode" in
plain) ;;
first)
    url="http://127.0.0.1:$proxy_port/pay/first"
    wrk_args=(-s "$bench_dir/lua/fresh.lua" "$url" -- "mem-$run_id") ;;
replay)
    url="http://127.0.0.1:$proxy_port/pay/replay"
    python3 "$bench_dir/http_loop.py" --port "$proxy_port" --path /pay/replay \
        --prefix "mem-$run_id-" --count "$keys" --expect stored --time-limit 120 >&2 ||
        die "recording the replay key pool failed: is the idempotency engine available?"
    wrk_args=(-s "$bench_dir/lua/replay.lua" "$url" -- "mem-$run_id-" "$keys") ;;
esac
[ ${#wrk_args[@]} -eq 0 ] && wrk_args=("$url")

idle_kib=0
for ((i = 0; i < idle; i++)); do
    sleep 1
    idle_kib=$(rss_kib)
done
log "idle: $(mib "$idle_kib") MiB"

peak_kib=$idle_kib
timeout $((load + 30)) wrk -t1 "-c$connections" "-d${load}s" --timeout 5s "${wrk_args[@]}" \
    >"$work_dir/wrk.txt" 2>&1 &
wrk_pid=$!
started_pids+=("$wrk_pid")
started_names[$wrk_pid]="wrk"
samples=()
deadline=$((SECONDS + load + 30))
while kill -0 "$wrk_pid" 2>/dev/null && [ "$SECONDS" -lt "$deadline" ]; do
    sleep 1
    kib=$(rss_kib)
    samples+=("$(mib "$kib")")
    [ "$kib" -gt "$peak_kib" ] && peak_kib=$kib
done
wait "$wrk_pid" || log "wrk: $(tail -n1 "$work_dir/wrk.txt")"
sleep 3
final_kib=$(rss_kib)
kill -0 "$proxy_pid" 2>/dev/null || die "onceproxy died under load (logs in $work_dir)"

echo "load samples (MiB, 1/s): ${samples[*]}"
grep -E 'Requests/sec|Non-2xx' "$work_dir/wrk.txt" || true
printf 'onceproxy RSS: idle %s MiB, peak under %d-connection load %s MiB, final %s MiB  [targets < 20 / < 100 MiB]\n' \
    "$(mib "$idle_kib")" "$connections" "$(mib "$peak_kib")" "$(mib "$final_kib")"
