# Background processes of the scripts, each in a process group of its own, so that stopping
# one stops everything it started. Sourced by demo.sh and bench-prefix.sh; the caller sets
# $WORK (logs go to $WORK/logs/NAME.log) and kills GROUPS_ALIVE in its exit trap.

GROUPS_ALIVE=() # process-group ids (each background process leads its own group)

# Starts "$@" in the background in its own process group, output to $WORK/logs/NAME.log.
# Sets SPAWNED_PID.
spawn() {
    local name=$1
    shift
    if command -v setsid >/dev/null 2>&1; then
        setsid "$@" >"$WORK/logs/$name.log" 2>&1 </dev/null &
    else
        "$@" >"$WORK/logs/$name.log" 2>&1 </dev/null &
    fi
    SPAWNED_PID=$!
    GROUPS_ALIVE+=("$SPAWNED_PID")
}

# Kills the given process groups: TERM, up to 5 s of grace, then KILL; reaps them.
kill_groups() {
    local pid deadline
    for pid in "$@"; do kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true; done
    deadline=$(($(date +%s) + 5))
    for pid in "$@"; do
        while kill -0 "$pid" 2>/dev/null && [[ $(date +%s) -lt $deadline ]]; do sleep 0.1; done
        kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    local keep=() g k
    for g in "${GROUPS_ALIVE[@]+"${GROUPS_ALIVE[@]}"}"; do
        k=1
        for pid in "$@"; do [[ $g == "$pid" ]] && k=0; done
        [[ $k == 1 ]] && keep+=("$g")
    done
    GROUPS_ALIVE=("${keep[@]+"${keep[@]}"}")
}

# A free loopback TCP port for a process told to bind it later (a server that starts in a
# minute, vLLM's KV-event publisher connecting to a sidecar that listens later): below the
# kernel's ephemeral range, where no outgoing connection can take it meanwhile. Inside the
# range one can: a publisher retrying its connection to a port nobody listens on yet takes it
# as its own source port (a TCP self-connect), and the listener fails for good.
free_port() {
    python3 - <<'PY'
import random, socket
try:
    first = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
except (OSError, ValueError, IndexError):
    first = 32768
low = min(10000, first // 2)
for _ in range(1000):
    port = random.randrange(low, first)
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
    except OSError:
        continue
    finally:
        s.close()
    print(port)
    break
else:
    raise SystemExit("no free loopback port below the ephemeral range")
PY
}
