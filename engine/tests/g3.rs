//! The newest task layer (the reference's G3): mailboxes and inputs, nested tasks,
//! publication and multi-part progress events — one test per behaviour, on a manual clock.
//!
//! Every scenario runs twice: straight, and with the store and its journal dropped and
//! reopened before every step (reboot equivalence: what the journal holds is all there is).

#![allow(clippy::unwrap_used, clippy::too_many_lines)]

mod common;

use common::*;
use dtask_engine::{
    AdvanceCursor, Command, CreateRequest, InputRequest, NotFound, NotificationRequest, StoreError,
    TaskStore, UpdateRequest,
};
use dtask_journal::{Delivery, Event, LeasePolicy, Publication};
use dtask_replay::Status;

use LeasePolicy::Retry;

/// A scenario's environment: the store, reopened before every step when `reboot` is set.
struct H {
    env: Env,
    reboot: bool,
}

impl H {
    fn new(reboot: bool) -> Self {
        Self {
            env: Env::new(),
            reboot,
        }
    }

    /// The store for the next step (reopened first when rebooting).
    fn s(&mut self) -> &TaskStore {
        if self.reboot {
            self.env.reopen();
        }
        self.env.store()
    }

    fn advance(&self, ms: u64) {
        self.env.advance(ms);
    }
}

/// Runs `$scenario` straight and with a reboot before every step.
macro_rules! scenario {
    ($name:ident) => {
        mod $name {
            #[tokio::test]
            async fn straight() {
                super::$name(&mut super::H::new(false)).await;
            }
            #[tokio::test]
            async fn with_reboots() {
                super::$name(&mut super::H::new(true)).await;
            }
        }
    };
}

fn input(event_id: &str, data: &str) -> InputRequest {
    InputRequest {
        event_id: event_id.to_owned(),
        kind: "message".to_owned(),
        data: data.as_bytes().to_vec(),
        delivery: Delivery::Queued,
    }
}

fn cursor(attempt: u64, generation: u64, expected: u64, to: u64) -> AdvanceCursor {
    AdvanceCursor {
        attempt,
        expected_generation: generation,
        expected_cursor: expected,
        cursor: to,
    }
}

fn part(attempt: u64, event_id: &str, part_id: &str, last: bool, data: &str) -> UpdateRequest {
    UpdateRequest {
        attempt,
        event_id: event_id.to_owned(),
        kind: "token".to_owned(),
        data: data.as_bytes().to_vec(),
        part_id: part_id.to_owned(),
        last,
        ..UpdateRequest::default()
    }
}

fn events_of(store: &TaskStore, id: &str) -> Vec<Event> {
    store
        .journal()
        .read_stream(id, 0)
        .map(|r| r.unwrap().event)
        .collect()
}

// ---- mailbox -----------------------------------------------------------------------------

/// Inputs get FIFO sequence numbers; the same event id and content returns the existing
/// record; other content is a typed conflict; a pending task's version does not change.
async fn inputs_are_fifo_and_deduplicated(h: &mut H) {
    create(h.s(), "t", Retry).await;
    for (i, id) in ["a", "b", "c"].into_iter().enumerate() {
        let (record, inserted) = h.s().send_input("t", input(id, id)).await.unwrap();
        assert!(inserted);
        assert_eq!(record.sequence, i as u64 + 1);
    }
    let (again, inserted) = h.s().send_input("t", input("b", "b")).await.unwrap();
    assert!(!inserted);
    assert_eq!(again.sequence, 2);
    assert_err!(
        h.s().send_input("t", input("b", "other")).await,
        StoreError::InputConflict(_)
    );
    let page = h.s().list_inputs("t", 1, 100).await.unwrap();
    let seqs: Vec<u64> = page.inputs.iter().map(|i| i.sequence).collect();
    assert_eq!(seqs, [2, 3]);
    assert_eq!((page.latest, page.consumed, page.generation), (3, 0, 1));
    let task = h.s().get("t").await.unwrap();
    assert_eq!((task.status, task.version), (Status::Pending, 1));
}
scenario!(inputs_are_fifo_and_deduplicated);

/// Input to a task waiting for input makes it pending (version + 1); input to a suspended
/// task leaves it suspended with the same version (the newest reference).
async fn input_wakes_waiting_not_suspended(h: &mut H) {
    running(h.s(), "w", Retry).await;
    let waiting = ok(
        h.s(),
        "w",
        Command::WaitInput {
            checkpoint: cp("ask"),
        },
    )
    .await;
    h.s().send_input("w", input("i1", "yes")).await.unwrap();
    let woken = h.s().get("w").await.unwrap();
    assert_eq!(woken.status, Status::Pending);
    assert_eq!(woken.version, waiting.version + 1);

    running(h.s(), "s", Retry).await;
    let suspended = ok(
        h.s(),
        "s",
        Command::Suspend {
            checkpoint: cp("zz"),
        },
    )
    .await;
    h.s().send_input("s", input("i1", "hello")).await.unwrap();
    let still = h.s().get("s").await.unwrap();
    assert_eq!(still.status, Status::Suspended);
    assert_eq!(still.version, suspended.version);
    assert_eq!(still.mailbox.latest, 1);
    let released = ok(
        h.s(),
        "s",
        Command::ReleaseSuspension {
            context_snapshot: None,
        },
    )
    .await;
    assert_eq!(released.status, Status::Pending);
}
scenario!(input_wakes_waiting_not_suspended);

