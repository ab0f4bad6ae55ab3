//! Cursors: opaque to the client, stable, and verifiable.
//!
//! A cursor carries the page position, a digest of what defines the selection (tool, upstream
//! arguments, horizon, filters) and a MAC over both under the proxy's key. So a cursor that is
//! malformed, altered, or minted for another query is refused instead of silently paging the
//! wrong list. The key is random per process unless the policy names an environment variable
//! holding one, so that several proxy instances accept each other's cursors.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, Mac};
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::page::Position;

type HmacSha256 = Hmac<Sha256>;

/// What identifies the selection a cursor pages through.
pub type SelectionDigest = [u8; 16];

/// What the model reads when a cursor was minted under another key.
pub const OTHER_KEY: &str = "after was issued by another mcp-budget instance, or before this proxy's cursor key changed (for instance a restart without a persistent key); call again without after to start from the first page";

/// Why a cursor was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CursorError {
    #[error("malformed or altered cursor")]
    Invalid,
    #[error("cursor minted for another query")]
    OtherQuery,
    #[error("cursor minted under another key")]
    OtherKey,
}

/// Why a sealed token ([`CursorKey::seal`]) was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SealError {
    #[error("malformed or altered token")]
    Invalid,
    #[error("token sealed under another key")]
    OtherKey,
    #[error("token sealed for another principal")]
    OtherOwner,
}

/// Mints and verifies cursors under one key.
#[derive(Clone)]
pub struct CursorKey {
    mac: HmacSha256,
    /// A short public id of the key, carried by each cursor, so that a cursor from another
    /// key (another instance, or before a restart with a random key) is told apart from an
    /// altered one.
    id: String,
}

impl std::fmt::Debug for CursorKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CursorKey(..)")
    }
}

const MAC_LEN: usize = 16;

impl CursorKey {
    /// A key derived from secret bytes (any length).
    pub fn from_secret(secret: &[u8]) -> CursorKey {
        let derived = Sha256::digest([b"mcp-budget cursor v1:".as_slice(), secret].concat());
        let mac = HmacSha256::new_from_slice(&derived).unwrap_or_else(|_| {
            // HMAC takes keys of any length; this branch cannot be reached.
            unreachable!("HMAC accepts any key length")
        });
        let id = hex(&Sha256::digest([b"mcp-budget key id:".as_slice(), &derived].concat())[..4]);
        CursorKey { mac, id }
    }

    /// A fresh random key.
    pub fn random() -> CursorKey {
        let mut secret = [0u8; 32];
        if getrandom::fill(&mut secret).is_err() {
            // No OS randomness: fall back to time and pid, still unguessable enough for a
            // tamper check that only protects a client from its own mistakes.
            let seed = format!("{:?}{}", std::time::SystemTime::now(), std::process::id());
            secret.copy_from_slice(&Sha256::digest(seed.as_bytes()));
        }
        CursorKey::from_secret(&secret)
    }

    fn tag(&self, payload: &[u8]) -> [u8; MAC_LEN] {
        let mut mac = self.mac.clone();
        mac.update(payload);
        let full = mac.finalize().into_bytes();
        let mut tag = [0u8; MAC_LEN];
        tag.copy_from_slice(&full[..MAC_LEN]);
        tag
    }

    /// The key's short public id (names its entries in a shared cache, so that replicas of
    /// another key never read them).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// A 32-byte key for `purpose` and `owner`, derived from this one (HMAC as the PRF, as
    /// HKDF's expand step): whoever holds the cursor key derives it, and the key of one owner
    /// tells nothing of another's.
    pub fn derive(&self, purpose: &str, owner: &str) -> [u8; 32] {
        let mut mac = self.mac.clone();
        mac.update(b"mcp-budget derive v1\0");
        mac.update(purpose.as_bytes());
        mac.update(b"\0");
        mac.update(owner.as_bytes());
        mac.finalize().into_bytes().into()
    }

    /// An 8-byte public digest of `owner` (as tokens carry it), in hex.
    pub fn owner_digest(owner: &str) -> String {
        owner_tag(owner)
    }

