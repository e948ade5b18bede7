#!/usr/bin/env python3
"""Measures a real vLLM server and fits the mock engine's step-time model to it (issue 45 §3).

Usage: fit-engine-profile.py URL [--out FILE.json] [--repeats 5] [--quick]
       fit-engine-profile.py --refit FILE.json     (fit again from saved measurements)
       fit-engine-profile.py URL --probe FILE.json (how fast the server runs now, against the
                                                    fit in FILE.json: prints one factor)

URL is a vLLM OpenAI server (scripts/lib/vllm.sh serve CORE PORT), serving `tiny` with
VLLM_SERVER_DEV_MODE=1 (POST /reset_prefix_cache). Only the Python standard library is used.

What it measures (each point the median of --repeats; the machine's cores are shared, so single
timings are noisy):
  prefill  one request at a time, max_tokens 1, streamed, prompt of L tokens, uncached (cache
           reset first), cached (the same prompt again) and, from 512 tokens, partial (the
           first half of it and a new second half). Per request: the client's TTFT and
           the server's own split of it, read as the change of the histogram sums
           vllm:request_prefill_time_seconds (first scheduled -> first token: the engine's
           steps) and vllm:request_queue_time_seconds.
  decode   B concurrent streams of 128 tokens (ignore_eos) over short or long prompts: the
           median inter-token gap each stream sees, i.e. one step of a batch of B decodes.
  mixed    8 decoding streams, then one prefill of L tokens arriving among them: the longest
           gap the decodes see (the step carrying the prefill's chunks) and the prefill's TTFT.
           Not fitted: a check of the fitted model's max(memory, compute) step.

The probe. The cores are shared, and how fast they run for this server drifts by 2x over
minutes with the other servers' load. --probe measures a few prefill and decode points (3
rounds, ~15 s; none of them a comparison's workload) and prints the geometric mean of
measured / modelled: the --time-scale that makes the fitted mock run at the speed of the
moment (scripts/mock-vs-vllm.sh --calibrate).

The fit. The model (sim/src/engine/model/timing.rs) is
    step = cpu_s + cpu_per_seq_s * seqs + max(memory, compute)
    memory  = weights_s + kv_s_per_token * sum(context read)
    compute = token_s * tokens + attention_s * sum(n * (k + n / 2))
On one CPU core with a 2-layer, 128-wide model the memory term is negligible (the weights are a
few MB in cache), so every step is compute-bound and the model is linear in the four
parameters cpu_s, cpu_per_seq_s, token_s, attention_s: a least-squares fit over the engine's
prefill times (split into chunks of max_num_batched_tokens, as vLLM's scheduler does) and the
decode steps. What the engine time does not explain of the client's TTFT is the front end
(HTTP, tokenisation, detokenisation), fitted as frontend_s + frontend_s_per_token * L.
"""

import argparse
import http.client
import json
import math
import random
import statistics
import sys
import threading
import time
import urllib.parse

# sim/src/text.rs's PIECES: one token each to the tiny model's tokenizer (make_tiny_model.py).
PIECES = (
    " the and for you not are was but all can had her one our out day get has him his how man"
    " new now old see two way who boy did its let put say she too use sun sea sky map key box"
    " cup pen ink oak elm fox owl bee ant cat dog car bus row set job art law war age"
).split(" ")[1:]
PIECES = [" " + p for p in PIECES]
assert len(PIECES) == 64

BLOCK = 32  # vllm.sh's --block-size
BUDGET = 2048  # vLLM's CPU default max_num_batched_tokens for the API server (world size 1)


