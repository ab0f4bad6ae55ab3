//! A deterministic, realistically verbose fleet record: streams with gates, prose and liveness.
//!
//! Shared by the example fleet server, the tests and the benchmarks (included with `#[path]`).
//! Terminal streams (merged, closed-without-merge) keep their expired liveness blocks and
//! week-old gate prose, as real records do — that is what makes an unbudgeted `fleet_show` huge.
#![allow(dead_code)]

use serde_json::{Map, Value, json};

/// The stream states, live first.
pub const LIVE_STATES: [&str; 3] = ["running", "gated", "blocked"];
pub const TERMINAL_STATES: [&str; 2] = ["merged", "closed-without-merge"];

/// A small deterministic generator (splitmix64): the same seed gives the same record.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x9e37_79b9_7f4a_7c15)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }

    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + self.below(hi - lo + 1)
    }

    pub fn pick<'a>(&mut self, items: &'a [&'a str]) -> &'a str {
        items[self.below(items.len())]
    }

    fn hex(&mut self, len: usize) -> String {
        let mut s = String::with_capacity(len);
        while s.len() < len {
            s.push_str(&format!("{:016x}", self.next_u64()));
        }
        s.truncate(len);
        s
    }
}

/// "Now" for the record: 2026-11-20T12:00:00Z, in minutes since the Unix epoch.
const NOW_MINUTES: i64 = 29_919_600;

/// An RFC 3339 timestamp `minutes_ago` before the record's "now".
pub fn timestamp(minutes_ago: i64) -> String {
    let total = NOW_MINUTES - minutes_ago;
    let (days, minute_of_day) = (total.div_euclid(1440), total.rem_euclid(1440));
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:00Z",
        minute_of_day / 60,
        minute_of_day % 60
    )
}

const OWNERS: [&str; 9] = [
    "agent-ada",
    "agent-brook",
    "agent-cyril",
    "agent-dana",
    "agent-ezra",
    "agent-fern",
    "agent-gale",
    "agent-hugo",
    "agent-iris",
];
const VERBS: [&str; 10] = [
    "Port",
    "Harden",
    "Refactor",
    "Instrument",
    "Migrate",
    "Parallelize",
    "Document",
    "Cache",
    "Retire",
    "Stabilize",
];
const OBJECTS: [&str; 12] = [
    "the ingest scheduler",
    "lease renewal",
    "the gate evaluator",
    "wave planning",
    "the merge queue",
    "branch protection checks",
    "the liveness probe",
    "stream snapshots",
    "the audit log writer",
    "artifact uploads",
    "the retry budget",
    "config reloads",
];
const GATES: [&str; 5] = [
    "design-review",
    "code-review",
    "ci",
    "merge-queue",
    "security-review",
];
const LABELS: [&str; 8] = [
    "perf",
    "reliability",
    "tech-debt",
    "customer",
    "security",
    "infra",
    "docs",
    "flaky",
];
const HOSTS: [&str; 6] = [
    "worker-a1.fleet.internal",
    "worker-a2.fleet.internal",
    "worker-b1.fleet.internal",
    "worker-b4.fleet.internal",
    "worker-c3.fleet.internal",
    "worker-d7.fleet.internal",
];
const SENTENCES: [&str; 16] = [
    "The reviewer walked through the change set file by file and confirmed that every new code path is exercised by at least one test that fails without the change.",
    "Latency on the synthetic workload stayed within two percent of the baseline across five consecutive runs, which is inside the noise band we agreed on for this gate.",
    "One concern raised in the previous round, the unbounded retry loop around lease renewal, is now addressed by an explicit budget with jittered backoff.",
    "The migration is reversible: the down-migration was applied against a snapshot of production data and the resulting schema diff was empty.",
    "We accepted a small increase in memory use (about 6 MiB per worker) in exchange for removing the lock that serialized snapshot writes.",
    "CI flagged a flaky integration test twice; it was traced to a port collision in the test harness, not to this change, and a follow-up issue was filed.",
    "Security review found no new network listeners, no new secrets in configuration, and confirmed that the audit log still records every gate decision.",
    "The owner supplied a rollout plan in three waves with a kill switch at each step, and on-call acknowledged the plan in the channel before approval.",
    "Documentation for operators was updated in the runbook, including the new alert thresholds and the exact command to drain a worker safely.",
    "The design keeps the public interface unchanged; callers that relied on the old ordering guarantee were audited and none were found outside this repository.",
    "A load test at twice the expected peak showed no errors and a p99 that stayed under the service objective for the full forty minutes.",
    "The gate was held once because the branch was behind its base by more than fifty commits; after a rebase every check passed again without changes.",
    "Coverage of the touched modules rose from 71 to 84 percent, mostly from property tests that generate random schedules and compare against a reference model.",
    "The reviewer asked for clearer error messages at the configuration boundary; the new messages name the offending key and the accepted range.",
    "Canary metrics from the first wave matched the control group on error rate, saturation and tail latency, so the second wave was approved.",
    "No data is dropped on shutdown: in-flight work is checkpointed and the checkpoint format is versioned so that an older worker refuses it loudly.",
];
const NOTES: [&str; 6] = [
    "heartbeat on schedule",
    "lease renewed after brief GC pause",
    "worker drained for node maintenance, lease kept",
    "slow heartbeat: disk pressure on host, recovered",
    "lease handed over to standby worker",
    "probe timed out once, next probe healthy",
];

