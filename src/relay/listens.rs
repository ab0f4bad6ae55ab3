//! Listens across the era bridge: served by the proxy for modern clients of a legacy server
//! (over resource subscriptions), or held at a modern server for a legacy client.

use crate::upstream::Outgoing;
use crate::wire::jsonrpc;
use crate::wire::message::{self, Id, Kind};

use super::bridged::for_modern_server;
use super::flights::{InFlight, Pending};
use super::{Delivery, Relay, Routed, State, bad_input};

/// At most this many listens the proxy cancelled keep delivering to a legacy client.
pub(super) const RETIRING_LISTENS: usize = 4;

/// A listen the proxy serves ([`Relay::serve_listen`]): whether it is open, its
/// acknowledgement (or refusal), and the subscriptions it needs upstream.
pub(super) struct ServedListen {
    pub(super) open: bool,
    pub(super) to_client: Vec<u8>,
    pub(super) to_server: Vec<Outgoing>,
}

impl Relay {
    /// Serves a modern client's `subscriptions/listen` in front of a legacy server: the part
    /// of its filter the server's `InitializeResult` (`init`) can honor is granted and
    /// acknowledged, and the URIs no other listen names are subscribed to upstream. The
    /// listen stays in flight (under `upstream`, a fresh id, when its own was used before)
    /// until the client cancels it or the session ends.
    pub(super) fn serve_listen(
        &self,
        state: &mut State,
        id: &Id,
        upstream: Option<Id>,
        filter: Result<crate::era::subscriptions::Filter, crate::era::subscriptions::Refused>,
        init: &str,
    ) -> ServedListen {
        let opened = filter.and_then(|filter| {
            let granted = filter.granted(init);
            let new = state.bridge.listens.open(id.clone(), granted.clone())?;
            Ok((granted, new))
        });
        let (granted, new) = match opened {
            Ok(opened) => opened,
            Err(refused) => {
                bad_input();
                return ServedListen {
                    open: false,
                    to_client: jsonrpc::error_response(
                        Some(id),
                        jsonrpc::INVALID_PARAMS,
                        &refused.to_string(),
                        None,
                    ),
                    to_server: Vec::new(),
                };
            }
        };
        tracing::debug!(
            id = id.raw(),
            uris = granted.uris.len(),
            "a listen served for a legacy server"
        );
        let key: Box<str> = match &upstream {
            Some(fresh) => {
                state.aliases.insert(id.key().into(), fresh.key().into());
                fresh.key().into()
            }
            None => id.key().into(),
        };
        let mut flight = InFlight::own(
            id.clone(),
            "subscriptions/listen",
            Pending::Listen {
                filter: None,
                served: true,
            },
            None,
        );
        flight.upstream = upstream;
        flight.era.modern = true;
        state.pending.insert(key, flight);
        let to_server = new
            .iter()
            .filter_map(|uri| self.subscription_request(state, "resources/subscribe", uri))
            .collect();
        ServedListen {
            open: true,
            to_client: crate::era::subscriptions::acknowledged(id, &granted),
            to_server,
        }
    }

    /// A legacy client's `resources/subscribe` or `resources/unsubscribe` in front of a modern
    /// server: its set of URIs changes, and the listen the proxy holds is replaced.
    pub(super) fn legacy_subscription(
        &self,
        state: &mut State,
        method: &str,
        request: &[u8],
        routed: &mut Routed,
    ) -> Result<(), String> {
        let uri = crate::era::subscriptions::requested_uri(request).ok_or_else(|| {
            format!(
                "Invalid params: {method} takes params.uri, a string of at most {} bytes",
                crate::era::subscriptions::MAX_URI_BYTES
            )
        })?;
        let uris = &mut state.bridge.legacy_uris;
        let changed = match method {
            "resources/subscribe" if uris.contains(&uri) => false,
            "resources/subscribe"
                if uris.len() >= crate::era::subscriptions::MAX_URIS
                    || uris.iter().map(String::len).sum::<usize>() + uri.len()
                        > crate::era::subscriptions::MAX_SESSION_URI_BYTES =>
            {
                return Err(format!(
                    "mcp-budget holds at most {} resource subscriptions ({} bytes of URIs) per session; unsubscribe one first",
                    crate::era::subscriptions::MAX_URIS,
                    crate::era::subscriptions::MAX_SESSION_URI_BYTES
                ));
            }
            "resources/subscribe" => {
                uris.push(uri);
                true
            }
            _ => {
                let before = uris.len();
                uris.retain(|u| *u != uri);
                uris.len() != before
            }
        };
        if changed {
            let listen = self.relisten(state);
            routed.also_to_server.extend(listen);
        }
        Ok(())
    }

