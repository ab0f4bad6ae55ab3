//! Queues bounded in bytes: every hand-off between the proxy's tasks goes through one.
//!
//! Why not `mpsc::channel(n)`: a bound in messages is no bound in memory when one message can
//! be 64 MiB — 256 of them is 16 GiB. Here a sender waits until the bytes it queues fit the
//! budget, so a peer that does not read slows the peer that writes (its messages wait in its
//! own pipe or socket), and memory stays at the budget plus one message at most. A message
//! larger than the whole budget takes all of it: it passes alone.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};

/// What every queue may hold by default (per queue).
pub const DEFAULT_QUEUE_BYTES: usize = 8 * 1024 * 1024;

/// Bytes counted for a message besides its payload (its place in the queue).
pub const OVERHEAD: usize = 64;

/// A value with a size in bytes.
pub trait Weigh {
    fn weight(&self) -> usize;
}

impl Weigh for Vec<u8> {
    fn weight(&self) -> usize {
        self.len()
    }
}

/// The sending half (cheap to clone).
pub struct Sender<T> {
    tx: mpsc::UnboundedSender<(T, OwnedSemaphorePermit)>,
    budget: Arc<Semaphore>,
    max: u32,
}

impl<T> Clone for Sender<T> {
    fn clone(&self) -> Self {
        Sender {
            tx: self.tx.clone(),
            budget: self.budget.clone(),
            max: self.max,
        }
    }
}

/// A sender that does not keep the queue open: the receiver still ends once every
/// [`Sender`] is gone.
pub struct WeakSender<T> {
    tx: mpsc::WeakUnboundedSender<(T, OwnedSemaphorePermit)>,
    budget: Arc<Semaphore>,
    max: u32,
}

impl<T> Clone for WeakSender<T> {
    fn clone(&self) -> Self {
        WeakSender {
            tx: self.tx.clone(),
            budget: self.budget.clone(),
            max: self.max,
        }
    }
}

impl<T> WeakSender<T> {
    /// A sender, while another one still keeps the queue open.
    pub fn upgrade(&self) -> Option<Sender<T>> {
        Some(Sender {
            tx: self.tx.upgrade()?,
            budget: self.budget.clone(),
            max: self.max,
        })
    }
}

impl<T> Sender<T> {
    /// A sender that does not keep the queue open.
    pub fn downgrade(&self) -> WeakSender<T> {
        WeakSender {
            tx: self.tx.downgrade(),
            budget: self.budget.clone(),
            max: self.max,
        }
    }
}

/// The receiving half.
pub struct Receiver<T> {
    rx: mpsc::UnboundedReceiver<(T, OwnedSemaphorePermit)>,
}

/// The receiver is gone; the value comes back.
#[derive(Debug)]
pub struct Closed<T>(pub T);

/// Why `try_send` did not queue the value (it comes back).
#[derive(Debug)]
pub enum TrySendError<T> {
    Full(T),
    Closed(T),
}

/// A queue that holds at most `max_bytes` (plus one message larger than that).
pub fn channel<T: Weigh>(max_bytes: usize) -> (Sender<T>, Receiver<T>) {
    let max = u32::try_from(max_bytes.max(OVERHEAD + 1)).unwrap_or(u32::MAX);
    let (tx, rx) = mpsc::unbounded_channel();
    (
        Sender {
            tx,
            budget: Arc::new(Semaphore::new(max as usize)),
            max,
        },
        Receiver { rx },
    )
}

impl<T: Weigh> Sender<T> {
    fn permits(&self, value: &T) -> u32 {
        u32::try_from(value.weight().saturating_add(OVERHEAD))
            .unwrap_or(u32::MAX)
            .min(self.max)
    }

    /// Queues `value`, waiting while the queue holds too many bytes.
    pub async fn send(&self, value: T) -> Result<(), Closed<T>> {
        let permits = self.permits(&value);
        // The common case: there is room now.
        if let Ok(permit) = self.budget.clone().try_acquire_many_owned(permits) {
            return self
                .tx
                .send((value, permit))
                .map_err(|mpsc::error::SendError((value, _))| Closed(value));
        }
        let permit = tokio::select! {
            permit = self.budget.clone().acquire_many_owned(permits) => match permit {
                Ok(permit) => permit,
                Err(_) => return Err(Closed(value)),
            },
            () = self.tx.closed() => return Err(Closed(value)),
        };
        self.tx
            .send((value, permit))
            .map_err(|mpsc::error::SendError((value, _))| Closed(value))
    }

