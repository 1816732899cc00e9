//! Nested tasks and mailboxes across a real crash: a child process runs a parent task's
//! attempt that creates children while inputs keep arriving and the first child's attempt
//! notifies the parent, and is killed with SIGKILL in the middle. A new process (this one)
//! opens the same journal: the parent's next attempt sees every acknowledged child exactly
//! once, every acknowledged input and notification is in the mailbox exactly once (a
//! resend is recognized as a replay), each notification beside the child's record of it,
//! and the journal audits clean. Runs without the libtest harness: the same binary is the
//! parent (no arguments) and the child (`--child DIR`).
#![allow(
    clippy::unwrap_used,
    clippy::missing_panics_doc,
    clippy::too_many_lines
)]

use dtask_engine::{
    application_notification_id, Command, CreateRequest, ExecutionContext, InputRequest,
    ManualClock, NotificationRequest, StoreConfig, SystemClock, TaskStore,
};
use dtask_journal::{Delivery, Event, Journal, JournalOptions, LeasePolicy, TaskSpec};
use dtask_replay::Status;
use std::collections::BTreeSet;
use std::io::Write;
use std::path::Path;
use std::process::Command as Process;
use std::time::{Duration, Instant};

fn spec(id: &str) -> TaskSpec {
    TaskSpec::new(id, "agent")
}

fn input(n: u64) -> InputRequest {
    InputRequest {
        event_id: format!("msg-{n}"),
        kind: "message".into(),
        data: format!("message {n}").into_bytes(),
        delivery: Delivery::Queued,
    }
}

/// The first child's `n`-th notification to the parent.
fn note(n: u64) -> NotificationRequest {
    NotificationRequest {
        event_id: format!("note-{n}"),
        kind: "finding".into(),
        data: format!("finding {n}").into_bytes(),
        ..NotificationRequest::default()
    }
}

/// The first child, whose attempt notifies the parent.
const NOTIFIER: &str = "parent/child-0";

/// Appends `line` to the acknowledgement log `file`, synced: written only after the store
/// acknowledged the operation, so every line names something durable.
fn log(dir: &Path, file: &str, line: &str) {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(file))
        .unwrap();
    // One write per line, so that lines appended at once stay whole.
    f.write_all(format!("{line}\n").as_bytes()).unwrap();
    f.sync_all().unwrap();
}

fn read_log(dir: &Path, file: &str) -> Vec<String> {
    std::fs::read_to_string(dir.join(file))
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// The child: the parent's attempt 1 creates children and inputs arrive, until killed.
fn child(dir: &Path) {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let journal = Journal::open(dir.join("journal"), JournalOptions::default()).unwrap();
        let store = TaskStore::open(journal, SystemClock, StoreConfig::default()).unwrap();
        let created = store
            .create(CreateRequest {
                spec: spec("parent"),
                policy: Some(LeasePolicy::Retry),
                ..CreateRequest::default()
            })
            .await
            .unwrap();
        let running = store
            .execute("parent", created.version, Command::Start)
            .await
            .unwrap();
        let sender = {
            let store = store.clone();
            let dir = dir.to_owned();
            tokio::spawn(async move {
                for n in 0.. {
                    store.send_input("parent", input(n)).await.unwrap();
                    log(&dir, "inputs", &format!("msg-{n}"));
                }
            })
        };
        for n in 0.. {
            let id = format!("parent/child-{n}");
            store
                .create(CreateRequest {
                    spec: spec(&id),
                    policy: Some(LeasePolicy::Retry),
                    parent: Some(ExecutionContext {
                        task_id: "parent".into(),
                        attempt: running.attempt,
                        generation: running.mailbox.generation,
                    }),
                    ..CreateRequest::default()
                })
                .await
                .unwrap();
            log(dir, "children", &id);
            if n == 0 {
                let child = store.get(&id).await.unwrap();
                let child = store
                    .execute(&id, child.version, Command::Start)
                    .await
                    .unwrap();
                let store = store.clone();
                let dir = dir.to_owned();
                tokio::spawn(async move {
                    for n in 0.. {
                        store
                            .enqueue_notification(NOTIFIER, child.attempt, note(n))
                            .await
                            .unwrap();
                        log(&dir, "notes", &format!("note-{n}"));
                    }
                });
            }
            if n == 3 {
                std::fs::write(dir.join("running"), b"").unwrap();
            }
        }
        sender.await.unwrap();
    });
}

