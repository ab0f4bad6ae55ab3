//! Recordings: every message of a session, one JSON object a line ([`mod@write`]), and the same
//! file read back into exchanges ([`read`]) for replay, report and suggest.

pub mod read;
pub mod write;

pub use read::{Entry, Exchange, Recording, ReplayError};
pub use write::{Dir, FORMAT, RecordError, Recorder};
