//! Latency of one `tools/call` through mcp-budget, against the same server called directly.
//!
//! Run with `cargo bench --bench relay_latency`. The server is this very binary in server mode
//! (a minimal stdio MCP responder, so that the figures show the proxy's cost, not a server's);
//! the client is a blocking line client. Direct and proxied rounds alternate in one run, so
//! that both see the same machine state. Prints p50, p99 and calls/s for each, and the
//! difference of the medians, in three CPU placements:
//!
//! - `unpinned`: the scheduler places the processes (what users get);
//! - `one core`: client, proxy and server share CPU 0 (the proxy's own cost, no cross-CPU wake-ups);
//! - `split`: the client on CPU 0, the server (and the proxy) on CPU 1, so that every call
//!   crosses CPUs in both cases.
//!
//! On a 2-core VM a cross-CPU wake-up costs tens of microseconds; the direct pair often avoids
//! it by sharing a core, a chain of three processes cannot. The placements tell these apart.

mod support;

use std::process::Command;
use std::time::Duration;

use support::{BARE_ENV, SERVE_ENV, Session, WARMUP, cpu, report};

/// Rounds of calls, each relay in turn; the CPU ratios are taken per round (the relays of one
/// round see the same machine), and their median is reported: this VM's clock moves by tens
/// of percent between runs.
const ROUNDS: usize = 12;
const CALLS_PER_ROUND: usize = 1000;

/// Runs `program args` on `cpu` (via `taskset`), or wherever the scheduler likes.
fn command_on(cpu: Option<usize>, program: &std::path::Path, args: &[&std::ffi::OsStr]) -> Command {
    let mut command = match cpu {
        Some(cpu) => {
            let mut c = Command::new("taskset");
            c.arg("-c").arg(cpu.to_string()).arg(program);
            c
        }
        None => Command::new(program),
    };
    command.args(args);
    command
}

fn pin_self(cpu: Option<usize>) {
    use nix::sched::{CpuSet, sched_setaffinity};
    use nix::unistd::Pid;
    let mut set = CpuSet::new();
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    for c in 0..cpus {
        if cpu.is_none_or(|only| only == c) {
            let _ = set.set(c);
        }
    }
    let _ = sched_setaffinity(Pid::from_raw(0), &set);
}

