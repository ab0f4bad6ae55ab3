//! MRTR (multi-round-trip requests) across the era bridge: a legacy client asked for a
//! modern server's input, and a modern client's call parked while a legacy server waits.

use std::time::Instant;

use crate::era::bridge;
use crate::upstream::Outgoing;
use crate::wire::jsonrpc::{self, MISSING_CAPABILITY, UPSTREAM_ERROR};
use crate::wire::message::{Id, Kind};

use super::era_state::EraFlight;
use super::flights::{InFlight, Pending};
use super::{Delivery, Forward, Relay, Routed, State, bad_input};

/// A legacy client's call a modern server asked input for: the proxy asks the client (real
/// server-to-client requests) and retries the call with the answers (the era bridge's MRTR).
pub(super) struct Round {
    /// The client's call.
    pub(super) client: Id,
    pub(super) method: String,
    pub(super) pending: Pending,
    /// The call as it went upstream.
    pub(super) sent: Box<[u8]>,
    /// The server's `requestState`, echoed on the retry.
    pub(super) state: Option<String>,
    /// The answers so far (input key, result JSON), and how many are still awaited.
    pub(super) answers: Vec<(String, String)>,
    pub(super) waiting: usize,
    pub(super) rounds: u8,
    pub(super) deadline: Instant,
}

/// At most this many rounds of input per call, and rounds open per session.
pub(super) const MAX_ROUNDS: u8 = 8;

pub(super) const MAX_OPEN_ROUNDS: usize = 64;

/// A legacy client's request kept for a retry with input is at most this large, and such
/// requests (and the answers collected for them) hold at most this many bytes per session.
pub(super) const MAX_KEPT_REQUEST: usize = 1024 * 1024;

pub(super) const MAX_KEPT_BYTES: usize = 16 * 1024 * 1024;

/// At most this many input requests in one `input_required` are relayed to a legacy client.
pub(super) const MAX_INPUTS: usize = 64;

/// The bytes a session keeps for MRTR retries: requests in flight and rounds waiting.
pub(super) fn kept_bytes(state: &State) -> usize {
    let calls: usize = state
        .pending
        .values()
        .filter_map(|f| f.era.kept.as_ref().map(|k| k.len()))
        .sum();
    let rounds: usize = state
        .bridge
        .rounds
        .values()
        .map(|r| {
            r.sent.len()
                + r.answers
                    .iter()
                    .map(|(k, v)| k.len() + v.len())
                    .sum::<usize>()
        })
        .sum();
    calls + rounds
}

/// A legacy server's call parked while its modern client answers the server's request (the
/// era bridge's MRTR, [`crate::era::bridge`]).
pub(super) struct Parked {
    /// The call's key in `pending` (it stays there, its client id detached).
    pub(super) upstream_key: Box<str>,
    /// The server's requests the client was asked: input key, server request id.
    pub(super) asked: Vec<(String, Id)>,
    /// The server's answer, when it came before the retry.
    pub(super) done: Option<Vec<u8>>,
    /// The server's requests that came after the client was answered (method, params,
    /// server request id): the retry gets them as the next `input_required`.
    pub(super) extra: Vec<(String, String, Id)>,
    /// The round's requests (input key, method, params) while its `input_required` is not
    /// sent yet: the server's requests already read join it (a server asking several things
    /// at once asks them in one round); see [`Relay::release_rounds`].
    pub(super) unsent: Option<Vec<(String, String, String)>>,
}

/// A round is sent once no server message came for [`ROUND_WINDOW`], or after this many more.
///
/// [`ROUND_WINDOW`]: super::ROUND_WINDOW
pub(super) const ROUND_HOLD_EVENTS: usize = 64;

/// At most this many calls are parked per session; a server request past it is refused.
pub(super) const MAX_PARKED: usize = 64;

