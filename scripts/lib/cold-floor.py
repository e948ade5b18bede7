#!/usr/bin/env python3
"""How close a run's TTFT tail came to the best any router could do with its new prefixes.

Reads the load generator's per-request records (`runs/<workload>-<policy>.records.jsonl` of
`scripts/demo.sh`) and replays the run's uncached requests (those whose engine reported fewer
than `--cached-below` cached prompt tokens) at their recorded send times on `--engines`
engines, each to the engine that is free first, each taking `--prefill-ms` alone: an ideal
central scheduler that knows every engine's queue at every instant. Every other request keeps
its recorded TTFT. Prints the run's p99 TTFT and the p99 with the replayed requests, the
floor a router's placement of new prefixes can reach on those arrivals. It ignores that
prefills slow the cached requests beside them, so it errs low.

Usage: cold-floor.py [--engines 4] [--prefill-ms 200] [--cached-below 2048] RECORDS...
"""

import argparse
import json


def quantile(values, q):
    """Linear interpolation between closest ranks, as the load generator's report."""
    values = sorted(values)
    position = (len(values) - 1) * q
    low = int(position)
    high = min(low + 1, len(values) - 1)
    return values[low] + (values[high] - values[low]) * (position - low)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", type=int, default=4)
    parser.add_argument("--prefill-ms", type=float, default=200.0)
    parser.add_argument("--cached-below", type=int, default=2048)
    parser.add_argument("records", nargs="+")
    args = parser.parse_args()
    for path in args.records:
        with open(path) as f:
            records = [json.loads(line) for line in f if line.strip()]
        records = [r for r in records if r.get("ttft_s") is not None]
        records.sort(key=lambda r: r["sent_at_s"])
        free_at = [0.0] * args.engines
        replayed = {}
        for r in records:
            if r["cached_tokens"] >= args.cached_below:
                continue
            engine = min(range(args.engines), key=lambda e: free_at[e])
            start = max(free_at[engine], r["sent_at_s"])
            free_at[engine] = start + args.prefill_ms / 1000
            replayed[r["index"]] = free_at[engine] - r["sent_at_s"]
        actual = quantile([r["ttft_s"] for r in records], 0.99)
        floor = quantile([replayed.get(r["index"], r["ttft_s"]) for r in records], 0.99)
        print(
            f"{path}: p99 TTFT {actual * 1000:.0f} ms; with its {len(replayed)} uncached "
            f"requests placed ideally {floor * 1000:.0f} ms"
        )


if __name__ == "__main__":
    main()
