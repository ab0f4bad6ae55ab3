//! Threads for the budget's heavy work, apart from the threads that do I/O.
//!
//! A 10 MB result costs the budget ~90 ms of CPU. On the listener, the session that receives
//! it hands it to this pool and waits; the runtime's threads go on serving every other
//! session's I/O. The binary starts the pool for `--listen` with a setup that lowers the
//! threads' scheduling priority, so that on a busy machine the small messages of other
//! sessions get a core first. Without a pool (stdio, tests in process) the work runs where it
//! is asked for.

use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex, OnceLock, PoisonError, mpsc};

type Job = Box<dyn FnOnce() + Send>;

static POOL: OnceLock<mpsc::Sender<Job>> = OnceLock::new();

/// Starts `threads` threads, each running `setup` first. Once per process; later calls do
/// nothing.
pub fn start(threads: usize, setup: fn()) -> std::io::Result<()> {
    if POOL.get().is_some() {
        return Ok(());
    }
    let (tx, rx) = mpsc::channel::<Job>();
    let rx = Arc::new(Mutex::new(rx));
    for k in 0..threads.max(1) {
        let rx = rx.clone();
        std::thread::Builder::new()
            .name(format!("mcp-budget-heavy-{k}"))
            .spawn(move || {
                setup();
                loop {
                    let job = rx.lock().unwrap_or_else(PoisonError::into_inner).recv();
                    match job {
                        Ok(job) => job(),
                        Err(_) => return,
                    }
                }
            })?;
    }
    let _ = POOL.set(tx);
    Ok(())
}

/// Whether heavy work leaves the calling thread.
pub fn started() -> bool {
    POOL.get().is_some()
}

/// Runs `job` on the pool and waits for it (here, when there is no pool). A panic in the job
/// is a panic of the caller, as if it had run here.
pub async fn run<T: Send + 'static>(job: impl FnOnce() -> T + Send + 'static) -> T {
    let Some(pool) = POOL.get() else {
        return job();
    };
    let (tx, rx) = tokio::sync::oneshot::channel();
    let work: Job = Box::new(move || {
        let _ = tx.send(std::panic::catch_unwind(AssertUnwindSafe(job)));
    });
    if let Err(mpsc::SendError(work)) = pool.send(work) {
        // No thread left to take it (they never end while the process runs): run it here.
        work();
    }
    match rx.await {
        Ok(Ok(value)) => value,
        Ok(Err(panic)) => std::panic::resume_unwind(panic),
        // The job was dropped unrun: only when its thread died, which `catch_unwind` prevents.
        Err(_) => panic!("the budget's worker thread ended before its job"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn jobs_run_on_the_pool_and_a_panic_is_the_callers() {
        start(2, || {}).expect("threads");
        let name = run(|| std::thread::current().name().map(String::from)).await;
        assert!(
            name.as_deref()
                .is_some_and(|n| n.starts_with("mcp-budget-heavy-")),
            "ran on {name:?}"
        );
        let caught = tokio::spawn(run(|| -> u8 { panic!("a bug in the budget") })).await;
        assert!(caught.is_err_and(|e| e.is_panic()));
        // The pool goes on after a job panicked.
        assert_eq!(run(|| 6 * 7).await, 42);
    }
}
