//! `subscriptions/listen` for modern clients in front of a legacy server (the era bridge).
//!
//! MCP 2026-07-28 replaced `resources/subscribe` and the GET stream with one long request,
//! `subscriptions/listen`, whose filter names what the client wants; every notification on it
//! carries `_meta["io.modelcontextprotocol/subscriptionId"]` (the request's id), and the
//! server MUST NOT send a kind the client did not ask for. A legacy server knows none of this:
//! it sends its list changes to whoever holds its session, and its resource updates for the
//! URIs someone subscribed to. So the proxy serves the listen itself: it acknowledges the part
//! of the filter the server's `InitializeResult` can honor, subscribes upstream to each URI
//! once however many listens name it (reference counts, unsubscribed when the last one ends),
//! and gives each of the server's notifications to every listen that asked for it, tagged
//! with that listen's id.
//!
//! The other way round, a legacy client in front of a modern server: the client gets list
//! changes unasked and subscribes with `resources/subscribe`, which the modern server no longer
//! has. So the proxy holds one listen at the server for the client's session, asking for every
//! list change the server's `DiscoverResult` offers and for the URIs the client subscribed to;
//! when those change, a new listen replaces the old one, which is cancelled once the new one is
//! acknowledged (no update is lost in between, none comes twice).
//!
//! Here are the filters, the table of open listens and the text the proxy writes; the relay
//! ([`crate::relay`]) owns the table and routes the messages. No I/O here.

use std::collections::HashMap;

use serde::Deserialize;
use serde_json::value::RawValue;

use crate::wire::message::{self, Id};

/// At most this many listens are open in one session.
pub const MAX_LISTENS: usize = 64;
/// At most this many URIs in one listen's `resourceSubscriptions`.
pub const MAX_URIS: usize = 256;
/// A URI is at most this long.
pub const MAX_URI_BYTES: usize = 8 * 1024;
/// The URIs of one session's listens (or one legacy client's subscriptions) hold at most this
/// many bytes in all.
pub const MAX_SESSION_URI_BYTES: usize = 1024 * 1024;
/// One server notification is copied to the listens that asked for it up to this many bytes
/// in all (a larger fan-out is cut, and the cut logged).
pub const MAX_FANOUT_BYTES: usize = 16 * 1024 * 1024;

/// The notification kinds a listen asks for (or is granted).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    pub tools: bool,
    pub prompts: bool,
    pub resources: bool,
    /// `resourceSubscriptions`, without repeats, in the client's order.
    pub uris: Vec<String>,
}

/// Why a listen's filter is refused (the client's fix is in the message).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error(
        "Invalid params: params.notifications must be an object (toolsListChanged, promptsListChanged, resourcesListChanged: booleans; resourceSubscriptions: a list of URI strings)"
    )]
    NotAnObject,
    #[error("Invalid params: params.notifications.{0} must be a boolean")]
    NotABoolean(&'static str),
    #[error(
        "Invalid params: params.notifications.resourceSubscriptions must be a list of URI strings"
    )]
    NotUris,
    #[error(
        "Invalid params: params.notifications.resourceSubscriptions names more than {MAX_URIS} URIs (or one longer than {MAX_URI_BYTES} bytes); split them over several subscriptions/listen requests"
    )]
    TooManyUris,
    #[error(
        "mcp-budget holds at most {MAX_LISTENS} subscriptions/listen open per session, naming at most {MAX_SESSION_URI_BYTES} bytes of URIs in all; cancel one (notifications/cancelled) before opening another"
    )]
    TooManyListens,
}

