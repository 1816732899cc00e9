//! One crash test per fail point (built with `--features failpoints`): a child engine running
//! the torture workload aborts the process at the point (twice, in separate runs), is
//! restarted each time, and after a last run that lets everything finish the invariant
//! checker must find nothing: no acknowledged event missing, every task terminal, each shell
//! side effect at most once, no event id twice in a task, attempts only growing, `verify`
//! clean. More tests make a point panic or fail with an error instead; one fails a sync
//! under `dtask serve` (in this process) and checks its liveness.
#![cfg(feature = "failpoints")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use assert_cmd::Command;
use serde_json::Value;
use std::time::Duration;

/// How many times each point must fire.
const FIRINGS: u64 = 2;

fn crash_at(point: &str, action: &str, seed: u64) -> Value {
    // Lease expiry needs tasks running at a kill: kill early (every other run then lives a
    // few leases longer, see `dtask torture`, and resolves what the run before left).
    let (min_ms, max_ms) = if point == "store::lease_expiry" {
        ("100", "300")
    } else {
        ("300", "1500")
    };
    let output = Command::cargo_bin("dtask")
        .unwrap()
        .args(["torture", "--json", "--seed", &seed.to_string()])
        .args(["--kills", &FIRINGS.to_string(), "--fail-point", point])
        .args([
            "--fail-action",
            action,
            "--min-ms",
            min_ms,
            "--max-ms",
            max_ms,
        ])
        .timeout(Duration::from_secs(600))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    let summary: Value = serde_json::from_slice(&output.stdout).unwrap_or(Value::Null);
    assert_eq!(
        output.status.code(),
        Some(0),
        "{point}: {summary:#}\nstderr: {stderr}"
    );
    assert_eq!(summary["violations"], Value::Array(vec![]), "{summary:#}");
    assert_eq!(summary["fail_point"], point);
    assert!(
        summary["fail_point_hits"].as_u64().unwrap() >= FIRINGS,
        "{point} did not fire: {summary:#}"
    );
    assert!(summary["tasks"].as_u64().unwrap() > 0, "{summary:#}");
    let by_status = summary["by_status"].as_object().unwrap();
    assert!(
        by_status
            .keys()
            .all(|s| ["completed", "failed", "canceled"].contains(&s.as_str())),
        "{summary:#}"
    );
    summary
}

fn abort_at(point: &str, seed: u64) {
    let summary = crash_at(point, "abort", seed);
    assert!(
        summary["aborts"].as_u64().unwrap() >= FIRINGS,
        "{point}: the process did not abort there: {summary:#}"
    );
}

#[test]
fn abort_before_a_batch_is_written() {
    abort_at("journal::before_write", 11);
}

#[test]
fn abort_after_a_batch_is_written_before_callers_are_acknowledged() {
    abort_at("journal::after_write", 12);
}

#[test]
fn abort_after_acknowledgement_before_memory_advances() {
    abort_at("store::after_append", 13);
}

#[test]
fn abort_inside_a_tool_start_before_the_started_marker() {
    abort_at("managed::tool_start", 14);
}

#[test]
fn abort_after_start_before_commit_start() {
    abort_at("managed::before_commit_start", 15);
}

#[test]
fn abort_after_an_update_is_persisted_before_the_materializer() {
    abort_at("managed::after_update_persisted", 16);
}

#[test]
fn abort_during_lease_expiry_resolution() {
    abort_at("store::lease_expiry", 17);
}

#[test]
fn abort_during_drain() {
    abort_at("runtime::drain", 18);
}

#[test]
fn panic_after_acknowledgement_before_memory_advances() {
    crash_at("store::after_append", "panic", 21);
}

#[test]
fn error_after_a_batch_is_written_before_callers_are_acknowledged() {
    crash_at("journal::after_write", "error", 22);
}

#[test]
fn error_before_the_started_marker_is_committed() {
    crash_at("managed::before_commit_start", "error", 23);
}

#[test]
fn error_at_a_failed_sync_stops_the_journal_and_the_next_run_recovers() {
    crash_at("journal::sync", "error", 24);
}

