#!/usr/bin/env bash
# Makes the certificates Secret of a kvmesh StatefulSet with `kvmesh cert`: a cluster CA and one
# node certificate per pod name (NAME-0 .. NAME-(N-1)), written as a Secret manifest that holds
# ca.pem and every node's NAME-i.pem and NAME-i.key, never the CA's key.
#
# Why one Secret with a certificate per pod, not a per-pod init step that issues its own: an
# init step would need the CA key inside the cluster, and whoever reads it can mint
# identities; here the CA key stays where you ran this script. The price: scaling past N
# needs this script again with a larger --replicas (existing certificates are kept, the CA
# reused), then `kubectl apply` of the new Secret.
#
#   deploy/kubernetes/make-certs.sh --replicas 4 --namespace llm --out ~/kvmesh-ca
#   kubectl apply -f ~/kvmesh-ca/kvmesh-tls.yaml
set -euo pipefail

usage() {
    cat <<'USAGE'
usage: make-certs.sh --replicas N --out DIR [options]
  --replicas N     pods to issue certificates for: NAME-0 .. NAME-(N-1) (required)
  --out DIR        where the CA (DIR/ca), the node files (DIR/nodes) and the Secret manifest
                   (DIR/SECRET.yaml) go; an existing CA there is reused (required)
  --name NAME      the StatefulSet's name [kvmesh]
  --namespace NS   the Secret's namespace [none: kubectl's current one]
  --secret NAME    the Secret's name [kvmesh-tls]
  --cluster-id ID  recorded in a new CA [kvmesh]
  --days N         validity of new node certificates [365]
  --kvmesh PATH    the kvmesh binary [$KVMESH_BIN, kvmesh on PATH, target/release, target/debug]
USAGE
}

die() {
    echo "make-certs.sh: $*" >&2
    exit 2
}

replicas="" out="" name="kvmesh" namespace="" secret="kvmesh-tls" cluster_id="kvmesh" days=365
kvmesh="${KVMESH_BIN:-}"
while [ $# -gt 0 ]; do
    case "$1" in
        --replicas) replicas="${2:?--replicas needs a value}"; shift 2 ;;
        --out) out="${2:?--out needs a value}"; shift 2 ;;
        --name) name="${2:?--name needs a value}"; shift 2 ;;
        --namespace) namespace="${2:?--namespace needs a value}"; shift 2 ;;
        --secret) secret="${2:?--secret needs a value}"; shift 2 ;;
        --cluster-id) cluster_id="${2:?--cluster-id needs a value}"; shift 2 ;;
        --days) days="${2:?--days needs a value}"; shift 2 ;;
        --kvmesh) kvmesh="${2:?--kvmesh needs a value}"; shift 2 ;;
        -h | --help) usage; exit 0 ;;
        *) usage >&2; die "unknown argument: $1" ;;
    esac
done
[ -n "$replicas" ] || { usage >&2; die "--replicas is required"; }
[ -n "$out" ] || { usage >&2; die "--out is required"; }
[[ "$replicas" =~ ^[1-9][0-9]*$ ]] || die "--replicas must be a positive integer, not '$replicas'"

if [ -z "$kvmesh" ]; then
    repo="$(cd "$(dirname "$0")/../.." && pwd)"
    for candidate in "$(command -v kvmesh || true)" "$repo/target/release/kvmesh" \
        "$repo/target/debug/kvmesh"; do
        if [ -n "$candidate" ] && [ -x "$candidate" ]; then
            kvmesh="$candidate"
            break
        fi
    done
fi
[ -n "$kvmesh" ] && [ -x "$kvmesh" ] ||
    die "no kvmesh binary: build it (cargo build --release -p kvmesh-node) or pass --kvmesh PATH"

ca="$out/ca"
nodes="$out/nodes"
if [ -f "$ca/ca.pem" ] && [ -f "$ca/ca.key" ]; then
    echo "reusing the CA in $ca"
else
    "$kvmesh" cert init --dir "$ca" --cluster-id "$cluster_id" >/dev/null
    echo "created the CA in $ca (keep $ca/ca.key safe and out of the cluster)"
fi
mkdir -p "$nodes"
cp "$ca/ca.pem" "$nodes/ca.pem"
for ((i = 0; i < replicas; i++)); do
    node="$name-$i"
    if [ -f "$nodes/$node.pem" ] && [ -f "$nodes/$node.key" ]; then
        continue # issued by an earlier run; the pod keeps its identity
    fi
    "$kvmesh" cert issue --dir "$ca" --node "$node" --out "$nodes" --days "$days" >/dev/null
done

# The manifest by hand (base64 of each file), so that no cluster and no kubectl is needed.
manifest="$out/$secret.yaml"
{
    echo "# Made by deploy/kubernetes/make-certs.sh: the cluster CA and one node certificate per"
    echo "# pod of StatefulSet $name. Holds private keys: do not commit it."
    echo "apiVersion: v1"
    echo "kind: Secret"
    echo "metadata:"
    echo "  name: $secret"
    [ -z "$namespace" ] || echo "  namespace: $namespace"
    echo "  labels:"
    echo "    app.kubernetes.io/name: $name"
    echo "type: Opaque"
    echo "data:"
    echo "  ca.pem: $(base64 -w0 <"$nodes/ca.pem")"
    # Every node issued so far, also beyond --replicas: scaling down and up again keeps them.
    for file in "$nodes"/*.pem "$nodes"/*.key; do
        base="$(basename "$file")"
        [ "$base" != ca.pem ] || continue
        echo "  $base: $(base64 -w0 <"$file")"
    done
} >"$manifest.tmp"
chmod 600 "$manifest.tmp"
mv "$manifest.tmp" "$manifest"
echo "wrote $manifest: ca.pem and certificates for $name-0 .. $name-$((replicas - 1))"
echo "next: kubectl apply -f $manifest"
