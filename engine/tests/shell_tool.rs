//! The shell tool against real processes: a start is idempotent by task id (the command runs
//! once however often start is called), and stop ends exactly the command's process group —
//! the run then reports itself canceled, and this process is still here to check.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use dtask_engine::managed::tools::ShellTool;
use dtask_engine::managed::{
    BackgroundTool, RecoverRequest, RecoverableTool, RunOutcome, StartRequest,
};
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

/// Whether any process of the group `pid` leads is alive (a zombie is not).
fn group_alive(pid: i32) -> bool {
    std::fs::read_dir("/proc").unwrap().flatten().any(|entry| {
        std::fs::read_to_string(entry.path().join("stat")).is_ok_and(|stat| {
            // pid (comm) state ppid pgrp …: the fields after the command's name.
            let Some((_, rest)) = stat.rsplit_once(") ") else {
                return false;
            };
            let fields: Vec<&str> = rest.split(' ').collect();
            fields.len() > 2 && fields[0] != "Z" && fields[2] == pid.to_string()
        })
    })
}

fn pid_of(dir: &std::path::Path, task: &str) -> i32 {
    std::fs::read_to_string(dir.join("runs").join(task).join("pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_that_ignores_sigterm_is_killed_when_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let tool = ShellTool::new(dir.path().join("runs"));
    let started = tool
        .start(request(
            "t-3",
            "trap '' TERM; sleep 1000 & wait; sleep 1000",
        ))
        .await
        .unwrap();
    let pid = pid_of(dir.path(), "t-3");
    started.run.stop().await.unwrap();
    let outcome = tokio::time::timeout(Duration::from_secs(60), started.run.wait())
        .await
        .expect("a stopped run ends, SIGTERM ignored or not")
        .unwrap();
    assert_eq!(outcome, RunOutcome::Canceled("stopped".into()));
    assert!(!group_alive(pid), "the command's group runs on");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_whose_group_was_killed_without_a_status_fails() {
    let dir = tempfile::tempdir().unwrap();
    let tool = ShellTool::new(dir.path().join("runs"));
    let started = tool.start(request("t-4", "sleep 1000")).await.unwrap();
    let pid = pid_of(dir.path(), "t-4");
    // What a reboot, or a service manager stopping the whole group, does.
    rustix::process::kill_process_group(
        rustix::process::Pid::from_raw(pid).unwrap(),
        rustix::process::Signal::KILL,
    )
    .unwrap();
    let outcome = tokio::time::timeout(Duration::from_secs(60), started.run.wait())
        .await
        .expect("a run whose command is gone ends")
        .unwrap();
    assert!(
        matches!(&outcome, RunOutcome::Failed(why) if why.contains("without an exit status")),
        "{outcome:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn comments_are_commands_and_long_lines_come_in_parts() {
    use futures::StreamExt;
    let dir = tempfile::tempdir().unwrap();
    let tool = ShellTool::new(dir.path().join("runs"));
    // A comment at the end of the command does not swallow the script around it.
    let started = tool
        .start(request("t-5", "echo hi # say hello"))
        .await
        .unwrap();
    let outcome = tokio::time::timeout(Duration::from_secs(30), started.run.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(outcome, RunOutcome::Completed(b"hi\n".to_vec()));
    // A line longer than an update may hold comes in parts, each within the bound.
    let started = tool
        .start(request(
            "t-6",
            "head -c 300000 /dev/zero | tr '\\0' a; echo; echo end",
        ))
        .await
        .unwrap();
    let updates: Vec<_> = started
        .run
        .updates()
        .unwrap()
        .map(|u| u.unwrap())
        .collect()
        .await;
    let sizes: Vec<usize> = updates.iter().map(|u| u.data.len()).collect();
    let part = dtask_engine::managed::MAX_UPDATE_DATA_BYTES;
    assert_eq!(sizes, [part, 300_000 - part, 3]);
    let ids: Vec<&str> = updates.iter().map(|u| u.event_id.as_str()).collect();
    assert_eq!(ids, ["line:0", "line:1", "line:2"]);
    assert_eq!(updates[2].data, b"end");
}

// A task whose id an earlier version's lossy directory name shares with another task's own
// name (`job.1`'s was `job_1`) is started in its own directory: it runs its command rather
// than answering with `job_1`'s output. A recovery finds a run under the old name only when
// its started marker names that run's process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_never_attaches_to_the_run_of_the_task_its_old_name_was() {
    let dir = tempfile::tempdir().unwrap();
    let tool = ShellTool::new(dir.path().join("runs"));
    let first = tool.start(request("job_1", "echo A")).await.unwrap();
    let outcome = tokio::time::timeout(Duration::from_secs(30), first.run.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(outcome, RunOutcome::Completed(b"A\n".to_vec()));
    let second = tool.start(request("job.1", "echo B")).await.unwrap();
    let outcome = tokio::time::timeout(Duration::from_secs(30), second.run.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(outcome, RunOutcome::Completed(b"B\n".to_vec()));
    // `job:1` has no run of its own; its old name is `job_1` too.
    let recover = |checkpoint: &[u8]| {
        tool.recover(RecoverRequest {
            task_id: "job:1".into(),
            arguments: serde_json::json!({ "command": "echo C" }).to_string(),
            attempt: 2,
            checkpoint: checkpoint.to_vec(),
        })
    };
    assert!(
        recover(br#"{"pid":1}"#).await.is_err(),
        "another task's run was recovered"
    );
    // An earlier version's run of `job:1` would be the one its marker names.
    let recovered = recover(&first.checkpoint).await.unwrap();
    assert_eq!(
        recovered.wait().await.unwrap(),
        RunOutcome::Completed(b"A\n".to_vec())
    );
}

// A command's output over the tool's limit of a result is not read whole: the result is its
// end, from the first whole line, after a line saying how many bytes before it were not kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_outputs_result_is_its_end() {
    let dir = tempfile::tempdir().unwrap();
    // The default limit: 1 MiB, the store's default limit of a value.
    let limit = 1 << 20;
    let tool = ShellTool::new(dir.path().join("runs"));
    let started = tool
        .start(request(
            "t-7",
            "head -c 40000000 /dev/zero; echo; seq 1 200000",
        ))
        .await
        .unwrap();
    let outcome = tokio::time::timeout(Duration::from_secs(60), started.run.wait())
        .await
        .unwrap()
        .unwrap();
    let RunOutcome::Completed(result) = outcome else {
        panic!("{outcome:?}")
    };
    assert!(result.len() <= limit, "{} bytes", result.len());
    let text = String::from_utf8(result).unwrap();
    let (note, end) = text.split_once('\n').unwrap();
    let numbers = (1..=200_000).fold(String::new(), |mut numbers, n| {
        numbers.push_str(&n.to_string());
        numbers.push('\n');
        numbers
    });
    assert!(
        numbers.ends_with(&format!("\n{end}")),
        "not the output's end from a whole line: {end:?}"
    );
    assert!(end.len() > limit - 100, "{} bytes kept", end.len());
    let total = 40_000_001 + numbers.len();
    assert_eq!(
        note,
        format!(
            "[{} earlier bytes of the output were not kept]",
            total - end.len()
        )
    );
    // An output within the limit is the result whole.
    let started = tool.start(request("t-8", "seq 1 3")).await.unwrap();
    let outcome = tokio::time::timeout(Duration::from_secs(60), started.run.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(outcome, RunOutcome::Completed(b"1\n2\n3\n".to_vec()));
}
