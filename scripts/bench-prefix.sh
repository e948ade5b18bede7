#!/usr/bin/env bash
# Prefix summaries on the real mesh (issue 5's benchmarks), two parts:
#
#   steady   per workload (gsp, the Mooncake trace): 4 modelled engines + 4 sidecars, the
#            demo's load (kvmesh-sim load, random entry nodes); each sidecar's /metrics read
#            when the load starts, half-way and at the end. Prints per node: summary bytes,
#            index fill, estimated false-match rate, shard churn, gossip bytes in/out per
#            second and the sidecar's CPU (share of one core) over the second half of the run
#            (the steady state).
#   converge for 3 and 8 nodes: a request with a new long prefix enters at one node; every
#            node's POST /debug/match is polled until each lists the engine that served it as
#            holding the whole chain. Prints median and max over the trials, and the median
#            time at the nodes that neither served the request nor took it in (what the
#            simulator's gossip delay is calibrated against).
#
# Figures go to BENCHMARKS.md by hand. Every process started here runs in its own process
# group and is killed on exit, error or Ctrl-C.
#
# Usage: scripts/bench-prefix.sh [--bin-dir DIR] [--part steady|converge|all]
#            [--workload gsp,trace] [--duration 40] [--sizes 3,8] [--trials 10]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)

BIN_DIR=; PART=all; WORKLOADS=gsp,trace; DURATION=40; SIZES=3,8; TRIALS=10; NODES=4
while [[ $# -gt 0 ]]; do
    case $1 in
        --bin-dir) BIN_DIR=$2; shift 2 ;;
        --part) PART=$2; shift 2 ;;
        --workload) WORKLOADS=$2; shift 2 ;;
        --duration) DURATION=$2; shift 2 ;;
        --sizes) SIZES=$2; shift 2 ;;
        --trials) TRIALS=$2; shift 2 ;;
        -h | --help) sed -n '2,18p' "$0"; exit 0 ;;
        *) echo "bench-prefix.sh: unknown option $1" >&2; exit 2 ;;
    esac
done
case $PART in steady | converge | all) ;; *) echo "--part steady|converge|all" >&2; exit 2 ;; esac
[[ $DURATION =~ ^[0-9]+$ && $DURATION -ge 10 ]] || { echo "--duration: an integer >= 10" >&2; exit 2; }
[[ $TRIALS =~ ^[0-9]+$ && $TRIALS -ge 1 ]] || { echo "--trials: a positive integer" >&2; exit 2; }
command -v python3 >/dev/null || { echo "bench-prefix.sh needs python3" >&2; exit 2; }

if [[ -z $BIN_DIR ]]; then
    (cd "$ROOT" && cargo build --release -p kvmesh-node -p kvmesh-sim --bins)
    BIN_DIR="${CARGO_TARGET_DIR:-$ROOT/target}/release"
fi
BIN_DIR=$(cd "$BIN_DIR" && pwd)
KVMESH="$BIN_DIR/kvmesh"
SIM="$BIN_DIR/kvmesh-sim"
[[ -x $KVMESH && -x $SIM ]] || { echo "no kvmesh / kvmesh-sim in $BIN_DIR" >&2; exit 1; }