fn scenario(name: &str, client_cpu: Option<usize>, server_cpu: Option<usize>) {
    let me = std::env::current_exe().expect("own path");
    // MCP_BUDGET_BIN: another build (a baseline, run after this one in the same session).
    let proxy = std::env::var_os("MCP_BUDGET_BIN")
        .filter(|bin| !bin.is_empty())
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_mcp-budget").into());
    let proxy = proxy.as_path();
    pin_self(client_cpu);
    let mut direct = Session::start(command_on(server_cpu, &me, &[]));
    let mut proxied = Session::start(command_on(
        server_cpu,
        proxy,
        &["--".as_ref(), me.as_os_str()],
    ));
    let recording =
        std::env::temp_dir().join(format!("mcp-budget-bench-{}.jsonl", std::process::id()));
    let mut recorded = Session::start(command_on(
        server_cpu,
        proxy,
        &[
            "record".as_ref(),
            "--out".as_ref(),
            recording.as_os_str(),
            "--".as_ref(),
            me.as_os_str(),
        ],
    ));
    // The floor: a bare blocking relay of the same shape (this binary, two threads copying
    // lines), in front of the same server.
    let mut bare = {
        let mut command = command_on(server_cpu, &me, &[]);
        command.env(BARE_ENV, "stdio");
        Session::start(command)
    };
    // The async floor: the same relay on tokio's current-thread runtime (the proxy's stack in
    // stdio mode), no protocol work.
    let mut tokio_relay = {
        let mut command = command_on(server_cpu, &me, &[]);
        command.env(BARE_ENV, "tokio-stdio");
        Session::start(command)
    };
    for _ in 0..WARMUP {
        direct.call();
        proxied.call();
        recorded.call();
        bare.call();
        tokio_relay.call();
    }
    let mut direct_samples = Vec::with_capacity(ROUNDS * CALLS_PER_ROUND);
    let mut proxied_samples = Vec::with_capacity(ROUNDS * CALLS_PER_ROUND);
    let mut recorded_samples = Vec::with_capacity(ROUNDS * CALLS_PER_ROUND);
    let mut bare_samples = Vec::with_capacity(ROUNDS * CALLS_PER_ROUND);
    let mut tokio_samples = Vec::with_capacity(ROUNDS * CALLS_PER_ROUND);
    // The relays' own CPU (their threads, not the server's) a call, per round.
    let (mut proxy_cpu, mut bare_cpu, mut tokio_cpu) = (Vec::new(), Vec::new(), Vec::new());
    let per_call = |d: Duration| d.as_secs_f64() * 1e6 / CALLS_PER_ROUND as f64;
    for _ in 0..ROUNDS {
        for _ in 0..CALLS_PER_ROUND {
            direct_samples.push(direct.call());
        }
        let before = cpu(proxied.pid());
        for _ in 0..CALLS_PER_ROUND {
            proxied_samples.push(proxied.call());
        }
        proxy_cpu.push(per_call(cpu(proxied.pid()) - before));
        for _ in 0..CALLS_PER_ROUND {
            recorded_samples.push(recorded.call());
        }
        let before = cpu(bare.pid());
        for _ in 0..CALLS_PER_ROUND {
            bare_samples.push(bare.call());
        }
        bare_cpu.push(per_call(cpu(bare.pid()) - before));
        let before = cpu(tokio_relay.pid());
        for _ in 0..CALLS_PER_ROUND {
            tokio_samples.push(tokio_relay.call());
        }
        tokio_cpu.push(per_call(cpu(tokio_relay.pid()) - before));
    }
    direct.stop();
    tokio_relay.stop();
    proxied.stop();
    recorded.stop();
    bare.stop();
    let _ = std::fs::remove_file(&recording);
    println!("\n[{name}]");
    let d = report("direct", &mut direct_samples);
    let p = report("through mcp-budget", &mut proxied_samples);
    let r = report("…while recording", &mut recorded_samples);
    let b = report("through a bare relay", &mut bare_samples);
    let t = report("through a tokio relay", &mut tokio_samples);
    let added = |x: Duration| (x.as_secs_f64() - d.as_secs_f64()) * 1e6;
    // Per round: the ratio of two relays' CPU; min / median / max over the rounds.
    let spread = |a: &[f64], b: &[f64]| {
        let mut ratios: Vec<f64> = a.iter().zip(b).map(|(x, y)| x / y.max(0.001)).collect();
        ratios.sort_by(f64::total_cmp);
        (
            ratios[0],
            ratios[ratios.len() / 2],
            ratios[ratios.len() - 1],
        )
    };
    let median = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (over_bare, over_tokio, tokio_over_bare) = (
        spread(&proxy_cpu, &bare_cpu),
        spread(&proxy_cpu, &tokio_cpu),
        spread(&tokio_cpu, &bare_cpu),
    );
    let (proxy_cpu, bare_cpu, tokio_cpu) =
        (median(&proxy_cpu), median(&bare_cpu), median(&tokio_cpu));
    println!(
        "added by the proxy: p50 {:+.1} µs ({:.2}× direct); recording adds {:+.1} µs",
        added(p),
        p.as_secs_f64() / d.as_secs_f64(),
        (r.as_secs_f64() - p.as_secs_f64()) * 1e6
    );
    println!(
        "against the floor (a bare blocking relay): p50 added {:+.1} against {:+.1} µs ({:.2}×, target ≤ 1.5×); own CPU a call {proxy_cpu:.1} against {bare_cpu:.1} µs (medians), per round {:.2} / {:.2} / {:.2}× (min / median / max of {ROUNDS}; target ≤ 1.5×)",
        added(p),
        added(b),
        added(p) / added(b).max(0.1),
        over_bare.0,
        over_bare.1,
        over_bare.2,
    );
    println!(
        "against the async floor (a tokio relay, no protocol work): p50 added {:+.1} against {:+.1} µs ({:.2}×); own CPU a call {proxy_cpu:.1} against {tokio_cpu:.1} µs, per round {:.2} / {:.2} / {:.2}×; the async floor's own CPU per round {:.2} / {:.2} / {:.2}× the bare one's",
        added(p),
        added(t),
        added(p) / added(t).max(0.1),
        over_tokio.0,
        over_tokio.1,
        over_tokio.2,
        tokio_over_bare.0,
        tokio_over_bare.1,
        tokio_over_bare.2,
    );
}

fn main() {
    if let Some(mode) = std::env::var_os(BARE_ENV) {
        match mode.to_str() {
            Some("tokio-stdio") => support::floors::tokio_stdio_relay(),
            _ => support::bare_stdio_relay(),
        }
        return;
    }
    if std::env::var_os(SERVE_ENV).is_some() {
        support::serve();
        return;
    }
    println!("tools/call round trip, sequential, one client (stdio), no policy:");
    scenario("unpinned", None, None);
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    scenario("one core", Some(0), Some(0));
    if cpus > 1 {
        scenario(
            "split: client on CPU 0, server and proxy on CPU 1",
            Some(0),
            Some(1),
        );
    }
}
