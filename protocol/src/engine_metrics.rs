//! vLLM's `/metrics`: the series kvmesh reads, summed over the `engine` label (data-parallel
//! engines behind one server) and other label sets (finish reasons), with the removed pre-0.12
//! names accepted as fallbacks. See `vllm-interfaces.md` §1.
//!
//! One parser for the node's engine poller, the load generator's scrape, the demo report's
//! sampler and the end-to-end tests; the text format itself is [`crate::prometheus_text`].

use crate::LoraUse;
use crate::prometheus_text::{Sample, samples};

/// Weight of a new observation in the load digest's exponentially weighted averages (TTFT,
/// prefill speed): the node moves them once per engine poll, towards the mean over the
/// requests the poll saw, and the simulator does the same once per digest.
pub const EWMA_WEIGHT: f64 = 0.3;

/// The average moved towards `sample`; the first sample (no average yet) is taken as it is. A
/// sample no digest can carry (not finite, or past `f32`'s range, as from an engine's garbage
/// counters) leaves it as it was: once infinite the average would turn NaN for good, and every
/// peer rejects a digest carrying either.
pub fn ewma(previous: f64, sample: f64) -> f64 {
    if !sample.is_finite() || sample.abs() > f64::from(f32::MAX) {
        previous
    } else if previous <= 0.0 {
        sample
    } else {
        previous + EWMA_WEIGHT * (sample - previous)
    }
}

/// What kvmesh reads of one `/metrics` scrape.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EngineMetrics {
    pub running: f64,
    pub waiting: f64,
    /// Mean over engines, 0..=1.
    pub kv_usage: f64,
    pub block_size: Option<u32>,
    pub num_gpu_blocks: Option<u64>,
    /// `vllm:prefix_cache_queries_total` (tokens).
    pub prefix_queries: f64,
    /// `vllm:prefix_cache_hits_total` (tokens).
    pub prefix_hits: f64,
    pub prompt_tokens: f64,
    /// `vllm:request_success_total`, all finish reasons.
    pub requests: f64,
    /// Of those, `finished_reason="abort"`: requests withdrawn by their client before the end.
    pub aborted: f64,
    pub ttft_sum: f64,
    pub ttft_count: f64,
    /// Cumulative `vllm:time_to_first_token_seconds` buckets: (upper bound, count), ascending,
    /// without `+Inf`.
    pub ttft_buckets: Vec<(f64, f64)>,
    /// `vllm:request_prefill_time_seconds` (real vLLM V1), when exposed.
    pub prefill_time_sum: Option<f64>,
    pub preemptions: f64,
    /// `vllm:lora_requests_info`'s latest sample: the adapters in use, and when.
    pub lora_use: Option<(f64, LoraUse)>,
}

/// An engine's cumulative prefill counters: what its prefill speed is measured by, in the
/// node's poller and in the simulator's sidecars alike.
#[derive(Copy, Clone, Debug, Default, PartialEq)]
pub struct PrefillCounters {
    /// Prompt tokens of requests that had their first token (`vllm:prompt_tokens_total`,
    /// counted by vLLM V1 with the first token).
    pub prompt_tokens: f64,
    /// Prompt tokens found in the prefix cache (`vllm:prefix_cache_hits_total`, counted when
    /// a request is scheduled).
    pub prefix_hits: f64,
    /// Seconds spent prefilling: `vllm:request_prefill_time_seconds`'s sum, or, of an engine
    /// that does not expose it, the TTFTs' (which count queueing too: the speed errs low).
    pub seconds: f64,
}

impl PrefillCounters {
    /// The prefill speed shown since `before`, tokens per second: the prompt tokens computed
    /// (prompt tokens less prefix-cache hits) over the time spent prefilling; `None` when
    /// nothing was computed or no time was counted.
    pub fn speed_since(&self, before: &Self) -> Option<f64> {
        let computed =
            (self.prompt_tokens - before.prompt_tokens) - (self.prefix_hits - before.prefix_hits);
        let seconds = self.seconds - before.seconds;
        (computed > 0.0 && seconds > 0.0).then(|| computed / seconds)
    }

