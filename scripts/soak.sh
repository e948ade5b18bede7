#!/usr/bin/env bash
# A soak (issue 18): MINUTES of chat load through one sidecar (a) while the three others are
# killed -9 and restarted in turn, every CHURN seconds, on loopback. Every 10 s it samples
# a's resident memory, open file descriptors (and how many of them are HTTP connections to
# its engine and from its clients, which follow the load), threads and the mesh connections
# it has opened, and prints them; at the end it compares the last sample with the first one
# after the warm-up (see WARM below; the target is growth of at most 5%) and counts the
# requests that failed (the load is not streamed, so no request has started when its node
# dies: the target is 0). With --heaptrack, a runs under heaptrack and its heap profile is
# summarised at the end (peak, leaked, and the heap in use after the warm-up against the end);
# --keep-profile FILE keeps the profile. Figures go to RELIABILITY.md by hand.
#
# Usage: scripts/soak.sh [--bin-dir DIR] [--minutes 10] [--churn 60] [--rate 20] [--heaptrack]
#                        [--keep-profile FILE]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=; MINUTES=10; CHURN=60; RATE=20; HEAPTRACK=0; KEEP_PROFILE=
while [[ $# -gt 0 ]]; do
    case $1 in
        --bin-dir) BIN=$2; shift 2 ;;
        --minutes) MINUTES=$2; shift 2 ;;
        --churn) CHURN=$2; shift 2 ;;
        --rate) RATE=$2; shift 2 ;;
        --heaptrack) HEAPTRACK=1; shift ;;
        --keep-profile) KEEP_PROFILE=$2; shift 2 ;;
        *) echo "unknown option $1" >&2; exit 2 ;;
    esac
done
if [[ -z $BIN ]]; then
    # The default build (no jemalloc feature): heaptrack sees the system allocator's calls
    # only, so a --bin-dir build for --heaptrack must be one without jemalloc too.
    (cd "$ROOT" && cargo build --release -p kvmesh-node -p kvmesh-sim --bins)
    BIN="${CARGO_TARGET_DIR:-$ROOT/target}/release"
fi
if [[ $HEAPTRACK == 1 ]] && ! command -v heaptrack >/dev/null; then
    echo "--heaptrack needs heaptrack (Debian: apt-get install heaptrack)" >&2
    exit 2
fi
WORK=$(mktemp -d)
# shellcheck source=lib/loopback.sh
source "$ROOT/scripts/lib/loopback.sh"
SECONDS_TOTAL=$((MINUTES * 60))

"$BIN/kvmesh" cert init --dir "$WORK/tls" >/dev/null
ENGINES=()
for n in a b c d; do
    start_engine "$BIN" "engine-$n" mock-model
    ENGINES+=("$ENGINE_URL")
done
if [[ $HEAPTRACK == 1 ]]; then
    # a under heaptrack: the same command line as start_sidecar's.
    "$BIN/kvmesh" cert issue --dir "$WORK/tls" --node a >/dev/null
    heaptrack -o "$WORK/a.heaptrack" "$BIN/kvmesh" serve --backend "${ENGINES[0]}" \
        --listen 127.0.0.1:0 --mesh 127.0.0.1:0 --node-id a --tls-dir "$WORK/tls" \
        >"$WORK/a.out" 2>"$WORK/a.err" &
    PIDS+=($!)
    wait_line "$WORK/a.out" listening
    SIDECAR_PID[a]=$(pgrep -f -n -- "--node-id a --tls-dir $WORK/tls" | head -n 1)
else
    start_sidecar "$BIN" "$WORK/tls" a "${ENGINES[0]}"
fi
SEED=$(mesh_of a)
i=1
for n in b c d; do
    start_sidecar "$BIN" "$WORK/tls" "$n" "${ENGINES[i]}" "$SEED"
    i=$((i + 1))
done
A=$(http_of a)
for _ in $(seq 300); do
    [[ $(curl -s "$A/debug/cluster" | grep -o '"node":"[bcd]"' | sort -u | wc -l) == 3 ]] && break
    sleep 0.1
done

"$BIN/kvmesh-sim" load --targets "$A" --engines "$(IFS=,; echo "${ENGINES[*]}")" \
    --model mock-model --workload chat --chat-sessions 64 --rate "$RATE" \
    --duration "$SECONDS_TOTAL" --timeout 60 --threads 1 --json "$WORK/load.json" \
    >"$WORK/load.log" 2>&1 &
LOAD=$!
PIDS+=($LOAD)

# a's open TCP connections to its engine and from its clients: hyper keeps as many as the
# load needed lately, so they rise after a peer dies (a serves more itself, answers take
# longer) and fall as they idle out. They follow the load, not the uptime.
tcp_conns() { # ss filter
    ss -Htnp state established "$1" 2>/dev/null | grep -c "pid=${SIDECAR_PID[a]}," || true
}

sample() { # elapsed seconds: one line of a's figures
    local pid=${SIDECAR_PID[a]} opened fds pooled
    opened=$(curl -s "$A/metrics" | awk '/^kvmesh_.*connections_opened_total/ {s += $2} END {print s + 0}')
    fds=$(ls "/proc/$pid/fd" | wc -l)
    pooled=$(($(tcp_conns "( dport = :${ENGINES[0]##*:} )") + $(tcp_conns "( sport = :${A##*:} )")))
    printf '%6s %10s %6s %8s %8s %8s %12s\n' "$1" \
        "$(awk '/VmRSS/ {print $2}' "/proc/$pid/status")" "$fds" "$pooled" "$((fds - pooled))" \
        "$(awk '/Threads/ {print $2}' "/proc/$pid/status")" "$opened"
}

