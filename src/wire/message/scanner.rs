//! A streaming scan of a message's top-level `id` and `method`, for a message too large or too
//! deep to read whole (its refusal is answered under its id).

use super::Id;

/// A streaming reader of a JSON object's top-level `id` and `method`, fed any number of chunks.
///
/// It tracks nesting and strings only; it does not validate JSON. Values it captures are capped
/// in length, so feeding it a gigabyte costs no memory.
#[derive(Default)]
pub struct EnvelopeScanner {
    depth: u32,
    in_string: bool,
    escaped: bool,
    expecting_key: bool,
    reading_key: bool,
    key: Vec<u8>,
    /// The top-level key whose value comes after the next `:`.
    pending: Option<Field>,
    /// The value being captured, with the field it belongs to.
    capture: Option<(Field, Vec<u8>)>,
    id: Option<Vec<u8>>,
    method: Option<Vec<u8>>,
}

#[derive(Clone, Copy)]
enum Field {
    Id,
    Method,
}

const MAX_CAPTURE: usize = 512;

impl EnvelopeScanner {
    pub fn feed(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.step(b);
        }
    }

    fn push(&mut self, b: u8) {
        if self.reading_key {
            if self.key.len() < 16 {
                self.key.push(b);
            }
        } else if let Some((_, value)) = &mut self.capture
            && value.len() < MAX_CAPTURE
        {
            value.push(b);
        }
    }

    fn end_value(&mut self) {
        if let Some((field, value)) = self.capture.take() {
            let slot = match field {
                Field::Id => &mut self.id,
                Field::Method => &mut self.method,
            };
            slot.get_or_insert(value);
        }
    }

    fn step(&mut self, b: u8) {
        if self.in_string {
            if self.escaped {
                self.escaped = false;
                self.push(b);
            } else if b == b'\\' {
                self.escaped = true;
                self.push(b);
            } else if b == b'"' {
                self.in_string = false;
                if self.reading_key {
                    self.reading_key = false;
                    self.pending = match self.key.as_slice() {
                        b"id" => Some(Field::Id),
                        b"method" => Some(Field::Method),
                        _ => None,
                    };
                } else {
                    self.push(b);
                }
            } else {
                self.push(b);
            }
            return;
        }
        match b {
            b'"' => {
                self.in_string = true;
                if self.depth == 1 && self.expecting_key {
                    self.expecting_key = false;
                    self.reading_key = true;
                    self.key.clear();
                } else {
                    self.push(b);
                }
            }
            b'{' | b'[' => {
                self.depth += 1;
                if self.depth == 1 {
                    self.expecting_key = b == b'{';
                } else {
                    self.push(b);
                }
            }
            b'}' | b']' => {
                if self.depth == 1 {
                    self.end_value();
                } else {
                    self.push(b);
                }
                self.depth = self.depth.saturating_sub(1);
            }
            b',' if self.depth == 1 => {
                self.end_value();
                self.expecting_key = true;
            }
            b':' if self.depth == 1 => {
                if let Some(field) = self.pending.take() {
                    self.capture = Some((field, Vec::new()));
                }
            }
            b' ' | b'\t' | b'\r' | b'\n' => {}
            _ => self.push(b),
        }
    }

    /// The `id` (if it was a string or number) and `method` (if it was a string) seen so far.
    pub fn finish(mut self) -> (Option<Id>, Option<String>) {
        self.end_value();
        let id = self
            .id
            .and_then(|raw| String::from_utf8(raw).ok())
            .and_then(|text| Id::parse(&text));
        let method = self
            .method
            .and_then(|raw| String::from_utf8(raw).ok())
            .and_then(|text| serde_json::from_str::<String>(&text).ok());
        (id, method)
    }
}
