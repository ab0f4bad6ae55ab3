//! Where an automatic page starts, and whether its cursor lets the tool run again.

use super::page::Position;

/// Where a page starts: which piece, and where in it (a byte offset in a text literal, or an
/// element index).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct At {
    pub piece: usize,
    pub offset: usize,
    /// The fingerprint of the result the position is in (0 on a first page): a result that
    /// changed since is never cut at an old position.
    pub fingerprint: u64,
}

impl At {
    pub fn to_position(self) -> Position {
        self.position(false)
    }

    /// The position a cursor carries; `rerun`: the tool may be run again to serve a page (it is
    /// read-only), so that any replica knows it, whether or not it saw the tool listed.
    pub fn position(self, rerun: bool) -> Position {
        let mark = if rerun { RERUN_MARK } else { "" };
        Position {
            offset: self.offset,
            key: Some(format!(
                "auto:{}:{:016x}{mark}",
                self.piece, self.fingerprint
            )),
        }
    }

    pub fn from_position(position: &Position) -> Option<At> {
        let rest = position.key.as_deref()?.strip_prefix("auto:")?;
        let rest = rest.strip_suffix(RERUN_MARK).unwrap_or(rest);
        let (piece, fingerprint) = rest.split_once(':')?;
        Some(At {
            piece: piece.parse().ok()?,
            offset: position.offset,
            fingerprint: u64::from_str_radix(fingerprint, 16).ok()?,
        })
    }

    pub(super) fn first(&self) -> bool {
        self.piece == 0 && self.offset == 0
    }
}

/// What an automatic cursor's position ends with when its tool may be run again on a miss.
const RERUN_MARK: &str = ":r";

/// Whether a cursor's (verified) position says its tool may be run again to serve a page.
pub fn may_rerun(position: &Position) -> bool {
    position
        .key
        .as_deref()
        .is_some_and(|k| k.starts_with("auto:") && k.ends_with(RERUN_MARK))
}
