//! Signing in to an upstream that requires OAuth 2.1, as the MCP authorization spec asks of a
//! client (2025-11-25 and 2026-07-28): the proxy signs in itself, and never passes a client's
//! token on (a token is bound to its audience).
//!
//! A `401` from the upstream starts the sign-in: the challenge's `resource_metadata` (else the
//! well-known URLs) lead to the protected resource's metadata and its authorization server's
//! (issuer checked, RFC 9207 `iss` too); the client is the pre-registered one, else a Client ID
//! Metadata Document URL where the server takes one, else one registered dynamically; the
//! authorization code flow runs with PKCE (S256) and the resource indicator, its browser step
//! on a loopback listener ([`browser`]). The tokens are kept per upstream ([`store`]), refreshed
//! before they expire, and sent to the upstream's origin only. A `403` with
//! `insufficient_scope` signs in again with the union of the scopes; a request is signed in for
//! at most [`MAX_SIGN_INS`] times, then fails with the reason.
//!
//! rmcp's OAuth client does discovery, registration, PKCE, scopes and refresh; its HTTP is
//! carried by the proxy's own client ([`carrier`]).

pub mod browser;
pub mod carrier;
pub mod store;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use hyper::header::{AUTHORIZATION, HeaderMap, HeaderValue, WWW_AUTHENTICATE};
use hyper::{Method, StatusCode};
use rmcp::transport::auth::{
    AuthError, AuthorizationCallback, AuthorizationManager, AuthorizationMetadata,
    AuthorizationRequest, AuthorizationSession, OAuthClientConfig,
};
use tokio::sync::{Mutex, watch};
use url::Url;

use super::conn::{self, ClientResponse, ConnError};
use carrier::Carrier;
use store::FileStore;

/// How many times one request may start a sign-in (a 401, or a 403 asking for more scope).
pub const MAX_SIGN_INS: u32 = 3;
/// How long the browser step may take before the sign-in is dropped.
const BROWSER_LIFETIME: Duration = Duration::from_secs(600);
/// The least time discovery and registration get while a request waits.
const MIN_DISCOVERY: Duration = Duration::from_secs(5);
/// How long `login` waits for discovery and registration.
const LOGIN_DISCOVERY: Duration = Duration::from_secs(60);
/// The longest a token refresh (or the check of a kept sign-in) may take.
const REFRESH_LIMIT: Duration = Duration::from_secs(30);
/// The longest one HTTP request of a sign-in may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);

/// A secret that never shows in logs or `Debug`.
#[derive(Clone)]
pub struct Secret(pub String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("[secret]")
    }
}

/// The client's identity and where sign-ins are kept.
#[derive(Debug, Clone)]
pub struct Options {
    /// A client registered with the authorization server ahead of time.
    pub client_id: Option<String>,
    /// Its secret (from `--upstream-client-secret-env`).
    pub client_secret: Option<Secret>,
    /// A Client ID Metadata Document URL, used as the client id where the server takes one.
    pub client_metadata_url: Option<String>,
    /// The loopback port the browser is sent back to (`None`: one the system picks).
    pub redirect_port: Option<u16>,
    /// The state directory (`$XDG_STATE_HOME/mcp-budget`).
    pub state_dir: PathBuf,
    /// How long a request waits for a sign-in in the browser before it fails (the sign-in
    /// itself goes on).
    pub wait: Duration,
    /// Whether a request may start a sign-in (a browser on this machine). A proxy that
    /// listens for clients over HTTP does not: it uses the sign-in of `mcp-budget login`.
    pub interactive: bool,
}

