//! A trim that reads only a stream's untrimmed tail (`Journal::trim_recent_progress`, what a
//! store that folded the stream uses) against one that reads the whole stream
//! (`Journal::trim_progress`): on the same streams, through the same steps, they write the
//! same bytes and refuse the same trims.

#![allow(clippy::unwrap_used)]

use dtask_journal::{
    Durability, Error, Event, Journal, JournalOptions, LeasePolicy, TaskSpec, Timestamp,
    TrimRefusal,
};
use proptest::prelude::*;

/// One step of a running task's life.
#[derive(Debug, Clone)]
enum Step {
    /// A progress update of this many bytes.
    Update(usize),
    /// A part of a multi-part event (the last part when set).
    Part(bool),
    /// A heartbeat (a record that is no update).
    Heartbeat,
    /// An operator's hold placed, or lifted where one stands.
    Hold,
    /// A trim to the last `keep` updates; the tail trim vouches for no hold as of the
    /// `back`-th position before the end at which none stood (0: the end).
    Trim { keep: u64, back: usize },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => (1usize..300).prop_map(Step::Update),
        1 => any::<bool>().prop_map(Step::Part),
        1 => Just(Step::Heartbeat),
        1 => Just(Step::Hold),
        3 => (0u64..6, 0usize..4).prop_map(|(keep, back)| Step::Trim { keep, back }),
    ]
}

fn open(dir: &std::path::Path) -> Journal {
    Journal::open(
        dir,
        JournalOptions::default().with_durability(Durability::Buffered),
    )
    .unwrap()
}

/// Every record of `task`'s stream: its event, sequence and chain digest.
fn stream(j: &Journal, task: &str) -> Vec<(Event, u64, String)> {
    j.read_stream(task, 0)
        .map(|r| {
            let r = r.unwrap();
            (r.event, r.seq, r.digest.to_hex())
        })
        .collect()
}

/// What a trim did, comparably: the records it trimmed, or why it was refused.
fn outcome(trimmed: Result<dtask_journal::TrimmedStream, Error>) -> Result<(u64, u64), String> {
    match trimmed {
        Ok(t) => Ok((t.records, t.rewritten)),
        Err(Error::NotTrimmable { why, .. }) => Err(format!("{why:?}")),
        Err(e) => panic!("unexpected error: {e}"),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn a_trim_reading_the_tail_writes_what_a_trim_reading_the_whole_stream_writes(
        steps in proptest::collection::vec(step(), 1..80)
    ) {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (whole, tail) = (open(a.path()), open(b.path()));
        let start = [
            Event::created(TaskSpec::new("t", "shell"), LeasePolicy::Retry, Timestamp(1)),
            Event::AttemptStarted { attempt: 1, lease_deadline: Timestamp(1 << 40), at: Timestamp(2) },
        ];
        for j in [&whole, &tail] {
            j.append("t", 0, &start).unwrap();
        }
        // The positions at which no hold stood (the stream folded that far), newest last.
        let mut unheld = vec![2u64];
        let (mut end, mut held, mut part) = (2u64, false, 0u64);
        for (n, step) in steps.into_iter().enumerate() {
            let at = Timestamp(10 + n as u64);
            let event = match step {
                Step::Update(size) => Event::UpdateAppended {
                    attempt: 1,
                    event_id: format!("u{n}"),
                    kind: "stdout".into(),
                    data: vec![b'x'; size],
                    metadata: vec![],
                    at,
                },
                Step::Part(last) => {
                    let event = Event::PartAppended {
                        attempt: 1,
                        event_id: format!("p{part}"),
                        part_id: format!("{n}"),
                        last,
                        kind: "chunk".into(),
                        data: vec![b'y'; 40],
                        metadata: vec![],
                        at,
                    };
                    if last {
                        part += 1;
                    }
                    event
                }
                Step::Heartbeat => Event::Heartbeat { lease_deadline: Timestamp(1 << 40), at },
                Step::Hold if held => Event::HoldLifted { at },
                Step::Hold => Event::Hold { reason: "case".into(), at },
                Step::Trim { keep, back } => {
                    let vouched = unheld[unheld.len().saturating_sub(back + 1)];
                    let by_whole = outcome(whole.trim_progress("t", keep, at));
                    let by_tail = outcome(tail.trim_recent_progress("t", keep, at, vouched));
                    prop_assert_eq!(&by_whole, &by_tail, "trim keep {} vouched at {}", keep, vouched);
                    if held {
                        prop_assert_eq!(by_tail, Err(format!("{:?}", TrimRefusal::OnHold)));
                    }
                    if matches!(by_whole, Ok((records, _)) if records > 0) {
                        end += 1;
                        if !held {
                            unheld.push(end);
                        }
                    }
                    continue;
                }
            };
            if matches!(event, Event::Hold { .. }) {
                held = true;
            } else if matches!(event, Event::HoldLifted { .. }) {
                held = false;
            }
            for j in [&whole, &tail] {
                j.append("t", end, std::slice::from_ref(&event)).unwrap();
            }
            end += 1;
            if !held {
                unheld.push(end);
            }
        }
        prop_assert_eq!(stream(&whole, "t"), stream(&tail, "t"));
    }
}

#[test]
fn a_tail_trim_finds_a_hold_placed_after_the_position_it_was_vouched_for() {
    let dir = tempfile::tempdir().unwrap();
    let j = open(dir.path());
    j.append(
        "t",
        0,
        &[
            Event::created(
                TaskSpec::new("t", "shell"),
                LeasePolicy::Retry,
                Timestamp(1),
            ),
            Event::AttemptStarted {
                attempt: 1,
                lease_deadline: Timestamp(1 << 40),
                at: Timestamp(2),
            },
        ],
    )
    .unwrap();
    for n in 0..4u64 {
        let update = Event::UpdateAppended {
            attempt: 1,
            event_id: format!("u{n}"),
            kind: "stdout".into(),
            data: vec![b'x'; 100],
            metadata: vec![],
            at: Timestamp(3 + n),
        };
        j.append("t", 2 + n, &[update]).unwrap();
    }
    // Folded as far as position 6 (no hold there); then another node holds the task.
    j.append(
        "t",
        6,
        &[Event::Hold {
            reason: "case 3".into(),
            at: Timestamp(9),
        }],
    )
    .unwrap();
    assert!(matches!(
        j.trim_recent_progress("t", 1, Timestamp(10), 6),
        Err(Error::NotTrimmable {
            why: TrimRefusal::OnHold,
            ..
        })
    ));
    // The hold lifted, the tail trim goes ahead, then reads no further back than it needs.
    j.append("t", 7, &[Event::HoldLifted { at: Timestamp(11) }])
        .unwrap();
    let first = j.trim_recent_progress("t", 1, Timestamp(12), 6).unwrap();
    assert_eq!((first.records, first.rewritten), (3, 6));
    let update = Event::UpdateAppended {
        attempt: 1,
        event_id: "u4".into(),
        kind: "stdout".into(),
        data: vec![b'x'; 100],
        metadata: vec![],
        at: Timestamp(13),
    };
    j.append("t", 9, &[update]).unwrap();
    let second = j.trim_recent_progress("t", 1, Timestamp(14), 10).unwrap();
    assert_eq!(
        (second.records, second.rewritten),
        (1, 5),
        "u3 trimmed: it and the records after it framed again"
    );
}