const MODULES: [&str; 10] = [
    "scheduler",
    "lease",
    "gate",
    "wave",
    "merge",
    "probe",
    "snapshot",
    "audit",
    "upload",
    "config",
];
const FILES: [&str; 8] = [
    "mod.rs",
    "state.rs",
    "retry.rs",
    "store.rs",
    "codec.rs",
    "limits.rs",
    "api.rs",
    "metrics.rs",
];
const FINDINGS: [&str; 12] = [
    "the error path now releases the lease before returning",
    "a missing bounds check on the batch size was added",
    "the timeout is read from configuration instead of a constant",
    "the lock is no longer held across the network call",
    "an off-by-one in the window arithmetic was fixed",
    "the metric name follows the naming convention",
    "a panic on an empty queue became a typed error",
    "the retry loop has a budget and jitter",
    "the log line no longer prints the token",
    "the snapshot is fsynced before the rename",
    "the fallback branch is covered by a new test",
    "the deprecated flag still parses but warns",
];
const REVIEW_VERBS: [&str; 6] = [
    "re-read",
    "ran the suite against",
    "bisected",
    "profiled",
    "diffed",
    "walked through",
];

/// One sentence of review prose: a stock sentence, or one made from parts (a path, a commit, a
/// number, a finding), so that no two records read alike.
fn sentence(rng: &mut Rng) -> String {
    match rng.below(3) {
        0 => rng.pick(&SENTENCES).to_string(),
        1 => format!(
            "{} {} src/{}/{} at {} and found that {}.",
            rng.pick(&OWNERS),
            rng.pick(&REVIEW_VERBS),
            rng.pick(&MODULES),
            rng.pick(&FILES),
            rng.hex(7),
            rng.pick(&FINDINGS)
        ),
        _ => format!(
            "Run {} of {} took {} s (p99 {} ms, {} retries); {}.",
            rng.range(1, 9),
            rng.pick(&["ci/integration", "ci/e2e", "bench/nightly", "ci/unit"]),
            rng.range(40, 900),
            rng.range(3, 480),
            rng.range(0, 12),
            rng.pick(&FINDINGS)
        ),
    }
}

fn prose(rng: &mut Rng, sentences: usize) -> String {
    (0..sentences)
        .map(|_| sentence(rng))
        .collect::<Vec<_>>()
        .join(" ")
}

fn gate(rng: &mut Rng, minutes_ago: i64, sentences: usize) -> Value {
    let gate = rng.pick(&GATES);
    json!({
        "gate": gate,
        "verdict": rng.pick(&["pass", "pass", "pass", "hold", "fail"]),
        "at": timestamp(minutes_ago),
        "by": rng.pick(&OWNERS),
        "justification": prose(rng, sentences),
        "evidence": [
            format!("ci/runs/{}", rng.range(10_000, 99_999)),
            format!("reviews/{}/{}", gate, rng.hex(8)),
        ],
        "checks": (0..rng.range(2, 4)).map(|k| json!({
            "name": format!("{}-{}", rng.pick(&["unit", "integration", "lint", "e2e", "bench"]), k),
            "status": rng.pick(&["passed", "passed", "passed", "skipped"]),
            "duration_ms": rng.range(800, 240_000),
        })).collect::<Vec<_>>(),
    })
}

fn liveness(rng: &mut Rng, terminal: bool, last_minutes_ago: i64) -> Value {
    let beats = if terminal {
        rng.range(9, 15)
    } else {
        rng.range(1, 4)
    };
    let every = rng.range(5, 15) as i64;
    let heartbeats: Vec<Value> = (0..beats)
        .map(|k| {
            json!({
                "at": timestamp(last_minutes_ago + k as i64 * every),
                "rss_mb": rng.range(180, 2400),
                "cpu_pct": rng.range(1, 97),
                "open_files": rng.range(40, 900),
                "note": rng.pick(&NOTES),
            })
        })
        .collect();
    let status = if terminal {
        "expired"
    } else {
        rng.pick(&["alive", "alive", "alive", "stale"])
    };
    json!({
        "status": status,
        "heartbeat_at": timestamp(last_minutes_ago),
        "lease_expires_at": timestamp(last_minutes_ago - 30),
        "lease_id": format!("lease-{}", rng.hex(12)),
        "host": rng.pick(&HOSTS),
        "pid": rng.range(1000, 65_000),
        "heartbeats": heartbeats,
    })
}

