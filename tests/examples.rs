//! The workspace's examples run as a user runs them, and say what their docs say they do.
//!
//! `cargo test` builds every example of the workspace beside the tests (into the target
//! directory's `examples/`); these tests run those executables in processes of their own, in
//! temporary directories, and check their output. An example that no longer runs fails here,
//! not in a user's hands. (`cargo test --test examples` alone builds this file only: after a
//! change, run `cargo build --examples` first, or the whole suite.)
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod pg;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long an example may run before it counts as hung (a guard, not a measure: each takes
/// a few seconds).
const HANG: Duration = Duration::from_secs(300);

/// The executable of example `name`, built by `cargo test` beside this test's own.
fn example(name: &str) -> PathBuf {
    let mut dir = std::env::current_exe().unwrap();
    dir.pop(); // the test executable
    if dir.ends_with("deps") {
        dir.pop();
    }
    let path = dir
        .join("examples")
        .join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    assert!(
        path.exists(),
        "{} is missing: `cargo test` builds the examples (`cargo build --examples` does too)",
        path.display()
    );
    path
}

/// Runs example `name` with `args` in a fresh directory; its standard output, after
/// checking that it exited with success.
fn run(name: &str, args: &[&str]) -> String {
    run_with_input(name, args, None)
}

/// [`run`], writing `input` (when given) to the example's standard input and closing it.
fn run_with_input(name: &str, args: &[&str], input: Option<&str>) -> String {
    use std::io::Write as _;
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(example(name))
        .args(args)
        .current_dir(dir.path())
        // The agent examples talk to a real model when this is set: the scripted one here.
        .env_remove("OPENAI_BASE_URL")
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    if let Some(input) = input {
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(input.as_bytes()).unwrap();
    }
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > HANG {
            let _ = child.kill();
            panic!("example {name} did not finish");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let output = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "example {name} failed ({}):\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().flatten().collect();
    assert!(
        left.is_empty() || name == "durable_agent" || name == "agent_chat",
        "example {name} left files in its working directory: {left:?}"
    );
    stdout
}

/// Asserts that `output` of example `name` has every line of `expected` (each a part of a
/// line), in that order.
fn has_in_order(name: &str, output: &str, expected: &[&str]) {
    let mut lines = output.lines();
    for part in expected {
        assert!(
            lines.any(|line| line.contains(part)),
            "example {name}: no line with {part:?} (in this order) in:\n{output}"
        );
    }
}

#[test]
fn the_nested_tasks_example_hears_its_childrens_findings_through_its_mailbox() {
    let out = run("nested_tasks", &[]);
    has_in_order(
        "nested_tasks",
        &out,
        &[
            "review completed with findings:",
            "  URGENT: src/store.rs: unsafe block without a SAFETY comment",
            "  src/lib.rs: TODO #0",
            "  src/main.rs: TODO #0",
            "  src/main.rs: TODO #1",
            "3 children, 3 ended",
        ],
    );
    assert_eq!(out.matches("TODO").count(), 3, "{out}");
}

#[test]
fn the_runtime_quickstart_completes_answers_cancels_delays_and_reruns() {
    let out = run("runtime_quickstart", &[]);
    has_in_order(
        "runtime_quickstart",
        &out,
        &[
            "completed: \"hello\"",
            "waiting for input (\"approve?\")",
            "completed: \"approved\"",
            "canceled: user gave up",
            "completed: \"job done, seen on attempt 2\"",
            "failed: the service was down",
            "completed: \"flaky\"",
            "rerun as echo_",
        ],
    );
    assert!(
        out.lines()
            .any(|l| l.contains(".rerun-1: rerun of echo_") && l.ends_with("completed: \"flaky\"")),
        "{out}"
    );
}

#[test]
fn the_managed_tool_example_hands_a_slow_call_to_the_background_and_resumes_an_approval() {
    let out = run("managed_tool", &[]);
    has_in_order(
        "managed_tool",
        &out,
        &[
            "\"type\":\"launch_result\"",
            "completed: \"done\"",
            "interrupted, asks {\"question\":\"Deploy to production?\"}",
            "\"type\":\"foreground_result\"",
        ],
    );
}

#[test]
fn the_durable_agent_finishes_its_run_and_a_second_start_carries_on_from_the_journal() {
    let dir = tempfile::tempdir().unwrap();
    let at = dir.path().join("run");
    let at = at.to_str().unwrap();
    let first = run("durable_agent", &[at]);
    has_in_order(
        "durable_agent",
        &first,
        &[
            "message sent: Say the sum in words, too.",
            "transcript:",
            "user        Say the sum in words, too.",
            "together 149 (one hundred forty-nine)",
            "done in 3 model calls",
        ],
    );
    // The same directory again: the run is found in the journal, and ends as it ended.
    let second = run("durable_agent", &[at]);
    has_in_order(
        "durable_agent",
        &second,
        &[
            "found in the journal, carrying on",
            "message: sent before",
            "together 149 (one hundred forty-nine)",
            "done in 3 model calls",
        ],
    );
}

#[test]
fn the_agent_chat_answers_each_line_and_a_second_start_goes_on_with_the_conversation() {
    let dir = tempfile::tempdir().unwrap();
    let at = dir.path().join("chat");
    let at = at.to_str().unwrap();
    let first = run_with_input("agent_chat", &[at], Some("what is dtask?\nthanks\n"));
    has_in_order(
        "agent_chat",
        &first,
        &[
            "conversation agent-chat-run: started",
            "agent> (1) you said: Hello!",
            "you> what is dtask?",
            "agent> (2) you said: what is dtask?",
            "you> thanks",
            "agent> (3) you said: thanks",
            "(end of input: closing the conversation)",
            "conversation closed after 3 model calls; its last answer: (3) you said: thanks",
        ],
    );
    // A second start finds the conversation ended: nothing is asked again.
    let second = run_with_input("agent_chat", &[at], Some("more?\n"));
    has_in_order(
        "agent_chat",
        &second,
        &[
            "found in the journal, going on",
            "conversation closed after 3 model calls",
        ],
    );
    assert!(!second.contains("you> more?"), "{second}");
}

#[test]
fn the_audit_example_audits_a_journal_being_written_and_replays_a_task() {
    let out = run("audit", &[]);
    has_in_order(
        "audit",
        &out,
        &[
            "audit 1:",
            "audit 2:",
            "audit 3:",
            "created",
            "pending -> running",
            "running -> completed",
            "the replay ends where the engine is: completed",
            "report-0 after 3 records: running",
        ],
    );
    assert_eq!(out.matches(": clean").count(), 3, "{out}");
}

#[test]
fn the_tool_layers_agent_loop_calls_its_typed_tools() {
    let out = run("agent_loop", &[]);
    has_in_order(
        "agent_loop",
        &out,
        &[
            "get_weather({\"city\":\"Paris\"})",
            "to_fahrenheit({\"celsius\":18.0})",
            "assistant: Paris is warmer",
            "(3 steps)",
        ],
    );
}

#[test]
fn the_postgres_nodes_example_runs_a_task_across_two_nodes() {
    let Some(url) = pg::pg_url("examples", "nodes") else {
        return;
    };
    let out = run("postgres_nodes", &[&url]);
    has_in_order(
        "postgres_nodes",
        &out,
        &[
            "node A: ",
            "node B: ",
            "is Completed",
            "the journal audits clean",
        ],
    );
}

#[test]
fn the_embedded_server_example_is_ready_and_runs_a_task_submitted_over_http() {
    let out = run("serve_embedded", &[]);
    has_in_order(
        "serve_embedded",
        &out,
        &[
            "serving on http://127.0.0.1:",
            r#"readyz: {"reasons":[],"status":"ok"}"#,
            "healthz: 200",
            "submitted ",
            r#": "completed": "HELLO, DTASK""#,
            r#"notification for "chat-1": "task_created" "" ("queued")"#,
            r#"notification for "chat-1": "progress" "12 chars" ("queued")"#,
            r#"notification for "chat-1": "completed" "" ("queued")"#,
            "outbox after the acknowledgements: []",
            "metric dtask_ready 1",
            r#"draining: readyz 503 ["manager_closed"]"#,
        ],
    );
}

#[test]
fn the_retention_example_trims_and_purges_by_age_keeps_a_held_task_and_audits_clean() {
    let out = run("retention", &[]);
    has_in_order(
        "retention",
        &out,
        &[
            "watch-1 (running): 200 updates, 164 trimmed by the cap as it ran, 36 whole (4 cap trims)",
            "watch-1 line 201 refused: task \"watch-1\" has recorded its limit of 200 progress updates",
            "deploy-1 on hold: incident 88",
            "trimmed build-1: 35 progress updates (",
            "build-1: 40 updates, 35 trimmed; the latest whole: \"line 40:\"",
            "audit after the trim: 199 progress updates trimmed, clean",
            "purged build-1: 44 records deleted",
            "purged build-2: 3 records deleted",
            "kept deploy-1: task \"deploy-1\" cannot be purged: it is on hold",
            "build-1: purged (its id stays taken)",
            "audit: 4 tasks, 2 purged (47 records deleted), clean",
            "deploy-1 purged once its hold was lifted: 5 records deleted",
        ],
    );
}
