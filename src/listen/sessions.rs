//! Every session of a listener: opening one (its upstream started, its slot counted), finding
//! it, ending it, and the tasks that read each upstream into its session and time out its
//! requests.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tokio::task::JoinSet;

use crate::intercept::Interceptor;
use crate::queue;
use crate::upstream::{Event, Upstream, UpstreamSpec};

use super::ListenOptions;
use super::replay::Replay;
use super::session::*;

/// Why a session could not be opened.
#[derive(Debug)]
pub(super) enum OpenError {
    /// The listener is at `--max-sessions`.
    Full(usize),
    /// This client holds `--max-sessions-per-client` already.
    ClientFull(usize),
    /// `--max-children` upstream server processes run already.
    Children(usize),
    /// The upstream could not be started.
    Upstream(String),
    /// No session id could be made.
    Id(String),
    /// The listener is shutting down.
    Closing,
}

/// A session slot taken while its upstream starts; given back when dropped (the session is in
/// the map by then, or the open failed).
struct Opening<'a> {
    sessions: &'a Sessions,
    client: Client,
}

impl Drop for Opening<'_> {
    fn drop(&mut self) {
        let mut opening = lock(&self.sessions.opening);
        if let Some(n) = opening.get_mut(&self.client) {
            *n -= 1;
            if *n == 0 {
                opening.remove(&self.client);
            }
        }
    }
}

/// Every session of a listener, and every task they run.
pub(super) struct Sessions {
    options: ListenOptions,
    spec: UpstreamSpec,
    /// The server's origin (the era bridge's verdicts are kept by it), made once.
    origin: Option<String>,
    /// Its verdict, as last read.
    verdict: crate::era::bridge::VerdictCopy,
    budget: Arc<crate::reload::Shared>,
    map: Mutex<HashMap<String, Arc<Session>>>,
    /// Sessions being opened (their upstream starting), by client: they count against the
    /// limits as if open, so that concurrent opens cannot pass them. Locked after `map`.
    opening: Mutex<HashMap<Client, usize>>,
    tasks: Mutex<JoinSet<()>>,
    /// Set when the listener shuts down: no session opens after it.
    closing: AtomicBool,
    /// Each principal's stateless sessions (modern requests), by the capabilities a legacy
    /// server may use that its requests declare (see [`crate::era::bridge::capability_profile`]; ""
    /// when none is needed). Weak: an ended session's entry is dropped when the
    /// next one opens.
    stateless: Mutex<HashMap<Client, HashMap<String, Weak<Session>>>>,
    /// One stateless session opens at a time (two first requests of one principal share it).
    stateless_open: tokio::sync::Mutex<()>,
}

impl Sessions {
    pub fn new(
        options: ListenOptions,
        spec: UpstreamSpec,
        budget: Arc<crate::reload::Shared>,
    ) -> Sessions {
        Sessions {
            options,
            origin: spec.origin(),
            verdict: crate::era::bridge::VerdictCopy::default(),
            spec,
            budget,
            map: Mutex::new(HashMap::new()),
            opening: Mutex::new(HashMap::new()),
            tasks: Mutex::new(JoinSet::new()),
            closing: AtomicBool::new(false),
            stateless: Mutex::new(HashMap::new()),
            stateless_open: tokio::sync::Mutex::new(()),
        }
    }

    /// The session that serves `client`'s modern requests: opened at its first one, and ended
    /// like any other when idle. Its cache and cursors are the principal's. `profile`: what the
    /// requests declare that a legacy server may use (the era bridge opens its legacy session
    /// with it, so requests that declare other capabilities get a session of their own);
    /// `None` (a notification, which declares nothing) takes any of the principal's.
    pub async fn stateless(
        self: &Arc<Self>,
        client: Client,
        profile: Option<String>,
    ) -> Result<Arc<Session>, OpenError> {
        let find = |sessions: &Sessions| {
            let stateless = lock(&sessions.stateless);
            let of_client = stateless.get(&client)?;
            let live = |session: &Weak<Session>| session.upgrade().filter(|s| !s.is_ended());
            match &profile {
                Some(profile) => of_client.get(profile.as_str()).and_then(live),
                None => of_client.values().find_map(live),
            }
        };
        if let Some(session) = find(self) {
            return Ok(session);
        }
        let _one = self.stateless_open.lock().await;
        if let Some(session) = find(self) {
            return Ok(session);
        }
        let session = self.open(client.clone()).await?;
        session.stateless.store(true, Ordering::SeqCst);
        tracing::info!(session = %session.id, ?client, "stateless session for this client's 2026-07-28 requests");
        // Entries of sessions that ended go (a client can name many capability profiles).
        let mut map = lock(&self.stateless);
        map.retain(|_, of_client| {
            of_client.retain(|_, s| s.upgrade().is_some_and(|s| !s.is_ended()));
            !of_client.is_empty()
        });
        map.entry(client)
            .or_default()
            .insert(profile.unwrap_or_default(), Arc::downgrade(&session));
        Ok(session)
    }

