#!/usr/bin/env python3
"""What one run of `scripts/demo.sh --pd` did with prefill and decode: a few lines of text.

From the load generator's records (routing reasons and the largest gap between two tokens of
each request), the engines' /metrics scraped at the end of the run (prompt tokens computed
and pulled, decode legs, preemptions) and the sampler's running/waiting series (how evenly the
decode engines were loaded over time).

Usage: pd-summary.py --load-json FILE --records FILE --samples FILE
           --engine NAME=ROLE=URL=METRICS_FILE ...
       pd-summary.py --conclude POLICY=SUMMARY_FILE ...   (what the runs of one workload show,
           from the summaries the first form wrote)
(ROLE: prefill, decode or mixed; URL as in the samples.)
"""

import argparse
import collections
import json
import re

LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)')


def metrics(path):
    """Sums of each metric per (name, label string), from a Prometheus text file."""
    out = collections.defaultdict(float)
    try:
        text = open(path).read()
    except OSError:
        return out
    for line in text.splitlines():
        m = LINE.match(line)
        if not m:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        labels = m.group(2) or ""
        src = re.search(r'source="([^"]+)"', labels)
        key = m.group(1) + (":" + src.group(1) if src else "")
        out[key] += value
    return out


def pct(values, q):
    if not values:
        return None
    v = sorted(values)
    return v[min(len(v) - 1, int(q * len(v)))]


def ms(x):
    return "-" if x is None else f"{x * 1000:.0f} ms"


def conclude(specs):
    """Two or three sentences on PD against mixed (and vllm-router), from the summaries."""
    figs = {}
    for spec in specs:
        policy, path = spec.split("=", 1)
        text = open(path).read()
        ttft = re.search(r"client: TTFT mean (\d+) ms", text)
        gap = re.search(r"long answers[^;]*; largest token gap per request p50 \d+ ms, p90 (\d+) ms",
                        text)
        if ttft and gap:
            figs[policy] = (int(ttft.group(1)), int(gap.group(1)))
    pd, mixed = figs.get("kvmesh pd"), figs.get("kvmesh mixed")
    if not (pd and mixed):
        return
    print(f"what this shows: on mixed engines a long prompt's prefill stalls every decode beside "
          f"it: the long-output requests' largest gap between two tokens was {mixed[1]} ms (p90) "
          f"with mixed engines, {pd[1]} ms with prefill/decode disaggregation.")
    if pd[0] > mixed[0]:
        print(f"the price is time to first token: mean {pd[0]} ms disaggregated against "
              f"{mixed[0]} ms mixed (half the engines prefill, and the KV is pulled before the "
              f"first token).")
    else:
        print(f"time to first token: mean {pd[0]} ms disaggregated against {mixed[0]} ms mixed.")
    vr = figs.get("vllm-router pd")
    if vr:
        print(f"vllm-router's PD mode on the same engines: mean TTFT {vr[0]} ms, largest gap "
              f"p90 {vr[1]} ms (scripts/compare-vllm-router.sh --pd repeats the comparison).")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--conclude", nargs="+")
    p.add_argument("--load-json")
    p.add_argument("--records")
    p.add_argument("--samples")
    p.add_argument("--engine", action="append", default=[])
    a = p.parse_args()
    if a.conclude:
        conclude(a.conclude)
        return
    if not (a.load_json and a.records and a.samples):
        p.error("--load-json, --records and --samples are required")

    # The demo's table has ITL p50 only; the tail is what disaggregation is about.
    doc = json.load(open(a.load_json))
    ttft, itl = doc.get("ttft_s", {}), doc.get("itl_s", {})
    print(f"client: TTFT mean {ms(ttft.get('mean'))}, p99 {ms(ttft.get('p99'))}; ITL p50 "
          f"{ms(itl.get('p50'))}, p99 {ms(itl.get('p99'))}, max {ms(itl.get('max'))}")
    records = [json.loads(line) for line in open(a.records) if line.strip()]
    reasons = collections.Counter(r.get("reason") or "(none)" for r in records)
    if set(reasons) != {"(none)"}:
        print("reasons: " + ", ".join(f"{k} {v}" for k, v in reasons.most_common()))
    # Long answers (the bursts) against short ones: where the tail of the token gaps is.
    for label, keep in (("long answers (>= 128 tokens)", lambda r: r["output_tokens"] >= 128),
                        ("short answers", lambda r: r["output_tokens"] < 128)):
        gaps = [r["itl_max_s"] for r in records if keep(r) and r.get("itl_max_s") is not None]
        ttft = [r["ttft_s"] for r in records if keep(r) and r.get("ttft_s") is not None]
        if gaps:
            print(f"{label}: {len(gaps)} requests; largest token gap per request p50 "
                  f"{ms(pct(gaps, 0.5))}, p90 {ms(pct(gaps, 0.9))}, max {ms(max(gaps))}; "
                  f"TTFT p50 {ms(pct(ttft, 0.5))}, p90 {ms(pct(ttft, 0.9))}")

    engines = []
    for spec in a.engine:
        name, role, url, path = spec.split("=", 3)
        engines.append((name, role, url, metrics(path)))
    running = collections.defaultdict(list)
    waiting = collections.defaultdict(list)
    try:
        for line in open(a.samples):
            try:
                s = json.loads(line)
            except ValueError:
                continue  # an empty line, or the last one cut when the sampler was stopped
            for e in s.get("engines", []):
                m = e.get("metrics")
                if m:
                    running[e["url"]].append(m.get("running", 0.0))
                    waiting[e["url"]].append(m.get("waiting", 0.0))
    except OSError:
        pass
    for name, role, url, m in engines:
        r = running.get(url, [])
        mean_r = sum(r) / len(r) if r else 0.0
        print(f"{name} ({role}): {m['vllm:request_success_total']:.0f} requests finished, "
              f"{m['vllm:nixl_xfer_time_seconds_count']:.0f} decode legs pulled KV; prompt tokens "
              f"computed {m['vllm:prompt_tokens_by_source_total:local_compute']:.0f}, "
              f"pulled {m['vllm:prompt_tokens_by_source_total:external_kv_transfer']:.0f}, "
              f"cached {m['vllm:prompt_tokens_by_source_total:local_cache_hit']:.0f}; "
              f"{m['vllm:generation_tokens_total']:.0f} tokens generated; "
              f"running mean {mean_r:.1f} max {max(r, default=0):.0f}, "
              f"waiting max {max(waiting.get(url, []), default=0):.0f}; "
              f"preemptions {m['vllm:num_preemptions_total']:.0f}")
    # How unevenly the decode side was loaded: the mean gap between its busiest and its least
    # busy engine, sample by sample.
    decode = [url for (_, role, url, _) in engines if role == "decode"]
    series = [running.get(u, []) for u in decode]
    n = min((len(s) for s in series), default=0)
    if len(decode) >= 2 and n:
        gaps = [max(s[i] for s in series) - min(s[i] for s in series) for i in range(n)]
        print(f"decode engines' running requests, busiest minus least busy: mean "
              f"{sum(gaps) / n:.1f}, p90 {pct(gaps, 0.9):.0f} (over {n} samples)")


if __name__ == "__main__":
    main()
