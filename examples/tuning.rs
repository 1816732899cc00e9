//! A journal opened with tuned options, under a load of concurrent writers, and what that load
//! left owed to RocksDB's background work — the figures docs/tuning.md says to watch.
//!
//! 1. opens a journal with the options a service tunes (`JournalOptions::with_…`);
//! 2. runs `WRITERS` closed-loop writers on a multi-threaded runtime, each appending synced
//!    progress updates to a task of its own and awaiting each before the next;
//! 3. prints the appends a second and, per column family, the memtables, level-0 files and
//!    compaction bytes owed (`Journal::storage_stats`), and whether the open chose direct I/O
//!    for table files.
//!
//! Run: `cargo run --release --example tuning -- [WRITERS] [APPENDS_EACH] [DIR]` (defaults:
//! 64 writers, 1,000 appends each, a temporary directory).
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use dtask::journal::{
    Durability, Event, Journal, JournalOptions, LeasePolicy, TaskSpec, Timestamp,
};
use std::time::{Duration, Instant};

fn created(id: &str) -> Event {
    Event::Created {
        spec: TaskSpec {
            id: id.into(),
            executor_key: "example".into(),
            ..TaskSpec::default()
        }
        .into(),
        policy: LeasePolicy::Retry,
        checkpoint: vec![],
        context_snapshot: vec![],
        at: Timestamp(1),
    }
}

fn update(i: u64) -> Event {
    Event::UpdateAppended {
        attempt: 1,
        event_id: format!("step-{i}"),
        kind: "progress".into(),
        data: vec![7; 200],
        metadata: vec![],
        at: Timestamp(i),
    }
}

/// One writer: creates its task, then appends `appends` updates, each awaited.
async fn writer(journal: Journal, id: String, appends: u64) {
    journal.append_async(&id, 0, &[created(&id)]).await.unwrap();
    for i in 1..=appends {
        journal.append_async(&id, i, &[update(i)]).await.unwrap();
    }
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let writers: usize = args.next().map_or(Ok(64), |a| a.parse())?;
    let each: u64 = args.next().map_or(Ok(1000), |a| a.parse())?;
    let temp = tempfile::tempdir()?;
    let dir = args
        .next()
        .map_or_else(|| temp.path().join("journal"), Into::into);

    let options = JournalOptions::default()
        // Every acknowledged append synced (the default; `Buffered` is for tests).
        .with_durability(Durability::Sync)
        // Finished streams kept out of the live ones' way (the default): faster recovery.
        .with_keep_finished_apart(true)
        // A close that waits at most 2 s for the compaction and moves due, not 10.
        .with_settle_on_close(Duration::from_secs(2));
    let journal = Journal::open(&dir, options)?;

    let started = Instant::now();
    let tasks: Vec<_> = (0..writers)
        .map(|w| tokio::spawn(writer(journal.clone(), format!("writer-{w}"), each)))
        .collect();
    for task in tasks {
        task.await?;
    }
    let took = started.elapsed().as_secs_f64();
    let appends = writers as u64 * (each + 1);
    // An example's count fits in 32 bits (and so converts exactly).
    let rate = f64::from(u32::try_from(appends).unwrap_or(u32::MAX)) / took;
    println!("{writers} writers: {appends} synced appends in {took:.2} s ({rate:.0} appends/s)");

    if let Some(stats) = journal.storage_stats()? {
        println!(
            "table files written with direct I/O: {}",
            stats.direct_table_io
        );
        println!("space      memtables  waiting  level-0 files  compaction owed");
        for space in &stats.spaces {
            println!(
                "{:<10} {:>8} KiB {:>7} {:>14} {:>12} KiB",
                space.name,
                space.memtable_bytes / 1024,
                space.immutable_memtables,
                space.level0_files,
                space.pending_compaction_bytes / 1024
            );
        }
        println!(
            "writes slowed: {}, stopped: {}",
            stats.delayed_write_rate != 0,
            stats.write_stopped
        );
    }
    Ok(())
}