    /// Whether a counter went down since `before`: the engine restarted.
    fn reset_since(&self, before: &Self) -> bool {
        self.prompt_tokens < before.prompt_tokens
            || self.prefix_hits < before.prefix_hits
            || self.seconds < before.seconds
    }
}

/// Prefill time a speed is measured over, at least, seconds.
pub const MIN_PREFILL_WINDOW_S: f64 = 0.25;

/// The prefill speed over windows of at least [`MIN_PREFILL_WINDOW_S`] of prefill time.
///
/// The engine counts a request's cache hits when it schedules it, but its prompt tokens and
/// its prefill time with its first token. A scrape between the two sees the hits without the
/// prompt: nothing computed, or less than nothing; the next sees the whole prompt computed in
/// the prefill time of a request that found most of it cached. Measured scrape by scrape,
/// the first window says nothing and is skipped, the second is kept: on a workload of cache
/// hits the speed read 2–3× the engine's (20,800 tokens/s at the median against 12,000, in
/// the simulator's `hot`), and a serving node judged a new prompt queued 100 ms before it
/// done. A window here stays open until it spans enough prefill time and computed tokens,
/// so the two scrapes' counts meet in one.
#[derive(Clone, Debug, Default)]
pub struct PrefillMeter {
    since: Option<PrefillCounters>,
}

impl PrefillMeter {
    /// Takes the engine's counters read now; the speed over the window they close, if they
    /// close one.
    pub fn observe(&mut self, now: PrefillCounters) -> Option<f64> {
        let since = match self.since {
            Some(since) if !now.reset_since(&since) => since,
            _ => {
                self.since = Some(now);
                return None;
            }
        };
        if now.seconds - since.seconds < MIN_PREFILL_WINDOW_S {
            return None;
        }
        let speed = now.speed_since(&since)?;
        self.since = Some(now);
        Some(speed)
    }
}

impl EngineMetrics {
    /// The prefill counters of this scrape (see [`PrefillCounters`]): timed by the prefill
    /// time where the engine exposes it, else by the TTFTs.
    pub fn prefill_counters(&self) -> PrefillCounters {
        PrefillCounters {
            prompt_tokens: self.prompt_tokens,
            prefix_hits: self.prefix_hits,
            seconds: self.prefill_time_sum.unwrap_or(self.ttft_sum),
        }
    }
}