fn run() -> Result<(), String> {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Process::new(std::env::current_exe().unwrap())
        .args(["--child", dir.path().to_str().unwrap()])
        .spawn()
        .unwrap();
    let started = Instant::now();
    while !dir.path().join("running").exists() {
        if started.elapsed() > Duration::from_secs(120) {
            let _ = child.kill();
            let _ = child.wait();
            return Err("the child never created its children".into());
        }
        if let Some(status) = child.try_wait().unwrap() {
            return Err(format!("the child exited early: {status}"));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    // Let it run a little more, then kill it in the middle of its appends.
    std::thread::sleep(Duration::from_millis(50));
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();

    let acked_children: BTreeSet<String> = read_log(dir.path(), "children").into_iter().collect();
    let acked_inputs = read_log(dir.path(), "inputs");
    let acked_notes: Vec<String> = read_log(dir.path(), "notes")
        .iter()
        .map(|n| application_notification_id(NOTIFIER, n))
        .collect();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let journal = Journal::open(dir.path().join("journal"), JournalOptions::default())
            .map_err(|e| e.to_string())?;
        // The child's lease (30 s from its clock) has certainly run out on this clock.
        let clock =
            ManualClock::new(dtask_engine::Clock::now(&SystemClock).as_millis() + 3_600_000);
        let store = TaskStore::open(journal, clock, StoreConfig::default()).unwrap();
        let parent = store.get("parent").await.unwrap();
        if parent.status != Status::Pending || parent.attempt != 1 {
            return Err(format!(
                "the parent is not pending after expiry: {parent:?}"
            ));
        }
        let next = store
            .execute("parent", parent.version, Command::Start)
            .await
            .unwrap();
        if next.attempt != 2 {
            return Err(format!("attempt 2 expected: {next:?}"));
        }
        // Every acknowledged child, exactly once (an unacknowledged one may be there too:
        // its append may have become durable just before the kill).
        let mut seen = Vec::new();
        let mut cursor = None;
        loop {
            let page = store
                .list_children("parent", cursor.as_deref(), 7)
                .await
                .unwrap();
            seen.extend(page.tasks.iter().map(|t| t.spec.id.clone()));
            match page.next_cursor {
                Some(c) => cursor = Some(c),
                None => break,
            }
        }
        let unique: BTreeSet<String> = seen.iter().cloned().collect();
        if unique.len() != seen.len() {
            return Err(format!("a child is listed twice: {seen:?}"));
        }
        if !acked_children.is_subset(&unique) {
            return Err(format!(
                "acknowledged children missing: {:?}",
                acked_children.difference(&unique).collect::<Vec<_>>()
            ));
        }
        for id in &unique {
            let c = store.get(id).await.unwrap();
            if c.parent_task_id != "parent" {
                return Err(format!("{id} lost its parent: {c:?}"));
            }
        }
        // Every acknowledged input exactly once, in FIFO order, and a resend is a replay.
        let mut inputs = Vec::new();
        loop {
            let page = store
                .list_inputs("parent", inputs.len() as u64, 1000)
                .await
                .unwrap();
            if page.inputs.is_empty() {
                break;
            }
            inputs.extend(page.inputs);
        }
        let latest = store.get("parent").await.unwrap().mailbox.latest;
        let messages: Vec<String> = inputs
            .iter()
            .filter(|i| i.kind == "message")
            .map(|i| i.event_id.clone())
            .collect();
        let unique: BTreeSet<&String> = messages.iter().collect();
        if unique.len() != messages.len() {
            return Err("an input is in the mailbox twice".into());
        }
        if messages.len() < acked_inputs.len() || messages[..acked_inputs.len()] != acked_inputs[..]
        {
            return Err(format!(
                "acknowledged inputs lost or out of order: {} acknowledged, {} kept",
                acked_inputs.len(),
                messages.len()
            ));
        }
        for (n, _) in acked_inputs.iter().enumerate() {
            let (_, inserted) = store.send_input("parent", input(n as u64)).await.unwrap();
            if inserted {
                return Err(format!("msg-{n} was accepted twice"));
            }
        }
        // Every acknowledged notification exactly once, in order, each beside the child's
        // record of it (one append wrote both); a resend from the child's next attempt is a
        // replay.
        let notes: Vec<String> = inputs
            .iter()
            .filter(|i| i.kind == "finding")
            .map(|i| i.event_id.clone())
            .collect();
        if notes.len() < acked_notes.len() || notes[..acked_notes.len()] != acked_notes[..] {
            return Err(format!(
                "acknowledged notifications lost or out of order: {} acknowledged, {} kept",
                acked_notes.len(),
                notes.len()
            ));
        }
        let recorded: Vec<String> = store
            .journal()
            .read_stream(NOTIFIER, 0)
            .filter_map(|r| match r.unwrap().event {
                Event::ParentNotified { event_id, .. } => {
                    Some(application_notification_id(NOTIFIER, &event_id))
                }
                _ => None,
            })
            .collect();
        if recorded != notes {
            return Err(format!(
                "the child's records and the parent's inputs differ: {} against {}",
                recorded.len(),
                notes.len()
            ));
        }
        let child = store.get(NOTIFIER).await.unwrap();
        let child = store
            .execute(NOTIFIER, child.version, Command::Start)
            .await
            .unwrap();
        for n in 0..acked_notes.len() {
            store
                .enqueue_notification(NOTIFIER, child.attempt, note(n as u64))
                .await
                .unwrap();
        }
        let after = store.get("parent").await.unwrap().mailbox.latest;
        if after != latest {
            return Err(format!(
                "a resent notification reached the mailbox again ({latest} → {after})"
            ));
        }
        let audit =
            dtask_replay::audit_journal(store.journal(), &mut |_| {}).map_err(|e| e.to_string())?;
        if !audit.is_clean() {
            return Err(format!("the audit found problems: {:?}", audit.problems));
        }
        let sequences: Vec<u64> = inputs.iter().map(|i| i.sequence).collect();
        if sequences != (1..=latest).collect::<Vec<_>>() {
            return Err(format!("sequences are not 1..n: {sequences:?}"));
        }
        println!(
            "nested_crash: {} children ({} acknowledged), {} inputs ({} acknowledged), \
             {} notifications ({} acknowledged)",
            seen.len(),
            acked_children.len(),
            inputs.len(),
            acked_inputs.len(),
            notes.len(),
            acked_notes.len()
        );
        Ok(())
    })
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--child") {
        child(Path::new(&args[2]));
        return;
    }
    if args.iter().any(|a| a == "--list") {
        return;
    }
    match run() {
        Ok(()) => println!("test nested_crash::parent_killed_after_creating_children ... ok"),
        Err(e) => {
            println!("test nested_crash::parent_killed_after_creating_children ... FAILED: {e}");
            std::process::exit(1);
        }
    }
}
