#!/usr/bin/env bash
# Deployment test: the Kustomize directories of deploy/kubernetes, rendered with
# `kubectl kustomize` and run as pods with `podman kube play` (4.3), on the images of
# `make image` (localhost/onceproxy:TAG, localhost/onceproxy-test-upstream:TAG as the app).
#
#   tests/deploy/run.sh            (IMAGE_TAG, default dev; run as root; `make deploy-test`)
#
# 0. the image alone: `--version` names a commit; a pod of the proxy (its built-in config) and
#    the app answers a guarded POST once and replays the retry.
# 1. base (memory store): a guarded POST executes once, its retry replays.
# 2. redis overlay: one Redis pod, the app Deployment played twice (two replicas); a retry sent
#    to the other replica replays. SIGTERM to a replica (as the kubelet sends it) while a slow
#    guarded request is in flight: the client gets its answer, the proxy drains and exits 0, and
#    the retry on the other replica replays it.
# 3. the sidecar component on an existing Deployment (tests/deploy/example-app), classic form:
#    the Service targets the proxy, the proxy forwards to the app's port, retries replay.
# 4. the native sidecar form: what podman 4.3's kube play does with it is logged (it refuses
#    it; see deploy/README.md), not counted as a failure.
# 5. the native sidecar lifecycle, run with explicit podman commands: proxy started first,
#    app after it; SIGTERM to the app first (it finishes its slow request, which reaches the
#    client through the proxy), then to the proxy, which exits 0.
#
# podman has no cluster: tests/deploy/adapt.py maps image names to the local tags, drops the
# Services (and the containerPorts, which podman 4.3 would publish on the host), stands in for
# the Redis Service's DNS name with hostAliases, turns Secrets into podman secrets, expands
# $(VAR) in args and plays the second replica under another name. Pods are reached through
# their network namespaces (nsenter); nothing is published. Every wait is bounded; pods,
# volumes and secrets are removed on exit (DEPLOY_TEST_KEEP=1 keeps them for a look).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
tag=${IMAGE_TAG:-dev}
proxy_image=localhost/onceproxy:$tag
app_image=localhost/onceproxy-test-upstream:$tag
redis_image=localhost/onceproxy-test-redis:$tag
work=$(mktemp -d /tmp/onceproxy-deploy.XXXXXX)
played=()
secrets=()
pods=()
failures=0
started=$SECONDS

log() { printf '[%3ds] %s\n' $((SECONDS - started)) "$*"; }
die() { log "FAIL: $*"; exit 1; }
check() { # check DESCRIPTION TEST...
    local what=$1; shift
    if "$@"; then log "ok   $what"; return 0; fi
    log "FAIL $what"
    failures=$((failures + 1))
    return 1
}
# show NAME: what the client of request NAME got (after a failed check).
show() {
    echo "    $1: status $(cat "$work/$1.status") $(cat "$work/$1.err")"
    sed 's/^/    | /' "$work/$1.headers"
}

# unplay FILE: podman kube down, and the volumes kube down (4.3) leaves behind (ConfigMaps,
# claims).
unplay() {
    local v
    timeout 90 podman kube down "$1" >/dev/null 2>&1 || true
    for v in $(tests/deploy/adapt.py --list-volumes <"$1"); do
        timeout 30 podman volume rm -f "$v" >/dev/null 2>&1 || true
    done
}

cleanup() {
    local f s p
    if [ -n "${DEPLOY_TEST_KEEP:-}" ]; then
        log "DEPLOY_TEST_KEEP: pods, secrets and $work left in place"
        return
    fi
    for f in "${played[@]}"; do
        unplay "$f"
    done
    for p in "${pods[@]}"; do
        timeout 60 podman pod rm -f "$p" >/dev/null 2>&1 || true
    done
    for s in "${secrets[@]}"; do
        timeout 30 podman secret rm "$s" >/dev/null 2>&1 || true
    done
    rm -rf "$work"
}
trap cleanup EXIT

