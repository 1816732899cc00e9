//! Proptest strategies for the journal's events, and a few fixed events, shared by the test
//! files.
#![allow(dead_code, reason = "each test file uses a part of these strategies")]

use dtask_journal::{Delivery, Event, ExpiryResolution, LeasePolicy, TaskSpec, Timestamp};
use proptest::prelude::*;

/// A task's creation (executor key "x", retry policy, time 1).
pub fn created(task: &str) -> Event {
    Event::created(TaskSpec::new(task, "x"), LeasePolicy::Retry, Timestamp(1))
}

/// Progress update `i` (event id `e{i}`, time `i`).
pub fn update(i: u64) -> Event {
    Event::UpdateAppended {
        attempt: 1,
        event_id: format!("e{i}"),
        kind: "progress".into(),
        data: i.to_be_bytes().to_vec(),
        metadata: vec![],
        at: Timestamp(i),
    }
}

/// A completion (time 9).
pub fn completed() -> Event {
    Event::Completed {
        data: b"ok".to_vec(),
        at: Timestamp(9),
    }
}

/// Arbitrary bytes, up to 64.
pub fn bytes() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(any::<u8>(), 0..64)
}

/// Any timestamp.
pub fn ts() -> impl Strategy<Value = Timestamp> {
    any::<u64>().prop_map(Timestamp)
}

/// A task spec with arbitrary fields (a non-empty id).
pub fn spec() -> impl Strategy<Value = TaskSpec> {
    (
        "[a-z0-9_-]{1,16}",
        ".{0,8}",
        ".{0,8}",
        bytes(),
        ".{0,16}",
        ".{0,8}",
        ".{0,8}",
        any::<bool>(),
    )
        .prop_map(
            |(id, executor_key, kind, payload, description, output_file, session_id, notify)| {
                TaskSpec {
                    id,
                    executor_key,
                    kind,
                    payload,
                    description,
                    output_file,
                    session_id,
                    notify_session: notify,
                }
            },
        )
}

/// Every event variant with arbitrary fields.
#[allow(clippy::too_many_lines, reason = "one arm per event type reads best")]
pub fn event() -> impl Strategy<Value = Event> {
    let policy = prop_oneof![Just(LeasePolicy::Retry), Just(LeasePolicy::Fail)];
    let resolution = prop_oneof![
        Just(ExpiryResolution::Retry),
        Just(ExpiryResolution::Failed),
        Just(ExpiryResolution::Canceled)
    ];
    prop_oneof![
        (spec(), policy, bytes(), bytes(), ts()).prop_map(
            |(spec, policy, checkpoint, context_snapshot, at)| {
                Event::Created {
                    spec: spec.into(),
                    policy,
                    checkpoint,
                    context_snapshot,
                    at,
                }
            }
        ),
        (any::<u64>(), ts(), ts()).prop_map(|(attempt, lease_deadline, at)| {
            Event::AttemptStarted {
                attempt,
                lease_deadline,
                at,
            }
        }),
        (ts(), ts()).prop_map(|(lease_deadline, at)| Event::Heartbeat { lease_deadline, at }),
        (bytes(), ts()).prop_map(|(checkpoint, at)| Event::StartCommitted { checkpoint, at }),
        (".{0,16}", ts()).prop_map(|(error, at)| Event::TranscriptFailed { error, at }),
        (bytes(), ts()).prop_map(|(checkpoint, at)| Event::WaitingInput { checkpoint, at }),
        (bytes(), ts()).prop_map(|(checkpoint, at)| Event::Suspended { checkpoint, at }),
        (bytes(), ts()).prop_map(|(checkpoint, at)| Event::Yielded { checkpoint, at }),
        (bytes(), proptest::option::of(bytes()), ts()).prop_map(|(data, context_snapshot, at)| {
            Event::InputProvided {
                data,
                context_snapshot,
                at,
            }
        }),
        (proptest::option::of(bytes()), ts()).prop_map(|(context_snapshot, at)| Event::Released {
            context_snapshot,
            at
        }),
        (".{0,16}", proptest::option::of(ts()), any::<bool>(), ts()).prop_map(
            |(reason, lease_deadline, direct, at)| Event::CancelRequested {
                reason,
                lease_deadline,
                direct,
                at
            }
        ),
        (resolution, ts(), ts()).prop_map(|(resolution, deadline, at)| Event::LeaseExpired {
            resolution,
            deadline,
            at
        }),
        (bytes(), ts()).prop_map(|(data, at)| Event::Completed { data, at }),
        (".{0,16}", ts()).prop_map(|(error, at)| Event::Failed { error, at }),
        (".{0,16}", ts()).prop_map(|(reason, at)| Event::Canceled { reason, at }),
        (
            any::<u64>(),
            ".{0,16}",
            ".{0,8}",
            bytes(),
            proptest::collection::vec((".{0,4}", ".{0,4}"), 0..4),
            ts()
        )
            .prop_map(|(attempt, event_id, kind, data, metadata, at)| {
                Event::UpdateAppended {
                    attempt,
                    event_id,
                    kind,
                    data,
                    metadata,
                    at,
                }
            }),
        (".{0,16}", ".{0,8}", ".{0,8}", bytes(), any::<u64>(), ts()).prop_map(
            |(id, event_id, kind, data, version, at)| Event::NotificationEnqueued {
                id,
                event_id,
                kind,
                data,
                version,
                at
            }
        ),
        (".{0,16}", any::<u64>(), ts()).prop_map(|(id, enqueued_seq, at)| {
            Event::NotificationAcked {
                id,
                enqueued_seq,
                at,
            }
        }),
        (".{0,16}", ts()).prop_map(|(task, at)| Event::RerunOf { task, at }),
        (".{0,16}", ts()).prop_map(|(task, at)| Event::RerunAs { task, at }),
        (any::<u64>(), ts())
            .prop_map(|(max_recoveries, at)| Event::RecoveryLimit { max_recoveries, at }),
        (ts(), ts()).prop_map(|(until, at)| Event::NotBefore { until, at }),
        (any::<u64>(), ".{0,8}", ".{0,8}", bytes(), delivery(), ts()).prop_map(
            |(sequence, event_id, kind, data, delivery, at)| Event::InputSent {
                sequence,
                event_id,
                kind,
                data,
                delivery,
                at
            }
        ),
        (any::<u64>(), ".{0,8}", ".{0,8}", bytes(), ts()).prop_map(
            |(attempt, event_id, kind, data, at)| Event::ParentNotified {
                attempt,
                event_id,
                kind,
                data,
                at
            }
        ),
        (any::<u64>(), ".{0,8}", ".{0,8}", bytes(), delivery(), ts()).prop_map(
            |(attempt, event_id, kind, data, delivery, at)| Event::ParentNotifiedV2 {
                attempt,
                event_id,
                kind,
                data,
                delivery,
                at
            }
        ),
        (
            (".{0,16}", ".{0,8}", ".{0,8}"),
            bytes(),
            delivery(),
            any::<u64>(),
            ts()
        )
            .prop_map(|((id, event_id, kind), data, delivery, version, at)| {
                Event::NotificationEnqueuedV2 {
                    id,
                    event_id,
                    kind,
                    data,
                    delivery,
                    version,
                    at,
                }
            }),
    ]
}

/// Either delivery.
fn delivery() -> impl Strategy<Value = Delivery> {
    prop_oneof![Just(Delivery::Queued), Just(Delivery::Preempt)]
}
