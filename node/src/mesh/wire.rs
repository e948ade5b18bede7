//! The framing of mesh streams: what the first bytes of every QUIC stream mean.
//!
//! Every stream starts with one [`StreamKind`] byte, so gossip and forwarded requests share
//! one endpoint and one connection per peer:
//! - [`StreamKind::Welcome`] (unidirectional, server → client, once per connection): the
//!   server has accepted the client's certificate. A client whose certificate is refused
//!   would otherwise only learn it at its first stream operation; waiting for the welcome
//!   makes every refusal an error of `connect`, bounded by the connect timeout.
//! - [`StreamKind::Gossip`] (unidirectional): one chitchat datagram, preceded by the
//!   sender's advertised mesh address (see [`GossipFrame`]), up to the end of the stream.
//! - [`StreamKind::Forward`] (bidirectional): a forwarded request; everything after the kind
//!   byte belongs to the forwarding layer.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// Largest chitchat datagram (chitchat's own UDP payload limit).
pub const MAX_GOSSIP_PAYLOAD: usize = 65_507;
/// Largest gossip stream: kind byte, address header, payload.
pub const MAX_GOSSIP_STREAM: usize = 1 + MAX_ADDR_LEN + MAX_GOSSIP_PAYLOAD;
const MAX_ADDR_LEN: usize = 1 + 16 + 2;

/// QUIC application error codes used when closing connections and refusing streams.
pub mod codes {
    use quinn::VarInt;
    /// Orderly shutdown of the endpoint.
    pub const SHUTDOWN: VarInt = VarInt::from_u32(0);
    /// The stream's kind byte is unknown, or the stream is of a kind not accepted here.
    pub const UNKNOWN_STREAM: VarInt = VarInt::from_u32(1);
    /// The stream's framing is invalid.
    pub const MALFORMED: VarInt = VarInt::from_u32(2);
    /// Nobody on this node accepts forwarded requests (or it is overloaded).
    pub const NOT_ACCEPTING: VarInt = VarInt::from_u32(3);
    /// Gossip declared the peer dead: its connection is closed rather than left to time out.
    pub const PEER_DEAD: VarInt = VarInt::from_u32(4);
    /// The peer's certificate is no longer accepted (revoked, expired, CA no longer trusted).
    pub const UNTRUSTED: VarInt = VarInt::from_u32(5);
}

/// The first byte of every mesh stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum StreamKind {
    Welcome = 0x57,
    Gossip = 0x47,
    Forward = 0x46,
}

impl StreamKind {
    pub fn from_byte(byte: u8) -> Option<Self> {
        match byte {
            0x57 => Some(Self::Welcome),
            0x47 => Some(Self::Gossip),
            0x46 => Some(Self::Forward),
            _ => None,
        }
    }
}

/// Why a gossip frame was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("gossip frame is truncated")]
    Truncated,
    #[error("unknown address family {0}")]
    BadFamily(u8),
    #[error("gossip frame carries an empty datagram")]
    Empty,
    #[error("gossip datagram of {0} bytes exceeds {MAX_GOSSIP_PAYLOAD}")]
    TooLarge(usize),
    #[error("gossip frame has address port 0 or an unspecified address")]
    BadAddress,
}

/// One gossip datagram as it travels on a [`StreamKind::Gossip`] stream (after the kind
/// byte): the sender's advertised mesh address, then the chitchat datagram.
///
/// The address is the sender's identity in chitchat's eyes (its gossip address), so the
/// receiver can hand the datagram to chitchat as coming from there and chitchat's replies go
/// back to the right peer, whatever source address the connection was seen from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GossipFrame<'a> {
    pub sender: SocketAddr,
    pub datagram: &'a [u8],
}