T0=$(date +%s)
log() { printf '[bench-prefix %4ss] %s\n' "$(($(date +%s) - T0))" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# --- processes (scripts/lib/processes.sh) ------------------------------------------------------
WORK=$(mktemp -d "${TMPDIR:-/tmp}/kvmesh-bench-prefix.XXXXXX")
mkdir -p "$WORK/logs"
# shellcheck source=lib/processes.sh
source "$ROOT/scripts/lib/processes.sh"
cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    trap '' PIPE
    [[ ${#GROUPS_ALIVE[@]} -gt 0 ]] && kill_groups "${GROUPS_ALIVE[@]}"
    if [[ $rc -ne 0 ]]; then log "logs of the processes: $WORK/logs"; else rm -rf "$WORK"; fi
    exit "$rc"
}
trap cleanup EXIT
trap 'log "interrupted"; exit 130' INT
trap 'exit 143' TERM

wait_line() { # FILE REGEX SECONDS PID: prints the first matching line
    local file=$1 re=$2 deadline=$(($(date +%s) + $3)) pid=$4 line
    while :; do
        line=$(grep -m1 -E "$re" "$file" 2>/dev/null || true)
        [[ -n $line ]] && { printf '%s\n' "$line"; return 0; }
        kill -0 "$pid" 2>/dev/null || { tail -n 20 "$file" >&2; return 1; }
        [[ $(date +%s) -ge $deadline ]] && { tail -n 20 "$file" >&2; return 1; }
        sleep 0.1
    done
}

# --- cluster --------------------------------------------------------------------------------
ENGINE_URLS=(); ENGINE_PIDS=(); SIDECAR_ADDRS=(); SIDECAR_PIDS=()
TLS_DIR="$WORK/tls"
"$KVMESH" cert init --dir "$TLS_DIR" >/dev/null
ISSUED=0
issue_certs() { # N: node-1..node-N
    local i
    for ((i = ISSUED + 1; i <= $1; i++)); do
        "$KVMESH" cert issue --dir "$TLS_DIR" --node "node-$i" >/dev/null
    done
    ((ISSUED < $1)) && ISSUED=$1
    return 0
}
start_cluster() { # TAG N ENGINE_ARGS...: N engines, N sidecars seeded with node-1, converged
    local tag=$1 n=$2 i line seed=
    shift 2
    ENGINE_URLS=(); ENGINE_PIDS=(); SIDECAR_ADDRS=(); SIDECAR_PIDS=()
    issue_certs "$n"
    for ((i = 1; i <= n; i++)); do
        spawn "$tag-engine-$i" "$SIM" engine --port 0 --model mock-model --engine-index "$i" --seed "$i" "$@"
        ENGINE_PIDS+=("$SPAWNED_PID")
    done
    for ((i = 1; i <= n; i++)); do
        line=$(wait_line "$WORK/logs/$tag-engine-$i.log" 'listening on http://' 30 "${ENGINE_PIDS[i - 1]}") ||
            die "engine $i did not start"
        ENGINE_URLS+=("${line##* }")
    done
    for ((i = 1; i <= n; i++)); do
        spawn "$tag-node-$i" "$KVMESH" serve --backend "${ENGINE_URLS[i - 1]}" --listen 127.0.0.1:0 \
            --mesh 127.0.0.1:0 --node-id "node-$i" --tls-dir "$TLS_DIR" ${seed:+--seeds "$seed"}
        SIDECAR_PIDS+=("$SPAWNED_PID")
        # "kvmesh listening on http://HTTP mesh MESH node NAME"
        line=$(wait_line "$WORK/logs/$tag-node-$i.log" 'kvmesh listening on http://' 30 "$SPAWNED_PID") ||
            die "sidecar node-$i did not start"
        SIDECAR_ADDRS+=("$(sed -E 's/.*listening on http:\/\/([^ ]+).*/\1/' <<<"$line")")
        [[ -z $seed ]] && seed=$(sed -E 's/.* mesh ([^ ]+).*/\1/' <<<"$line")
    done
    local deadline=$(($(date +%s) + 60)) ok
    while :; do
        ok=0
        for ((i = 0; i < n; i++)); do
            [[ $(curl -fsS --max-time 5 "http://${SIDECAR_ADDRS[i]}/debug/cluster" 2>/dev/null |
                grep -o '"age_ms"' | wc -l) -ge $((n - 1)) ]] && ok=$((ok + 1))
        done
        [[ $ok -eq $n ]] && break
        [[ $(date +%s) -ge $deadline ]] && die "$n nodes did not converge within 60 s ($ok see all peers)"
        sleep 0.2
    done
    log "$tag: $n engines and $n sidecars up, every node sees $((n - 1)) peers"
}
stop_cluster() {
    kill_groups "${SIDECAR_PIDS[@]}" "${ENGINE_PIDS[@]}"
    SIDECAR_PIDS=(); ENGINE_PIDS=()
}

# scrape LABEL: appends "LABEL unix_seconds node metric value" lines for every sidecar
scrape() {
    local label=$1 i now
    for ((i = 0; i < ${#SIDECAR_ADDRS[@]}; i++)); do
        now=$(date +%s.%N)
        curl -fsS --max-time 5 "http://${SIDECAR_ADDRS[i]}/metrics" |
            grep -E '^kvmesh_(prefix_shard_bytes|prefix_shards_published|prefix_false_match_rate|index_blocks|index_capacity_blocks|mesh_gossip_sent_bytes|mesh_gossip_received_bytes|served)' |
            awk -v l="$label" -v t="$now" -v n="node-$((i + 1))" '{ print l, t, n, $1, $2 }' >>"$SCRAPES"
        # The sidecar's CPU time so far (user + system clock ticks of /proc/PID/stat).
        awk -v l="$label" -v t="$now" -v n="node-$((i + 1))" \
            '{ print l, t, n, "cpu_ticks", $14 + $15 }' "/proc/${SIDECAR_PIDS[i]}/stat" >>"$SCRAPES"
    done
}

# --- part 1: steady state on the demo's workloads -------------------------------------------
# The engines and the load are scripts/demo.sh's (keep them in step): gsp 2048-token system
# prompts x 16 questions at 16 req/s on 4096-block engines; the Mooncake trace compressed into
# the run, prompts clipped to 2048 tokens, on 16384-block engines at --time-scale 0.3.
steady() {
    local w=$1 engine_args load_args
    case $w in
        gsp)
            local groups=$((16 * DURATION / 16))
            engine_args=(--kv-blocks 4096 --block-size 16)
            load_args=(--rate 16 --gsp-groups "$groups" --gsp-prompts-per-group 16 --gsp-system-len 2048
                --gsp-question-len 128 --gsp-output-len 128)
            ;;
        trace)
            engine_args=(--kv-blocks 16384 --block-size 16 --time-scale 0.3)
            load_args=(--time-scale "$(awk -v d="$DURATION" 'BEGIN { printf "%.4f", d / 1022.0 }')"
                --max-input-tokens 2048 --max-output-tokens 64)
            ;;
        *) die "unknown workload $w" ;;
    esac
    start_cluster "$w" "$NODES" "${engine_args[@]}"
    SCRAPES="$WORK/$w.scrapes"
    : >"$SCRAPES"
    local targets engines
    targets=$(printf 'http://%s,' "${SIDECAR_ADDRS[@]}"); targets=${targets%,}
    engines=$(IFS=,; echo "${ENGINE_URLS[*]}")
    scrape start
    spawn "$w-load" "$SIM" load --targets "$targets" --pick random --engines "$engines" \
        --workload "$w" --stream --seed 7 --timeout 120 --threads 1 --json "$WORK/$w-load.json" "${load_args[@]}"
    local load=$SPAWNED_PID
    sleep $((DURATION / 2))
    scrape mid
    local rc=0
    wait "$load" || rc=$?
    scrape end
    kill_groups "$load"
    [[ $rc -eq 0 ]] || { tail -n 20 "$WORK/logs/$w-load.log" >&2; die "the load generator failed on $w"; }
    log "$w: $(grep -E '^requests:' "$WORK/logs/$w-load.log" || true)"
    stop_cluster
    python3 - "$w" "$SCRAPES" "$(getconf CLK_TCK)" <<'PY'
import sys, collections
workload, path, ticks_per_s = sys.argv[1], sys.argv[2], float(sys.argv[3])
at = collections.defaultdict(dict)   # (label, node) -> metric -> value
when = {}
for line in open(path):
    label, t, node, metric, value = line.split()
    name = metric.split("{")[0]
    at[(label, node)][name] = at[(label, node)].get(name, 0.0) + float(value)
    when[(label, node)] = float(t)
nodes = sorted({node for (_, node) in at}, key=lambda n: int(n.split("-")[1]))
def rate(node, metric):
    dt = when[("end", node)] - when[("mid", node)]
    return (at[("end", node)].get(metric, 0) - at[("mid", node)].get(metric, 0)) / dt
print(f"\n{workload}: steady state = from half-way to the end of the load")
print("| node | served | index blocks / capacity | summary bytes | est. false match | shards/s | gossip out B/s | gossip in B/s | sidecar CPU |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
rows = []
for node in nodes:
    end = at[("end", node)]
    served = end.get("kvmesh_served_total", 0) - at[("start", node)].get("kvmesh_served_total", 0)
    row = (served, end.get("kvmesh_index_blocks", 0), end.get("kvmesh_index_capacity_blocks", 0),
           end.get("kvmesh_prefix_shard_bytes", 0), end.get("kvmesh_prefix_false_match_rate", 0),
           rate(node, "kvmesh_prefix_shards_published_total"),
           rate(node, "kvmesh_mesh_gossip_sent_bytes_total"),
           rate(node, "kvmesh_mesh_gossip_received_bytes_total"),
           rate(node, "cpu_ticks") / ticks_per_s)
    rows.append(row)
    print(f"| {node} | {row[0]:.0f} | {row[1]:.0f} / {row[2]:.0f} | {row[3]:.0f} | {row[4]*100:.3f}% | {row[5]:.1f} | {row[6]:.0f} | {row[7]:.0f} | {row[8]*100:.1f}% |")
mean = [sum(r[i] for r in rows) / len(rows) for i in range(9)]
print(f"| mean | {mean[0]:.0f} | {mean[1]:.0f} / {mean[2]:.0f} | {mean[3]:.0f} | {mean[4]*100:.3f}% | {mean[5]:.1f} | {mean[6]:.0f} | {mean[7]:.0f} | {mean[8]*100:.1f}% |")
PY
}

# --- part 2: time for a new prefix to be known by every node --------------------------------
converge() {
    local n=$1
    start_cluster "converge$n" "$n" --instant
    log "converge$n: $TRIALS trials"
    python3 - "$TRIALS" "${SIDECAR_ADDRS[@]}" <<'PY'
import http.client, json, os, statistics, sys, time
trials, addrs = int(sys.argv[1]), sys.argv[2:]
conns = {}
def post(addr, path, body, fresh=False):
    if fresh or addr not in conns:
        host, port = addr.rsplit(":", 1)
        conns[addr] = http.client.HTTPConnection(host, int(port), timeout=10)
    conn = conns[addr]
    conn.request("POST", path, body=json.dumps(body), headers={"content-type": "application/json"})
    response = conn.getresponse()
    return response, response.read()
words = "the router sends every prefix home quickly while engines keep their caches warm".split()
times = []
# Per node that neither served the request nor took it in: the time from the request to that
# node's view of the owner holding it (what the simulator's gossip lag models: the owner's
# publish tick, then gossip).
peer_times = []
for trial in range(trials):
    tag = os.urandom(8).hex()
    prompt = f"trial {tag}: " + " ".join(words[(i * 7 + trial) % len(words)] for i in range(1600))
    body = {"model": "mock-model", "prompt": prompt, "max_tokens": 1}
    entry = addrs[trial % len(addrs)]
    sent = time.monotonic()
    response, _ = post(entry, "/v1/completions", body)
    if response.status != 200:
        sys.exit(f"the request failed: HTTP {response.status}")
    owner = response.getheader("x-kvmesh-node")
    answered = time.monotonic() - sent
    known = {}
    deadline = sent + 30
    while len(known) < len(addrs):
        if time.monotonic() > deadline:
            sys.exit(f"trial {trial}: only {sorted(known)} learned within 30 s")
        for addr in addrs:
            if addr in known:
                continue
            _, raw = post(addr, "/debug/match", body)
            view = json.loads(raw)
            if any(n["node"] == owner and n["matched_blocks"] == view["blocks"] for n in view["nodes"]):
                known[addr] = time.monotonic() - sent
        time.sleep(0.002)
    last = max(known.values())
    times.append(last)
    owner_addr = addrs[int(owner.rsplit("-", 1)[1]) - 1]
    peer_times += [t for addr, t in known.items() if addr not in (entry, owner_addr)]
    print(f"  trial {trial + 1}: entry {entry}, owner {owner}, answered {answered*1000:.0f} ms, "
          f"known by all {len(addrs)} nodes after {last*1000:.0f} ms", file=sys.stderr)
ms = sorted(t * 1000 for t in times)
peers = sorted(t * 1000 for t in peer_times)
print(f"| {len(addrs)} nodes | {len(ms)} | {statistics.median(ms):.0f} | {ms[0]:.0f} | {ms[-1]:.0f} "
      f"| {statistics.median(peers):.0f} ({len(peers)}) |")
PY
    stop_cluster
}

echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')  machine: $(nproc) cores,$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)  load average: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "commit: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)  binaries: $BIN_DIR"
if [[ $PART == steady || $PART == all ]]; then
    IFS=, read -r -a list <<<"$WORKLOADS"
    for w in "${list[@]}"; do steady "$w"; done
fi
if [[ $PART == converge || $PART == all ]]; then
    echo
    echo "time from sending a request with a new prefix until every node's view lists its owner (ms)"
    echo "| cluster | trials | median | min | max | a peer's view, median (samples) |"
    echo "|---|---:|---:|---:|---:|---:|"
    IFS=, read -r -a sizes <<<"$SIZES"
    for n in "${sizes[@]}"; do converge "$n"; done
fi
log "done"