    /// `body` sealed under the key's MAC for `purpose`, bound to `owner` (a principal): only
    /// [`CursorKey::unseal`] with the same purpose and owner opens it. The body is readable (a
    /// MAC, not a cipher): it must hold nothing the client may not see.
    pub fn seal(&self, purpose: &str, owner: &str, body: &[u8]) -> String {
        let payload = [
            self.id.as_bytes(),
            b".",
            owner_tag(owner).as_bytes(),
            b".",
            body,
        ]
        .concat();
        let tag = self.tag(&[purpose.as_bytes(), b"\0", &payload].concat());
        format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(payload),
            URL_SAFE_NO_PAD.encode(tag)
        )
    }

    /// The body of a token [`CursorKey::seal`] made for `purpose` and `owner`.
    pub fn unseal(&self, purpose: &str, owner: &str, token: &str) -> Result<Vec<u8>, SealError> {
        let (payload, tag) = token.split_once('.').ok_or(SealError::Invalid)?;
        let payload = URL_SAFE_NO_PAD
            .decode(payload)
            .map_err(|_| SealError::Invalid)?;
        let tag = URL_SAFE_NO_PAD
            .decode(tag)
            .map_err(|_| SealError::Invalid)?;
        if tag.len() != MAC_LEN {
            return Err(SealError::Invalid);
        }
        let mut parts = payload.splitn(3, |b| *b == b'.');
        let (Some(id), Some(owned_by), Some(body)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(SealError::Invalid);
        };
        if id != self.id.as_bytes() {
            return Err(SealError::OtherKey);
        }
        let mut mac = self.mac.clone();
        mac.update(purpose.as_bytes());
        mac.update(b"\0");
        mac.update(&payload);
        mac.verify_truncated_left(&tag)
            .map_err(|_| SealError::Invalid)?;
        if owned_by != owner_tag(owner).as_bytes() {
            return Err(SealError::OtherOwner);
        }
        Ok(body.to_vec())
    }

    pub fn mint(&self, position: &Position, digest: &SelectionDigest) -> String {
        let key = position
            .key
            .as_ref()
            .map_or_else(String::new, |k| URL_SAFE_NO_PAD.encode(k.as_bytes()));
        let payload = format!("{}.{}.{}.{}", position.offset, hex(digest), key, self.id);
        let tag = self.tag(payload.as_bytes());
        format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(payload),
            URL_SAFE_NO_PAD.encode(tag)
        )
    }

    /// The position a cursor carries and the digest it was minted for, once its MAC holds (for a
    /// caller that finds the chain by the cursor, as the search tool does).
    pub fn open(&self, cursor: &str) -> Result<(Position, SelectionDigest), CursorError> {
        let minted_for = cursor
            .split_once('.')
            .and_then(|(payload, _)| URL_SAFE_NO_PAD.decode(payload).ok())
            .and_then(|payload| {
                let text = String::from_utf8(payload).ok()?;
                let hex = text.split('.').nth(1)?.to_string();
                unhex(&hex)
            })
            .ok_or(CursorError::Invalid)?;
        self.verify(cursor, &minted_for)
            .map(|position| (position, minted_for))
    }

    pub fn verify(&self, cursor: &str, digest: &SelectionDigest) -> Result<Position, CursorError> {
        let (payload, tag) = cursor.split_once('.').ok_or(CursorError::Invalid)?;
        let payload = URL_SAFE_NO_PAD
            .decode(payload)
            .map_err(|_| CursorError::Invalid)?;
        let tag = URL_SAFE_NO_PAD
            .decode(tag)
            .map_err(|_| CursorError::Invalid)?;
        if tag.len() != MAC_LEN {
            return Err(CursorError::Invalid);
        }
        let text = std::str::from_utf8(&payload).map_err(|_| CursorError::Invalid)?;
        let mut parts = text.splitn(4, '.');
        let (Some(offset), Some(minted_for), Some(key)) =
            (parts.next(), parts.next(), parts.next())
        else {
            return Err(CursorError::Invalid);
        };
        // Another key's cursor (or one from before key ids: an older release) says so; the MAC
        // then tells an altered cursor of this key.
        if parts.next() != Some(self.id.as_str()) {
            return Err(CursorError::OtherKey);
        }
        let mut mac = self.mac.clone();
        mac.update(&payload);
        mac.verify_truncated_left(&tag)
            .map_err(|_| CursorError::Invalid)?;
        if minted_for != hex(digest) {
            return Err(CursorError::OtherQuery);
        }
        let offset = offset.parse().map_err(|_| CursorError::Invalid)?;
        let key = if key.is_empty() {
            None
        } else {
            let bytes = URL_SAFE_NO_PAD
                .decode(key)
                .map_err(|_| CursorError::Invalid)?;
            Some(String::from_utf8(bytes).map_err(|_| CursorError::Invalid)?)
        };
        Ok(Position { offset, key })
    }
}

