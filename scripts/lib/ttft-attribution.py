#!/usr/bin/env python3
"""Where a router's mean TTFT goes against a baseline's, from the load generator's records.

Usage: ttft-attribution.py BASELINE.records.jsonl RUN.records.jsonl [RUN.records.jsonl ...]

Both runs sent the same requests (the demo's runs of one workload). A request's TTFT is
mostly the prompt tokens its engine had to compute plus the time it waited behind others.
Requests are put in classes by the share of their prompt found cached (none, partial, most,
all but the last block); then the difference of the mean TTFTs splits in two
(Oaxaca-Blinder):

  cache:    (run's class mix - baseline's class mix) x baseline's TTFT per class
            what the run's cache hits are worth at the baseline's queueing
  queueing: run's class mix x (run's TTFT per class - baseline's TTFT per class)
            what the run pays per class of request: waits behind a busier engine, hops

and prints, per run, both parts in ms, the ratio the run would have with the baseline's
per-class TTFTs, and the requests per engine (the imbalance behind the queueing part).
"""

import collections
import json
import sys

CLASSES = [(0.0, "none cached"), (0.5, "< 50% cached"), (0.9, "50-90% cached"), (1.01, ">= 90% cached")]


def load(path):
    out = []
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            if r.get("status") != 200 or r.get("ttft_s") is None:
                continue
            prompt = r.get("prompt_tokens") or 0
            cached = r.get("cached_tokens") or 0
            out.append((cached / prompt if prompt else 0.0, r["ttft_s"] * 1e3, r.get("node") or r.get("target")))
    if not out:
        sys.exit(f"{path}: no answered request with a TTFT")
    return out


def klass(share):
    if share == 0.0:
        return 0
    for i, (bound, _) in enumerate(CLASSES[1:], start=1):
        if share < bound:
            return i
    return len(CLASSES) - 1


def profile(records):
    by = collections.defaultdict(list)
    for share, ttft, _ in records:
        by[klass(share)].append(ttft)
    n = len(records)
    mix = {k: len(v) / n for k, v in by.items()}
    mean = {k: sum(v) / len(v) for k, v in by.items()}
    return mix, mean


def main(argv):
    if len(argv) < 3:
        sys.exit(__doc__)
    base = load(argv[1])
    base_mix, base_mean = profile(base)
    base_ttft = sum(t for _, t, _ in base) / len(base)
    print(f"baseline {argv[1]}: {len(base)} requests, mean TTFT {base_ttft:.1f} ms")
    for k, (_, name) in enumerate(CLASSES):
        if k in base_mix:
            print(f"  {name:>14}: {base_mix[k] * 100:5.1f}% of requests, mean TTFT {base_mean[k]:7.1f} ms")
    for path in argv[2:]:
        run = load(path)
        mix, mean = profile(run)
        ttft = sum(t for _, t, _ in run) / len(run)
        # A class the baseline never saw is priced at its nearest seen neighbour's TTFT.
        def base_at(k):
            seen = sorted(base_mean, key=lambda j: (abs(j - k), j))
            return base_mean[seen[0]]
        cache = sum((mix.get(k, 0) - base_mix.get(k, 0)) * base_at(k) for k in set(mix) | set(base_mix))
        queueing = sum(mix[k] * (mean[k] - base_at(k)) for k in mix)
        per_engine = collections.Counter(engine for _, _, engine in run)
        counts = sorted(per_engine.values(), reverse=True)
        print(f"\n{path}: {len(run)} requests, mean TTFT {ttft:.1f} ms ({ttft / base_ttft:.2f}x the baseline)")
        for k, (_, name) in enumerate(CLASSES):
            if k in mix:
                print(f"  {name:>14}: {mix[k] * 100:5.1f}% of requests, mean TTFT {mean[k]:7.1f} ms"
                      f" (baseline {base_at(k):.1f})")
        print(f"  cache part {cache:+.1f} ms, queueing part {queueing:+.1f} ms"
              f" (sum {cache + queueing:+.1f}, measured {ttft - base_ttft:+.1f})")
        print(f"  at the baseline's TTFT per class: {(base_ttft + cache) / base_ttft:.2f}x the baseline")
        print(f"  requests per engine: {counts} (max / mean {counts[0] / (len(run) / len(counts)):.2f})")


if __name__ == "__main__":
    main(sys.argv)