    /// What a modern request declares that a legacy server may use, when the server may be
    /// legacy; `None` when it is known to be modern (one session serves every capability set:
    /// any of the principal's).
    pub fn capability_profile(&self, body: &[u8]) -> Option<String> {
        let modern = self
            .origin
            .as_deref()
            .and_then(|origin| self.verdict.get(origin))
            == Some(crate::era::bridge::Era::Modern);
        if modern || !self.options.session.bridge {
            return None;
        }
        Some(crate::era::bridge::capability_profile(body))
    }

    pub fn options(&self) -> &ListenOptions {
        &self.options
    }

    /// Whether a new session would be opened now (not shutting down, under `--max-sessions`).
    pub fn accepting(&self) -> bool {
        !self.closing.load(Ordering::SeqCst) && lock(&self.map).len() < self.options.max_sessions
    }

    pub fn get(&self, id: &str) -> Option<Arc<Session>> {
        lock(&self.map).get(id).cloned()
    }

    fn spawn(&self, task: impl std::future::Future<Output = ()> + Send + 'static) {
        let mut tasks = lock(&self.tasks);
        // Collect what has finished, so the set holds only live tasks.
        while tasks.try_join_next().is_some() {}
        tasks.spawn(task);
    }

    /// Opens a session for `client`: its upstream, relay, and tasks.
    pub async fn open(self: &Arc<Self>, client: Client) -> Result<Arc<Session>, OpenError> {
        if self.closing.load(Ordering::SeqCst) {
            return Err(OpenError::Closing);
        }
        // The slot is taken now, under the lock that checks it, and given back if the open fails.
        let _slot = {
            let map = lock(&self.map);
            let mut opening = lock(&self.opening);
            let pending: usize = opening.values().sum();
            let total = map.len() + pending;
            if total >= self.options.max_sessions {
                return Err(OpenError::Full(self.options.max_sessions));
            }
            let held = map.values().filter(|s| s.client == client).count()
                + opening.get(&client).copied().unwrap_or(0);
            if held >= self.options.max_sessions_per_client {
                return Err(OpenError::ClientFull(self.options.max_sessions_per_client));
            }
            // A session in front of a command runs one server process.
            if matches!(self.spec, UpstreamSpec::Command(_)) && total >= self.options.max_children {
                return Err(OpenError::Children(self.options.max_children));
            }
            *opening.entry(client.clone()).or_insert(0) += 1;
            Opening {
                sessions: self,
                client: client.clone(),
            }
        };
        let mut raw = [0u8; 16];
        getrandom::fill(&mut raw).map_err(|err| OpenError::Id(err.to_string()))?;
        let id: String = raw.iter().map(|b| format!("{b:02x}")).collect();
        let mut upstream = Upstream::start(&self.spec, self.options.session.max_message_bytes)
            .await
            .map_err(|err| OpenError::Upstream(err.to_string()))?;
        let stopper = upstream.stopper();
        let relay = self.options.session.relay(
            Interceptor::reloadable(self.budget.clone())
                .for_origin(self.spec.origin())
                .for_principal(client.principal()),
        );
        let relay = match &self.options.recorder {
            Some(recorder) => relay.with_recorder(recorder.for_session(&id)),
            None => relay,
        };
        let session = Arc::new(Session {
            id: id.clone(),
            client,
            relay: Arc::new(relay),
            to_server: upstream.to_server.clone(),
            routes: Mutex::new(Routes {
                waiting: HashMap::new(),
                progress: HashMap::new(),
                streams: BTreeMap::new(),
                get: None,
                backlog: VecDeque::new(),
                backlog_bytes: 0,
                next_stream: 0,
                gets: VecDeque::new(),
                parked: HashMap::new(),
                parked_count: 0,
                expired: VecDeque::new(),
                stops: HashMap::new(),
                replay: Replay::new(self.options.replay_bytes),
            }),
            room: Notify::new(),
            closed: Notify::new(),
            stopper: Mutex::new(stopper),
            last_active: Mutex::new(Instant::now()),
            protocol: Mutex::new(None),
            initialize_key: Mutex::new(None),
            ended: AtomicBool::new(false),
            resume_window: self.options.resume_window,
            stateless: AtomicBool::new(false),
            fresh: AtomicU64::new(0),
        });
        if let Some(task) = upstream.take_task() {
            self.spawn(async move {
                let _ = task.await;
            });
        }
        self.spawn(pump(Arc::downgrade(self), session.clone(), upstream.events));
        self.spawn(sweep_timeouts(session.clone()));
        lock(&self.map).insert(id.clone(), session.clone());
        tracing::info!(session = %id, "new session");
        Ok(session)
    }

