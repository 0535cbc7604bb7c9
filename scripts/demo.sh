#!/usr/bin/env bash
# `make run`: the test upstream on 127.0.0.1:3000 and onceproxy on 127.0.0.1:8080 in front of it,
# with the embedded memory store (conf/minimal.yaml). Ctrl-C stops both.
set -euo pipefail
build=${1:-build/release}
upstream_bin=$build/tools/test_upstream/onceproxy_test_upstream
proxy_bin=$build/src/onceproxy

"$upstream_bin" --listen 127.0.0.1:3000 >/dev/null &
upstream_pid=$!
trap 'kill $upstream_pid 2>/dev/null || true' EXIT

cat <<'MSG'

onceproxy is starting on http://127.0.0.1:8080 (demo upstream on 127.0.0.1:3000,
memory store, config conf/minimal.yaml, admin on http://127.0.0.1:9901). Try, from another terminal:

  # first execution: Idempotency-Status: stored
  curl -si -X POST http://127.0.0.1:8080/v1/payments \
       -H 'Idempotency-Key: order-42' -H 'Content-Type: application/json' -d '{"amount": 1000}'

  # the retry: same body and execution_id, Idempotency-Status: replayed
  curl -si -X POST http://127.0.0.1:8080/v1/payments \
       -H 'Idempotency-Key: order-42' -H 'Content-Type: application/json' -d '{"amount": 1000}'

  # same key, different body: 422 idempotency.payload_mismatch
  curl -si -X POST http://127.0.0.1:8080/v1/payments \
       -H 'Idempotency-Key: order-42' -H 'Content-Type: application/json' -d '{"amount": 2000}'

  # how many times the upstream really executed each key
  curl -s http://127.0.0.1:3000/__counts

  # metrics and probes
  curl -s http://127.0.0.1:9901/metrics | grep requests_total
  curl -s http://127.0.0.1:9901/readyz

  # the status page (a browser), and its data as JSON
  http://127.0.0.1:9901/
  curl -s http://127.0.0.1:9901/admin/v1/status

Press Ctrl-C to stop.

MSG
"$proxy_bin" --config conf/minimal.yaml
