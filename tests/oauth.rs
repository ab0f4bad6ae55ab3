//! mcp-budget signing in to an OAuth-protected upstream (`--upstream`), attacked: a redirect
//! with a wrong state, a code replayed, an authorization server of another issuer, a token
//! endpoint on another host, a resource that does not match, a token file others can read,
//! an authorization server that never answers, a flood of 401s, and a sign-in left waiting.
//!
//! The upstream and its authorization server are one axum app on 127.0.0.1 (the MCP endpoint
//! requires a token it issued). The browser is a script that writes the authorization URL to
//! a file; the test then plays the browser, so that it can also play the attacker.
#![cfg(feature = "oauth")]

mod common;

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use common::{INITIALIZE, INITIALIZED, PATIENCE, Peer, proxy_bin};
use tokio::process::Command;

/// How the test server misbehaves.
#[derive(Default)]
struct Faults {
    /// The metadata names another issuer than the server it came from.
    other_issuer: bool,
    /// The token endpoint is on another host (`localhost`, not `127.0.0.1`).
    token_elsewhere: bool,
    /// The protected resource metadata names another resource.
    other_resource: bool,
    /// The authorization server's metadata never answers.
    hang: bool,
    /// The MCP endpoint refuses every token.
    refuse_all: bool,
    /// Tokens live 2 s, and the token endpoint is busy for refreshes.
    busy_refresh: bool,
    /// Tokens live 2 s and come with no refresh token.
    no_refresh: bool,
    /// No protected resource or authorization server metadata at all.
    no_metadata: bool,
}

#[derive(Default)]
struct Server {
    base: String,
    faults: Faults,
    authorizations: AtomicUsize,
    code_grants: AtomicUsize,
    refresh_grants: AtomicUsize,
    rejected_codes: AtomicUsize,
    /// Codes issued and not yet exchanged.
    codes: Mutex<HashMap<String, ()>>,
    tokens: Mutex<Vec<String>>,
    next: AtomicUsize,
    mcp_with_token: AtomicBool,
}

impl Server {
    fn issue(&self, prefix: &str) -> String {
        format!("{prefix}-{}", self.next.fetch_add(1, Ordering::SeqCst))
    }
}

fn query(uri: &Uri) -> HashMap<String, String> {
    url::form_urlencoded::parse(uri.query().unwrap_or("").as_bytes())
        .into_owned()
        .collect()
}

fn json(status: StatusCode, value: serde_json::Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        value.to_string(),
    )
        .into_response()
}