class Server:
    def __init__(self, url):
        u = urllib.parse.urlparse(url)
        self.host, self.port = u.hostname, u.port or 80

    def _conn(self):
        return http.client.HTTPConnection(self.host, self.port, timeout=300)

    def post(self, path, body=None):
        c = self._conn()
        c.request("POST", path, body=json.dumps(body or {}), headers={"Content-Type": "application/json"})
        r = c.getresponse()
        data = r.read()
        c.close()
        if r.status >= 300:
            raise RuntimeError(f"POST {path}: {r.status} {data[:200]!r}")
        return data

    def metrics(self):
        c = self._conn()
        c.request("GET", "/metrics")
        text = c.getresponse().read().decode()
        c.close()
        out = {}
        for line in text.splitlines():
            if line.startswith("vllm:") and "_bucket" not in line:
                name, _, value = line.rpartition(" ")
                out[name.split("{")[0]] = float(value)
        return out

    def stream(self, prompt, max_tokens, ignore_eos=True):
        """Streams one completion; returns (send time, [arrival time of each text chunk])."""
        c = self._conn()
        body = {
            "model": "tiny",
            "prompt": prompt,
            "max_tokens": max_tokens,
            "ignore_eos": ignore_eos,
            "temperature": 0,
            "stream": True,
        }
        t0 = time.perf_counter()
        c.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            raise RuntimeError(f"completion: {r.status} {r.read()[:200]!r}")
        times = []
        for raw in r:
            line = raw.strip()
            if not line.startswith(b"data:") or line == b"data: [DONE]":
                continue
            times.append(time.perf_counter())
        c.close()
        return t0, times


def prompt_of(rng, n):
    return "".join(rng.choice(PIECES) for _ in range(n))


def delta(after, before, name):
    return after.get(name, 0.0) - before.get(name, 0.0)


