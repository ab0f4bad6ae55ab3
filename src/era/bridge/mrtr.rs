//! Multi-round-trip requests (2026-07-28) in text: the input a server asks for in an
//! `input_required` result, the `inputResponses` and `requestState` of a client's retry, and
//! a retry written for a server.

use super::*;

#[derive(Deserialize)]
struct Retry<'a> {
    #[serde(borrow)]
    params: Option<RetryParams<'a>>,
}

#[derive(Deserialize)]
struct RetryParams<'a> {
    #[serde(borrow, rename = "requestState")]
    request_state: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow, rename = "inputResponses")]
    input_responses: Option<HashMap<String, &'a RawValue>>,
}

/// A retry's `params.requestState`, when it names one.
pub fn request_state(request: &[u8]) -> Option<String> {
    static KEY: LazyLock<memchr::memmem::Finder<'static>> =
        LazyLock::new(|| memchr::memmem::Finder::new(b"requestState"));
    KEY.find(request)?;
    let retry: Retry<'_> = serde_json::from_slice(request).ok()?;
    retry
        .params?
        .request_state
        .map(std::borrow::Cow::into_owned)
}

/// A retry's `params.inputResponses`, by key (JSON text of each answer).
pub fn input_responses(request: &[u8]) -> HashMap<String, String> {
    serde_json::from_slice::<Retry<'_>>(request)
        .ok()
        .and_then(|r| r.params?.input_responses)
        .map(|map| {
            map.into_iter()
                .map(|(key, value)| (key, value.get().to_string()))
                .collect()
        })
        .unwrap_or_default()
}

/// What identifies a request across its MRTR rounds: its method and its params without what
/// a retry adds or changes (`_meta`, `inputResponses`, `requestState`).
pub fn call_digest(method: &str, request: &[u8]) -> [u8; 16] {
    #[derive(Deserialize)]
    struct Top {
        params: Option<serde_json::Value>,
    }
    let mut params = serde_json::from_slice::<Top>(request)
        .ok()
        .and_then(|t| t.params)
        .unwrap_or(serde_json::Value::Null);
    if let Some(map) = params.as_object_mut() {
        for key in ["_meta", "inputResponses", "requestState"] {
            map.remove(key);
        }
    }
    crate::wire::canonical::digest(&serde_json::json!({"method": method, "params": params}))
}

/// A server request's `params` (JSON text; `{}` when it has none).
pub fn params_of(message: &[u8]) -> String {
    message::params_of(message).unwrap_or("{}").to_string()
}

/// An `input_required` result carrying server requests (key, method, params JSON text),
/// and `state` as its `requestState`.
pub fn input_required(requests: &[(String, String, String)], state: &str) -> String {
    let members: Vec<String> = requests
        .iter()
        .map(|(key, method, params)| {
            format!(
                r#"{}:{{"method":{},"params":{params}}}"#,
                quote(key),
                quote(method)
            )
        })
        .collect();
    format!(
        r#"{{"resultType":"input_required","inputRequests":{{{}}},"requestState":{}}}"#,
        members.join(","),
        quote(state)
    )
}

/// One server request an `input_required` result carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputRequest {
    /// Its key in `inputRequests` (the key of its answer in `inputResponses`).
    pub key: String,
    pub method: String,
    /// Its params (JSON text).
    pub params: String,
}

/// What an `input_required` result asks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputRequired {
    pub requests: Vec<InputRequest>,
    /// Its `requestState`, echoed on the retry.
    pub state: Option<String>,
}

/// A map's members as (key, value) pairs, in order.
type Pairs<'de> = Vec<(String, &'de RawValue)>;

/// The server requests an `input_required` result carries, and its `requestState`.
pub fn input_requests(message: &[u8]) -> Option<InputRequired> {
    #[derive(Deserialize)]
    struct Top<'a> {
        #[serde(borrow)]
        result: Option<Inner<'a>>,
    }
    #[derive(Deserialize)]
    struct Inner<'a> {
        // A map, read as (key, value) pairs in the server's order.
        #[serde(borrow, rename = "inputRequests", default, deserialize_with = "pairs")]
        input_requests: Option<Pairs<'a>>,
        #[serde(rename = "requestState")]
        request_state: Option<String>,
    }
    #[derive(Deserialize)]
    struct Asked<'a> {
        method: String,
        #[serde(borrow)]
        params: Option<&'a RawValue>,
    }
    fn pairs<'de, D: serde::Deserializer<'de>>(de: D) -> Result<Option<Pairs<'de>>, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Pairs<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a map")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Self::Value, A::Error> {
                let mut out = Vec::new();
                while let Some(entry) = map.next_entry::<String, &'de RawValue>()? {
                    out.push(entry);
                }
                Ok(out)
            }
        }
        serde::Deserializer::deserialize_map(de, V).map(Some)
    }
    let top: Top<'_> = serde_json::from_slice(message).ok()?;
    let inner = top.result?;
    let mut out = Vec::new();
    for (key, raw) in inner.input_requests.unwrap_or_default() {
        let asked: Asked<'_> = serde_json::from_str(raw.get()).ok()?;
        let params = asked
            .params
            .map_or_else(|| "{}".to_string(), |p| p.get().to_string());
        out.push(InputRequest {
            key,
            method: asked.method,
            params,
        });
    }
    Some(InputRequired {
        requests: out,
        state: inner.request_state,
    })
}

/// A retry of `request` (JSON text of the request as it went upstream) under `id`, its
/// `params` given `inputResponses` (members: key → answer JSON) and `requestState`.
pub fn retry(
    request: &[u8],
    id: &Id,
    responses: &[(String, String)],
    state: Option<&str>,
) -> Option<Vec<u8>> {
    let with_id = message::with_id(request, id.raw())?;
    let params = message::params_of(&with_id)?;
    let mut members: Vec<String> = Vec::new();
    let answers: Vec<String> = responses
        .iter()
        .map(|(key, value)| format!("{}:{value}", quote(key)))
        .collect();
    members.push(format!("\"inputResponses\":{{{}}}", answers.join(",")));
    if let Some(state) = state {
        members.push(format!("\"requestState\":{}", quote(state)));
    }
    let new = prepend_members(params, &members.join(","))?;
    Some(message::splice(&with_id, params, new.as_bytes()))
}