async fn start(faults: Faults) -> Arc<Server> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = Arc::new(Server {
        base: format!("http://127.0.0.1:{port}"),
        faults,
        ..Default::default()
    });
    let s = server.clone();
    let prm = move || {
        let s = s.clone();
        async move {
            if s.faults.no_metadata {
                return StatusCode::NOT_FOUND.into_response();
            }
            let resource = if s.faults.other_resource {
                "https://evil.example/mcp".to_string()
            } else {
                format!("{}/mcp", s.base)
            };
            json(
                StatusCode::OK,
                serde_json::json!({"resource": resource, "authorization_servers": [s.base]}),
            )
        }
    };
    let s = server.clone();
    let metadata = move || {
        let s = s.clone();
        async move {
            if s.faults.hang {
                std::future::pending::<()>().await;
            }
            if s.faults.no_metadata {
                return StatusCode::NOT_FOUND.into_response();
            }
            let issuer = if s.faults.other_issuer {
                "https://attacker.example".to_string()
            } else {
                s.base.clone()
            };
            let port = s.base.rsplit(':').next().unwrap_or_default().to_string();
            let token = if s.faults.token_elsewhere {
                format!("http://localhost:{port}/token")
            } else {
                format!("{}/token", s.base)
            };
            json(
                StatusCode::OK,
                serde_json::json!({
                    "issuer": issuer,
                    "authorization_endpoint": format!("{}/authorize", s.base),
                    "token_endpoint": token,
                    "registration_endpoint": format!("{}/register", s.base),
                    "response_types_supported": ["code"],
                    "grant_types_supported": ["authorization_code", "refresh_token"],
                    "code_challenge_methods_supported": ["S256"],
                    "token_endpoint_auth_methods_supported": ["none"],
                    "authorization_response_iss_parameter_supported": true
                }),
            )
        }
    };
    let register = |body: Bytes| async move {
        let asked: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
        json(
            StatusCode::CREATED,
            serde_json::json!({
                "client_id": "registered-client",
                "redirect_uris": asked["redirect_uris"],
                "token_endpoint_auth_method": "none"
            }),
        )
    };
    let s = server.clone();
    let authorize = move |uri: Uri| {
        let s = s.clone();
        async move {
            s.authorizations.fetch_add(1, Ordering::SeqCst);
            let q = query(&uri);
            let code = s.issue("code");
            s.codes.lock().unwrap().insert(code.clone(), ());
            let mut to = url::Url::parse(&q["redirect_uri"]).unwrap();
            to.query_pairs_mut()
                .append_pair("code", &code)
                .append_pair("state", &q["state"])
                .append_pair("iss", &s.base);
            (StatusCode::FOUND, [(header::LOCATION, to.to_string())]).into_response()
        }
    };
    let s = server.clone();
    let token = move |body: Bytes| {
        let s = s.clone();
        async move {
            let form: HashMap<String, String> =
                url::form_urlencoded::parse(&body).into_owned().collect();
            match form.get("grant_type").map(String::as_str) {
                Some("authorization_code") => {
                    s.code_grants.fetch_add(1, Ordering::SeqCst);
                    let known = form
                        .get("code")
                        .is_some_and(|code| s.codes.lock().unwrap().remove(code).is_some());
                    if !known {
                        s.rejected_codes.fetch_add(1, Ordering::SeqCst);
                        return json(
                            StatusCode::BAD_REQUEST,
                            serde_json::json!({"error": "invalid_grant"}),
                        );
                    }
                }
                Some("refresh_token") => {
                    s.refresh_grants.fetch_add(1, Ordering::SeqCst);
                    if s.faults.busy_refresh {
                        return json(
                            StatusCode::SERVICE_UNAVAILABLE,
                            serde_json::json!({"error": "temporarily_unavailable"}),
                        );
                    }
                }
                _ => {
                    return json(
                        StatusCode::BAD_REQUEST,
                        serde_json::json!({"error": "unsupported_grant_type"}),
                    );
                }
            }
            let access = s.issue("token");
            s.tokens.lock().unwrap().push(access.clone());
            let short = s.faults.busy_refresh || s.faults.no_refresh;
            let mut answer = serde_json::json!({
                "access_token": access,
                "token_type": "Bearer",
                "expires_in": if short { 2 } else { 3600 },
            });
            if !s.faults.no_refresh {
                answer["refresh_token"] = s.issue("refresh").into();
            }
            json(StatusCode::OK, answer)
        }
    };
    let s = server.clone();
    let mcp = move |headers: HeaderMap, body: Bytes| {
        let s = s.clone();
        async move {
            let bearer = headers
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "))
                .map(String::from);
            let valid = bearer
                .as_ref()
                .is_some_and(|t| s.tokens.lock().unwrap().contains(t));
            if bearer.is_some() {
                s.mcp_with_token.store(true, Ordering::SeqCst);
            }
            if !valid || s.faults.refuse_all {
                let challenge = format!(
                    "Bearer resource_metadata=\"{}/.well-known/oauth-protected-resource/mcp\"",
                    s.base
                );
                return (
                    StatusCode::UNAUTHORIZED,
                    [(header::WWW_AUTHENTICATE, challenge)],
                )
                    .into_response();
            }
            let message: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
            let Some(id) = message.get("id").cloned() else {
                return StatusCode::ACCEPTED.into_response();
            };
            let result = match message["method"].as_str() {
                Some("initialize") => serde_json::json!({
                    "protocolVersion": "2025-06-18",
                    "capabilities": {"tools": {}},
                    "serverInfo": {"name": "signed-in", "version": "1"}
                }),
                Some("tools/list") => serde_json::json!({"tools": [{
                    "name": "echo",
                    "inputSchema": {"type": "object"}
                }]}),
                Some("tools/call") => serde_json::json!({
                    "content": [{"type": "text", "text": "signed in"}]
                }),
                _ => serde_json::json!({}),
            };
            json(
                StatusCode::OK,
                serde_json::json!({"jsonrpc": "2.0", "id": id, "result": result}),
            )
        }
    };
    let app = axum::Router::new()
        .route(
            "/.well-known/oauth-protected-resource/mcp",
            axum::routing::get(prm.clone()),
        )
        .route(
            "/.well-known/oauth-protected-resource",
            axum::routing::get(prm),
        )
        .route(
            "/.well-known/oauth-authorization-server",
            axum::routing::get(metadata),
        )
        .route("/register", axum::routing::post(register))
        .route("/authorize", axum::routing::get(authorize))
        .route("/token", axum::routing::post(token))
        .route("/mcp", axum::routing::post(mcp));
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    server
}