/// Parses the text format. Unknown series are ignored; a malformed line, or a sample that is
/// not finite, is skipped (a scrape must not fail because an engine added an exotic series).
pub fn parse(text: &str) -> EngineMetrics {
    let mut m = EngineMetrics::default();
    let mut kv_samples = 0u32;
    let mut legacy_kv = (0.0, 0u32);
    // Pre-0.12 prefix-cache counters (queries, hits), used when the current ones are absent.
    let mut legacy_prefix = (0.0, 0.0);
    let (mut have_queries, mut have_hits) = (false, false);
    for sample in samples(text).filter(|s| s.value.is_finite()) {
        let value = sample.value;
        match sample.name {
            "vllm:num_requests_running" => add(&mut m.running, value),
            "vllm:num_requests_waiting" => add(&mut m.waiting, value),
            "vllm:kv_cache_usage_perc" => kv_samples += u32::from(added(&mut m.kv_usage, value)),
            "vllm:gpu_cache_usage_perc" => legacy_kv.1 += u32::from(added(&mut legacy_kv.0, value)),
            "vllm:prefix_cache_queries_total" => {
                add(&mut m.prefix_queries, value);
                have_queries = true;
            }
            "vllm:prefix_cache_hits_total" => {
                add(&mut m.prefix_hits, value);
                have_hits = true;
            }
            "vllm:gpu_prefix_cache_queries_total" | "vllm:gpu_prefix_cache_queries" => {
                add(&mut legacy_prefix.0, value)
            }
            "vllm:gpu_prefix_cache_hits_total" | "vllm:gpu_prefix_cache_hits" => {
                add(&mut legacy_prefix.1, value)
            }
            "vllm:prompt_tokens_total" => add(&mut m.prompt_tokens, value),
            "vllm:request_success_total" => {
                add(&mut m.requests, value);
                if sample.label("finished_reason") == Some("abort") {
                    add(&mut m.aborted, value);
                }
            }
            "vllm:time_to_first_token_seconds_sum" => add(&mut m.ttft_sum, value),
            "vllm:time_to_first_token_seconds_count" => add(&mut m.ttft_count, value),
            "vllm:time_to_first_token_seconds_bucket" => add_ttft_bucket(&mut m, &sample),
            "vllm:request_prefill_time_seconds_sum" => {
                add(m.prefill_time_sum.get_or_insert(0.0), value)
            }
            "vllm:num_preemptions_total" => add(&mut m.preemptions, value),
            // A gauge whose labels say the adapters in use and whose value is when: vLLM
            // sets a new label set at each change and keeps the old ones, so the latest wins.
            "vllm:lora_requests_info" if m.lora_use.as_ref().is_none_or(|(at, _)| value >= *at) => {
                m.lora_use = Some((value, lora_use(&sample)));
            }
            "vllm:cache_config_info" => add_cache_config(&mut m, &sample),
            _ => {}
        }
    }
    if kv_samples > 0 {
        m.kv_usage /= f64::from(kv_samples);
    } else if legacy_kv.1 > 0 {
        m.kv_usage = legacy_kv.0 / f64::from(legacy_kv.1);
    }
    if !have_queries {
        m.prefix_queries = legacy_prefix.0;
    }
    if !have_hits {
        m.prefix_hits = legacy_prefix.1;
    }
    m.kv_usage = m.kv_usage.clamp(0.0, 1.0);
    m.ttft_buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    m
}

/// Adds a TTFT histogram bucket's count to the bucket of the same bound (summed over
/// engines); a bucket without a finite `le` is skipped.
fn add_ttft_bucket(m: &mut EngineMetrics, sample: &Sample) {
    let Some(le) = sample
        .label("le")
        .and_then(|le| le.parse::<f64>().ok())
        .filter(|le| le.is_finite())
    else {
        return;
    };
    match m.ttft_buckets.iter_mut().find(|(bound, _)| *bound == le) {
        Some((_, count)) => add(count, sample.value),
        None => m.ttft_buckets.push((le, sample.value)),
    }
}

/// Reads `vllm:cache_config_info`'s labels: the block size, and the GPU blocks (summed over
/// engines).
fn add_cache_config(m: &mut EngineMetrics, sample: &Sample) {
    if let Some(size) = sample.label("block_size").and_then(|v| v.parse().ok()) {
        m.block_size = Some(size);
    }
    if let Some(blocks) = sample
        .label("num_gpu_blocks")
        .and_then(|v| v.parse::<u64>().ok())
    {
        // Saturating: an absurd count must not overflow (a panic in debug builds, a wrapped,
        // tiny capacity in release ones).
        let total = m.num_gpu_blocks.get_or_insert(0);
        *total = total.saturating_add(blocks);
    }
}

/// Adds a sample to a sum, unless the sum would no longer be finite: then the sample is
/// skipped like a malformed line. Samples are finite, but summed over engines, two huge ones
/// overflow, and an infinite figure poisons what the poller derives from it (an infinite or
/// NaN EWMA makes every peer reject this node's digest).
fn add(sum: &mut f64, value: f64) {
    added(sum, value);
}

/// [`add`], saying whether the sample was added.
fn added(sum: &mut f64, value: f64) -> bool {
    let total = *sum + value;
    if total.is_finite() {
        *sum = total;
    }
    total.is_finite()
}

