//! A recording served as an upstream (`mcp-budget replay`): each message is answered by the
//! [`Replayer`].

use std::sync::Arc;

use serde_json::Value;

use super::{Event, Link, Upstream};
use crate::replay::Replayer;
use crate::wire::framing::Frame;
use crate::wire::jsonrpc;

/// An upstream that answers from a recording.
pub fn upstream(replayer: Arc<Replayer>) -> Upstream {
    Upstream::spawn(move |link: Link| async move {
        let Link {
            messages: mut rx,
            events,
            stop: stop_rx,
        } = link;
        tokio::pin!(stop_rx);
        loop {
            tokio::select! {
                message = rx.recv() => {
                    let Some(bytes) = message else { break };
                    let replies = match serde_json::from_slice::<Value>(&bytes) {
                        Ok(Value::Array(batch)) => {
                            let replies: Vec<Value> = batch.iter().flat_map(|m| replayer.answer(m)).collect();
                            if replies.is_empty() { Vec::new() } else { vec![Value::Array(replies)] }
                        }
                        Ok(message) => replayer.answer(&message),
                        Err(_) => vec![serde_json::from_slice::<Value>(&jsonrpc::error_response(None, jsonrpc::PARSE_ERROR, "Parse error", None)).unwrap_or(Value::Null)],
                    };
                    for reply in replies {
                        let frame = Frame::Line(reply.to_string().into_bytes());
                        if events.send(Event::Frame(frame)).await.is_err() {
                            return;
                        }
                    }
                }
                _ = &mut stop_rx => break,
            }
        }
        let _ = events
            .send(Event::Ended {
                reason: "stopped".into(),
                stopped: true,
            })
            .await;
    })
}