impl Filter {
    /// The filter a `subscriptions/listen` request asks for (`params.notifications`; absent:
    /// nothing). Members the proxy does not know are not granted (a legacy server has none).
    pub fn requested(request: &[u8]) -> Result<Filter, Refused> {
        #[derive(Deserialize)]
        struct Params<'a> {
            #[serde(borrow)]
            notifications: Option<&'a RawValue>,
        }
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Asked {
            tools_list_changed: Option<serde_json::Value>,
            prompts_list_changed: Option<serde_json::Value>,
            resources_list_changed: Option<serde_json::Value>,
            resource_subscriptions: Option<serde_json::Value>,
        }
        // (The envelope reader read the message already: no `params` means none were asked.)
        let Some(params) = message::params_of(request) else {
            return Ok(Filter::default());
        };
        let params: Params<'_> = serde_json::from_str(params).map_err(|_| Refused::NotAnObject)?;
        let Some(asked) = params.notifications else {
            return Ok(Filter::default());
        };
        let asked: Asked = serde_json::from_str(asked.get()).map_err(|_| Refused::NotAnObject)?;
        let flag = |value: Option<serde_json::Value>, name: &'static str| match value {
            None | Some(serde_json::Value::Null) => Ok(false),
            Some(serde_json::Value::Bool(b)) => Ok(b),
            Some(_) => Err(Refused::NotABoolean(name)),
        };
        let mut uris: Vec<String> = Vec::new();
        match asked.resource_subscriptions {
            None | Some(serde_json::Value::Null) => {}
            Some(serde_json::Value::Array(items)) => {
                if items.len() > MAX_URIS {
                    return Err(Refused::TooManyUris);
                }
                for item in items {
                    let serde_json::Value::String(uri) = item else {
                        return Err(Refused::NotUris);
                    };
                    if uri.len() > MAX_URI_BYTES {
                        return Err(Refused::TooManyUris);
                    }
                    if !uris.contains(&uri) {
                        uris.push(uri);
                    }
                }
            }
            Some(_) => return Err(Refused::NotUris),
        }
        Ok(Filter {
            tools: flag(asked.tools_list_changed, "toolsListChanged")?,
            prompts: flag(asked.prompts_list_changed, "promptsListChanged")?,
            resources: flag(asked.resources_list_changed, "resourcesListChanged")?,
            uris,
        })
    }

    /// What of this filter a legacy server honors, by its `InitializeResult`'s capabilities
    /// (`tools.listChanged`, `prompts.listChanged`, `resources.listChanged`,
    /// `resources.subscribe`).
    pub fn granted(&self, init: &str) -> Filter {
        let result: serde_json::Value = serde_json::from_str(init).unwrap_or_default();
        let caps = &result["capabilities"];
        let on = |area: &str, flag: &str| caps[area][flag].as_bool() == Some(true);
        Filter {
            tools: self.tools && on("tools", "listChanged"),
            prompts: self.prompts && on("prompts", "listChanged"),
            resources: self.resources && on("resources", "listChanged"),
            uris: match on("resources", "subscribe") {
                true => self.uris.clone(),
                false => Vec::new(),
            },
        }
    }

    /// The filter as the acknowledgement (or a listen's `notifications`) writes it.
    fn json(&self) -> String {
        let mut members: Vec<String> = Vec::new();
        for (on, name) in [
            (self.tools, "toolsListChanged"),
            (self.prompts, "promptsListChanged"),
            (self.resources, "resourcesListChanged"),
        ] {
            if on {
                members.push(format!("\"{name}\":true"));
            }
        }
        if !self.uris.is_empty() {
            let uris = serde_json::to_string(&self.uris).unwrap_or_else(|_| "[]".into());
            members.push(format!("\"resourceSubscriptions\":{uris}"));
        }
        format!("{{{}}}", members.join(","))
    }

    /// Whether a server notification (`method`, and for a resource update its `uri`) is one
    /// this filter asked for.
    fn wants(&self, method: &str, uri: Option<&str>) -> bool {
        match method {
            "notifications/tools/list_changed" => self.tools,
            "notifications/prompts/list_changed" => self.prompts,
            "notifications/resources/list_changed" => self.resources,
            "notifications/resources/updated" => {
                uri.is_some_and(|uri| self.uris.iter().any(|u| covers(u, uri)))
            }
            _ => false,
        }
    }
}

/// The filter of the listen the proxy holds at a modern server for a legacy client: every list
/// change the server's `DiscoverResult` (`discovered`) offers, and `uris` when it offers
/// subscriptions. `None`: nothing to listen to.
pub fn held_filter(discovered: &str, uris: &[String]) -> Option<Filter> {
    let everything = Filter {
        tools: true,
        prompts: true,
        resources: true,
        uris: uris.to_vec(),
    };
    let filter = everything.granted(discovered);
    (filter != Filter::default()).then_some(filter)
}

/// Whether a modern server's `DiscoverResult` offers resource subscriptions.
pub fn offers_subscribe(discovered: &str) -> bool {
    let result: serde_json::Value = serde_json::from_str(discovered).unwrap_or_default();
    result["capabilities"]["resources"]["subscribe"].as_bool() == Some(true)
}

