//! A user-space UDP relay that delays every datagram, both ways: the kernel here has no
//! `netem`, and nftables can drop but not delay. A node binds its mesh on one port and
//! advertises the relay's; peers dial the relay, which forwards each datagram to the node
//! after `delay` from a socket of its own per peer (so the node's answers come back through
//! it), and the node's answers to the peer after `delay` too. Constant delay keeps order, so
//! a queue per direction suffices. Threads stop when the relay is dropped.

use std::collections::HashMap;
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How often blocked reads look at the stop flag.
const POLL: Duration = Duration::from_millis(50);

/// One datagram on its way: when to send it, from which socket, to where.
struct Delayed {
    due: Instant,
    from: Arc<UdpSocket>,
    to: SocketAddr,
    bytes: Vec<u8>,
}

/// A relay in front of `target` adding `delay` each way.
pub struct DelayRelay {
    address: SocketAddr,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl DelayRelay {
    /// Starts a relay on an ephemeral loopback port, forwarding to `target`.
    pub fn start(target: SocketAddr, delay: Duration) -> Self {
        let front = Arc::new(UdpSocket::bind("127.0.0.1:0").expect("relay socket"));
        front.set_read_timeout(Some(POLL)).expect("read timeout");
        let address = front.local_addr().expect("relay address");
        let stop = Arc::new(AtomicBool::new(false));
        let (queue, queued) = channel::<Delayed>();
        let mut threads = vec![std::thread::spawn(send_when_due(queued))];
        let stopping = stop.clone();
        threads.push(std::thread::spawn(move || {
            // Per peer: the socket the node sees it as, and that socket's reader thread.
            let peers: Mutex<HashMap<SocketAddr, Arc<UdpSocket>>> = Mutex::default();
            let mut readers = Vec::new();
            let mut buffer = vec![0u8; 65_536];
            while !stopping.load(Ordering::Relaxed) {
                let Ok((n, peer)) = front.recv_from(&mut buffer) else {
                    continue;
                };
                let mut peers = peers.lock().expect("peers");
                let back = peers.entry(peer).or_insert_with(|| {
                    let back = Arc::new(UdpSocket::bind("127.0.0.1:0").expect("relay socket"));
                    back.set_read_timeout(Some(POLL)).expect("read timeout");
                    let answers = (back.clone(), front.clone(), queue.clone());
                    readers.push(std::thread::spawn(relay_answers(
                        answers,
                        peer,
                        delay,
                        stopping.clone(),
                    )));
                    back
                });
                let datagram = Delayed {
                    due: Instant::now() + delay,
                    from: back.clone(),
                    to: target,
                    bytes: buffer[..n].to_vec(),
                };
                let _ = queue.send(datagram);
            }
            drop(queue);
            for reader in readers {
                let _ = reader.join();
            }
        }));
        DelayRelay {
            address,
            stop,
            threads,
        }
    }

    /// The address peers dial (the node advertises it).
    pub fn address(&self) -> SocketAddr {
        self.address
    }
}

/// Reads the node's answers to `peer` on `back` and queues them out of `front`.
fn relay_answers(
    (back, front, queue): (Arc<UdpSocket>, Arc<UdpSocket>, Sender<Delayed>),
    peer: SocketAddr,
    delay: Duration,
    stop: Arc<AtomicBool>,
) -> impl FnOnce() {
    move || {
        let mut buffer = vec![0u8; 65_536];
        while !stop.load(Ordering::Relaxed) {
            if let Ok(n) = back.recv(&mut buffer) {
                let datagram = Delayed {
                    due: Instant::now() + delay,
                    from: front.clone(),
                    to: peer,
                    bytes: buffer[..n].to_vec(),
                };
                let _ = queue.send(datagram);
            }
        }
    }
}

/// Sends each queued datagram at its time, until every sender is gone.
fn send_when_due(queued: Receiver<Delayed>) -> impl FnOnce() {
    move || {
        for datagram in queued {
            if let Some(wait) = datagram.due.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
            let _ = datagram.from.send_to(&datagram.bytes, datagram.to);
        }
    }
}

impl Drop for DelayRelay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// A free loopback UDP port, for a node's mesh to bind behind a relay. (Another process could
/// take it before the node binds it; the node would then fail to start, loudly.)
pub fn free_udp_address() -> SocketAddr {
    let socket = UdpSocket::bind("127.0.0.1:0").expect("a free port");
    socket.local_addr().expect("its address")
}