impl<'a> GossipFrame<'a> {
    /// Writes kind byte, address and datagram.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.push(StreamKind::Gossip as u8);
        match self.sender.ip() {
            IpAddr::V4(ip) => {
                out.push(4);
                out.extend_from_slice(&ip.octets());
            }
            IpAddr::V6(ip) => {
                out.push(6);
                out.extend_from_slice(&ip.octets());
            }
        }
        out.extend_from_slice(&self.sender.port().to_be_bytes());
        out.extend_from_slice(self.datagram);
    }

    /// Parses what follows the kind byte.
    pub fn decode(bytes: &'a [u8]) -> Result<Self, FrameError> {
        let (&family, rest) = bytes.split_first().ok_or(FrameError::Truncated)?;
        let (ip, rest) = match family {
            4 => {
                let (octets, rest) = split::<4>(rest)?;
                (IpAddr::V4(Ipv4Addr::from(octets)), rest)
            }
            6 => {
                let (octets, rest) = split::<16>(rest)?;
                (IpAddr::V6(Ipv6Addr::from(octets)), rest)
            }
            other => return Err(FrameError::BadFamily(other)),
        };
        let (port, datagram) = split::<2>(rest)?;
        let sender = SocketAddr::new(ip, u16::from_be_bytes(port));
        if sender.port() == 0 || ip.is_unspecified() {
            return Err(FrameError::BadAddress);
        }
        if datagram.is_empty() {
            return Err(FrameError::Empty);
        }
        if datagram.len() > MAX_GOSSIP_PAYLOAD {
            return Err(FrameError::TooLarge(datagram.len()));
        }
        Ok(Self { sender, datagram })
    }
}

fn split<const N: usize>(bytes: &[u8]) -> Result<([u8; N], &[u8]), FrameError> {
    let (head, rest) = bytes
        .split_first_chunk::<N>()
        .ok_or(FrameError::Truncated)?;
    Ok((*head, rest))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_round_trips_v4_and_v6() {
        for sender in ["10.1.2.3:7946", "[fd00::1]:7946"] {
            let frame = GossipFrame {
                sender: sender.parse().unwrap(),
                datagram: b"hello",
            };
            let mut bytes = Vec::new();
            frame.encode(&mut bytes);
            assert_eq!(StreamKind::from_byte(bytes[0]), Some(StreamKind::Gossip));
            assert_eq!(GossipFrame::decode(&bytes[1..]).unwrap(), frame);
        }
    }

    #[test]
    fn every_truncation_is_rejected() {
        let mut bytes = Vec::new();
        GossipFrame {
            sender: "[fd00::1]:7946".parse().unwrap(),
            datagram: b"x",
        }
        .encode(&mut bytes);
        for len in 1..bytes.len() {
            assert!(GossipFrame::decode(&bytes[1..len]).is_err(), "len {len}");
        }
    }

    #[test]
    fn bad_frames_are_rejected() {
        assert_eq!(
            GossipFrame::decode(&[9, 1, 2]),
            Err(FrameError::BadFamily(9))
        );
        assert_eq!(
            GossipFrame::decode(&[4, 0, 0, 0, 0, 0x1e, 0x0a, 1]),
            Err(FrameError::BadAddress)
        );
        assert_eq!(
            GossipFrame::decode(&[4, 1, 1, 1, 1, 0, 0, 1]),
            Err(FrameError::BadAddress)
        );
        let mut big = vec![4, 1, 1, 1, 1, 0x1e, 0x0a];
        big.resize(big.len() + MAX_GOSSIP_PAYLOAD + 1, 0);
        assert_eq!(
            GossipFrame::decode(&big),
            Err(FrameError::TooLarge(MAX_GOSSIP_PAYLOAD + 1))
        );
    }

    #[test]
    fn kinds_are_distinct_bytes() {
        for kind in [StreamKind::Welcome, StreamKind::Gossip, StreamKind::Forward] {
            assert_eq!(StreamKind::from_byte(kind as u8), Some(kind));
        }
        assert_eq!(StreamKind::from_byte(0), None);
    }
}
