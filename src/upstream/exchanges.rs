//! The HTTP upstream's exchanges under way, polled by the upstream's own task, without the
//! wake-up that `FuturesUnordered` gives itself after every poll.
//!
//! `FuturesUnordered` (futures-util 0.3) wakes its parent task and returns `Pending` whenever it
//! has polled every future it holds (`polled == len`). With the one exchange a sequential
//! client has under way, that is every poll: on the multi-thread runtime, a yield that wakes
//! another worker to steal the task. The set is polled through a [`QuietWaker`]: such a wake
//! is a poll again, at once (see [`crate::quiet`]), and a finished exchange is returned
//! without one (the caller polls again for the next).

use std::future::Future;
use std::task::{Context, Poll};

use futures_util::stream::{FuturesUnordered, StreamExt};

use crate::quiet::QuietWaker;

/// A set of futures run to completion by whoever polls [`Exchanges::next`].
pub struct Exchanges<F> {
    set: FuturesUnordered<F>,
    waker: QuietWaker,
}

impl<F: Future<Output = ()>> Exchanges<F> {
    pub fn new() -> Self {
        Exchanges {
            set: FuturesUnordered::new(),
            waker: QuietWaker::default(),
        }
    }

    pub fn push(&mut self, future: F) {
        self.set.push(future);
    }

    pub fn is_empty(&self) -> bool {
        self.set.is_empty()
    }

    /// Waits for one future of the set to finish; `None` when the set is empty.
    pub async fn next(&mut self) -> Option<()> {
        std::future::poll_fn(|cx| self.poll_next(cx)).await
    }

    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<()>> {
        let Exchanges { set, waker } = self;
        waker.poll(cx, |inner| set.poll_next_unpin(inner))
    }
}

impl<F: Future<Output = ()>> Default for Exchanges<F> {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quiet::testing::Count;
    use std::pin::Pin;
    use std::sync::Arc;
    use std::task::Waker;

    fn poll(
        exchanges: &mut Exchanges<Pin<Box<dyn Future<Output = ()>>>>,
        count: &Arc<Count>,
    ) -> Poll<Option<()>> {
        let waker = Waker::from(count.clone());
        exchanges.poll_next(&mut Context::from_waker(&waker))
    }

    #[test]
    fn one_pending_exchange_does_not_wake_its_task() {
        // The bare FuturesUnordered wakes the task on every poll of a lone pending future.
        let mut bare = FuturesUnordered::new();
        bare.push(std::future::pending::<()>());
        let count = Arc::new(Count::default());
        let waker = Waker::from(count.clone());
        let _ = bare.poll_next_unpin(&mut Context::from_waker(&waker));
        assert_eq!(
            count.wakes(),
            1,
            "FuturesUnordered no longer yields: this module may go"
        );

        let mut exchanges: Exchanges<Pin<Box<dyn Future<Output = ()>>>> = Exchanges::new();
        exchanges.push(Box::pin(std::future::pending()));
        let count = Arc::new(Count::default());
        assert!(poll(&mut exchanges, &count).is_pending());
        assert!(poll(&mut exchanges, &count).is_pending());
        assert_eq!(count.wakes(), 0);
    }

    #[test]
    fn a_wake_after_the_poll_reaches_the_task_and_the_future_finishes() {
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let mut exchanges: Exchanges<Pin<Box<dyn Future<Output = ()>>>> = Exchanges::new();
        exchanges.push(Box::pin(async move {
            let _ = rx.await;
        }));
        let count = Arc::new(Count::default());
        assert!(poll(&mut exchanges, &count).is_pending());
        let _ = tx.send(());
        assert_eq!(count.wakes(), 1);
        assert_eq!(poll(&mut exchanges, &count), Poll::Ready(Some(())));
        assert_eq!(poll(&mut exchanges, &count), Poll::Ready(None));
    }

    #[test]
    fn a_finished_exchange_is_returned_without_waking_its_task() {
        // The second exchange finishes the first: it is woken during the poll that returns
        // the second. The caller polls again for the next one; a wake of the task here was a
        // yield (on the multi-thread runtime, another worker woken: a futex a call).
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let mut exchanges: Exchanges<Pin<Box<dyn Future<Output = ()>>>> = Exchanges::new();
        exchanges.push(Box::pin(async move {
            let _ = rx.await;
        }));
        exchanges.push(Box::pin(async move {
            let _ = tx.send(());
        }));
        let count = Arc::new(Count::default());
        assert_eq!(poll(&mut exchanges, &count), Poll::Ready(Some(())));
        assert_eq!(count.wakes(), 0);
        // Nothing was lost: the woken one finishes on the next poll.
        assert_eq!(poll(&mut exchanges, &count), Poll::Ready(Some(())));
        assert_eq!(poll(&mut exchanges, &count), Poll::Ready(None));
        assert_eq!(count.wakes(), 0);
    }
}
