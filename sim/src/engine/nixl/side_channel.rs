//! The prefill side: a TCP listener through which decode engines handshake, read leased
//! blocks, report reads and aborts, and renew leases.
//!
//! Each connection carries one [`SideRequest`]. The listener checks that the request is meant
//! for this engine (its `engine_id`), then asks the driver, which owns the engine model and
//! its leases, to act on the request's lease. Faults injected with `--nixl-fault` act here.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

use super::wire::{self, SideReply, SideRequest};
use crate::engine::config::NixlFault;
use crate::engine::server::driver::DriverHandle;

/// Bound on a decode engine's sending of its request line.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// What the driver is asked to do with a lease, by the prefill leg's internal id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseOp {
    /// Check that these blocks may be read.
    Read {
        /// Internal id of the prefill leg.
        request_id: String,
        /// Blocks to read.
        block_ids: Vec<u32>,
    },
    /// Free the blocks (read done, or the decode leg gave up).
    Release {
        /// Internal id of the prefill leg.
        request_id: String,
    },
    /// Renew these leases.
    Renew {
        /// Internal ids of the prefill legs.
        request_ids: Vec<String>,
    },
}

/// The driver's answer to a [`LeaseOp`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseReply {
    /// Whether the read may go ahead, and why not.
    Read(Result<(), String>),
    /// Whether a lease was released.
    Released(bool),
    /// How many leases were renewed.
    Renewed(usize),
}

/// Everything a side-channel connection needs.
pub struct SideChannel {
    /// This engine's id.
    pub engine_id: String,
    /// Tokens per block (a decode engine must have the same).
    pub block_size: u32,
    /// Injected fault, if any.
    pub fault: Option<NixlFault>,
    /// Delay of [`NixlFault::SlowRead`].
    pub fault_delay: Duration,
    /// The engine driver.
    pub driver: DriverHandle,
}

/// Accepts side-channel connections forever.
pub async fn serve(listener: TcpListener, ctx: Arc<SideChannel>) -> std::io::Result<()> {
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "side channel accept failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!(error = %e, "could not set TCP_NODELAY");
        }
        let ctx = ctx.clone();
        tokio::spawn(async move {
            if let Err(e) = connection(stream, &ctx).await {
                tracing::debug!(%peer, error = %e, "side channel connection ended with an error");
            }
        });
    }
}

async fn connection(stream: TcpStream, ctx: &SideChannel) -> std::io::Result<()> {
    let mut stream = BufReader::new(stream);
    let line = tokio::time::timeout(REQUEST_TIMEOUT, wire::read_line(&mut stream))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "no request line"))??;
    let reply = match serde_json::from_str::<SideRequest>(&line) {
        Err(e) => SideReply::refused(format!("bad side-channel request: {e}")),
        Ok(req) => match answer(req, ctx, &mut stream).await {
            Some(reply) => reply,
            None => return Ok(()), // a hung read: the peer hung up first
        },
    };
    wire::write_reply(stream.get_mut(), &reply).await
}

/// The reply to `req`; `None` when an injected hang ended because the peer went away.
async fn answer(
    req: SideRequest,
    ctx: &SideChannel,
    stream: &mut BufReader<TcpStream>,
) -> Option<SideReply> {
    let engine_id = match &req {
        SideRequest::Handshake { engine_id }
        | SideRequest::Read { engine_id, .. }
        | SideRequest::Done { engine_id, .. }
        | SideRequest::Abort { engine_id, .. }
        | SideRequest::Heartbeat { engine_id, .. } => engine_id,
    };
    if *engine_id != ctx.engine_id {
        // A restarted prefill engine is a new engine: what the old one lent is gone.
        return Some(SideReply::refused(format!(
            "this is engine {}, not {engine_id}",
            ctx.engine_id
        )));
    }
    let op = match req {
        SideRequest::Handshake { .. } => {
            if ctx.fault == Some(NixlFault::HandshakeFailure) {
                return Some(SideReply::refused("handshake refused (injected fault)"));
            }
            return Some(SideReply {
                ok: true,
                engine_id: Some(ctx.engine_id.clone()),
                block_size: Some(ctx.block_size),
                ..SideReply::default()
            });
        }
        SideRequest::Read {
            request_id,
            block_ids,
            ..
        } => {
            match ctx.fault {
                Some(NixlFault::SlowRead) => tokio::time::sleep(ctx.fault_delay).await,
                Some(NixlFault::HungRead) => {
                    // Never answer; end when the decode engine gives up and hangs up.
                    let mut sink = [0u8; 64];
                    while matches!(stream.read(&mut sink).await, Ok(n) if n > 0) {}
                    return None;
                }
                _ => {}
            }
            LeaseOp::Read {
                request_id,
                block_ids,
            }
        }
        SideRequest::Done { request_id, .. } | SideRequest::Abort { request_id, .. } => {
            LeaseOp::Release { request_id }
        }
        SideRequest::Heartbeat { request_ids, .. } => LeaseOp::Renew { request_ids },
    };
    Some(match ctx.driver.lease(op).await {
        None => SideReply::refused("the engine is shutting down"),
        Some(LeaseReply::Read(Ok(()))) => SideReply::ok(),
        Some(LeaseReply::Read(Err(e))) => SideReply::refused(e),
        Some(LeaseReply::Released(true)) => SideReply::ok(),
        Some(LeaseReply::Released(false)) => {
            SideReply::refused("no KV blocks were held for that request (expired or unknown)")
        }
        Some(LeaseReply::Renewed(n)) => SideReply {
            ok: true,
            renewed: Some(n),
            ..SideReply::default()
        },
    })
}
