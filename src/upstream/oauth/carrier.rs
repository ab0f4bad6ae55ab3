//! The HTTP of a sign-in (discovery, registration, the token endpoint), carried by the proxy's
//! own client: rustls with the platform's roots, bounded in time and in bytes.
//!
//! Plain `http://` is refused except to a loopback host, a redirect is followed only within its
//! origin and only when the sign-in asks for it (never for the token endpoint), and an answer
//! over [`MAX_BODY`] bytes is an error.

use std::time::Duration;

use bytes::Bytes;
use hyper::StatusCode;
use hyper::header::LOCATION;
use rmcp::transport::auth::{
    OAuthHttpClient, OAuthHttpClientFuture, OAuthHttpRedirectPolicy, OAuthHttpRequest,
};
use url::Url;

use crate::upstream::body;
use crate::upstream::conn;

/// The most a metadata document, a registration or a token answer may weigh.
pub const MAX_BODY: usize = 1 << 20;
/// Redirects followed within one origin.
const MAX_REDIRECTS: usize = 5;

/// Why a sign-in request could not be made.
#[derive(Debug, thiserror::Error)]
pub enum CarryError {
    #[error(
        "refusing to sign in over plain http to {0}: an authorization server must use https (http is accepted on a loopback host only)"
    )]
    Plain(String),
    #[error("the sign-in request to {0} got no answer within {1} s")]
    Timeout(String, u64),
    #[error("the sign-in request to {0} failed: {1}")]
    Conn(String, String),
    #[error("{0} redirected to another origin ({1}); not followed")]
    CrossOrigin(String, String),
    #[error("{0} redirected more than {MAX_REDIRECTS} times")]
    TooManyRedirects(String),
    #[error("the answer of {0} is larger than {MAX_BODY} bytes or broke off: {1}")]
    Body(String, String),
    #[error("not a URL: {0}")]
    Url(String),
}

/// Whether `url` may carry a sign-in: https anywhere, http to a loopback host only.
pub fn allowed(url: &Url) -> bool {
    match url.scheme() {
        "https" => true,
        "http" => is_loopback(url),
        _ => false,
    }
}

/// `localhost`, 127.0.0.0/8 or `[::1]`.
pub fn is_loopback(url: &Url) -> bool {
    match url.host() {
        Some(url::Host::Domain(name)) => name.eq_ignore_ascii_case("localhost"),
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        None => false,
    }
}

/// Carries the sign-in's HTTP requests.
pub struct Carrier {
    /// The longest one request (with its redirects) may take.
    pub timeout: Duration,
}

impl OAuthHttpClient for Carrier {
    fn execute(&self, request: OAuthHttpRequest) -> OAuthHttpClientFuture<'_> {
        Box::pin(async move {
            let limit = request
                .timeout
                .map_or(self.timeout, |asked| asked.min(self.timeout));
            let shown = request.request.uri().to_string();
            match tokio::time::timeout(limit, carry(request, limit)).await {
                Ok(done) => done.map_err(|e| Box::new(e) as _),
                Err(_) => Err(Box::new(CarryError::Timeout(shown, limit.as_secs())) as _),
            }
        })
    }
}

async fn carry(
    request: OAuthHttpRequest,
    limit: Duration,
) -> Result<hyper::Response<Vec<u8>>, CarryError> {
    let OAuthHttpRequest {
        request,
        redirect_policy,
        ..
    } = request;
    let (parts, body) = request.into_parts();
    let first = parts.uri.to_string();
    let mut url = Url::parse(&first).map_err(|_| CarryError::Url(first.clone()))?;
    let mut method = parts.method;
    let mut body = Bytes::from(body);
    let mut headers = parts.headers;
    for hop in 0..=MAX_REDIRECTS {
        if !allowed(&url) {
            return Err(CarryError::Plain(url.to_string()));
        }
        let client = conn::Client::new(&url, limit)
            .map_err(|e| CarryError::Conn(url.to_string(), e.to_string()))?;
        let response = client
            .send(method.clone(), headers.clone(), body.clone())
            .await
            .map_err(|e| CarryError::Conn(url.to_string(), e.to_string()))?;
        let follow = redirect_policy == OAuthHttpRedirectPolicy::Follow
            && response.status.is_redirection()
            && response.status != StatusCode::NOT_MODIFIED;
        if follow {
            let location = response
                .headers
                .get(LOCATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| url.join(v).ok());
            if let Some(next) = location {
                if next.origin() != url.origin() {
                    return Err(CarryError::CrossOrigin(url.to_string(), next.to_string()));
                }
                if hop == MAX_REDIRECTS {
                    return Err(CarryError::TooManyRedirects(first));
                }
                // 303, and 301/302 after a POST, continue as a GET without a body.
                if response.status == StatusCode::SEE_OTHER
                    || (method == hyper::Method::POST
                        && matches!(
                            response.status,
                            StatusCode::MOVED_PERMANENTLY | StatusCode::FOUND
                        ))
                {
                    method = hyper::Method::GET;
                    body = Bytes::new();
                    headers.remove(hyper::header::CONTENT_TYPE);
                    headers.remove(hyper::header::CONTENT_LENGTH);
                }
                url = next;
                continue;
            }
        }
        let status = response.status;
        let answer_headers = response.headers;
        let read = body::read_limited(response.body, MAX_BODY, limit)
            .await
            .map_err(|e| CarryError::Body(url.to_string(), e.to_string()))?;
        let mut answer = hyper::Response::new(read);
        *answer.status_mut() = status;
        *answer.headers_mut() = answer_headers;
        return Ok(answer);
    }
    Err(CarryError::TooManyRedirects(first))
}
