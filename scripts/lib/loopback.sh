# Instant engines and sidecars on loopback for the overhead benchmarks (bench-overhead.sh,
# bench-overhead-ab.sh). Sourced after the caller set $WORK (a scratch directory, removed on
# exit); every process writes its output to $WORK/NAME.out and is killed on exit.

PIDS=()
declare -A SIDECAR_PID
loopback_cleanup() {
    for pid in "${PIDS[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$WORK"
}
trap loopback_cleanup EXIT INT TERM

wait_line() { # FILE PATTERN
    for _ in $(seq 400); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.05; done
    echo "timed out waiting for '$2' in $1" >&2; cat "$1" >&2; exit 1
}
# BIN NAME MODEL: starts an instant engine; sets ENGINE_URL (not in a subshell, so that PIDS
# keeps it).
start_engine() {
    "$1/kvmesh-sim" engine --port 0 --model "$3" --instant >"$WORK/$2.out" 2>&1 &
    PIDS+=($!)
    wait_line "$WORK/$2.out" listening
    ENGINE_URL=$(grep -o 'http://[0-9.:]*' "$WORK/$2.out")
}
# BIN TLS_DIR NAME BACKEND [SEEDS [EXTRA FLAGS...]]: issues NAME's certificate from the CA in
# TLS_DIR and starts its sidecar.
start_sidecar() {
    local bin=$1 tls=$2 name=$3 backend=$4 seeds=${5:-}
    shift $(($# < 5 ? $# : 5))
    "$bin/kvmesh" cert issue --dir "$tls" --node "$name" >/dev/null
    "$bin/kvmesh" serve --backend "$backend" --listen 127.0.0.1:0 --mesh 127.0.0.1:0 \
        --node-id "$name" --tls-dir "$tls" ${seeds:+--seeds "$seeds"} "$@" \
        >"$WORK/$name.out" 2>"$WORK/$name.err" &
    PIDS+=($!)
    SIDECAR_PID[$name]=$!
    wait_line "$WORK/$name.out" listening
}
http_of() { grep -o 'http://[0-9.:]*' "$WORK/$1.out"; }
mesh_of() { grep -o ' mesh [0-9][0-9.:]*' "$WORK/$1.out" | cut -d' ' -f3; }
cpu_ticks() { awk '{print $14 + $15}' "/proc/${SIDECAR_PID[$1]}/stat"; } # NAME: user + system
# NAME TICKS_BEFORE REQUESTS: CPU microseconds per request of a sidecar since TICKS_BEFORE.
cpu_per_request() {
    awk -v t="$(($(cpu_ticks "$1") - $2))" -v hz="$(getconf CLK_TCK)" -v n="$3" \
        'BEGIN {printf "%.0f us", t * 1e6 / hz / n}'
}