/// A terminal task's mailbox is sealed (generation + 1): new input is refused, a replay of
/// an accepted input still succeeds.
async fn sealed_mailbox_refuses_new_input(h: &mut H) {
    running(h.s(), "t", Retry).await;
    h.s().send_input("t", input("early", "x")).await.unwrap();
    let done = ok(h.s(), "t", Command::Complete { data: cp("ok") }).await;
    assert_eq!(done.mailbox.generation, 2);
    assert!(done.mailbox_sealed());
    assert_err!(
        h.s().send_input("t", input("late", "x")).await,
        StoreError::MailboxSealed(_)
    );
    let (replayed, inserted) = h.s().send_input("t", input("early", "x")).await.unwrap();
    assert!(!inserted);
    assert_eq!(replayed.sequence, 1);
    assert!(h.s().list_inputs("t", 0, 10).await.unwrap().sealed);
}
scenario!(sealed_mailbox_refuses_new_input);

/// `AdvanceCursor`: generation, cursor CAS, range and attempt are checked in that order;
/// the version does not change.
async fn advance_cursor_checks(h: &mut H) {
    let t = running(h.s(), "t", Retry).await;
    for i in 1..=3 {
        h.s()
            .send_input("t", input(&format!("i{i}"), "d"))
            .await
            .unwrap();
    }
    assert_err!(
        h.s().advance_cursor("t", cursor(1, 2, 0, 1)).await,
        StoreError::OwnershipLost {
            expected: 2,
            actual: 1
        }
    );
    assert_err!(
        h.s().advance_cursor("t", cursor(1, 1, 1, 2)).await,
        StoreError::CursorConflict {
            expected: 1,
            actual: 0
        }
    );
    assert_err!(
        h.s().advance_cursor("t", cursor(1, 1, 0, 4)).await,
        StoreError::InvalidCursor(_)
    );
    assert_err!(
        h.s().advance_cursor("t", cursor(2, 1, 0, 1)).await,
        StoreError::LeaseLost(_)
    );
    let moved = h.s().advance_cursor("t", cursor(1, 1, 0, 2)).await.unwrap();
    assert_eq!(moved.mailbox.consumed, 2);
    assert_eq!(moved.version, t.version);
    // Backwards is a validation error; where it is, nothing is written.
    assert_err!(
        h.s().advance_cursor("t", cursor(1, 1, 2, 1)).await,
        StoreError::Invalid { .. }
    );
    let len = h.s().journal().stream_len("t").unwrap();
    h.s().advance_cursor("t", cursor(1, 1, 2, 2)).await.unwrap();
    assert_eq!(h.s().journal().stream_len("t").unwrap(), len);
}
scenario!(advance_cursor_checks);

/// `CommitInput` consumes and checkpoints atomically (version + 1); a stale expected cursor
/// is a cursor conflict.
async fn commit_input(h: &mut H) {
    running(h.s(), "t", Retry).await;
    h.s().send_input("t", input("i1", "d")).await.unwrap();
    h.s().send_input("t", input("i2", "d")).await.unwrap();
    let before = h.s().get("t").await.unwrap();
    let after = ok(
        h.s(),
        "t",
        Command::CommitInput {
            expected_cursor: 0,
            cursor: 2,
            checkpoint: cp("read two"),
        },
    )
    .await;
    assert_eq!(after.mailbox.consumed, 2);
    assert_eq!(after.checkpoint, cp("read two"));
    assert_eq!(after.version, before.version + 1);
    assert_err!(
        exec(
            h.s(),
            "t",
            Command::CommitInput {
                expected_cursor: 0,
                cursor: 2,
                checkpoint: cp("again"),
            },
        )
        .await,
        StoreError::CursorConflict { .. }
    );
}
scenario!(commit_input);

/// `CompleteIfNoInputs` completes when nothing newer arrived, and otherwise sends the task
/// back to pending (with the "inputs pending" error, the checkpoint kept); the next attempt
/// reads the new input and completes.
async fn complete_if_no_inputs(h: &mut H) {
    running(h.s(), "t", Retry).await;
    ok(
        h.s(),
        "t",
        Command::CommitStart {
            checkpoint: cp("started"),
        },
    )
    .await;
    h.s().send_input("t", input("late", "more")).await.unwrap();
    let err = exec(
        h.s(),
        "t",
        Command::CompleteIfNoInputs {
            cursor: 0,
            data: cp("early answer"),
        },
    )
    .await
    .unwrap_err();
    let StoreError::InputsPending(state) = err else {
        panic!("expected InputsPending, got {err:?}");
    };
    assert_eq!(state.status, Status::Pending);
    assert_eq!(state.checkpoint, cp("started"));
    assert_eq!(state.mailbox.consumed, 0);
    let again = ok(h.s(), "t", Command::Start).await;
    assert_eq!(again.attempt, 2);
    let page = h
        .s()
        .list_inputs("t", again.mailbox.consumed, 10)
        .await
        .unwrap();
    assert_eq!(page.inputs.len(), 1);
    let done = ok(
        h.s(),
        "t",
        Command::CommitInput {
            expected_cursor: 0,
            cursor: 1,
            checkpoint: cp("read"),
        },
    )
    .await;
    let done = h
        .s()
        .execute(
            "t",
            done.version,
            Command::CompleteIfNoInputs {
                cursor: 1,
                data: cp("answer"),
            },
        )
        .await
        .unwrap();
    assert_eq!(done.status, Status::Completed);
    assert_eq!(done.result_data, cp("answer"));
}
scenario!(complete_if_no_inputs);

