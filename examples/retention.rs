//! Retention: finished tasks' older progress trimmed, finished tasks purged by age a step at a
//! time, an operator's hold that keeps one, and the audit that still accounts for every record
//! the trims rewrote and the purges deleted.
//!
//! Three tasks run and complete, `build-1` with 40 lines of output (progress updates);
//! `deploy-1` is put on hold (an incident is being looked into). A trim sweep — the first
//! tier of retention — keeps the last 5 updates of `build-1` whole and drops the bytes of the
//! others, which keep their place and event ids. A retention sweep — what `dtask serve
//! --retain 30d` runs in the background, here with "everything that ended before now" —
//! purges the others: their records are deleted, one tombstone a task kept, and each id stays
//! taken. The audit is clean and counts the purged tasks. Once the hold is lifted, `deploy-1`
//! is purged by name.
//!
//! The store also caps running tasks' progress (`StoreConfig::with_progress_cap`): `watch-1`,
//! a tool that runs on and reports 200 lines, is trimmed to its last 10 updates each time it
//! holds more than 50 whole ones — by its own updates, as it runs — and refused a 201st,
//! the store's limit of updates a task may record (`StoreConfig::with_max_updates`).
//!
//! Run: `cargo run --example retention`
#![allow(clippy::unwrap_used, missing_docs)]

use dtask::engine::{RetentionStep, UpdateRequest};
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
    let config = StoreConfig::default()
        .with_progress_cap(50, 10)
        .with_max_updates(200);
    let store = TaskStore::open(journal, SystemClock, config).unwrap();
    for id in ["build-1", "build-2", "deploy-1"] {
        let request = CreateRequest {
            spec: TaskSpec::new(id, "shell"),
            policy: Some(LeasePolicy::Retry),
            ..CreateRequest::default()
        };
        store.create(request).await.unwrap();
        let running = store.execute(id, 1, Command::Start).await.unwrap();
        if id == "build-1" {
            for line in 1..=40 {
                let update = UpdateRequest {
                    attempt: running.attempt,
                    event_id: format!("line-{line}"),
                    kind: "stdout".into(),
                    data: format!("line {line}: {}", "x".repeat(100)).into_bytes(),
                    ..UpdateRequest::default()
                };
                store.append_update(id, update).await.unwrap();
            }
        }
        let data = format!("{id} done").into_bytes();
        store
            .execute(id, running.version, Command::Complete { data })
            .await
            .unwrap();
    }
    watch(&store).await;

    let held = store.hold("deploy-1", "incident 88").await.unwrap();
    println!("deploy-1 on hold: {}", held.hold.as_deref().unwrap_or("-"));

    // The first tier: every task that ended before the cutoff keeps its last 5 updates whole.
    let cutoff = Timestamp(store.now().0 + 1);
    let step = store.trim_finished(cutoff, 5, None, 100).await.unwrap();
    for trimmed in &step.trimmed {
        println!(
            "trimmed {}: {} progress updates ({} bytes saved)",
            trimmed.task, trimmed.records, trimmed.bytes
        );
    }
    let updates = store
        .list_updates("build-1", None, 100, false)
        .await
        .unwrap();
    let trimmed = updates.updates.iter().filter(|u| u.trimmed).count();
    let latest = updates.updates.last().unwrap();
    println!(
        "build-1: {} updates, {trimmed} trimmed; the latest whole: {:?}",
        updates.updates.len(),
        String::from_utf8_lossy(&latest.data[..8])
    );
    let report = audit_journal(store.journal(), &mut |_| {}).unwrap();
    println!(
        "audit after the trim: {} progress updates trimmed, {}",
        report.trimmed_records,
        verdict(&report)
    );

    // A retention sweep: every root task that ended before the cutoff, a step at a time
    // (each purge one atomic write; a sweep cut short is simply run again).
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
        verdict(&report)
    );

    store.lift_hold("deploy-1").await.unwrap();
    let purged = store.purge("deploy-1").await.unwrap();
    println!(
        "deploy-1 purged once its hold was lifted: {} records deleted",
        purged[0].records
    );
}

/// A tool that runs on, reporting 200 lines: the store's cap trims its progress as it goes.
async fn watch(store: &TaskStore) {
    let request = CreateRequest {
        spec: TaskSpec::new("watch-1", "shell"),
        policy: Some(LeasePolicy::Retry),
        ..CreateRequest::default()
    };
    store.create(request).await.unwrap();
    let running = store.execute("watch-1", 1, Command::Start).await.unwrap();
    for line in 1..=200 {
        let update = UpdateRequest {
            attempt: running.attempt,
            event_id: format!("line-{line}"),
            kind: "stdout".into(),
            data: format!("line {line}: {}", "y".repeat(100)).into_bytes(),
            ..UpdateRequest::default()
        };
        store.append_update("watch-1", update).await.unwrap();
    }
    let watch = store.get("watch-1").await.unwrap();
    println!(
        "watch-1 ({}): {} updates, {} trimmed by the cap as it ran, {} whole ({} cap trims)",
        watch.status,
        watch.updates,
        watch.trimmed,
        dtask::engine::whole_updates(&watch),
        store.counts().progress_capped
    );
    // Past the store's limit: refused, nothing written.
    let one_more = UpdateRequest {
        attempt: running.attempt,
        event_id: "line-201".into(),
        kind: "stdout".into(),
        data: b"line 201".to_vec(),
        ..UpdateRequest::default()
    };
    match store.append_update("watch-1", one_more).await {
        Err(e @ StoreError::UpdateLimit { .. }) => println!("watch-1 line 201 refused: {e}"),
        other => panic!("expected the update limit, got {other:?}"),
    }
}

/// What an audit found, in a word.
fn verdict(report: &dtask::replay::AuditReport) -> &'static str {
    if report.is_clean() {
        "clean"
    } else {
        "PROBLEMS"
    }
}
