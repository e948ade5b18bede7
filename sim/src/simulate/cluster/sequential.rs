//! The discrete-event loop of the centralized policies: arrivals and engine wake-ups in time
//! order (engines first at equal times, then by node index). In a disaggregated cluster a
//! prefill leg's end hands its decode leg to the decode engine at once (a central router has
//! no hop to model), and a pull's arrival wakes both engines.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::Sim;
use crate::simulate::node::{EngineEvent, SimNode};
use crate::simulate::workload::SimRequest;

/// What happens at an instant, in the order events at one instant run.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    /// An engine's next step is due.
    Engine(u32),
    /// The KV of request `id`'s decode leg arrived at node `node`'s engine.
    Pulled { id: u64, node: u32 },
}

type Heap = BinaryHeap<Reverse<(u64, Event)>>;

pub(super) fn run(sim: &mut Sim<'_>, requests: impl Iterator<Item = SimRequest>) {
    let mut heap = Heap::new();
    let mut outputs = Vec::new();
    let mut events = Vec::new();
    let mut requests = requests.peekable();
    loop {
        let t_event = heap.peek().map_or(u64::MAX, |Reverse((t, _))| *t);
        let t_arrival = requests.peek().map_or(u64::MAX, |r| r.arrival_ns);
        if t_event == u64::MAX && t_arrival == u64::MAX {
            break;
        }
        if t_event <= t_arrival {
            let Reverse((now, event)) = heap.pop().expect("peeked");
            match event {
                Event::Engine(i) => {
                    let node = &mut sim.nodes[i as usize];
                    events.clear();
                    if !node.wake(now, &mut outputs, &mut events) {
                        continue;
                    }
                    schedule(node, i, now, &mut heap);
                    for (at, id) in sim.start_pulls(i, now) {
                        heap.push(Reverse((at, Event::Pulled { id, node: i })));
                    }
                    let prefilled: Vec<u64> = events
                        .iter()
                        .filter_map(|event| match *event {
                            EngineEvent::Finished { request, .. }
                                if sim.is_prefill_leg(i as usize, request) =>
                            {
                                Some(request)
                            }
                            _ => None,
                        })
                        .collect();
                    sim.apply(i as usize, &events);
                    for id in prefilled {
                        sim.prefill_legs.remove(&id);
                        if let Some(submission) = sim.decode_leg(id, i, now) {
                            submit(sim, submission, &mut heap);
                        }
                    }
                }
                Event::Pulled { id, node } => {
                    for woken in sim.pulled(id, node, now) {
                        schedule(&mut sim.nodes[woken as usize], woken, now, &mut heap);
                    }
                }
            }
        } else {
            let request = requests.next().expect("peeked");
            if let Some(submission) = sim.arrive(request) {
                submit(sim, submission, &mut heap);
            }
        }
    }
}

fn submit(sim: &mut Sim<'_>, submission: super::Submission, heap: &mut Heap) {
    let target = submission.target;
    let node = &mut sim.nodes[target];
    if node.submit(submission.request, submission.arrival_ns) {
        schedule(node, target as u32, submission.arrival_ns, heap);
    } else {
        sim.refused(target);
    }
}

fn schedule(node: &mut SimNode, index: u32, now: u64, heap: &mut Heap) {
    if let Some(at) = node.next_wake(now) {
        heap.push(Reverse((at, Event::Engine(index))));
    }
}
