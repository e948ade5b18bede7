//! The discrete-event loop of the centralized policies: arrivals and engine wake-ups in time
//! order (engines first at equal times, then by node index).

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::Sim;
use crate::simulate::node::SimNode;
use crate::simulate::workload::SimRequest;

pub(super) fn run(sim: &mut Sim<'_>, requests: impl Iterator<Item = SimRequest>) {
    let mut heap: BinaryHeap<Reverse<(u64, u32)>> = BinaryHeap::new();
    let mut outputs = Vec::new();
    let mut events = Vec::new();
    let mut requests = requests.peekable();
    loop {
        let t_engine = heap.peek().map_or(u64::MAX, |Reverse((t, _))| *t);
        let t_arrival = requests.peek().map_or(u64::MAX, |r| r.arrival_ns);
        if t_engine == u64::MAX && t_arrival == u64::MAX {
            break;
        }
        if t_engine <= t_arrival {
            let Reverse((now, i)) = heap.pop().expect("peeked");
            let node = &mut sim.nodes[i as usize];
            events.clear();
            if !node.wake(now, &mut outputs, &mut events) {
                continue;
            }
            schedule(node, i, now, &mut heap);
            sim.apply(i as usize, &events);
        } else {
            let request = requests.next().expect("peeked");
            let Some(submission) = sim.arrive(request) else {
                continue;
            };
            let target = submission.target;
            let node = &mut sim.nodes[target];
            if node.submit(submission.request, submission.arrival_ns) {
                schedule(node, target as u32, submission.arrival_ns, &mut heap);
            } else {
                sim.refused(target);
            }
        }
    }
}

fn schedule(node: &mut SimNode, index: u32, now: u64, heap: &mut BinaryHeap<Reverse<(u64, u32)>>) {
    if let Some(at) = node.next_wake(now) {
        heap.push(Reverse((at, index)));
    }
}
