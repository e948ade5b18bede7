//! Writing `uuid`s into a chat body's raw bytes instead of encoding the parsed body again.
//!
//! A structural scan of the JSON (strings skipped with their escapes, nesting followed) finds
//! where each content part of each message closes, enumerating the parts exactly as
//! `serde_json::Value` does (a duplicated key: the last one counts), and `,"uuid":"…"` is
//! inserted before the closing brace of each part that got one. Anything unexpected (a shape
//! other than the parse's, an empty object, nesting deeper than serde_json allows) answers
//! `None`, and the caller encodes the parsed body instead.

use memchr::memchr2;

/// `raw` with `"uuid": uuid` added to content part `ordinal` for each `(ordinal, uuid)`, in
/// increasing ordinal; `None` when the scan does not find those parts as objects.
pub fn insert_uuids(raw: &[u8], added: &[(usize, String)]) -> Option<Vec<u8>> {
    let parts = content_parts(raw)?;
    let extra: usize = added.iter().map(|(_, uuid)| uuid.len() + 10).sum();
    let mut out = Vec::with_capacity(raw.len() + extra);
    let mut copied = 0;
    for (ordinal, uuid) in added {
        let part = (*parts.get(*ordinal)?)?;
        if part.close < copied || uuid.contains(['"', '\\']) {
            return None;
        }
        out.extend_from_slice(&raw[copied..part.close]);
        out.extend_from_slice(b",\"uuid\":\"");
        out.extend_from_slice(uuid.as_bytes());
        out.push(b'"');
        copied = part.close;
    }
    out.extend_from_slice(&raw[copied..]);
    Some(out)
}

/// A content part that is a non-empty object: where its closing brace is.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
struct ObjectPart {
    close: usize,
}

/// Every content part of every message, in order: `Some` for a non-empty object, `None` for
/// anything else.
fn content_parts(raw: &[u8]) -> Option<Vec<Option<ObjectPart>>> {
    let mut scan = Scanner {
        bytes: raw,
        at: 0,
        depth: 0,
    };
    let mut messages = Vec::new();
    scan.object(|key, scan| match key {
        b"messages" if scan.peek() == Some(b'[') => {
            messages.clear();
            scan.array(|scan| {
                let mut parts = Vec::new();
                if scan.peek() == Some(b'{') {
                    scan.object(|key, scan| match key {
                        b"content" if scan.peek() == Some(b'[') => {
                            parts.clear();
                            scan.array(|scan| {
                                parts.push(scan.part()?);
                                Some(())
                            })
                        }
                        b"content" => {
                            parts.clear();
                            scan.value()
                        }
                        _ => scan.value(),
                    })?;
                } else {
                    scan.value()?;
                }
                messages.push(parts);
                Some(())
            })
        }
        b"messages" => {
            messages.clear();
            scan.value()
        }
        _ => scan.value(),
    })?;
    scan.space();
    (scan.at == raw.len()).then(|| messages.into_iter().flatten().collect())
}

/// serde_json's own recursion limit: a body it parsed never nests deeper.
const MAX_DEPTH: usize = 128;

struct Scanner<'a> {
    bytes: &'a [u8],
    at: usize,
    depth: usize,
}