    /// Queues `value` if it fits now.
    pub fn try_send(&self, value: T) -> Result<(), TrySendError<T>> {
        if self.tx.is_closed() {
            return Err(TrySendError::Closed(value));
        }
        let permits = self.permits(&value);
        let permit = match self.budget.clone().try_acquire_many_owned(permits) {
            Ok(permit) => permit,
            Err(tokio::sync::TryAcquireError::Closed) => return Err(TrySendError::Closed(value)),
            Err(tokio::sync::TryAcquireError::NoPermits) => return Err(TrySendError::Full(value)),
        };
        self.tx
            .send((value, permit))
            .map_err(|mpsc::error::SendError((value, _))| TrySendError::Closed(value))
    }

    /// Whether the receiver is gone, or the queue was closed to senders.
    pub fn is_closed(&self) -> bool {
        self.tx.is_closed() || self.budget.is_closed()
    }

    /// Takes no more values: a sender waiting for room, and every later one, gets its value
    /// back as [`Closed`]. What is queued stays for the receiver.
    pub fn close(&self) {
        self.budget.close();
    }
}

impl<T> Receiver<T> {
    /// The next value; `None` once every sender is gone and the queue is empty.
    pub async fn recv(&mut self) -> Option<T> {
        self.rx.recv().await.map(|(value, _permit)| value)
    }

    /// The next value if one is queued.
    pub fn try_recv(&mut self) -> Option<T> {
        self.rx.try_recv().ok().map(|(value, _permit)| value)
    }

    /// Whether nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.rx.is_empty()
    }

    /// Stops accepting values; those already queued can still be received.
    pub fn close(&mut self) {
        self.rx.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_closed_queue_gives_a_waiting_sender_its_value_back_and_keeps_what_it_holds() {
        let (tx, mut rx) = channel::<Vec<u8>>(1000);
        tx.send(vec![0; 600]).await.unwrap();
        let waiting = tokio::spawn({
            let tx = tx.clone();
            async move { tx.send(vec![1; 600]).await.map_err(|Closed(v)| v) }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        tx.close();
        assert_eq!(waiting.await.unwrap(), Err(vec![1; 600]));
        assert!(matches!(tx.try_send(vec![2]), Err(TrySendError::Closed(_))));
        assert!(tx.is_closed());
        assert_eq!(rx.recv().await.unwrap(), vec![0; 600]);
    }

    #[tokio::test]
    async fn a_full_queue_makes_the_sender_wait_until_bytes_are_taken() {
        let (tx, mut rx) = channel::<Vec<u8>>(1000);
        tx.send(vec![0; 600]).await.unwrap();
        assert!(matches!(
            tx.try_send(vec![0; 600]),
            Err(TrySendError::Full(_))
        ));
        let waiting = tokio::spawn({
            let tx = tx.clone();
            async move { tx.send(vec![1; 600]).await.is_ok() }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        assert_eq!(rx.recv().await.unwrap().len(), 600);
        assert!(waiting.await.unwrap());
        assert_eq!(rx.recv().await.unwrap(), vec![1; 600]);
    }

    #[tokio::test]
    async fn a_message_larger_than_the_budget_passes_alone() {
        let (tx, mut rx) = channel::<Vec<u8>>(1000);
        tx.send(vec![0; 5000]).await.unwrap();
        assert!(matches!(
            tx.try_send(vec![0; 1]),
            Err(TrySendError::Full(_))
        ));
        assert_eq!(rx.recv().await.unwrap().len(), 5000);
        tx.try_send(vec![0; 1]).unwrap();
    }

    #[tokio::test]
    async fn a_waiting_sender_learns_that_the_receiver_went_away() {
        let (tx, rx) = channel::<Vec<u8>>(100);
        tx.send(vec![0; 100]).await.unwrap();
        let waiting = tokio::spawn({
            let tx = tx.clone();
            async move { tx.send(vec![0; 100]).await.is_err() }
        });
        tokio::task::yield_now().await;
        drop(rx);
        assert!(waiting.await.unwrap());
    }
}