/// The `params.uri` of a legacy client's `resources/subscribe` or `resources/unsubscribe`.
pub fn requested_uri(request: &[u8]) -> Option<String> {
    updated_uri(request).filter(|uri| uri.len() <= MAX_URI_BYTES)
}

/// The proxy's own `subscriptions/listen` (without `_meta`: the bridge adds the client's).
pub fn listen_request(id: &Id, filter: &Filter) -> Vec<u8> {
    format!(
        r#"{{"jsonrpc":"2.0","id":{},"method":"subscriptions/listen","params":{{"notifications":{}}}}}"#,
        id.raw(),
        filter.json()
    )
    .into_bytes()
}

/// Whether a subscription to `subscribed` covers an update of `uri`: the same URI, or one of
/// its sub-resources (the schema: the updated URI "might be a sub-resource of the one that the
/// client actually subscribed to"), below a path, fragment or query boundary.
fn covers(subscribed: &str, uri: &str) -> bool {
    match uri.strip_prefix(subscribed) {
        Some("") => true,
        Some(rest) => subscribed.ends_with('/') || rest.starts_with(['/', '#', '?']),
        None => false,
    }
}

/// Whether a legacy server's notification is one a modern client gets only on a listen.
pub fn is_listened(method: &str) -> bool {
    matches!(
        method,
        "notifications/tools/list_changed"
            | "notifications/prompts/list_changed"
            | "notifications/resources/list_changed"
            | "notifications/resources/updated"
    )
}

/// One session's open listens, and the URIs subscribed upstream for them.
#[derive(Default)]
pub struct Listens {
    /// Each open listen: its id (as the relay sees it) and what it was granted.
    open: Vec<(Id, Filter)>,
    /// URI → how many open listens name it (subscribed upstream while above zero).
    upstream: HashMap<String, usize>,
    /// The bytes of the open listens' URIs.
    bytes: usize,
}

impl Listens {
    /// Opens a listen; the URIs to subscribe to upstream now (named by no other listen).
    pub fn open(&mut self, id: Id, granted: Filter) -> Result<Vec<String>, Refused> {
        let bytes: usize = granted.uris.iter().map(String::len).sum();
        if self.open.len() >= MAX_LISTENS || self.bytes + bytes > MAX_SESSION_URI_BYTES {
            return Err(Refused::TooManyListens);
        }
        self.bytes += bytes;
        let mut new = Vec::new();
        for uri in &granted.uris {
            let count = self.upstream.entry(uri.clone()).or_insert(0);
            *count += 1;
            if *count == 1 {
                new.push(uri.clone());
            }
        }
        self.open.push((id, granted));
        Ok(new)
    }

    pub fn is_open(&self, key: &str) -> bool {
        self.open.iter().any(|(id, _)| id.key() == key)
    }

    /// Ends the listen `key`; `None` when none is open under it, else the URIs to unsubscribe
    /// from upstream (no other listen names them).
    pub fn close(&mut self, key: &str) -> Option<Vec<String>> {
        let at = self.open.iter().position(|(id, _)| id.key() == key)?;
        let (_, filter) = self.open.remove(at);
        self.bytes -= filter.uris.iter().map(String::len).sum::<usize>();
        let mut gone = Vec::new();
        for uri in filter.uris {
            if let Some(count) = self.upstream.get_mut(&uri) {
                *count -= 1;
                if *count == 0 {
                    self.upstream.remove(&uri);
                    gone.push(uri);
                }
            }
        }
        Some(gone)
    }

    /// Forgets every listen (the server's session is gone: nothing is subscribed upstream).
    pub fn clear(&mut self) {
        self.open.clear();
        self.upstream.clear();
        self.bytes = 0;
    }

    /// The server's notification as each listen that asked for it receives it: tagged with
    /// that listen's id. Empty: no listen asked for it.
    pub fn deliveries(&self, method: &str, notification: &[u8]) -> Vec<Vec<u8>> {
        if self.open.is_empty() {
            return Vec::new();
        }
        let uri = match method {
            "notifications/resources/updated" => updated_uri(notification),
            _ => None,
        };
        let wanted = self
            .open
            .iter()
            .filter(|(_, filter)| filter.wants(method, uri.as_deref()));
        let mut copies = Vec::new();
        let mut bytes = 0;
        for (id, _) in wanted {
            if !copies.is_empty() && bytes + notification.len() > MAX_FANOUT_BYTES {
                tracing::warn!(
                    method,
                    bytes = notification.len(),
                    "a server notification too large to copy to every listen that asked for it: the later listens do not get it"
                );
                break;
            }
            if let Some(copy) = tagged(notification, id) {
                bytes += copy.len();
                copies.push(copy);
            }
        }
        copies
    }
}

