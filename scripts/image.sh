#!/usr/bin/env bash
# Builds the container images with podman, without a registry:
#   localhost/onceproxy:TAG                 the proxy (deploy/Containerfile, stage `runtime`)
#   localhost/onceproxy-test-upstream:TAG   the test upstream, the "app" of tests/deploy/run.sh
#
#   scripts/image.sh [TAG]        (TAG defaults to `dev`; IMAGE_TAG in the environment too)
#
# When no debian:12 image is present it bootstraps one from Debian's archive with mmdebstrap
# (minbase + ca-certificates, without docs and locales as in -slim, ~80 s) and tags it as
# debian:12 and debian:12-slim, the names the Containerfile uses; the tarball is kept in
# build/image/ for the next time. The git commit is passed to the build, so
# `onceproxy --version` names it. Run as root (podman, mmdebstrap).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
tag=${1:-${IMAGE_TAG:-dev}}
cache=build/image

die() { echo "image.sh: $*" >&2; exit 1; }
command -v podman >/dev/null || die "podman is not installed (scripts/install-deps.sh deploy)"

# Two settings container sandboxes like the CI machines need (crun cannot set rlimits or use
# their hybrid cgroups). Only written when the machine has no containers.conf of its own.
if [ ! -e /etc/containers/containers.conf ] && [ "$(id -u)" -eq 0 ]; then
    echo "image.sh: writing /etc/containers/containers.conf (runtime runc, no default ulimits)"
    mkdir -p /etc/containers
    printf '[engine]\nruntime = "runc"\n[containers]\ndefault_ulimits = []\n' \
        >/etc/containers/containers.conf
fi

if ! podman image exists docker.io/library/debian:12 \
    || ! podman image exists docker.io/library/debian:12-slim; then
    mkdir -p "$cache"
    if [ ! -s "$cache/debian12.tar" ]; then
        command -v mmdebstrap >/dev/null ||
            die "mmdebstrap is not installed (scripts/install-deps.sh deploy)"
        echo "image.sh: bootstrapping a Debian 12 base with mmdebstrap"
        # The path excludes of Debian's official -slim images (no docs, man pages, locales);
        # they stay in /etc/dpkg/dpkg.cfg.d, so packages installed later skip them too.
        slim=()
        for p in doc man info groff lintian linda locale; do
            slim+=("--dpkgopt=path-exclude=/usr/share/$p/*")
        done
        slim+=(--dpkgopt='path-include=/usr/share/doc/*/copyright')
        # Merged /usr set up directly, as in the official images; otherwise bookworm's
        # usrmerge package pulls the whole of perl into the base.
        hooks=/usr/share/mmdebstrap/hooks/merged-usr
        [ -d "$hooks" ] && slim+=(--hook-dir="$hooks")
        # mmdebstrap picks the output format from the name: it must end in .tar.
        rm -rf "$cache/debian12.part.tar"
        mmdebstrap --quiet --variant=minbase --include=ca-certificates "${slim[@]}" bookworm \
            "$cache/debian12.part.tar"
        mv "$cache/debian12.part.tar" "$cache/debian12.tar"
    fi
    podman import --quiet "$cache/debian12.tar" localhost/debian:12 >/dev/null
    podman tag localhost/debian:12 docker.io/library/debian:12
    podman tag localhost/debian:12 docker.io/library/debian:12-slim
fi

commit=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
if [ "$commit" != unknown ] && ! git diff --quiet HEAD -- 2>/dev/null; then
    commit="$commit-dirty"
fi
build=(podman build --pull=never --layers -f deploy/Containerfile
       --ignorefile deploy/Containerfile.dockerignore --build-arg "ONCEPROXY_COMMIT=$commit")
"${build[@]}" --target runtime -t "localhost/onceproxy:$tag" .
"${build[@]}" --target test-upstream -t "localhost/onceproxy-test-upstream:$tag" .
podman run --rm "localhost/onceproxy:$tag" --version
podman image ls --format '{{.Repository}}:{{.Tag}} {{.Size}}' \
    | grep -E "^localhost/onceproxy(-test-upstream)?:$tag " || true
