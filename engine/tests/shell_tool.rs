//! The shell tool against real processes: a start is idempotent by task id (the command runs
//! once however often start is called), and stop ends exactly the command's process group —
//! the run then reports itself canceled, and this process is still here to check.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use dtask_engine::managed::tools::ShellTool;
use dtask_engine::managed::{BackgroundTool, RunOutcome, StartRequest};
use std::time::Duration;

fn request(task_id: &str, command: &str) -> StartRequest {
    StartRequest {
        task_id: task_id.into(),
        arguments: serde_json::json!({ "command": command }).to_string(),
        attempt: 1,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn starting_twice_runs_the_command_once() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = dir.path().join("ledger");
    let tool = ShellTool::new(dir.path().join("runs"));
    let command = format!("echo ran >> '{}'; echo done", ledger.display());
    let first = tool.start(request("t-1", &command)).await.unwrap();
    let second = tool.start(request("t-1", &command)).await.unwrap();
    assert_eq!(
        first.checkpoint, second.checkpoint,
        "the same run (same pid)"
    );
    let outcome = tokio::time::timeout(Duration::from_secs(30), second.run.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(outcome, RunOutcome::Completed(b"done\n".to_vec()));
    assert_eq!(std::fs::read_to_string(&ledger).unwrap(), "ran\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_ends_the_command_and_the_run_reports_canceled() {
    let dir = tempfile::tempdir().unwrap();
    let tool = ShellTool::new(dir.path().join("runs"));
    let started = tool
        .start(request("t-2", "echo started; sleep 60"))
        .await
        .unwrap();
    let pid: i32 = std::fs::read_to_string(dir.path().join("runs/t-2/pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(pid > 1);
    started.run.stop().await.unwrap();
    let outcome = tokio::time::timeout(Duration::from_secs(30), started.run.wait())
        .await
        .expect("a stopped run ends")
        .unwrap();
    assert_eq!(outcome, RunOutcome::Canceled("stopped".into()));
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists()
            || std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .is_ok_and(|stat| stat.contains(") Z ")),
        "the command's shell is gone"
    );
    // Stopping again is harmless.
    started.run.stop().await.unwrap();
}
