//! Golden fixtures of record format v1 (BLAKE3 chain digests) — one with an event of every
//! type of event schema v1, one with an event of every type schema v2 added — and of record
//! format v2 (SHA-256), with every event of both, and one each with every type schemas v3,
//! v4, v5, v6 and v7 added:
//! the committed bytes must decode to the same events, and encoding those events must give
//! the same bytes. A failure means the format
//! drifted: bump `RECORD_FORMAT_VERSION`, add an upcast, and keep the old fixture. Regenerate
//! (only with a version bump) with `DTASK_BLESS=1 cargo test -p dtask-journal --test golden`.
#![allow(clippy::unwrap_used)]

use dtask_journal::record::{self, Digest, RecordFormat};
use dtask_journal::{
    Delivery, Event, EventType, ExpiryResolution, LeasePolicy, Publication, TaskSpec, Timestamp,
};

const FIXTURE: &str = "tests/fixtures/format-v1.hex";
const FIXTURE_V2: &str = "tests/fixtures/schema-v2.hex";
const FIXTURE_RECORD_V2: &str = "tests/fixtures/record-v2.hex";
const FIXTURE_V3: &str = "tests/fixtures/schema-v3.hex";
const FIXTURE_V4: &str = "tests/fixtures/schema-v4.hex";
const FIXTURE_V5: &str = "tests/fixtures/schema-v5.hex";
const FIXTURE_V6: &str = "tests/fixtures/schema-v6.hex";
const FIXTURE_V7: &str = "tests/fixtures/schema-v7.hex";
const TASK: &str = "golden-task";

/// One event of every type, with fixed values.
#[allow(clippy::too_many_lines, reason = "one literal event per type")]
fn events() -> Vec<Event> {
    let at = Timestamp(1_764_000_000_000);
    vec![
        Event::Created {
            spec: TaskSpec {
                id: TASK.into(),
                executor_key: "eino.dev/recoverable-background-tool".into(),
                kind: "background_tool".into(),
                payload: br#"{"version":1,"tool_name":"shell","arguments":"{}"}"#.to_vec(),
                description: "run a shell command".into(),
                output_file: "/tmp/out.txt".into(),
                session_id: "session-1".into(),
                notify_session: true,
            }
            .into(),
            policy: LeasePolicy::Retry,
            checkpoint: vec![1, 2, 3],
            context_snapshot: vec![9],
            at,
        },
        Event::AttemptStarted {
            attempt: 1,
            lease_deadline: at.plus_millis(30_000),
            at,
        },
        Event::Heartbeat {
            lease_deadline: at.plus_millis(40_000),
            at: at.plus_millis(10_000),
        },
        Event::StartCommitted {
            checkpoint: br#"{"started":true}"#.to_vec(),
            at,
        },
        Event::TranscriptFailed {
            error: "disk full".into(),
            at,
        },
        Event::UpdateAppended {
            attempt: 1,
            event_id: "evt-1".into(),
            kind: "progress".into(),
            data: b"50%".to_vec(),
            metadata: vec![("k".into(), "v".into())],
            at,
        },
        Event::WaitingInput {
            checkpoint: b"request".to_vec(),
            at,
        },
        Event::NotificationEnqueued {
            id: "golden-task:8:waiting_input".into(),
            event_id: String::new(),
            kind: "waiting_input".into(),
            data: vec![],
            version: 8,
            at,
        },
        Event::NotificationAcked {
            id: "golden-task:8:waiting_input".into(),
            enqueued_seq: 8,
            at,
        },
        Event::InputProvided {
            data: b"yes".to_vec(),
            context_snapshot: None,
            at,
        },
        Event::AttemptStarted {
            attempt: 2,
            lease_deadline: at.plus_millis(30_000),
            at,
        },
        Event::Suspended {
            checkpoint: b"s".to_vec(),
            at,
        },
        Event::Released {
            context_snapshot: Some(vec![]),
            at,
        },
        Event::AttemptStarted {
            attempt: 3,
            lease_deadline: at.plus_millis(30_000),
            at,
        },
        Event::Yielded {
            checkpoint: vec![],
            at,
        },
        Event::AttemptStarted {
            attempt: 4,
            lease_deadline: at.plus_millis(30_000),
            at,
        },
        Event::LeaseExpired {
            resolution: ExpiryResolution::Retry,
            deadline: at.plus_millis(30_000),
            at: at.plus_millis(31_000),
        },
        Event::CancelRequested {
            reason: "user".into(),
            lease_deadline: None,
            direct: false,
            at,
        },
        Event::AttemptStarted {
            attempt: 5,
            lease_deadline: at.plus_millis(30_000),
            at,
        },
        Event::Canceled {
            reason: "user".into(),
            at,
        },
        Event::Completed {
            data: b"unused".to_vec(),
            at,
        },
        Event::Failed {
            error: "boom".into(),
            at,
        },
    ]
}