    /// Opens the listen the proxy holds at a modern server for a legacy client, with what it
    /// should now ask for. The acknowledged listen keeps serving until the server acknowledges
    /// the new one, and is cancelled then; one never acknowledged is cancelled at once (nothing
    /// came on it).
    pub(super) fn relisten(&self, state: &mut State) -> Vec<Outgoing> {
        let Some(discovered) = state.bridge.discovered.clone() else {
            return Vec::new();
        };
        let filter = crate::era::subscriptions::held_filter(&discovered, &state.bridge.legacy_uris);
        let mut out = Vec::new();
        let current = state.bridge.held_listen.take();
        let acked = std::mem::take(&mut state.bridge.held_acked);
        match current {
            Some(current) if acked && filter.is_some() => {
                if let Some(older) = state.bridge.replaced_listen.replace(current) {
                    out.push(self.cancel_held(state, &older));
                }
            }
            Some(current) => out.push(self.cancel_held(state, &current)),
            None => {}
        }
        let Some(filter) = filter else {
            if let Some(older) = state.bridge.replaced_listen.take() {
                out.push(self.cancel_held(state, &older));
            }
            return out;
        };
        state.fresh += 1;
        let id = Id::from_json_text(&format!("\"mcp-budget-listen-{}\"", state.fresh));
        let request = crate::era::subscriptions::listen_request(&id, &filter);
        state.pending.insert(
            id.key().into(),
            InFlight::own(
                id.clone(),
                "subscriptions/listen",
                Pending::HeldListen,
                None,
            ),
        );
        tracing::debug!(
            uris = filter.uris.len(),
            "a listen held for a legacy client"
        );
        out.push(Outgoing {
            requests: vec![id.clone()],
            ..for_modern_server(state, "subscriptions/listen", request)
        });
        state.bridge.held_listen = Some(id);
        out
    }

    /// The cancellation of a listen the proxy held for a legacy client (what it still
    /// delivers reaches the client: see `retiring`).
    pub(super) fn cancel_held(&self, state: &mut State, listen: &Id) -> Outgoing {
        state.finish(listen.key());
        if state.bridge.retiring.len() >= RETIRING_LISTENS {
            state.bridge.retiring.pop_front();
        }
        state.bridge.retiring.push_back(listen.clone());
        let cancel = jsonrpc::cancelled(listen, "mcp-budget: the client's subscriptions changed");
        for_modern_server(state, "notifications/cancelled", cancel)
    }

    /// A modern server's notification on a listen the proxy holds for a legacy client: the
    /// acknowledgement of the current one cancels the one it replaces (dropped: the client
    /// asked for no listen); a list change or resource update on the current listen, the one
    /// it replaces, or one cancelled lately goes to the client, on any other of the proxy's
    /// listens nowhere. `None`: not one of these listens' (routed as before).
    pub(super) fn on_held_listen(&self, method: &str, line: &[u8]) -> Option<Delivery> {
        if !self.bridge_on {
            return None;
        }
        let mut state = self.state();
        if !state.bridge.serving_legacy {
            return None;
        }
        let tag = message::subscription_id(line)?;
        let ours = tag.raw().starts_with("\"mcp-budget-listen-");
        let is = |listen: &Option<Id>| listen.as_ref().is_some_and(|l| l.key() == tag.key());
        let current = is(&state.bridge.held_listen);
        if method == "notifications/subscriptions/acknowledged" {
            if current {
                state.bridge.held_acked = true;
                if let Some(older) = state.bridge.replaced_listen.take() {
                    let cancel = self.cancel_held(&mut state, &older);
                    state.later.to_server.push(cancel);
                }
            }
            return ours.then_some(Delivery::Drop);
        }
        let known = current
            || is(&state.bridge.replaced_listen)
            || state.bridge.retiring.iter().any(|r| r.key() == tag.key());
        match known {
            true => Some(Delivery::Unchanged),
            false => ours.then_some(Delivery::Drop),
        }
    }

    /// The proxy's own `resources/subscribe` or `resources/unsubscribe` (`method`) for a URI
    /// of the listens it serves, in flight; `None` while one for that URI is in flight (it
    /// goes once that one is answered: [`Relay::subscribed`]).
    pub(super) fn subscription_request(
        &self,
        state: &mut State,
        method: &'static str,
        uri: &str,
    ) -> Option<Outgoing> {
        if let Some(next) = state.bridge.subscribing.get_mut(uri) {
            *next = Some(method);
            return None;
        }
        state.bridge.subscribing.insert(uri.to_string(), None);
        state.fresh += 1;
        let id = Id::from_json_text(&format!("\"mcp-budget-subscribe-{}\"", state.fresh));
        let bytes = crate::era::subscriptions::upstream_request(&id, method, uri);
        state.pending.insert(
            id.key().into(),
            InFlight::own(id.clone(), method, Pending::Subscription(uri.into()), None),
        );
        Some(Outgoing {
            requests: vec![id],
            bytes,
            ..Outgoing::default()
        })
    }

    /// A `resources/subscribe` or `resources/unsubscribe` of the proxy's own for `uri` is
    /// over: the one asked for since, if any, goes now.
    pub(super) fn subscribed(&self, uri: &str) {
        let mut state = self.state();
        if let Some(Some(next)) = state.bridge.subscribing.remove(uri)
            && let Some(request) = self.subscription_request(&mut state, next, uri)
        {
            state.later.to_server.push(request);
        }
    }

    /// A legacy server's list change or resource update, for modern clients: each listen that
    /// asked for it gets it, tagged with its id (by [`Relay::take_later`]); none asked, nobody
    /// gets it (2026-07-28 sends nothing a client did not ask for).
    pub(super) fn to_listens(&self, method: &str, line: &[u8]) -> Delivery {
        let mut state = self.state();
        let deliveries = state.bridge.listens.deliveries(method, line);
        if deliveries.is_empty() {
            tracing::debug!(
                method,
                "a legacy server's notification no listen asked for; dropped"
            );
        }
        // Every copy goes by its listen's id alone (over HTTP, not to the stream of a request
        // the server's message came with).
        for copy in deliveries {
            let kind = Kind::Notification {
                method: method.to_string(),
            };
            state.later.to_client.push((copy, Some(kind), None));
        }
        Delivery::Drop
    }
}
