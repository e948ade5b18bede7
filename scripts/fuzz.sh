#!/usr/bin/env bash
# Fuzzes every decoder of untrusted bytes: runs each target of fuzz/ (cargo-fuzz, libFuzzer), or
# only the TARGETs named, for SECONDS (default 60), one at a time in one niced process, on the stable toolchain
# (`--sanitizer none`). Prints a line per target: executions, executions per second, corpus size
# and whether it found a failing input. Exits non-zero if any target did; the input is in
# fuzz/artifacts/TARGET/ and replays with
#   cargo fuzz run --sanitizer none TARGET fuzz/artifacts/TARGET/crash-…
# Each run starts from fuzz/seeds/TARGET (real encodings) and fuzz/corpus/TARGET (what earlier
# runs found; new inputs are added there). libFuzzer's full output is in
# fuzz/target/fuzz-logs/TARGET.log. Installs cargo-fuzz when it is missing.
# With FUZZ_SCRATCH_CORPUS=1 (what scripts/test.sh sets) new inputs go to a temporary
# directory instead, so that a check leaves the tree as it was.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds="${1:-60}"
if ! [[ "$seconds" =~ ^[1-9][0-9]*$ ]]; then
    echo "usage: scripts/fuzz.sh [SECONDS] [TARGET...]" >&2
    exit 2
fi

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "==> installing cargo-fuzz" >&2
    cargo install --locked cargo-fuzz
fi

shift $(($# > 0 ? 1 : 0))
targets=("$@")
if ((${#targets[@]} == 0)); then
    for file in fuzz/fuzz_targets/*.rs; do
        targets+=("$(basename "$file" .rs)")
    done
fi
for target in "${targets[@]}"; do
    if [[ ! -f "fuzz/fuzz_targets/$target.rs" ]]; then
        echo "no fuzz target $target (see fuzz/fuzz_targets/)" >&2
        exit 2
    fi
done

echo "==> building ${#targets[@]} targets" >&2
nice -n 15 cargo fuzz build --sanitizer none >&2

# The last match of a pattern in a log, or nothing (a run cut short by a find has no final
# stats).
last() {
    grep -o "$1" "$2" | tail -1 || true
}

logs="fuzz/target/fuzz-logs"
mkdir -p "$logs"
failed=0
printf '%-16s %8s %14s %10s %8s  %s\n' target seconds executions "execs/s" corpus result
for target in "${targets[@]}"; do
    corpus="$PWD/fuzz/corpus/$target"
    mkdir -p "$corpus"
    # libFuzzer adds what it finds to the first corpus directory it is given.
    found="$corpus"
    if [[ "${FUZZ_SCRATCH_CORPUS:-0}" == 1 ]]; then
        found=$(mktemp -d)
    fi
    options=(-max_total_time="$seconds" -print_final_stats=1 -timeout=10)
    if [[ -f "fuzz/dicts/$target.dict" ]]; then
        options+=(-dict="$PWD/fuzz/dicts/$target.dict")
    fi
    log="$logs/$target.log"
    start=$(date +%s)
    if nice -n 15 cargo fuzz run --sanitizer none "$target" "$found" "$corpus" "$PWD/fuzz/seeds/$target" \
        -- "${options[@]}" >"$log" 2>&1; then
        result="ok"
    else
        failed=$((failed + 1))
        artifact=$(last 'Test unit written to [^ ]*' "$log" | awk '{print $NF}')
        result="FAILED ${artifact:-(see $log)}"
    fi
    elapsed=$(($(date +%s) - start))
    # Final stats when libFuzzer ends normally; the last status line when it stopped on a find.
    execs=$(last 'stat::number_of_executed_units: [0-9]*' "$log" | awk '{print $2}')
    execs=${execs:-$(last '^#[0-9]*' "$log" | tr -d '#')}
    rate=$(last 'stat::average_exec_per_sec: [0-9]*' "$log" | awk '{print $2}')
    rate=${rate:-$(last 'exec/s: [0-9]*' "$log" | awk '{print $2}')}
    size=$(find "$found" "$corpus" -type f | sort -u | wc -l)
    [[ "$found" == "$corpus" ]] || rm -rf "$found"
    printf '%-16s %8s %14s %10s %8s  %s\n' "$target" "$elapsed" "${execs:-?}" "${rate:-?}" \
        "$size" "$result"
done

if ((failed > 0)); then
    echo "$failed of ${#targets[@]} targets found a failing input" >&2
    exit 1
fi
