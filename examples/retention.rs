//! Retention: finished tasks purged by age a step at a time, an operator's hold that keeps
//! one, and the audit that still accounts for every record the purges deleted.
//!
//! Three tasks run and complete; `deploy-1` is put on hold (an incident is being looked
//! into). A retention sweep — what `dtask serve --retain 30d` runs in the background, here
//! with "everything that ended before now" — purges the others: their records are deleted,
//! one tombstone a task kept, and each id stays taken. The audit is clean and counts the
//! purged tasks. Once the hold is lifted, `deploy-1` is purged by name.
//!
//! Run: `cargo run --example retention`
#![allow(clippy::unwrap_used, missing_docs)]

use dtask::engine::RetentionStep;
use dtask::journal::Timestamp;
use dtask::replay::audit_journal;
use dtask::{
    Command, CreateRequest, Journal, JournalOptions, LeasePolicy, StoreConfig, StoreError,
    SystemClock, TaskSpec, TaskStore,
};

#[tokio::main]
async fn main() {
    let dir = tempfile::tempdir().unwrap();
    let journal = Journal::open(dir.path(), JournalOptions::default()).unwrap();
    let store = TaskStore::open(journal, SystemClock, StoreConfig::default()).unwrap();
    for id in ["build-1", "build-2", "deploy-1"] {
        let request = CreateRequest {
            spec: TaskSpec::new(id, "shell"),
            policy: Some(LeasePolicy::Retry),
            ..CreateRequest::default()
        };
        store.create(request).await.unwrap();
        let running = store.execute(id, 1, Command::Start).await.unwrap();
        let data = format!("{id} done").into_bytes();
        store
            .execute(id, running.version, Command::Complete { data })
            .await
            .unwrap();
    }
    let held = store.hold("deploy-1", "incident 88").await.unwrap();
    println!("deploy-1 on hold: {}", held.hold.as_deref().unwrap_or("-"));

    // A retention sweep: every root task that ended before the cutoff, a step at a time
    // (each purge one atomic write; a sweep cut short is simply run again).
    let cutoff = Timestamp(store.now().0 + 1);
    let mut after = None;
    loop {
        let RetentionStep {
            purged,
            kept,
            next_after,
        } = store.purge_finished(cutoff, after, 100).await.unwrap();
        for stream in &purged {
            println!("purged {}: {} records deleted", stream.task, stream.records);
        }
        for (task, why) in &kept {
            println!("kept {task}: {why}");
        }
        after = next_after;
        if after.is_none() {
            break;
        }
    }

    match store.get("build-1").await {
        Err(StoreError::Purged { task }) => println!("{task}: purged (its id stays taken)"),
        other => println!("build-1: unexpected {other:?}"),
    }
    let report = audit_journal(store.journal(), &mut |_| {}).unwrap();
    println!(
        "audit: {} tasks, {} purged ({} records deleted), {}",
        report.tasks,
        report.purged,
        report.purged_records,
        if report.is_clean() {
            "clean"
        } else {
            "PROBLEMS"
        }
    );

    store.lift_hold("deploy-1").await.unwrap();
    let purged = store.purge("deploy-1").await.unwrap();
    println!(
        "deploy-1 purged once its hold was lifted: {} records deleted",
        purged[0].records
    );
}
