//! `kv_transfer_params`: which leg a request is, and what a prefill leg answers.
//!
//! The shapes are vLLM's NixlConnector's (`request_finished` and
//! `get_num_new_matched_tokens`): a prefill leg carries `do_remote_decode: true`; its answer
//! carries `do_remote_prefill: true` and the coordinates of the leased blocks, which the proxy
//! copies verbatim into the decode leg.

use serde_json::{Value, json};

/// Where a decode leg's KV is: the prefill engine's answer, relayed by the proxy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteKv {
    /// The prefill engine's `engine_id`.
    pub engine_id: String,
    /// The prefill engine's internal id of the prefill leg.
    pub request_id: String,
    /// Host of the prefill engine's side channel.
    pub host: String,
    /// Port of the prefill engine's side channel.
    pub port: u16,
    /// The leased blocks, in prompt order.
    pub block_ids: Vec<u32>,
}

/// The disaggregation leg a request asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Leg {
    /// An ordinary request (no params, null params, or neither flag set).
    Whole,
    /// `do_remote_decode: true`: prefill, then lend the blocks.
    Prefill,
    /// `do_remote_prefill: true`: pull the KV, then decode.
    Decode(RemoteKv),
}

/// Reads the leg from a request's `kv_transfer_params` (already known to be an object or
/// null). Decode legs must name every coordinate of the blocks; a missing or mistyped field
/// is an error that names it.
pub fn parse(params: Option<&Value>) -> Result<Leg, String> {
    let Some(obj) = params.and_then(Value::as_object) else {
        return Ok(Leg::Whole);
    };
    let flag = |k: &str| obj.get(k).and_then(Value::as_bool).unwrap_or(false);
    match (flag("do_remote_decode"), flag("do_remote_prefill")) {
        (true, true) => Err("do_remote_decode and do_remote_prefill are exclusive".into()),
        (true, false) => Ok(Leg::Prefill),
        (false, false) => Ok(Leg::Whole),
        (false, true) => {
            let text = |k: &str| {
                obj.get(k)
                    .and_then(Value::as_str)
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned)
                    .ok_or_else(|| format!("do_remote_prefill needs a non-empty string {k}"))
            };
            let port = obj
                .get("remote_port")
                .and_then(Value::as_u64)
                .and_then(|p| u16::try_from(p).ok())
                .filter(|&p| p != 0)
                .ok_or("do_remote_prefill needs remote_port, a port number")?;
            Ok(Leg::Decode(RemoteKv {
                engine_id: text("remote_engine_id")?,
                request_id: text("remote_request_id")?,
                host: text("remote_host")?,
                port,
                block_ids: block_ids(obj.get("remote_block_ids"))?,
            }))
        }
    }
}

/// `remote_block_ids`: a list of block ids, or (vLLM builds with the hybrid allocator) a list
/// of one such list per KV-cache group, of which the mock has one.
fn block_ids(v: Option<&Value>) -> Result<Vec<u32>, String> {
    const WHAT: &str = "do_remote_prefill needs remote_block_ids, a non-empty list of block ids";
    let list = v.and_then(Value::as_array).ok_or(WHAT)?;
    let flat = match list.as_slice() {
        [Value::Array(group)] => group,
        [Value::Array(_), ..] => {
            return Err("remote_block_ids has several KV-cache groups; this engine has one".into());
        }
        _ => list,
    };
    let ids: Option<Vec<u32>> = flat
        .iter()
        .map(|b| b.as_u64().and_then(|b| u32::try_from(b).ok()))
        .collect();
    ids.filter(|ids| !ids.is_empty()).ok_or_else(|| WHAT.into())
}

/// What a prefill leg that finished by length answers, field for field as vLLM's
/// NixlConnector: `remote_request_id` is the engine's internal id of the leg (not the
/// client's `X-Request-Id`), `remote_host`/`remote_port` its side channel.
pub fn prefill_answer(
    engine_id: &str,
    internal_id: &str,
    side_channel: (&str, u16),
    block_ids: &[u32],
) -> Value {
    json!({
        "do_remote_prefill": true,
        "do_remote_decode": false,
        "remote_block_ids": block_ids,
        "remote_engine_id": engine_id,
        "remote_request_id": internal_id,
        "remote_host": side_channel.0,
        "remote_port": side_channel.1,
        "tp_size": 1,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_toy_proxy_prefill_leg_and_an_answer_round_trip() {
        let p = json!({"do_remote_decode": true, "do_remote_prefill": false,
            "remote_engine_id": null, "remote_block_ids": null, "remote_host": null,
            "remote_port": null});
        assert_eq!(parse(Some(&p)), Ok(Leg::Prefill));
        let answer = prefill_answer("e1", "cmpl-x-0-1a2b3c4d", ("127.0.0.1", 5600), &[7, 8]);
        let keys: Vec<&str> = answer
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(keys.len(), 8, "{keys:?}");
        assert_eq!(
            parse(Some(&answer)),
            Ok(Leg::Decode(RemoteKv {
                engine_id: "e1".into(),
                request_id: "cmpl-x-0-1a2b3c4d".into(),
                host: "127.0.0.1".into(),
                port: 5600,
                block_ids: vec![7, 8],
            }))
        );
    }

    #[test]
    fn grouped_block_ids_and_plain_requests() {
        let mut p = prefill_answer("e", "r", ("h", 1), &[1]);
        p["remote_block_ids"] = json!([[3, 4]]);
        assert!(matches!(parse(Some(&p)), Ok(Leg::Decode(r)) if r.block_ids == [3, 4]));
        assert_eq!(parse(None), Ok(Leg::Whole));
        assert_eq!(parse(Some(&Value::Null)), Ok(Leg::Whole));
        assert_eq!(parse(Some(&json!({}))), Ok(Leg::Whole));
    }

    #[test]
    fn a_bad_decode_leg_names_the_field() {
        let good = prefill_answer("e", "r", ("h", 1), &[1]);
        for (field, bad) in [
            ("remote_engine_id", json!(null)),
            ("remote_request_id", json!(5)),
            ("remote_host", json!("")),
            ("remote_port", json!(70_000)),
            ("remote_block_ids", json!([])),
            ("remote_block_ids", json!([[1], [2]])),
        ] {
            let mut p = good.clone();
            p[field] = bad;
            let e = parse(Some(&p)).unwrap_err();
            assert!(e.contains(field), "{field}: {e}");
        }
        let both = json!({"do_remote_decode": true, "do_remote_prefill": true});
        assert!(parse(Some(&both)).is_err());
    }
}