impl Relay {
    /// A modern server's `input_required` for a legacy client's call: each of its requests
    /// goes to the client as a real server-to-client request (on the call's stream); the
    /// answers are collected and the call retried ([`Relay::answered_in_round`]).
    pub(super) fn ask_legacy_client(
        &self,
        client: &Id,
        method: &str,
        pending: Pending,
        sent: Box<[u8]>,
        rounds: u8,
        answer: &[u8],
    ) -> Delivery {
        let refuse = |why: &str| {
            tracing::warn!(method, why, "a modern server's input_required not relayed");
            Delivery::Rewritten(jsonrpc::error_response(
                Some(client),
                UPSTREAM_ERROR,
                &format!(
                    "the server needs input for {method} that mcp-budget could not ask this client for: {why}"
                ),
                None,
            ))
        };
        let Some(asked) = bridge::input_requests(answer) else {
            return refuse("its input_required result could not be read");
        };
        if rounds >= MAX_ROUNDS {
            return refuse(&format!("it asked more than {MAX_ROUNDS} rounds"));
        }
        let mut state = self.state();
        if state.bridge.rounds.len() >= MAX_OPEN_ROUNDS {
            return refuse("too many calls of this session wait for input");
        }
        state.bridge.round_seq += 1;
        let n = state.bridge.round_seq;
        if asked.requests.len() > MAX_INPUTS {
            drop(state);
            return refuse(&format!(
                "it asked {} inputs at once, more than {MAX_INPUTS}",
                asked.requests.len()
            ));
        }
        let waiting = asked.requests.len();
        for request in &asked.requests {
            state.fresh += 1;
            let id = Id::from_json_text(&format!("\"mcp-budget-input-{}\"", state.fresh));
            let bytes = format!(
                r#"{{"jsonrpc":"2.0","id":{},"method":{},"params":{}}}"#,
                id.raw(),
                serde_json::Value::from(request.method.as_str()),
                request.params
            )
            .into_bytes();
            let kind = Kind::Request {
                id: id.clone(),
                method: request.method.clone(),
                progress: None,
                modern: None,
                call: None,
            };
            state
                .bridge
                .inputs
                .insert(id.key().into(), (n, request.key.clone()));
            state
                .later
                .to_client
                .push((bytes, Some(kind), Some(client.clone())));
        }
        tracing::info!(
            method,
            requests = waiting,
            "a modern server asks for input: mcp-budget asks the legacy client"
        );
        state.bridge.rounds.insert(
            n,
            Round {
                client: client.clone(),
                method: method.to_string(),
                pending,
                sent,
                state: asked.state,
                answers: Vec::new(),
                waiting,
                rounds: rounds + 1,
                deadline: Instant::now() + self.input_timeout,
            },
        );
        if waiting == 0 {
            // Only a requestState: the call is retried at once.
            match self.retry_round(&mut state, n) {
                Some(Ok(retry)) => state.later.to_server.push(retry),
                Some(Err(error)) => {
                    let kind = Kind::Response {
                        id: Some(client.clone()),
                        result: None,
                    };
                    state.later.to_client.push((error, Some(kind), None));
                }
                None => {}
            }
        }
        drop(state);
        self.deadline_added.notify_one();
        Delivery::Drop
    }

    /// A legacy client's answer to one of the proxy's input requests; once every answer is in,
    /// the call goes upstream again with them.
    pub(super) fn answered_in_round(
        &self,
        id: &Id,
        bytes: &[u8],
        routed: &mut Routed,
        out: &mut Outgoing,
    ) -> Forward {
        let mut state = self.state();
        let Some((n, key)) = state.bridge.inputs.remove(id.key()) else {
            return Forward::Drop;
        };
        let Some(result) = bridge::result_of(bytes).map(str::to_string) else {
            // The client refused (an error): the call ends with it.
            state.bridge.take_inputs(n);
            if let Some(round) = state.bridge.rounds.remove(&n) {
                let message = serde_json::from_slice::<serde_json::Value>(bytes)
                    .ok()
                    .and_then(|v| v["error"]["message"].as_str().map(str::to_string))
                    .unwrap_or_default();
                routed.to_client.push(jsonrpc::error_response(
                    Some(&round.client),
                    UPSTREAM_ERROR,
                    &format!(
                        "the client answered the server's request for input with an error ({message}); {} was not completed",
                        round.method
                    ),
                    None,
                ));
            }
            return Forward::Drop;
        };
        if kept_bytes(&state) + result.len() > MAX_KEPT_BYTES {
            if let Some(round) = state.bridge.rounds.remove(&n) {
                state.bridge.inputs.retain(|_, (m, _)| *m != n);
                routed.to_client.push(jsonrpc::error_response(
                    Some(&round.client),
                    UPSTREAM_ERROR,
                    &format!(
                        "the client's answers to the server's requests for input are more than mcp-budget holds for a retry ({MAX_KEPT_BYTES} bytes a session); {} was not completed",
                        round.method
                    ),
                    None,
                ));
            }
            return Forward::Drop;
        }
        let Some(round) = state.bridge.rounds.get_mut(&n) else {
            return Forward::Drop;
        };
        round.answers.push((key, result));
        round.waiting = round.waiting.saturating_sub(1);
        if round.waiting > 0 {
            return Forward::Drop;
        }
        match self.retry_round(&mut state, n) {
            Some(Ok(retry)) => {
                let Outgoing {
                    bytes,
                    requests,
                    modern,
                    ..
                } = retry;
                let id = requests.first().cloned();
                out.requests.extend(requests);
                out.modern = modern;
                drop(state);
                if id.is_some() && self.request_timeout.is_some() {
                    self.deadline_added.notify_one();
                }
                Forward::Rewritten(bytes)
            }
            Some(Err(error)) => {
                routed.to_client.push(error);
                Forward::Drop
            }
            None => Forward::Drop,
        }
    }

