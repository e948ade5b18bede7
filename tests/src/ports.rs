//! Loopback ports for processes that are told a port rather than reporting the one they bound
//! (a test that binds its own port asks the kernel for an ephemeral one, `127.0.0.1:0`).

use std::net::TcpListener;

use kvmesh_protocol::mix64;

/// An unused loopback TCP port below the kernel's ephemeral range, for an endpoint a peer
/// connects to, retrying, before its listener starts (a KV-event publisher connecting to a
/// sidecar under `--kv-events-bind`), or that a server binds a minute after it was chosen (a
/// vLLM server starting). Inside the range, one of those connection attempts can
/// take the port as its own source port (a TCP self-connect) or any outgoing connection can,
/// and the listener then fails with "address in use" for good; below it, only another
/// listener can.
pub fn free_listen_port() -> u16 {
    let first_ephemeral = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let low = 10_000u16.min(first_ephemeral / 2);
    let span = u64::from(first_ephemeral.saturating_sub(low).max(1));
    let seed = u64::from(std::process::id())
        ^ mix64(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64),
        );
    (0..1000u64)
        .map(|attempt| low + (mix64(seed ^ attempt) % span) as u16)
        .find(|&port| TcpListener::bind(("127.0.0.1", port)).is_ok())
        .expect("a free loopback port below the ephemeral range")
}
