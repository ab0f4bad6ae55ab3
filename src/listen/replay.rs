//! The events a session sent, kept for `Last-Event-ID`: the newest, up to a bound in bytes,
//! and which streams lost events to make room.

use std::collections::{BTreeMap, VecDeque};

use crate::queue;

/// The events a session sent, for `Last-Event-ID`: the newest, up to a bound in bytes.
pub(super) struct Replay {
    events: VecDeque<Logged>,
    bytes: usize,
    max: usize,
    /// Per stream, the highest event number that can no longer be replayed (dropped from the
    /// log to make room, or larger than the whole log).
    lost: BTreeMap<u64, u64>,
    /// Streams up to this number are treated as lost (the `lost` map is bounded too).
    lost_through: u64,
}

struct Logged {
    stream: u64,
    seq: u64,
    /// The event as it was written (id, data lines): sent again as it is.
    event: bytes::Bytes,
}

/// At most this many streams are remembered as having lost events.
const MAX_LOST_STREAMS: usize = 1024;

impl Replay {
    pub(super) fn new(max: usize) -> Replay {
        Replay {
            events: VecDeque::new(),
            bytes: 0,
            max,
            lost: BTreeMap::new(),
            lost_through: 0,
        }
    }

    /// Logs an event; `keep` names streams whose loss records must not be forgotten (the
    /// parked ones: a resume must be told exactly).
    pub(super) fn push(
        &mut self,
        stream: u64,
        seq: u64,
        event: bytes::Bytes,
        keep: impl Fn(u64) -> bool,
    ) {
        let weight = event.len() + queue::OVERHEAD;
        if weight > self.max {
            self.lose(stream, seq, &keep);
            return;
        }
        while self.bytes + weight > self.max {
            let Some(old) = self.events.pop_front() else {
                break;
            };
            self.bytes -= old.event.len() + queue::OVERHEAD;
            self.lose(old.stream, old.seq, &keep);
        }
        self.bytes += weight;
        self.events.push_back(Logged { stream, seq, event });
    }

    fn lose(&mut self, stream: u64, seq: u64, keep: &impl Fn(u64) -> bool) {
        let lost = self.lost.entry(stream).or_insert(0);
        *lost = (*lost).max(seq);
        if self.lost.len() > MAX_LOST_STREAMS
            // The lowest stream number not kept (at most the parked ones are passed over).
            && let Some(&oldest) = self.lost.keys().find(|&&s| !keep(s))
        {
            self.lost.remove(&oldest);
            self.lost_through = self.lost_through.max(oldest);
        }
    }

    /// Whether an event of `stream` after `seq` was sent but can no longer be replayed. (A
    /// parked stream's record is exact: it is never forgotten.)
    pub(super) fn lost_after(&self, stream: u64, seq: u64, parked: bool) -> bool {
        (!parked && stream <= self.lost_through)
            || self.lost.get(&stream).is_some_and(|&lost| lost > seq)
    }

    /// The events of `stream` after `seq`, with their ids.
    pub(super) fn after(&self, stream: u64, seq: u64) -> Replayed {
        self.events
            .iter()
            .filter(|e| e.stream == stream && e.seq > seq)
            .map(|e| e.event.clone())
            .collect()
    }
}

/// Events sent again, with their ids.
pub(super) type Replayed = Vec<bytes::Bytes>;
