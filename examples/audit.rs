//! An auditor beside a running engine. Every transition of a task is a record of the journal,
//! so an audit needs nothing but the journal:
//!
//! 1. an engine runs tasks (created, started, a few progress updates, completed);
//! 2. while it writes, the auditor audits the whole journal — damage, legal transitions, the
//!    indexes — on the journal's **frozen view**, which does not move while it is read (the
//!    audit `dtask verify` runs);
//! 3. it replays one task record by record through its own [`Replay`], printing which event
//!    moved the task from which status to which, and checks the end against what the engine
//!    reports;
//! 4. it folds the same task as it stood after its first three records ([`load_task_at`]).
//!
//! Run: `cargo run --example audit -- [DIR]` (default: a temporary directory). Afterwards
//! `cargo run -- --journal DIR/journal verify` runs the same audit from the command line.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use dtask::engine::{Command, CreateRequest, StoreConfig, SystemClock, TaskStore, UpdateRequest};
use dtask::journal::{Journal, JournalOptions, LeasePolicy, Record, TaskSpec};
use dtask::replay::{audit_journal, load_task_at, replay_task, FoldError, Replay, Task};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// One task as an engine runs it: created, started, `steps` updates, completed.
async fn run_task(store: &TaskStore, id: &str, steps: u64) {
    let created = store
        .create(CreateRequest {
            spec: TaskSpec {
                id: id.into(),
                executor_key: "report".into(),
                kind: "example".into(),
                ..TaskSpec::default()
            },
            policy: Some(LeasePolicy::Retry),
            ..CreateRequest::default()
        })
        .await
        .unwrap();
    let running = store
        .execute(id, created.version, Command::Start)
        .await
        .unwrap();
    for step in 0..steps {
        store
            .append_update(
                id,
                UpdateRequest {
                    attempt: running.attempt,
                    event_id: format!("step-{step}"),
                    kind: "progress".into(),
                    data: format!("{} of {steps}", step + 1).into_bytes(),
                    ..UpdateRequest::default()
                },
            )
            .await
            .unwrap();
    }
    store
        .execute(
            id,
            running.version,
            Command::Complete {
                data: b"report ready".to_vec(),
            },
        )
        .await
        .unwrap();
}

/// An audit trail: the fold of `id`'s stream, printing what each record did to the task.
struct Trail<'a> {
    id: &'a str,
    task: Option<Task>,
}

impl Replay for Trail<'_> {
    type Error = FoldError;

    fn replay(&mut self, record: &Record) -> Result<(), FoldError> {
        let before = self.task.as_ref().map(|t| t.state.status);
        match self.task.as_mut() {
            None => self.task = Some(Task::from_created(self.id, record.event.clone())?),
            Some(task) => task.apply(&record.event)?,
        }
        let after = self.task.as_ref().map(|t| t.state.status);
        let moved = match (before, after) {
            (Some(b), Some(a)) if b != a => format!("{b} -> {a}"),
            (None, Some(a)) => format!("-> {a}"),
            (_, Some(a)) => format!("{a}"),
            (_, None) => String::new(),
        };
        println!(
            "  #{:<2} seq {:<4} {:<18} {moved}",
            record.position,
            record.seq,
            record.event.event_type().as_str(),
        );
        Ok(())
    }
}

#[tokio::main]
async fn main() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = std::env::args()
        .nth(1)
        .map_or_else(|| tmp.path().to_path_buf(), std::path::PathBuf::from);
    let journal = Journal::open(dir.join("journal"), JournalOptions::default()).unwrap();
    let store = TaskStore::open(journal.clone(), SystemClock, StoreConfig::default()).unwrap();

    // 1. The engine at work: eight callers, each running tasks one after another.
    let stop = Arc::new(AtomicBool::new(false));
    let callers: Vec<_> = (0..8)
        .map(|c| {
            let (store, stop) = (store.clone(), Arc::clone(&stop));
            tokio::spawn(async move {
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) || n == 0 {
                    run_task(&store, &format!("report-{}", c + 8 * n), 4).await;
                    n += 1;
                }
            })
        })
        .collect();

    // 2. Audits while it writes, each of one moment of the journal.
    for round in 1..=3 {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        let frozen = journal.frozen().unwrap();
        let view = frozen.journal().clone();
        let report = tokio::task::spawn_blocking(move || audit_journal(&view, &mut |_| {}))
            .await
            .unwrap()
            .unwrap();
        println!(
            "audit {round}: {} tasks, {} records up to sequence {}, {} live: {}",
            report.tasks,
            report.records,
            report.last_seq,
            report.live,
            if report.is_clean() {
                "clean"
            } else {
                "PROBLEMS"
            }
        );
        for problem in &report.problems {
            println!("  {problem}");
        }
        assert!(report.is_clean());
    }
    stop.store(true, Ordering::Relaxed);
    for caller in callers {
        caller.await.unwrap();
    }

    // 3. One task, record by record.
    println!("report-0, record by record:");
    let mut trail = Trail {
        id: "report-0",
        task: None,
    };
    replay_task(&journal, "report-0", None, &mut trail).unwrap();
    let replayed = trail.task.expect("report-0 has records");
    let engine = store.get("report-0").await.unwrap();
    assert_eq!(
        replayed.state, engine,
        "the replay ends where the engine is"
    );
    println!(
        "  the replay ends where the engine is: {} at version {}, updates: {}",
        engine.status, engine.version, engine.updates
    );

    // 4. The same task as it stood after its first three records.
    let then = load_task_at(&journal, "report-0", 3).unwrap().unwrap();
    println!(
        "report-0 after 3 records: {} at version {}, updates: {}",
        then.state.status, then.state.version, then.state.updates
    );
}