/// One event of every type event schema v2 added, with fixed values.
fn events_v2() -> Vec<Event> {
    let at = Timestamp(1_764_000_000_000);
    vec![
        Event::CreatedV2 {
            spec: TaskSpec {
                id: TASK.into(),
                executor_key: "agent".into(),
                kind: "sub_agent".into(),
                payload: b"{}".to_vec(),
                description: "a nested task".into(),
                output_file: String::new(),
                session_id: String::new(),
                notify_session: true,
            }
            .into(),
            policy: LeasePolicy::Retry,
            checkpoint: vec![],
            context_snapshot: vec![7],
            publication: Publication::Deferred,
            parent_task_id: "parent".into(),
            root_session_id: "root-session".into(),
            at,
        },
        Event::ChildCreated {
            child_id: "golden-task/child".into(),
            attempt: 1,
            generation: 1,
            at,
        },
        Event::InputSent {
            sequence: 1,
            event_id: "msg-1".into(),
            kind: "user_message".into(),
            data: b"steer left".to_vec(),
            delivery: Delivery::Preempt,
            at,
        },
        Event::InputWoke { sequence: 1, at },
        Event::CursorAdvanced {
            cursor: 1,
            attempt: 2,
            at,
        },
        Event::InputCommitted {
            cursor: 1,
            checkpoint: b"consumed".to_vec(),
            at,
        },
        Event::InputsPending {
            cursor: 1,
            checkpoint: vec![],
            at,
        },
        Event::Published { at },
        Event::PartAppended {
            attempt: 2,
            event_id: "answer".into(),
            part_id: "p1".into(),
            last: true,
            kind: "token".into(),
            data: b"hello".to_vec(),
            metadata: vec![("k".into(), "v".into())],
            at,
        },
        Event::ParentNotificationFailed {
            kind: "completed".into(),
            error: "the mailbox of task \"parent\" is sealed".into(),
            at,
        },
    ]
}

/// One event of every type event schema v3 added, with fixed values.
fn events_v3() -> Vec<Event> {
    let at = Timestamp(1_765_000_000_000);
    vec![
        Event::RerunOf {
            task: "golden-original".into(),
            at,
        },
        Event::RerunAs {
            task: "golden-task.rerun-1".into(),
            at,
        },
        Event::RecoveryLimit {
            max_recoveries: 3,
            at,
        },
        Event::NotBefore {
            until: Timestamp(1_765_000_060_000),
            at,
        },
    ]
}

/// One event of every type event schema v4 added, with fixed values.
fn events_v4() -> Vec<Event> {
    vec![
        Event::Purged {
            records: 7,
            sequences: [0x0123_4567_89ab_cdef, 0xfedc_ba98_7654_3210],
            last_digest: [0x5a; 32],
            at: Timestamp(1_766_000_000_000),
        },
        Event::Hold {
            reason: "case 4411: keep until the review".into(),
            at: Timestamp(1_766_000_000_001),
        },
        Event::HoldLifted {
            at: Timestamp(1_766_000_000_002),
        },
    ]
}

/// One event of every type event schema v5 added, with fixed values.
fn events_v5() -> Vec<Event> {
    vec![
        Event::UpdateTrimmed {
            attempt: 2,
            event_id: "line-17".into(),
            part_id: "p3".into(),
            last: false,
            kind: "stdout".into(),
            bytes: 4_153,
            at: Timestamp(1_767_000_000_000),
        },
        Event::ProgressTrimmed {
            records: 41,
            bytes: 170_233,
            digest_before: [0xa5; 32],
            at: Timestamp(1_767_000_000_001),
        },
    ]
}

/// One event of every type event schema v6 added, with fixed values.
fn events_v6() -> Vec<Event> {
    vec![Event::ParentNotified {
        attempt: 3,
        event_id: "found-42".into(),
        kind: "finding".into(),
        data: b"{\"file\":\"src/lib.rs\"}".to_vec(),
        at: Timestamp(1_768_000_000_000),
    }]
}