impl Scanner<'_> {
    fn space(&mut self) {
        while matches!(self.bytes.get(self.at), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.at += 1;
        }
    }

    fn peek(&mut self) -> Option<u8> {
        self.space();
        self.bytes.get(self.at).copied()
    }

    fn eat(&mut self, byte: u8) -> Option<()> {
        (self.peek()? == byte).then(|| self.at += 1)
    }

    /// A string's raw contents (escapes left as they are).
    fn string(&mut self) -> Option<&[u8]> {
        self.eat(b'"')?;
        let start = self.at;
        loop {
            self.at += memchr2(b'"', b'\\', self.bytes.get(self.at..)?)?;
            if self.bytes[self.at] == b'\\' {
                self.at += 2;
                continue;
            }
            self.at += 1;
            return self.bytes.get(start..self.at - 1);
        }
    }

    /// `{ key: value, … }`, calling `member` with the scanner on each value.
    fn object(&mut self, mut member: impl FnMut(&[u8], &mut Self) -> Option<()>) -> Option<()> {
        self.enter()?;
        self.eat(b'{')?;
        if self.peek()? == b'}' {
            self.at += 1;
            self.depth -= 1;
            return Some(());
        }
        loop {
            let key = self.string()?.to_vec();
            self.eat(b':')?;
            member(&key, self)?;
            match self.peek()? {
                b',' => self.at += 1,
                b'}' => {
                    self.at += 1;
                    self.depth -= 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    /// `[ value, … ]`, calling `element` with the scanner on each element.
    fn array(&mut self, mut element: impl FnMut(&mut Self) -> Option<()>) -> Option<()> {
        self.enter()?;
        self.eat(b'[')?;
        if self.peek()? == b']' {
            self.at += 1;
            self.depth -= 1;
            return Some(());
        }
        loop {
            element(self)?;
            match self.peek()? {
                b',' => self.at += 1,
                b']' => {
                    self.at += 1;
                    self.depth -= 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    fn enter(&mut self) -> Option<()> {
        self.depth += 1;
        (self.depth <= MAX_DEPTH).then_some(())
    }

    /// Skips any value.
    fn value(&mut self) -> Option<()> {
        match self.peek()? {
            b'"' => self.string().map(drop),
            b'{' => self.object(|_, scan| scan.value()),
            b'[' => self.array(Self::value),
            _ => {
                let start = self.at;
                while !matches!(
                    self.bytes.get(self.at),
                    None | Some(b',' | b']' | b'}' | b' ' | b'\t' | b'\n' | b'\r')
                ) {
                    self.at += 1;
                }
                (self.at > start).then_some(())
            }
        }
    }

    /// A content part: an object (whose closing brace is kept when it has members) or
    /// anything else.
    fn part(&mut self) -> Option<Option<ObjectPart>> {
        if self.peek()? != b'{' {
            self.value()?;
            return Some(None);
        }
        let mut members = 0;
        self.object(|_, scan| {
            members += 1;
            scan.value()
        })?;
        Some((members > 0).then_some(ObjectPart { close: self.at - 1 }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    #[test]
    fn uuids_land_in_their_parts_whatever_the_layout() {
        let raw = br#" { "model" : "m", "messages": [
            {"role": "system", "content": "be \"brief\" \\"},
            {"role": "user", "content": [ {"type":"text","text":"a } ] \" tricky"} ,
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}} ] },
            {"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "QUJD"}}]}
        ], "stream": false } "#;
        let out = insert_uuids(raw, &[(1, "u1".into()), (2, "u2".into())]).unwrap();
        let parsed: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(parsed["messages"][1]["content"][1]["uuid"], "u1");
        assert_eq!(parsed["messages"][2]["content"][0]["uuid"], "u2");
        assert!(parsed["messages"][1]["content"][0].get("uuid").is_none());
        let mut expected: Value = serde_json::from_slice(raw).unwrap();
        expected["messages"][1]["content"][1]["uuid"] = json!("u1");
        expected["messages"][2]["content"][0]["uuid"] = json!("u2");
        assert_eq!(parsed, expected);
    }

    #[test]
    fn duplicate_keys_count_as_serde_json_counts_them() {
        let raw = br#"{"messages": [{"content": [{"a": 1}], "content": [{"b": 1}, {"c": 1}]}]}"#;
        let out = insert_uuids(raw, &[(1, "u".into())]).unwrap();
        let parsed: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(parsed["messages"][0]["content"][1]["uuid"], "u");
    }

    #[test]
    fn what_the_scan_cannot_place_is_refused() {
        let body = br#"{"messages": [{"content": [{}, 3, {"a": 1}]}]}"#;
        assert_eq!(
            insert_uuids(body, &[(0, "u".into())]),
            None,
            "an empty object"
        );
        assert_eq!(
            insert_uuids(body, &[(1, "u".into())]),
            None,
            "not an object"
        );
        assert_eq!(insert_uuids(body, &[(3, "u".into())]), None, "no such part");
        assert!(insert_uuids(body, &[(2, "u".into())]).is_some());
        assert_eq!(insert_uuids(b"{\"messages\": [", &[(0, "u".into())]), None);
        assert_eq!(insert_uuids(br#"{"a": 1} x"#, &[]), None, "trailing bytes");
        let deep = format!("{{\"x\": {}{}}}", "[".repeat(200), "]".repeat(200));
        assert_eq!(insert_uuids(deep.as_bytes(), &[]), None);
    }
}