for image in "$proxy_image" "$app_image"; do
    podman image exists "$image" || die "$image is missing: run \`make image\` first"
done
if ! podman image exists "$redis_image"; then
    log "building $redis_image (tests/deploy/redis.Containerfile)"
    timeout 600 podman build --pull=never -q -f tests/deploy/redis.Containerfile \
        -t "$redis_image" tests/deploy >/dev/null
fi

images=(--image "registry.example.com/onceproxy=$proxy_image"
        --image "registry.example.com/my-app=$app_image"
        --image "registry.example.com/onceproxy-test-upstream=$app_image"
        --image "redis=$redis_image")
# A well-behaved app finishes what it is serving on SIGTERM; the test upstream exits at once,
# so in the pods it runs under a shell that forwards SIGTERM 5 s later.
draining_script='/usr/local/bin/onceproxy_test_upstream --listen 127.0.0.1:3000 & pid=$!; trap "sleep 5; kill -TERM $pid" TERM; wait $pid; wait $pid'
draining_app=$(python3 -c 'import json, sys; print(json.dumps(["/bin/sh", "-c", sys.argv[1]]))' \
    "$draining_script")

# render DIR OUT adapt-options...: kubectl kustomize DIR, adapted for podman, into OUT. Its
# Secrets become podman secrets (see adapt.py --secrets-to).
render() {
    local dir=$1 out=$2 f name; shift 2
    kubectl kustomize "$dir" >"$work/rendered.yaml"
    rm -rf "$work/secrets" && mkdir -p "$work/secrets"
    tests/deploy/adapt.py "${images[@]}" --drop-kind Service --secrets-to "$work/secrets" \
        --restart-policy Never "$@" <"$work/rendered.yaml" >"$out"
    for f in "$work"/secrets/*.json; do
        [ -e "$f" ] || continue
        name=$(basename "$f" .json)
        timeout 30 podman secret rm "$name" >/dev/null 2>&1 || true
        timeout 30 podman secret create "$name" "$f" >/dev/null
        secrets+=("$name")
    done
}

# play FILE: podman kube play, bounded; remembered for cleanup.
play() {
    played+=("$1")
    timeout 120 podman kube play "$1" >"$work/play.log" 2>&1 || {
        cat "$work/play.log"; die "podman kube play $1"; }
}

infra_pid() { # infra_pid POD
    local infra
    infra=$(podman pod inspect "$1" --format '{{.InfraContainerID}}')
    podman inspect "$infra" --format '{{.State.Pid}}'
}

pod_ip() { # pod_ip POD
    local infra
    infra=$(podman pod inspect "$1" --format '{{.InfraContainerID}}')
    podman inspect "$infra" --format '{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}'
}

# in_pod POD CMD...: CMD in the pod's network namespace (its loopback is the pod's).
in_pod() {
    local pod=$1; shift
    nsenter -t "$(infra_pid "$pod")" -n "$@"
}

# wait_http POD URL SECONDS: until URL answers 2xx inside the pod.
wait_http() {
    local pod=$1 url=$2 deadline=$((SECONDS + $3))
    until in_pod "$pod" curl -fsS -m 2 -o /dev/null "$url" 2>/dev/null; do
        if [ $SECONDS -ge $deadline ]; then
            podman pod logs "$pod" 2>&1 | tail -30
            die "$pod: $url did not answer within $3 s"
        fi
        sleep 0.5
    done
}

# post POD PORT KEY NAME [curl options...]: a guarded POST /v1/payments through the proxy;
# leaves $work/NAME.status, NAME.headers and NAME.body.
post() {
    local pod=$1 port=$2 key=$3 name=$4; shift 4
    in_pod "$pod" curl -sS -m 40 -X POST "http://127.0.0.1:$port/v1/payments" \
        -H "Idempotency-Key: $key" -H 'Content-Type: application/json' \
        --data '{"amount": 1000, "currency": "EUR"}' "$@" \
        -D "$work/$name.headers" -o "$work/$name.body" -w '%{http_code}' \
        >"$work/$name.status" 2>"$work/$name.err" || true
}

status_is() { [ "$(cat "$work/$1.status")" = "$2" ]; }
idempotency_status_is() {
    grep -qi "^idempotency-status: $2"$'\r'"\?$" "$work/$1.headers"
}
same_body() { cmp -s "$work/$1.body" "$work/$2.body"; }
# executions POD KEY: how many times the app in POD executed requests with KEY.
executions() {
    in_pod "$1" curl -fsS -m 5 "http://127.0.0.1:3000/__count?key=$2" \
        | python3 -c 'import json, sys; print(json.load(sys.stdin)["count"])'
}
executions_are() { [ "$(executions "$1" "$2")" = "$3" ]; }

# ---- 0. the image alone: --version, and a request through its built-in config ------------
version=$(podman run --rm "$proxy_image" --version)
log "image: $version"
version_pattern='^onceproxy [0-9]+\.[0-9]+\.[0-9]+ \(commit [0-9a-f]{7,}(-dirty)?\)$'
check "image: --version names the version and a commit" \
    eval '[[ "$version" =~ $version_pattern ]]'
# The README's plain-podman pod: the proxy's default /etc/onceproxy/onceproxy.yaml forwards to
# the app on 127.0.0.1:3000 in the same pod. Nothing is published.
timeout 30 podman pod rm -f onceproxy-image-test >/dev/null 2>&1 || true
timeout 60 podman pod create --name onceproxy-image-test >/dev/null
pods+=(onceproxy-image-test)
timeout 60 podman run -d --pod onceproxy-image-test --name onceproxy-image-test-app "$app_image" \
    >/dev/null
timeout 60 podman run -d --pod onceproxy-image-test --name onceproxy-image-test-proxy \
    "$proxy_image" >/dev/null
wait_http onceproxy-image-test http://127.0.0.1:9901/readyz 30
post onceproxy-image-test 8080 image-1 image-first
post onceproxy-image-test 8080 image-1 image-retry
check "image: a guarded POST through it executes once, its retry replays" \
    eval 'status_is image-first 200 && idempotency_status_is image-first stored &&
          status_is image-retry 200 && idempotency_status_is image-retry replayed &&
          executions_are onceproxy-image-test image-1 1' || { show image-first; show image-retry; }
timeout 60 podman pod rm -f onceproxy-image-test >/dev/null

# ---- 1. base: memory store, one pod ------------------------------------------------------
log "base: rendering deploy/kubernetes/base and playing it"
render deploy/kubernetes/base "$work/base.yaml"
play "$work/base.yaml"
wait_http app-pod-0 http://127.0.0.1:9901/readyz 60
post app-pod-0 8080 base-1 base-first
post app-pod-0 8080 base-1 base-retry
check "base: first execution answers 200, Idempotency-Status: stored" \
    eval 'status_is base-first 200 && idempotency_status_is base-first stored' || show base-first
check "base: the retry answers 200, Idempotency-Status: replayed, same body" \
    eval 'status_is base-retry 200 && idempotency_status_is base-retry replayed &&
          same_body base-first base-retry' || show base-retry
check "base: the app executed the request once" executions_are app-pod-0 base-1 1
unplay "$work/base.yaml"

# ---- 2. redis overlay: two replicas sharing one Redis ------------------------------------
log "redis: rendering deploy/kubernetes/redis; the Redis pod first"
password=$(kubectl kustomize deploy/kubernetes/redis | python3 -c '
import sys, yaml
for d in yaml.safe_load_all(sys.stdin):
    if d and d["kind"] == "Secret":
        print(d["stringData"]["password"])')
render deploy/kubernetes/redis "$work/redis.yaml" \
    --keep Secret/onceproxy-redis --keep PersistentVolumeClaim/onceproxy-redis-data \
    --keep Deployment/onceproxy-redis
play "$work/redis.yaml"
redis_ip=$(pod_ip onceproxy-redis-pod-0)
[ -n "$redis_ip" ] || die "the Redis pod has no IP"
deadline=$((SECONDS + 30))
until in_pod onceproxy-redis-pod-0 redis-cli -a "$password" --no-auth-warning ping 2>/dev/null \
    | grep -q PONG; do
    [ $SECONDS -lt $deadline ] || { podman pod logs onceproxy-redis-pod-0 | tail; die "Redis"; }
    sleep 0.5
done
log "redis: Redis answers at $redis_ip; two replicas of the app"
for replica in a b; do
    render deploy/kubernetes/redis "$work/app-$replica.yaml" \
        --keep "Deployment/app" --keep "ConfigMap/*" --rename "app=app-$replica" \
        --host-alias "onceproxy-redis=$redis_ip" --command "app=$draining_app"
    play "$work/app-$replica.yaml"
done
for replica in a b; do
    wait_http "app-$replica-pod-0" http://127.0.0.1:9901/readyz 60
done
post app-a-pod-0 8080 redis-1 redis-first
post app-b-pod-0 8080 redis-1 redis-retry
check "redis: replica a executes: 200, Idempotency-Status: stored" \
    eval 'status_is redis-first 200 && idempotency_status_is redis-first stored' ||
    show redis-first
check "redis: the retry on replica b replays: 200, Idempotency-Status: replayed, same body" \
    eval 'status_is redis-retry 200 && idempotency_status_is redis-retry replayed &&
          same_body redis-first redis-retry' || show redis-retry
check "redis: executed once on a, never on b" \
    eval 'executions_are app-a-pod-0 redis-1 1 && executions_are app-b-pod-0 redis-1 0'

log "redis: SIGTERM to replica a with a slow guarded request in flight"
post app-a-pod-0 8080 redis-slow slow-first -H 'X-Test-Delay-Ms: 3000' &
client=$!
deadline=$((SECONDS + 20))
until [ "$(executions app-a-pod-0 redis-slow 2>/dev/null)" = 1 ]; do
    [ $SECONDS -lt $deadline ] || die "the slow request never reached the app"
    sleep 0.2
done
# What the kubelet does: SIGTERM to the pod's containers, the pod's network (its infra
# container) kept until they have exited. `podman pod stop` (4.3) stops the infra container at
# once, which takes the pod's interface down under the draining proxy: its Redis would vanish.
stop_started=$SECONDS
timeout 10 podman kill --signal TERM app-a-pod-0-onceproxy app-a-pod-0-app >/dev/null
timeout 40 podman wait app-a-pod-0-onceproxy app-a-pod-0-app >/dev/null ||
    die "replica a's containers did not exit within 40 s of SIGTERM"
log "redis: replica a's containers exited $((SECONDS - stop_started)) s after SIGTERM"
wait "$client" || true
check "redis: the in-flight client still gets its answer: 200, stored" \
    eval 'status_is slow-first 200 && idempotency_status_is slow-first stored' ||
    show slow-first
post app-b-pod-0 8080 redis-slow slow-retry
check "redis: its retry on replica b replays (the record is complete)" \
    eval 'status_is slow-retry 200 && idempotency_status_is slow-retry replayed &&
          same_body slow-first slow-retry && executions_are app-b-pod-0 redis-slow 0' ||
    show slow-retry
check "redis: the proxy of replica a drained in time and exited 0" \
    eval '[ "$(podman inspect app-a-pod-0-onceproxy --format "{{.State.ExitCode}}")" = 0 ] &&
          podman logs app-a-pod-0-onceproxy 2>&1 | grep -q "drained, exiting" &&
          ! podman logs app-a-pod-0-onceproxy 2>&1 | grep -q "overran"'

# ---- 3. the sidecar component on an existing Deployment ----------------------------------
log "component: tests/deploy/example-app/classic (sidecar-classic on the shop Deployment)"
kubectl kustomize tests/deploy/example-app/classic >"$work/classic-rendered.yaml"
check "component: the Service now targets the proxy port" \
    grep -q 'targetPort: onceproxy$' "$work/classic-rendered.yaml"
render tests/deploy/example-app/classic "$work/shop.yaml" \
    --host-alias "onceproxy-redis=$redis_ip"
play "$work/shop.yaml"
wait_http shop-pod-0 http://127.0.0.1:15090/readyz 60
post shop-pod-0 15080 shop-1 shop-first
post shop-pod-0 15080 shop-1 shop-retry
check "component: through the sidecar the POST executes once and its retry replays" \
    eval 'status_is shop-first 200 && idempotency_status_is shop-first stored &&
          status_is shop-retry 200 && idempotency_status_is shop-retry replayed &&
          executions_are shop-pod-0 shop-1 1' || { show shop-first; show shop-retry; }

# ---- 4. what podman 4.3 does with the native sidecar form (recorded, not a failure) ------
unplay "$work/shop.yaml"
log "native form: tests/deploy/example-app/native with podman kube play"
render tests/deploy/example-app/native "$work/native.yaml" \
    --host-alias "onceproxy-redis=$redis_ip"
played+=("$work/native.yaml")
pods+=(shop-pod-0)   # a refused play leaves its half-made pod, which kube down does not remove
if timeout 60 podman kube play "$work/native.yaml" >"$work/native.log" 2>&1; then
    log "native form: podman played it: $(podman ps -a --filter pod=shop-pod-0 \
        --format '{{.Names}}={{.Status}}' | tr '\n' ' ')"
else
    log "native form: podman refused it: $(grep -v 'level=' "$work/native.log" | tail -1)"
fi

# ---- 5. the native sidecar lifecycle, with explicit podman commands -----------------------
# What the kubelet does with a native sidecar, on the same images: the proxy starts first and
# the app once the proxy is ready; on shutdown the app gets SIGTERM first and the proxy only
# after the app has exited. The proxy must carry the app's last answer while the app drains.
log "native lifecycle: proxy first, app second; SIGTERM to the app, then to the proxy"
native=onceproxy-native-test
timeout 30 podman pod rm -f "$native" >/dev/null 2>&1 || true
timeout 60 podman pod create --name "$native" >/dev/null
pods+=("$native")
timeout 60 podman run -d --pod "$native" --name "$native-proxy" "$proxy_image" >/dev/null
wait_http "$native" http://127.0.0.1:9901/readyz 30
timeout 60 podman run -d --pod "$native" --name "$native-app" --entrypoint /bin/sh "$app_image" \
    -c "$draining_script" >/dev/null
wait_http "$native" http://127.0.0.1:3000/__health 30
post "$native" 8080 native-slow native-first -H 'X-Test-Delay-Ms: 3000' &
client=$!
deadline=$((SECONDS + 20))
until [ "$(executions "$native" native-slow 2>/dev/null)" = 1 ]; do
    [ $SECONDS -lt $deadline ] || die "the slow request never reached the app"
    sleep 0.2
done
timeout 10 podman kill --signal TERM "$native-app" >/dev/null
timeout 30 podman wait "$native-app" >/dev/null || die "the app did not exit within 30 s"
wait "$client" || true
post "$native" 8080 native-slow native-retry
timeout 10 podman kill --signal TERM "$native-proxy" >/dev/null
timeout 30 podman wait "$native-proxy" >/dev/null || die "the proxy did not exit within 30 s"
check "native lifecycle: the app's last answer reached the client (stored), its retry replays" \
    eval 'status_is native-first 200 && idempotency_status_is native-first stored &&
          status_is native-retry 200 && idempotency_status_is native-retry replayed' ||
    { show native-first; show native-retry; }
check "native lifecycle: the proxy, signalled last, exited 0 without overrunning its drain" \
    eval '[ "$(podman inspect "$native-proxy" --format "{{.State.ExitCode}}")" = 0 ] &&
          ! podman logs "$native-proxy" 2>&1 | grep -q "overran"'
timeout 60 podman pod rm -f "$native" >/dev/null

log "done in $((SECONDS - started)) s, $failures failure(s)"
[ "$failures" -eq 0 ]
