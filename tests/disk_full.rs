//! A journal whose disk fills — a real file system, a tmpfs of the test's own: appends fail
//! with a no-space storage error and leave nothing behind (no record, no sequence, no index
//! entry); once space is freed the journal writes again by itself, each task going on at
//! the position where it stopped; closed and opened again, it holds every acknowledged
//! append and audits clean.
//!
//! The tmpfs is mounted in a mount namespace of the test's own (`unshare`): no privilege is
//! needed where unprivileged user namespaces are allowed (root's plain mount namespace is
//! tried next), and no mount outlives the test. Where neither can mount, the test says
//! SKIPPED — unless `DTASK_REQUIRE_TMPFS` is set, as CI sets it, which makes that a failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use dtask::journal::{Event, Journal, JournalOptions, LeasePolicy, TaskSpec, Timestamp};
use std::io::Write as _;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// The environment variable that makes the test binary the child, naming its mount point.
const CHILD: &str = "DTASK_DISK_FULL_CHILD";

/// This test's name, which the child runs alone.
const NAME: &str = "a_full_disk_fails_appends_cleanly_and_the_journal_writes_again_with_room";

/// The tmpfs's size: the journal and its ballast, and after the ballast is gone more than
/// RocksDB asks to be free before it writes again (its largest memtable, 64 MiB).
const TMPFS: &str = "size=160m";

/// What the ballast leaves free before the journal opens: the journal fills it.
const SLACK: u64 = 6 << 20;

/// Writers, each appending to a task of its own.
const WRITERS: usize = 8;

/// Appends a writer makes at most before the disk must have filled.
const MAX_APPENDS: u64 = 100_000;

/// Appends each writer makes once the journal writes again.
const AFTER: u64 = 20;

/// How long the journal may take to write again once space is freed: RocksDB looks for
/// room every 5 s.
const RESUME_WITHIN: Duration = Duration::from_secs(120);

#[test]
fn a_full_disk_fails_appends_cleanly_and_the_journal_writes_again_with_room() {
    if let Some(dir) = std::env::var_os(CHILD) {
        child(Path::new(&dir));
        return;
    }
    let mount = tempfile::tempdir().unwrap();
    let exe = std::env::current_exe().unwrap();
    let script = format!(
        "mount -t tmpfs -o {TMPFS} dtask-disk-full \"$0\" || exit 77; \
         exec \"$1\" --exact {NAME} --nocapture --test-threads 1"
    );
    let mut refused = Vec::new();
    for namespace in [
        &["--user", "--map-root-user", "--mount"][..],
        &["--mount"][..],
    ] {
        let output = Command::new("unshare")
            .args(namespace)
            .args(["sh", "-c", &script])
            .arg(mount.path())
            .arg(&exe)
            .env(CHILD, mount.path())
            .output();
        let output = match output {
            Ok(output) => output,
            Err(e) => {
                refused.push(format!("unshare: {e}"));
                break;
            }
        };
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        if output.status.success() && stdout.contains("1 passed") {
            print!("{stdout}");
            return;
        }
        assert!(
            output.status.code() != Some(101) && !stdout.contains("panicked"),
            "the child failed:\n{stdout}\n{stderr}"
        );
        refused.push(format!(
            "unshare {}: {} {}",
            namespace.join(" "),
            output.status,
            stderr.trim()
        ));
    }
    let why = refused.join("; ");
    assert!(
        std::env::var_os("DTASK_REQUIRE_TMPFS").is_none(),
        "no tmpfs could be mounted: {why}"
    );
    eprintln!("SKIPPED {NAME}: no tmpfs could be mounted ({why})");
}

fn created(id: &str) -> Event {
    Event::created(TaskSpec::new(id, "disk"), LeasePolicy::Retry, Timestamp(1))
}

/// The event at `position` of a writer's task: its creation, an attempt, then updates of
/// 2 KiB (a legal stream, so that the audit at the end checks every record).
fn event(id: &str, position: u64) -> Event {
    match position {
        0 => created(id),
        1 => Event::AttemptStarted {
            attempt: 1,
            lease_deadline: Timestamp(u64::MAX / 2),
            at: Timestamp(2),
        },
        n => Event::UpdateAppended {
            attempt: 1,
            event_id: format!("step-{n}"),
            kind: "progress".into(),
            data: vec![0x5a; 2048],
            metadata: vec![],
            at: Timestamp(n),
        },
    }
}