    /// Round `n`'s call, retried upstream with the client's answers and the server's
    /// `requestState`, under a fresh id (in flight again, as the client's call). `Err`: the
    /// client's error (the call could not be retried).
    pub(super) fn retry_round(
        &self,
        state: &mut State,
        n: u64,
    ) -> Option<Result<Outgoing, Vec<u8>>> {
        let round = state.bridge.rounds.remove(&n)?;
        state.fresh += 1;
        let fresh = Id::from_json_text(&format!("\"mcp-budget-retry-{}\"", state.fresh));
        let Some(bytes) =
            bridge::retry(&round.sent, &fresh, &round.answers, round.state.as_deref())
        else {
            return Some(Err(jsonrpc::error_response(
                Some(&round.client),
                UPSTREAM_ERROR,
                &format!(
                    "mcp-budget could not retry {} with the client's input",
                    round.method
                ),
                None,
            )));
        };
        let annotated = match &round.pending {
            Pending::ToolsCall(context) => self.interceptor.param_headers(context.tool()),
            _ => Vec::new(),
        };
        let headers = crate::era::Headers::of(
            crate::protocol::MODERN,
            &round.method,
            bridge::named(&round.method, &bytes),
            &bytes,
            &annotated,
        );
        state
            .aliases
            .insert(round.client.key().into(), fresh.key().into());
        state.pending.insert(
            fresh.key().into(),
            InFlight {
                upstream: Some(fresh.clone()),
                era: EraFlight {
                    kept: Some(round.sent),
                    rounds: round.rounds,
                    ..EraFlight::default()
                },
                ..InFlight::own(
                    round.client,
                    &round.method,
                    round.pending,
                    self.request_timeout.map(|t| Instant::now() + t),
                )
            },
        );
        tracing::debug!("a legacy client's answers: its call goes upstream again with them");
        Some(Ok(Outgoing {
            bytes,
            requests: vec![fresh],
            modern: Some(Box::new(headers)),
            ..Outgoing::default()
        }))
    }

    /// A legacy server's request for input (elicitation, sampling, roots) during a modern
    /// client's call: the call is parked upstream and its client answered `input_required`,
    /// carrying the request and a `requestState` minted under the cursor key for this session
    /// and this call. `None`: no single call can take it (it is refused, see
    /// [`Relay::answer_server_request`]). The client's id and the answer to it.
    /// `related`: the call whose stream the request came on, when the transport knows it.
    pub(super) fn park(
        &self,
        server_id: &Id,
        method: &str,
        line: &[u8],
        related: Option<&Id>,
    ) -> Result<Option<(Id, Vec<u8>)>, ()> {
        if !crate::protocol::is_input_request(method) {
            return Err(());
        }
        self.park_inner(server_id, method, line, related).ok_or(())
    }