use crate::wire::canonical::hex;

/// A principal, as a sealed token names it (a digest: the token shows no credential).
fn owner_tag(owner: &str) -> String {
    hex(&Sha256::digest([b"mcp-budget owner:".as_slice(), owner.as_bytes()].concat())[..8])
}

fn unhex(text: &str) -> Option<SelectionDigest> {
    if text.len() != 32 || !text.is_ascii() {
        return None;
    }
    let mut digest = [0u8; 16];
    for (i, byte) in digest.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(digest)
}

/// The digest of a selection: the canonical JSON (keys sorted) of its parts.
pub fn digest(parts: &Value) -> SelectionDigest {
    crate::wire::canonical::digest(parts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn sealed_tokens_open_only_for_their_purpose_owner_and_key() {
        let key = CursorKey::from_secret(b"k");
        let token = key.seal("task", "Token(0)", b"{\"t\":\"up-1\"}");
        assert_eq!(
            key.unseal("task", "Token(0)", &token).as_deref(),
            Ok(b"{\"t\":\"up-1\"}".as_slice())
        );
        assert_eq!(
            key.unseal("task", "Token(1)", &token),
            Err(SealError::OtherOwner)
        );
        assert_eq!(
            key.unseal("cursor", "Token(0)", &token),
            Err(SealError::Invalid)
        );
        assert_eq!(
            CursorKey::from_secret(b"j").unseal("task", "Token(0)", &token),
            Err(SealError::OtherKey)
        );
        // One byte of the body changed, the MAC kept.
        let (payload, tag) = token.split_once('.').unwrap();
        let mut bytes = URL_SAFE_NO_PAD.decode(payload).unwrap();
        let last = bytes.len() - 3;
        bytes[last] ^= 1;
        let altered = format!("{}.{tag}", URL_SAFE_NO_PAD.encode(bytes));
        assert_eq!(
            key.unseal("task", "Token(0)", &altered),
            Err(SealError::Invalid)
        );
        // A principal's tag, rewritten to another's, does not open either.
        assert_eq!(
            key.unseal("task", "Token(0)", "x.y"),
            Err(SealError::Invalid)
        );
    }

    #[test]
    fn round_trip_and_refusals() {
        let key = CursorKey::from_secret(b"k");
        let d = digest(&json!({"tool": "t", "args": {"b": 1, "a": 2}}));
        let position = Position {
            offset: 25,
            key: Some("st-0042".into()),
        };
        let cursor = key.mint(&position, &d);
        assert_eq!(key.verify(&cursor, &d), Ok(position));
        // Another query.
        let other = digest(&json!({"tool": "u"}));
        assert_eq!(key.verify(&cursor, &other), Err(CursorError::OtherQuery));
        // Another key (another proxy without a shared key, or a restart with a random key).
        assert_eq!(
            CursorKey::from_secret(b"j").verify(&cursor, &d),
            Err(CursorError::OtherKey)
        );
        // Tampered: flip one character of the payload.
        let mut bytes = cursor.clone().into_bytes();
        bytes[0] = if bytes[0] == b'A' { b'B' } else { b'A' };
        let tampered = String::from_utf8(bytes).unwrap();
        assert_eq!(key.verify(&tampered, &d), Err(CursorError::Invalid));
        assert_eq!(key.verify("garbage", &d), Err(CursorError::Invalid));
        assert_eq!(key.verify("", &d), Err(CursorError::Invalid));
    }

    #[test]
    fn digest_ignores_key_order() {
        assert_eq!(
            digest(&json!({"a": 1, "b": [1, {"x": 1, "y": 2}]})),
            digest(&json!({"b": [1, {"y": 2, "x": 1}], "a": 1}))
        );
        assert_ne!(digest(&json!({"a": 1})), digest(&json!({"a": 2})));
    }
}