/// `WaitInputIfNoInputs` consumes up to its cursor and waits, or goes back to pending when
/// newer input exists; `SuspendIfNoInputs` needs the exact consumed cursor.
async fn wait_and_suspend_if_no_inputs(h: &mut H) {
    running(h.s(), "t", Retry).await;
    h.s().send_input("t", input("i1", "d")).await.unwrap();
    let waiting = ok(
        h.s(),
        "t",
        Command::WaitInputIfNoInputs {
            cursor: 1,
            checkpoint: cp("need more"),
        },
    )
    .await;
    assert_eq!(waiting.status, Status::WaitingInput);
    assert_eq!(waiting.mailbox.consumed, 1);

    running(h.s(), "u", Retry).await;
    h.s().send_input("u", input("i1", "d")).await.unwrap();
    h.s().send_input("u", input("i2", "d")).await.unwrap();
    assert_err!(
        exec(
            h.s(),
            "u",
            Command::WaitInputIfNoInputs {
                cursor: 1,
                checkpoint: cp("need more"),
            },
        )
        .await,
        StoreError::InputsPending(_)
    );
    let u = h.s().get("u").await.unwrap();
    assert_eq!((u.status, u.mailbox.consumed), (Status::Pending, 1));
    assert_eq!(u.checkpoint, cp("need more"));

    ok(h.s(), "u", Command::Start).await;
    assert_err!(
        exec(
            h.s(),
            "u",
            Command::SuspendIfNoInputs {
                cursor: 2,
                checkpoint: cp("zz"),
            },
        )
        .await,
        StoreError::CursorConflict {
            expected: 2,
            actual: 1
        }
    );
    assert_err!(
        exec(
            h.s(),
            "u",
            Command::SuspendIfNoInputs {
                cursor: 1,
                checkpoint: cp("zz"),
            },
        )
        .await,
        StoreError::InputsPending(_)
    );
}
scenario!(wait_and_suspend_if_no_inputs);

/// `WaitInputs` returns once an input arrives after the given sequence.
#[tokio::test]
async fn wait_inputs_returns_when_input_arrives() {
    let env = Env::new();
    let store = env.store().clone();
    create(&store, "t", Retry).await;
    let waiter = {
        let store = store.clone();
        tokio::spawn(async move { store.wait_inputs("t", 0, 10).await })
    };
    tokio::task::yield_now().await;
    store.send_input("t", input("i1", "hi")).await.unwrap();
    let page = waiter.await.unwrap().unwrap();
    assert_eq!(page.inputs.len(), 1);
    assert_eq!(page.inputs[0].data, b"hi");
}

// ---- publication -------------------------------------------------------------------------

/// A deferred task sends no lifecycle notification until published; `Publish` moves it to
/// `on_background` without a version change and queues `task_backgrounded`; publishing again
/// is a no-op.
async fn publication(h: &mut H) {
    let deferred = CreateRequest {
        publication: Publication::Deferred,
        ..request(session_spec("d", true), Retry)
    };
    let t = h.s().create(deferred).await.unwrap();
    assert_eq!(t.publication, Publication::Deferred);
    assert!(receive_all(h.s()).await.is_empty());
    let published = h.s().publish("d", t.version).await.unwrap();
    assert_eq!(published.publication, Publication::OnBackground);
    assert_eq!(published.version, t.version);
    let kinds: Vec<String> = receive_all(h.s())
        .await
        .into_iter()
        .map(|n| n.kind)
        .collect();
    assert_eq!(kinds, ["task_backgrounded"]);
    let len = h.s().journal().stream_len("d").unwrap();
    h.s().publish("d", t.version).await.unwrap();
    assert_eq!(h.s().journal().stream_len("d").unwrap(), len);

    h.s()
        .create(request(session_spec("c", false), Retry))
        .await
        .unwrap();
    assert_err!(
        h.s().publish("c", 1).await,
        StoreError::IllegalTransition { .. }
    );
    assert_err!(
        h.s()
            .create(CreateRequest {
                publication: Publication::OnBackground,
                ..request(spec("b"), Retry)
            })
            .await,
        StoreError::Invalid {
            field: "publication",
            ..
        }
    );
    let ended = h
        .s()
        .create(CreateRequest {
            publication: Publication::Deferred,
            ..request(spec("e"), Retry)
        })
        .await
        .unwrap();
    let canceled = h
        .s()
        .execute(
            "e",
            ended.version,
            Command::RequestCancel {
                reason: String::new(),
            },
        )
        .await
        .unwrap();
    assert_err!(
        h.s().publish("e", canceled.version).await,
        StoreError::AlreadyTerminal(_)
    );
    assert_eq!(
        h.s().get("e").await.unwrap().publication,
        Publication::Deferred
    );
}
scenario!(publication);

// ---- nested tasks ------------------------------------------------------------------------