/// Why a request could not be signed in.
#[derive(Debug, thiserror::Error)]
pub enum SignInError {
    #[error(
        "the upstream server {url} asks to sign in; finish it in the browser (the URL is on mcp-budget's log: {auth}), or run `mcp-budget login {url}` once, then retry"
    )]
    Waiting { url: String, auth: String },
    #[error("signing in to {url} failed: {why}; run `mcp-budget login {url}` to sign in again")]
    Failed { url: String, why: String },
    #[error(
        "the upstream server {url} still refused the request (HTTP {status}) after {MAX_SIGN_INS} sign-ins; check that this account may use it (`mcp-budget logout {url}`, then `mcp-budget login {url}`)"
    )]
    Exhausted { url: String, status: u16 },
    #[error(
        "the upstream server {url} asks to sign in, and a proxy that listens for clients does not sign in on their behalf: run `mcp-budget login {url}` where it runs (as its user, with its state directory), then retry"
    )]
    NeedsLogin { url: String },
    #[error(
        "refreshing the sign-in to {url} failed for now ({why}); retry the request (the sign-in is kept)"
    )]
    Refresh { url: String, why: String },
    #[error("{0}")]
    Store(#[from] store::StoreError),
}

/// What the upstream said when it refused a request.
struct Challenge {
    /// `WWW-Authenticate`, as the server wrote it.
    header: Option<String>,
    /// The scopes a 403 `insufficient_scope` asks for (`None`: a 401).
    more_scope: Option<Vec<String>>,
}

/// A sign-in under way in the browser.
struct Pending {
    done: watch::Receiver<Option<Result<(), String>>>,
    auth_url: String,
    /// A request already waited for it in vain: the next ones are told at once.
    overdue: bool,
}

#[derive(Default)]
struct Inner {
    manager: Option<Arc<AuthorizationManager>>,
    /// Bumped whenever new tokens are in place: a request whose token is older just retries.
    generation: u64,
    /// The store was read (once, at the first request).
    restored: bool,
    pending: Option<Pending>,
    /// The scopes asked for so far (a step-up asks for their union with the new ones).
    requested: Vec<String>,
    /// The kept access token found dead (expired, its refresh refused): a sign-in kept by
    /// another process is one with another token.
    stale: Option<String>,
}

/// The sign-in of one upstream, shared by every session of the proxy.
pub struct SignIn {
    url: Url,
    options: Options,
    store: FileStore,
    carrier: Arc<Carrier>,
    inner: Mutex<Inner>,
    /// Token reads one at a time: a token about to expire is refreshed once, not by every
    /// request that finds it so.
    fetching: Mutex<()>,
    /// The token to send, while it is good: a request reads no file and takes no lock of the
    /// sign-in's. Emptied by a refusal and by every new sign-in.
    cached: std::sync::Mutex<Option<Cached>>,
}

/// The access token the sign-in file holds, and until when it is good to send.
struct Kept {
    token: String,
    until: Option<std::time::Instant>,
}

/// The token to send (`None`: none yet), of which generation, and until when.
#[derive(Clone)]
struct Cached {
    token: Option<String>,
    generation: u64,
    /// `None`: no expiry is known (it holds until the upstream refuses it).
    until: Option<std::time::Instant>,
}

