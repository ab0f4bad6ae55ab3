//! Batches both ways, and the server's answers that cannot be passed on as they are
//! (twice answered, withheld, too large).

use bytes::Bytes;
use serde_json::value::RawValue;

use crate::upstream::Outgoing;
use crate::wire::jsonrpc::{self, PARSE_ERROR, UPSTREAM_ERROR};
use crate::wire::message::{self, Id, Kind, part_of};

use super::server::{NULL_ID_ERROR_BYTES, unclassified_from_server};
use super::{Delivery, Forward, Relay, Routed};

impl Relay {
    pub(super) fn client_batch(&self, kinds: Vec<Kind>, line: Vec<u8>) -> Routed {
        let mut routed = Routed::default();
        let elements: Vec<&RawValue> = match serde_json::from_slice(&line) {
            Ok(elements) => elements,
            Err(err) => {
                // `parse` accepted it as an array, so this cannot happen; answer rather than drop.
                let message = format!("Parse error: {err}");
                routed
                    .to_client
                    .push(jsonrpc::error_response(None, PARSE_ERROR, &message, None));
                return routed;
            }
        };
        let mut kept = Vec::with_capacity(elements.len());
        let mut changed = false;
        let mut out = Outgoing::default();
        for (kind, element) in kinds.into_iter().zip(&elements) {
            match self.client_message(kind, element.get().as_bytes(), &mut routed, &mut out, None) {
                Forward::Drop => changed = true,
                Forward::Unchanged => kept.push(element.get().to_owned()),
                Forward::Rewritten(rewritten) => {
                    changed = true;
                    kept.push(String::from_utf8_lossy(&rewritten).into_owned());
                }
            }
        }
        routed.to_server = if !changed {
            Some(Outgoing { bytes: line, ..out })
        } else if kept.is_empty() {
            None
        } else {
            Some(Outgoing {
                bytes: format!("[{}]", kept.join(",")).into_bytes(),
                ..out
            })
        };
        routed
    }

    /// The batch as it reaches the client: responses for ids not in flight are left out.
    /// `first` gets the client's id of the first response the client receives.
    pub(super) fn server_batch(
        &self,
        kinds: Vec<Kind>,
        line: &Bytes,
        first: &mut Option<Id>,
    ) -> Delivery {
        let Ok(elements) = serde_json::from_slice::<Vec<&RawValue>>(line) else {
            return Delivery::Unchanged; // `parse` accepted it as an array: unreachable
        };
        let mut out = Vec::with_capacity(elements.len());
        let mut changed = false;
        let mut seen_response = false;
        for (kind, element) in kinds.into_iter().zip(&elements) {
            let delivery = match kind {
                Kind::Response { id: Some(id), .. } => {
                    let mut restored = None;
                    let delivery = self.server_response(
                        &id,
                        &part_of(line, element.get().as_bytes()),
                        None,
                        &mut restored,
                    );
                    // The batch is routed by its first response the client receives.
                    if !seen_response && !matches!(delivery, Delivery::Drop) {
                        seen_response = true;
                        *first = Some(restored.unwrap_or(id));
                    }
                    delivery
                }
                // In a batch as alone: what a client could read two ways is withheld.
                Kind::Malformed {
                    id,
                    problem: message::Problem::Duplicate(key) | message::Problem::DuplicateIn(key),
                } if id.is_some() => match id.and_then(|id| self.twice_answered(&id, key)) {
                    Some((client, answer)) => {
                        if !seen_response {
                            seen_response = true;
                            *first = Some(client);
                        }
                        Delivery::Rewritten(answer)
                    }
                    None => {
                        tracing::warn!(
                            key,
                            "a server message in a batch names a key twice; withheld"
                        );
                        Delivery::Drop
                    }
                },
                // In a batch as alone: a task's state names it by its token, and a completed
                // task's result is budgeted.
                Kind::Notification { method } => {
                    let element = part_of(line, element.get().as_bytes());
                    let element = &element;
                    let rewritten = match method.as_str() {
                        "notifications/tasks" => self.interceptor.task_notification(element),
                        "notifications/subscriptions/acknowledged" => {
                            Ok(self.interceptor.tasks_acknowledged(element))
                        }
                        _ => Ok(None),
                    };
                    match rewritten {
                        Ok(Some(bytes)) => Delivery::Rewritten(bytes),
                        Ok(None) => Delivery::Unchanged,
                        Err(_) => Delivery::Drop,
                    }
                }
                Kind::Response {
                    id: None,
                    result: None,
                } if element.get().len() <= NULL_ID_ERROR_BYTES => Delivery::Unchanged,
                kind @ (Kind::Malformed { .. }
                | Kind::Response { id: None, .. }
                | Kind::Other
                | Kind::Invalid) => {
                    unclassified_from_server(&kind, element.get().as_bytes());
                    Delivery::Drop
                }
                _ => Delivery::Unchanged,
            };
            match delivery {
                Delivery::Unchanged => out.push(element.get().to_owned()),
                Delivery::Rewritten(bytes) => {
                    changed = true;
                    out.push(String::from_utf8_lossy(&bytes).into_owned());
                }
                Delivery::Drop => changed = true,
            }
        }
        match (changed, out.is_empty()) {
            (false, _) => Delivery::Unchanged,
            (true, true) => Delivery::Drop,
            (true, false) => Delivery::Rewritten(format!("[{}]", out.join(",")).into_bytes()),
        }
    }

    /// A server's answer that names `key` twice: a client could read it two ways, and the
    /// proxy could not know which it budgeted, so the call ends with an error that says so.
    /// The client's id and that error; `None`: it answers no call in flight (dropped).
    pub(super) fn twice_answered(&self, id: &Id, key: &str) -> Option<(Id, Vec<u8>)> {
        self.withheld_answer(id, &format!("names a key twice ({key})"))
    }

    /// A server's answer to `id` that the proxy cannot read for certain (`why`): the call ends
    /// with an error that says so. The client's id and that error; `None`: it answers no call
    /// in flight.
    pub(super) fn withheld_answer(&self, id: &Id, why: &str) -> Option<(Id, Vec<u8>)> {
        let flight = self.finish_for_client(id, &format!("its answer {why}"))?;
        tracing::warn!(id = flight.id.raw(), why, "the server's answer withheld");
        let answer = jsonrpc::error_response(
            Some(&flight.id),
            UPSTREAM_ERROR,
            &format!(
                "mcp-budget: the server's answer {why}, so the proxy cannot know what a client would read; it was withheld"
            ),
            None,
        );
        Some((flight.id.clone(), answer))
    }

    pub(super) fn server_too_large(
        &self,
        bytes: usize,
        id: Option<Id>,
        method: Option<String>,
    ) -> Option<Vec<u8>> {
        tracing::warn!(
            bytes,
            method = method.as_deref(),
            "server message over the size limit; dropped"
        );
        let id = id?;
        let finished = self.state().finish(id.key())?;
        let id = self
            .clients_flight(finished, "its answer is over the size limit")?
            .id;
        let message = format!(
            "the server's response is {bytes} bytes, over the proxy's message size limit \
             (raise it with --max-message-bytes, or narrow the request)"
        );
        Some(jsonrpc::error_response(
            Some(&id),
            UPSTREAM_ERROR,
            &message,
            None,
        ))
    }
}