/// The journal at `dir` opened for writing once the last handle of the server that held it
/// is gone (a moment after it stopped).
async fn reopen(dir: &std::path::Path) -> dtask::journal::Journal {
    use dtask::journal::{Error, Journal, JournalOptions};
    for _ in 0..1_000 {
        match Journal::open(dir, JournalOptions::default()) {
            Ok(journal) => return journal,
            Err(Error::InUse { .. }) => tokio::time::sleep(Duration::from_millis(10)).await,
            Err(e) => panic!("the journal does not open: {e}"),
        }
    }
    panic!("the journal stayed in use");
}

/// Under a served store: a failed write makes the server not ready (`journal_failing`),
/// alive all along, and ready again once a write succeeds. Then a failed sync stops the
/// journal (a failed `fsync` cannot be tried again): the server's liveness fails with
/// `journal_stopped`, its readiness names it, every write is refused 503 `journal_stopped` —
/// and the journal, reopened, holds every task acknowledged before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_write_unreadies_the_server_and_a_failed_sync_fails_its_liveness() {
    use dtask::engine::{failpoints, StoreConfig, SystemClock, TaskStore};
    use dtask::journal::{Journal, JournalOptions};
    use dtask::server::{Server, ServerConfig};
    use serde_json::json;
    use support::Served;

    let dir = tempfile::tempdir().unwrap();
    let journal = Journal::open(dir.path(), JournalOptions::default()).unwrap();
    let store = TaskStore::open(journal, SystemClock, StoreConfig::default()).unwrap();
    let served = Served::start(Server::owner(store, None, ServerConfig::default())).await;
    let get = |path: &'static str| served.get(path);
    let submit = |id: &str| {
        let (served, task) = (
            &served,
            json!({"id": id, "executor_key": "shell", "kind": "tool_call", "payload": {}}),
        );
        async move { served.post("/api/tasks", &task).await }
    };

    // Ready once the server has counted the journal.
    assert_eq!(served.readiness(true).await, json!([]));
    assert_eq!(submit("before").await.0, 201);
    assert_eq!(
        get("/healthz").await,
        (200, json!({"status": "ok", "reasons": []}))
    );

    // A failed write: not ready until a write succeeds; alive.
    failpoints::configure(&failpoints::parse("journal::before_write=error").unwrap()).unwrap();
    let (status, body) = submit("refused").await;
    assert_eq!(
        (status, &body["error"]["code"]),
        (500, &json!("journal_error")),
        "{body}"
    );
    assert_eq!(
        get("/readyz").await,
        (
            503,
            json!({"status": "unavailable", "reasons": ["journal_failing"]})
        )
    );
    assert_eq!(get("/healthz").await.0, 200);
    assert_eq!(submit("refused").await.0, 201, "the same write, made again");
    assert_eq!(
        get("/readyz").await,
        (200, json!({"status": "ok", "reasons": []}))
    );

    failpoints::configure(&failpoints::parse("journal::sync=error").unwrap()).unwrap();
    let (status, body) = submit("during").await;
    assert_eq!(
        (status, &body["error"]["code"]),
        (503, &json!("journal_stopped")),
        "{body}"
    );
    assert_eq!(
        get("/healthz").await,
        (
            503,
            json!({"status": "unavailable", "reasons": ["journal_stopped"]})
        )
    );
    let (status, ready) = get("/readyz").await;
    assert_eq!(status, 503);
    assert!(
        ready["reasons"]
            .as_array()
            .unwrap()
            .contains(&json!("journal_stopped")),
        "{ready}"
    );
    let metrics = served.text("/metrics").await;
    assert!(metrics.contains("\ndtask_journal_stopped 1\n"), "{metrics}");
    assert!(metrics.contains("\ndtask_ready 0\n"), "{metrics}");
    // The point fired once; the journal stays stopped all the same.
    let (status, body) = submit("after").await;
    assert_eq!(
        (status, &body["error"]["code"]),
        (503, &json!("journal_stopped"))
    );
    failpoints::disarm_all();

    served.stop().await;
    // Reopened (once the server's last handle is gone): the task acknowledged before the
    // failed sync is there; the one refused after it is not.
    let journal = reopen(dir.path()).await;
    assert!(journal.contains_task("before").unwrap());
    assert!(journal.contains_task("refused").unwrap());
    assert!(!journal.contains_task("after").unwrap());
    let audit = dtask::replay::audit_journal(&journal, &mut |_| {}).unwrap();
    assert!(audit.is_clean(), "{:?}", audit.problems);
}
