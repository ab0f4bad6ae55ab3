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

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

const SERVE_ENV: &str = "MCP_BUDGET_BENCH_SERVE";
const ROUNDS: usize = 4;
const CALLS_PER_ROUND: usize = 1500;
const WARMUP: usize = 500;

/// Server mode: answer every request with a small tool result carrying its id.
fn serve() {
    let stdin = std::io::stdin();
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    for line in stdin.lock().lines() {
        let Ok(line) = line else { return };
        let Ok(message) = serde_json::from_str::<serde_json::Value>(&line) else {
            continue;
        };
        let Some(id) = message.get("id") else {
            continue;
        };
        let reply = format!(
            r#"{{"jsonrpc":"2.0","id":{id},"result":{{"content":[{{"type":"text","text":"{{\"stream_id\":\"st-0042\",\"state\":\"running\",\"owner\":\"agent-ada\",\"wave\":\"w4\"}}"}}],"structuredContent":{{"stream_id":"st-0042","state":"running","owner":"agent-ada","wave":"w4"}},"isError":false}}}}"#
        );
        if writeln!(out, "{reply}").and_then(|()| out.flush()).is_err() {
            return;
        }
    }
}

struct Session {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    next_id: u64,
    line: String,
}

impl Session {
    fn start(mut command: Command) -> Session {
        let mut child = command
            .env(SERVE_ENV, "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn the bench server");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = BufReader::new(child.stdout.take().expect("stdout"));
        Session {
            child,
            stdin,
            stdout,
            next_id: 1,
            line: String::new(),
        }
    }

    fn call(&mut self) -> Duration {
        let id = self.next_id;
        self.next_id += 1;
        let request = format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"stream_detail","arguments":{{"stream_id":"st-0042"}},"_meta":{{"progressToken":{id}}}}}}}"#
        );
        let start = Instant::now();
        self.stdin.write_all(request.as_bytes()).expect("write");
        self.stdin.write_all(b"\n").expect("write");
        self.stdin.flush().expect("flush");
        self.line.clear();
        self.stdout.read_line(&mut self.line).expect("read");
        let elapsed = start.elapsed();
        assert!(
            self.line.contains(&format!(r#""id":{id},"#)),
            "unexpected reply: {}",
            self.line
        );
        elapsed
    }

    fn stop(mut self) {
        drop(self.stdin);
        let _ = self.child.wait();
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index]
}

fn report(name: &str, samples: &mut [Duration]) -> Duration {
    samples.sort();
    let total: Duration = samples.iter().sum();
    let p50 = percentile(samples, 0.50);
    println!(
        "{name:<22} p50 {:>7.1} µs   p99 {:>7.1} µs   {:>8.0} calls/s   ({} calls)",
        p50.as_secs_f64() * 1e6,
        percentile(samples, 0.99).as_secs_f64() * 1e6,
        samples.len() as f64 / total.as_secs_f64(),
        samples.len()
    );
    p50
}

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
    let proxy = std::path::Path::new(env!("CARGO_BIN_EXE_mcp-budget"));
    pin_self(client_cpu);
    let mut direct = Session::start(command_on(server_cpu, &me, &[]));
    let mut proxied = Session::start(command_on(
        server_cpu,
        proxy,
        &["--".as_ref(), me.as_os_str()],
    ));
    for _ in 0..WARMUP {
        direct.call();
        proxied.call();
    }
    let mut direct_samples = Vec::with_capacity(ROUNDS * CALLS_PER_ROUND);
    let mut proxied_samples = Vec::with_capacity(ROUNDS * CALLS_PER_ROUND);
    for _ in 0..ROUNDS {
        for _ in 0..CALLS_PER_ROUND {
            direct_samples.push(direct.call());
        }
        for _ in 0..CALLS_PER_ROUND {
            proxied_samples.push(proxied.call());
        }
    }
    direct.stop();
    proxied.stop();
    println!("\n[{name}]");
    let d = report("direct", &mut direct_samples);
    let p = report("through mcp-budget", &mut proxied_samples);
    println!(
        "added by the proxy: p50 {:+.1} µs ({:.2}× direct)",
        (p.as_secs_f64() - d.as_secs_f64()) * 1e6,
        p.as_secs_f64() / d.as_secs_f64()
    );
}

fn main() {
    if std::env::var_os(SERVE_ENV).is_some() {
        serve();
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
