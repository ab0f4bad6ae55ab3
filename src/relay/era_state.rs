//! What the routing core carries of a request's era, and nothing else names of the relay: the
//! request context read where a client request comes in, and what the era's hooks keep of a
//! request in flight.

use crate::wire::message::{Id, Modern};

/// One client request as the routing core carries it, read once where it came in.
pub(super) struct Request<'a> {
    pub(super) id: &'a Id,
    pub(super) method: &'a str,
    pub(super) bytes: &'a [u8],
    /// Its 2026-07-28 `_meta`, when it is a modern request: its era.
    pub(super) meta: Option<&'a Modern>,
}

/// What the era hooks keep of one request in flight: its client's era and, for a request the
/// bridge carries, what its MRTR rounds and log filter need.
#[derive(Default)]
pub(super) struct EraFlight {
    /// Whether it was a modern (2026-07-28) request.
    pub(super) modern: bool,
    /// The log level it asked for (a rank), when it is a modern request bridged to a legacy
    /// server: only such requests get the server's `notifications/message`.
    pub(super) log_level: Option<u8>,
    /// What identifies it across MRTR rounds ([`bridge::call_digest`]), when it is a modern
    /// request a legacy server may ask input for.
    ///
    /// [`bridge::call_digest`]: crate::era::bridge::call_digest
    pub(super) digest: Option<[u8; 16]>,
    /// Parked: its client got `input_required` and the call waits upstream for the retry
    /// (the number of its entry in [`Bridge::parked`]).
    ///
    /// [`Bridge::parked`]: super::bridged::Bridge::parked
    pub(super) parked: Option<u64>,
    /// A legacy client's request to a modern server that may be answered `input_required`:
    /// the bytes it went upstream as (the proxy retries it with the client's answers), and
    /// how many rounds it had.
    pub(super) kept: Option<Box<[u8]>>,
    pub(super) rounds: u8,
    /// What a modern call bridged to a legacy server declared that the server may use
    /// ([`bridge::capability_profile`]).
    ///
    /// [`bridge::capability_profile`]: crate::era::bridge::capability_profile
    pub(super) caps: Option<Box<str>>,
}
