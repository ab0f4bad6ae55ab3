//! Replaying a recording: the recorded server, answering from the file.
//!
//! Each request is answered with the recorded response to the same method and params (ids
//! rewritten to the caller's; `_meta` and so progress tokens do not count in the match), after
//! the server messages that came between that request and its response in the recording
//! (progress re-addressed to the caller's progress token). Repeated identical requests get the
//! recorded responses in order, then the last again. An unrecorded request gets an error that
//! names the closest recorded one. It is an upstream like any other, so it works behind stdio,
//! behind `--listen`, and behind a policy.

use std::collections::HashMap;
use std::sync::Mutex;

use serde_json::{Map, Value, json};

use crate::recording::{Exchange, Recording};
use crate::wire::{canonical, jsonrpc};

/// The params a request is matched by: `_meta` removed, keys canonical.
fn match_key(method: &str, params: Option<&Value>) -> String {
    let mut params = params.cloned().unwrap_or(Value::Null);
    if let Value::Object(map) = &mut params {
        map.remove("_meta");
    }
    if method == "initialize" {
        params = Value::Null; // client name and version differ from run to run
    }
    let digest = canonical::digest(&json!([method, params]));
    canonical::hex(&digest)
}

/// A request's params without `_meta` (progress tokens and the like differ from run to run).
fn params_without_meta(request: &Value) -> Value {
    let mut params = request.get("params").cloned().unwrap_or(Value::Null);
    if let Value::Object(map) = &mut params {
        map.remove("_meta");
    }
    params
}

/// Key=value pairs of a value, for closeness.
fn flatten(prefix: &str, value: &Value, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                flatten(&format!("{prefix}.{k}"), v, out);
            }
        }
        other => out.push(format!("{prefix}={other}")),
    }
}

/// Serves requests from a recording.
#[derive(Debug)]
pub struct Replayer {
    by_key: HashMap<String, Vec<Exchange>>,
    served: Mutex<HashMap<String, usize>>,
    all: Vec<Exchange>,
}

impl Replayer {
    pub fn new(recording: &Recording) -> Replayer {
        let all: Vec<Exchange> = recording
            .exchanges()
            .into_iter()
            .filter(|e| e.response.is_some())
            .collect();
        let mut by_key: HashMap<String, Vec<Exchange>> = HashMap::new();
        for exchange in &all {
            let key = match_key(&exchange.method, exchange.upstream_request.get("params"));
            by_key.entry(key).or_default().push(exchange.clone());
        }
        Replayer {
            by_key,
            served: Mutex::new(HashMap::new()),
            all,
        }
    }

    /// The messages answering one client message (none for notifications and responses).
    pub fn answer(&self, request: &Value) -> Vec<Value> {
        let (Some(method), Some(id)) = (
            request.get("method").and_then(Value::as_str),
            request.get("id"),
        ) else {
            return Vec::new();
        };
        let params = request.get("params");
        let key = match_key(method, params);
        let Some(candidates) = self.by_key.get(&key) else {
            let message = format!(
                "no recorded response for {method} {}; {}",
                compact(params),
                self.closest(method, params)
            );
            return vec![
                json!({"jsonrpc": "2.0", "id": id, "error": {"code": jsonrpc::METHOD_NOT_FOUND, "message": message}}),
            ];
        };
        let index = {
            let mut served = self
                .served
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let n = served.entry(key).or_insert(0);
            let index = (*n).min(candidates.len() - 1);
            *n += 1;
            index
        };
        let exchange = &candidates[index];
        let token = params
            .and_then(|p| p.get("_meta"))
            .and_then(|m| m.get("progressToken"))
            .cloned();
        let mut out: Vec<Value> = exchange
            .before
            .iter()
            .filter(|m| m.get("id").is_none()) // server requests would wait for answers nobody recorded
            .map(|m| {
                let mut m = m.clone();
                if let (Some(token), Some(p)) =
                    (&token, m.get_mut("params").and_then(Value::as_object_mut))
                    && p.contains_key("progressToken")
                {
                    p.insert("progressToken".into(), token.clone());
                }
                m
            })
            .collect();
        if let Some(mut response) = exchange.response.clone() {
            response["id"] = id.clone();
            out.push(response);
        }
        out
    }

    fn closest(&self, method: &str, params: Option<&Value>) -> String {
        let mut wanted = Vec::new();
        flatten("", params.unwrap_or(&Value::Null), &mut wanted);
        let best = self
            .all
            .iter()
            .map(|e| {
                let mut have = Vec::new();
                flatten("", &params_without_meta(&e.upstream_request), &mut have);
                let common = have.iter().filter(|h| wanted.contains(h)).count();
                ((usize::from(e.method == method), common), e)
            })
            .max_by_key(|(score, _)| *score);
        match best {
            Some((_, e)) => format!(
                "the closest recorded request is {} {}",
                e.method,
                compact(Some(&params_without_meta(&e.upstream_request)))
            ),
            None => "the recording has no requests".to_string(),
        }
    }
}

fn compact(params: Option<&Value>) -> String {
    let mut params = params.cloned().unwrap_or_else(|| Value::Object(Map::new()));
    if let Value::Object(map) = &mut params {
        map.remove("_meta");
    }
    let text = params.to_string();
    if text.len() > 300 {
        format!("{}…", text.chars().take(300).collect::<String>())
    } else {
        text
    }
}