/// The `params.uri` of a message (`notifications/resources/updated`, `resources/subscribe`).
fn updated_uri(notification: &[u8]) -> Option<String> {
    #[derive(Deserialize)]
    struct Params {
        uri: Option<String>,
    }
    serde_json::from_str::<Params>(message::params_of(notification)?)
        .ok()?
        .uri
}

/// `notifications/subscriptions/acknowledged` for the listen `id`, granting `filter`.
pub fn acknowledged(id: &Id, filter: &Filter) -> Vec<u8> {
    format!(
        r#"{{"jsonrpc":"2.0","method":"notifications/subscriptions/acknowledged","params":{{"_meta":{{"{}":{}}},"notifications":{}}}}}"#,
        message::META_SUBSCRIPTION_ID,
        id.raw(),
        filter.json()
    )
    .into_bytes()
}

/// A server notification tagged with the listen `id` (its `params._meta` gains the
/// subscription id; the rest as the server wrote it).
pub fn tagged(notification: &[u8], id: &Id) -> Option<Vec<u8>> {
    let member = format!("\"{}\":{}", message::META_SUBSCRIPTION_ID, id.raw());
    crate::era::bridge::with_meta_members(notification, &member)
}

/// The proxy's own `resources/subscribe` or `resources/unsubscribe` (`method`) for `uri`.
pub fn upstream_request(id: &Id, method: &str, uri: &str) -> Vec<u8> {
    format!(
        r#"{{"jsonrpc":"2.0","id":{},"method":"{method}","params":{{"uri":{}}}}}"#,
        id.raw(),
        crate::wire::jsonrpc::quote(uri)
    )
    .into_bytes()
}