/// `vllm:lora_requests_info`'s labels: comma-separated adapter names.
fn lora_use(sample: &Sample) -> LoraUse {
    let names = |key| {
        sample
            .label(key)
            .unwrap_or_default()
            .split(',')
            .map(str::trim)
            .filter(|name| !name.is_empty())
            .map(str::to_owned)
            .collect()
    };
    LoraUse {
        running: names("running_lora_adapters"),
        waiting: names("waiting_lora_adapters"),
        max_loras: sample
            .label("max_lora")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_sample_no_digest_could_carry_leaves_the_average_alone() {
        // Found by the engine_metrics fuzz target's neighbourhood: finite counters whose
        // quotient overflows, or a cast to the digest's f32 that would.
        for bad in [f64::INFINITY, f64::NAN, 1e300, -1e300] {
            assert_eq!(ewma(120.0, bad), 120.0, "{bad}");
            assert_eq!(ewma(0.0, bad), 0.0, "{bad}");
        }
        assert_eq!(ewma(0.0, 80.0), 80.0);
        assert_eq!(ewma(100.0, 200.0), 100.0 + EWMA_WEIGHT * 100.0);
    }

    use super::*;

    #[test]
    fn prefill_speed_is_timed_by_the_prefill_time_where_the_engine_has_it() {
        let before = EngineMetrics {
            prompt_tokens: 1_000.0,
            ttft_sum: 1.0,
            prefill_time_sum: Some(0.5),
            ..Default::default()
        };
        let now = EngineMetrics {
            prompt_tokens: 4_000.0,
            prefix_hits: 1_000.0,
            ttft_sum: 3.0,
            prefill_time_sum: Some(0.75),
            ..Default::default()
        };
        // 2,000 tokens computed in 0.25 s of prefill (2 s of TTFT).
        let mut meter = PrefillMeter::default();
        assert_eq!(
            meter.observe(before.prefill_counters()),
            None,
            "a first read"
        );
        assert_eq!(meter.observe(now.prefill_counters()), Some(8_000.0));
        let untimed = |m: &EngineMetrics| EngineMetrics {
            prefill_time_sum: None,
            ..m.clone()
        };
        let mut meter = PrefillMeter::default();
        meter.observe(untimed(&before).prefill_counters());
        assert_eq!(
            meter.observe(untimed(&now).prefill_counters()),
            Some(1_000.0),
            "by the TTFTs"
        );
        assert_eq!(
            meter.observe(untimed(&now).prefill_counters()),
            None,
            "nothing since"
        );
    }

    #[test]
    fn a_window_stays_open_until_the_hits_meet_their_prompts() {
        let mut meter = PrefillMeter::default();
        let at = |prompt_tokens, prefix_hits, seconds| PrefillCounters {
            prompt_tokens,
            prefix_hits,
            seconds,
        };
        meter.observe(at(0.0, 0.0, 0.0));
        // A 2,304-token prompt with 2,048 cached was scheduled: its hits show, its prompt not
        // yet; another request computed 1,000 in 0.3 s. Less than nothing computed: open.
        assert_eq!(meter.observe(at(1_000.0, 2_048.0, 0.3)), None);
        // Its first token: 256 computed in 0.034 s. Scrape by scrape this window would read
        // 2,304 / 0.034 = 67,765 tokens/s (the one before skipped); over both, 1,256 in 0.334 s.
        let speed = meter.observe(at(3_304.0, 2_048.0, 0.334)).unwrap();
        assert!((speed - 1_256.0 / 0.334).abs() < 1e-6, "{speed}");
        // Too little prefill time since: the window stays open.
        assert_eq!(meter.observe(at(3_400.0, 2_048.0, 0.4)), None);
        // The engine restarted: its counters start again, and so does the window.
        assert_eq!(meter.observe(at(100.0, 0.0, 0.01)), None);
        assert_eq!(meter.observe(at(3_100.0, 0.0, 0.31)), Some(10_000.0));
    }

    #[test]
    fn the_latest_lora_requests_info_says_which_adapters_are_in_use() {
        let text = "# TYPE vllm:lora_requests_info gauge\n\
            vllm:lora_requests_info{max_lora=\"2\",running_lora_adapters=\"sql\",waiting_lora_adapters=\"\"} 1.79e9\n\
            vllm:lora_requests_info{max_lora=\"2\",running_lora_adapters=\"sql,chat\",waiting_lora_adapters=\"math\"} 1.7900001e9\n\
            vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"100\"} 1\n";
        let parsed = parse(text);
        let (_, lora) = parsed.lora_use.expect("a lora_requests_info sample");
        assert_eq!(lora.running, ["sql", "chat"]);
        assert_eq!(lora.waiting, ["math"]);
        assert_eq!(lora.max_loras, 2);
        assert_eq!(parsed.block_size, Some(16), "other labels still read");
        assert_eq!(parse("vllm:num_requests_running 1\n").lora_use, None);
    }

    const CURRENT: &str = r#"# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
vllm:num_requests_waiting{engine="0",model_name="m"} 4.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.25
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1000.0
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 640.0
vllm:prompt_tokens_total{engine="0",model_name="m"} 1000.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} 10.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 2.5
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 10.0
vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="0",num_gpu_blocks="8192"} 1.0
vllm:num_preemptions_total{engine="0",model_name="m"} 2.0
"#;

    #[test]
    fn reads_current_names_and_sums_engines() {
        let m = parse(CURRENT);
        assert_eq!(m.running, 5.0);
        assert_eq!(m.waiting, 4.0);
        assert!((m.kv_usage - 0.375).abs() < 1e-9);
        assert_eq!((m.prefix_queries, m.prefix_hits), (1000.0, 640.0));
        assert_eq!((m.ttft_sum, m.ttft_count), (2.5, 10.0));
        assert_eq!(m.block_size, Some(16));
        assert_eq!(m.num_gpu_blocks, Some(8192));
        assert_eq!(m.preemptions, 2.0);
        assert_eq!(m.prefill_time_sum, None);
    }

    #[test]
    fn falls_back_to_removed_names() {
        let old = "vllm:gpu_cache_usage_perc{model_name=\"m\"} 0.8\n\
                   vllm:gpu_prefix_cache_queries_total{model_name=\"m\"} 50\n\
                   vllm:gpu_prefix_cache_hits_total{model_name=\"m\"} 5\n";
        let m = parse(old);
        assert!((m.kv_usage - 0.8).abs() < 1e-9);
        assert_eq!((m.prefix_queries, m.prefix_hits), (50.0, 5.0));
    }

    /// Found by the `engine_metrics` fuzz target: sums over engines overflowed to infinities.
    #[test]
    fn huge_values_do_not_sum_to_infinity() {
        let m = parse(
            "vllm:num_requests_running{} -1e308\nvllm:num_requests_running{} -1e308\n\
             vllm:prompt_tokens_total 1e308\nvllm:prompt_tokens_total 1e308\n\
             vllm:kv_cache_usage_perc 1e308\nvllm:kv_cache_usage_perc 1e308\n\
             vllm:kv_cache_usage_perc -1e308\n",
        );
        assert_eq!((m.running, m.prompt_tokens), (-1e308, 1e308));
        // The second huge sample was skipped; the mean is over the two that were summed.
        assert_eq!(m.kv_usage, 0.0);
    }

    /// Found by the `engine_metrics` fuzz target: block counts summed over engines overflowed.
    #[test]
    fn huge_block_counts_saturate() {
        let line =
            "vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"18446744073709551615\"} 1\n";
        assert_eq!(parse(&line.repeat(2)).num_gpu_blocks, Some(u64::MAX));
    }

    #[test]
    fn garbage_is_skipped_not_fatal() {
        let m =
            parse("vllm:num_requests_running{ 3\nnot a metric\nvllm:num_requests_waiting 2 123\n");
        assert_eq!(m.waiting, 2.0);
        assert_eq!(m.running, 0.0);
    }
}
