//! Cost of the engine model itself (no HTTP): what one request costs the mock engine and the
//! cluster simulator.

use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use kvmesh_sim::engine::model::{Engine, EngineConfig, EngineRequest, TimingModel};
use std::hint::black_box;

fn engine() -> Engine {
    Engine::new(EngineConfig {
        timing: TimingModel {
            instant: true,
            ..TimingModel::default()
        },
        ..EngineConfig::default()
    })
}

fn drain(e: &mut Engine) -> usize {
    let mut n = 0;
    while let Some(t) = e.next_event_time() {
        n += e.advance(t).len();
    }
    n
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("engine_model");
    let small: Vec<u32> = (0..32).collect();
    g.bench_function("small_request_32_in_16_out", |b| {
        let mut e = engine();
        let mut id = 0;
        b.iter(|| {
            id += 1;
            e.submit(EngineRequest::new(id, small.clone(), 16), Duration::ZERO)
                .unwrap();
            black_box(drain(&mut e))
        })
    });
    let long: Vec<u32> = (0..4096).map(|i| i * 7 % 50_000).collect();
    g.bench_function("cached_4k_prompt_1_out", |b| {
        let mut e = engine();
        let mut id = 0;
        b.iter(|| {
            id += 1;
            e.submit(EngineRequest::new(id, long.clone(), 1), Duration::ZERO)
                .unwrap();
            black_box(drain(&mut e))
        })
    });
    g.bench_function("batch_of_64_small_requests", |b| {
        let mut e = engine();
        let mut id = 0;
        b.iter(|| {
            for i in 0..64u32 {
                id += 1;
                let p: Vec<u32> = (0..32).map(|t| t + i * 1000).collect();
                e.submit(EngineRequest::new(id, p, 16), Duration::ZERO)
                    .unwrap();
            }
            black_box(drain(&mut e))
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
