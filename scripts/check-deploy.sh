#!/usr/bin/env bash
# Offline checks of deploy/: the Kubernetes manifests against Kubernetes 1.33's schemas, the
# Prometheus configuration, rules and their unit tests, the Grafana dashboard against Grafana's
# published schema. Installs the tools it needs (scripts/lib/deploy-tools.sh); a check whose
# tool cannot be installed is skipped with a message. Exits non-zero if any check fails.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/deploy-tools.sh

KUBERNETES_VERSION=1.33.0
failed=0
check() { # DESCRIPTION COMMAND...
    local what=$1
    shift
    if "$@"; then
        echo "ok: $what"
    else
        echo "FAILED: $what" >&2
        failed=1
    fi
}

ensure_deploy_tools

# Every kustomization: the base and each overlay.
kustomizations=(deploy/kubernetes/base deploy/kubernetes/overlays/*/)
validate_kustomization() {
    kubectl kustomize "$1" | kubernetes-validate --strict --quiet -k "$KUBERNETES_VERSION" -
}
if deploy_tool_ok kubectl && deploy_tool_ok kubernetes-validate; then
    for kustomization in "${kustomizations[@]}"; do
        check "$kustomization is valid Kubernetes $KUBERNETES_VERSION" \
            validate_kustomization "${kustomization%/}"
    done
fi

if deploy_tool_ok promtool; then
    check "Prometheus rules" promtool check rules deploy/prometheus/rules/*.yml
    # Debian's promtool is built without Kubernetes discovery, so only the static
    # configuration can be checked here (tests/tests/deploy_kubernetes.rs checks the other's
    # pod label and port names against the manifests).
    check "Prometheus static configuration" \
        promtool check config deploy/prometheus/prometheus-static.yml
    check "Prometheus rule unit tests" \
        bash -c 'cd deploy/prometheus && promtool test rules tests/*.test.yml'
fi

# The dashboard as a TypeScript object literal typed as @grafana/schema's Dashboard: tsc
# rejects unknown fields (excess property checks), wrong types and missing required fields.
check_dashboard() {
    local dir="$DEPLOY_TOOLS_DIR/grafana" check
    check="$dir/kvmesh-dashboard-check.ts"
    {
        echo "import type { Dashboard } from '@grafana/schema';"
        printf 'export const dashboard: Dashboard = '
        cat deploy/grafana/kvmesh.json
        echo ";"
    } >"$check"
    "$dir/node_modules/.bin/tsc" --noEmit --strict --skipLibCheck --target es2022 \
        --module esnext --moduleResolution bundler "$check"
}
if deploy_tool_ok grafana-schema; then
    check "deploy/grafana/kvmesh.json against @grafana/schema $GRAFANA_SCHEMA_VERSION" check_dashboard
fi

if [ ${#MISSING_TOOLS[@]} -gt 0 ]; then
    echo "!! deploy checks SKIPPED for lack of: ${MISSING_TOOLS[*]}" >&2
fi
exit "$failed"