/// A running attempt creates a child: the parent records it (with the authority) in the same
/// append, lists it, and gets `task_created` in its mailbox; the child inherits the root
/// session.
async fn child_creation(h: &mut H) {
    let parent = h
        .s()
        .create(CreateRequest {
            root_session_id: "root-1".to_owned(),
            ..request(spec("p"), Retry)
        })
        .await
        .unwrap();
    h.s()
        .execute("p", parent.version, Command::Start)
        .await
        .unwrap();
    let child = h
        .s()
        .create(child_request("p/c1", "p", 1, false))
        .await
        .unwrap();
    assert_eq!(child.parent_task_id, "p");
    assert_eq!(child.root_session_id, "root-1");
    h.s()
        .create(child_request("p/c2", "p", 1, false))
        .await
        .unwrap();
    let page = h.s().list_children("p", None, 1).await.unwrap();
    assert_eq!(page.tasks[0].spec.id, "p/c1");
    let next = h
        .s()
        .list_children("p", page.next_cursor.as_deref(), 1)
        .await
        .unwrap();
    assert_eq!(next.tasks[0].spec.id, "p/c2");
    assert!(next.next_cursor.is_none());
    let inputs = h.s().list_inputs("p", 0, 10).await.unwrap().inputs;
    let seen: Vec<(String, Vec<u8>)> = inputs.into_iter().map(|i| (i.kind, i.data)).collect();
    assert_eq!(
        seen,
        [
            ("task_created".to_owned(), b"p/c1".to_vec()),
            ("task_created".to_owned(), b"p/c2".to_vec())
        ]
    );
    let p = events_of(h.s(), "p");
    assert!(p.iter().any(|e| matches!(e,
        Event::ChildCreated { child_id, attempt: 1, generation: 1, .. } if child_id == "p/c1")));
}
scenario!(child_creation);

/// A stale authority is refused, nothing written: another attempt, another generation, an
/// ended parent, an unknown parent.
async fn child_authority_is_checked(h: &mut H) {
    running(h.s(), "p", Retry).await;
    assert_err!(
        h.s().create(child_request("c", "p", 2, false)).await,
        StoreError::LeaseLost(_)
    );
    let mut stale = child_request("c", "p", 1, false);
    stale.parent.as_mut().unwrap().generation = 2;
    assert_err!(h.s().create(stale).await, StoreError::OwnershipLost { .. });
    assert_err!(
        h.s().create(child_request("c", "nobody", 1, false)).await,
        StoreError::NotFound(NotFound::Mailbox(_))
    );
    // The request's own fields are checked before its parent is looked up.
    let no_policy = CreateRequest {
        policy: None,
        ..child_request("c", "nobody", 1, false)
    };
    assert_err!(
        h.s().create(no_policy).await,
        StoreError::Invalid {
            field: "policy",
            ..
        }
    );
    ok(h.s(), "p", Command::Complete { data: vec![] }).await;
    assert_err!(
        h.s().create(child_request("c", "p", 1, false)).await,
        StoreError::MailboxSealed(_)
    );
    assert!(h.s().journal().stream_len("c").unwrap().is_none());
    assert!(h
        .s()
        .list_children("p", None, 10)
        .await
        .unwrap()
        .tasks
        .is_empty());
}
scenario!(child_authority_is_checked);

/// A child's lifecycle notifications become inputs of the parent's mailbox: they wake a
/// parent waiting for input, not a suspended one.
async fn child_notifications_reach_the_parent(h: &mut H) {
    running(h.s(), "p", Retry).await;
    h.s()
        .create(child_request("c1", "p", 1, true))
        .await
        .unwrap();
    h.s()
        .create(child_request("c2", "p", 1, true))
        .await
        .unwrap();
    let waiting = ok(
        h.s(),
        "p",
        Command::WaitInputIfNoInputs {
            cursor: 2,
            checkpoint: cp("waiting for children"),
        },
    )
    .await;
    assert_eq!(waiting.status, Status::WaitingInput);
    ok(h.s(), "c1", Command::Start).await;
    ok(h.s(), "c1", Command::Complete { data: cp("r1") }).await;
    let woken = h.s().get("p").await.unwrap();
    assert_eq!(woken.status, Status::Pending);
    assert_eq!(woken.version, waiting.version + 1);
    let last = h.s().list_inputs("p", 2, 10).await.unwrap().inputs;
    assert_eq!(last.len(), 1);
    assert_eq!(
        (last[0].kind.as_str(), last[0].data.as_slice()),
        ("completed", &b"c1"[..])
    );

    ok(h.s(), "p", Command::Start).await;
    // The wait consumed up to 2; input 3 is unread: suspending sends it back to pending.
    assert_err!(
        exec(
            h.s(),
            "p",
            Command::SuspendIfNoInputs {
                cursor: 2,
                checkpoint: cp("zz"),
            },
        )
        .await,
        StoreError::InputsPending(_)
    );
    let p = ok(h.s(), "p", Command::Start).await;
    let p = h
        .s()
        .execute(
            "p",
            p.version,
            Command::CommitInput {
                expected_cursor: 2,
                cursor: 3,
                checkpoint: cp("read all"),
            },
        )
        .await
        .unwrap();
    let suspended = h
        .s()
        .execute(
            "p",
            p.version,
            Command::SuspendIfNoInputs {
                cursor: 3,
                checkpoint: cp("zz"),
            },
        )
        .await
        .unwrap();
    assert_eq!(suspended.status, Status::Suspended);
    let c2 = h.s().get("c2").await.unwrap();
    h.s()
        .execute(
            "c2",
            c2.version,
            Command::RequestCancel {
                reason: "stop".into(),
            },
        )
        .await
        .unwrap();
    let still = h.s().get("p").await.unwrap();
    assert_eq!(still.status, Status::Suspended);
    assert_eq!(still.version, suspended.version);
    assert_eq!(still.mailbox.latest, 4);
}
scenario!(child_notifications_reach_the_parent);

