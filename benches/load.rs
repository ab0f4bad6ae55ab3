//! Load: 50 concurrent HTTP sessions × 200 `tools/call` each through `mcp-budget --listen`
//! (fleet policy) to the example fleet server; loopback only, bounded, stops by itself.
//! Run with `cargo bench --bench load` (builds the fleet example first if needed).

#[path = "support/load.rs"]
mod load;

use std::path::PathBuf;

fn main() {
    let sessions: usize = std::env::var("LOAD_SESSIONS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(50);
    let calls: usize = std::env::var("LOAD_CALLS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(200);
    let policy = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("policies/fleet.toml");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    // MCP_BUDGET_BASELINE_BIN runs another build under the same load, for a side-by-side figure.
    let proxy = std::env::var_os("MCP_BUDGET_BASELINE_BIN")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::PathBuf::from(env!("CARGO_BIN_EXE_mcp-budget")));
    println!("proxy: {}", proxy.display());
    let report = runtime.block_on(load::run(
        &proxy,
        &load::fleet_server(),
        &policy,
        sessions,
        calls,
    ));
    let total = report.latencies.len();
    println!(
        "load: {sessions} concurrent HTTP sessions × {calls} tools/call (fleet_show limit 5 / stream_detail), fleet policy"
    );
    println!(
        "  {total} calls in {:.1} s: {:.0} calls/s; p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        report.wall.as_secs_f64(),
        total as f64 / report.wall.as_secs_f64(),
        report.percentile(0.50).as_secs_f64() * 1e3,
        report.percentile(0.99).as_secs_f64() * 1e3,
        report.percentile(1.0).as_secs_f64() * 1e3,
    );
    println!(
        "  errors: {}; servers at peak: {}; servers left after the sessions ended: {}; proxy peak RSS: {:.1} MiB",
        report.errors.len(),
        report.servers_during,
        report.servers_left,
        report.peak_rss_kib as f64 / 1024.0
    );
    for error in report.errors.iter().take(5) {
        println!("  error: {error}");
    }
    assert!(
        report.errors.is_empty() && report.servers_left == 0,
        "the load run failed"
    );
}
