//! The decode side's handshakes: one per prefill engine, on first contact, shared by every
//! request that needs it (vLLM's NixlConnector keys its remote agents by engine id).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use super::params::RemoteKv;
use super::wire::{self, SideRequest};

/// Bound on a handshake's exchange (the modelled cost comes on top).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The prefill engines this decode engine has shaken hands with.
#[derive(Default)]
pub struct Handshakes {
    /// Per engine id: whether the handshake is done. The async lock makes concurrent first
    /// contacts wait for one handshake instead of each doing their own.
    peers: Mutex<HashMap<String, Arc<tokio::sync::Mutex<bool>>>>,
}

impl Handshakes {
    /// Makes sure this engine has shaken hands with `remote`'s engine, doing it (and paying
    /// `cost`) on first contact. A failed handshake is tried again by the next request.
    pub async fn ensure(
        &self,
        remote: &RemoteKv,
        block_size: u32,
        cost: Duration,
    ) -> Result<(), String> {
        let peer = self
            .peers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(remote.engine_id.clone())
            .or_default()
            .clone();
        let mut done = peer.lock().await;
        if *done {
            return Ok(());
        }
        let req = SideRequest::Handshake {
            engine_id: remote.engine_id.clone(),
        };
        let reply = wire::exchange(&remote.host, remote.port, &req, Some(HANDSHAKE_TIMEOUT))
            .await
            .map_err(|e| format!("handshake failed: {e}"))?;
        if reply.engine_id.as_deref() != Some(remote.engine_id.as_str()) {
            return Err(format!(
                "handshake failed: expected engine {}, reached {:?}",
                remote.engine_id, reply.engine_id
            ));
        }
        if reply.block_size != Some(block_size) {
            return Err(format!(
                "handshake failed: incompatible block size {:?} (this engine's is {block_size})",
                reply.block_size
            ));
        }
        tokio::time::sleep(cost).await;
        *done = true;
        Ok(())
    }

    /// Whether this engine has shaken hands with `engine_id`.
    pub fn is_done(&self, engine_id: &str) -> bool {
        let peers = self.peers.lock().unwrap_or_else(PoisonError::into_inner);
        peers
            .get(engine_id)
            .and_then(|p| p.try_lock().ok().map(|d| *d))
            .unwrap_or(false)
    }
}