/// One stream. `index` fixes its id and wave; the state is drawn from `rng`.
pub fn stream(index: usize, rng: &mut Rng) -> Value {
    let state = match rng.below(100) {
        0..=47 => "merged",
        48..=61 => "closed-without-merge",
        62..=79 => "running",
        80..=91 => "gated",
        _ => "blocked",
    };
    let terminal = TERMINAL_STATES.contains(&state);
    let id = format!("st-{index:04}");
    let verb = rng.pick(&VERBS);
    let object = rng.pick(&OBJECTS);
    let title = format!("{verb} {object}");
    let slug: String = title
        .to_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    // Terminal streams last moved a week or more ago; live ones within hours.
    let updated_ago = if terminal {
        rng.range(7 * 1440, 14 * 1440) as i64
    } else {
        rng.range(5, 600) as i64
    };
    let created_ago = updated_ago + rng.range(2 * 1440, 20 * 1440) as i64;
    // Live streams that were gated or blocked carry their own gate history too.
    let history_len = match state {
        "merged" | "closed-without-merge" => rng.range(4, 6),
        "gated" | "blocked" => rng.range(1, 3),
        _ => rng.range(0, 1),
    };
    let gate_history: Vec<Value> = (0..history_len)
        .map(|k| {
            let sentences = rng.range(3, 5);
            gate(rng, updated_ago + (k as i64 + 1) * 1440, sentences)
        })
        .collect();
    let mut labels: Vec<&str> = (0..rng.range(1, 3)).map(|_| rng.pick(&LABELS)).collect();
    labels.dedup();
    let depends_on: Vec<String> = (0..rng.range(0, 2))
        .filter(|_| index > 0)
        .map(|_| format!("st-{:04}", rng.below(index.max(1))))
        .collect();
    let mut record = Map::new();
    record.insert("stream_id".into(), json!(id));
    record.insert("title".into(), json!(title));
    record.insert("state".into(), json!(state));
    record.insert("owner".into(), json!(rng.pick(&OWNERS)));
    record.insert("wave".into(), json!(format!("w{}", index / 12 + 1)));
    record.insert("branch".into(), json!(format!("stream/{id}-{slug}")));
    record.insert("base_commit".into(), json!(rng.hex(40)));
    record.insert("head_commit".into(), json!(rng.hex(40)));
    record.insert("created_at".into(), json!(timestamp(created_ago)));
    record.insert("updated_at".into(), json!(timestamp(updated_ago)));
    record.insert("labels".into(), json!(labels));
    record.insert("depends_on".into(), json!(depends_on));
    let sentences = if terminal {
        rng.range(4, 6)
    } else {
        rng.range(2, 3)
    };
    record.insert("last_gate".into(), gate(rng, updated_ago, sentences));
    record.insert("gate_history".into(), json!(gate_history));
    record.insert("liveness".into(), liveness(rng, terminal, updated_ago));
    Value::Object(record)
}

/// All streams of a fleet of `count` streams.
pub fn streams(count: usize, seed: u64) -> Vec<Value> {
    let mut rng = Rng::new(seed);
    (0..count).map(|i| stream(i, &mut rng)).collect()
}

/// The waves the streams belong to, with their stream counts.
pub fn waves(streams: &[Value]) -> Vec<Value> {
    let mut waves: Vec<(String, usize)> = Vec::new();
    for stream in streams {
        let wave = stream["wave"].as_str().unwrap_or("w0").to_string();
        match waves.iter_mut().find(|(w, _)| *w == wave) {
            Some((_, n)) => *n += 1,
            None => waves.push((wave, 1)),
        }
    }
    waves
        .into_iter()
        .enumerate()
        .map(|(k, (wave, n))| {
            json!({
                "wave": wave,
                "opened_at": timestamp(30 * 1440 - k as i64 * 2 * 1440),
                "streams": n,
            })
        })
        .collect()
}

/// The whole `fleet_show` result: fleet header, waves, every stream.
pub fn fleet_show(count: usize, seed: u64) -> Value {
    let streams = streams(count, seed);
    json!({
        "fleet": "atlas",
        "generated_at": timestamp(0),
        "record_version": 3,
        "stream_count": streams.len(),
        "waves": waves(&streams),
        "streams": streams,
    })
}
