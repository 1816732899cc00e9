//! `dtask torture` as a process: a short crash-recovery run — a child engine with a mixed
//! workload killed with SIGKILL at random moments at least 20 times, restarted each time, then left to
//! finish, purging tasks that ended as it goes — and the invariant checker's verdict.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use assert_cmd::Command;
use serde_json::Value;
use std::time::Duration;

fn torture(args: &[&str]) -> (Option<i32>, Value, String) {
    let output = Command::cargo_bin("dtask")
        .unwrap()
        .arg("torture")
        .args(args)
        .arg("--json")
        .timeout(Duration::from_secs(900))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    let summary = serde_json::from_slice(&output.stdout).unwrap_or(Value::Null);
    (output.status.code(), summary, stderr)
}

#[test]
fn twenty_kills_leave_every_invariant_intact() {
    let (code, summary, stderr) = torture(&["--seed", "20260601", "--kills", "20"]);
    assert_eq!(code, Some(0), "summary: {summary:#}\nstderr: {stderr}");
    assert_eq!(summary["violations"], Value::Array(vec![]), "{summary:#}");
    assert_eq!(summary["clean"], true);
    assert!(summary["kills"].as_u64().unwrap() >= 20, "{summary:#}");
    assert!(summary["sigkills"].as_u64().unwrap() >= 1, "{summary:#}");
    // The workload really ran: every kind of tool, updates, acknowledgements, side effects.
    for tool in ["shell", "tick", "poll", "approval"] {
        assert!(
            summary["by_tool"][tool].as_u64().unwrap_or(0) > 0,
            "no {tool} task: {summary:#}"
        );
    }
    assert!(summary["updates"].as_u64().unwrap() > 0, "{summary:#}");
    assert!(summary["acknowledged"].as_u64().unwrap() > 0, "{summary:#}");
    assert!(summary["side_effects"].as_u64().unwrap() > 0, "{summary:#}");
    // Poll tasks waited on durable timers between their looks, across the kills.
    assert!(summary["timers"].as_u64().unwrap() > 0, "{summary:#}");
    // Tasks that ended were purged now and then, between the kills: their tombstones stand
    // for what was acknowledged of them.
    let purged = summary["purged"].as_u64().unwrap();
    assert!(purged > 0, "{summary:#}");
    // Every other task ended in a terminal status.
    let by_status = summary["by_status"].as_object().unwrap();
    let tasks: u64 = by_status.values().map(|n| n.as_u64().unwrap()).sum();
    assert_eq!(tasks + purged, summary["tasks"].as_u64().unwrap());
    for status in by_status.keys() {
        assert!(
            ["completed", "failed", "canceled"].contains(&status.as_str()),
            "a task ended {status}: {summary:#}"
        );
    }
    assert!(summary["reproduce"]
        .as_str()
        .unwrap()
        .starts_with("dtask torture --seed 20260601 --kills 20"));
}

