//! One crash test per fail point (built with `--features failpoints`): a child engine running
//! the torture workload aborts the process at the point (twice, in separate runs), is
//! restarted each time, and after a last run that lets everything finish the invariant
//! checker must find nothing: no acknowledged event missing, every task terminal, each shell
//! side effect at most once, no event id twice in a task, attempts only growing, `verify`
//! clean. Two more tests make a point panic and fail with an error instead.
#![cfg(feature = "failpoints")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

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
