//! The HTTP upstream's exchanges under way, polled by the upstream's own task, without the
//! wake-up that `FuturesUnordered` gives itself after every poll.
//!
//! `FuturesUnordered` (futures-util 0.3) wakes its parent task and returns `Pending` whenever it
//! has polled every future it holds (`polled == len`). With the one exchange a sequential
//! client has under way, that is every poll: the upstream task is rescheduled as a yield, and
//! on the multi-thread runtime a yield wakes another worker to steal it (an `eventfd` write, a
//! futex wake and a cross-CPU hop per call; measured in #28: ~1.6 `eventfd` writes and ~2.2
//! futex calls a call, against none on one thread). Here the set is polled with a waker of our
//! own: a wake that arrives while the set is being polled is taken as "poll again", which is
//! done at once, up to [`REPOLLS`] times in a row; past that it is a real yield and is passed
//! on. A finished exchange is returned without a wake either (the caller polls again for the
//! next; measured in #28: ~1 yield, and a futex wake, a call). A wake at any other time goes to
//! the task, as before.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Wake, Waker};

use futures_util::stream::{FuturesUnordered, StreamExt};
use futures_util::task::AtomicWaker;

/// How many times in a row the set is polled while it wakes itself, before the wake is left
/// to the runtime as a yield.
const REPOLLS: usize = 4;

/// Where the set's wakes go: to the task, or, during a poll, to a flag.
#[derive(Default)]
struct Quiet {
    task: AtomicWaker,
    polling: AtomicBool,
    woken: AtomicBool,
}

impl Wake for Quiet {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        // A wake from another thread can race the end of a poll: the poller clears `polling`
        // and then reads `woken`; the waker sets `woken` and then reads `polling` again. With
        // sequentially consistent order one of them sees the other's store, so the wake is
        // either taken by the poller or passed to the task (at worst both: a spurious wake),
        // never lost.
        if self.polling.load(Ordering::SeqCst) {
            self.woken.store(true, Ordering::SeqCst);
            if self.polling.load(Ordering::SeqCst) {
                return;
            }
        }
        self.task.wake();
    }
}

/// A set of futures run to completion by whoever polls [`Exchanges::next`].
pub struct Exchanges<F> {
    set: FuturesUnordered<F>,
    quiet: Arc<Quiet>,
    waker: Waker,
}

impl<F: Future<Output = ()>> Exchanges<F> {
    pub fn new() -> Self {
        let quiet = Arc::new(Quiet::default());
        let waker = Waker::from(quiet.clone());
        Exchanges {
            set: FuturesUnordered::new(),
            quiet,
            waker,
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
        self.quiet.task.register(cx.waker());
        let mut inner = Context::from_waker(&self.waker);
        for round in 1..=REPOLLS {
            self.quiet.polling.store(true, Ordering::SeqCst);
            let polled = self.set.poll_next_unpin(&mut inner);
            self.quiet.polling.store(false, Ordering::SeqCst);
            let woken = self.quiet.woken.swap(false, Ordering::SeqCst);
            match polled {
                // No wake for the caller: it polls again for the next one (a wake here was a
                // yield a call on the multi-thread runtime: another worker woken to steal it).
                // What woke the set meanwhile is in its ready queue for that poll.
                Poll::Ready(done) => return Poll::Ready(done),
                Poll::Pending if !woken => return Poll::Pending,
                // Still waking itself after REPOLLS polls: a real yield, left to the runtime.
                Poll::Pending if round == REPOLLS => {
                    cx.waker().wake_by_ref();
                    return Poll::Pending;
                }
                Poll::Pending => {}
            }
        }
        Poll::Pending
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
    use std::pin::Pin;
    use std::sync::atomic::AtomicUsize;

    /// Counts the wakes of the task that polls it.
    #[derive(Default)]
    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

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
            count.0.load(Ordering::SeqCst),
            1,
            "FuturesUnordered no longer yields: this module may go"
        );

        let mut exchanges: Exchanges<Pin<Box<dyn Future<Output = ()>>>> = Exchanges::new();
        exchanges.push(Box::pin(std::future::pending()));
        let count = Arc::new(Count::default());
        assert!(poll(&mut exchanges, &count).is_pending());
        assert!(poll(&mut exchanges, &count).is_pending());
        assert_eq!(count.0.load(Ordering::SeqCst), 0);
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
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
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
        assert_eq!(count.0.load(Ordering::SeqCst), 0);
        // Nothing was lost: the woken one finishes on the next poll.
        assert_eq!(poll(&mut exchanges, &count), Poll::Ready(Some(())));
        assert_eq!(poll(&mut exchanges, &count), Poll::Ready(None));
        assert_eq!(count.0.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn a_future_that_keeps_yielding_is_left_to_the_runtime() {
        let mut exchanges: Exchanges<Pin<Box<dyn Future<Output = ()>>>> = Exchanges::new();
        exchanges.push(Box::pin(std::future::poll_fn(|cx| {
            cx.waker().wake_by_ref();
            Poll::<()>::Pending
        })));
        let count = Arc::new(Count::default());
        assert!(poll(&mut exchanges, &count).is_pending());
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn a_wake_from_another_thread_during_the_poll_is_never_lost() {
        // The waker of another thread races the end of the poll: either the poll sees the
        // message, or the task is woken. A lost wake would leave a client hung.
        for _ in 0..2000 {
            let (tx, rx) = tokio::sync::oneshot::channel::<()>();
            let mut exchanges: Exchanges<Pin<Box<dyn Future<Output = ()>>>> = Exchanges::new();
            exchanges.push(Box::pin(async move {
                let _ = rx.await;
            }));
            let count = Arc::new(Count::default());
            let sender = std::thread::spawn(move || {
                let _ = tx.send(());
            });
            let first = poll(&mut exchanges, &count);
            sender.join().expect("the sender thread ends");
            if first.is_pending() {
                assert!(
                    count.0.load(Ordering::SeqCst) >= 1,
                    "pending, and the task was never woken"
                );
                assert_eq!(poll(&mut exchanges, &count), Poll::Ready(Some(())));
            }
        }
    }
}
