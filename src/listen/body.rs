//! A request body, read under the message size limit and the body timeout, with room for it
//! among the bodies in flight (`--max-body-bytes-in-flight`).

use super::checks::*;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};

/// Why a body could not be read: no room for it, or the body itself.
enum Readable {
    Room(Refusal),
    Body(Box<dyn std::error::Error + Send + Sync>),
}

impl From<Box<dyn std::error::Error + Send + Sync>> for Readable {
    fn from(err: Box<dyn std::error::Error + Send + Sync>) -> Readable {
        Readable::Body(err)
    }
}

/// Bodies under this size take no room of `--max-body-bytes-in-flight`.
const SMALL_BODY: usize = 64 * 1024;
/// How long a large body waits for room before it is refused.
const BODY_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Room for a body of `bytes` among the bodies in flight: `None` for a small one; an error
/// (503, Retry-After) when none comes within [`BODY_WAIT`].
async fn body_room(
    listener: &Listener,
    bytes: usize,
) -> Result<Option<tokio::sync::OwnedSemaphorePermit>, Refusal> {
    if bytes < SMALL_BODY {
        return Ok(None);
    }
    let kib = u32::try_from(bytes.div_ceil(1024)).unwrap_or(u32::MAX);
    let acquire = listener.bodies.clone().acquire_many_owned(kib);
    match tokio::time::timeout(BODY_WAIT, acquire).await {
        Ok(Ok(permit)) => Ok(Some(permit)),
        _ => {
            let limit = listener.sessions.options().max_body_bytes_in_flight;
            tracing::warn!(
                bytes,
                limit,
                "request body refused: the listener holds as many large bodies as --max-body-bytes-in-flight allows"
            );
            let mut response = refuse(
                StatusCode::SERVICE_UNAVAILABLE,
                &format!(
                    "the proxy is reading as many large request bodies as it holds at once ({limit} bytes, --max-body-bytes-in-flight); retry in a moment"
                ),
            );
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            Err(response)
        }
    }
}

/// Reads the body under the message size limit and the body timeout, with room for it among
/// the bodies in flight (kept by the caller until the message has been passed on).
pub(super) async fn read_body(
    listener: &Listener,
    headers: &HeaderMap,
    body: Body,
) -> Result<(Vec<u8>, Option<tokio::sync::OwnedSemaphorePermit>), Refusal> {
    let options = listener.sessions.options();
    let limit = options.session.max_message_bytes;
    let too_large = || {
        refuse(
            StatusCode::PAYLOAD_TOO_LARGE,
            &format!(
                "the message is over the proxy's message size limit of {limit} bytes (raise it with --max-message-bytes)"
            ),
        )
    };
    let declared = header_str(headers, header::CONTENT_LENGTH).and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    // Room for what the body says it is; one without a length is read in room for the limit
    // only once it grows past a small body.
    let mut room = body_room(listener, declared.map_or(0, |n| n as usize)).await?;
    let read = async {
        use http_body_util::BodyExt;
        let mut body = http_body_util::Limited::new(body, limit);
        let mut bytes: Vec<u8> = Vec::with_capacity(declared.map_or(0, |n| n as usize));
        while let Some(frame) = body.frame().await {
            let frame = frame?;
            if let Ok(data) = frame.into_data() {
                bytes.extend_from_slice(&data);
                if room.is_none() && declared.is_none() && bytes.len() >= SMALL_BODY {
                    room = body_room(listener, limit).await.map_err(Readable::Room)?;
                }
            }
        }
        Ok::<_, Readable>(bytes)
    };
    match tokio::time::timeout(options.body_timeout, read).await {
        Ok(Ok(bytes)) => Ok((bytes, room)),
        Ok(Err(Readable::Room(refusal))) => Err(refusal),
        Ok(Err(Readable::Body(err))) => {
            let over = err.is::<http_body_util::LengthLimitError>();
            if over {
                Err(too_large())
            } else {
                Err(refuse(
                    StatusCode::BAD_REQUEST,
                    &format!("the request body could not be read: {err}"),
                ))
            }
        }
        Err(_) => Err(refuse(
            StatusCode::REQUEST_TIMEOUT,
            &format!(
                "the request body did not arrive within {} s",
                options.body_timeout.as_secs()
            ),
        )),
    }
}
