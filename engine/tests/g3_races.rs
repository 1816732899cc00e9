//! Races of the G3 task layer on real threads, 100 runs each: every race resolves to exactly
//! one consistent outcome, and what was acknowledged is in the journal exactly once.

#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use dtask_engine::{Command, InputRequest, StoreError};
use dtask_journal::{Delivery, LeasePolicy::Retry};
use dtask_replay::{load_task, Status};

const REPS: usize = 100;

fn input(event_id: &str, data: &str) -> InputRequest {
    InputRequest {
        event_id: event_id.to_owned(),
        kind: "message".to_owned(),
        data: data.as_bytes().to_vec(),
        delivery: Delivery::Queued,
    }
}

/// Input racing `CompleteIfNoInputs`: either the input came first (the task goes back to
/// pending with `InputsPending`, the input unconsumed) or the completion did (the input is
/// refused: the mailbox is sealed). Never both, never a lost input.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn input_races_complete_if_no_inputs() {
    let env = Env::new();
    let store = env.store().clone();
    let (mut completed, mut pending) = (0, 0);
    for i in 0..REPS {
        let id = format!("t{i}");
        let running = running(&store, &id, Retry).await;
        let send = {
            let (store, id) = (store.clone(), id.clone());
            tokio::spawn(async move { store.send_input(&id, input("steer", "left")).await })
        };
        let complete = {
            let (store, id) = (store.clone(), id.clone());
            tokio::spawn(async move {
                store
                    .execute(
                        &id,
                        running.version,
                        Command::CompleteIfNoInputs {
                            cursor: 0,
                            data: b"done".to_vec(),
                        },
                    )
                    .await
            })
        };
        let send = send.await.unwrap();
        let complete = complete.await.unwrap();
        let t = store.get(&id).await.unwrap();
        match (&send, &complete) {
            (Err(StoreError::MailboxSealed(_)), Ok(done)) => {
                assert_eq!(done.status, Status::Completed);
                assert_eq!(t.mailbox.latest, 0);
                completed += 1;
            }
            (Ok((record, true)), Err(StoreError::InputsPending(state))) => {
                assert_eq!(state.status, Status::Pending);
                assert_eq!((t.mailbox.latest, t.mailbox.consumed), (1, 0));
                assert_eq!(record.sequence, 1);
                pending += 1;
            }
            other => panic!("{id}: inconsistent outcome {other:?}"),
        }
        let folded = load_task(store.journal(), &id).unwrap().unwrap();
        assert_eq!(folded.state, t);
    }
    assert_eq!(completed + pending, REPS);
}

/// Two senders with the same event id and content: one inserts, the other gets the same
/// record back; the mailbox holds it once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_senders_with_one_event_id() {
    let env = Env::new();
    let store = env.store().clone();
    for i in 0..REPS {
        let id = format!("t{i}");
        create(&store, &id, Retry).await;
        let spawn = |store: dtask_engine::TaskStore, id: String| {
            tokio::spawn(async move { store.send_input(&id, input("same", "payload")).await })
        };
        let a = spawn(store.clone(), id.clone());
        let b = spawn(store.clone(), id.clone());
        let (a, b) = (a.await.unwrap().unwrap(), b.await.unwrap().unwrap());
        assert_ne!(a.1, b.1, "{id}: exactly one insert");
        assert_eq!(a.0, b.0);
        let page = store.list_inputs(&id, 0, 10).await.unwrap();
        assert_eq!(page.inputs.len(), 1);
        assert_eq!(page.latest, 1);
    }
}

/// A parent's cancel racing its child's completion: the parent ends canceled, the child
/// completed; the child's `completed` notice either reached the parent's mailbox (it came
/// first) or is recorded on the child as undeliverable (the parent's mailbox was sealed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parent_cancel_races_child_completion() {
    let env = Env::new();
    let store = env.store().clone();
    let (mut delivered, mut refused) = (0, 0);
    for i in 0..REPS {
        let parent = format!("p{i}");
        let child = format!("p{i}/c");
        running(&store, &parent, Retry).await;
        store
            .create(child_request(&child, &parent, 1, true))
            .await
            .unwrap();
        let c = ok(&store, &child, Command::Start).await;
        let p = store.get(&parent).await.unwrap();
        // The parent's attempt acknowledges its cancellation right away (a direct end).
        let cancel = {
            let (store, parent) = (store.clone(), parent.clone());
            tokio::spawn(async move {
                let t = store
                    .execute(
                        &parent,
                        p.version,
                        Command::RequestCancel {
                            reason: "stop".into(),
                        },
                    )
                    .await?;
                store
                    .execute(
                        &parent,
                        t.version,
                        Command::AckCancel {
                            reason: String::new(),
                        },
                    )
                    .await
            })
        };
        let complete = {
            let (store, child) = (store.clone(), child.clone());
            tokio::spawn(async move {
                store
                    .execute(
                        &child,
                        c.version,
                        Command::Complete {
                            data: b"r".to_vec(),
                        },
                    )
                    .await
            })
        };
        let canceled = cancel.await.unwrap().unwrap();
        let done = complete.await.unwrap().unwrap();
        assert_eq!(canceled.status, Status::Canceled);
        assert_eq!(done.status, Status::Completed);
        let p = store.get(&parent).await.unwrap();
        let c = store.get(&child).await.unwrap();
        let notice = store
            .list_inputs(&parent, 0, 10)
            .await
            .unwrap()
            .inputs
            .into_iter()
            .filter(|i| i.kind == "completed")
            .count();
        match (notice, c.parent_notification_error.is_empty()) {
            (1, true) => delivered += 1,
            (0, false) => refused += 1,
            other => panic!("{parent}: notice {other:?}"),
        }
        for id in [&parent, &child] {
            let folded = load_task(store.journal(), id).unwrap().unwrap();
            assert_eq!(&folded.state, if id == &parent { &p } else { &c });
        }
    }
    assert_eq!(delivered + refused, REPS);
}
