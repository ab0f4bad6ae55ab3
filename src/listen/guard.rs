//! The HTTP edge's guards, shared by the MCP endpoint (`--listen`) and the standalone metrics
//! endpoint (`--metrics ADDR`): the `Host` check against DNS rebinding, and the refusal of a
//! connection over a cap.

use std::collections::HashSet;

/// The Host header values a listener bound to `local` accepts: the loopback names, `local`
/// itself and `extra` (`--allow-host`), lower case.
pub fn allowed_hosts(local: std::net::IpAddr, extra: &[String]) -> HashSet<String> {
    let mut hosts: HashSet<String> = ["localhost", "127.0.0.1", "[::1]", "::1"]
        .iter()
        .map(|h| h.to_string())
        .collect();
    hosts.insert(local.to_string());
    hosts.extend(extra.iter().map(|h| h.to_lowercase()));
    hosts
}

/// The DNS rebinding check: exactly one Host header, whose name (or name:port) is in `hosts`.
/// `Err`: the status and message to refuse the request with.
pub fn check_host(
    hosts: &HashSet<String>,
    headers: &axum::http::HeaderMap,
) -> Result<(), (axum::http::StatusCode, String)> {
    use axum::http::{StatusCode, header};
    let mut values = headers.get_all(header::HOST).iter();
    let host = values.next().and_then(|v| v.to_str().ok());
    if values.next().is_some() {
        tracing::warn!("request refused: more than one Host header");
        return Err((
            StatusCode::BAD_REQUEST,
            "more than one Host header: send exactly one".into(),
        ));
    }
    // Lowercased only when it has capitals (a copy a request otherwise).
    let host = host.unwrap_or_default();
    let host = match host
        .bytes()
        .any(|b| b.is_ascii_uppercase() || !b.is_ascii())
    {
        true => std::borrow::Cow::Owned(host.to_lowercase()),
        false => std::borrow::Cow::Borrowed(host),
    };
    let name = match host.rsplit_once(':') {
        Some((name, port)) if port.chars().all(|c| c.is_ascii_digit()) && !name.is_empty() => name,
        _ => &host,
    };
    if !hosts.contains(name) && !hosts.contains(&*host) {
        tracing::warn!(%host, "request refused: Host not allowed");
        return Err((
            StatusCode::FORBIDDEN,
            format!(
                "Host {host:?} is not allowed (DNS rebinding protection); allow it with --allow-host"
            ),
        ));
    }
    Ok(())
}

/// Writes a 503 with `body` to a connection over a cap, and closes it.
pub(crate) fn refuse_connection_with(stream: tokio::net::TcpStream, body: &str) {
    let response = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.try_write(response.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_are_matched_without_regard_to_case() {
        let hosts = allowed_hosts(
            std::net::IpAddr::from([127, 0, 0, 1]),
            &["Example.COM".to_string()],
        );
        let check = |host: &str| {
            let mut headers = axum::http::HeaderMap::new();
            headers.insert(
                axum::http::header::HOST,
                axum::http::HeaderValue::from_str(host).expect("a header value"),
            );
            check_host(&hosts, &headers).map_err(|(status, _)| status.as_u16())
        };
        assert_eq!(check("127.0.0.1:8080"), Ok(()));
        assert_eq!(check("LOCALHOST:8080"), Ok(()));
        assert_eq!(check("localhost"), Ok(()));
        assert_eq!(check("example.com:443"), Ok(()));
        assert_eq!(check("EXAMPLE.com"), Ok(()));
        assert_eq!(check("evil.example:8080"), Err(403));
        assert_eq!(check("localhost.evil:80"), Err(403));
    }
}
