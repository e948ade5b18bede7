# The tools the offline checks of deploy/ need, installed when missing (sourced by
# check-deploy.sh and test.sh). Each ensure_* either makes its tool available or adds it to
# MISSING_TOOLS with a visible message; nothing is skipped silently.
#
#   kubectl              renders the kustomizations (kubectl kustomize); not installable from
#                        Debian (its kubernetes-client is 1.20, whose kustomize is too old)
#   kubernetes-validate  validates them against Kubernetes 1.33's schemas (PyPI)
#   promtool             checks and unit-tests the Prometheus rules (Debian's prometheus)
#   grafana-schema       tsc and @grafana/schema (npm), to type-check the Grafana dashboard
#   chromium             runs /dashboard's script in tests/tests/dashboard.rs (Debian)
#   playwright           playwright-core (npm), which drives that Chromium on an open page
#   nft                  nftables (Debian), for partitions and loss between sidecars on
#                        loopback in tests/tests/network_faults.rs; needs root

MISSING_TOOLS=()
# npm packages for the dashboard check, pinned: a new schema release must not break CI unseen.
GRAFANA_SCHEMA_VERSION=13.2.3
TYPESCRIPT_VERSION=5.9.3
PLAYWRIGHT_CORE_VERSION=1.65.2
DEPLOY_TOOLS_DIR="${CARGO_TARGET_DIR:-target}/deploy-tools"

deploy_tool_missing() { # NAME WHY
    echo "!! missing $1: $2" >&2
    MISSING_TOOLS+=("$1")
}

apt_install() { # PACKAGE...
    command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ] || return 1
    if [ -z "${DEPLOY_TOOLS_APT_UPDATED:-}" ]; then
        apt-get update -qq >/dev/null 2>&1 || true
        DEPLOY_TOOLS_APT_UPDATED=1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

ensure_kubectl() {
    command -v kubectl >/dev/null 2>&1 ||
        deploy_tool_missing kubectl "kubectl is not installed (install a kubectl >= 1.22)"
}

ensure_kubernetes_validate() {
    command -v kubernetes-validate >/dev/null 2>&1 && return 0
    echo "installing kubernetes-validate (PyPI)"
    python3 -m pip install --quiet kubernetes-validate >/dev/null 2>&1 ||
        pip3 install --quiet kubernetes-validate >/dev/null 2>&1 || true
    command -v kubernetes-validate >/dev/null 2>&1 ||
        deploy_tool_missing kubernetes-validate "pip install kubernetes-validate failed"
}

ensure_promtool() {
    command -v promtool >/dev/null 2>&1 && return 0
    echo "installing promtool (Debian's prometheus package)"
    apt_install prometheus || true
    command -v promtool >/dev/null 2>&1 ||
        deploy_tool_missing promtool "apt-get install prometheus failed (not Debian, or not root)"
}

ensure_grafana_schema() {
    local dir="$DEPLOY_TOOLS_DIR/grafana"
    if [ -x "$dir/node_modules/.bin/tsc" ] &&
        grep -q "\"version\": \"$GRAFANA_SCHEMA_VERSION\"" \
            "$dir/node_modules/@grafana/schema/package.json" 2>/dev/null; then
        return 0
    fi
    if ! command -v npm >/dev/null 2>&1; then
        echo "installing node and npm (Debian)"
        apt_install nodejs npm || true
    fi
    if ! command -v npm >/dev/null 2>&1; then
        deploy_tool_missing grafana-schema "npm is not installed and could not be"
        return 0
    fi
    echo "installing @grafana/schema@$GRAFANA_SCHEMA_VERSION and typescript@$TYPESCRIPT_VERSION (npm)"
    mkdir -p "$dir"
    npm install --prefix "$dir" --no-audit --no-fund --silent \
        "@grafana/schema@$GRAFANA_SCHEMA_VERSION" "typescript@$TYPESCRIPT_VERSION" >/dev/null 2>&1 || true
    [ -x "$dir/node_modules/.bin/tsc" ] ||
        deploy_tool_missing grafana-schema "npm install @grafana/schema typescript failed"
}

ensure_chromium() {
    command -v chromium >/dev/null 2>&1 && return 0
    echo "installing chromium (Debian), for the /dashboard test"
    apt_install chromium || true
    command -v chromium >/dev/null 2>&1 ||
        deploy_tool_missing chromium "apt-get install chromium failed (not Debian, or not root)"
}

ensure_playwright() {
    local dir="$DEPLOY_TOOLS_DIR/browser"
    grep -q "\"version\": \"$PLAYWRIGHT_CORE_VERSION\"" \
        "$dir/node_modules/playwright-core/package.json" 2>/dev/null && return 0
    if command -v npm >/dev/null 2>&1; then
        echo "installing playwright-core@$PLAYWRIGHT_CORE_VERSION (npm; it uses Debian's chromium)"
        mkdir -p "$dir"
        npm install --prefix "$dir" --no-audit --no-fund --silent \
            "playwright-core@$PLAYWRIGHT_CORE_VERSION" >/dev/null 2>&1 || true
    fi
    [ -f "$dir/node_modules/playwright-core/package.json" ] ||
        deploy_tool_missing playwright "npm install playwright-core failed (or no npm)"
}

ensure_nft() {
    if ! command -v nft >/dev/null 2>&1; then
        echo "installing nftables (Debian), for the network fault tests"
        apt_install nftables || true
    fi
    nft list tables >/dev/null 2>&1 ||
        deploy_tool_missing nft "nftables is not installed or may not change the ruleset (not root)"
}

ensure_deploy_tools() {
    MISSING_TOOLS=()
    ensure_kubectl
    ensure_kubernetes_validate
    ensure_promtool
    ensure_grafana_schema
    ensure_chromium
    ensure_playwright
    ensure_nft
}

deploy_tool_ok() { # NAME
    local tool
    for tool in "${MISSING_TOOLS[@]}"; do [ "$tool" != "$1" ] || return 1; done
    return 0
}
