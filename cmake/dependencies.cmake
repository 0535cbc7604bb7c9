# Every dependency comes from a Debian 12 package (scripts/install-deps.sh).
find_package(Threads REQUIRED)
find_package(Boost 1.81 REQUIRED CONFIG COMPONENTS json url)
find_package(OpenSSL 3 REQUIRED)
find_package(yaml-cpp REQUIRED)
find_package(PkgConfig REQUIRED)
pkg_check_modules(HIREDIS REQUIRED IMPORTED_TARGET hiredis>=0.14)
# HTTP/2: nghttp2's sans-io session (Debian 12: 1.52).
pkg_check_modules(NGHTTP2 REQUIRED IMPORTED_TARGET libnghttp2>=1.52)
# PostgreSQL: libpq >= 14 for pipeline mode (Debian 12: libpq-dev 15).
pkg_check_modules(LIBPQ REQUIRED IMPORTED_TARGET libpq>=14)
# jemalloc as the proxy's allocator (README "Benchmark": about 12 % fewer instructions per
# proxied request than glibc's malloc, whose thread cache does not hold the coroutine frames and
# header fields a request allocates). Sanitizers bring their own allocator.
set(ONCEPROXY_USE_JEMALLOC OFF)
if(ONCEPROXY_JEMALLOC AND NOT ONCEPROXY_SANITIZE)
  pkg_check_modules(JEMALLOC REQUIRED IMPORTED_TARGET jemalloc>=5)
  set(ONCEPROXY_USE_JEMALLOC ON)
endif()
if(ONCEPROXY_BUILD_TESTS)
  find_package(doctest REQUIRED)
endif()

find_program(CCACHE_PROGRAM ccache)
if(CCACHE_PROGRAM)
  set(CMAKE_CXX_COMPILER_LAUNCHER ${CCACHE_PROGRAM})
endif()
