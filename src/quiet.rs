//! Polling with a waker of the proxy's own, so that a wake a task gives itself while it is
//! being polled is a poll again, at once, and not a yield to the runtime.
//!
//! On tokio's work-stealing runtime (the listener's), a task woken while it runs is pushed to
//! the back of the run queue as a yield, and a yield wakes another worker to steal it: a futex
//! wake, a context switch and a cross-CPU hop. Two of the proxy's tasks did that on every call:
//! - the HTTP upstream's set of exchanges (`FuturesUnordered` wakes its parent whenever it has
//!   polled every future it holds, which with one exchange under way is every poll);
//! - a listener connection's task: hyper reads the request body in the connection's own task
//!   and hands it to the handler, polled by the same task, through a channel whose receiver
//!   wakes the sender as it takes a chunk.
//!
//! Measured in #28 (`strace -c`, 5,000 HTTP→HTTP calls): `futex` calls a call 3.7 → 1.9 with
//! the first; the second took out the yield `perf` traced to the body read (one a call).
//!
//! A wake that arrives while the inner poll runs is noted, and the inner future is polled
//! again at once: at most [`REPOLLS`] polls in one poll of the task; a wake during the last is
//! a real yield and is passed on. A wake at any other time goes to the task, as before.
//! (hyper's connection yields after 16 turns of its loop with such a wake: inside `Quiet` a
//! busy connection turns up to 4 × 16 times before it yields. Its reads and writes still spend
//! tokio's cooperative budget, whose yields are deferred wakes, not absorbed here.)

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Wake, Waker};

use futures_util::task::AtomicWaker;

/// How many polls of a future that wakes itself one poll of the task makes, before the wake
/// is left to the runtime as a yield.
pub const REPOLLS: usize = 4;

/// Where the wakes go: to the task, or, during a poll, to a flag.
#[derive(Default)]
struct Flag {
    task: AtomicWaker,
    polling: AtomicBool,
    woken: AtomicBool,
}

impl Wake for Flag {
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

/// The waker a quiet poll hands down (one per polled thing, made once).
pub struct QuietWaker {
    flag: Arc<Flag>,
    waker: Waker,
}

impl Default for QuietWaker {
    fn default() -> Self {
        let flag = Arc::new(Flag::default());
        let waker = Waker::from(flag.clone());
        QuietWaker { flag, waker }
    }
}

impl QuietWaker {
    /// `poll`, given this waker: polled again while it wakes itself (at most [`REPOLLS`] polls).
    /// A `Ready` wakes nobody: a future is done, and a stream's reader polls again for more.
    pub fn poll<T>(
        &self,
        cx: &mut Context<'_>,
        mut poll: impl FnMut(&mut Context<'_>) -> Poll<T>,
    ) -> Poll<T> {
        self.flag.task.register(cx.waker());
        let mut inner = Context::from_waker(&self.waker);
        for round in 1..=REPOLLS {
            let polled = {
                let _polling = Polling::start(&self.flag);
                poll(&mut inner)
            };
            let woken = self.flag.woken.swap(false, Ordering::SeqCst);
            match polled {
                Poll::Ready(value) => return Poll::Ready(value),
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

/// Marks a poll under way; its end is marked on drop, a panic's unwinding included (a flag
/// left set would keep every later wake from the task).
struct Polling<'a>(&'a Flag);

impl<'a> Polling<'a> {
    fn start(flag: &'a Flag) -> Self {
        flag.polling.store(true, Ordering::SeqCst);
        Polling(flag)
    }
}

impl Drop for Polling<'_> {
    fn drop(&mut self) {
        self.0.polling.store(false, Ordering::SeqCst);
    }
}

/// `future`, polled through a [`QuietWaker`].
pub struct Quiet<F> {
    future: Pin<Box<F>>,
    waker: QuietWaker,
}

impl<F: Future> Quiet<F> {
    pub fn new(future: F) -> Self {
        Quiet {
            future: Box::pin(future),
            waker: QuietWaker::default(),
        }
    }
}

impl<F: Future> Future for Quiet<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.get_mut();
        let future = &mut this.future;
        this.waker.poll(cx, |inner| future.as_mut().poll(inner))
    }
}

/// For tests of what polls quietly.
#[cfg(test)]
pub(crate) mod testing {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Wake;