    /// Removes a session and ends it.
    pub fn end(&self, session: &Session, reason: &str) {
        lock(&self.map).remove(&session.id);
        session.end(reason, self.options.session.shutdown_grace);
    }

    /// Ends sessions idle for longer than `--session-idle-secs` with nothing in flight.
    pub fn end_idle(&self) {
        let now = Instant::now();
        let idle: Vec<Arc<Session>> = {
            let mut map = lock(&self.map);
            let ids: Vec<String> = map
                .iter()
                .filter(|(_, s)| {
                    s.relay.in_flight() == 0
                        && now.duration_since(*lock(&s.last_active)) >= self.options.idle
                })
                .map(|(id, _)| id.clone())
                .collect();
            ids.iter().filter_map(|id| map.remove(id)).collect()
        };
        for session in idle {
            tracing::info!(session = %session.id, "session idle; ending it");
            session.end(
                "the session was idle too long and was ended",
                self.options.session.shutdown_grace,
            );
        }
    }

    /// Ends every session and waits (bounded) for every task they ran.
    pub async fn shut_down(&self) {
        self.closing.store(true, Ordering::SeqCst);
        let sessions: Vec<Arc<Session>> = lock(&self.map).drain().map(|(_, s)| s).collect();
        for session in sessions {
            session.end(
                "the proxy is shutting down",
                self.options.session.shutdown_grace,
            );
        }
        let mut tasks = std::mem::take(&mut *lock(&self.tasks));
        let bound = self.options.session.shutdown_grace + Duration::from_secs(3);
        if tokio::time::timeout(bound, async { while tasks.join_next().await.is_some() {} })
            .await
            .is_err()
        {
            tracing::warn!(
                left = tasks.len(),
                "session tasks still running after the grace period; aborting them"
            );
            tasks.shutdown().await;
        }
    }
}

/// Reads the upstream's messages into the session until it ends.
async fn pump(sessions: Weak<Sessions>, session: Arc<Session>, events: queue::Receiver<Event>) {
    let to_server = session.to_server.downgrade();
    let ended =
        crate::session::server_to_client(events, &session.relay, &session, &to_server).await;
    let (reason, stopped) = ended.unwrap_or_else(|| ("the session ended".to_string(), true));
    if !stopped {
        tracing::warn!(session = %session.id, %reason, "upstream ended; ending the session");
        if let Some(sessions) = sessions.upgrade() {
            lock(&sessions.map).remove(&session.id);
        }
    }
    session.end(&reason, Duration::ZERO);
}

/// Answers a session's timed-out requests and cancels them upstream, until it ends.
async fn sweep_timeouts(session: Arc<Session>) {
    tokio::select! {
        () = crate::session::sweep_timeouts(&session.relay, &session.to_server, &session) => {}
        () = session.until_ended() => {}
    }
}