def prefill_once(srv, rng, L):
    """Requests of L tokens alone on the server: a fresh prompt (uncached), the same again
    (cached), and from 512 tokens on one sharing its first half (the rest computed after a
    long cached context, as a RAG prompt whose first document is cached)."""
    rows = []
    srv.post("/reset_prefix_cache")
    p = prompt_of(rng, L)
    half = p[: len(p) // 2] + prompt_of(rng, L - L // 2)  # pieces are 4 characters each
    kinds = [("uncached", p), ("cached", p)] + ([("partial", half)] if L >= 512 else [])
    for kind, prompt in kinds:
        m0 = srv.metrics()
        t0, times = srv.stream(prompt, 1)
        m1 = srv.metrics()
        rows.append(
            {
                "tokens": L,
                "kind": kind,
                "cached": kind == "cached",
                "hit_tokens": delta(m1, m0, "vllm:prefix_cache_hits_total"),
                "queried_tokens": delta(m1, m0, "vllm:prefix_cache_queries_total"),
                "ttft_s": times[0] - t0,
                "prefill_s": delta(m1, m0, "vllm:request_prefill_time_seconds_sum"),
                "queue_s": delta(m1, m0, "vllm:request_queue_time_seconds_sum"),
            }
        )
    return rows


def run_streams(srv, prompts, max_tokens):
    results = [None] * len(prompts)

    def one(i):
        results[i] = srv.stream(prompts[i], max_tokens)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def decode_once(srv, rng, B, ctx):
    """B streams of 128 tokens at once: the median gap between tokens while all B are
    decoding (after the last one's first token, before the first one's last): the prefills of
    late joiners, which share steps with early decodes, stay out."""
    srv.post("/reset_prefix_cache")
    res = run_streams(srv, [prompt_of(rng, ctx) for _ in range(B)], 128)
    start = max(times[0] for _, times in res)
    end = min(times[-1] for _, times in res)
    gaps = [b - a for _, times in res for a, b in zip(times, times[1:]) if a >= start and b <= end]
    if not gaps:  # no moment with all B decoding: the middle of each stream, as a fallback
        gaps = [b - a for _, t in res for a, b in zip(t[32:], t[33:-16])]
    return {"batch": B, "prompt_tokens": ctx, "output_tokens": 128,
            "itl_median_s": statistics.median(gaps)}


def mixed_once(srv, rng, L, decoders=8):
    """`decoders` streams decoding, then an L-token prefill arriving among them: the longest gap
    the decodes see around it (the step carrying its first chunk) and its TTFT."""
    srv.post("/reset_prefix_cache")
    box = {}

    def inject():
        time.sleep(0.5)  # the decoders are decoding by then (256 tokens take over a second)
        box["r"] = srv.stream(prompt_of(rng, L), 1)

    t = threading.Thread(target=inject)
    t.start()
    res = run_streams(srv, [prompt_of(rng, 64) for _ in range(decoders)], 256)
    t.join()
    t0, times = box["r"]
    first = times[0]
    worst, baseline = 0.0, []
    for _, ts in res:
        for a, b in zip(ts, ts[1:]):
            if t0 <= b <= first + 0.05:
                worst = max(worst, b - a)
            elif b < t0:
                baseline.append(b - a)
    return {"prefill_tokens": L, "decoders": decoders, "ttft_s": first - t0,
            "decode_gap_max_s": worst,
            "decode_gap_before_s": statistics.median(baseline[8:] or baseline or [0.0])}


def measure(srv, rng, lengths, batches, contexts, mixed, rounds):
    """Every configuration once per round, in a fresh random order each round: the machine's
    other load drifts over minutes, and interleaving spreads it evenly over the points (their
    medians then compare like with like)."""
    data = {"prefill": [], "decode": [], "mixed": [], "loadavg": []}
    tasks = ([("prefill", L) for L in lengths] + [("decode", B, c) for c in contexts for B in batches]
             + [("mixed", L) for L in mixed])
    for r in range(rounds):
        order = tasks[:]
        rng.shuffle(order)
        for t in order:
            if t[0] == "prefill":
                rows = prefill_once(srv, rng, t[1])
                data["prefill"].extend(rows)
                msg = f"{rows[0]['ttft_s']*1e3:.1f} ms uncached, {rows[1]['ttft_s']*1e3:.1f} ms cached"
            elif t[0] == "decode":
                row = decode_once(srv, rng, t[1], t[2])
                data["decode"].append(row)
                msg = f"step {row['itl_median_s']*1e3:.2f} ms"
            else:
                row = mixed_once(srv, rng, t[1])
                data["mixed"].append(row)
                msg = (f"ttft {row['ttft_s']*1e3:.1f} ms, decode gap {row['decode_gap_max_s']*1e3:.1f} ms "
                       f"(before {row['decode_gap_before_s']*1e3:.1f})")
            print(f"  round {r} {t}: {msg}", file=sys.stderr)
        with open("/proc/loadavg") as f:
            data["loadavg"].append(f.read().split()[0])
    return data


# --- the fit ------------------------------------------------------------------------------

NAMES = ("cpu_s", "cpu_per_seq_s", "admit_s", "admit_s_per_prompt_token", "token_s", "attention_s",
         "kv_s_per_token")


def step(seqs, admitted, admitted_prompt, tokens, attention, kv_read):
    """One step as the model sees it: (common, compute, memory) feature vectors over NAMES.
    Its time is common + max(compute, memory); weights_s is 0 on the CPU (see the docstring)."""
    return ([1.0, seqs, admitted, admitted_prompt, 0.0, 0.0, 0.0],
            [0.0, 0.0, 0.0, 0.0, tokens, attention, 0.0],
            [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, kv_read])


def chunks(n_new, context, budget=BUDGET):
    """The (chunk tokens, context before it) of a prefill of n_new tokens after `context`
    cached ones, as vLLM V1's scheduler splits it under the token budget."""
    out, k = [], context
    while n_new > 0:
        c = min(n_new, budget)
        out.append((c, k))
        k += c
        n_new -= c
    return out


def prefill_steps(tokens, hit):
    """The steps of a lone request's time to first token; the first admits it."""
    return [step(1, int(i == 0), tokens if i == 0 else 0, c, c * (k + c / 2), k + c)
            for i, (c, k) in enumerate(chunks(tokens - hit, hit))]


def decode_steps(batch, ctx):
    # One step of `batch` decodes, each attending to ~ctx + half its output so far (64 of 128).
    c = ctx + 64
    return [step(batch, 0, 0, batch, batch * c, batch * c)]


def mixed_steps(decoders, tokens):
    """The step in which a lone prefill of `tokens` joins `decoders` decodes (64-token prompts,
    ~100 tokens out by then): its first chunk, under the budget the decodes leave."""
    c = min(tokens, BUDGET - decoders)
    ctx = decoders * (64 + 100)
    return [step(decoders + 1, 1, tokens, decoders + c, ctx + c * c / 2, ctx + c)]


def predict(theta, steps):
    dot = lambda f: sum(t * x for t, x in zip(theta, f))
    return sum(dot(c) + max(dot(p), dot(m)) for c, p, m in steps)


def linearised(theta, steps):
    """The features of `steps` with each step's larger branch under theta."""
    dot = lambda f: sum(t * x for t, x in zip(theta, f))
    out = [0.0] * len(NAMES)
    for c, p, m in steps:
        if theta is None:  # the first pass: both branches, so that each gets a signal
            out = [o + x + y + z for o, x, y, z in zip(out, c, p, m)]
            continue
        branch = p if dot(p) >= dot(m) else m
        out = [o + x + y for o, x, y in zip(out, c, branch)]
    return out


def lstsq(X, y, w):
    """Weighted least squares by the normal equations (a handful of unknowns: no numpy)."""
    n = len(X[0])
    A = [[sum(wi * xi[a] * xi[b] for xi, wi in zip(X, w)) for b in range(n)] for a in range(n)]
    b = [sum(wi * xi[a] * yi for xi, yi, wi in zip(X, y, w)) for a in range(n)]
    for i in range(n):  # Gauss-Jordan with partial pivoting
        p = max(range(i, n), key=lambda r: abs(A[r][i]))
        A[i], A[p], b[i], b[p] = A[p], A[i], b[p], b[i]
        for r in range(n):
            if r != i and A[i][i]:
                f = A[r][i] / A[i][i]
                A[r] = [x - f * yv for x, yv in zip(A[r], A[i])]
                b[r] -= f * b[i]
    return [b[i] / A[i][i] if A[i][i] else 0.0 for i in range(n)]


def nnls(X, y):
    """Least squares with every parameter >= 0 (drop the most negative one and refit), weighted
    by 1/y^2 so that every point counts by its relative error (the times span 100x)."""
    active = list(range(len(X[0])))
    w = [1.0 / max(v, 1e-6) ** 2 for v in y]
    while True:
        sol = lstsq([[r[j] for j in active] for r in X], y, w)
        worst = min(zip(sol, active))
        if worst[0] >= 0:
            full = [0.0] * len(X[0])
            for j, s in zip(active, sol):
                full[j] = s
            return full
        active.remove(worst[1])


def med(rows, key, **match):
    vals = [r[key] for r in rows if all(r[k] == v for k, v in match.items())]
    return statistics.median(vals) if vals else None


def points(data):
    """(label, steps, measured seconds, fitted?) of every median point."""
    out = []
    pre = data["prefill"]
    kind = lambda r: r.get("kind") or ("cached" if r["cached"] else "uncached")
    for L in sorted({r["tokens"] for r in pre}):
        for k in ("uncached", "cached", "partial"):
            sel = [r for r in pre if r["tokens"] == L and kind(r) == k]
            if sel:
                hit = int(statistics.median(r["hit_tokens"] for r in sel))
                out.append((f"TTFT L={L} {k} (hit {hit})", prefill_steps(L, hit),
                            statistics.median(r["ttft_s"] for r in sel), True))
    dec = data["decode"]
    for ctx in sorted({r["prompt_tokens"] for r in dec}):
        for B in sorted({r["batch"] for r in dec}):
            v = med(dec, "itl_median_s", batch=B, prompt_tokens=ctx)
            if v is not None:
                out.append((f"decode step B={B} ctx={ctx}", decode_steps(B, ctx), v, True))
    mix = data.get("mixed") or []
    for L in sorted({r["prefill_tokens"] for r in mix}):
        d = mix[0]["decoders"]
        g = med(mix, "decode_gap_max_s", prefill_tokens=L)
        out.append((f"mixed: {d} decodes' step as {L} tokens join", mixed_steps(d, L), g, False))
    return out


def fit(data):
    """NNLS over the points, each step linearised on its larger branch (compute or memory);
    the branches are re-chosen under the new parameters until they settle."""
    pts = [p for p in points(data) if p[3]]
    theta = None
    for _ in range(20):
        X = [linearised(theta, st) for _, st, _, _ in pts]
        new = nnls(X, [m for _, _, m, _ in pts])
        if new == theta:
            break
        theta = new
    params = dict(zip(NAMES, theta))
    table = []
    for label, st, m, used in points(data):
        p = predict(theta, st)
        table.append({"point": label, "fitted": used, "measured_ms": m * 1e3, "model_ms": p * 1e3,
                      "error_pct": (p - m) / m * 100})
    return params, table


def report(data):
    params, table = fit(data)
    print("fitted (seconds):", json.dumps(params, indent=1))
    print("\nmedians, measured and modelled (* = not fitted, a check):")
    for r in table:
        star = " " if r["fitted"] else "*"
        print(f" {star}{r['point']:<40} measured {r['measured_ms']:8.2f} ms  model "
              f"{r['model_ms']:8.2f} ms  {r['error_pct']:+6.1f}%")
    errs = [abs(r["error_pct"]) for r in table if r["fitted"]]
    print(f"\nfitted points: median |error| {statistics.median(errs):.1f}%, worst {max(errs):.1f}%")
    if data.get("loadavg"):
        print(f"load average after each round: {' '.join(data['loadavg'])}")
    return {"params": params, "table": table}


def probe(srv, rng, fit_file):
    """The factor measured / modelled over a few points, now (see the module docs)."""
    with open(fit_file) as f:
        params = json.load(f)["fit"]["params"]
    theta = [params[n] for n in NAMES]
    srv.stream(prompt_of(rng, 256), 4)  # warm up
    data = measure(srv, rng, [512, 2048], [4], [64], [], 3)
    logs = []
    for label, steps, measured, _ in points(data):
        model = predict(theta, steps)
        logs.append(math.log(measured / model))
        print(f"  {label}: measured {measured*1e3:.1f} ms, model {model*1e3:.1f} ms", file=sys.stderr)
    return math.exp(sum(logs) / len(logs))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("url", nargs="?")
    ap.add_argument("--out")
    ap.add_argument("--repeats", type=int, default=5, help="rounds over every configuration")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--refit")
    ap.add_argument("--probe", metavar="FIT.json")
    ap.add_argument("--seed", type=int, default=45)
    a = ap.parse_args()
    if a.refit:
        with open(a.refit) as f:
            data = json.load(f)
        data["fit"] = report(data)
        with open(a.refit, "w") as f:
            json.dump(data, f, indent=1)
        return
    if not a.url:
        ap.error("URL or --refit")
    srv = Server(a.url)
    rng = random.Random(a.seed)
    if a.probe:
        print(f"{probe(srv, rng, a.probe):.3f}")
        return
    lengths = [64, 512, 2048, 4096] if a.quick else [16, 128, 512, 1024, 2048, 3072, 4096, 6144]
    batches = [1, 4] if a.quick else [1, 2, 4, 8, 16, 32]
    contexts = [64] if a.quick else [64, 1024]
    srv.stream(prompt_of(rng, 256), 4)  # warm up
    data = {
        "url": a.url,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "rounds": a.repeats,
        "block_size": BLOCK,
        "max_num_batched_tokens": BUDGET,
    }
    data.update(measure(srv, rng, lengths, batches, contexts, [32, 256, 1024, 2048], a.repeats))
    data["fit"] = report(data)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(data, f, indent=1)


if __name__ == "__main__":
    main()