#[test]
fn bad_arguments_are_usage_errors_and_run_nothing() {
    let (code, _, stderr) = torture(&["--min-ms", "500", "--max-ms", "100"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("--min-ms 500 is above --max-ms 100"),
        "{stderr}"
    );
    let (code, _, stderr) = torture(&["--fail-point", "nowhere"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("unknown fail point \"nowhere\""),
        "{stderr}"
    );
    assert!(stderr.contains("journal::before_write"), "{stderr}");
    let (code, _, stderr) = torture(&[
        "--fail-point",
        "store::after_append",
        "--fail-action",
        "explode",
    ]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("unknown fail action \"explode\""),
        "{stderr}"
    );
    let (code, _, stderr) = torture(&["--nodes", "3"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("--nodes above 1 needs --postgres"),
        "{stderr}"
    );
}

#[test]
fn without_the_feature_fail_points_are_refused() {
    if cfg!(feature = "failpoints") {
        return;
    }
    let (code, _, stderr) = torture(&["--fail-point", "store::after_append"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("failpoints"), "{stderr}");
}

#[test]
fn kills_before_the_journal_exists_mean_nothing_was_acknowledged() {
    // Killed within a few milliseconds of starting, most children die before they created
    // the journal (or while creating it): the driver must go on, not stop at "not a journal".
    let (code, summary, stderr) = torture(&[
        "--seed", "2", "--kills", "3", "--min-ms", "1", "--max-ms", "5",
    ]);
    // With this seed the first child is killed within 5 ms of its start (it draws no drain:
    // a unit test of the generator holds that), long before its journal is there, so the
    // first check finds no journal.
    assert!(stderr.contains("run 1: SIGKILL after"), "{stderr}");
    assert_eq!(code, Some(0), "summary: {summary:#}\nstderr: {stderr}");
    assert_eq!(summary["clean"], true, "{summary:#}");
    assert!(summary["kills"].as_u64().unwrap() >= 3, "{summary:#}");
    assert!(!stderr.contains("not a dtask journal"), "{stderr}");
}

#[test]
fn no_kills_print_a_sensible_summary() {
    let output = Command::cargo_bin("dtask")
        .unwrap()
        .env_remove("DTASK_JOURNAL")
        .args(["torture", "--kills", "0", "--seed", "1"])
        .timeout(Duration::from_secs(300))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("0 crashes"), "{stdout}");
    assert!(stdout.contains("in 1 run\n"), "{stdout}");
    assert!(
        stdout.contains("tasks: none (no child run submitted a task)"),
        "{stdout}"
    );
    assert!(!stdout.contains("(; )"), "{stdout}");
    assert!(stdout.contains("checked: 0 acknowledgements"), "{stdout}");
}

#[test]
fn the_journal_flag_is_refused() {
    let output = Command::cargo_bin("dtask")
        .unwrap()
        .env_remove("DTASK_JOURNAL")
        .args(["--journal", "somewhere", "torture", "--kills", "1"])
        .timeout(Duration::from_secs(60))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("torture does not take --journal"),
        "{stderr}"
    );
    assert!(stderr.contains("--dir"), "{stderr}");
    assert!(output.stdout.is_empty());
}

#[test]
fn three_nodes_on_one_postgres_journal_take_over_each_others_tasks() {
    let Ok(base) = std::env::var("DTASK_TEST_PG_URL") else {
        eprintln!("SKIPPED three_nodes_on_one_postgres_journal: DTASK_TEST_PG_URL is not set");
        return;
    };
    let sep = if base.contains('?') { '&' } else { '?' };
    let url = format!("{base}{sep}schema=torture{}", std::process::id());
    let (code, summary, stderr) = torture(&[
        "--seed",
        "20261202",
        "--kills",
        "9",
        "--postgres",
        &url,
        "--nodes",
        "3",
    ]);
    assert_eq!(code, Some(0), "summary: {summary:#}\nstderr: {stderr}");
    assert_eq!(summary["violations"], Value::Array(vec![]), "{summary:#}");
    assert_eq!(summary["nodes"], 3);
    assert!(summary["sigkills"].as_u64().unwrap() >= 9, "{summary:#}");
    // Tasks of killed nodes were taken over: some took more than one attempt, and every
    // side effect in the ledger happened once (the checker proves it; a duplicate is a
    // violation above).
    assert!(
        summary["max_attempts"].as_u64().unwrap() >= 2,
        "{summary:#}"
    );
    assert!(summary["side_effects"].as_u64().unwrap() > 0, "{summary:#}");
    let by_status = summary["by_status"].as_object().unwrap();
    for status in by_status.keys() {
        assert!(
            ["completed", "failed", "canceled"].contains(&status.as_str()),
            "a task ended {status}: {summary:#}"
        );
    }
    // A second run on the same schema is refused: it holds tasks.
    let (code, _, stderr) = torture(&["--kills", "1", "--postgres", &url, "--nodes", "2"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("holds tasks already"), "{stderr}");
}
