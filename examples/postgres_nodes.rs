//! Two nodes on one PostgreSQL journal: a task created and claimed on one is followed by the
//! other, and an auditor's read-only open reads back only what the database has made
//! durable. Each node waits a second past a lease's deadline before it expires it (the
//! expiry grace, for clocks that disagree).
//!
//! Run: `cargo run --example postgres_nodes -- 'postgres://me@127.0.0.1:5432/db?schema=example'`
//! (`./dev postgres` starts a private database and prints its URL; over TLS, add
//! `&sslmode=verify-full&sslrootcert=ca.pem`). The schema must hold no journal yet, or one
//! of an earlier run of this example.
#![allow(clippy::unwrap_used, missing_docs)]

use dtask::engine::{Command, CreateRequest, StoreConfig, SystemClock, TaskStore};
use dtask::journal::{Journal, JournalOptions, LeasePolicy, TaskSpec};
use std::time::Duration;

fn node(url: &str) -> TaskStore {
    let journal = Journal::open_postgres(url, JournalOptions::default()).unwrap();
    let config = StoreConfig::default().with_expiry_grace(Duration::from_secs(1));
    TaskStore::open(journal, SystemClock, config).unwrap()
}

#[tokio::main]
async fn main() {
    let Some(url) = std::env::args().nth(1) else {
        eprintln!("usage: postgres_nodes 'postgres://user@host:port/db?schema=NAME'");
        std::process::exit(2);
    };
    let (a, b) = (node(&url), node(&url));
    println!("two nodes on {}", a.journal().location());

    let id = format!("job-{}", std::process::id());
    let spec = TaskSpec::new(id.clone(), "reports");
    let created = a
        .create(CreateRequest {
            spec,
            policy: Some(LeasePolicy::Retry),
            ..CreateRequest::default()
        })
        .await
        .unwrap();
    let running = a
        .execute(&id, created.version, Command::Start)
        .await
        .unwrap();
    println!(
        "node A: {id} is {:?} (attempt {})",
        running.status, running.attempt
    );

    // Node B follows the journal: it sees what A committed.
    b.refresh().await.unwrap();
    println!("node B: {id} is {:?}", b.get(&id).await.unwrap().status);

    // B finishes it (A's view was a cache: the database decides who wins).
    let done = b
        .execute(
            &id,
            running.version,
            Command::Complete {
                data: b"42 pages".to_vec(),
            },
        )
        .await
        .unwrap();
    println!("node B: {id} is {:?}", done.status);

    // An auditor reads what the database has made durable, and checks it.
    let auditor = Journal::open_postgres_read_only(&url).unwrap();
    let records = auditor.read_stream(&id, 0).count();
    let audit = dtask::replay::audit_journal(&auditor, &mut |_| {}).unwrap();
    println!(
        "auditor: {records} durable records of {id}; the journal audits {}",
        if audit.is_clean() {
            "clean"
        } else {
            "with problems"
        }
    );
}
