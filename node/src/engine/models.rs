//! The engine's model cards: what its `/v1/models` says of each served name and adapter, as
//! vLLM reports it, gossiped under their own key (`gossip_keys::MODELS`; they change only when
//! an engine restarts or loads an adapter, unlike the load digest) so that every node's
//! `/v1/models` is the cluster's union in vLLM's shape.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// Bounds on what a peer may gossip: an engine serves a few names and adapters, with paths.
const MAX_CARDS: usize = 512;
const MAX_FIELD_BYTES: usize = 1024;

/// One entry of vLLM's `/v1/models`, with the fields a client reads.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelCard {
    pub id: String,
    /// The weights: the model path for a served name (every alias of one engine shares it),
    /// the adapter's path for a LoRA adapter.
    pub root: Option<String>,
    /// The base model of a LoRA adapter.
    pub parent: Option<String>,
    pub max_model_len: Option<u64>,
    /// Unix seconds. vLLM stamps every listing with the time it answers: the poller keeps the
    /// first listing's while [`same_cards`] says nothing else changed.
    pub created: u64,
    pub owned_by: String,
}

impl ModelCard {
    /// A card for `id` from a `/v1/models` entry; `None` without a string `id`.
    pub fn from_entry(entry: &Value) -> Option<Self> {
        let text = |field: &str| entry.get(field).and_then(Value::as_str).map(str::to_owned);
        Some(Self {
            id: text("id")?,
            root: text("root"),
            parent: text("parent"),
            max_model_len: entry.get("max_model_len").and_then(Value::as_u64),
            created: entry.get("created").and_then(Value::as_u64).unwrap_or(0),
            owned_by: text("owned_by").unwrap_or_else(|| "vllm".to_owned()),
        })
    }

    /// A LoRA adapter: its parent is another model.
    pub fn is_adapter(&self) -> bool {
        self.parent
            .as_deref()
            .is_some_and(|parent| parent != self.id)
    }

    /// The card as vLLM's `/v1/models` lists it.
    pub fn to_json(&self) -> Value {
        json!({
            "id": self.id,
            "object": "model",
            "created": self.created,
            "owned_by": self.owned_by,
            "root": self.root,
            "parent": self.parent,
            "max_model_len": self.max_model_len,
            "permission": [],
        })
    }

    fn within_bounds(&self) -> bool {
        [
            Some(&self.id),
            self.root.as_ref(),
            self.parent.as_ref(),
            Some(&self.owned_by),
        ]
        .into_iter()
        .flatten()
        .all(|field| field.len() <= MAX_FIELD_BYTES)
            && !self.id.is_empty()
    }
}

/// Cards as gossiped.
pub fn encode_cards(cards: &[ModelCard]) -> String {
    serde_json::to_string(cards).unwrap_or_else(|_| "[]".to_owned())
}

/// Cards a peer gossiped, validated: never trusted to be well-formed or small.
pub fn decode_cards(value: &str) -> Result<Vec<ModelCard>, String> {
    let cards: Vec<ModelCard> =
        serde_json::from_str(value).map_err(|e| format!("model cards: {e}"))?;
    if cards.len() > MAX_CARDS {
        return Err(format!(
            "{} model cards, more than {MAX_CARDS}",
            cards.len()
        ));
    }
    if let Some(bad) = cards.iter().find(|card| !card.within_bounds()) {
        return Err(format!(
            "model card with an empty or oversized field: {:?}",
            bad.id
        ));
    }
    Ok(cards)
}

/// `/v1/models` → its cards, in the engine's order.
pub fn parse_models(text: &str) -> Result<Vec<ModelCard>, String> {
    let value: Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
    let data = value
        .get("data")
        .and_then(|d| d.as_array())
        .ok_or("no `data` array")?;
    Ok(data.iter().filter_map(ModelCard::from_entry).collect())
}

/// The ids of the adapters among `cards` (`adapters`), or of the served model names.
pub fn ids(cards: &[ModelCard], adapters: bool) -> Vec<String> {
    cards
        .iter()
        .filter(|card| card.is_adapter() == adapters)
        .map(|card| card.id.clone())
        .collect()
}

