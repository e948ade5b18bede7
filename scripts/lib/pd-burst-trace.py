#!/usr/bin/env python3
"""Writes the pd-burst workload of `scripts/demo.sh --pd` as a Mooncake JSONL trace.

Two kinds of requests on one timeline, so that long prefills and decode bursts overlap:

- long prompts: Poisson arrivals of 4096 to 8192-token prompts (8 to 16 Mooncake blocks of 512
  tokens), of which the first 2048 come from one of a few shared documents (Zipf-popular: a
  prefix cache helps there) and the rest is new; short answers. Their prefill is the work a
  prefill engine takes off a decode engine.
- decode bursts: every BURST_EVERY seconds, BURST_SIZE requests with 1024-token new prompts and
  long answers arriving within BURST_SPREAD seconds: they load the decode engines for several
  seconds while the long prompts' prefills run.

`kvmesh-sim load --trace FILE` replays it at its timestamps (each hash id is a 512-token text
segment, so requests sharing ids share those blocks token for token).

Usage: pd-burst-trace.py --duration S --seed N --out FILE
"""

import argparse
import json
import math
import random

BLOCK = 512  # tokens per Mooncake hash id (kvmesh-sim's MOONCAKE_BLOCK_TOKENS)
LONG_RATE = 1.0  # long prompts per second (Poisson)
LONG_BLOCKS = (8, 16)  # 4096 to 8192 tokens
LONG_OUTPUT = (16, 64)
DOCUMENTS = 6  # shared documents, Zipf(1.0)-popular
DOC_BLOCKS = 4  # 2048 shared tokens
BURST_EVERY = 8.0
BURST_FIRST = 4.0
BURST_SIZE = 12
BURST_SPREAD = 0.4
BURST_BLOCKS = 2  # 1024-token prompts
BURST_OUTPUT = (256, 384)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--duration", type=float, required=True)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    rng = random.Random(a.seed)
    next_id = [10_000]

    def fresh(n):
        ids = list(range(next_id[0], next_id[0] + n))
        next_id[0] += n
        return ids

    weights = [1.0 / (k + 1) for k in range(DOCUMENTS)]
    reqs = []
    t = rng.expovariate(LONG_RATE)
    while t < a.duration:
        blocks = rng.randint(*LONG_BLOCKS)
        doc = rng.choices(range(DOCUMENTS), weights)[0]
        ids = [1000 + doc * 100 + k for k in range(DOC_BLOCKS)] + fresh(blocks - DOC_BLOCKS)
        reqs.append((t, blocks * BLOCK, rng.randint(*LONG_OUTPUT), ids))
        t += rng.expovariate(LONG_RATE)
    bursts = max(1, math.ceil((a.duration - BURST_FIRST) / BURST_EVERY))
    for b in range(bursts):
        start = BURST_FIRST + b * BURST_EVERY
        for _ in range(BURST_SIZE):
            at = start + rng.uniform(0.0, BURST_SPREAD)
            reqs.append((at, BURST_BLOCKS * BLOCK, rng.randint(*BURST_OUTPUT), fresh(BURST_BLOCKS)))
    reqs.sort(key=lambda r: r[0])
    with open(a.out, "w") as f:
        # The replay counts time from the first entry: an empty-looking start would shift
        # everything, so the trace starts at 0 with whichever request comes first.
        first = reqs[0][0]
        for at, inp, out, ids in reqs:
            line = {"timestamp": round((at - first) * 1000.0, 1), "input_length": inp,
                    "output_length": out, "hash_ids": ids}
            f.write(json.dumps(line) + "\n")


if __name__ == "__main__":
    main()