    pub(super) fn park_inner(
        &self,
        server_id: &Id,
        method: &str,
        line: &[u8],
        related: Option<&Id>,
    ) -> Option<Option<(Id, Vec<u8>)>> {
        let mut state = self.state();
        // Parked calls that ended otherwise (the server restarted, the answer was unreadable)
        // are forgotten.
        let fields = &mut *state;
        let pending = &fields.pending;
        fields
            .bridge
            .parked
            .retain(|_, p| pending.contains_key(&p.upstream_key));
        if state.bridge.parked.len() >= MAX_PARKED {
            tracing::warn!(
                method,
                "too many calls wait for their clients' input; refused"
            );
            return None;
        }
        // Over HTTP the request came on the stream of the call it belongs to (a parked one:
        // it joins that call's next round). A stream that names a request that cannot take
        // input (not a modern call, or one over) is not guessed past.
        let related = match related {
            None => None,
            Some(r) => match state.pending.get(r.key()) {
                Some(flight) if flight.era.modern && flight.era.digest.is_some() => {
                    Some((Box::<str>::from(r.key()), flight.era.parked))
                }
                _ => {
                    tracing::warn!(
                        method,
                        "a legacy server's request for input came on the stream of a request that cannot take input; refused"
                    );
                    return None;
                }
            },
        };
        // On stdio a server request names no call: it is the only one open that can take
        // input; with none open, the call parked last (a server asking several things at
        // once asks them for one call).
        let open: Vec<Box<str>> = state
            .pending
            .iter()
            .filter(|(_, f)| f.era.modern && f.era.digest.is_some() && f.era.parked.is_none())
            .map(|(k, _)| k.clone())
            .collect();
        let latest = state
            .pending
            .iter()
            .filter_map(|(k, f)| {
                f.era
                    .parked
                    .filter(|_| f.era.modern)
                    .map(|n| (n, k.clone()))
            })
            .max_by_key(|(n, _)| *n);
        let (upstream_key, parked) = match (related, open.as_slice(), latest) {
            (Some(call), _, _) => call,
            (None, [one], _) => (one.clone(), None),
            (None, [], Some((n, key))) => (key, Some(n)),
            _ => {
                tracing::warn!(
                    method,
                    "a legacy server's request for input with no single modern call it belongs to; refused"
                );
                return None;
            }
        };
        if let Some(n) = parked {
            let entry = state.bridge.parked.get_mut(&n)?;
            if entry.asked.len() + entry.extra.len() >= MAX_INPUTS {
                return None;
            }
            // Its round is not sent yet: this one joins it.
            if let Some(unsent) = entry.unsent.as_mut() {
                let input_key = format!("mcp-budget-{n}-{}", entry.asked.len());
                unsent.push((
                    input_key.clone(),
                    method.to_string(),
                    bridge::params_of(line),
                ));
                entry.asked.push((input_key, server_id.clone()));
                return Some(None);
            }
            // The client has its input_required already: this one goes with the next round.
            entry.extra.push((
                method.to_string(),
                bridge::params_of(line),
                server_id.clone(),
            ));
            return Some(None);
        }
        state.bridge.parked_seq += 1;
        let n = state.bridge.parked_seq;
        let deadline = Instant::now() + self.input_timeout;
        let flight = state.pending.get_mut(&upstream_key)?;
        let client = flight.id.clone();
        // Only a call that can take input (a modern call, its digest kept) is parked.
        flight.era.digest?;
        let capability = crate::protocol::capability_of(method);
        let declared = flight.era.caps.as_deref().is_some_and(|caps| {
            caps.split(';')
                .any(|c| c.starts_with(&format!("{capability}(")))
        });
        if !declared {
            // The server needs what the client did not declare: the call fails as a modern
            // server fails it (-32021), and the server's call is cancelled.
            let upstream = flight.upstream.clone().unwrap_or_else(|| flight.id.clone());
            let finished = state.finish(&upstream_key);
            state
                .later
                .to_server
                .push(Outgoing::notification(jsonrpc::error_response(
                    Some(server_id),
                    jsonrpc::METHOD_NOT_FOUND,
                    &format!("mcp-budget: the client did not declare the {capability} capability"),
                    None,
                )));
            state
                .later
                .to_server
                .push(Outgoing::notification(jsonrpc::cancelled(
                    &upstream,
                    "mcp-budget: the client did not declare the capability this call needs",
                )));
            drop(state);
            tracing::info!(
                method,
                "a legacy server needs a capability the modern call did not declare: -32021"
            );
            let data = serde_json::json!({"requiredCapabilities": {capability: {}}});
            let answer = jsonrpc::error_response(
                Some(&client),
                MISSING_CAPABILITY,
                &format!("Server requires the {capability} capability for this request"),
                Some(&data),
            );
            return finished.map(|_| Some((client, answer)));
        }
        if flight.upstream.is_none() {
            // The server knows it by the client's id; a new request under that id goes
            // upstream under a fresh one.
            flight.upstream = Some(flight.id.clone());
        }
        flight.era.parked = Some(n);
        flight.deadline = Some(deadline);
        state.aliases.remove(client.key());
        let input_key = format!("mcp-budget-{n}");
        let params = bridge::params_of(line);
        state.bridge.parked.insert(
            n,
            Parked {
                upstream_key,
                asked: vec![(input_key.clone(), server_id.clone())],
                done: None,
                extra: Vec::new(),
                unsent: Some(vec![(input_key, method.to_string(), params)]),
            },
        );
        drop(state);
        self.rounds_held
            .store(1, std::sync::atomic::Ordering::Relaxed);
        self.deadline_added.notify_one();
        tracing::info!(
            method,
            "a legacy server asks for input: the modern client gets input_required, the call waits for its retry"
        );
        Some(None)
    }

