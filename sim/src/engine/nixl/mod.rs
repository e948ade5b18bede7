//! `--kv-connector nixl`: the mock's side of vLLM's NixlConnector protocol.
//!
//! A proxy sends a request to a prefill engine with `kv_transfer_params.do_remote_decode`;
//! that engine prefills, answers with `kv_transfer_params` naming its leased blocks
//! ([`params`]) and keeps them under a lease (the engine model's `lease`). The proxy sends the
//! request to a decode engine with those params; the decode engine allocates blocks, then
//! really contacts the prefill engine over a side channel ([`wire`], served by
//! [`side_channel`]) to handshake ([`handshake`]), read the blocks and report the read, while
//! heartbeating the lease ([`heartbeat`]); [`puller`] runs that. The data is not moved: the
//! transfer time is modelled (bytes over bandwidth), the exchanges and their failures are
//! real, so a dead prefill engine or an expired lease really fails the pull. [`stats`] keeps
//! vLLM's `vllm:nixl_*` figures.

pub mod handshake;
pub mod heartbeat;
pub mod params;
pub mod puller;
pub mod side_channel;
pub mod stats;
pub mod wire;