/// Fills the file system of `dir` with a ballast file, then gives back all but `slack`
/// bytes of it.
fn ballast(path: &Path, slack: u64) {
    let mut file = std::fs::File::create(path).unwrap();
    let chunk = vec![0u8; 1 << 20];
    let mut written = 0u64;
    loop {
        match file.write(&chunk) {
            Ok(0) => break,
            Ok(n) => written += n as u64,
            Err(e) if e.raw_os_error() == Some(28) => break,
            Err(e) => panic!("writing the ballast: {e}"),
        }
    }
    assert!(written > slack, "the file system is smaller than the slack");
    file.set_len(written - slack).unwrap();
    file.sync_all().unwrap();
}

/// The test proper, on the tmpfs mounted at `dir`.
fn child(dir: &Path) {
    let ballast_path = dir.join("ballast");
    ballast(&ballast_path, SLACK);
    let path = dir.join("journal");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let journal = Journal::open(&path, JournalOptions::default()).unwrap();

    // Every writer appends until the disk is full; each failure must say so.
    let stopped: Vec<u64> = runtime.block_on(async {
        let writers = (0..WRITERS).map(|w| {
            let journal = journal.clone();
            tokio::spawn(async move {
                let id = format!("task-{w}");
                for position in 0..MAX_APPENDS {
                    match journal
                        .append_async(&id, position, &[event(&id, position)])
                        .await
                    {
                        Ok(_) => {}
                        Err(e) => {
                            assert!(e.is_no_space(), "{id} at {position}: {e}");
                            return position;
                        }
                    }
                }
                panic!("{id}: the disk never filled in {MAX_APPENDS} appends");
            })
        });
        futures::future::join_all(writers)
            .await
            .into_iter()
            .map(Result::unwrap)
            .collect()
    });
    let acknowledged: u64 = stopped.iter().sum();
    println!("disk full after {acknowledged} acknowledged appends: {stopped:?}");

    // Nothing of a failed append is there: each stream ends at its last acknowledged
    // append, and no sequence was taken.
    for (w, &len) in stopped.iter().enumerate() {
        let read = journal.read_stream(&format!("task-{w}"), 0).count() as u64;
        assert_eq!(read, len, "task-{w}'s stream");
    }
    assert_eq!(journal.last_seq().unwrap(), acknowledged);

    // Room again: the journal writes again by itself, each task at the position where it
    // stopped (its failed append left nothing there to conflict with).
    std::fs::remove_file(&ballast_path).unwrap();
    let freed = Instant::now();
    runtime.block_on(async {
        for (w, &at) in stopped.iter().enumerate() {
            let id = format!("task-{w}");
            loop {
                match journal.append_async(&id, at, &[event(&id, at)]).await {
                    Ok(_) => break,
                    Err(e) => {
                        assert!(e.is_no_space(), "{id} at {at}, space freed: {e}");
                        assert!(
                            freed.elapsed() < RESUME_WITHIN,
                            "the journal did not write again within {RESUME_WITHIN:?} of the \
                             space being freed: {e}"
                        );
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            }
            for position in at + 1..=at + AFTER {
                journal
                    .append_async(&id, position, &[event(&id, position)])
                    .await
                    .unwrap();
            }
        }
    });
    println!(
        "writing again {:?} after the space was freed",
        freed.elapsed()
    );
    drop(journal);

    // Opened again (the tail marker, the indexes and the streams agree, or the open would
    // refuse): every acknowledged append is there, the sequences have no gap, the audit is
    // clean.
    let journal = Journal::open(&path, JournalOptions::default()).unwrap();
    let per_task = 1 + AFTER;
    for (w, &len) in stopped.iter().enumerate() {
        let read = journal.read_stream(&format!("task-{w}"), 0).count() as u64;
        assert_eq!(read, len + per_task, "task-{w}'s stream after the reopen");
    }
    let total = acknowledged + per_task * WRITERS as u64;
    assert_eq!(journal.last_seq().unwrap(), total);
    let audit = dtask::replay::audit_journal(&journal, &mut |_| {}).unwrap();
    assert!(audit.is_clean(), "{:?}", audit.problems);
    assert_eq!(audit.records, total);
}