fn note(event_id: &str, kind: &str, data: &str) -> NotificationRequest {
    NotificationRequest {
        event_id: event_id.to_owned(),
        kind: kind.to_owned(),
        data: data.as_bytes().to_vec(),
        ..NotificationRequest::default()
    }
}

/// A child's application notifications go into its parent's mailbox (not to a session),
/// each in one append with the child's `parent_notified` record: the input wakes a parent
/// waiting for input; a replay is a no-op, other content a conflict; a stale attempt, a
/// deferred child and an ended parent are refused with nothing written.
async fn child_application_notifications_reach_the_parent(h: &mut H) {
    running(h.s(), "p", Retry).await;
    h.s()
        .create(child_request("c", "p", 1, false))
        .await
        .unwrap();
    let waiting = ok(
        h.s(),
        "p",
        Command::WaitInputIfNoInputs {
            cursor: 1,
            checkpoint: cp("waiting for findings"),
        },
    )
    .await;
    assert_eq!(waiting.status, Status::WaitingInput);
    let child = ok(h.s(), "c", Command::Start).await;
    h.s()
        .enqueue_notification("c", 1, note("found-1", "finding", "src/a.rs"))
        .await
        .unwrap();
    let woken = h.s().get("p").await.unwrap();
    assert_eq!(woken.status, Status::Pending, "the input woke the parent");
    let inputs = h.s().list_inputs("p", 1, 10).await.unwrap().inputs;
    assert_eq!(inputs.len(), 1);
    assert_eq!(
        (inputs[0].kind.as_str(), inputs[0].data.as_slice()),
        ("finding", &b"src/a.rs"[..])
    );
    assert_eq!(
        inputs[0].event_id,
        dtask_engine::application_notification_id("c", "found-1")
    );
    let after = h.s().get("c").await.unwrap();
    assert_eq!(after.version, child.version, "the child's version stays");
    let c = events_of(h.s(), "c");
    assert!(
        matches!(c.last(), Some(Event::ParentNotified { attempt: 1, event_id, kind, data, .. })
        if event_id == "found-1" && kind == "finding" && data == b"src/a.rs")
    );
    assert!(!c
        .iter()
        .any(|e| matches!(e, Event::NotificationEnqueued { .. })));
    assert!(receive_all(h.s()).await.is_empty(), "nothing for a session");

    // A replay (same content) writes nothing; other content is a conflict.
    let position = h.s().journal().stream_len("p").unwrap();
    h.s()
        .enqueue_notification("c", 1, note("found-1", "finding", "src/a.rs"))
        .await
        .unwrap();
    assert_err!(
        h.s()
            .enqueue_notification("c", 1, note("found-1", "finding", "src/b.rs"))
            .await,
        StoreError::NotificationEventIdConflict(_)
    );
    assert_err!(
        h.s()
            .enqueue_notification("c", 2, note("found-2", "finding", "src/b.rs"))
            .await,
        StoreError::LeaseLost(_)
    );
    assert_eq!(h.s().journal().stream_len("p").unwrap(), position);

    // A deferred child (created by the parent's next attempt): its parent does not see it
    // yet.
    let p = ok(h.s(), "p", Command::Start).await;
    assert_eq!(p.attempt, 2);
    h.s()
        .create(CreateRequest {
            publication: Publication::Deferred,
            ..child_request("d", "p", 2, false)
        })
        .await
        .unwrap();
    ok(h.s(), "d", Command::Start).await;
    assert_err!(
        h.s()
            .enqueue_notification("d", 1, note("found-3", "finding", "x"))
            .await,
        StoreError::NotificationUnavailable(_)
    );

    // The parent ended: its mailbox is sealed, and nothing is written for the child.
    ok(h.s(), "p", Command::Complete { data: vec![] }).await;
    let before = h.s().journal().stream_len("c").unwrap();
    assert_err!(
        h.s()
            .enqueue_notification("c", 1, note("found-4", "finding", "late"))
            .await,
        StoreError::MailboxSealed(_)
    );
    assert_eq!(h.s().journal().stream_len("c").unwrap(), before);
    // A deferred child published once its parent has ended: the publish fails whole (its
    // notice is the publish), the child still deferred.
    let d = h.s().get("d").await.unwrap();
    let before = h.s().journal().stream_len("d").unwrap();
    assert_err!(
        h.s().publish("d", d.version).await,
        StoreError::MailboxSealed(_)
    );
    assert_eq!(
        h.s().get("d").await.unwrap().publication,
        Publication::Deferred
    );
    assert_eq!(h.s().journal().stream_len("d").unwrap(), before);
}
scenario!(child_application_notifications_reach_the_parent);

