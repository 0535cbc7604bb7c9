# The two commands of the README: `make run` and `make test`. Both install what is missing
# (Debian 12 packages, as root) before building.
.PHONY: deps build run test test-build test-tsan check-config bench soak soak-short format clean \
        conformance-report fuzz fuzz-build image deploy-deps deploy-lint deploy-test \
        failover-chaos failover-chaos-short screenshot

JOBS ?= $(shell nproc)

deps:
	@scripts/install-deps.sh

build: deps
	@cmake --preset release >/dev/null
	@cmake --build --preset release -j $(JOBS) --target onceproxy onceproxy_test_upstream onceproxy_grpc_load onceproxy_syscall_cost onceproxy_floor_proxy

run: build
	@scripts/demo.sh build/release

test-build: deps
	@cmake --preset test >/dev/null
	@cmake --build --preset test -j $(JOBS)

# Every shipped config must load: examples and deployment files (the Redis overlay and the
# sidecar components take their password, Redis address and app port from the environment).
check-config: test-build
	@REDIS_PASSWORD=check ONCEPROXY_REDIS_ADDRESS=redis:6379 ONCEPROXY_APP_PORT=3000 \
	  build/test/src/onceproxy --check-config conf/*.yaml \
	  deploy/container/onceproxy.yaml deploy/kubernetes/*/onceproxy.yaml \
	  deploy/kubernetes/components/*/onceproxy.yaml

# Every test: unit and integration (ASan+UBSan), the ThreadSanitizer pass, then every libFuzzer
# target briefly (TEST_FUZZ_SECONDS each; `make fuzz` runs them longer).
TEST_FUZZ_SECONDS ?= 10
test: test-build check-config
	@ctest --preset test -j $(JOBS)
	@$(MAKE) --no-print-directory test-tsan
	@$(MAKE) --no-print-directory fuzz FUZZ_SECONDS=$(TEST_FUZZ_SECONDS)

# The multi-worker suites again under ThreadSanitizer. Reports go to files (the proxies run as
# child processes, whose stderr the tests do not read); any report fails the target.
TSAN_TARGETS = onceproxy onceproxy_test_upstream unit_store it_proxy_test it_idempotency_test \
               it_postgres_proxy_test it_egress_test
TSAN_REPORTS = $(CURDIR)/build/tsan/reports
test-tsan: deps
	@cmake --preset tsan >/dev/null
	@cmake --build --preset tsan -j $(JOBS) --target $(TSAN_TARGETS)
	@rm -rf $(TSAN_REPORTS) && mkdir -p $(TSAN_REPORTS)
	@TSAN_OPTIONS="log_path=$(TSAN_REPORTS)/tsan halt_on_error=0" \
	  ctest --preset tsan -j $(JOBS) -R '^(unit\.store|integration\.(proxy|idempotency|postgres_proxy|egress)_test)$$'
	@if ls $(TSAN_REPORTS)/tsan* >/dev/null 2>&1; then \
	  head -c 20000 $(TSAN_REPORTS)/tsan*; echo "ThreadSanitizer reported problems (above)"; exit 1; \
	else echo "ThreadSanitizer: no reports"; fi

# docs/images/status-page.png: the admin listener's status page in headless Chromium, taken by
# the status page test under its light traffic (a guarded route, an observed one, plain GETs).
screenshot: test-build
	@mkdir -p docs/images
	@ONCEPROXY_SCREENSHOT=$(CURDIR)/docs/images/status-page.png \
	  build/test/tests/it_status_page_test -tc='*Chromium*'
	@echo "wrote docs/images/status-page.png"

# libFuzzer targets (clang, ASan+UBSan) over the parsers that read peer input; each runs for
# FUZZ_SECONDS (default 60) from the seeds in tests/fuzz/corpus/. CI runs them briefly.
fuzz-build:
	@scripts/install-deps.sh fuzz
	@cmake --preset fuzz >/dev/null
	@cmake --build --preset fuzz -j $(JOBS) --target fuzzers

fuzz: fuzz-build
	@scripts/fuzz.sh

# docs/CONFORMANCE.md: every MUST/SHOULD of the Idempotency-Key draft and every README guarantee
# (docs/conformance/requirements.txt) with the tests that check it, run now, and their results.
conformance-report: test-build
	@python3 scripts/conformance-report.py --build build/test --out docs/CONFORMANCE.md

# bench/run.sh defaults to build/rel (bench/README.md's manual build); `make build` builds
# the release preset into build/release.
# It adds the HTTP/2 rows, the gRPC rows (h2load, and the release build's
# bench/onceproxy_grpc_load) and the PostgreSQL store's rows (a private postgresql-15 server;
# bench/run.sh leaves all three out by default) unless BENCH_SCENARIOS says otherwise.
bench: build
	@BENCH_BUILD_DIR=$(CURDIR)/build/release BENCH_SCENARIOS="$${BENCH_SCENARIOS:-default,h2,grpc,pg}" bench/run.sh

# Container images with podman (no registry needed: the debian:12 base is bootstrapped with
# mmdebstrap when absent): localhost/onceproxy:$(IMAGE_TAG) and the test upstream beside it.
IMAGE_TAG ?= dev
deploy-deps:
	@scripts/install-deps.sh deploy

image: deploy-deps
	@scripts/image.sh $(IMAGE_TAG)

# Manifests: yamllint, then every Kustomize directory renders (kubectl kustomize).
deploy-lint: deploy-deps
	@tests/deploy/lint.sh

# The images, then the Kustomize directories rendered and run as pods with `podman kube play`:
# replay across retries and replicas, SIGTERM with a request in flight (tests/deploy/run.sh).
deploy-test: deploy-lint image
	@IMAGE_TAG=$(IMAGE_TAG) tests/deploy/run.sh

# Mixed traffic with faults (proxy SIGKILL, Redis restarts, upstream resets and stalls) through
# two proxies sharing one Redis, then checks at-most-once, replays and flat RSS
# (tests/soak/README.md). SOAK_SECONDS (default 600) sets the load time; CI runs soak-short.
SOAK_SECONDS ?= 600
soak: build
	@SOAK_SECONDS=$(SOAK_SECONDS) python3 tests/soak/soak.py --build build/release

soak-short: build
	@SOAK_SECONDS=60 SOAK_FAULT_INTERVAL=10 python3 tests/soak/soak.py --build build/release

# Two proxies under a load of unique keys while the store's primary is SIGKILLed every
# FAILOVER_INTERVAL s; then every key is retried and duplicate executions are counted. Redis
# behind Sentinel (a master, two replicas, three sentinels) with durability async and
# replicated, then PostgreSQL with a synchronous standby (promoted on each kill, the killed node
# rebuilt as its standby) (tests/soak/README.md). The short form (CI) takes about 3 minutes.
FAILOVER_SECONDS ?= 120
FAILOVER_INTERVAL ?= 15
failover-chaos: build
	@for d in async replicated postgres; do python3 tests/soak/soak.py --build build/release \
	  --failover $$d --seconds $(FAILOVER_SECONDS) --fault-interval $(FAILOVER_INTERVAL) \
	  --clients 8 || exit 1; done

failover-chaos-short: build
	@for d in async replicated; do python3 tests/soak/soak.py --build build/release \
	  --failover $$d --seconds 30 --fault-interval 12 --clients 8 || exit 1; done
	@python3 tests/soak/soak.py --build build/release --failover postgres --seconds 40 \
	  --fault-interval 20 --clients 8

format:
	@git ls-files '*.cpp' '*.hpp' | xargs clang-format -i

clean:
	@rm -rf build
