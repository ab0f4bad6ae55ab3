//! Shared by the latency benchmarks: a minimal stdio MCP responder (the bench binary itself in
//! server mode), a blocking line client for it, and the percentile report.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

pub const SERVE_ENV: &str = "MCP_BUDGET_BENCH_SERVE";
pub const ROUNDS: usize = 4;
pub const CALLS_PER_ROUND: usize = 1500;
pub const WARMUP: usize = 500;

/// A tools/call request with this id, as the benchmarks send it.
pub fn request(id: u64) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"stream_detail","arguments":{{"stream_id":"st-0042"}},"_meta":{{"progressToken":{id}}}}}}}"#
    )
}

/// Server mode: answer every request with a small tool result carrying its id.
pub fn serve() {
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

pub struct Session {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    next_id: u64,
    line: String,
}

impl Session {
    pub fn start(mut command: Command) -> Session {
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

    pub fn call(&mut self) -> Duration {
        let id = self.next_id;
        self.next_id += 1;
        let request = request(id);
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

    /// The process this session talks to.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn stop(mut self) {
        drop(self.stdin);
        let _ = self.child.wait();
    }
}

pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index]
}

pub fn report(name: &str, samples: &mut [Duration]) -> Duration {
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