/// An input sent to a parent under the id a child's notice takes is not taken for the
/// notice: with other content the notice is a conflict — an application notification is
/// refused with nothing written, a lifecycle one is recorded as not delivered — and with
/// the same content it is the notice delivered before.
async fn a_notice_meeting_another_input_under_its_id_conflicts(h: &mut H) {
    running(h.s(), "p", Retry).await;
    h.s()
        .create(child_request("c", "p", 1, true))
        .await
        .unwrap();
    let child = ok(h.s(), "c", Command::Start).await;
    let taken = |event_id: String, data: &str| InputRequest {
        event_id,
        kind: "finding".to_owned(),
        data: data.as_bytes().to_vec(),
        delivery: Delivery::Queued,
    };
    h.s()
        .send_input(
            "p",
            taken(
                dtask_engine::application_notification_id("c", "found-1"),
                "spoofed",
            ),
        )
        .await
        .unwrap();
    let before = h.s().journal().stream_len("c").unwrap();
    assert_err!(
        h.s()
            .enqueue_notification("c", 1, note("found-1", "finding", "src/a.rs"))
            .await,
        StoreError::InputConflict(_)
    );
    assert_eq!(h.s().journal().stream_len("c").unwrap(), before);

    // The same content under the id: the notice, delivered before.
    h.s()
        .send_input(
            "p",
            taken(
                dtask_engine::application_notification_id("c", "found-2"),
                "src/b.rs",
            ),
        )
        .await
        .unwrap();
    let inputs = h.s().get("p").await.unwrap().mailbox.latest;
    h.s()
        .enqueue_notification("c", 1, note("found-2", "finding", "src/b.rs"))
        .await
        .unwrap();
    assert_eq!(h.s().get("p").await.unwrap().mailbox.latest, inputs);

    // A lifecycle notice (the child's completion) meeting another input: the child ends,
    // and says its parent was not told.
    let version = child.version + 1;
    h.s()
        .send_input(
            "p",
            InputRequest {
                event_id: format!("c:{version}:completed"),
                kind: "completed".to_owned(),
                data: b"not the child".to_vec(),
                delivery: Delivery::Queued,
            },
        )
        .await
        .unwrap();
    let done = ok(h.s(), "c", Command::Complete { data: cp("done") }).await;
    assert_eq!(done.status, Status::Completed);
    assert!(
        !done.parent_notification_error.is_empty(),
        "the notice was taken for delivered: {done:?}"
    );
}
scenario!(a_notice_meeting_another_input_under_its_id_conflicts);

/// G3's delivery of a child's application notification: one sent to preempt becomes a
/// preemptive input of the parent's mailbox and is recorded with its delivery
/// (`parent_notified_v2`); a queued one keeps the v1 record. The delivery is part of the
/// notification's content: a replay naming another delivery is a conflict, with nothing
/// written.
async fn child_notifications_keep_their_delivery(h: &mut H) {
    running(h.s(), "p", Retry).await;
    h.s()
        .create(child_request("c", "p", 1, false))
        .await
        .unwrap();
    ok(h.s(), "c", Command::Start).await;
    h.s()
        .enqueue_notification("c", 1, note("stop", "urgent", "over budget").preempt())
        .await
        .unwrap();
    h.s()
        .enqueue_notification("c", 1, note("found-1", "finding", "src/a.rs"))
        .await
        .unwrap();
    let inputs = h.s().list_inputs("p", 1, 10).await.unwrap().inputs;
    let got: Vec<_> = inputs
        .iter()
        .map(|i| (i.kind.as_str(), i.delivery))
        .collect();
    assert_eq!(
        got,
        [("urgent", Delivery::Preempt), ("finding", Delivery::Queued)]
    );
    let c = events_of(h.s(), "c");
    assert!(
        matches!(&c[c.len() - 2], Event::ParentNotifiedV2 { event_id, delivery: Delivery::Preempt, .. } if event_id == "stop"),
        "{c:?}"
    );
    assert!(
        matches!(c.last(), Some(Event::ParentNotified { event_id, .. }) if event_id == "found-1"),
        "a queued notification keeps the v1 record"
    );

    // The same delivery replays; another is a conflict, either way round.
    let (p_len, c_len) = (
        h.s().journal().stream_len("p").unwrap(),
        h.s().journal().stream_len("c").unwrap(),
    );
    h.s()
        .enqueue_notification("c", 1, note("stop", "urgent", "over budget").preempt())
        .await
        .unwrap();
    assert_err!(
        h.s()
            .enqueue_notification("c", 1, note("stop", "urgent", "over budget"))
            .await,
        StoreError::NotificationEventIdConflict(_)
    );
    assert_err!(
        h.s()
            .enqueue_notification("c", 1, note("found-1", "finding", "src/a.rs").preempt())
            .await,
        StoreError::NotificationEventIdConflict(_)
    );
    assert_eq!(h.s().journal().stream_len("p").unwrap(), p_len);
    assert_eq!(h.s().journal().stream_len("c").unwrap(), c_len);
}
scenario!(child_notifications_keep_their_delivery);

