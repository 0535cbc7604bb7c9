#!/usr/bin/env bash
# Installs onceproxy's build, test and bench dependencies from Debian 12 packages.
# Idempotent: returns at once when every package is already installed.
set -euo pipefail
pkgs=(g++ cmake ninja-build pkg-config ccache libssl-dev openssl
      libboost1.81-dev libboost-json1.81-dev libboost-url1.81-dev libboost-system1.81-dev
      libhiredis-dev libnghttp2-dev libyaml-cpp-dev libjemalloc-dev doctest-dev redis-server redis-tools
      libpq-dev postgresql-15 util-linux
      curl python3 python3-h2 python3-grpcio nginx-light wrk nghttp2-client
      prometheus chromium)
# prometheus is here for promtool (the alert rule tests, deploy/monitoring/); like
# postgresql-15 it also installs a service, which on a systemd host starts and listens on
# :9090 (no test uses that port): `systemctl disable --now prometheus` if it is not wanted.
# chromium (headless) loads the admin listener's status page in integration.status_page_test.
# Optional groups, any number of them:
#   fuzz    clang and its libFuzzer runtime (make fuzz)
#   deploy  podman, buildah and mmdebstrap (make image, make deploy-test), yamllint for the
#           manifests; kubectl is not a Debian 12 package (see deploy/README.md)
for group in "$@"; do
  case "$group" in
  fuzz) pkgs+=(clang libclang-rt-14-dev) ;;
  deploy) pkgs+=(podman buildah mmdebstrap catatonit runc uidmap yamllint) ;;
  *) echo "install-deps.sh: unknown group '$group' (fuzz, deploy)" >&2; exit 2 ;;
  esac
done
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "installing: ${missing[*]}"
if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; else SUDO=; fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
