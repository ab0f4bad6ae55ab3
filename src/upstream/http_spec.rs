//! Where and how to reach a Streamable HTTP upstream: the URL, the static headers
//! (`--upstream-header`), the read timeout, and the errors of setting it up.

use std::time::Duration;

use url::Url;

use super::conn;

/// Where and how to reach the server.
#[derive(Debug, Clone)]
pub struct HttpSpec {
    pub url: Url,
    /// Static headers sent with every request (`--upstream-header`).
    pub headers: Vec<(String, String)>,
    /// How long one message may take to arrive once the server began sending it.
    pub read_timeout: Duration,
    /// The sign-in, shared by every session, when the upstream may require OAuth.
    #[cfg(feature = "oauth")]
    pub sign_in: Option<std::sync::Arc<super::oauth::SignIn>>,
}

/// The default for [`HttpSpec::read_timeout`].
pub const DEFAULT_READ_TIMEOUT: Duration = Duration::from_secs(60);

/// The HTTP upstream could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("--upstream-header {0:?} is not a valid header (use \"Name: value\")")]
    Header(String),
    #[error("--upstream-header {1}: the environment variable {0} is not set")]
    MissingVar(String, String),
    #[error("cannot use the upstream URL: {0}")]
    Client(#[from] conn::SetupError),
}

/// Parses `--upstream-header "Name: value"`, taking `${VAR}` in the value from the environment.
pub fn parse_header(text: &str) -> Result<(String, String), HttpError> {
    let (name, value) = text
        .split_once(':')
        .ok_or_else(|| HttpError::Header(text.to_string()))?;
    let mut out = String::new();
    let mut rest = value.trim();
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = after
            .find('}')
            .ok_or_else(|| HttpError::Header(text.to_string()))?;
        let var = &after[..end];
        let value = std::env::var(var)
            .map_err(|_| HttpError::MissingVar(var.to_string(), name.trim().to_string()))?;
        out.push_str(&value);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok((name.trim().to_string(), out))
}
