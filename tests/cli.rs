//! The `dtask` command-line tool, run as a process on journals built by the tests (with the
//! task store and a manual clock, so every time and digest is deterministic).
//!
//! Golden files live in `tests/golden/`; `DTASK_BLESS=1 cargo test -p dtask --test cli`
//! rewrites them.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)]

mod pg;

use assert_cmd::Command;
use dtask_engine::{
    Command as Cmd, CreateRequest, ManualClock, StoreConfig, TaskStore, UpdateRequest,
};
use dtask_journal::keys::{self, Space};
use dtask_journal::{
    record, Digest, Event, Journal, JournalOptions, LeasePolicy, TaskSpec, Timestamp,
};
use predicates::prelude::*;
use std::path::Path;
use std::time::Duration;

/// 2023-11-14T22:13:20.000Z.
const T0: u64 = 1_700_000_000_000;

fn request(id: &str, executor: &str, payload: &[u8], policy: LeasePolicy) -> CreateRequest {
    CreateRequest {
        spec: TaskSpec {
            id: id.into(),
            executor_key: executor.into(),
            kind: "tool_call".into(),
            payload: payload.to_vec(),
            description: format!("the {id} task"),
            output_file: String::new(),
            session_id: "sess".into(),
            notify_session: true,
        },
        policy: Some(policy),
        ..CreateRequest::default()
    }
}

fn update(attempt: u64, id: &str, data: &str) -> UpdateRequest {
    UpdateRequest {
        attempt,
        event_id: id.into(),
        kind: "progress".into(),
        data: data.as_bytes().to_vec(),
        metadata: vec![("step".into(), id.into())],
        ..UpdateRequest::default()
    }
}

/// Builds the fixture journal: five tasks covering every status path the CLI shows.
///
/// - `alpha` (shell): started marker, two updates, heartbeat, completed.
/// - `beta` (approval): waits for input, is answered, completes on attempt 2.
/// - `gamma` (fetch): canceled while running.
/// - `delta` (no JSON payload): pending.
/// - `epsilon` (shell, fail policy): its lease expires, failed.
///
/// Three notifications are delivered and acknowledged; the rest stay queued.
fn fixture(dir: &Path) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let clock = ManualClock::new(T0);
        // Finished streams kept apart: the commands read both places (the golden export is
        // the same bytes as before streams were kept apart).
        let options = JournalOptions::default().with_keep_finished_apart(true);
        let journal = Journal::open(dir, options).unwrap();
        let store = TaskStore::open(journal, clock.clone(), StoreConfig::default()).unwrap();
        let tick = || clock.advance(Duration::from_secs(1));
        let shell = br#"{"tool_name":"shell","command":"ls"}"#;
        for (id, executor, payload, policy) in [
            ("alpha", "shell", &shell[..], LeasePolicy::Retry),
            (
                "beta",
                "approval",
                br#"{"tool_name":"approval"}"#,
                LeasePolicy::Retry,
            ),
            (
                "gamma",
                "fetch",
                br#"{"tool_name":"fetch"}"#,
                LeasePolicy::Retry,
            ),
            ("delta", "shell", b"raw bytes", LeasePolicy::Retry),
            ("epsilon", "shell", &shell[..], LeasePolicy::Fail),
        ] {
            store
                .create(request(id, executor, payload, policy))
                .await
                .unwrap();
            tick();
        }
        // alpha
        let t = store.execute("alpha", 1, Cmd::Start).await.unwrap();
        tick();
        let t = store
            .execute(
                "alpha",
                t.version,
                Cmd::CommitStart {
                    checkpoint: b"pid=7".to_vec(),
                },
            )
            .await
            .unwrap();
        tick();
        store
            .append_update("alpha", update(1, "a-1", "half"))
            .await
            .unwrap();
        tick();
        store
            .append_update("alpha", update(1, "a-2", "all"))
            .await
            .unwrap();
        tick();
        let t = store
            .execute("alpha", t.version, Cmd::Heartbeat)
            .await
            .unwrap();
        tick();
        store
            .execute(
                "alpha",
                t.version,
                Cmd::Complete {
                    data: b"exit 0".to_vec(),
                },
            )
            .await
            .unwrap();
        tick();
        // beta
        let t = store.execute("beta", 1, Cmd::Start).await.unwrap();
        tick();
        let t = store
            .execute(
                "beta",
                t.version,
                Cmd::WaitInput {
                    checkpoint: b"deploy?".to_vec(),
                },
            )
            .await
            .unwrap();
        tick();
        let t = store
            .execute(
                "beta",
                t.version,
                Cmd::Resume {
                    data: b"yes".to_vec(),
                    context_snapshot: None,
                },
            )
            .await
            .unwrap();
        tick();
        let t = store.execute("beta", t.version, Cmd::Start).await.unwrap();
        tick();
        store
            .execute(
                "beta",
                t.version,
                Cmd::Complete {
                    data: b"deployed".to_vec(),
                },
            )
            .await
            .unwrap();
        tick();
        // gamma
        let t = store.execute("gamma", 1, Cmd::Start).await.unwrap();
        tick();
        let t = store
            .execute(
                "gamma",
                t.version,
                Cmd::RequestCancel {
                    reason: "not needed".into(),
                },
            )
            .await
            .unwrap();
        tick();
        store
            .execute(
                "gamma",
                t.version,
                Cmd::AckCancel {
                    reason: String::new(),
                },
            )
            .await
            .unwrap();
        tick();
        // epsilon
        store.execute("epsilon", 1, Cmd::Start).await.unwrap();
        clock.advance(Duration::from_secs(31));
        store.get("epsilon").await.unwrap();
        tick();
        // the outbox: three delivered and acknowledged
        for n in store
            .receive_notifications(3, Duration::from_secs(60))
            .await
            .unwrap()
        {
            store.ack_notification(&n.receipt).await.unwrap();
        }
    });
}

fn built() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    fixture(dir.path());
    dir
}

fn dtask(journal: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_dtask"));
    cmd.env_remove("DTASK_JOURNAL")
        .arg("--journal")
        .arg(journal);
    cmd
}

fn stdout(cmd: &mut Command) -> String {
    let output = cmd.assert().success().get_output().stdout.clone();
    String::from_utf8(output).unwrap()
}

/// The ids of the tasks a `tasks --json` listing holds, in order.
fn listed_ids(listing: &serde_json::Value) -> Vec<serde_json::Value> {
    listing["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].clone())
        .collect()
}

fn golden(name: &str, actual: &str) {
    let path = manifest_dir().join("tests/golden").join(name);
    if std::env::var_os("DTASK_BLESS").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path)
        .unwrap_or_else(|_| panic!("missing golden {}: run with DTASK_BLESS=1", path.display()));
    assert!(
        expected == actual,
        "{name} differs from its golden file (DTASK_BLESS=1 regenerates it)\n--- expected\n{expected}\n--- actual\n{actual}"
    );
}

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap()
}

/// The column family holding `task`'s records: `events` while its stream has no terminal
/// record, `finished` after.
fn records_cf<'a>(db: &'a rocksdb::DB, task: &str) -> &'a rocksdb::ColumnFamily {
    let events = db.cf_handle(Space::Events.name()).unwrap();
    if db
        .get_cf(events, keys::event_key(task, 0))
        .unwrap()
        .is_some()
    {
        events
    } else {
        db.cf_handle(keys::FINISHED_EVENTS).unwrap()
    }
}

/// Flips one payload byte of `task`'s record at `position`.
fn flip(dir: &Path, task: &str, position: u64) {
    let cfs: Vec<_> = dtask_journal::keys::COLUMN_FAMILIES.to_vec();
    let db = rocksdb::DB::open_cf(&rocksdb::Options::default(), dir, cfs).unwrap();
    let cf = records_cf(&db, task);
    let key = keys::event_key(task, position);
    let mut value = db.get_cf(cf, &key).unwrap().unwrap();
    value[23] ^= 0x01;
    db.put_cf(cf, &key, value).unwrap();
}

#[test]
fn tasks_and_stats_go_on_past_a_damaged_last_record() {
    let dir = built();
    let last = {
        let journal = Journal::open_read_only(dir.path()).unwrap();
        journal.head("alpha").unwrap().unwrap().next_position - 1
    };
    flip(dir.path(), "alpha", last);
    let all = stdout(dtask(dir.path()).arg("tasks"));
    let ids: Vec<&str> = all
        .lines()
        .skip(1)
        .take(5)
        .map(|l| l.split_whitespace().next().unwrap())
        .collect();
    assert_eq!(ids, ["alpha", "beta", "delta", "epsilon", "gamma"], "{all}");
    assert!(
        all.contains("1 task marked ! does not fold cleanly"),
        "{all}"
    );
    let stats = json(&stdout(dtask(dir.path()).args(["--json", "stats"])));
    assert_eq!(stats["tasks"], 5, "{stats}");
    assert_eq!(
        stats["journal_format"],
        dtask_journal::JOURNAL_FORMAT_VERSION,
        "{stats}"
    );
    // The task is still known, and its damage is named, not an error of the tool.
    let shown = dtask(dir.path()).args(["show", "alpha"]).output().unwrap();
    let text = String::from_utf8_lossy(&shown.stdout);
    assert!(text.contains("checksum"), "{text}");
    assert!(!String::from_utf8_lossy(&shown.stderr).contains("no task"));
}

#[test]
fn tasks_lists_filters_sorts_and_pages() {
    let dir = built();
    let all = stdout(dtask(dir.path()).arg("tasks"));
    let ids: Vec<&str> = all
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().next().unwrap())
        .collect();
    assert_eq!(ids, ["alpha", "beta", "delta", "epsilon", "gamma"]);
    assert!(all.contains("2023-11-14T22:13:20.000Z"), "{all}");

    let done = json(&stdout(dtask(dir.path()).args([
        "--json",
        "tasks",
        "--status",
        "completed",
    ])));
    let ids = listed_ids(&done);
    assert_eq!(ids, ["alpha", "beta"]);

    let shell = json(&stdout(
        dtask(dir.path()).args(["tasks", "--tool", "shell", "--json"]),
    ));
    assert_eq!(shell["tasks"].as_array().unwrap().len(), 2);
    let failed = &shell["tasks"][1];
    assert_eq!(
        (failed["id"].as_str(), failed["status"].as_str()),
        (Some("epsilon"), Some("failed"))
    );

    let page = json(&stdout(
        dtask(dir.path()).args(["tasks", "--json", "--limit", "2"]),
    ));
    assert_eq!(page["tasks"].as_array().unwrap().len(), 2);
    assert_eq!(page["next_after"], "beta");
    let next =
        json(&stdout(dtask(dir.path()).args([
            "tasks", "--json", "--limit", "2", "--after", "beta",
        ])));
    assert_eq!(next["tasks"][0]["id"], "delta");

    let by_created =
        stdout(dtask(dir.path()).args(["tasks", "--sort", "created", "--executor", "shell"]));
    let ids: Vec<&str> = by_created
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().next().unwrap())
        .collect();
    assert_eq!(ids, ["alpha", "delta", "epsilon"]);

    // alpha was created at T0, beta a second later.
    let window = json(&stdout(dtask(dir.path()).args([
        "tasks",
        "--json",
        "--since",
        "2023-11-14T22:13:21Z",
        "--until",
        &(T0 + 3000).to_string(),
    ])));
    let ids = listed_ids(&window);
    assert_eq!(ids, ["beta", "gamma"]);

    dtask(dir.path())
        .args(["tasks", "--status", "sleeping"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("unknown status"));
}

#[test]
fn a_page_by_id_folds_nothing_after_it() {
    let dir = built();
    // A key that names no task, after every task: a listing that reaches it fails.
    tamper(dir.path(), |db, _| {
        let events = db.cf_handle(Space::Events.name()).unwrap();
        db.put_cf(events, b"zz", b"junk").unwrap();
    });
    let page = json(&stdout(
        dtask(dir.path()).args(["tasks", "--json", "--limit", "2"]),
    ));
    assert_eq!(listed_ids(&page), ["alpha", "beta"]);
    assert_eq!(page["next_after"], "beta");
    // The last page reaches the key, as every listing of the whole journal does.
    dtask(dir.path())
        .args(["tasks", "--limit", "2", "--after", "delta"])
        .assert()
        .code(1)
        .stderr(predicate::str::contains("malformed key"));
    dtask(dir.path())
        .args(["tasks", "--limit", "0"])
        .assert()
        .code(1);
}