/// G3's delivery of a root task's application notification: the session's consumer
/// receives it with its delivery (`notification_enqueued_v2` records it; a queued one
/// keeps the v1 record), and a replay must name the same delivery.
async fn session_notifications_keep_their_delivery(h: &mut H) {
    let t = h
        .s()
        .create(request(session_spec("a", false), Retry))
        .await
        .unwrap();
    h.s().execute("a", t.version, Command::Start).await.unwrap();
    h.s()
        .enqueue_notification("a", 1, note("stop", "urgent", "over budget").preempt())
        .await
        .unwrap();
    h.s()
        .enqueue_notification("a", 1, note("found-1", "finding", "src/a.rs"))
        .await
        .unwrap();
    let got: Vec<_> = receive_all(h.s())
        .await
        .into_iter()
        .filter(|n| n.kind != "task_created")
        .map(|n| (n.kind, n.delivery, n.data))
        .collect();
    assert_eq!(
        got,
        [
            (
                "urgent".to_owned(),
                Delivery::Preempt,
                b"over budget".to_vec()
            ),
            ("finding".to_owned(), Delivery::Queued, b"src/a.rs".to_vec())
        ]
    );
    let a = events_of(h.s(), "a");
    assert!(
        matches!(&a[a.len() - 2], Event::NotificationEnqueuedV2 { event_id, delivery: Delivery::Preempt, .. } if event_id == "stop"),
        "{a:?}"
    );
    assert!(
        matches!(a.last(), Some(Event::NotificationEnqueued { event_id, .. }) if event_id == "found-1")
    );

    let len = h.s().journal().stream_len("a").unwrap();
    h.s()
        .enqueue_notification("a", 1, note("stop", "urgent", "over budget").preempt())
        .await
        .unwrap();
    assert_err!(
        h.s()
            .enqueue_notification("a", 1, note("stop", "urgent", "over budget"))
            .await,
        StoreError::NotificationEventIdConflict(_)
    );
    assert_eq!(h.s().journal().stream_len("a").unwrap(), len);
}
scenario!(session_notifications_keep_their_delivery);

/// A consumer of one session leases that session's notifications only (an extension of the
/// reference's outbox): two sessions' consumers do not take each other's, and an unfiltered
/// receive skips what a session's consumer holds.
async fn a_sessions_consumer_leases_its_own_notifications(h: &mut H) {
    for (id, session) in [("a", "s1"), ("b", "s2"), ("c", "s1")] {
        let mut spec = session_spec(id, false);
        spec.session_id = session.into();
        h.s().create(request(spec, Retry)).await.unwrap();
    }
    let lease = std::time::Duration::from_secs(600);
    let s2 = h
        .s()
        .receive_session_notifications("s2", 100, lease)
        .await
        .unwrap();
    let got: Vec<_> = s2
        .iter()
        .map(|n| (n.task_id.as_str(), n.session_id.as_str(), n.kind.as_str()))
        .collect();
    assert_eq!(got, [("b", "s2", "task_created")]);
    if !h.reboot {
        // Leases are the store's memory: only without a restart is b's still leased.
        let rest: Vec<_> = receive_all(h.s())
            .await
            .into_iter()
            .map(|n| n.task_id)
            .collect();
        assert_eq!(rest, ["a", "c"]);
    }
    let none = h
        .s()
        .receive_session_notifications("s3", 100, lease)
        .await
        .unwrap();
    assert!(none.is_empty());
    assert_err!(
        h.s()
            .receive_session_notifications("s1", 100, std::time::Duration::ZERO)
            .await,
        StoreError::Invalid { .. }
    );
}
scenario!(a_sessions_consumer_leases_its_own_notifications);

/// A child that ends after its parent: the notification cannot be put into the sealed
/// mailbox, the child records why, and its own transition goes ahead.
async fn child_outliving_its_parent(h: &mut H) {
    running(h.s(), "p", Retry).await;
    h.s()
        .create(child_request("c", "p", 1, true))
        .await
        .unwrap();
    ok(h.s(), "p", Command::Complete { data: vec![] }).await;
    ok(h.s(), "c", Command::Start).await;
    let done = ok(h.s(), "c", Command::Complete { data: cp("late") }).await;
    assert_eq!(done.status, Status::Completed);
    assert!(done.parent_notification_error.contains("sealed"));
    assert_eq!(h.s().get("p").await.unwrap().mailbox.latest, 1);
}
scenario!(child_outliving_its_parent);

/// A child survives its parent's attempt: after the parent's lease expires, its next attempt
/// finds the child, which kept running.
async fn children_survive_the_parents_attempt(h: &mut H) {
    running(h.s(), "p", Retry).await;
    h.s()
        .create(child_request("c", "p", 1, false))
        .await
        .unwrap();
    ok(h.s(), "c", Command::Start).await;
    h.advance(LEASE_MS + 1);
    let p = h.s().get("p").await.unwrap();
    assert_eq!(p.status, Status::Pending);
    let p = h.s().execute("p", p.version, Command::Start).await.unwrap();
    assert_eq!(p.attempt, 2);
    let children = h.s().list_children("p", None, 10).await.unwrap().tasks;
    assert_eq!(children.len(), 1);
    assert_eq!(children[0].spec.id, "c");
    // The child's lease expired too (same clock): it is pending again, not lost.
    assert_eq!(children[0].status, Status::Pending);
    // The parent's new attempt can create children under its own authority.
    h.s()
        .create(child_request("c2", "p", 2, false))
        .await
        .unwrap();
}
scenario!(children_survive_the_parents_attempt);

// ---- multi-part progress events ----------------------------------------------------------

