//! A canonical JSON rendering (object keys sorted, no insignificant whitespace) so that tool
//! definitions and tool calls hash the same whatever key order a client library emits, and
//! whatever serde_json features other crates in the build turn on.

use serde_json::Value;
use std::fmt::Write as _;

pub fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => {
            let _ = write!(out, "{n}");
        }
        Value::String(s) => write_string(s, out),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(key, out);
                out.push(':');
                write_canonical(&map[key], out);
            }
            out.push('}');
        }
    }
}

fn write_string(s: &str, out: &mut String) {
    // serde_json's string escaping is canonical (it depends only on the string).
    out.push_str(&Value::String(s.to_owned()).to_string());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_order_does_not_matter() {
        let a: Value = serde_json::from_str(r#"{"b":1,"a":{"y":[1,"x"],"x":null}}"#).unwrap();
        let b: Value = serde_json::from_str(r#"{"a":{"x":null,"y":[1,"x"]},"b":1}"#).unwrap();
        let (mut sa, mut sb) = (String::new(), String::new());
        write_canonical(&a, &mut sa);
        write_canonical(&b, &mut sb);
        assert_eq!(sa, sb);
        assert_eq!(sa, r#"{"a":{"x":null,"y":[1,"x"]},"b":1}"#);
    }

    /// Found by the `request_hash` fuzz target: serde_json's default float parser is not
    /// correctly rounded, so one number written two ways rendered two ways, and a body that a
    /// client re-serialized hashed differently. The crate's `float_roundtrip` parser is exact.
    #[test]
    fn a_number_renders_the_same_however_it_is_written() {
        let render = |json: &str| {
            let mut out = String::new();
            write_canonical(&serde_json::from_str(json).unwrap(), &mut out);
            out
        };
        for (a, b) in [
            ("38e293", "3.8e294"),
            ("9007199254740993.0", "9007199254740992.0"),
            ("2.2250738585072011e-308", "2.225073858507201e-308"),
        ] {
            assert_eq!(render(a), render(b), "{a} and {b}");
            assert_eq!(render(&render(a)), render(a), "{a} re-rendered");
        }
    }
}