#[test]
fn show_matches_its_golden_output() {
    let dir = built();
    golden(
        "show-beta.txt",
        &stdout(dtask(dir.path()).args(["show", "beta"])),
    );
    golden(
        "show-alpha.json",
        &stdout(dtask(dir.path()).args(["show", "alpha", "--json"])),
    );
    // Without --bytes, text values are previewed next to their size; binary ones are a size.
    let text = stdout(dtask(dir.path()).args(["show", "alpha"]));
    assert!(text.contains(r#"result       "exit 0" (6 B)"#), "{text}");
    assert!(text.contains(r#""pid=7" (5 B)"#), "{text}");
    let bytes = stdout(dtask(dir.path()).args(["show", "alpha", "--bytes"]));
    assert!(bytes.contains("\"pid=7\""), "{bytes}");
    assert!(bytes.contains("\"exit 0\""), "{bytes}");
    dtask(dir.path())
        .args(["show", "nobody"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("no task \"nobody\""));
}

#[test]
fn show_lists_the_latest_updates_and_counts_the_rest() {
    // One task, "t0000", with 250 updates: u2 … u251.
    let dir = interleaved(1, 252);
    let ids = |shown: &serde_json::Value| -> Vec<String> {
        shown["timeline"]["updates"]
            .as_array()
            .unwrap()
            .iter()
            .map(|u| u["event_id"].as_str().unwrap().to_owned())
            .collect()
    };
    // By default the latest 100, the 150 before them counted.
    let shown = json(&stdout(dtask(dir.path()).args(["show", "t0000", "--json"])));
    let listed = ids(&shown);
    assert_eq!(listed.len(), 100);
    assert_eq!((listed[0].as_str(), listed[99].as_str()), ("u152", "u251"));
    assert_eq!(shown["timeline"]["updates_left_out"], 150);
    assert_eq!(shown["state"]["updates"], 250);
    // All of them.
    let all = json(&stdout(dtask(dir.path()).args([
        "show",
        "t0000",
        "--json",
        "--updates",
        "0",
    ])));
    assert_eq!(ids(&all).len(), 250);
    assert_eq!(all["timeline"]["updates_left_out"], 0);
    // Three, in text: the table's title counts the rest.
    let text = stdout(dtask(dir.path()).args(["show", "t0000", "--updates", "3"]));
    assert!(
        text.contains("updates (the latest 3; 247 before them left out"),
        "{text}"
    );
    assert!(text.contains("u249") && text.contains("u251"), "{text}");
    assert!(!text.contains("u248"), "{text}");
    // More than there are, however many: all of them (the count does not overflow).
    let huge = json(&stdout(dtask(dir.path()).args([
        "show",
        "t0000",
        "--json",
        "--updates",
        "9223372036854775809",
    ])));
    assert_eq!(ids(&huge).len(), 250);
}

#[test]
fn events_lists_raw_records() {
    let dir = built();
    let text = stdout(dtask(dir.path()).args(["events", "alpha"]));
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("POS  SEQ"), "{text}");
    assert!(lines[1].contains("created"), "{text}");
    assert!(
        text.contains("update_appended") && text.contains("event_id=a-2"),
        "{text}"
    );
    let tail = stdout(dtask(dir.path()).args(["events", "alpha", "--tail", "2"]));
    assert_eq!(tail.lines().count(), 3, "{tail}");
    let range =
        json(&stdout(dtask(dir.path()).args([
            "events", "alpha", "--from", "2", "--to", "3", "--json",
        ])));
    let events = range["events"].as_array().unwrap();
    assert_eq!(events.len(), 2);
    assert_eq!(events[0]["position"], 2);
    assert_eq!(events[0]["type"], "attempt_started");
    assert_eq!(events[0]["digest"].as_str().unwrap().len(), 64);
    assert_eq!(events[1]["event"]["checkpoint"], "cGlkPTc=");
    // Written record by record, the document reads as one written whole.
    let whole = stdout(dtask(dir.path()).args(["events", "alpha", "--json"]));
    assert_eq!(
        whole,
        format!("{}\n", serde_json::to_string_pretty(&json(&whole)).unwrap())
    );
    // An empty range is a usage error, not an empty table.
    dtask(dir.path())
        .args(["events", "alpha", "--from", "8", "--to", "3"])
        .assert()
        .code(2)
        .stdout("")
        .stderr(predicate::str::contains("--from 8 is after --to 3"));
    dtask(dir.path())
        .args(["events", "alpha", "--from", "999"])
        .assert()
        .code(2)
        .stdout("")
        .stderr(predicate::str::contains("--from 999 is beyond its end"));
}

/// `dtask outbox` lists what is queued and not acknowledged, oldest first, with filters
/// and a limit; the fixture acknowledged its first three notifications.
#[test]
fn outbox_lists_the_unacknowledged_notifications() {
    let dir = built();
    let stats = json(&stdout(dtask(dir.path()).args(["--json", "stats"])));
    let enqueued = stats["by_type"]["notification_enqueued"]["records"]
        .as_u64()
        .unwrap();
    let listed = json(&stdout(dtask(dir.path()).args(["--json", "outbox"])));
    assert_eq!(listed["count"].as_u64().unwrap(), enqueued - 3, "{listed}");
    let items = listed["notifications"].as_array().unwrap();
    assert_eq!(items.len() as u64, enqueued - 3);
    let seqs: Vec<u64> = items.iter().map(|n| n["seq"].as_u64().unwrap()).collect();
    assert!(
        seqs.windows(2).all(|w| w[0] < w[1]),
        "oldest first: {seqs:?}"
    );
    assert!(items
        .iter()
        .all(|n| n["session_id"] == "sess" && n["delivery"] == "queued"));
    assert_eq!(
        listed["oldest_queued_at"], items[0]["queued_at"],
        "{listed}"
    );

    let beta = json(&stdout(
        dtask(dir.path()).args(["--json", "outbox", "--task", "beta"]),
    ));
    let beta_items = beta["notifications"].as_array().unwrap();
    assert!(!beta_items.is_empty());
    assert!(beta_items.iter().all(|n| n["task"] == "beta"));
    let none = stdout(dtask(dir.path()).args(["outbox", "--session", "other"]));
    assert!(none.starts_with("the outbox is empty"), "{none}");

    let text = stdout(dtask(dir.path()).args(["outbox", "--limit", "1"]));
    assert!(
        text.starts_with(&format!("{} notifications waiting", enqueued - 3)),
        "{text}"
    );
    assert!(text.contains("DELIVERY"), "{text}");
    assert!(
        text.contains(&format!("… {} more (--limit 0 shows all)", enqueued - 4)),
        "{text}"
    );
}

#[test]
fn export_matches_its_golden_output_and_redacts() {
    let dir = built();
    let export = stdout(dtask(dir.path()).arg("export"));
    golden("export.jsonl", &export);
    let header = json(export.lines().next().unwrap());
    assert_eq!(header["dtask_export"], 7);
    assert_eq!(header["scope"], "journal");
    assert_eq!(
        header["records"].as_u64().unwrap(),
        export.lines().count() as u64 - 1
    );

    let redacted = stdout(dtask(dir.path()).args(["export", "--no-payload"]));
    assert!(
        redacted.contains(r#""checkpoint":{"redacted_len":5}"#),
        "{redacted}"
    );
    assert!(!redacted.contains("cGlkPTc="));

    let some = stdout(dtask(dir.path()).args(["export", "--task", "gamma", "--task", "alpha"]));
    let seqs: Vec<u64> = some
        .lines()
        .skip(1)
        .map(|l| json(l)["seq"].as_u64().unwrap())
        .collect();
    assert!(
        seqs.windows(2).all(|w| w[0] < w[1]),
        "global order: {seqs:?}"
    );
    let tasks: std::collections::BTreeSet<String> = some
        .lines()
        .skip(1)
        .map(|l| json(l)["task"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(tasks.into_iter().collect::<Vec<_>>(), ["alpha", "gamma"]);

    // Every task named: the same records, in the same order, as the whole journal's export
    // (the streams merged by sequence).
    let all = listed_ids(&json(&stdout(dtask(dir.path()).args(["tasks", "--json"]))));
    let mut named = dtask(dir.path());
    named.arg("export");
    for id in &all {
        named.args(["--task", id.as_str().unwrap()]);
    }
    let named = stdout(&mut named);
    assert_eq!(
        named.lines().skip(1).collect::<Vec<_>>(),
        export.lines().skip(1).collect::<Vec<_>>()
    );
}

/// An export of an older build — the golden export of this test's journal as record format 1
/// (BLAKE3 chain digests) wrote it — imports bit-exact: the rebuilt journal is created in the
/// export's framing, and exports to the same record lines.
#[test]
fn an_export_of_record_format_1_imports_bit_exact() {
    let old = std::fs::read_to_string(manifest_dir().join("tests/golden/export-record-v1.jsonl"))
        .unwrap();
    let work = tempfile::tempdir().unwrap();
    let file = work.path().join("old.jsonl");
    std::fs::write(&file, &old).unwrap();
    let target = work.path().join("rebuilt");
    let text = stdout(dtask(&target).arg("import").arg(&file));
    assert!(text.contains("every digest and CRC matches"), "{text}");
    let journal = Journal::open_read_only(&target).unwrap();
    assert_eq!(journal.record_format(), dtask_journal::RecordFormat::BLAKE3);
    drop(journal);
    let export = stdout(dtask(&target).arg("export"));
    let header = json(export.lines().next().unwrap());
    assert_eq!(header["record_format"], 1);
    assert_eq!(
        header["journal_format"],
        dtask_journal::JOURNAL_FORMAT_VERSION
    );
    assert_eq!(
        export.lines().skip(1).collect::<Vec<_>>(),
        old.lines().skip(1).collect::<Vec<_>>()
    );
    dtask(&target).arg("verify").assert().success();
    // The journal this test builds today is framed in record format 2: other digests.
    let today = stdout(dtask(built().path()).arg("export"));
    assert_eq!(json(today.lines().next().unwrap())["record_format"], 2);
    assert_ne!(today.lines().nth(1), old.lines().nth(1));
}

/// A journal with a rerun: `job` (recovered at most once) failed, rerun as `job.rerun-1`
/// (still pending); and `later`, delayed by an hour.
fn rerun_fixture(dir: &Path) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let clock = ManualClock::new(T0);
        let journal = Journal::open(dir, JournalOptions::default()).unwrap();
        let store = TaskStore::open(journal, clock.clone(), StoreConfig::default()).unwrap();
        let shell = br#"{"tool_name":"shell","command":"make"}"#;
        let mut job = request("job", "shell", shell, LeasePolicy::Retry);
        job.max_recoveries = Some(1);
        store.create(job).await.unwrap();
        let t = store.execute("job", 1, Cmd::Start).await.unwrap();
        clock.advance(Duration::from_secs(1));
        store
            .execute(
                "job",
                t.version,
                Cmd::Fail {
                    error: "exit 2".into(),
                },
            )
            .await
            .unwrap();
        clock.advance(Duration::from_secs(1));
        store.rerun("job", None).await.unwrap();
        let mut later = request("later", "shell", shell, LeasePolicy::Retry);
        later.not_before = Some(Timestamp(T0 + 3_600_000));
        store.create(later).await.unwrap();
    });
}

#[test]
fn a_rerun_a_recovery_limit_and_a_delay_show_audit_clean_and_import_bit_exact() {
    let dir = tempfile::tempdir().unwrap();
    rerun_fixture(dir.path());
    let text = stdout(dtask(dir.path()).args(["show", "job.rerun-1"]));
    assert!(
        text.lines()
            .any(|l| l.starts_with("rerun of") && l.ends_with("job")),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with("recoveries") && l.ends_with("0 (at most 1)")),
        "{text}"
    );
    let shown = json(&stdout(dtask(dir.path()).args(["show", "job", "--json"])));
    assert_eq!(
        shown["state"]["rerun_as"],
        serde_json::json!(["job.rerun-1"])
    );
    assert_eq!(shown["state"]["max_recoveries"], 1);
    assert_eq!(shown["state"]["rerun_of"], serde_json::Value::Null);
    let events = stdout(dtask(dir.path()).args(["events", "job"]));
    let last = events.lines().last().unwrap();
    assert!(
        last.contains("rerun_as") && last.contains("task=job.rerun-1"),
        "{events}"
    );
    let later = stdout(dtask(dir.path()).args(["show", "later"]));
    assert!(
        later
            .lines()
            .any(|l| l.starts_with("not before") && l.ends_with("2023-11-14T23:13:20.000Z")),
        "{later}"
    );
    let listed = json(&stdout(dtask(dir.path()).args(["tasks", "--json"])));
    let delayed: Vec<_> = listed["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| !t["not_before"].is_null())
        .map(|t| t["id"].clone())
        .collect();
    assert_eq!(delayed, [serde_json::json!("later")], "{listed}");
    let table = stdout(dtask(dir.path()).arg("tasks"));
    assert!(
        table.contains("pending until 2023-11-14T23:13:20.000Z"),
        "{table}"
    );
    dtask(dir.path()).arg("verify").assert().success();

    let work = tempfile::tempdir().unwrap();
    let (_, _, export) = round_trip(dir.path(), work.path());
    assert!(export.contains(r#""type":"rerun_of""#), "{export}");
    assert!(
        export.contains(r#""max_recoveries":1,"type":"recovery_limit""#),
        "{export}"
    );
    assert!(export.contains(r#""type":"not_before""#), "{export}");
}

/// Exports `journal` to a file in `work` and imports it into `work/rebuilt`, checking that
/// the import is bit-exact and that the rebuilt journal exports to the same bytes and audits
/// clean; returns the file, the rebuilt journal and the export.
fn round_trip(journal: &Path, work: &Path) -> (std::path::PathBuf, std::path::PathBuf, String) {
    let file = work.join("export.jsonl");
    dtask(journal)
        .args(["export", "--output"])
        .arg(&file)
        .assert()
        .success();
    let target = work.join("rebuilt");
    let export = std::fs::read_to_string(&file).unwrap();
    rebuild(&file, &export, &target);
    (file, target, export)
}

/// Imports the export `file` (whose text is `export`) into `target`, checking that the import
/// is bit-exact, that the rebuilt journal exports the same bytes and that it audits clean.
fn rebuild(file: &Path, export: &str, target: &Path) {
    let text = stdout(dtask(target).arg("import").arg(file));
    assert!(text.contains("every digest and CRC matches"), "{text}");
    assert_eq!(stdout(dtask(target).arg("export")), export);
    dtask(target).arg("verify").assert().success();
}

/// An import stopped by SIGINT — here while it waits on a pipe for the rest of its input —
/// removes its staging copy and exits with 130: the target stays absent, nothing is left in
/// its parent directory.
#[test]
fn an_interrupted_import_leaves_nothing_behind() {
    use std::io::Write;
    let dir = built();
    let work = tempfile::tempdir().unwrap();
    let export = stdout(dtask(dir.path()).arg("export"));
    let target = work.path().join("copy");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_dtask"))
        .env_remove("DTASK_JOURNAL")
        .arg("--journal")
        .arg(&target)
        .args(["import", "-"])
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The header and two records; the pipe stays open, saying nothing more.
    let mut input = child.stdin.take().unwrap();
    let head: Vec<&str> = export.lines().take(3).collect();
    writeln!(input, "{}", head.join("\n")).unwrap();
    input.flush().unwrap();
    let staging = || {
        std::fs::read_dir(work.path())
            .unwrap()
            .filter_map(Result::ok)
            .any(|e| {
                e.file_name()
                    .to_string_lossy()
                    .starts_with(".dtask-import-")
            })
    };
    // A guard against a hung child, not a timing assertion.
    let mut looks = 0;
    while !staging() {
        assert!(looks < 6_000, "the import never began");
        looks += 1;
        std::thread::sleep(Duration::from_millis(10));
    }
    let signaled = std::process::Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(signaled.success());
    let output = child.wait_with_output().unwrap();
    drop(input);
    assert_eq!(output.status.code(), Some(130), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("interrupted: nothing was imported"),
        "{stderr}"
    );
    assert!(!staging(), "the staging copy was left behind");
    assert!(!target.exists());
}

#[test]
fn export_import_round_trip_is_bit_exact() {
    let dir = built();
    let work = tempfile::tempdir().unwrap();
    // The rebuilt journal exports to the very same bytes, and audits clean.
    let (file, target, original) = round_trip(dir.path(), work.path());
    // Every record's digest, compared directly.
    let a = Journal::open_read_only(dir.path()).unwrap();
    let b = Journal::open_read_only(&target).unwrap();
    let digests = |j: &Journal| -> Vec<_> {
        j.commits(1)
            .map(|c| c.map(|c| (c.task, c.record.digest)).unwrap())
            .collect()
    };
    assert_eq!(digests(&a), digests(&b));

    // An export of a format-1 journal (the same records) imports too; a newer journal format,
    // or a record format this build does not read, is refused.
    let import_with = |field: &str, value: u64| {
        let mut lines: Vec<String> = original.lines().map(str::to_owned).collect();
        let mut header = json(&lines[0]);
        header[field] = value.into();
        lines[0] = header.to_string();
        let file = work.path().join(format!("{field}{value}.jsonl"));
        std::fs::write(&file, lines.join("\n") + "\n").unwrap();
        dtask(&work.path().join(format!("{field}{value}")))
            .arg("import")
            .arg(&file)
            .assert()
    };
    import_with("journal_format", 1).success();
    import_with(
        "journal_format",
        u64::from(dtask_journal::JOURNAL_FORMAT_VERSION) + 1,
    )
    .code(2)
    .stderr(predicate::str::contains("journal formats"));
    import_with("record_format", 3)
        .code(2)
        .stderr(predicate::str::contains("record formats 1..=2"));
    // Sequences missing that no tombstone accounts for (a record left out, the count told
    // accordingly): refused before the rebuilt journal is audited (which walks each gap).
    {
        let mut lines: Vec<String> = original.lines().map(str::to_owned).collect();
        // A task's last record, which a later record of another task follows.
        let task_of = |line: &str| json(line)["task"].as_str().unwrap().to_owned();
        let left_out = (1..lines.len() - 1)
            .find(|&i| {
                let task = task_of(&lines[i]);
                lines[i + 1..].iter().all(|later| task_of(later) != task)
            })
            .unwrap();
        lines.remove(left_out);
        let mut header = json(&lines[0]);
        header["records"] = (lines.len() as u64 - 1).into();
        lines[0] = header.to_string();
        let file = work.path().join("gap.jsonl");
        std::fs::write(&file, lines.join("\n") + "\n").unwrap();
        dtask(&work.path().join("gap"))
            .arg("import")
            .arg(&file)
            .assert()
            .code(2)
            .stderr(predicate::str::contains("sequences are missing"));
        assert!(!work.path().join("gap").join("CURRENT").exists());
    }

    // A non-empty target is refused.
    dtask(&target)
        .arg("import")
        .arg(&file)
        .assert()
        .code(2)
        .stderr(predicate::str::contains("not empty"));
    // A redacted or partial export is refused.
    let redacted = work.path().join("redacted.jsonl");
    let partial = work.path().join("partial.jsonl");
    dtask(dir.path())
        .args(["export", "--no-payload", "-o"])
        .arg(&redacted)
        .assert()
        .success();
    dtask(dir.path())
        .args(["export", "--task", "beta", "-o"])
        .arg(&partial)
        .assert()
        .success();
    dtask(&work.path().join("r1"))
        .arg("import")
        .arg(&redacted)
        .assert()
        .code(2)
        .stderr(predicate::str::contains("redacted"));
    dtask(&work.path().join("r2"))
        .arg("import")
        .arg(&partial)
        .assert()
        .code(2)
        .stderr(predicate::str::contains("selected tasks"));
}

#[test]
fn import_fails_loudly_when_a_digest_differs() {
    let dir = built();
    let export = stdout(dtask(dir.path()).arg("export"));
    // Change one event's time but keep its exported digest: the rebuilt record cannot match.
    let mut lines: Vec<String> = export.lines().map(str::to_owned).collect();
    let mut line = json(&lines[3]);
    let at = line["event"]["at"].as_u64().unwrap();
    line["event"]["at"] = (at + 1).into();
    lines[3] = line.to_string();
    let work = tempfile::tempdir().unwrap();
    let file = work.path().join("edited.jsonl");
    std::fs::write(&file, lines.join("\n") + "\n").unwrap();
    let task = line["task"].as_str().unwrap().to_owned();
    dtask(&work.path().join("j"))
        .arg("import")
        .arg(&file)
        .assert()
        .code(1)
        .stderr(predicate::str::contains("not bit-exact"))
        .stderr(predicate::str::contains(format!("task {task:?}")));
}

/// A journal of `tasks` tasks whose streams of `per_task` records were written one record
/// at a time in turn (the commit order interleaves them: an import appends one record a
/// batch), in a new directory.
fn interleaved(tasks: usize, per_task: usize) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let journal = Journal::open(dir.path(), JournalOptions::default()).unwrap();
    let at = Timestamp(1_764_000_000_000);
    let stream = |id: &str| {
        let mut events = vec![
            Event::Created {
                spec: TaskSpec {
                    id: id.into(),
                    executor_key: "shell".into(),
                    ..TaskSpec::default()
                }
                .into(),
                policy: LeasePolicy::Retry,
                checkpoint: vec![],
                context_snapshot: vec![],
                at,
            },
            Event::AttemptStarted {
                attempt: 1,
                lease_deadline: Timestamp(u64::MAX / 2),
                at,
            },
        ];
        for u in 2..per_task {
            events.push(Event::UpdateAppended {
                attempt: 1,
                event_id: format!("u{u}"),
                kind: "progress".into(),
                data: format!("step {u}").into_bytes(),
                metadata: vec![],
                at,
            });
        }
        events
    };
    let streams: Vec<(String, Vec<Event>)> = (0..tasks)
        .map(|t| {
            let id = format!("t{t:04}");
            let events = stream(&id);
            (id, events)
        })
        .collect();
    for position in 0..per_task {
        for (id, events) in &streams {
            journal
                .append(id, position as u64, &events[position..=position])
                .unwrap();
        }
    }
    drop(journal);
    dir
}

#[test]
fn an_import_of_many_windows_of_interleaved_tasks_is_bit_exact() {
    // 9,000 records, one a batch: the import's appends are in flight a window (4,096
    // records) at a time, the same task's several times in one window.
    let dir = interleaved(300, 30);
    let export = stdout(dtask(dir.path()).arg("export"));
    let work = tempfile::tempdir().unwrap();
    let file = work.path().join("x.jsonl");
    std::fs::write(&file, &export).unwrap();
    let copy = work.path().join("copy");
    dtask(&copy).arg("import").arg(&file).assert().success();
    assert_eq!(stdout(dtask(&copy).arg("export")), export);
    // A record of the third window whose event was changed (its exported digest kept).
    let mut lines: Vec<String> = export.lines().map(str::to_owned).collect();
    let mut line = json(&lines[8_500]);
    line["event"]["data"] = "c3RlcCB4".into();
    lines[8_500] = line.to_string();
    let edited = work.path().join("edited.jsonl");
    std::fs::write(&edited, lines.join("\n") + "\n").unwrap();
    let task = line["task"].as_str().unwrap().to_owned();
    let target = work.path().join("edited");
    dtask(&target)
        .arg("import")
        .arg(&edited)
        .assert()
        .code(1)
        .stderr(predicate::str::contains("not bit-exact"))
        .stderr(predicate::str::contains(format!("task {task:?}")));
    assert!(!target.exists(), "a failed import leaves nothing");
}

#[test]
fn a_failed_import_leaves_nothing_behind() {
    let dir = built();
    let export = stdout(dtask(dir.path()).arg("export"));
    let lines: Vec<&str> = export.lines().collect();
    // Cut short: the header announces every record, ten follow.
    let work = tempfile::tempdir().unwrap();
    let file = work.path().join("cut.jsonl");
    std::fs::write(&file, lines[..11].join("\n") + "\n").unwrap();
    let entries = |dir: &Path| -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    };
    let target = work.path().join("copy");
    dtask(&target)
        .arg("import")
        .arg(&file)
        .assert()
        .code(1)
        .stderr(predicate::str::contains("cut short"));
    assert!(
        !target.exists(),
        "a failed import left {}",
        target.display()
    );
    assert_eq!(
        entries(work.path()),
        ["cut.jsonl"],
        "nothing left beside it"
    );
    // An empty target directory stays as it was.
    std::fs::create_dir(&target).unwrap();
    dtask(&target)
        .arg("import")
        .arg(&file)
        .assert()
        .code(1)
        .stderr(predicate::str::contains("cut short"));
    assert!(entries(&target).is_empty(), "{:?}", entries(&target));
    assert_eq!(entries(work.path()), ["copy", "cut.jsonl"]);
    // A record that does not rebuild bit-exact leaves nothing either.
    let mut edited: Vec<String> = lines.iter().map(|l| (*l).to_owned()).collect();
    let mut line = json(&edited[3]);
    line["event"]["at"] = (line["event"]["at"].as_u64().unwrap() + 1).into();
    edited[3] = line.to_string();
    let file = work.path().join("edited.jsonl");
    std::fs::write(&file, edited.join("\n") + "\n").unwrap();
    let other = work.path().join("other");
    dtask(&other).arg("import").arg(&file).assert().code(1);
    assert!(!other.exists());
    // The whole export imports into the empty directory.
    let file = work.path().join("full.jsonl");
    std::fs::write(&file, &export).unwrap();
    dtask(&target).arg("import").arg(&file).assert().success();
    assert_eq!(stdout(dtask(&target).arg("export")), export);
    assert_eq!(
        entries(work.path()),
        ["copy", "cut.jsonl", "edited.jsonl", "full.jsonl"]
    );
}

#[test]
fn a_journal_held_by_a_writer_is_in_use_but_still_readable() {
    let work = tempfile::tempdir().unwrap();
    let torture_dir = work.path();
    let held = torture_dir.join("journal");
    let journal = Journal::open(&held, JournalOptions::default()).unwrap();
    journal.append("held", 0, &[created("held", T0)]).unwrap();
    // A command that opens the journal for writing: the engine process of `torture`.
    let mut writer = Command::new(env!("CARGO_BIN_EXE_dtask"));
    writer
        .env_remove("DTASK_JOURNAL")
        .arg("torture-child")
        .arg("--dir")
        .arg(torture_dir)
        .args(["--seed", "1", "--run", "1", "--lease-ms", "400"])
        .args(["--shell-command", "true"])
        .timeout(Duration::from_secs(60))
        .assert()
        .code(2)
        .stderr(predicate::str::contains(format!(
            "the journal at {} is in use: another process has it open for writing",
            held.display()
        )))
        .stderr(predicate::str::contains(
            "the read-only commands (tasks, show, events, replay, stats, tail, verify, export, \
             serve --read-only) work on it",
        ))
        .stderr(predicate::str::contains("While lock file").not());
    // The read-only commands work while it is held.
    let tasks = stdout(dtask(&held).arg("tasks"));
    assert!(
        tasks.lines().nth(1).unwrap().starts_with("held "),
        "{tasks}"
    );
    dtask(&held).arg("verify").assert().success();
    drop(journal);
}

#[test]
fn verify_is_clean_on_a_good_journal() {
    let dir = built();
    let text = stdout(dtask(dir.path()).arg("verify"));
    assert!(text.contains("5 tasks"), "{text}");
    assert!(text.trim_end().ends_with("clean"), "{text}");
    let report = json(&stdout(dtask(dir.path()).args(["verify", "--json"])));
    assert_eq!(report["clean"], true);
    assert_eq!(report["problems"].as_array().unwrap().len(), 0);
    let one = stdout(dtask(dir.path()).args(["verify", "--task", "beta"]));
    assert!(one.contains(": 1 task, "), "{one}");
}

#[test]
fn verify_names_the_damaged_task_and_position() {
    let dir = built();
    flip(dir.path(), "alpha", 3);
    dtask(dir.path())
        .arg("verify")
        .assert()
        .code(1)
        .stdout(predicate::str::contains(
            "task \"alpha\" position 3: checksum",
        ))
        .stdout(predicate::str::contains(": 1 problem\n"));
    let report = json(
        &String::from_utf8(
            dtask(dir.path())
                .args(["verify", "--json"])
                .assert()
                .code(1)
                .get_output()
                .stdout
                .clone(),
        )
        .unwrap(),
    );
    assert_eq!(report["problems"][0]["task"], "alpha");
    assert_eq!(report["problems"][0]["position"], 3);
    assert_eq!(report["problems"][0]["kind"], "checksum");
    // The inspection commands show the damage too, and say so in their exit code.
    dtask(dir.path())
        .args(["events", "alpha"])
        .assert()
        .code(1)
        .stdout(predicate::str::contains("DAMAGED"));
    dtask(dir.path())
        .args(["verify", "--task", "beta"])
        .assert()
        .success();
}

/// Applies `f` to the raw column family holding task alpha's records (finished and kept
/// apart: see [`records_cf`]) in the journal in `dir`.
fn tamper(dir: &Path, f: impl FnOnce(&rocksdb::DB, &rocksdb::ColumnFamily)) {
    let cfs: Vec<_> = dtask_journal::keys::COLUMN_FAMILIES.to_vec();
    let db = rocksdb::DB::open_cf(&rocksdb::Options::default(), dir, cfs).unwrap();
    let cf = records_cf(&db, "alpha");
    let events = db.cf_handle(Space::Events.name()).unwrap();
    assert!(
        db.get_cf(events, keys::event_key("alpha", 0))
            .unwrap()
            .is_none(),
        "alpha's stream is finished, and kept apart"
    );
    f(&db, cf);
}

/// `verify --json` on the damaged journal: exit 1 and the (task, position, kind) of each problem.
fn problems(dir: &Path) -> Vec<(String, u64, String)> {
    let out = dtask(dir)
        .args(["verify", "--json"])
        .assert()
        .code(1)
        .get_output()
        .stdout
        .clone();
    let report = json(&String::from_utf8(out).unwrap());
    report["problems"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["task"].as_str().unwrap().to_owned(),
                p["position"].as_u64().unwrap_or(u64::MAX),
                p["kind"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

#[test]
fn verify_names_every_kind_of_damage() {
    let get = |db: &rocksdb::DB, cf: &rocksdb::ColumnFamily, p: u64| {
        db.get_cf(cf, keys::event_key("alpha", p)).unwrap().unwrap()
    };
    // A truncated record.
    let dir = built();
    tamper(dir.path(), |db, cf| {
        let v = get(db, cf, 2);
        db.put_cf(cf, keys::event_key("alpha", 2), &v[..v.len() - 5])
            .unwrap();
    });
    assert!(problems(dir.path()).contains(&("alpha".into(), 2, "truncated".into())));
    // A deleted middle record.
    let dir = built();
    tamper(dir.path(), |db, cf| {
        db.delete_cf(cf, keys::event_key("alpha", 2)).unwrap();
    });
    assert!(problems(dir.path()).contains(&("alpha".into(), 2, "missing".into())));
    // Two swapped records.
    let dir = built();
    tamper(dir.path(), |db, cf| {
        let (a, b) = (get(db, cf, 1), get(db, cf, 3));
        db.put_cf(cf, keys::event_key("alpha", 1), b).unwrap();
        db.put_cf(cf, keys::event_key("alpha", 3), a).unwrap();
    });
    let found = problems(dir.path());
    assert!(
        found.contains(&("alpha".into(), 1, "misplaced".into())),
        "{found:?}"
    );
    assert!(
        found.contains(&("alpha".into(), 3, "misplaced".into())),
        "{found:?}"
    );
    // A forged record: another event framed at position 2 with a valid CRC but a chain digest
    // that cannot match the real predecessor.
    let dir = built();
    tamper(dir.path(), |db, cf| {
        let original =
            record::decode_payload(record::parse(&get(db, cf, 2)).unwrap().payload).unwrap();
        let forged = match original {
            Event::UpdateAppended {
                attempt,
                event_id,
                kind,
                metadata,
                at,
                ..
            } => Event::UpdateAppended {
                attempt,
                event_id,
                kind,
                data: b"forged".to_vec(),
                metadata,
                at,
            },
            other => other,
        };
        let payload = record::encode_payload(&forged).unwrap();
        let (bytes, _) = record::frame("alpha", 2, 3, &payload, &Digest([9; 32])).unwrap();
        db.put_cf(cf, keys::event_key("alpha", 2), bytes).unwrap();
    });
    let found = problems(dir.path());
    assert!(
        found.contains(&("alpha".into(), 2, "chain".into())),
        "{found:?}"
    );
}

#[test]
fn verify_reports_an_illegal_record_appended_through_the_journal() {
    let dir = built();
    {
        let journal = Journal::open(dir.path(), JournalOptions::default()).unwrap();
        let head = journal.head("delta").unwrap().unwrap();
        journal
            .append(
                "delta",
                head.next_position,
                &[Event::Completed {
                    data: vec![],
                    at: Timestamp(T0),
                }],
            )
            .unwrap();
    }
    dtask(dir.path())
        .arg("verify")
        .assert()
        .code(1)
        .stdout(predicate::str::contains(
            "task \"delta\" position 2: illegal: `completed` is not allowed in status pending",
        ));
}

#[test]
fn replay_travels_back_in_time() {
    let dir = built();
    let text = stdout(dtask(dir.path()).args(["replay", "beta", "--at", "3"]));
    assert!(text.starts_with("as of position 3"), "{text}");
    assert!(text.contains("waiting_input"), "{text}");
    // The timeline as `show` draws it, up to the position: the first attempt ended waiting
    // for input; the answer and the second attempt come later.
    assert!(text.contains("\nattempts\n"), "{text}");
    assert!(text.contains("\nwaits and answers\n"), "{text}");
    assert!(!text.contains("input_provided"), "{text}");
    assert!(!text.contains("\noutcome\n"), "{text}");
    let state = json(&stdout(
        dtask(dir.path()).args(["replay", "beta", "--at", "2", "--json"]),
    ));
    assert_eq!(state["state"]["status"], "running");
    assert_eq!(state["state"]["version"], 2);
    assert_eq!(state["at"]["type"], "attempt_started");
    let attempts = state["timeline"]["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 1, "{state}");
    assert_eq!(attempts[0]["end"], serde_json::Value::Null, "{state}");
    assert_eq!(state["timeline"]["outcome"], serde_json::Value::Null);
    let last = json(&stdout(
        dtask(dir.path()).args(["replay", "beta", "--json"]),
    ));
    assert_eq!(last["state"]["status"], "completed");
    dtask(dir.path())
        .args(["replay", "beta", "--at", "999"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("beyond its end"));
}

#[test]
fn stats_counts_tasks_and_records() {
    let dir = built();
    let stats = json(&stdout(dtask(dir.path()).args(["stats", "--json"])));
    assert_eq!(stats["tasks"], 5);
    assert_eq!(stats["by_status"]["completed"], 2);
    assert_eq!(stats["by_status"]["failed"], 1);
    assert_eq!(stats["by_executor"]["shell"], 3);
    assert_eq!(stats["by_type"]["created"]["records"], 5);
    assert_eq!(stats["by_type"]["notification_acked"]["records"], 3);
    assert_eq!(stats["records"], stats["last_seq"]);
    assert_eq!(stats["largest"].as_array().unwrap().len(), 5);
    assert!(
        stats["postgres_schema"].is_null(),
        "an embedded journal has no schema"
    );
    // The storage engine's figures: the journal was closed, so its records are in table
    // files (the live streams in `events`, the finished ones in `finished`), none owed.
    let storage = &stats["storage"];
    let space = |name: &str| {
        storage["spaces"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["name"] == name)
            .unwrap_or_else(|| panic!("no {name} in {storage}"))
            .clone()
    };
    assert!(
        space("commits")["table_bytes"].as_u64().unwrap() > 0,
        "{storage}"
    );
    let records_in_tables = space("events")["table_bytes"].as_u64().unwrap()
        + space("finished")["table_bytes"].as_u64().unwrap();
    assert!(records_in_tables > 0, "{storage}");
    assert_eq!(storage["write_stopped"], false, "{storage}");
    assert_eq!(storage["background_errors"], 0, "{storage}");
    let text = stdout(dtask(dir.path()).arg("stats"));
    assert!(
        text.contains("EVENT TYPE") && text.contains("LARGEST TASK"),
        "{text}"
    );
    assert!(
        text.contains("COMPACTION OWED") && text.contains("writes not held back"),
        "{text}"
    );
    // What a synced append promises where the journal lies, as `dtask probe` says it.
    let promise = stats["sync_promise"]["promise"].as_str().unwrap();
    assert!(
        ["stable", "flushed", "lost", "unknown"].contains(&promise),
        "{stats}"
    );
    assert!(
        text.contains(&format!("synced appends: {promise} — ")),
        "{text}"
    );
}

#[test]
fn tail_prints_the_last_records() {
    let dir = built();
    let last = Journal::open_read_only(dir.path())
        .unwrap()
        .last_seq()
        .unwrap();
    let text = stdout(dtask(dir.path()).args(["tail", "-n", "3"]));
    assert_eq!(text.lines().count(), 3, "{text}");
    assert!(
        text.lines()
            .last()
            .unwrap()
            .trim_start()
            .starts_with(&last.to_string()),
        "{text}"
    );
    let lines = stdout(dtask(dir.path()).args(["tail", "--json", "--from-seq", "2"]));
    assert_eq!(lines.lines().count() as u64, last - 1);
    assert_eq!(json(lines.lines().next().unwrap())["seq"], 2);
}

#[test]
fn tail_follows_a_live_writer() {
    let dir = tempfile::tempdir().unwrap();
    let journal = Journal::open(dir.path(), JournalOptions::default()).unwrap();
    let created = |id: &str| created(id, T0);
    journal.append("first", 0, &[created("first")]).unwrap();
    // Killed with SIGKILL below: its scratch directory stays behind, in a directory of ours.
    let tmp = tempfile::tempdir().unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_dtask"))
        .env("TMPDIR", tmp.path())
        .arg("--journal")
        .arg(dir.path())
        .args([
            "tail",
            "--follow",
            "--json",
            "--from-seq",
            "1",
            "--interval",
            "20",
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stdout).lines() {
            if tx.send(line.unwrap()).is_err() {
                break;
            }
        }
    });
    // A safety net against a hung child, not a timing assertion.
    let next = || {
        rx.recv_timeout(Duration::from_secs(60))
            .expect("a line from tail --follow")
    };
    assert_eq!(json(&next())["task"], "first");
    journal.append("second", 0, &[created("second")]).unwrap();
    let line = json(&next());
    assert_eq!(
        (line["task"].as_str(), line["seq"].as_u64()),
        (Some("second"), Some(2))
    );
    child.kill().unwrap();
    child.wait().unwrap();
}

/// A journal with `n` tasks of one record each, closed.
/// The `created` event of a plain task `id` at `at` (milliseconds).
fn created(id: &str, at: u64) -> Event {
    Event::created(TaskSpec::new(id, "x"), LeasePolicy::Retry, Timestamp(at))
}

fn small_journal(dir: &Path, n: u64) {
    let journal = Journal::open(dir, JournalOptions::default()).unwrap();
    for i in 0..n {
        let id = format!("t{i}");
        journal.append(&id, 0, &[created(&id, T0 + i)]).unwrap();
    }
}

/// `dtask --journal DIR tail --follow …` with its temporary directory under `tmp`.
fn follow(dir: &Path, tmp: &Path, args: &[&str]) -> Command {
    let mut cmd = dtask(dir);
    cmd.env("TMPDIR", tmp)
        .args(["tail", "--follow", "--json", "--interval", "20"])
        .args(args)
        // A safety net against a hung process, not a timing assertion.
        .timeout(Duration::from_secs(60));
    cmd
}

fn is_empty_dir(dir: &Path) -> bool {
    std::fs::read_dir(dir).unwrap().next().is_none()
}

#[test]
fn tail_follow_stops_at_max_or_when_idle_and_removes_its_scratch_dir() {
    let dir = tempfile::tempdir().unwrap();
    small_journal(dir.path(), 3);
    let tmp = tempfile::tempdir().unwrap();
    // --max: exits by itself after that many records.
    let out = stdout(&mut follow(
        dir.path(),
        tmp.path(),
        &["--from-seq", "1", "--max", "2"],
    ));
    let seqs: Vec<u64> = out
        .lines()
        .map(|l| json(l)["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs, [1, 2], "{out}");
    assert!(
        is_empty_dir(tmp.path()),
        "a scratch directory was left behind"
    );
    // --until-idle: exits once nothing new came for that long.
    let out = stdout(&mut follow(
        dir.path(),
        tmp.path(),
        &["--until-idle", "0.2"],
    ));
    assert_eq!(out.lines().count(), 3, "{out}");
    assert!(
        is_empty_dir(tmp.path()),
        "a scratch directory was left behind"
    );
    // The stop flags need --follow.
    dtask(dir.path())
        .args(["tail", "--max", "1"])
        .assert()
        .code(2);
}

#[test]
fn tail_follow_removes_its_scratch_dir_on_sigterm_and_sigint() {
    let dir = tempfile::tempdir().unwrap();
    small_journal(dir.path(), 1);
    for signal in ["TERM", "INT"] {
        let tmp = tempfile::tempdir().unwrap();
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_dtask"))
            .env_remove("DTASK_JOURNAL")
            .env("TMPDIR", tmp.path())
            .arg("--journal")
            .arg(dir.path())
            .args(["tail", "--follow", "--json", "--interval", "20"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // The first line means the follower is open, its scratch directory made.
        let mut lines =
            std::io::BufRead::lines(std::io::BufReader::new(child.stdout.take().unwrap()));
        assert_eq!(json(&lines.next().unwrap().unwrap())["task"], "t0");
        assert!(
            !is_empty_dir(tmp.path()),
            "the follower's scratch directory"
        );
        let killed = std::process::Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(child.id().to_string())
            .status()
            .unwrap();
        assert!(killed.success());
        let status = child.wait().unwrap();
        assert_eq!(status.code(), Some(0), "SIG{signal}: {status}");
        assert!(
            is_empty_dir(tmp.path()),
            "SIG{signal} left the scratch directory behind"
        );
    }
}

#[test]
fn demo_runs_and_its_audit_is_clean() {
    let work = tempfile::tempdir().unwrap();
    let dir = work.path().join("demo");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_dtask"));
    cmd.env_remove("DTASK_JOURNAL").arg("demo").arg(&dir);
    let text = stdout(&mut cmd);
    assert!(text.contains("** crash **"), "{text}");
    assert!(text.contains("deduplicated"), "{text}");
    assert!(text.contains("audit: clean"), "{text}");
    // The managed tool: one call answered in the foreground, one handed off and completed.
    assert!(text.contains("\"type\":\"foreground_result\""), "{text}");
    assert!(text.contains("\"type\":\"launch_result\""), "{text}");
    assert!(
        text.contains("adopted the running command (no second start): completed"),
        "{text}"
    );
    // The kept journal verifies clean with the CLI too, and the demo refuses to reuse it.
    dtask(&dir).arg("verify").assert().success();
    let mut again = Command::new(env!("CARGO_BIN_EXE_dtask"));
    again
        .env_remove("DTASK_JOURNAL")
        .arg("demo")
        .arg(&dir)
        .assert()
        .code(2);
    // And without a directory (a temporary one), as `./dev demo` runs it.
    let mut temp = Command::new(env!("CARGO_BIN_EXE_dtask"));
    temp.env_remove("DTASK_JOURNAL").args(["demo", "--json"]);
    let report = json(&stdout(&mut temp));
    assert_eq!(report["audit"]["problems"].as_array().unwrap().len(), 0);
    // Five store-level tasks, the conversation's agent task and its nested task, and the
    // handed-off managed call (the foreground one left none).
    let tasks = report["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 8);
    let ids: Vec<&str> = tasks.iter().filter_map(|t| t["id"].as_str()).collect();
    assert!(
        ids.contains(&"agent-1") && ids.contains(&"agent-1/backup"),
        "{ids:?}"
    );
    // The model is told what the shell tool takes: a required string `command`.
    let function = &report["managed_tool"]["function"];
    assert_eq!(function["name"], "sh", "{report}");
    assert_eq!(
        function["parameters"]["required"],
        serde_json::json!(["command"]),
        "{report}"
    );
    assert_eq!(
        function["parameters"]["properties"]["command"]["type"],
        "string"
    );
    assert!(
        text.contains("the model is told it requires: command"),
        "{text}"
    );
}

#[test]
fn usage_errors_exit_2() {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_dtask"));
    cmd.env_remove("DTASK_JOURNAL")
        .arg("tasks")
        .assert()
        .code(2)
        .stderr(predicate::str::contains("--journal"));
    let missing = tempfile::tempdir().unwrap();
    let nothing = missing.path().join("nothing");
    for command in ["verify", "tasks", "tail"] {
        dtask(&nothing)
            .arg(command)
            .assert()
            .code(2)
            .stderr(format!("dtask: no journal at {}\n", nothing.display()));
    }
    // The commands that change a journal do not make one where there is none: not at a
    // mistyped path, not in a directory of something else.
    let other = missing.path().join("documents");
    std::fs::create_dir(&other).unwrap();
    std::fs::write(other.join("notes.txt"), "mine").unwrap();
    for at in [&nothing, &other] {
        for args in [
            &["purge", "--finished-before", "2100-01-01"][..],
            &["trim", "--finished-before", "2100-01-01"],
            &["hold", "job", "--reason", "r"],
        ] {
            dtask(at)
                .args(args)
                .assert()
                .code(2)
                .stderr(format!("dtask: no journal at {}\n", at.display()));
        }
    }
    assert!(!nothing.exists(), "a journal was made at a mistyped path");
    // The demo makes its own journal: `--journal` is refused, not ignored.
    dtask(&nothing)
        .arg("demo")
        .assert()
        .code(2)
        .stderr(predicate::str::contains("demo does not take --journal"));
    let left: Vec<_> = std::fs::read_dir(&other).unwrap().collect();
    assert_eq!(
        left.len(),
        1,
        "files were written beside another's: {left:?}"
    );
    // A time that does not exist is refused, not rolled over into March.
    let dir = built();
    for bad in ["2024-02-31", "2023-02-29", "2024-02-30T00:00:00Z"] {
        dtask(dir.path())
            .args(["tasks", "--since", bad])
            .assert()
            .code(2)
            .stderr(predicate::str::contains(format!("bad time \"{bad}\"")));
    }
    // RFC 3339 with an offset and fractional seconds is accepted.
    let window = json(&stdout(dtask(dir.path()).args([
        "tasks",
        "--json",
        "--since",
        "2023-11-14T23:13:20.500+01:00",
        "--until",
        "2023-11-14",
    ])));
    assert_eq!(window["tasks"].as_array().unwrap().len(), 0, "{window}");
    let since = json(&stdout(dtask(dir.path()).args([
        "tasks",
        "--json",
        "--since",
        "2023-11-14T23:13:20.500+01:00",
    ])));
    let ids = listed_ids(&since);
    assert_eq!(ids, ["beta", "delta", "epsilon", "gamma"]);
    let mut bad = Command::new(env!("CARGO_BIN_EXE_dtask"));
    bad.arg("frobnicate").assert().code(2);
}

/// Not a test: builds a large journal for measurements, e.g.
/// `DTASK_LARGE=/tmp/big DTASK_LARGE_TASKS=100000 cargo test -p dtask --test cli -- --ignored`.
/// Each task has 12 records: created, task-created notification, attempt, started marker, seven
/// updates, completed — and a 13th, the notification's acknowledgement, with
/// `DTASK_LARGE_ACKED=1` (a journal whose tasks may be purged).
#[test]
#[ignore = "builds a large journal for measurements"]
fn large_journal() {
    let Some(dir) = std::env::var_os("DTASK_LARGE") else {
        return;
    };
    let tasks: u64 = std::env::var("DTASK_LARGE_TASKS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(10_000);
    let journal = Journal::open(
        &dir,
        JournalOptions::default().with_durability(dtask_journal::Durability::Buffered),
    )
    .unwrap();
    for t in 0..tasks {
        let id = format!("task-{t:07}");
        let at = |ms: u64| Timestamp(T0 + t * 10 + ms);
        let mut events = vec![
            Event::Created {
                spec: TaskSpec {
                    id: id.clone(),
                    executor_key: "shell".into(),
                    payload: br#"{"tool_name":"shell","command":"make"}"#.to_vec(),
                    session_id: "s".into(),
                    ..TaskSpec::default()
                }
                .into(),
                policy: LeasePolicy::Retry,
                checkpoint: vec![],
                context_snapshot: vec![],
                at: at(0),
            },
            Event::NotificationEnqueued {
                id: format!("{id}:1:task_created"),
                event_id: String::new(),
                kind: "task_created".into(),
                data: vec![],
                version: 1,
                at: at(0),
            },
            Event::AttemptStarted {
                attempt: 1,
                lease_deadline: at(30_000),
                at: at(1),
            },
            Event::StartCommitted {
                checkpoint: b"pid=1234".to_vec(),
                at: at(2),
            },
        ];
        for u in 0..7 {
            events.push(Event::UpdateAppended {
                attempt: 1,
                event_id: format!("u{u}"),
                kind: "stdout".into(),
                data: vec![b'x'; 64],
                metadata: vec![],
                at: at(3),
            });
        }
        events.push(Event::Completed {
            data: b"exit 0".to_vec(),
            at: at(4),
        });
        let appended = journal.append(&id, 0, &events).unwrap();
        if std::env::var_os("DTASK_LARGE_ACKED").is_some() {
            let ack = Event::NotificationAcked {
                id: format!("{id}:1:task_created"),
                enqueued_seq: appended.first_seq + 1,
                at: at(5),
            };
            journal.append(&id, appended.next_position, &[ack]).unwrap();
        }
    }
}

/// The package directory, read when the test runs (not when it was compiled), so a test binary
/// reused from a build in another checkout still finds this checkout's files.
fn manifest_dir() -> std::path::PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| std::path::PathBuf::from("."), std::path::PathBuf::from)
}

/// The G3 records (inputs, a nested task, consumed cursors) survive `export` / `import`
/// bit-exact, `verify` audits them clean, and `show` renders the mailbox and the children.
/// An export of version 1 (before the G3 event types) still imports.
#[test]
fn g3_records_round_trip_and_show() {
    let work = tempfile::tempdir().unwrap();
    let demo = work.path().join("demo");
    Command::new(env!("CARGO_BIN_EXE_dtask"))
        .env_remove("DTASK_JOURNAL")
        .arg("demo")
        .arg(&demo)
        .assert()
        .success();
    let export = stdout(dtask(&demo).arg("export"));
    for ty in [
        "input_sent",
        "child_created",
        "created_v2",
        "input_committed",
        "inputs_pending",
        "parent_notified",
        "parent_notified_v2",
    ] {
        assert!(
            export.contains(&format!("\"type\":\"{ty}\"")),
            "no {ty} in the export"
        );
    }
    let file = work.path().join("demo.jsonl");
    std::fs::write(&file, &export).unwrap();
    let rebuilt = work.path().join("rebuilt");
    dtask(&rebuilt).arg("import").arg(&file).assert().success();
    assert_eq!(stdout(dtask(&rebuilt).arg("export")), export);
    dtask(&rebuilt).arg("verify").assert().success();

    let shown = json(&stdout(dtask(&rebuilt).args(["show", "agent-1", "--json"])));
    let state = &shown["state"];
    assert_eq!(state["status"], "completed");
    assert_eq!(state["mailbox"]["sealed"], true);
    assert_eq!(state["mailbox"]["latest"], state["mailbox"]["consumed"]);
    let children = shown["timeline"]["children"].as_array().unwrap();
    assert_eq!(children.len(), 1, "{shown}");
    let inputs = shown["timeline"]["inputs"].as_array().unwrap();
    assert!(inputs.iter().any(|i| i["event"] == "input_sent"), "{shown}");
    // The child's notifications, read back to the child and its event id, each with its
    // delivery.
    let notified: Vec<_> = inputs.iter().filter(|i| !i["from"].is_null()).collect();
    assert_eq!(notified.len(), 2, "{shown}");
    assert_eq!(notified[0]["kind"], "backup_progress");
    assert_eq!(notified[0]["delivery"], "queued");
    assert_eq!(
        notified[0]["from"],
        serde_json::json!({ "task": "agent-1/backup", "event_id": "dumped" })
    );
    assert_eq!(notified[1]["kind"], "backup_warning");
    assert_eq!(notified[1]["delivery"], "preempt");
    let child = json(&stdout(dtask(&rebuilt).args([
        "show",
        "agent-1/backup",
        "--json",
    ])));
    assert_eq!(child["state"]["parent_task_id"], "agent-1");
    let sent: Vec<_> = child["timeline"]["notifications"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            (
                n["event"].as_str().unwrap(),
                n["delivery"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        sent,
        [
            ("parent_notified", "queued"),
            ("parent_notified_v2", "preempt")
        ],
        "{child}"
    );
    let text = stdout(dtask(&rebuilt).args(["show", "agent-1"]));
    assert!(
        text.contains("mailbox") && text.contains("children"),
        "{text}"
    );
    assert!(text.contains("agent-1/backup (dumped)"), "{text}");

    // A version 1 header is read too (its events are a subset of the newer versions').
    let current = format!("\"dtask_export\":{}", dtask_journal::export::VERSION);
    assert!(export.starts_with(&format!("{{{current},")), "{export}");
    let v1 = export.replacen(&current, "\"dtask_export\":1", 1);
    let v1_file = work.path().join("v1.jsonl");
    std::fs::write(&v1_file, v1).unwrap();
    dtask(&work.path().join("from-v1"))
        .arg("import")
        .arg(&v1_file)
        .assert()
        .success();
}

/// A fresh schema of the test database, or `None` (and a loud line) without one.
fn pg_url(name: &str) -> Option<String> {
    pg::pg_url("cli", name)
}

/// Runs `sql` on the test database, outside any journal.
fn pg_admin(sql: &str) {
    let base = std::env::var("DTASK_TEST_PG_URL").unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let (client, conn) = tokio_postgres::connect(&base, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(conn);
        client.batch_execute(sql).await.unwrap();
    });
}

fn dtask_at(journal: &str) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_dtask"));
    cmd.env_remove("DTASK_JOURNAL")
        .arg("--journal")
        .arg(journal);
    cmd
}

#[test]
fn a_postgres_journal_runs_the_demo_and_moves_between_backends_bit_exact() {
    let (Some(pg), Some(back)) = (pg_url("demo"), pg_url("back")) else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    Command::new(env!("CARGO_BIN_EXE_dtask"))
        .env_remove("DTASK_JOURNAL")
        .args(["demo", &pg])
        .assert()
        .success()
        .stdout(predicate::str::contains("audit: clean (8 tasks"))
        .stdout(predicate::str::contains("a shared journal at PostgreSQL"));
    dtask_at(&pg)
        .arg("verify")
        .assert()
        .success()
        .stdout(predicate::str::contains(": clean"));
    dtask_at(&pg)
        .arg("tasks")
        .assert()
        .success()
        .stdout(predicate::str::contains("agent-1/backup"));
    // `stats` names the schema's version, which the demo's open migrated to this build's.
    let stats = json(&stdout(dtask_at(&pg).args(["stats", "--json"])));
    assert_eq!(
        stats["postgres_schema"],
        dtask_journal::postgres::SCHEMA_VERSION,
        "{stats}"
    );
    dtask_at(&pg)
        .arg("stats")
        .assert()
        .success()
        .stdout(predicate::str::contains(format!(
            "PostgreSQL schema version {}",
            dtask_journal::postgres::SCHEMA_VERSION
        )));
    // Up to date: `migrate --check` says so.
    let checked = json(&stdout(
        dtask_at(&pg).args(["--json", "migrate", "--check"]),
    ));
    assert_eq!(checked["pending"], false, "{checked}");
    assert_eq!(
        checked["postgres_schema"]["before"],
        dtask_journal::postgres::SCHEMA_VERSION,
        "{checked}"
    );
    // Back to schema version 2 (batches as pipelined statements, the writer lock a row
    // lock): pending, then migrated.
    let schema = pg.rsplit_once("schema=").unwrap().1;
    pg_admin(&format!(
        "SET search_path TO \"{schema}\"; DROP FUNCTION dtask_write_batch; \
         DELETE FROM dtask_schema WHERE version = 4; DROP FUNCTION dtask_lock_writer(); \
         CREATE TABLE dtask_writer (id integer PRIMARY KEY CHECK (id = 1)); \
         INSERT INTO dtask_writer (id) VALUES (1); DELETE FROM dtask_schema WHERE version = 3"
    ));
    dtask_at(&pg)
        .args(["migrate", "--check"])
        .assert()
        .code(1)
        .stdout(predicate::str::contains("PostgreSQL schema version 2"));
    dtask_at(&pg)
        .arg("migrate")
        .assert()
        .success()
        .stdout(predicate::str::contains(format!(
            "PostgreSQL schema version 2 to journal format {}, PostgreSQL schema version {}",
            dtask_journal::JOURNAL_FORMAT_VERSION,
            dtask_journal::postgres::SCHEMA_VERSION
        )));
    let from_pg = tmp.path().join("pg.jsonl");
    dtask_at(&pg)
        .args(["export", "-o"])
        .arg(&from_pg)
        .assert()
        .success();
    // PostgreSQL -> RocksDB -> PostgreSQL: every export the same bytes.
    let dir = tmp.path().join("journal");
    dtask(&dir).arg("import").arg(&from_pg).assert().success();
    let from_rocks = tmp.path().join("rocks.jsonl");
    dtask(&dir)
        .args(["export", "-o"])
        .arg(&from_rocks)
        .assert()
        .success();
    dtask_at(&back)
        .arg("import")
        .arg(&from_rocks)
        .assert()
        .success()
        .stdout(predicate::str::contains("every digest and CRC matches"));
    let from_back = tmp.path().join("back.jsonl");
    dtask_at(&back)
        .args(["export", "-o"])
        .arg(&from_back)
        .assert()
        .success();
    let read = |p: &Path| std::fs::read(p).unwrap();
    assert_eq!(read(&from_pg), read(&from_rocks));
    assert_eq!(read(&from_pg), read(&from_back));
    // Importing into a journal that holds records is refused, and changes nothing.
    dtask_at(&back)
        .arg("import")
        .arg(&from_rocks)
        .assert()
        .code(2)
        .stderr(predicate::str::contains("already holds a journal of"));
    dtask_at(&back).arg("verify").assert().success();
    // An unreachable database is named, with the cause.
    dtask_at("postgres://nobody@127.0.0.1:1/none")
        .arg("tasks")
        .assert()
        .code(2)
        .stderr(predicate::str::contains("127.0.0.1:1"));
}

/// Turns the journal in `dir` (created with BLAKE3 records) into what journal format 4 stored:
/// version 4, no record framing named.
fn make_format_4(dir: &Path) {
    let cfs: Vec<_> = dtask_journal::keys::COLUMN_FAMILIES.to_vec();
    let db = rocksdb::DB::open_cf(&rocksdb::Options::default(), dir, cfs).unwrap();
    let meta = db.cf_handle(Space::Meta.name()).unwrap();
    db.put_cf(meta, keys::META_FORMAT_VERSION, 4u32.to_be_bytes())
        .unwrap();
    db.delete_cf(meta, keys::META_RECORD_FORMAT).unwrap();
}

/// Standard output of `cmd`, which must exit with `code`.
fn stdout_of(cmd: &mut Command, code: i32) -> String {
    let output = cmd.output().unwrap();
    assert_eq!(
        output.status.code(),
        Some(code),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

#[test]
fn migrate_checks_and_brings_an_older_journal_up_to_this_builds_format() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("journal");
    {
        let options =
            JournalOptions::default().with_record_format(dtask_journal::RecordFormat::BLAKE3);
        let journal = Journal::open(&dir, options).unwrap();
        let spec = TaskSpec::new("old", "x");
        let created = Event::created(spec, LeasePolicy::Retry, Timestamp(1));
        journal.append("old", 0, &[created]).unwrap();
    }
    make_format_4(&dir);
    // Checked: pending, exit 1, nothing changed.
    dtask(&dir)
        .args(["migrate", "--check"])
        .assert()
        .code(1)
        .stdout(predicate::str::contains("journal format 4"))
        .stdout(predicate::str::contains("`dtask migrate` brings it there"));
    let checked = json(&stdout_of(
        dtask(&dir).args(["--json", "migrate", "--check"]),
        1,
    ));
    assert_eq!(checked["pending"], true, "{checked}");
    assert_eq!(checked["migrated"], false, "{checked}");
    assert_eq!(checked["journal_format"]["after"], 4, "{checked}");
    assert!(checked["postgres_schema"].is_null(), "{checked}");
    // Migrated: the format is this build's, the records' framing is kept.
    dtask(&dir)
        .arg("migrate")
        .assert()
        .success()
        .stdout(predicate::str::contains(format!(
            "migrated from journal format 4 to journal format {}",
            dtask_journal::JOURNAL_FORMAT_VERSION
        )));
    let journal = Journal::open_read_only(&dir).unwrap();
    assert_eq!(
        journal.format_version(),
        dtask_journal::JOURNAL_FORMAT_VERSION
    );
    assert_eq!(journal.record_format(), dtask_journal::RecordFormat::BLAKE3);
    assert_eq!(journal.read_stream("old", 0).count(), 1);
    drop(journal);
    dtask(&dir)
        .args(["migrate", "--check"])
        .assert()
        .success()
        .stdout(predicate::str::contains("up to date"));
    let again = json(&stdout(dtask(&dir).args(["--json", "migrate"])));
    assert_eq!(again["migrated"], false, "{again}");
    assert_eq!(again["pending"], false, "{again}");
}

/// `export` and `verify` of a PostgreSQL journal another node writes meanwhile read one
/// snapshot: every export holds as many records as its header announces, and every audit is
/// clean (read as the database moved, the export's header and its lines disagreed).
#[test]
fn a_postgres_export_and_verify_beside_a_writing_node_read_one_snapshot() {
    let Some(pg) = pg_url("snapshot") else {
        return;
    };
    let writer = Journal::open_postgres(&pg, JournalOptions::default()).unwrap();
    for i in 0..500 {
        let id = format!("seed-{i}");
        writer.append(&id, 0, &[created(&id, T0 + i)]).unwrap();
    }
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let appending = std::thread::spawn({
        let (writer, stop) = (writer.clone(), stop.clone());
        move || {
            let mut n = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let id = format!("live-{n}");
                writer.append(&id, 0, &[created(&id, T0 + n)]).unwrap();
                n += 1;
            }
            n
        }
    });
    let tmp = tempfile::tempdir().unwrap();
    for round in 0..5 {
        let file = tmp.path().join(format!("export-{round}.jsonl"));
        dtask_at(&pg)
            .args(["export", "--output"])
            .arg(&file)
            .assert()
            .success();
        let text = std::fs::read_to_string(&file).unwrap();
        let mut lines = text.lines();
        let header = json(lines.next().unwrap());
        assert_eq!(
            header["records"].as_u64(),
            Some(lines.count() as u64),
            "{header}"
        );
        dtask_at(&pg)
            .arg("verify")
            .assert()
            .success()
            .stdout(predicate::str::contains(": clean"));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(appending.join().unwrap() > 0);
}

/// [`rerun_fixture`] with every queued notification acknowledged (a task whose notification
/// is still queued is not purged).
fn acknowledged_fixture(dir: &Path) {
    rerun_fixture(dir);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let journal = Journal::open(dir, JournalOptions::default()).unwrap();
        let store = TaskStore::open(
            journal,
            ManualClock::new(T0 + 5_000),
            StoreConfig::default(),
        )
        .unwrap();
        let queued = store
            .receive_notifications(100, Duration::from_secs(60))
            .await
            .unwrap();
        assert!(!queued.is_empty());
        for n in queued {
            store.ack_notification(&n.receipt).await.unwrap();
        }
    });
}

#[test]
fn purge_deletes_finished_tasks_by_name_or_age_and_the_journal_still_audits_and_imports() {
    let dir = tempfile::tempdir().unwrap();
    acknowledged_fixture(dir.path());
    // Not ended, unknown: refused with nothing written.
    let refused = dtask(dir.path())
        .args(["purge", "job.rerun-1"])
        .assert()
        .code(2);
    let said = String::from_utf8_lossy(&refused.get_output().stderr).to_string();
    assert!(said.contains("job.rerun-1 has not ended"), "{said}");
    dtask(dir.path()).args(["purge", "nobody"]).assert().code(2);
    let cutoff = (T0 + 10_000).to_string();
    // Held, it is kept (and named); lifted, it may go.
    let held = stdout(dtask(dir.path()).args(["hold", "job", "--reason", "case 9"]));
    assert!(held.contains("on hold (\"case 9\")"), "{held}");
    let shown = stdout(dtask(dir.path()).args(["show", "job"]));
    assert!(
        shown
            .lines()
            .any(|l| l.starts_with("on hold") && l.ends_with("\"case 9\"")),
        "{shown}"
    );
    let kept = json(&stdout(dtask(dir.path()).args([
        "purge",
        "--finished-before",
        &cutoff,
        "--json",
    ])));
    assert_eq!(kept["purged"]["tasks"], 0, "{kept}");
    assert_eq!(kept["kept"][0]["why"], "job is on hold", "{kept}");
    dtask(dir.path())
        .args(["purge", "job"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("job is on hold"));
    let unheld = json(&stdout(
        dtask(dir.path()).args(["hold", "job", "--lift", "--json"]),
    ));
    assert_eq!(unheld["hold"], serde_json::Value::Null, "{unheld}");
    let dry = json(&stdout(dtask(dir.path()).args([
        "purge",
        "--finished-before",
        &cutoff,
        "--dry-run",
        "--json",
    ])));
    assert_eq!(dry["purged"]["tasks"], 1, "{dry}");
    assert_eq!(dry["dry_run"], true);
    let records = stdout(dtask(dir.path()).args(["events", "job"]))
        .lines()
        .count();
    assert!(records > 3, "the dry run wrote nothing");

    let work = tempfile::tempdir().unwrap();
    // An archive is never replaced: it holds records the journal has no more.
    let earlier = work.path().join("earlier.jsonl");
    std::fs::write(&earlier, "an earlier purge's archive\n").unwrap();
    dtask(dir.path())
        .args(["purge", "--finished-before", &cutoff, "--export"])
        .arg(&earlier)
        .assert()
        .code(2)
        .stderr(predicate::str::contains("exists"));
    assert_eq!(
        std::fs::read_to_string(&earlier).unwrap(),
        "an earlier purge's archive\n"
    );
    let saved = work.path().join("purged.jsonl");
    let done = json(&stdout(
        dtask(dir.path())
            .args([
                "purge",
                "--finished-before",
                &cutoff,
                "--json",
                "--compact",
                "--export",
            ])
            .arg(&saved),
    ));
    // Compacted after: the directory's size before and after, measured.
    assert!(
        done["compacted"]["bytes_before"].as_u64().unwrap() > 0
            && done["compacted"]["bytes_after"].as_u64().unwrap() > 0,
        "{done}"
    );
    // Exported before it went: every record of it, in full.
    let saved = std::fs::read_to_string(&saved).unwrap();
    assert_eq!(
        saved.lines().count() as u64,
        1 + done["purged"]["records"].as_u64().unwrap(),
        "{saved}"
    );
    assert!(saved.lines().skip(1).all(|l| l.contains(r#""task":"job""#)));
    assert_eq!(done["purged"]["tasks"], 1, "{done}");
    assert!(done["purged"]["records"].as_u64().unwrap() >= 4, "{done}");
    let shown = stdout(dtask(dir.path()).args(["show", "job"]));
    assert!(shown.contains("purged at"), "{shown}");
    let shown = json(&stdout(dtask(dir.path()).args(["show", "job", "--json"])));
    assert_eq!(shown["purged"]["records"], done["purged"]["records"]);
    // `replay` says it as `show` does: nothing is left to replay, not a problem.
    let replayed = json(&stdout(dtask(dir.path()).args(["replay", "job", "--json"])));
    assert_eq!(replayed["purged"]["records"], done["purged"]["records"]);
    let listed = json(&stdout(dtask(dir.path()).args(["tasks", "--json"])));
    assert_eq!(
        listed_ids(&listed),
        [serde_json::json!("job.rerun-1"), serde_json::json!("later")]
    );
    // The rerun still names the task it reran.
    let rerun = stdout(dtask(dir.path()).args(["show", "job.rerun-1"]));
    assert!(
        rerun
            .lines()
            .any(|l| l.starts_with("rerun of") && l.ends_with("job")),
        "{rerun}"
    );
    let verified = stdout(dtask(dir.path()).arg("verify"));
    assert!(verified.contains("1 purged"), "{verified}");
    // Counted apart by stats: not a task of some status or executor.
    let stats = json(&stdout(dtask(dir.path()).args(["stats", "--json"])));
    assert_eq!(stats["purged"], 1, "{stats}");
    assert!(stats["by_status"].get("unreadable").is_none(), "{stats}");
    assert!(stats["by_executor"].get("?").is_none(), "{stats}");
    dtask(dir.path()).args(["purge", "job"]).assert().code(2);

    // A purged journal moves bit-exact: the rebuilt one leaves the same sequences out.
    let (_, rebuilt, export) = round_trip(dir.path(), work.path());
    assert!(export.contains(r#""type":"purged""#), "{export}");
    let verified = stdout(dtask(&rebuilt).arg("verify"));
    assert!(verified.contains("1 purged"), "{verified}");
    // A record after the tombstone is a problem of the purged task: exit 1, and listed.
    {
        let cfs: Vec<_> = dtask_journal::keys::COLUMN_FAMILIES.to_vec();
        let db = rocksdb::DB::open_cf(&rocksdb::Options::default(), dir.path(), cfs).unwrap();
        let cf = records_cf(&db, "job");
        let tombstone = db.get_cf(cf, keys::event_key("job", 0)).unwrap().unwrap();
        db.put_cf(cf, keys::event_key("job", 1), tombstone).unwrap();
    }
    let damaged = dtask(dir.path()).args(["show", "job"]).output().unwrap();
    assert_eq!(damaged.status.code(), Some(1));
    let text = String::from_utf8_lossy(&damaged.stdout);
    assert!(
        text.contains("purged at") && text.contains("problems"),
        "{text}"
    );
}

/// A damaged or illegal stream is evidence: a purge keeps its tree, and says why.
#[test]
fn a_purge_keeps_a_damaged_task() {
    let dir = tempfile::tempdir().unwrap();
    acknowledged_fixture(dir.path());
    // Its last record (after its end: a notification's acknowledgement) damaged — the fold
    // up to it ends the task, and the purge read it as one to go.
    let last = {
        let journal = Journal::open_read_only(dir.path()).unwrap();
        journal.head("job").unwrap().unwrap().next_position - 1
    };
    flip(dir.path(), "job", last);
    let cutoff = (T0 + 10_000).to_string();
    let done = json(&stdout(dtask(dir.path()).args([
        "purge",
        "--finished-before",
        &cutoff,
        "--json",
    ])));
    assert_eq!(done["purged"]["tasks"], 0, "{done}");
    assert_eq!(done["kept"][0]["task"], "job", "{done}");
    assert!(
        done["kept"][0]["why"].as_str().unwrap().contains("damaged"),
        "{done}"
    );
    // Still there (`events` names the damage: exit 1).
    let events = stdout_of(dtask(dir.path()).args(["events", "job"]), 1);
    assert!(events.lines().count() > 3, "{events}");
}

/// A task named twice is exported once (the export never ended); a file is written whole,
/// by a rename, nothing of it left beside.
#[test]
fn an_export_names_each_task_once_and_writes_its_file_whole() {
    let dir = built();
    let once = stdout(dtask(dir.path()).args(["export", "--task", "alpha"]));
    let twice = stdout(dtask(dir.path()).args(["export", "--task", "alpha", "--task", "alpha"]));
    assert_eq!(once, twice);
    let work = tempfile::tempdir().unwrap();
    let file = work.path().join("alpha.jsonl");
    std::fs::write(&file, "x".repeat(1 << 20)).unwrap();
    dtask(dir.path())
        .args(["export", "--task", "alpha", "-o"])
        .arg(&file)
        .assert()
        .success();
    assert_eq!(std::fs::read_to_string(&file).unwrap(), once);
    let names: Vec<_> = std::fs::read_dir(work.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["alpha.jsonl"]);
}

#[test]
fn a_purged_journal_moves_to_postgres_and_back_bit_exact_and_purges_there() {
    let Some(pg) = pg_url("purged") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    acknowledged_fixture(dir.path());
    dtask(dir.path()).args(["purge", "job"]).assert().success();
    let work = tempfile::tempdir().unwrap();
    let file = work.path().join("purged.jsonl");
    dtask(dir.path())
        .args(["export", "-o"])
        .arg(&file)
        .assert()
        .success();
    let text = stdout(dtask_at(&pg).arg("import").arg(&file));
    assert!(text.contains("every digest and CRC matches"), "{text}");
    assert_eq!(
        stdout(dtask_at(&pg).arg("export")),
        std::fs::read_to_string(&file).unwrap()
    );
    // On PostgreSQL: a purged id stays taken, and another purge audits clean.
    let shown = stdout(dtask_at(&pg).args(["show", "job"]));
    assert!(shown.contains("purged at"), "{shown}");
    dtask_at(&pg)
        .args(["purge", "--finished-before", "2100-01-01", "--compact"])
        .assert()
        .success()
        .stdout(predicate::str::contains(
            "not compacted: the database reclaims",
        ));
    let verified = stdout(dtask_at(&pg).arg("verify"));
    assert!(
        verified.contains("1 purged") && verified.ends_with("clean\n"),
        "{verified}"
    );
    // And back: the journal PostgreSQL holds rebuilds bit-exact on RocksDB.
    round_trip_from(&pg, &work.path().join("back"));
}

/// Exports the journal at `from` (a URL or directory) and rebuilds it in `to` ([`rebuild`]).
fn round_trip_from(from: &str, to: &Path) {
    let export = stdout(dtask_at(from).arg("export"));
    let file = to.with_extension("jsonl");
    std::fs::write(&file, &export).unwrap();
    rebuild(&file, &export, to);
}

#[test]
fn trim_drops_older_progress_bytes_by_name_or_age_and_the_journal_still_audits_and_imports() {
    let dir = built();
    dtask(dir.path())
        .args(["trim", "nobody"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("no task \"nobody\""));
    // A named task on hold is refused before any other is trimmed.
    dtask(dir.path())
        .args(["hold", "beta", "--reason", "case 9"])
        .assert()
        .success();
    dtask(dir.path())
        .args(["trim", "alpha", "beta", "--keep", "1"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("\"beta\" is on hold (case 9)"));
    let events = stdout(dtask(dir.path()).args(["events", "alpha"]));
    assert!(!events.contains("update_trimmed"), "alpha was trimmed");
    dtask(dir.path())
        .args(["hold", "beta", "--lift"])
        .assert()
        .success();
    let dry = json(&stdout(dtask(dir.path()).args([
        "trim",
        "alpha",
        "--keep",
        "1",
        "--dry-run",
        "--json",
    ])));
    assert_eq!(dry["trimmed"]["records"], 1, "{dry}");
    assert_eq!(dry["dry_run"], true);
    let events = stdout(dtask(dir.path()).args(["events", "alpha"]));
    assert!(
        !events.contains("update_trimmed"),
        "the dry run wrote nothing"
    );

    let done = json(&stdout(
        dtask(dir.path()).args(["trim", "alpha", "--keep", "1", "--json"]),
    ));
    assert_eq!(
        (&done["trimmed"]["tasks"], &done["trimmed"]["records"]),
        (&1.into(), &1.into()),
        "{done}"
    );
    let events = stdout(dtask(dir.path()).args(["events", "alpha"]));
    assert!(
        events.contains("update_trimmed") && events.contains("progress_trimmed"),
        "{events}"
    );
    let shown = stdout(dtask(dir.path()).args(["show", "alpha"]));
    assert!(shown.contains("update_trimmed"), "{shown}");
    assert!(shown.contains("2 updates, 1 trimmed"), "{shown}");
    let shown = json(&stdout(dtask(dir.path()).args(["show", "alpha", "--json"])));
    assert_eq!(
        (
            &shown["state"]["updates"],
            &shown["state"]["trimmed_updates"]
        ),
        (&2.into(), &1.into()),
        "{shown}"
    );
    // Again: nothing more to trim.
    let again = json(&stdout(
        dtask(dir.path()).args(["trim", "alpha", "--keep", "1", "--json"]),
    ));
    assert_eq!(again["trimmed"]["records"], 0, "{again}");
    // By age, to nothing kept.
    let swept = json(&stdout(dtask(dir.path()).args([
        "trim",
        "--finished-before",
        "2100-01-01",
        "--keep",
        "0",
        "--compact",
        "--json",
    ])));
    assert!(
        swept["trimmed"]["records"].as_u64().unwrap() >= 1,
        "{swept}"
    );
    let verified = stdout(dtask(dir.path()).arg("verify"));
    assert!(verified.contains("trimmed in"), "{verified}");
    // One task's audit counts its trims too, and a task named twice once.
    let one =
        json(&stdout(dtask(dir.path()).args([
            "verify", "--task", "alpha", "--task", "alpha", "--json",
        ])));
    assert_eq!(
        (&one["tasks"], &one["trimmed"]),
        (&1.into(), &1.into()),
        "{one}"
    );
    assert!(one["trimmed_records"].as_u64().unwrap() >= 1, "{one}");

    // A trimmed journal moves bit-exact.
    let work = tempfile::tempdir().unwrap();
    let (_, rebuilt, export) = round_trip(dir.path(), work.path());
    assert!(export.contains(r#""type":"update_trimmed""#), "{export}");
    let verified = stdout(dtask(&rebuilt).arg("verify"));
    assert!(verified.contains("trimmed in"), "{verified}");
}

#[test]
fn a_trimmed_journal_moves_to_postgres_and_back_bit_exact_and_trims_there() {
    let Some(pg) = pg_url("trimmed") else {
        return;
    };
    let dir = built();
    dtask(dir.path())
        .args(["trim", "alpha", "--keep", "1"])
        .assert()
        .success();
    let work = tempfile::tempdir().unwrap();
    let file = work.path().join("trimmed.jsonl");
    dtask(dir.path())
        .args(["export", "-o"])
        .arg(&file)
        .assert()
        .success();
    let text = stdout(dtask_at(&pg).arg("import").arg(&file));
    assert!(text.contains("every digest and CRC matches"), "{text}");
    assert_eq!(
        stdout(dtask_at(&pg).arg("export")),
        std::fs::read_to_string(&file).unwrap()
    );
    // On PostgreSQL: trimmed again (its rows replaced), the journal audits clean.
    let done = json(&stdout(
        dtask_at(&pg).args(["trim", "alpha", "--keep", "0", "--json"]),
    ));
    assert_eq!(done["trimmed"]["records"], 1, "{done}");
    let verified = stdout(dtask_at(&pg).arg("verify"));
    assert!(
        verified.contains("2 progress updates trimmed in 1 task"),
        "{verified}"
    );
}

#[test]
fn probe_tells_what_a_synced_record_survives_where_a_journal_lies() {
    let work = tempfile::tempdir().unwrap();
    // A journal not created yet is probed where it would be, and not created.
    let later = work.path().join("journals/one");
    let probed = json(&stdout(
        dtask(&later).args(["probe", "--syncs", "7", "--json"]),
    ));
    assert_eq!(probed["syncs"]["count"], 7, "{probed}");
    assert_eq!(probed["syncs"]["bytes"], 4096, "{probed}");
    assert!(probed["syncs"]["p50_us"].as_u64().is_some(), "{probed}");
    assert_eq!(
        probed["placement"]["dir"],
        work.path().canonicalize().unwrap().display().to_string(),
        "{probed}"
    );
    if cfg!(target_os = "linux") {
        assert!(probed["placement"]["filesystem"].is_string(), "{probed}");
    }
    let promise = probed["verdict"]["promise"].as_str().unwrap().to_owned();
    assert!(
        ["stable", "flushed", "lost", "unknown"].contains(&promise.as_str()),
        "{probed}"
    );
    assert!(!work.path().join("journals").exists());
    // The probe's file is gone; an existing journal is probed in its own directory.
    let dir = built();
    let before: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    let text = stdout(dtask(dir.path()).args(["probe", "--syncs", "3"]));
    assert!(text.contains("synced writes of 4 KiB: p50"), "{text}");
    assert!(text.contains("(3 timed)"), "{text}");
    assert!(text.contains(&format!("verdict: {promise}")), "{text}");
    let after: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(before.len(), after.len(), "{after:?}");
    // No syncs timed when asked for none.
    let untimed = json(&stdout(
        dtask(dir.path()).args(["probe", "--syncs", "0", "--json"]),
    ));
    assert!(untimed["syncs"].is_null(), "{untimed}");
    // More syncs than a probe takes are refused before anything is timed.
    dtask(dir.path())
        .args(["probe", "--syncs", "4294967295"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("100000"));
    // A file is no place for a journal.
    let file = work.path().join("file");
    std::fs::write(&file, b"x").unwrap();
    dtask(&file)
        .arg("probe")
        .assert()
        .code(2)
        .stderr(predicate::str::contains("is a file"));
}

#[cfg(target_os = "linux")]
#[test]
fn probe_fails_a_journal_in_memory() {
    // /dev/shm is a tmpfs wherever the C library mounts it.
    let Ok(shm) = tempfile::tempdir_in("/dev/shm") else {
        eprintln!("SKIPPED probe_fails_a_journal_in_memory: no /dev/shm to write to");
        return;
    };
    let assert = dtask(&shm.path().join("j"))
        .args(["probe", "--syncs", "2", "--json"])
        .assert()
        .code(1);
    let probed = json(&String::from_utf8(assert.get_output().stdout.clone()).unwrap());
    assert_eq!(probed["placement"]["filesystem"], "tmpfs", "{probed}");
    assert_eq!(probed["verdict"]["promise"], "lost", "{probed}");
    dtask(&shm.path().join("j"))
        .args(["probe", "--syncs", "0"])
        .assert()
        .code(1)
        .stdout(predicate::str::contains(
            "verdict: lost — tmpfs keeps its files in memory",
        ));
}

#[test]
fn probe_reads_a_postgres_servers_settings_and_times_its_commits() {
    let Some(pg) = pg_url("probe") else {
        return;
    };
    let probed = json(&stdout(
        dtask_at(&pg).args(["probe", "--syncs", "5", "--json"]),
    ));
    assert_eq!(probed["commits"]["count"], 5, "{probed}");
    assert!(
        probed["server"]["version"]
            .as_str()
            .is_some_and(|v| !v.is_empty()),
        "{probed}"
    );
    // The test server runs with fsync on.
    assert_eq!(probed["server"]["fsync"], true, "{probed}");
    assert_eq!(probed["verdict"]["promise"], "flushed", "{probed}");
    assert!(
        probed["journal"].as_str().unwrap().contains("PostgreSQL"),
        "{probed}"
    );
    let text = stdout(dtask_at(&pg).args(["probe", "--syncs", "2"]));
    assert!(text.contains("commits flushed: p50"), "{text}");
    assert!(text.contains("fsync on"), "{text}");
}

/// Root `tree` with nested `tree/a` and its nested `tree/a/x`, all completed; root `open`,
/// completed, with nested `open/c` still running. Every queued notification acknowledged.
fn nested_fixture(dir: &Path) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let clock = ManualClock::new(T0);
        let journal = Journal::open(dir, JournalOptions::default()).unwrap();
        let store = TaskStore::open(journal, clock.clone(), StoreConfig::default()).unwrap();
        let started = |id: &'static str, parent: Option<&'static str>| {
            let store = store.clone();
            async move {
                let mut create = request(id, "shell", b"{}", LeasePolicy::Retry);
                if let Some(parent) = parent {
                    let p = store.get(parent).await.unwrap();
                    create.spec.session_id = String::new();
                    create.spec.notify_session = false;
                    create.parent = Some(dtask_engine::ExecutionContext {
                        task_id: parent.into(),
                        attempt: p.attempt,
                        generation: p.mailbox.generation,
                    });
                }
                store.create(create).await.unwrap();
                store.execute(id, 1, Cmd::Start).await.unwrap()
            }
        };
        let complete = |id: &'static str| {
            let store = store.clone();
            async move {
                let t = store.get(id).await.unwrap();
                store
                    .execute(id, t.version, Cmd::Complete { data: vec![] })
                    .await
                    .unwrap();
            }
        };
        started("tree", None).await;
        started("tree/a", Some("tree")).await;
        started("tree/a/x", Some("tree/a")).await;
        started("open", None).await;
        started("open/c", Some("open")).await;
        clock.advance(Duration::from_secs(1));
        for id in ["tree/a/x", "tree/a", "tree", "open"] {
            complete(id).await;
        }
        for n in store
            .receive_notifications(100, Duration::from_secs(60))
            .await
            .unwrap()
        {
            store.ack_notification(&n.receipt).await.unwrap();
        }
    });
}

#[test]
fn purge_takes_a_root_with_its_nested_tasks_and_keeps_a_tree_with_one_running() {
    let dir = tempfile::tempdir().unwrap();
    nested_fixture(dir.path());
    for (task, said) in [
        (
            "tree/a",
            "\"tree/a\" is a nested task of \"tree\": purge its root task",
        ),
        ("nobody", "no task \"nobody\" that could be purged"),
        ("open", "cannot purge: open/c has not ended"),
    ] {
        dtask(dir.path())
            .args(["purge", task])
            .assert()
            .code(2)
            .stderr(predicate::str::contains(said));
    }
    let cutoff = (T0 + 10_000).to_string();
    let dry = json(&stdout(dtask(dir.path()).args([
        "purge",
        "--finished-before",
        &cutoff,
        "--dry-run",
        "--json",
    ])));
    assert_eq!(dry["purged"]["tasks"], 3, "{dry}");
    // A tree is never split, whatever the batch.
    let done = json(&stdout(dtask(dir.path()).args([
        "purge",
        "--finished-before",
        &cutoff,
        "--batch",
        "1",
        "--json",
    ])));
    assert_eq!(done["purged"]["tasks"], 3, "{done}");
    assert_eq!(
        done["purged"]["records"], dry["purged"]["records"],
        "{done}"
    );
    assert_eq!(
        done["kept"],
        serde_json::json!([{"task": "open", "why": "open/c has not ended"}]),
        "{done}"
    );
    let left = json(&stdout(dtask(dir.path()).args(["tasks", "--json"])));
    assert_eq!(
        listed_ids(&left),
        [serde_json::json!("open"), serde_json::json!("open/c")],
        "{left}"
    );
    let again = json(&stdout(dtask(dir.path()).args([
        "purge",
        "--finished-before",
        &cutoff,
        "--json",
    ])));
    assert_eq!(again["purged"]["tasks"], 0, "{again}");
    assert_eq!(again["purged_before"], 3, "{again}");
    dtask(dir.path()).arg("verify").assert().success();
}

#[test]
fn output_that_cannot_be_written_ends_quietly_at_a_closed_pipe_and_fails_on_a_full_device() {
    use std::io::BufRead;
    use std::process::Stdio;
    // `dtask demo | head -1`: the reader goes away after a line; the demo runs on to its
    // end and exits 0, as every command does at a closed pipe (no panic).
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_dtask"))
        .env_remove("DTASK_JOURNAL")
        .arg("demo")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    assert!(first.starts_with("dtask demo:"), "{first}");
    let done = child.wait_with_output().unwrap();
    assert!(
        done.status.success(),
        "{:?}: {}",
        done.status,
        String::from_utf8_lossy(&done.stderr)
    );

    // A full device: the document could not be written, which is an error (exit 2).
    let dir = built();
    let work = tempfile::tempdir().unwrap();
    let export = work.path().join("export.jsonl");
    for args in [
        vec!["outbox", "--json"],
        vec!["export", "--json", "-o", export.to_str().unwrap()],
    ] {
        let full = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap();
        let done = std::process::Command::new(env!("CARGO_BIN_EXE_dtask"))
            .env_remove("DTASK_JOURNAL")
            .arg("--journal")
            .arg(dir.path())
            .args(&args)
            .stdout(full)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&done.stderr);
        assert_eq!(done.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains("writing output"), "{args:?}: {stderr}");
    }
}

#[test]
fn an_import_into_a_schema_holding_another_applications_tables_is_refused() {
    let Some(pg) = pg_url("foreign") else {
        return;
    };
    let schema = pg.rsplit_once("schema=").unwrap().1.to_owned();
    pg_admin(&format!(
        "CREATE SCHEMA \"{schema}\"; CREATE TABLE \"{schema}\".orders (id int); \
         INSERT INTO \"{schema}\".orders VALUES (1)"
    ));
    let dir = built();
    let work = tempfile::tempdir().unwrap();
    let file = work.path().join("export.jsonl");
    dtask(dir.path())
        .args(["export", "-o"])
        .arg(&file)
        .assert()
        .success();
    dtask_at(&pg)
        .arg("import")
        .arg(&file)
        .assert()
        .code(2)
        .stderr(predicate::str::contains("not a dtask journal's"));
    // The application's table is as it was (this fails if it is gone or changed).
    pg_admin(&format!(
        "DO $$ BEGIN IF (SELECT count(*) FROM \"{schema}\".orders) <> 1 THEN \
         RAISE EXCEPTION 'changed'; END IF; END $$"
    ));
}
