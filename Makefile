# The two commands of the README: `make run` and `make test`. Both install what is missing
# (Debian 12 packages, as root) before building.
.PHONY: deps build run test test-build check-config bench format clean

JOBS ?= $(shell nproc)

deps:
	@scripts/install-deps.sh

build: deps
	@cmake --preset release >/dev/null
	@cmake --build --preset release -j $(JOBS) --target onceproxy onceproxy_test_upstream

run: build
	@scripts/demo.sh build/release

test-build: deps
	@cmake --preset test >/dev/null
	@cmake --build --preset test -j $(JOBS)

check-config: test-build
	@build/test/src/onceproxy --check-config conf/*.yaml

test: test-build check-config
	@ctest --preset test -j $(JOBS)

bench: build
	@bench/run.sh

format:
	@git ls-files '*.cpp' '*.hpp' | xargs clang-format -i

clean:
	@rm -rf build