/// A fresh state directory and a browser script that writes each URL it is given to `urls`.
struct Home {
    dir: PathBuf,
}

impl Home {
    fn new(name: &str) -> Home {
        let dir =
            std::env::temp_dir().join(format!("mcp-budget-oauth-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let browser = dir.join("browser.sh");
        std::fs::write(
            &browser,
            format!(
                "#!/bin/sh\nprintf '%s\\n' \"$1\" >> '{}'\n",
                dir.join("urls").display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&browser, std::fs::Permissions::from_mode(0o755)).unwrap();
        Home { dir }
    }

    fn proxy(&self, upstream: &str, more: &[&str]) -> Peer {
        let mut command = Command::new(proxy_bin());
        command
            .args(["--policy", "none", "--upstream", upstream])
            .args(more)
            .env("XDG_STATE_HOME", self.dir.join("state"))
            .env("BROWSER", self.dir.join("browser.sh"))
            .env("MCP_BUDGET_TEST_SECRET", "s3cret")
            .env("RUST_LOG", "info");
        Peer::from_command(command)
    }

    /// The `n`-th authorization URL the proxy opened (waits for it).
    async fn url(&self, n: usize) -> String {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            let urls = std::fs::read_to_string(self.dir.join("urls")).unwrap_or_default();
            if let Some(url) = urls.lines().nth(n) {
                return url.to_string();
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the proxy opened no authorization URL #{n}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn opened(&self) -> usize {
        std::fs::read_to_string(self.dir.join("urls"))
            .unwrap_or_default()
            .lines()
            .count()
    }

    fn token_files(&self) -> Vec<PathBuf> {
        std::fs::read_dir(self.dir.join("state/mcp-budget/oauth"))
            .map(|dir| {
                dir.filter_map(Result::ok)
                    .map(|e| e.path())
                    .filter(|p| p.extension().is_some_and(|e| e == "json"))
                    .collect()
            })
            .unwrap_or_default()
    }
}

impl Drop for Home {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn http() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

/// `echo` called as id 2.
const CALL_ECHO: &str =
    r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo","arguments":{}}}"#;

/// Plays the browser through the rest of a sign-in: the authorization server's approval, then
/// its redirect to the proxy's loopback listener, which takes it.
async fn come_back(url: &str) {
    let redirect = approve(url).await;
    assert_eq!(
        http().get(&redirect).send().await.unwrap().status(),
        StatusCode::OK
    );
}

/// The next answer is the signed-in server's to initialize.
async fn signed_in(proxy: &mut Peer) {
    let answer = proxy.recv_json().await;
    assert_eq!(
        answer["result"]["serverInfo"]["name"], "signed-in",
        "{answer}"
    );
}

/// Plays the browser: the authorization server's redirect, as it sends it back.
async fn approve(url: &str) -> String {
    let answer = http().get(url).send().await.unwrap();
    assert_eq!(
        answer.status(),
        StatusCode::FOUND,
        "the authorization server's answer"
    );
    answer.headers()[header::LOCATION]
        .to_str()
        .unwrap()
        .to_string()
}

fn error_text(answer: &serde_json::Value) -> String {
    answer["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[tokio::test]
async fn signs_in_once_refuses_a_wrong_state_and_a_replayed_code_and_keeps_the_sign_in() {
    let server = start(Faults::default()).await;
    let upstream = format!("{}/mcp", server.base);
    let home = Home::new("main");
    let mut proxy = home.proxy(&upstream, &[]);
    proxy.send(INITIALIZE).await;
    let url = home.url(0).await;
    assert!(
        url.starts_with(&format!("{}/authorize?", server.base)),
        "{url}"
    );
    let redirect = approve(&url).await;

    // Another state at the loopback changes nothing, and the sign-in still waits.
    let mut forged = url::Url::parse(&redirect).unwrap();
    let pairs: Vec<(String, String)> = forged.query_pairs().into_owned().collect();
    forged.query_pairs_mut().clear();
    for (key, value) in &pairs {
        let value = if key == "state" { "forged" } else { value };
        forged.query_pairs_mut().append_pair(key, value);
    }
    let refused = http().get(forged.as_str()).send().await.unwrap();
    assert_eq!(refused.status(), StatusCode::BAD_REQUEST);
    assert_eq!(
        server.code_grants.load(Ordering::SeqCst),
        0,
        "no exchange for a forged state"
    );

    let back = http().get(&redirect).send().await.unwrap();
    assert_eq!(back.status(), StatusCode::OK);
    signed_in(&mut proxy).await;
    proxy.send(INITIALIZED).await;
    proxy.send(CALL_ECHO).await;
    let called = proxy.recv_json().await;
    assert_eq!(
        called["result"]["content"][0]["text"], "signed in",
        "{called}"
    );
    assert_eq!(server.authorizations.load(Ordering::SeqCst), 1);
    assert_eq!(server.code_grants.load(Ordering::SeqCst), 1);

    // The code replayed: the loopback took one code and closed.
    let replayed = http().get(&redirect).send().await;
    assert!(
        replayed.is_err(),
        "the loopback still listens: {replayed:?}"
    );
    assert_eq!(server.code_grants.load(Ordering::SeqCst), 1);

    // Kept, privately: a second proxy signs in with it, no browser.
    let files = home.token_files();
    assert_eq!(files.len(), 1, "{files:?}");
    let mode = std::fs::metadata(&files[0]).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let kept = std::fs::read_to_string(&files[0]).unwrap();
    assert!(kept.contains(&upstream), "the file names its upstream");
    let mut again = home.proxy(&upstream, &[]);
    again.send(INITIALIZE).await;
    signed_in(&mut again).await;
    assert_eq!(home.opened(), 1, "the kept sign-in was used");
    let log = {
        again.close_stdin();
        again.wait().await;
        again.stderr().await
    };
    for secret in server.tokens.lock().unwrap().iter() {
        assert!(!log.contains(secret.as_str()), "a token in the log: {log}");
    }

    // A file others can read is refused, with the fix named.
    std::fs::set_permissions(&files[0], std::fs::Permissions::from_mode(0o644)).unwrap();
    let mut exposed = home.proxy(&upstream, &[]);
    exposed.send(INITIALIZE).await;
    let answer = exposed.recv_json().await;
    let why = error_text(&answer);
    assert!(why.contains("chmod 600"), "{answer}");

    // logout forgets it.
    std::fs::set_permissions(&files[0], std::fs::Permissions::from_mode(0o600)).unwrap();
    let out = std::process::Command::new(proxy_bin())
        .args(["logout", &upstream])
        .env("XDG_STATE_HOME", home.dir.join("state"))
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(home.token_files().is_empty());
}

/// Starts a proxy in front of a server with `faults`, sends initialize, and returns the error
/// it answers with (no browser ever completes).
async fn refused_with(faults: Faults, name: &str, more: &[&str]) -> (Arc<Server>, String, Home) {
    let server = start(faults).await;
    let home = Home::new(name);
    let mut proxy = home.proxy(&format!("{}/mcp", server.base), more);
    proxy.send(INITIALIZE).await;
    let answer = proxy.recv_json().await;
    assert!(answer.get("result").is_none(), "{answer}");
    (server, error_text(&answer), home)
}

#[tokio::test]
async fn an_authorization_server_of_another_issuer_is_refused() {
    let (server, why, home) = refused_with(
        Faults {
            other_issuer: true,
            ..Default::default()
        },
        "issuer",
        &[],
    )
    .await;
    assert!(why.contains("issuer"), "{why}");
    assert_eq!(server.authorizations.load(Ordering::SeqCst), 0);
    assert_eq!(home.opened(), 0);
}

#[tokio::test]
async fn a_token_endpoint_on_another_host_is_refused() {
    let (server, why, home) = refused_with(
        Faults {
            token_elsewhere: true,
            ..Default::default()
        },
        "elsewhere",
        &[],
    )
    .await;
    assert!(why.contains("another host"), "{why}");
    assert!(why.contains("mcp-budget login"), "{why}");
    assert_eq!(server.code_grants.load(Ordering::SeqCst), 0);
    assert_eq!(home.opened(), 0);
}

#[tokio::test]
async fn a_resource_that_does_not_match_is_refused() {
    let (server, why, home) = refused_with(
        Faults {
            other_resource: true,
            ..Default::default()
        },
        "resource",
        &[],
    )
    .await;
    assert!(why.to_lowercase().contains("resource"), "{why}");
    assert_eq!(server.authorizations.load(Ordering::SeqCst), 0);
    assert_eq!(home.opened(), 0);
}

#[tokio::test]
async fn a_hung_authorization_server_is_bounded() {
    let started = tokio::time::Instant::now();
    let (_server, why, _home) = refused_with(
        Faults {
            hang: true,
            ..Default::default()
        },
        "hang",
        &["--upstream-sign-in-wait-secs", "1"],
    )
    .await;
    assert!(why.contains("did not answer"), "{why}");
    assert!(started.elapsed() < PATIENCE);
}

#[tokio::test]
async fn a_flood_of_401s_ends_with_the_reason() {
    let server = start(Faults {
        refuse_all: true,
        ..Default::default()
    })
    .await;
    let home = Home::new("flood");
    let mut proxy = home.proxy(&format!("{}/mcp", server.base), &[]);
    proxy.send(INITIALIZE).await;
    // The browser approves whatever it is asked to, as often as it is asked.
    let browse = {
        let dir = home.dir.clone();
        tokio::spawn(async move {
            let mut done = 0;
            loop {
                let urls = std::fs::read_to_string(dir.join("urls")).unwrap_or_default();
                for url in urls.lines().skip(done) {
                    let redirect = approve(url).await;
                    let _ = http().get(&redirect).send().await;
                    done += 1;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    let answer = proxy.recv_json().await;
    browse.abort();
    let why = error_text(&answer);
    assert!(why.contains("still refused"), "{answer}");
    assert!(why.contains("mcp-budget login"), "{answer}");
    assert!(
        server.mcp_with_token.load(Ordering::SeqCst),
        "a token was sent"
    );
    let authorizations = server.authorizations.load(Ordering::SeqCst);
    assert!(
        (1..=3).contains(&authorizations),
        "{authorizations} authorizations"
    );
}

#[tokio::test]
async fn a_sign_in_left_waiting_names_login_and_finishes_later() {
    let server = start(Faults::default()).await;
    let upstream = format!("{}/mcp", server.base);
    let home = Home::new("waiting");
    let mut proxy = home.proxy(&upstream, &["--upstream-sign-in-wait-secs", "0.5"]);
    proxy.send(INITIALIZE).await;
    let answer = proxy.recv_json().await;
    let why = error_text(&answer);
    assert!(
        why.contains(&format!("mcp-budget login {upstream}")),
        "{answer}"
    );
    // The browser comes back later: the sign-in finishes, and the next request goes through.
    let url = home.url(0).await;
    come_back(&url).await;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while home.token_files().is_empty() || server.code_grants.load(Ordering::SeqCst) == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the sign-in did not finish"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    proxy
        .send(&INITIALIZE.replace(r#""id":1"#, r#""id":3"#))
        .await;
    signed_in(&mut proxy).await;
    assert_eq!(server.authorizations.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_busy_token_endpoint_at_refresh_keeps_the_sign_in() {
    let server = start(Faults {
        busy_refresh: true,
        ..Default::default()
    })
    .await;
    let home = Home::new("busy");
    let mut proxy = home.proxy(&format!("{}/mcp", server.base), &[]);
    proxy.send(INITIALIZE).await;
    come_back(&home.url(0).await).await;
    signed_in(&mut proxy).await;
    proxy.send(INITIALIZED).await;
    // Past the token's life: the refresh is refused for now.
    for _ in 0..100 {
        proxy.send(CALL_ECHO).await;
        let called = proxy.recv_json().await;
        if called.get("error").is_some() {
            let why = error_text(&called);
            assert!(why.contains("refreshing the sign-in"), "{called}");
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(server.refresh_grants.load(Ordering::SeqCst) >= 1);
    assert_eq!(
        server.authorizations.load(Ordering::SeqCst),
        1,
        "no new sign-in"
    );
    assert_eq!(home.opened(), 1, "no browser opened again");
}

#[tokio::test]
async fn a_listening_proxy_asks_for_login_and_then_uses_it() {
    let server = start(Faults::default()).await;
    let upstream = format!("{}/mcp", server.base);
    let home = Home::new("listen");
    let state = home.dir.join("state");
    let browser = home.dir.join("browser.sh");
    let env = [
        ("XDG_STATE_HOME", state.to_str().unwrap()),
        ("BROWSER", browser.to_str().unwrap()),
    ];
    let (_child, url) = common::listen(&["--policy", "none", "--upstream", &upstream], &env).await;
    let client = http();
    let refused = common::mcp_post(&client, &url, None, INITIALIZE)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        refused.contains(&format!("mcp-budget login {upstream}")),
        "{refused}"
    );
    assert!(
        !refused.contains("/authorize"),
        "no authorization URL for a client: {refused}"
    );
    assert_eq!(home.opened(), 0, "no browser opened for a client's request");
    assert_eq!(server.authorizations.load(Ordering::SeqCst), 0);

    // `login` where the proxy runs: then the listening proxy uses that sign-in.
    let mut login = Command::new(proxy_bin());
    login
        .args(["login", &upstream])
        .env("XDG_STATE_HOME", &state)
        .env("BROWSER", &browser)
        .kill_on_drop(true);
    let mut login = login.spawn().unwrap();
    come_back(&home.url(0).await).await;
    let status = tokio::time::timeout(PATIENCE, login.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success());
    let session = common::mcp_initialize(&client, &url).await;
    assert!(!session.is_empty());
    assert_eq!(server.authorizations.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn an_expired_token_with_no_refresh_signs_in_again() {
    let server = start(Faults {
        no_refresh: true,
        ..Default::default()
    })
    .await;
    let home = Home::new("expired");
    let mut proxy = home.proxy(&format!("{}/mcp", server.base), &[]);
    proxy.send(INITIALIZE).await;
    come_back(&home.url(0).await).await;
    signed_in(&mut proxy).await;
    proxy.send(INITIALIZED).await;
    // Past its life, the token cannot be refreshed: the browser is asked again, once.
    tokio::time::sleep(Duration::from_millis(2100)).await;
    proxy.send(CALL_ECHO).await;
    come_back(&home.url(1).await).await;
    let called = proxy.recv_json().await;
    assert_eq!(
        called["result"]["content"][0]["text"], "signed in",
        "{called}"
    );
    assert_eq!(server.authorizations.load(Ordering::SeqCst), 2);
    assert_eq!(home.opened(), 2);
}

#[tokio::test]
async fn a_client_secret_goes_to_no_authorization_server_the_upstream_does_not_name() {
    let (server, why, home) = refused_with(
        Faults {
            no_metadata: true,
            ..Default::default()
        },
        "nometadata",
        &[
            "--upstream-client-id",
            "pre-registered",
            "--upstream-client-secret-env",
            "MCP_BUDGET_TEST_SECRET",
        ],
    )
    .await;
    assert!(why.contains("refusing to send the client secret"), "{why}");
    assert_eq!(server.code_grants.load(Ordering::SeqCst), 0);
    assert_eq!(home.opened(), 0);
}

#[tokio::test]
async fn the_redirect_comes_back_to_the_port_given() {
    let server = start(Faults::default()).await;
    let home = Home::new("port");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut proxy = home.proxy(
        &format!("{}/mcp", server.base),
        &["--upstream-redirect-port", &port.to_string()],
    );
    proxy.send(INITIALIZE).await;
    let url = url::Url::parse(&home.url(0).await).unwrap();
    let redirect_uri = url
        .query_pairs()
        .find(|(k, _)| k == "redirect_uri")
        .map(|(_, v)| v.into_owned());
    assert_eq!(
        redirect_uri,
        Some(format!("http://127.0.0.1:{port}/callback"))
    );
    come_back(url.as_str()).await;
    signed_in(&mut proxy).await;
}

#[test]
fn sign_in_flags_without_an_upstream_are_refused() {
    let out = std::process::Command::new(proxy_bin())
        .args(["--upstream-client-id", "x", "--", "true"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(text.contains("--upstream URL"), "{text}");
    let out = std::process::Command::new(proxy_bin())
        .args([
            "--upstream",
            "http://127.0.0.1:9/mcp",
            "--upstream-client-metadata-url",
            "http://x/",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(text.contains("https URL with a path"), "{text}");
}
