#!/usr/bin/env bash
# The manifests: yamllint over deploy/ and tests/deploy/ (rules in deploy/.yamllint), then every
# Kustomize directory must render with `kubectl kustomize` (Kustomize 5). Takes seconds.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
command -v yamllint >/dev/null || { echo "yamllint is missing (scripts/install-deps.sh deploy)"; exit 1; }
command -v kubectl >/dev/null || { echo "kubectl is missing (it brings Kustomize)"; exit 1; }
yamllint --strict -c deploy/.yamllint deploy/ tests/deploy/
dirs=(deploy/kubernetes/base deploy/kubernetes/redis
      tests/deploy/example-app/app tests/deploy/example-app/native tests/deploy/example-app/classic)
for dir in "${dirs[@]}"; do
    kubectl kustomize "$dir" >/dev/null || { echo "kubectl kustomize $dir failed"; exit 1; }
done
echo "manifests: yamllint clean, ${#dirs[@]} Kustomize directories render"
