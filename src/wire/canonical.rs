//! Canonical JSON text (object keys sorted) and its digest: a key for a JSON value that does
//! not depend on the order its keys were written in. Cursors digest their selection with it,
//! and replay matches recorded requests by it.

use serde_json::Value;
use sha2::{Digest, Sha256};

/// The first 16 bytes of the SHA-256 of `value`'s canonical text.
pub fn digest(value: &Value) -> [u8; 16] {
    let mut canonical = String::new();
    write_canonical(value, &mut canonical);
    let full = Sha256::digest(canonical.as_bytes());
    let mut out = [0u8; 16];
    out.copy_from_slice(&full[..16]);
    out
}

/// Lower-case hex of some bytes.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            out.push('{');
            for (k, (key, value)) in entries.into_iter().enumerate() {
                if k > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(key.clone()).to_string());
                out.push(':');
                write_canonical(value, out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (k, item) in items.iter().enumerate() {
                if k > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}