impl std::fmt::Debug for SignIn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SignIn")
            .field("url", &self.url.as_str())
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl SignIn {
    pub fn new(url: Url, options: Options) -> Arc<SignIn> {
        let store = FileStore::new(&options.state_dir, &url);
        Arc::new(SignIn {
            url,
            store,
            carrier: Arc::new(Carrier {
                timeout: REQUEST_TIMEOUT,
            }),
            options,
            inner: Mutex::new(Inner::default()),
            fetching: Mutex::new(()),
            cached: std::sync::Mutex::new(None),
        })
    }

    /// Where this upstream's sign-in is kept.
    pub fn store(&self) -> &FileStore {
        &self.store
    }

    /// Sends one request to the upstream with the current token, signing in (and retrying)
    /// when the upstream refuses it for want of one.
    pub async fn send(
        self: &Arc<Self>,
        client: &conn::Client,
        method: Method,
        headers: &(dyn Fn() -> HeaderMap + Sync),
        body: Bytes,
    ) -> Result<ClientResponse, ConnError> {
        let mut sign_ins = 0;
        loop {
            let (token, generation) = self.token().await.map_err(refused)?;
            let mut sent = headers();
            if let Some(value) = token
                .as_deref()
                .and_then(|t| HeaderValue::try_from(format!("Bearer {t}")).ok())
            {
                let mut value = value;
                value.set_sensitive(true);
                sent.insert(AUTHORIZATION, value);
            }
            let response = client.send(method.clone(), sent, body.clone()).await?;
            let Some(challenge) = challenge(&response) else {
                return Ok(response);
            };
            self.forget_cached();
            let status = response.status.as_u16();
            drop(response);
            if sign_ins == MAX_SIGN_INS {
                let err = SignInError::Exhausted {
                    url: self.url.to_string(),
                    status,
                };
                tracing::warn!(%err);
                return Err(refused(err));
            }
            sign_ins += 1;
            tracing::info!(
                status,
                attempt = sign_ins,
                "the upstream server asks to sign in"
            );
            self.sign_in(challenge, generation, token.as_deref())
                .await
                .map_err(refused)?;
        }
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, Option<Cached>> {
        self.cached
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn forget_cached(&self) {
        *self.cache() = None;
    }

    /// The token to send (refreshed when it is about to expire), and the generation it is of:
    /// the cached one while it is good.
    async fn token(&self) -> Result<(Option<String>, u64), SignInError> {
        if let Some(cached) = self.cache().as_ref()
            && cached
                .until
                .is_none_or(|until| std::time::Instant::now() < until)
        {
            return Ok((cached.token.clone(), cached.generation));
        }
        let (token, generation) = self.token_now().await?;
        let until = match &token {
            Some(_) => self.kept().ok().flatten().and_then(|kept| kept.until),
            None => None,
        };
        *self.cache() = Some(Cached {
            token: token.clone(),
            generation,
            until,
        });
        Ok((token, generation))
    }

    /// [`Self::token`], asked of rmcp (which reads the file, and refreshes when it is time).
    async fn token_now(&self) -> Result<(Option<String>, u64), SignInError> {
        let (manager, generation) = {
            let mut inner = self.inner.lock().await;
            if !inner.restored {
                inner.restored = true;
                if let Some((manager, granted)) = self.restore().await? {
                    inner.manager = Some(Arc::new(manager));
                    inner.requested = granted;
                }
            }
            (inner.manager.clone(), inner.generation)
        };
        let Some(manager) = manager else {
            return Ok((None, generation));
        };
        let fetched = {
            let _one = self.fetching.lock().await;
            tokio::time::timeout(REFRESH_LIMIT, manager.get_access_token()).await
        };
        let err = match fetched {
            Ok(Ok(token)) => return Ok((Some(token), generation)),
            Ok(Err(err)) => err,
            Err(_) => {
                return Err(SignInError::Refresh {
                    url: self.url.to_string(),
                    why: format!(
                        "the token endpoint did not answer within {} s",
                        REFRESH_LIMIT.as_secs()
                    ),
                });
            }
        };
        match err {
            // For now only (the token endpoint busy, unreachable): the sign-in stays.
            AuthError::TokenRefreshFailed(why) if !for_good(&why) => Err(SignInError::Refresh {
                url: self.url.to_string(),
                why: shortened(&why),
            }),
            AuthError::CredentialStoreError(why) => Err(self.failed(why)),
            err => {
                // Expired with no refresh, or the refresh refused for good: sign in again.
                tracing::info!(%err, "the kept token cannot be used any more");
                let dead = self.kept().ok().flatten().map(|kept| kept.token);
                let mut inner = self.inner.lock().await;
                inner.stale = dead;
                if inner.generation == generation {
                    inner.manager = None;
                }
                Ok((None, generation))
            }
        }
    }

    /// The access token the file holds, and until when it may be sent without asking rmcp:
    /// rmcp refreshes it once fewer than min(60 s, half its life) remain, and so is asked a
    /// second before that (`None`: no expiry known).
    fn kept(&self) -> Result<Option<Kept>, SignInError> {
        let Some(kept) = self.store.credentials()? else {
            return Ok(None);
        };
        // The token response's fields, as the file holds them.
        let Some(response) = kept
            .token_response
            .as_ref()
            .and_then(|r| serde_json::to_value(r).ok())
        else {
            return Ok(None);
        };
        let Some(token) = response.get("access_token").and_then(|t| t.as_str()) else {
            return Ok(None);
        };
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let until = response
            .get("expires_in")
            .and_then(|life| life.as_u64())
            .zip(kept.token_received_at)
            .map(|(life, received)| {
                let margin = 60.min(life / 2) + 1;
                let left = (received + life).saturating_sub(now).saturating_sub(margin);
                std::time::Instant::now() + Duration::from_secs(left)
            });
        Ok(Some(Kept {
            token: token.to_string(),
            until,
        }))
    }

    /// Whether the file holds an access token other than `known` (the one just refused, or
    /// the one found dead).
    fn kept_token_is_new(&self, known: Option<&str>) -> Result<bool, SignInError> {
        Ok(self
            .kept()?
            .is_some_and(|kept| Some(kept.token.as_str()) != known))
    }

    /// A manager for the tokens kept from an earlier run, if there are any, with the scopes
    /// they were granted; given up (and signed in again) when discovery does not answer.
    async fn restore(&self) -> Result<Option<(AuthorizationManager, Vec<String>)>, SignInError> {
        match tokio::time::timeout(REFRESH_LIMIT, self.restore_now()).await {
            Ok(restored) => restored,
            Err(_) => {
                tracing::warn!(upstream = %self.url, "the kept sign-in could not be checked in time; signing in again");
                Ok(None)
            }
        }
    }

    async fn restore_now(
        &self,
    ) -> Result<Option<(AuthorizationManager, Vec<String>)>, SignInError> {
        let Some(kept) = self.store.credentials()? else {
            return Ok(None);
        };
        if kept.token_response.is_none() {
            return Ok(None);
        }
        let mut manager = self.manager().await?;
        // The kept tokens (and a client secret) go to the authorization server the upstream
        // names now, checked as a new sign-in checks it.
        let resolution = match manager.resolve_metadata().await {
            Ok(resolution) => resolution,
            Err(err) => {
                tracing::warn!(%err, "the kept sign-in could not be checked; signing in again");
                return Ok(None);
            }
        };
        self.check_metadata(&resolution.metadata)
            .map_err(|why| self.failed(why))?;
        manager.set_metadata(resolution.metadata);
        match manager.initialize_from_store().await {
            Ok(true) => {}
            Ok(false) => return Ok(None),
            Err(err) => {
                tracing::warn!(%err, "the kept sign-in could not be restored; signing in again");
                return Ok(None);
            }
        }
        let secret = match &self.options.client_id {
            Some(id) if *id == kept.client_id => self.options.client_secret.clone(),
            _ => self.store.registered_secret()?.map(Secret),
        };
        if let Some(secret) = secret {
            let config =
                OAuthClientConfig::new(kept.client_id.clone(), "http://127.0.0.1/callback")
                    .with_client_secret(secret.0);
            if let Err(err) = manager.configure_client(config) {
                tracing::warn!(%err, "the kept client could not be configured; signing in again");
                return Ok(None);
            }
        }
        tracing::info!(upstream = %self.url, "using the kept sign-in");
        Ok(Some((manager, kept.granted_scopes)))
    }

    /// [`check_endpoints`], and no client secret for an upstream that names no authorization
    /// server (rmcp's fallback endpoints on the upstream itself).
    fn check_metadata(&self, metadata: &AuthorizationMetadata) -> Result<(), String> {
        check_endpoints(metadata)?;
        if self.options.client_secret.is_some() && metadata.issuer.is_none() {
            return Err(format!(
                "the upstream names no authorization server with an issuer; refusing to send the client secret to {}",
                metadata.token_endpoint
            ));
        }
        Ok(())
    }

    async fn manager(&self) -> Result<AuthorizationManager, SignInError> {
        let mut manager = AuthorizationManager::new_with_oauth_http_client(
            self.url.as_str(),
            self.carrier.clone(),
        )
        .await
        .map_err(|e| self.failed(e))?;
        manager.set_credential_store(self.store.clone());
        Ok(manager)
    }

    fn failed(&self, why: impl std::fmt::Display) -> SignInError {
        SignInError::Failed {
            url: self.url.to_string(),
            why: shortened(&why.to_string()),
        }
    }

    /// Signs in after `challenge`, unless another request did since `generation`; waits for a
    /// sign-in already under way in the browser.
    async fn sign_in(
        self: &Arc<Self>,
        challenge: Challenge,
        generation: u64,
        used: Option<&str>,
    ) -> Result<(), SignInError> {
        let (mut done, auth_url) = {
            let mut inner = self.inner.lock().await;
            if inner.generation != generation {
                return Ok(());
            }
            // Scopes this sign-in already asked for: signing in again would not change the answer.
            if let Some(more) = &challenge.more_scope
                && !more.is_empty()
                && more.iter().all(|scope| inner.requested.contains(scope))
            {
                return Err(self.failed(format!(
                    "the upstream server refused the request for want of the scope {:?}, which this sign-in already asked for and the authorization server did not grant",
                    more.join(" ")
                )));
            }
            // A sign-in whose task ended without a word (it cannot, short of a panic): gone.
            if inner
                .pending
                .as_ref()
                .is_some_and(|p| p.done.borrow().is_none() && p.done.has_changed().is_err())
            {
                inner.pending = None;
            }
            match &inner.pending {
                Some(pending) if pending.overdue => {
                    return Err(SignInError::Waiting {
                        url: self.url.to_string(),
                        auth: pending.auth_url.clone(),
                    });
                }
                Some(pending) => (pending.done.clone(), pending.auth_url.clone()),
                None => {
                    // A token the server no longer takes: a refresh may be enough.
                    // Another process signed in since (`login`, a proxy beside this one).
                    let known = used.map(String::from).or_else(|| inner.stale.clone());
                    if challenge.more_scope.is_none()
                        && self.kept_token_is_new(known.as_deref())?
                        && let Some((manager, granted)) = self.restore().await?
                    {
                        inner.manager = Some(Arc::new(manager));
                        inner.requested = granted;
                        inner.generation += 1;
                        self.forget_cached();
                        return Ok(());
                    }
                    if used.is_some()
                        && challenge.more_scope.is_none()
                        && let Some(manager) = inner.manager.clone()
                        && matches!(
                            tokio::time::timeout(REFRESH_LIMIT, manager.refresh_token()).await,
                            Ok(Ok(_))
                        )
                    {
                        inner.generation += 1;
                        self.forget_cached();
                        tracing::info!("refreshed the upstream token after a 401");
                        return Ok(());
                    }
                    if !carrier::allowed(&self.url) {
                        return Err(self.failed(
                            "refusing to sign in to an upstream over plain http (its token would cross the network in clear); reach it with https",
                        ));
                    }
                    if !self.options.interactive {
                        return Err(SignInError::NeedsLogin {
                            url: self.url.to_string(),
                        });
                    }
                    let limit = self.options.wait.max(MIN_DISCOVERY);
                    let pending = self.begin_within(&mut inner, challenge, limit).await?;
                    let out = (pending.done.clone(), pending.auth_url.clone());
                    inner.pending = Some(pending);
                    out
                }
            }
        };
        let waited = tokio::time::timeout(self.options.wait, async {
            loop {
                if let Some(outcome) = done.borrow_and_update().clone() {
                    return outcome;
                }
                if done.changed().await.is_err() {
                    return Err("the sign-in was dropped".to_string());
                }
            }
        })
        .await;
        match waited {
            Ok(Ok(())) => Ok(()),
            Ok(Err(why)) => Err(self.failed(why)),
            Err(_) => {
                if let Some(pending) = self.inner.lock().await.pending.as_mut()
                    && pending.auth_url == auth_url
                {
                    pending.overdue = true;
                }
                Err(SignInError::Waiting {
                    url: self.url.to_string(),
                    auth: auth_url,
                })
            }
        }
    }

    /// [`Self::begin`], given up after `limit` (a server that never answers).
    async fn begin_within(
        self: &Arc<Self>,
        inner: &mut Inner,
        challenge: Challenge,
        limit: Duration,
    ) -> Result<Pending, SignInError> {
        match tokio::time::timeout(limit, self.begin(inner, challenge)).await {
            Ok(begun) => begun,
            Err(_) => Err(self.failed(format!(
                "its authorization server did not answer within {} s",
                limit.as_secs_f64()
            ))),
        }
    }

    /// Starts a sign-in: discovery, the client's identity, the authorization URL opened in a
    /// browser, and a task that finishes it when the browser comes back.
    async fn begin(
        self: &Arc<Self>,
        inner: &mut Inner,
        challenge: Challenge,
    ) -> Result<Pending, SignInError> {
        let mut manager = self.manager().await?;
        let resolution = manager
            .resolve_metadata_from_challenge(challenge.header.as_deref())
            .await
            .map_err(|e| self.failed(e))?;
        self.check_metadata(&resolution.metadata)
            .map_err(|why| self.failed(why))?;
        let takes_documents = resolution
            .metadata
            .additional_fields
            .get("client_id_metadata_document_supported")
            .and_then(|v| v.as_bool())
            .unwrap_or(false);
        manager.set_metadata(resolution.metadata);
        let port = self.options.redirect_port.unwrap_or(0);
        let loopback = browser::Loopback::bind(port).await.map_err(|e| {
            self.failed(format!(
                "cannot listen on 127.0.0.1:{port} for the browser: {e}"
            ))
        })?;
        let redirect_uri = loopback.redirect_uri();
        let mut request = AuthorizationRequest::new(redirect_uri.clone())
            .with_client_name("mcp-budget")
            .with_initial_scope_selection();
        if let Some(more) = &challenge.more_scope {
            let mut scopes = inner.requested.clone();
            for scope in more {
                if !scopes.contains(scope) {
                    scopes.push(scope.clone());
                }
            }
            request = request.with_scopes(scopes);
        }
        // The client, in the spec's order: pre-registered, a metadata document URL where the
        // server takes one, else registered now (its secret kept with the tokens, for refreshes).
        // A client registered now: its secret is kept with the tokens once they come.
        let mut registered: Option<Option<String>> = None;
        if let Some(id) = &self.options.client_id {
            request = request.with_preregistered_client(id.clone());
            if let Some(secret) = &self.options.client_secret {
                request = request.with_client_secret(secret.0.clone());
            }
        } else if let Some(url) = self
            .options
            .client_metadata_url
            .as_ref()
            .filter(|_| takes_documents)
        {
            request = request.with_client_metadata_url(url.clone());
        } else {
            let scopes = if request.scopes.is_empty() {
                manager.select_initial_scopes(&[]).await
            } else {
                request.scopes.clone()
            };
            let names: Vec<&str> = scopes.iter().map(String::as_str).collect();
            let client = manager
                .register_client("mcp-budget", &redirect_uri, &names)
                .await
                .map_err(|e| self.failed(e))?;
            registered = Some(client.client_secret.clone());
            request = request.with_preregistered_client(client.client_id);
            if let Some(secret) = client.client_secret {
                request = request.with_client_secret(secret);
            }
        }
        let session = AuthorizationSession::new(manager, request)
            .await
            .map_err(|(_, e)| self.failed(e))?;
        let auth_url = session.get_authorization_url().to_string();
        let state = Url::parse(&auth_url)
            .ok()
            .and_then(|u| {
                u.query_pairs()
                    .find(|(k, _)| k == "state")
                    .map(|(_, v)| v.into_owned())
            })
            .ok_or_else(|| self.failed("the authorization URL carries no state"))?;
        inner.requested = Url::parse(&auth_url)
            .ok()
            .and_then(|u| {
                u.query_pairs()
                    .find(|(k, _)| k == "scope")
                    .map(|(_, v)| v.split_whitespace().map(String::from).collect())
            })
            .unwrap_or_default();
        // Printed whatever the log level (a prompt for the user, not a log line), on stderr:
        // stdout is the protocol's.
        eprintln!(
            "mcp-budget: {} asks to sign in; open this in a browser if none opens:\n{auth_url}",
            self.url
        );
        tracing::info!(upstream = %self.url, "sign-in opened in the browser");
        browser::open(&auth_url);
        let (finished, done) = watch::channel(None);
        let this = self.clone();
        tokio::spawn(async move {
            let outcome =
                tokio::time::timeout(BROWSER_LIFETIME, this.finish(session, loopback, state))
                    .await
                    .unwrap_or_else(|_| Err("no answer came back from the browser in time".into()));
            let mut inner = this.inner.lock().await;
            inner.pending = None;
            let outcome = match (outcome, registered) {
                (Ok(manager), Some(secret)) => this
                    .store
                    .set_registered_secret(secret)
                    .map(|()| manager)
                    .map_err(|e| e.to_string()),
                (outcome, _) => outcome,
            };
            match outcome {
                Ok(manager) => {
                    inner.manager = Some(Arc::new(manager));
                    inner.stale = None;
                    inner.generation += 1;
                    this.forget_cached();
                    tracing::info!(upstream = %this.url, "signed in to the upstream server");
                    let _ = finished.send(Some(Ok(())));
                }
                Err(why) => {
                    tracing::warn!(upstream = %this.url, %why, "signing in failed");
                    let _ = finished.send(Some(Err(why)));
                }
            }
        });
        Ok(Pending {
            done,
            auth_url,
            overdue: false,
        })
    }

    /// The browser's answer, exchanged for tokens.
    async fn finish(
        &self,
        session: AuthorizationSession,
        loopback: browser::Loopback,
        state: String,
    ) -> Result<AuthorizationManager, String> {
        let url = match loopback.wait(state).await {
            browser::Redirect::Code(url) => url,
            browser::Redirect::Refused(why) => {
                return Err(format!("the authorization server refused: {why}"));
            }
        };
        let callback = AuthorizationCallback::from_redirect_url(&url).map_err(|e| e.to_string())?;
        session
            .handle_callback_with_issuer(
                &callback.code,
                &callback.csrf_token,
                callback.issuer.as_deref(),
            )
            .await
            .map_err(|e| e.to_string())?;
        Ok(session.auth_manager)
    }

    /// Signs in now, waiting for the browser up to 10 minutes (`mcp-budget login`); the
    /// sign-in kept before is replaced only once the new one is complete.
    pub async fn login(self: &Arc<Self>) -> Result<(), SignInError> {
        let client = conn::Client::new(&self.url, REQUEST_TIMEOUT).map_err(|e| self.failed(e))?;
        // Any request the server must authorize shows its challenge: a ping.
        let mut headers = HeaderMap::new();
        headers.insert(
            hyper::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        headers.insert(
            hyper::header::ACCEPT,
            HeaderValue::from_static("application/json, text/event-stream"),
        );
        let probe = client
            .send(
                Method::POST,
                headers,
                Bytes::from_static(br#"{"jsonrpc":"2.0","id":0,"method":"ping"}"#),
            )
            .await
            .map_err(|e| self.failed(e))?;
        let challenge = challenge(&probe).unwrap_or(Challenge {
            header: None,
            more_scope: None,
        });
        drop(probe);
        let pending = {
            let mut inner = self.inner.lock().await;
            inner.restored = true;
            self.begin_within(&mut inner, challenge, LOGIN_DISCOVERY)
                .await?
        };
        let mut done = pending.done;
        loop {
            if let Some(outcome) = done.borrow_and_update().clone() {
                return outcome.map_err(|why| self.failed(why));
            }
            if done.changed().await.is_err() {
                return Err(self.failed("the sign-in was dropped"));
            }
        }
    }
}

/// Whether a refresh's failure is for good (the client or grant refused), not for now.
fn for_good(why: &str) -> bool {
    ["invalid_grant", "invalid_client", "unauthorized_client"]
        .iter()
        .any(|code| why.contains(code))
}

/// A server's words in an error, at most 400 characters.
fn shortened(why: &str) -> String {
    match why.char_indices().nth(400) {
        Some((cut, _)) => format!("{}…", &why[..cut]),
        None => why.to_string(),
    }
}

fn refused(err: SignInError) -> ConnError {
    ConnError::SignIn(err.to_string())
}

/// The challenge of a response that asks for a (better) sign-in: a 401, or a 403 whose
/// `WWW-Authenticate` says `insufficient_scope`.
fn challenge(response: &ClientResponse) -> Option<Challenge> {
    let header = || {
        response
            .headers
            .get(WWW_AUTHENTICATE)
            .and_then(|v| v.to_str().ok())
            .map(String::from)
    };
    match response.status {
        StatusCode::UNAUTHORIZED => Some(Challenge {
            header: header(),
            more_scope: None,
        }),
        StatusCode::FORBIDDEN => {
            let header = header()?;
            let params = rmcp::transport::auth::WWWAuthenticateParams::parse(&header, &base());
            if !params.is_insufficient_scope() {
                return None;
            }
            let more = params
                .scope
                .as_deref()
                .map(|s| s.split_whitespace().map(String::from).collect())
                .unwrap_or_default();
            Some(Challenge {
                header: Some(header),
                more_scope: Some(more),
            })
        }
        _ => None,
    }
}

fn base() -> Url {
    Url::parse("http://127.0.0.1/").unwrap_or_else(|_| unreachable!("a constant URL"))
}

/// Refuses metadata whose endpoints would receive a code or a secret over plain http (off
/// loopback) or on a host the issuer does not share a domain with.
fn check_endpoints(metadata: &AuthorizationMetadata) -> Result<(), String> {
    let issuer = metadata
        .issuer
        .as_deref()
        .and_then(|issuer| Url::parse(issuer).ok());
    let endpoints = [
        (
            "authorization",
            Some(metadata.authorization_endpoint.as_str()),
        ),
        ("token", Some(metadata.token_endpoint.as_str())),
        ("registration", metadata.registration_endpoint.as_deref()),
    ];
    for (name, endpoint) in endpoints {
        let Some(endpoint) = endpoint else { continue };
        let url = Url::parse(endpoint)
            .map_err(|_| format!("the {name} endpoint {endpoint:?} is not a URL"))?;
        if !carrier::allowed(&url) {
            return Err(format!(
                "the {name} endpoint {endpoint} is not https (http is accepted on a loopback host only)"
            ));
        }
        if name != "authorization"
            && let Some(issuer) = &issuer
            && !same_site(issuer, &url)
        {
            return Err(format!(
                "the authorization server {issuer} names a {name} endpoint on another host ({endpoint}); refusing to send it a code or a secret"
            ));
        }
    }
    Ok(())
}

/// Whether two URLs' hosts are the same, or share their parent domain (`auth.example.com`
/// and `api.example.com`).
fn same_site(a: &Url, b: &Url) -> bool {
    let (Some(x), Some(y)) = (a.host_str(), b.host_str()) else {
        return false;
    };
    if x.eq_ignore_ascii_case(y) {
        return true;
    }
    let parent = |host: &str| -> Option<String> {
        let (_, rest) = host.split_once('.')?;
        (rest.contains('.') && !rest.chars().all(|c| c.is_ascii_digit() || c == '.'))
            .then(|| rest.to_ascii_lowercase())
    };
    matches!((parent(x), parent(y)), (Some(p), Some(q)) if p == q)
        || parent(x).is_some_and(|p| p == y.to_ascii_lowercase())
        || parent(y).is_some_and(|q| q == x.to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(text: &str) -> Url {
        Url::parse(text).unwrap()
    }

    #[test]
    fn endpoints_on_the_issuers_site_only() {
        assert!(same_site(
            &url("https://auth.example.com"),
            &url("https://auth.example.com/t")
        ));
        assert!(same_site(
            &url("https://auth.example.com"),
            &url("https://api.example.com/t")
        ));
        assert!(same_site(
            &url("https://example.com"),
            &url("https://login.example.com/t")
        ));
        assert!(!same_site(
            &url("https://auth.example.com"),
            &url("https://evil.test/t")
        ));
        assert!(!same_site(
            &url("http://127.0.0.1:1"),
            &url("http://127.0.0.2:1")
        ));
        let mut metadata = AuthorizationMetadata::default();
        metadata.issuer = Some("https://auth.example.com".into());
        metadata.authorization_endpoint = "https://auth.example.com/authorize".into();
        metadata.token_endpoint = "https://evil.test/token".into();
        let refused = check_endpoints(&metadata).unwrap_err();
        assert!(refused.contains("another host"), "{refused}");
        metadata.token_endpoint = "http://auth.example.com/token".into();
        assert!(
            check_endpoints(&metadata)
                .unwrap_err()
                .contains("not https")
        );
        metadata.token_endpoint = "https://auth.example.com/token".into();
        check_endpoints(&metadata).unwrap();
    }
}