    /// A task's waker that counts its wakes.
    #[derive(Default)]
    pub struct Count(pub AtomicUsize);

    impl Count {
        pub fn wakes(&self) -> usize {
            self.0.load(Ordering::SeqCst)
        }
    }

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testing::Count;
    use super::*;

    fn poll_once<F: Future>(
        future: &mut Pin<&mut Quiet<F>>,
        count: &Arc<Count>,
    ) -> Poll<F::Output> {
        let waker = Waker::from(count.clone());
        future.as_mut().poll(&mut Context::from_waker(&waker))
    }

    #[test]
    fn a_future_that_wakes_itself_once_is_polled_again_at_once() {
        // The shape of hyper's body channel: the first poll wakes its own task and is pending,
        // the second finds what it waited for.
        let mut polls = 0;
        let future = Quiet::new(std::future::poll_fn(move |cx| {
            polls += 1;
            if polls == 1 {
                cx.waker().wake_by_ref();
                Poll::Pending
            } else {
                Poll::Ready(polls)
            }
        }));
        let mut future = std::pin::pin!(future);
        let count = Arc::new(Count::default());
        assert_eq!(poll_once(&mut future, &count), Poll::Ready(2));
        assert_eq!(count.wakes(), 0, "no yield to the runtime");
    }

    #[test]
    fn a_future_that_keeps_waking_itself_is_left_to_the_runtime() {
        let future = Quiet::new(std::future::poll_fn(|cx| {
            cx.waker().wake_by_ref();
            Poll::<()>::Pending
        }));
        let mut future = std::pin::pin!(future);
        let count = Arc::new(Count::default());
        assert!(poll_once(&mut future, &count).is_pending());
        assert_eq!(count.wakes(), 1);
    }

    #[test]
    fn a_wake_after_the_poll_reaches_the_task() {
        let (tx, rx) = tokio::sync::oneshot::channel::<u8>();
        let future = Quiet::new(rx);
        let mut future = std::pin::pin!(future);
        let count = Arc::new(Count::default());
        assert!(poll_once(&mut future, &count).is_pending());
        assert_eq!(count.wakes(), 0);
        let _ = tx.send(7);
        assert_eq!(count.wakes(), 1);
        assert!(matches!(poll_once(&mut future, &count), Poll::Ready(Ok(7))));
    }

    #[test]
    fn a_poll_that_panics_leaves_later_wakes_to_the_task() {
        let waker = QuietWaker::default();
        let count = Arc::new(Count::default());
        let task = Waker::from(count.clone());
        let mut cx = Context::from_waker(&task);
        let mut stored: Option<Waker> = None;
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            waker.poll(&mut cx, |inner| -> Poll<()> {
                stored = Some(inner.waker().clone());
                panic!("the inner poll fails");
            })
        }));
        assert!(panicked.is_err());
        stored.expect("the inner poll kept its waker").wake();
        assert_eq!(
            count.wakes(),
            1,
            "the wake after the panic reached the task"
        );
    }

    #[test]
    fn a_wake_from_another_thread_during_the_poll_is_never_lost() {
        // The waker of another thread races the end of the poll: either the poll sees the
        // message, or the task is woken. A lost wake would leave a client hung.
        for _ in 0..2000 {
            let (tx, rx) = tokio::sync::oneshot::channel::<()>();
            let future = Quiet::new(rx);
            let mut future = std::pin::pin!(future);
            let count = Arc::new(Count::default());
            let sender = std::thread::spawn(move || {
                let _ = tx.send(());
            });
            let first = poll_once(&mut future, &count);
            sender.join().expect("the sender thread ends");
            if first.is_pending() {
                assert!(count.wakes() >= 1, "pending, and the task was never woken");
                assert!(poll_once(&mut future, &count).is_ready());
            }
        }
    }
}