    /// Whether a round of input is held unsent: the caller then calls
    /// [`Relay::release_rounds`] with `now` once no server message came for [`ROUND_WINDOW`].
    ///
    /// [`ROUND_WINDOW`]: super::ROUND_WINDOW
    pub fn rounds_waiting(&self) -> bool {
        self.rounds_held.load(std::sync::atomic::Ordering::Relaxed) > 0
    }

    /// Sends the `input_required` of every round not sent yet: `now` when no server message
    /// came for [`ROUND_WINDOW`] (what the server asked at once is in its round), or anyway
    /// once [`ROUND_HOLD_EVENTS`] more messages were handled. The answers go to
    /// [`Relay::take_later`].
    ///
    /// [`ROUND_WINDOW`]: super::ROUND_WINDOW
    pub fn release_rounds(&self, now: bool) {
        use std::sync::atomic::Ordering;
        let age = self.rounds_held.load(Ordering::Relaxed);
        if age == 0 {
            return;
        }
        if !now && age <= ROUND_HOLD_EVENTS {
            self.rounds_held.store(age + 1, Ordering::Relaxed);
            return;
        }
        self.rounds_held.store(0, Ordering::Relaxed);
        let key = self.interceptor.cursor_key();
        let mut state = self.state();
        let nonce = state.bridge.nonce.clone();
        let mut answers = Vec::new();
        let fields = &mut *state;
        for (n, parked) in fields.bridge.parked.iter_mut() {
            let Some(requests) = parked.unsent.take() else {
                continue;
            };
            let Some(flight) = fields.pending.get(&parked.upstream_key) else {
                continue;
            };
            let Some(digest) = flight.era.digest else {
                continue;
            };
            let token = key.mint(
                &crate::budget::page::Position {
                    offset: usize::try_from(*n).unwrap_or(usize::MAX),
                    key: Some(format!("mrtr.{nonce}")),
                },
                &digest,
            );
            let result = bridge::input_required(&requests, &token);
            let client = flight.id.clone();
            answers.push((client.clone(), jsonrpc::result_response(&client, &result)));
        }
        for (client, answer) in answers {
            self.record_answers(std::slice::from_ref(&answer));
            let kind = Kind::Response {
                id: Some(client),
                result: None,
            };
            state.later.to_client.push((answer, Some(kind), None));
        }
    }