/// Parts are unique per (event, part); a replay is deduplicated; a new part after the final
/// one is refused; readers see the final flag.
async fn multi_part_events(h: &mut H) {
    running(h.s(), "t", Retry).await;
    let (_, first) = h
        .s()
        .append_update("t", part(1, "e", "p1", false, "he"))
        .await
        .unwrap();
    assert!(first);
    let (_, again) = h
        .s()
        .append_update("t", part(1, "e", "p1", false, "he"))
        .await
        .unwrap();
    assert!(!again);
    assert_err!(
        h.s()
            .append_update("t", part(1, "e", "p1", false, "HE"))
            .await,
        StoreError::PartConflict { .. }
    );
    assert_err!(
        h.s()
            .append_update("t", part(1, "e", "p1", true, "he"))
            .await,
        StoreError::PartConflict { .. }
    );
    h.s()
        .append_update("t", part(1, "e", "p2", true, "llo"))
        .await
        .unwrap();
    assert_err!(
        h.s()
            .append_update("t", part(1, "e", "p3", true, "!"))
            .await,
        StoreError::EventClosed(_)
    );
    // The final part replayed is still a replay.
    let (_, replay) = h
        .s()
        .append_update("t", part(1, "e", "p2", true, "llo"))
        .await
        .unwrap();
    assert!(!replay);
    // A metadata-only part carries no data.
    h.s()
        .append_update("t", part(1, "m", "only", true, ""))
        .await
        .unwrap();
    let page = h.s().list_updates("t", None, 10, false).await.unwrap();
    let seen: Vec<(String, String, bool)> = page
        .updates
        .iter()
        .map(|u| (u.event_id.clone(), u.part_id.clone(), u.last))
        .collect();
    assert_eq!(
        seen,
        [
            ("e".to_owned(), "p1".to_owned(), false),
            ("e".to_owned(), "p2".to_owned(), true),
            ("m".to_owned(), "only".to_owned(), true)
        ]
    );
    // A single-record update cannot reuse a multi-part event's id, nor the reverse.
    let plain = UpdateRequest {
        part_id: String::new(),
        ..part(1, "e", "", false, "x")
    };
    assert_err!(
        h.s().append_update("t", plain).await,
        StoreError::EventIdConflict(_)
    );
}
scenario!(multi_part_events);

// ---- store behaviours aligned with the reference ------------------------------------------

/// Every operation refuses an empty task id as a validation error naming the field, before
/// any lookup — never "not found".
#[tokio::test]
async fn empty_task_id_is_invalid_everywhere() {
    let env = Env::new();
    let s = env.store();
    macro_rules! invalid {
        ($e:expr) => {
            assert_err!(
                $e,
                StoreError::Invalid {
                    field: "task id",
                    ..
                }
            )
        };
    }
    invalid!(s.get("").await);
    invalid!(s.get_task("").await);
    invalid!(s.execute("", 1, Command::Start).await);
    invalid!(
        s.execute(
            "",
            1,
            Command::ReleaseSuspension {
                context_snapshot: None
            }
        )
        .await
    );
    invalid!(s.wait_for_task_version("", 0).await);
    invalid!(s.list_updates("", None, 10, false).await);
    invalid!(s.watch(""));
    invalid!(s.send_input("", input("e", "d")).await);
    invalid!(s.list_inputs("", 0, 10).await);
    invalid!(s.wait_inputs("", 0, 10).await);
    invalid!(s.advance_cursor("", cursor(1, 1, 0, 0)).await);
    invalid!(s.publish("", 1).await);
    invalid!(s.list_children("", None, 10).await);
    invalid!(s.append_update("", part(1, "e", "p", true, "d")).await);
}

/// A list cursor whose last id names no task is refused as an invalid cursor.
#[tokio::test]
async fn list_cursor_naming_no_task_is_invalid() {
    use base64::Engine as _;
    let env = Env::new();
    let s = env.store();
    for id in ["a", "b", "c"] {
        create(s, id, Retry).await;
    }
    let page = s.list_pending(&keys(), None, 1).await.unwrap();
    let cursor = page.next_cursor.unwrap();
    assert!(s.list_pending(&keys(), Some(&cursor), 1).await.is_ok());
    // The same cursor, rewritten to name a task that does not exist.
    let engine = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let json = String::from_utf8(engine.decode(&cursor).unwrap()).unwrap();
    let forged = engine.encode(json.replace("\"l\":\"a\"", "\"l\":\"zz\""));
    assert_ne!(forged, cursor);
    assert_err!(
        s.list_pending(&keys(), Some(&forged), 1).await,
        StoreError::InvalidCursor(_)
    );
}

/// Terminal transitions keep the checkpoint (see docs/semantics.md): it stays readable for
/// inspection and no write can use it.
#[tokio::test]
async fn terminal_transitions_keep_the_checkpoint() {
    let env = Env::new();
    let s = env.store();
    running(s, "t", Retry).await;
    ok(
        s,
        "t",
        Command::CommitStart {
            checkpoint: cp("marker"),
        },
    )
    .await;
    let done = ok(s, "t", Command::Complete { data: vec![] }).await;
    assert_eq!(done.checkpoint, cp("marker"));
    assert_err!(
        exec(
            s,
            "t",
            Command::CommitStart {
                checkpoint: cp("x")
            }
        )
        .await,
        StoreError::LeaseLost(_)
    );
}