/// Whether two listings describe the same models: the same cards in the same order, their
/// `created` aside (vLLM's is the time of each listing).
pub fn same_cards(a: &[ModelCard], b: &[ModelCard]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(a, b)| {
            ModelCard {
                created: b.created,
                ..a.clone()
            } == *b
        })
}

/// The cluster's `/v1/models`: every name once, in name order, each as the first of `cards`
/// with its id describes it. A name of `names` no card describes (its node has not gossiped
/// its cards yet) gets a card with the name alone.
pub fn union<'a>(
    cards: impl Iterator<Item = &'a ModelCard>,
    names: impl Iterator<Item = &'a str>,
) -> Vec<Value> {
    let mut by_id: std::collections::BTreeMap<&str, Value> = std::collections::BTreeMap::new();
    for card in cards {
        by_id
            .entry(card.id.as_str())
            .or_insert_with(|| card.to_json());
    }
    for name in names {
        by_id.entry(name).or_insert_with(|| {
            json!({"id": name, "object": "model", "created": 0, "owned_by": "vllm",
                "root": null, "parent": null, "max_model_len": null, "permission": []})
        });
    }
    by_id.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const VLLM: &str = r#"{"object":"list","data":[
        {"id":"llama","object":"model","created":1790000000,"owned_by":"vllm",
         "root":"/models/llama-3.1-8b","parent":null,"max_model_len":8192,"permission":[]},
        {"id":"llama-8b","object":"model","created":1790000000,"owned_by":"vllm",
         "root":"/models/llama-3.1-8b","parent":null,"max_model_len":8192,"permission":[]},
        {"id":"sql-lora","object":"model","created":1790000001,"owned_by":"vllm",
         "root":"/adapters/sql","parent":"llama","max_model_len":null,"permission":[]},
        {"object":"model"}]}"#;

    #[test]
    fn vllms_cards_are_read_with_their_fields_and_adapters_told_apart() {
        let cards = parse_models(VLLM).unwrap();
        assert_eq!(cards.len(), 3, "an entry without an id is skipped");
        assert_eq!(cards[0].root.as_deref(), Some("/models/llama-3.1-8b"));
        assert_eq!(cards[0].max_model_len, Some(8192));
        assert!(!cards[0].is_adapter() && cards[2].is_adapter());
        assert_eq!(ids(&cards, false), ["llama", "llama-8b"]);
        assert_eq!(ids(&cards, true), ["sql-lora"]);
        assert_eq!(cards[2].to_json()["parent"], "llama");
        assert!(parse_models("{}").is_err());
    }

    #[test]
    fn gossiped_cards_round_trip_and_bad_ones_are_refused() {
        let cards = parse_models(VLLM).unwrap();
        assert_eq!(decode_cards(&encode_cards(&cards)).unwrap(), cards);
        assert!(decode_cards("not json").is_err());
        let mut huge = cards[0].clone();
        huge.root = Some("x".repeat(MAX_FIELD_BYTES + 1));
        assert!(decode_cards(&encode_cards(&[huge])).is_err());
        let many = vec![cards[0].clone(); MAX_CARDS + 1];
        assert!(decode_cards(&encode_cards(&many)).is_err());
    }

    #[test]
    fn listings_that_differ_in_their_time_alone_are_the_same() {
        let before = parse_models(VLLM).unwrap();
        let mut relisted = before.clone();
        for card in &mut relisted {
            card.created += 20;
        }
        assert!(same_cards(&before, &relisted));
        let mut unloaded = relisted.clone();
        unloaded.pop();
        assert!(!same_cards(&before, &unloaded));
        let mut moved = relisted;
        moved[2].root = Some("/adapters/sql-v2".to_owned());
        assert!(!same_cards(&before, &moved));
    }

    #[test]
    fn the_union_lists_every_name_once_in_order_as_its_first_node_says() {
        let ours = parse_models(VLLM).unwrap();
        let mut theirs = ours[0].clone();
        theirs.max_model_len = Some(4096);
        let listed = union(
            ours.iter().chain([&theirs]),
            ["llama", "mistral"].into_iter(),
        );
        let ids: Vec<&str> = listed.iter().filter_map(|c| c["id"].as_str()).collect();
        assert_eq!(ids, ["llama", "llama-8b", "mistral", "sql-lora"]);
        assert_eq!(listed[0]["max_model_len"], 8192);
        assert_eq!(listed[2]["created"], 0);
    }
}