    /// A modern client's retry of a parked call: its answers go to the server's requests, and
    /// the call, still running upstream, is the retry's from now on.
    pub(super) fn resume(
        &self,
        state: &mut State,
        id: &Id,
        method: &str,
        bytes: &[u8],
        token: &str,
        routed: &mut Routed,
    ) -> Forward {
        let mut refuse = |message: &str| {
            bad_input();
            tracing::warn!(id = id.raw(), message, "an MRTR retry refused");
            routed.to_client.push(jsonrpc::error_response(
                Some(id),
                jsonrpc::INVALID_PARAMS,
                message,
                None,
            ));
            Forward::Drop
        };
        let digest = bridge::call_digest(method, bytes);
        let position = match self.interceptor.cursor_key().verify(token, &digest) {
            Ok(position) => position,
            Err(_) => {
                return refuse(
                    "Invalid params: this requestState was not minted by mcp-budget for this request (it was altered, or is another request's); send the request again without requestState and inputResponses",
                );
            }
        };
        if position.key.as_deref() != Some(format!("mrtr.{}", state.bridge.nonce).as_str()) {
            return refuse(
                "Invalid params: this requestState belongs to another session or principal; send the request again without requestState and inputResponses",
            );
        }
        let n = position.offset as u64;
        let Some(parked) = state.bridge.parked.remove(&n) else {
            return refuse(&format!(
                "Invalid params: the call this requestState continues is no longer held by mcp-budget (it was retried already, or waited longer than {} s, --input-timeout-secs); send the request again without requestState and inputResponses (the tool was not run again)",
                self.input_timeout.as_secs()
            ));
        };
        let answers = bridge::input_responses(bytes);
        let mut to_server: Vec<String> = Vec::new();
        for (key, server_id) in &parked.asked {
            let answer = match answers.get(key) {
                Some(value) => jsonrpc::result_response(server_id, value),
                None => jsonrpc::error_response(
                    Some(server_id),
                    jsonrpc::INVALID_PARAMS,
                    "the client's retry gave no answer to this request",
                    None,
                ),
            };
            to_server.push(String::from_utf8_lossy(&answer).into_owned());
        }
        // Each answer on its own line (2025 servers take no batches).
        let bytes = to_server.remove(0);
        routed.also_to_server.extend(
            to_server
                .into_iter()
                .map(|answer| Outgoing::notification(answer.into_bytes())),
        );
        if !parked.extra.is_empty() {
            // The server asked more meanwhile: the retry gets it, as the next round.
            state.bridge.parked_seq += 1;
            let m = state.bridge.parked_seq;
            let nonce = state.bridge.nonce.clone();
            let Some(flight) = state.pending.get_mut(&parked.upstream_key) else {
                return refuse("Invalid params: the call this requestState continues has ended");
            };
            flight.id = id.clone();
            flight.era.parked = Some(m);
            flight.deadline = Some(Instant::now() + self.input_timeout);
            let token = self.interceptor.cursor_key().mint(
                &crate::budget::page::Position {
                    offset: usize::try_from(m).unwrap_or(usize::MAX),
                    key: Some(format!("mrtr.{nonce}")),
                },
                &digest,
            );
            let mut requests = Vec::new();
            let mut asked = Vec::new();
            for (i, (method, params, server_id)) in parked.extra.into_iter().enumerate() {
                let key = format!("mcp-budget-{m}-{i}");
                asked.push((key.clone(), server_id));
                requests.push((key, method, params));
            }
            state.bridge.parked.insert(
                m,
                Parked {
                    upstream_key: parked.upstream_key,
                    asked,
                    done: parked.done,
                    extra: Vec::new(),
                    unsent: None,
                },
            );
            let result = bridge::input_required(&requests, &token);
            routed.to_client.push(jsonrpc::result_response(id, &result));
            return Forward::Rewritten(bytes.into_bytes());
        }
        let deadline = self.request_timeout.map(|t| Instant::now() + t);
        let Some(flight) = state.pending.get_mut(&parked.upstream_key) else {
            return refuse("Invalid params: the call this requestState continues has ended");
        };
        flight.id = id.clone();
        flight.era.parked = None;
        flight.deadline = deadline;
        let upstream = flight.upstream.clone();
        state
            .aliases
            .insert(id.key().into(), parked.upstream_key.clone());
        routed.accepted.push(id.clone());
        if let (Some(done), Some(upstream)) = (parked.done, upstream) {
            state.bridge.resumed_done = Some((upstream, done));
        }
        tracing::debug!(
            id = id.raw(),
            "an MRTR retry: the client's answers go to the legacy server"
        );
        Forward::Rewritten(bytes.into_bytes())
    }
}