/// The graceful end of a listen (the spec's "Graceful Closure"): its completion result.
pub fn closing_result(id: &Id) -> Vec<u8> {
    crate::wire::jsonrpc::result_response(
        id,
        &format!(
            r#"{{"resultType":"complete","_meta":{{"{}":{}}}}}"#,
            message::META_SUBSCRIPTION_ID,
            id.raw()
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listen(notifications: &str) -> Vec<u8> {
        format!(r#"{{"jsonrpc":"2.0","id":7,"method":"subscriptions/listen","params":{{"_meta":{{}},"notifications":{notifications}}}}}"#).into_bytes()
    }

    const INIT: &str = r#"{"protocolVersion":"2025-11-25","capabilities":{"tools":{"listChanged":true},"resources":{"subscribe":true}},"serverInfo":{"name":"s","version":"1"}}"#;

    #[test]
    fn the_server_grants_what_its_capabilities_name() {
        let asked = Filter::requested(&listen(
            r#"{"toolsListChanged":true,"promptsListChanged":true,"resourceSubscriptions":["a://1","a://1","a://2"]}"#,
        ))
        .unwrap();
        assert_eq!(asked.uris, ["a://1", "a://2"]);
        let granted = asked.granted(INIT);
        assert!(granted.tools && !granted.prompts && !granted.resources);
        let ack = acknowledged(&Id::from_json_text("7"), &granted);
        assert_eq!(
            String::from_utf8(ack).unwrap(),
            r#"{"jsonrpc":"2.0","method":"notifications/subscriptions/acknowledged","params":{"_meta":{"io.modelcontextprotocol/subscriptionId":7},"notifications":{"toolsListChanged":true,"resourceSubscriptions":["a://1","a://2"]}}}"#
        );
        // Without resources.subscribe, no URI is granted.
        let none = asked.granted(r#"{"capabilities":{"resources":{}}}"#);
        assert!(none.uris.is_empty() && !none.tools);
    }

    #[test]
    fn bad_filters_are_refused_with_the_fix() {
        assert_eq!(
            Filter::requested(&listen(r#"{"toolsListChanged":"yes"}"#)),
            Err(Refused::NotABoolean("toolsListChanged"))
        );
        assert_eq!(
            Filter::requested(&listen(r#"{"resourceSubscriptions":"a://1"}"#)),
            Err(Refused::NotUris)
        );
        assert_eq!(
            Filter::requested(&listen(r#"{"resourceSubscriptions":[1]}"#)),
            Err(Refused::NotUris)
        );
        assert_eq!(Filter::requested(&listen("[]")), Err(Refused::NotAnObject));
        let many: Vec<String> = (0..=MAX_URIS).map(|n| format!("a://{n}")).collect();
        let many = serde_json::to_string(&many).unwrap();
        assert_eq!(
            Filter::requested(&listen(&format!(r#"{{"resourceSubscriptions":{many}}}"#))),
            Err(Refused::TooManyUris)
        );
        assert_eq!(
            Filter::requested(
                b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"subscriptions/listen\"}"
            ),
            Ok(Filter::default())
        );
    }

    #[test]
    fn uris_are_subscribed_once_and_unsubscribed_with_the_last_listen() {
        let mut listens = Listens::default();
        let both = Filter {
            uris: vec!["a://1".into(), "a://2".into()],
            ..Filter::default()
        };
        let one = Filter {
            uris: vec!["a://1".into()],
            tools: true,
            ..Filter::default()
        };
        assert_eq!(
            listens.open(Id::from_json_text("1"), both).unwrap(),
            ["a://1", "a://2"]
        );
        assert!(
            listens
                .open(Id::from_json_text("2"), one)
                .unwrap()
                .is_empty()
        );
        let updated = br#"{"jsonrpc":"2.0","method":"notifications/resources/updated","params":{"uri":"a://1"}}"#;
        let got = listens.deliveries("notifications/resources/updated", updated);
        assert_eq!(got.len(), 2);
        assert_eq!(
            String::from_utf8(got[1].clone()).unwrap(),
            r#"{"jsonrpc":"2.0","method":"notifications/resources/updated","params":{"_meta":{"io.modelcontextprotocol/subscriptionId":2},"uri":"a://1"}}"#
        );
        let changed = br#"{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}"#;
        let got = listens.deliveries("notifications/tools/list_changed", changed);
        assert_eq!(
            String::from_utf8(got.concat()).unwrap(),
            r#"{"params":{"_meta":{"io.modelcontextprotocol/subscriptionId":2}},"jsonrpc":"2.0","method":"notifications/tools/list_changed"}"#
        );
        assert!(
            listens
                .deliveries("notifications/prompts/list_changed", b"{}")
                .is_empty()
        );
        // A sub-resource of a subscribed URI is covered; a longer name is not.
        let below = br#"{"jsonrpc":"2.0","method":"notifications/resources/updated","params":{"uri":"a://1/x.json"}}"#;
        assert_eq!(
            listens
                .deliveries("notifications/resources/updated", below)
                .len(),
            2
        );
        let other = br#"{"jsonrpc":"2.0","method":"notifications/resources/updated","params":{"uri":"a://10"}}"#;
        assert!(
            listens
                .deliveries("notifications/resources/updated", other)
                .is_empty()
        );
        assert_eq!(listens.close("1").unwrap(), ["a://2"]);
        assert_eq!(listens.close("2").unwrap(), ["a://1"]);
        assert_eq!(listens.close("2"), None);
    }

    #[test]
    fn a_sessions_uris_are_bounded_in_bytes_and_the_bytes_come_back() {
        let mut listens = Listens::default();
        let long = |n: usize| format!("a://{n}/{}", "x".repeat(MAX_URI_BYTES - 16));
        let half: Vec<String> = (0..MAX_SESSION_URI_BYTES / MAX_URI_BYTES / 2)
            .map(long)
            .collect();
        let filter = |uris: &[String]| Filter {
            uris: uris.to_vec(),
            ..Filter::default()
        };
        listens
            .open(Id::from_json_text("1"), filter(&half))
            .unwrap();
        listens
            .open(Id::from_json_text("2"), filter(&half))
            .unwrap();
        let more = vec![long(9999), long(9998)];
        assert_eq!(
            listens.open(Id::from_json_text("3"), filter(&more)),
            Err(Refused::TooManyListens)
        );
        listens.close("1").unwrap();
        listens
            .open(Id::from_json_text("3"), filter(&more))
            .unwrap();
    }

    #[test]
    fn at_most_max_listens_are_open() {
        let mut listens = Listens::default();
        for n in 0..MAX_LISTENS {
            listens
                .open(Id::from_json_text(&n.to_string()), Filter::default())
                .unwrap();
        }
        assert_eq!(
            listens.open(Id::from_json_text("\"x\""), Filter::default()),
            Err(Refused::TooManyListens)
        );
    }
}
