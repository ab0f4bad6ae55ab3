//! JSON-RPC on the wire: frames, the envelope read once, the messages the proxy writes itself,
//! and canonical JSON.

pub mod canonical;
pub mod framing;
pub mod jsonrpc;
pub mod message;
