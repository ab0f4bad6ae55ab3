//! A short load smoke test: concurrent HTTP sessions, every answer checked, nothing left behind.
//! (The full load — 50 × 200 — is `cargo bench --bench load`.)

mod common;

#[path = "../benches/support/load.rs"]
mod load;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_sessions_all_answered_correctly_and_no_server_left() {
    let policy = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("policies/fleet.toml");
    let report = load::run(
        &common::proxy_bin(),
        &common::example("fleet_server"),
        &policy,
        6,
        20,
    )
    .await;
    assert_eq!(report.errors, Vec::<String>::new());
    assert_eq!(report.latencies.len(), 6 * 20);
    assert!(report.servers_during >= 1);
    assert_eq!(
        report.servers_left, 0,
        "sessions ended but their servers did not"
    );
}