/// One event of every type event schema v7 added, with fixed values.
fn events_v7() -> Vec<Event> {
    let at = Timestamp(1_769_000_000_000);
    vec![
        Event::NotificationEnqueuedV2 {
            id: "dtask.custom:Z29sZGVuLXRhc2s:c3RvcA:application-event".into(),
            event_id: "stop".into(),
            kind: "urgent".into(),
            data: b"{\"why\":\"budget\"}".to_vec(),
            delivery: Delivery::Preempt,
            version: 4,
            at,
        },
        Event::ParentNotifiedV2 {
            attempt: 2,
            event_id: "found-43".into(),
            kind: "finding".into(),
            data: b"{\"file\":\"src/main.rs\"}".to_vec(),
            delivery: Delivery::Preempt,
            at,
        },
    ]
}

fn encode(format: RecordFormat, events: &[Event]) -> Vec<String> {
    let mut prev = Digest::GENESIS;
    let mut lines = Vec::new();
    for (i, event) in events.iter().enumerate() {
        let position = i as u64;
        let payload = record::encode_payload(event).unwrap();
        let (bytes, digest) =
            record::frame_as(format, TASK, position, position + 1, &payload, &prev).unwrap();
        prev = digest;
        lines.push(hex(&bytes));
    }
    lines
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::new(), |mut s, b| {
        use std::fmt::Write;
        let _ = write!(s, "{b:02x}");
        s
    })
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

#[test]
fn format_v1_fixture_decodes_and_reencodes_identically() {
    check_fixture(FIXTURE, RecordFormat::BLAKE3, &events());
}

#[test]
fn schema_v2_fixture_decodes_and_reencodes_identically() {
    check_fixture(FIXTURE_V2, RecordFormat::BLAKE3, &events_v2());
}

#[test]
fn record_v2_fixture_decodes_and_reencodes_identically() {
    let all: Vec<Event> = events().into_iter().chain(events_v2()).collect();
    check_fixture(FIXTURE_RECORD_V2, RecordFormat::SHA256, &all);
}

#[test]
fn schema_v3_fixture_decodes_and_reencodes_identically() {
    check_fixture(FIXTURE_V3, RecordFormat::SHA256, &events_v3());
}

#[test]
fn schema_v4_fixture_decodes_and_reencodes_identically() {
    check_fixture(FIXTURE_V4, RecordFormat::SHA256, &events_v4());
}

#[test]
fn schema_v5_fixture_decodes_and_reencodes_identically() {
    check_fixture(FIXTURE_V5, RecordFormat::SHA256, &events_v5());
}

#[test]
fn schema_v6_fixture_decodes_and_reencodes_identically() {
    check_fixture(FIXTURE_V6, RecordFormat::SHA256, &events_v6());
}

#[test]
fn schema_v7_fixture_decodes_and_reencodes_identically() {
    check_fixture(FIXTURE_V7, RecordFormat::SHA256, &events_v7());
}

#[test]
fn the_fixtures_hold_every_event_type() {
    let mut types: Vec<EventType> = events()
        .into_iter()
        .chain(events_v2())
        .chain(events_v3())
        .chain(events_v4())
        .chain(events_v5())
        .chain(events_v6())
        .chain(events_v7())
        .map(|e| e.event_type())
        .collect();
    types.sort();
    types.dedup();
    assert_eq!(types, EventType::ALL);
}

fn check_fixture(fixture_path: &str, format: RecordFormat, events: &[Event]) {
    let lines = encode(format, events);
    let path = manifest_dir().join(fixture_path);
    if std::env::var_os("DTASK_BLESS").is_some() || !path.exists() {
        let mut text = lines.join("\n");
        text.push('\n');
        std::fs::write(&path, text).unwrap();
    }
    let text = std::fs::read_to_string(&path).unwrap();
    let fixture: Vec<&str> = text.lines().collect();
    assert_eq!(fixture.len(), events.len(), "one record per event type");

    let mut prev = Digest::GENESIS;
    for (i, (line, expected)) in fixture.iter().zip(events).enumerate() {
        let rec = record::decode(TASK, i as u64, &prev, &unhex(line)).unwrap();
        assert_eq!(
            &rec.event, expected,
            "record {i} decodes to the fixed event"
        );
        assert_eq!(rec.seq, i as u64 + 1);
        assert_eq!(unhex(line)[0], format.version(), "record {i}'s framing");
        prev = rec.digest;
    }
    assert_eq!(
        fixture,
        lines.iter().map(String::as_str).collect::<Vec<_>>(),
        "encoding is unchanged"
    );
}

/// The package directory, read when the test runs (not when it was compiled), so a test binary
/// reused from a build in another checkout still finds this checkout's files.
fn manifest_dir() -> std::path::PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| std::path::PathBuf::from("."), std::path::PathBuf::from)
}
