//! Reboot equivalence: every scenario runs twice — once straight, once with the store and its
//! journal dropped and reopened before every step — and must observe exactly the same results,
//! snapshots, versions, listings, updates and notifications (receipts aside: they are delivery
//! handles, fresh on every delivery).

#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use dtask_engine::{Command, NotificationRequest, TaskStore, UpdateRequest};
use dtask_journal::LeasePolicy::{self, Fail, Retry};
use dtask_replay::TaskState;
use std::time::Duration;

/// One step of a scenario.
#[derive(Debug, Clone)]
enum Op {
    Create {
        id: &'static str,
        policy: LeasePolicy,
        session: bool,
        notify: bool,
    },
    /// A command at the task's current version.
    Exec(&'static str, Command),
    /// A command at an explicit version.
    ExecAt(&'static str, u64, Command),
    Update {
        id: &'static str,
        attempt: u64,
        event_id: &'static str,
        data: &'static str,
    },
    Notify {
        id: &'static str,
        attempt: u64,
        event_id: &'static str,
        data: &'static str,
    },
    Advance(u64),
    Sweep,
    /// Receive everything with a lease of this many ms, without acknowledging.
    Receive(u64),
    /// Receive everything and acknowledge it.
    ReceiveAck,
}

/// An update as observed: (event id, attempt, data, created at).
type SeenUpdate = (String, u64, Vec<u8>, u64);

/// What one step observed.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Observation {
    outcome: String,
    tasks: Vec<TaskState>,
    pending: Vec<String>,
    suspended: Vec<String>,
    updates: Vec<Vec<SeenUpdate>>,
    notifications: Vec<(String, String, u64, Vec<u8>)>,
}

#[allow(clippy::too_many_lines, reason = "one arm per operation")]
async fn step(store: &TaskStore, env: &Env, ids: &mut Vec<&'static str>, op: &Op) -> Observation {
    let mut notifications = Vec::new();
    let outcome = match op.clone() {
        Op::Create {
            id,
            policy,
            session,
            notify,
        } => {
            ids.push(id);
            let spec = if session {
                session_spec(id, notify)
            } else {
                spec(id)
            };
            format!(
                "{:?}",
                store.create(request(spec, policy)).await.map(|t| t.version)
            )
        }
        Op::Exec(id, command) => {
            format!("{:?}", exec(store, id, command).await.map_err(|e| kind(&e)))
        }
        Op::ExecAt(id, version, command) => format!(
            "{:?}",
            store
                .execute(id, version, command)
                .await
                .map_err(|e| kind(&e))
        ),
        Op::Update {
            id,
            attempt,
            event_id,
            data,
        } => {
            let request = UpdateRequest {
                attempt,
                event_id: event_id.into(),
                kind: "progress".into(),
                data: data.as_bytes().to_vec(),
                ..UpdateRequest::default()
            };
            format!(
                "{:?}",
                store.append_update(id, request).await.map_err(|e| kind(&e))
            )
        }
        Op::Notify {
            id,
            attempt,
            event_id,
            data,
        } => {
            let request = NotificationRequest {
                event_id: event_id.into(),
                kind: "app".into(),
                data: data.as_bytes().to_vec(),
                ..NotificationRequest::default()
            };
            format!(
                "{:?}",
                store
                    .enqueue_notification(id, attempt, request)
                    .await
                    .map_err(|e| kind(&e))
            )
        }
        Op::Advance(ms) => {
            env.advance(ms);
            "advanced".into()
        }
        Op::Sweep => format!("{:?}", store.sweep_expired().await.map_err(|e| kind(&e))),
        Op::Receive(_) | Op::ReceiveAck => {
            let lease = if let Op::Receive(ms) = op {
                *ms
            } else {
                600_000
            };
            let got = store
                .receive_notifications(1000, Duration::from_millis(lease))
                .await
                .unwrap();
            for n in &got {
                if matches!(op, Op::ReceiveAck) {
                    store.ack_notification(&n.receipt).await.unwrap();
                }
                notifications.push((n.id.clone(), n.kind.clone(), n.version, n.data.clone()));
            }
            format!("{} received", got.len())
        }
    };
    let mut tasks = Vec::new();
    let mut updates = Vec::new();
    for id in ids.iter() {
        if let Ok(t) = store.get(id).await {
            tasks.push(t);
        }
        let page = store.list_updates(id, None, 0, false).await;
        updates.push(page.map_or_else(
            |_| vec![],
            |p| {
                p.updates
                    .into_iter()
                    .map(|u| (u.event_id, u.attempt, u.data, u.created_at.as_millis()))
                    .collect()
            },
        ));
    }
    let names =
        |p: dtask_engine::TaskPage| p.tasks.into_iter().map(|t| t.spec.id.clone()).collect();
    Observation {
        outcome,
        tasks,
        pending: names(store.list_pending(&keys(), None, 0).await.unwrap()),
        suspended: names(store.list_suspended(&keys(), None, 0).await.unwrap()),
        updates,
        notifications,
    }
}

async fn run(ops: &[Op], reboot: bool) -> Vec<Observation> {
    let mut env = Env::new();
    let mut ids = Vec::new();
    let mut out = Vec::new();
    for op in ops {
        if reboot {
            env.reopen();
        }
        let store = env.store().clone();
        out.push(step(&store, &env, &mut ids, op).await);
    }
    out
}

async fn check(ops: &[Op]) -> Vec<Observation> {
    let straight = run(ops, false).await;
    let rebooted = run(ops, true).await;
    for (i, (a, b)) in straight.iter().zip(&rebooted).enumerate() {
        assert_eq!(a, b, "step {i}: {:?}", ops[i]);
    }
    assert_eq!(straight.len(), ops.len());
    straight
}

fn outcomes(obs: &[Observation]) -> Vec<&str> {
    obs.iter().map(|o| o.outcome.as_str()).collect()
}

fn c(s: &str) -> Vec<u8> {
    s.as_bytes().to_vec()
}

#[tokio::test]
async fn full_lifecycle_with_updates() {
    let ops = vec![
        Op::Create {
            id: "a",
            policy: Retry,
            session: true,
            notify: true,
        },
        Op::Exec("a", Command::Start),
        Op::Update {
            id: "a",
            attempt: 1,
            event_id: "e1",
            data: "one",
        },
        Op::Exec(
            "a",
            Command::CommitStart {
                checkpoint: c("started"),
            },
        ),
        Op::Advance(1_000),
        Op::Update {
            id: "a",
            attempt: 1,
            event_id: "e2",
            data: "two",
        },
        Op::Update {
            id: "a",
            attempt: 1,
            event_id: "e1",
            data: "one",
        },
        Op::Update {
            id: "a",
            attempt: 1,
            event_id: "e1",
            data: "changed",
        },
        Op::Exec("a", Command::Heartbeat),
        Op::Exec(
            "a",
            Command::ReportTranscriptFailure {
                error: "disk".into(),
            },
        ),
        Op::Exec(
            "a",
            Command::ReportTranscriptFailure {
                error: "again".into(),
            },
        ),
        Op::Notify {
            id: "a",
            attempt: 1,
            event_id: "n1",
            data: "hello",
        },
        Op::Exec(
            "a",
            Command::Yield {
                checkpoint: c("yielded"),
            },
        ),
        Op::Exec("a", Command::Start),
        Op::Update {
            id: "a",
            attempt: 1,
            event_id: "e3",
            data: "stale",
        },
        Op::Update {
            id: "a",
            attempt: 2,
            event_id: "e3",
            data: "three",
        },
        Op::Notify {
            id: "a",
            attempt: 2,
            event_id: "n1",
            data: "hello",
        },
        Op::Advance(500),
        Op::Exec("a", Command::Complete { data: c("result") }),
        Op::Exec("a", Command::Complete { data: c("again") }),
        Op::ReceiveAck,
        Op::ReceiveAck,
    ];
    let obs = check(&ops).await;
    let last = &obs[obs.len() - 2];
    let ids: Vec<_> = last.notifications.iter().map(|n| n.0.as_str()).collect();
    assert_eq!(ids.len(), 3);
    assert_eq!(ids[0], "a:1:task_created");
    assert!(ids[1].ends_with(":application-event"));
    assert_eq!(ids[2], "a:8:completed");
    assert!(obs[obs.len() - 1].notifications.is_empty());
    assert_eq!(last.updates[0].len(), 3);
    assert_eq!(outcomes(&obs)[7], "Err(\"EventIdConflict\")");
}

#[tokio::test]
async fn wait_input_resume_complete() {
    let ops = vec![
        Op::Create {
            id: "w",
            policy: Fail,
            session: true,
            notify: true,
        },
        Op::Exec("w", Command::Start),
        Op::Exec("w", Command::CommitStart { checkpoint: c("s") }),
        Op::Exec(
            "w",
            Command::WaitInput {
                checkpoint: c("need input"),
            },
        ),
        Op::Exec("w", Command::Start),
        Op::Advance(60_000),
        Op::Exec(
            "w",
            Command::Resume {
                data: c("answer"),
                context_snapshot: Some(c("ctx")),
            },
        ),
        Op::Exec(
            "w",
            Command::Resume {
                data: c("again"),
                context_snapshot: None,
            },
        ),
        Op::Exec("w", Command::Start),
        Op::Exec("w", Command::Complete { data: c("done") }),
        Op::ReceiveAck,
    ];
    let obs = check(&ops).await;
    let t = &obs.last().unwrap().tasks[0];
    assert_eq!(t.status, dtask_replay::Status::Completed);
    assert_eq!(t.context_snapshot, b"ctx");
    assert_eq!(obs.last().unwrap().notifications.len(), 3);
}

#[tokio::test]
async fn suspend_release() {
    let ops = vec![
        Op::Create {
            id: "s",
            policy: Retry,
            session: false,
            notify: false,
        },
        Op::Create {
            id: "t",
            policy: Retry,
            session: false,
            notify: false,
        },
        Op::Exec("s", Command::Start),
        Op::Exec(
            "s",
            Command::Suspend {
                checkpoint: c("paused"),
            },
        ),
        Op::Exec(
            "s",
            Command::ReleaseSuspension {
                context_snapshot: Some(c("ctx")),
            },
        ),
        Op::Exec(
            "s",
            Command::ReleaseSuspension {
                context_snapshot: None,
            },
        ),
        Op::Exec("s", Command::Start),
        Op::Exec(
            "s",
            Command::Suspend {
                checkpoint: c("paused again"),
            },
        ),
        Op::Exec(
            "s",
            Command::ReleaseSuspension {
                context_snapshot: Some(vec![]),
            },
        ),
        Op::Exec("s", Command::Start),
        Op::Exec("s", Command::Yield { checkpoint: vec![] }),
        Op::Exec("s", Command::Start),
        Op::Exec("s", Command::Complete { data: vec![] }),
    ];
    let obs = check(&ops).await;
    assert_eq!(obs[3].suspended, ["s"]);
    assert_eq!(obs[3].pending, ["t"]);
    assert_eq!(obs[4].pending, ["s", "t"]);
}

#[tokio::test]
async fn cancel_running_then_ack() {
    let ops = vec![
        Op::Create {
            id: "c",
            policy: Fail,
            session: true,
            notify: true,
        },
        Op::Exec("c", Command::Start),
        Op::Update {
            id: "c",
            attempt: 1,
            event_id: "u",
            data: "x",
        },
        Op::Advance(20_000),
        Op::Exec(
            "c",
            Command::RequestCancel {
                reason: "user".into(),
            },
        ),
        Op::Exec(
            "c",
            Command::RequestCancel {
                reason: "other".into(),
            },
        ),
        Op::Advance(20_000),
        Op::Exec("c", Command::Heartbeat),
        Op::Update {
            id: "c",
            attempt: 1,
            event_id: "u2",
            data: "x",
        },
        Op::Exec("c", Command::ReportTranscriptFailure { error: "t".into() }),
        Op::Exec(
            "c",
            Command::AckCancel {
                reason: "ack".into(),
            },
        ),
        Op::Exec(
            "c",
            Command::RequestCancel {
                reason: String::new(),
            },
        ),
        Op::ReceiveAck,
        // A direct cancel and a retried-pending intent.
        Op::Create {
            id: "d",
            policy: Retry,
            session: true,
            notify: true,
        },
        Op::Exec(
            "d",
            Command::RequestCancel {
                reason: String::new(),
            },
        ),
        Op::Create {
            id: "e",
            policy: Retry,
            session: false,
            notify: false,
        },
        Op::Exec("e", Command::Start),
        Op::Exec("e", Command::Yield { checkpoint: vec![] }),
        Op::Exec(
            "e",
            Command::RequestCancel {
                reason: "later".into(),
            },
        ),
        Op::Exec("e", Command::Start),
        Op::Exec(
            "e",
            Command::AckCancel {
                reason: String::new(),
            },
        ),
        Op::ReceiveAck,
    ];
    let obs = check(&ops).await;
    let c_task = &obs[11].tasks[0];
    assert_eq!(c_task.result_error, "user");
    assert_eq!(outcomes(&obs)[11], "Err(\"AlreadyTerminal\")");
}

#[tokio::test]
async fn lease_expiry_retry_and_fail() {
    let ops = vec![
        Op::Create {
            id: "r",
            policy: Retry,
            session: true,
            notify: true,
        },
        Op::Create {
            id: "f",
            policy: Fail,
            session: true,
            notify: true,
        },
        Op::Create {
            id: "g",
            policy: Fail,
            session: true,
            notify: true,
        },
        Op::Exec("r", Command::Start),
        Op::Exec("f", Command::Start),
        Op::Exec("g", Command::Start),
        Op::Exec(
            "g",
            Command::RequestCancel {
                reason: "stop".into(),
            },
        ),
        Op::Update {
            id: "r",
            attempt: 1,
            event_id: "u1",
            data: "x",
        },
        Op::Exec(
            "r",
            Command::CommitStart {
                checkpoint: c("cp"),
            },
        ),
        Op::Advance(29_999),
        Op::ExecAt("r", 3, Command::Heartbeat),
        Op::Advance(30_000),
        // r's lease runs out here; the stale heartbeat version conflicts after resolution.
        Op::ExecAt("r", 4, Command::Heartbeat),
        Op::Exec("r", Command::Start),
        Op::Update {
            id: "r",
            attempt: 2,
            event_id: "u1",
            data: "x",
        },
        Op::Update {
            id: "r",
            attempt: 2,
            event_id: "u2",
            data: "y",
        },
        Op::Advance(30_000),
        Op::Sweep,
        Op::Exec("r", Command::Start),
        Op::Exec("r", Command::Complete { data: c("ok") }),
        Op::ReceiveAck,
    ];
    let obs = check(&ops).await;
    let last = obs.last().unwrap();
    let status: Vec<_> = last
        .tasks
        .iter()
        .map(|t| (t.spec.id.as_str(), t.status.as_str(), t.attempt))
        .collect();
    assert_eq!(
        status,
        [
            ("r", "completed", 3),
            ("f", "failed", 1),
            ("g", "canceled", 1)
        ]
    );
}

#[tokio::test]
async fn notifications_enqueue_receive_ack() {
    let ops = vec![
        Op::Create {
            id: "n",
            policy: Retry,
            session: true,
            notify: true,
        },
        Op::Create {
            id: "m",
            policy: Retry,
            session: true,
            notify: false,
        },
        Op::Exec("n", Command::Start),
        Op::Notify {
            id: "n",
            attempt: 1,
            event_id: "e1",
            data: "",
        },
        Op::Notify {
            id: "n",
            attempt: 1,
            event_id: "e2",
            data: "payload",
        },
        Op::Receive(5_000),
        // The leases run out before the next receive, so both runs redeliver the same items.
        Op::Advance(5_000),
        Op::Receive(5_000),
        Op::Advance(5_000),
        Op::ReceiveAck,
        Op::Notify {
            id: "n",
            attempt: 1,
            event_id: "e1",
            data: "",
        },
        Op::Notify {
            id: "n",
            attempt: 1,
            event_id: "e1",
            data: "different",
        },
        Op::ReceiveAck,
        Op::Exec("n", Command::WaitInput { checkpoint: c("w") }),
        Op::Exec("m", Command::Start),
        Op::Exec(
            "m",
            Command::Fail {
                error: "bad".into(),
            },
        ),
        Op::ReceiveAck,
        Op::ReceiveAck,
    ];
    let obs = check(&ops).await;
    let ids =
        |i: usize| -> Vec<String> { obs[i].notifications.iter().map(|n| n.0.clone()).collect() };
    assert_eq!(ids(5).len(), 4);
    assert_eq!(ids(7), ids(5));
    assert_eq!(ids(9), ids(5));
    assert!(ids(12).is_empty());
    assert_eq!(ids(16), ["n:3:waiting_input"]);
    assert!(ids(17).is_empty());
}