restart() { # NAME INDEX: kill -9 the sidecar, start it again a few seconds later
    kill -9 "${SIDECAR_PID[$1]}" 2>/dev/null || true
    # Reaped at once, quietly (bash would report the kill on its own otherwise).
    wait "${SIDECAR_PID[$1]}" 2>/dev/null || true
    sleep 3
    # start_sidecar issues the node's certificate, and `cert issue` keeps an existing one.
    rm -f "$WORK/tls/$1.pem" "$WORK/tls/$1.key"
    start_sidecar "$BIN" "$WORK/tls" "$1" "${ENGINES[$2]}" "$SEED"
}

printf '%6s %10s %6s %8s %8s %8s %12s\n' "s" "RSS kB" "fds" "http" "others" "threads" \
    "conn opened" | tee "$WORK/samples.txt"
START=$(date +%s)
NEXT_CHURN=$CHURN
VICTIMS=(b c d)
VICTIM=0
while kill -0 "$LOAD" 2>/dev/null; do
    ELAPSED=$(($(date +%s) - START))
    sample "$ELAPSED" | tee -a "$WORK/samples.txt"
    if ((ELAPSED >= NEXT_CHURN && ELAPSED + 15 < SECONDS_TOTAL)); then
        name=${VICTIMS[VICTIM]}
        echo "       churn: kill -9 and restart $name"
        restart "$name" $((VICTIM + 1))
        VICTIM=$(((VICTIM + 1) % 3))
        NEXT_CHURN=$((NEXT_CHURN + CHURN))
    fi
    sleep 10
done
wait "$LOAD" || true

echo
grep -E '^requests:' "$WORK/load.log" || tail -n 5 "$WORK/load.log"
# Growth from the first sample after the warm-up (a fifth of the run) to the last.
# The warm-up: a fifth of the run, or until the first restarted peer's old identity is
# forgotten, whichever is later. A dead peer's state (chitchat's copy of it, its gossip link)
# is kept by design for the dead-node grace period (2 min, node/src/mesh/config.rs) plus the
# link's idle time (30 s), so until then every restart adds some; the question is whether it
# grows after.
WARM=$((SECONDS_TOTAL / 5))
FORGOTTEN=$((CHURN + 120 + 30))
((FORGOTTEN > WARM)) && WARM=$FORGOTTEN
echo "warm-up: ${WARM} s"
awk -v warm=$WARM 'NR > 1 && $1 ~ /^[0-9]+$/ {
        if ($1 >= warm && !base) { base = 1; r = $2; f = $5; t = $6 }
        lr = $2; lf = $5; lt = $6
    }
    END {
        printf "growth after the warm-up: RSS %+.1f%% (%d -> %d kB), fds other than HTTP connections %+.1f%% (%d -> %d), threads %+d\n",
            (lr - r) * 100 / r, r, lr, (lf - f) * 100 / f, f, lf, lt - t
    }' "$WORK/samples.txt"
if [[ $HEAPTRACK == 1 ]]; then
    kill -TERM "${SIDECAR_PID[a]}" 2>/dev/null || true
    for _ in $(seq 100); do ls "$WORK"/a.heaptrack* >/dev/null 2>&1 && ! kill -0 "${SIDECAR_PID[a]}" 2>/dev/null && break; sleep 0.5; done
    sleep 2
    PROFILE=$(ls "$WORK"/a.heaptrack* | head -n 1)
    heaptrack_print "$PROFILE" 2>/dev/null |
        grep -E '^(peak heap memory consumption|peak RSS|total memory leaked|calls to allocation functions)' || true
    # The heap in use over time (heaptrack's massif snapshots): unlike RSS, it does not
    # include what the allocator keeps after a free, so growth here is memory still held.
    heaptrack_print "$PROFILE" -M "$WORK/a.massif" >/dev/null 2>&1 || true
    awk '
        /^time=/ { t = substr($0, 6) + 0 }
        /^mem_heap_B=/ { n++; time[n] = t; heap[n] = substr($0, 12) + 0 }
        END {
            if (n < 10) { print "heap over time: too few snapshots"; exit }
            # Mean heap over a tenth of the profile right after the warm-up (a fifth), and
            # over the tenth before the last twentieth (the shutdown frees everything).
            T = time[n]
            for (i = 1; i <= n; i++) {
                if (time[i] >= 0.2 * T && time[i] < 0.3 * T) { a += heap[i]; na++ }
                if (time[i] >= 0.85 * T && time[i] < 0.95 * T) { b += heap[i]; nb++ }
            }
            if (!na || !nb) { print "heap over time: too few snapshots"; exit }
            printf "heap in use (mean): %.2f MB after the warm-up, %.2f MB at the end (%+.1f%%)\n",
                a / na / 1e6, b / nb / 1e6, (b / nb - a / na) * 100 / (a / na)
        }' "$WORK/a.massif"
    if [[ -n $KEEP_PROFILE ]]; then
        cp "$PROFILE" "$KEEP_PROFILE"
        echo "heap profile: $KEEP_PROFILE (heaptrack_print or heaptrack_gui)"
    fi
fi
