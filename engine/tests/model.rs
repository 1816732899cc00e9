//! A model test: random operation sequences against the real store (RocksDB in a tempdir)
//! and against a small in-memory model of the reference rules, written here independently of
//! `decide` and the fold. After every operation the outcome (Ok, or which error) and the
//! task's snapshot must agree; the outbox is compared whenever it is drained.

#![allow(clippy::unwrap_used, clippy::too_many_lines)]

mod common;

use common::*;
use dtask_engine::{Command, CreateRequest, UpdateRequest};
use dtask_journal::{LeasePolicy, TaskSpec, Timestamp};
use dtask_replay::{Status, TaskState, DEFAULT_CANCEL_REASON, LEASE_EXPIRED_ERROR};
use proptest::prelude::*;
use std::collections::HashMap;

const TASKS: usize = 2;

#[derive(Debug, Clone)]
enum Cmd {
    Start,
    Heartbeat,
    CommitStart(u8),
    Complete(u8),
    Fail(u8),
    WaitInput(u8),
    Suspend(u8),
    Yield(u8),
    AckCancel(u8),
    RequestCancel(u8),
    Resume(u8),
    Release(Option<u8>),
    Transcript(u8),
}

#[derive(Debug, Clone)]
enum Op {
    Create {
        t: usize,
        retry: bool,
        session: bool,
        notify: bool,
        checkpoint: u8,
    },
    Cmd {
        t: usize,
        skew: i8,
        cmd: Cmd,
    },
    Update {
        t: usize,
        attempt_skew: i8,
        event: u8,
        payload: u8,
    },
    Advance(u64),
    Reboot,
    Drain,
}

fn bytes(n: u8) -> Vec<u8> {
    if n == 0 {
        Vec::new()
    } else {
        format!("b{n}").into_bytes()
    }
}

fn text(n: u8) -> String {
    if n == 0 {
        String::new()
    } else {
        format!("s{n}")
    }
}

fn cmd_strategy() -> impl Strategy<Value = Cmd> {
    let n = 0u8..3;
    prop_oneof![
        4 => Just(Cmd::Start),
        2 => Just(Cmd::Heartbeat),
        2 => n.clone().prop_map(Cmd::CommitStart),
        2 => n.clone().prop_map(Cmd::Complete),
        1 => n.clone().prop_map(Cmd::Fail),
        2 => n.clone().prop_map(Cmd::WaitInput),
        2 => n.clone().prop_map(Cmd::Suspend),
        2 => n.clone().prop_map(Cmd::Yield),
        1 => n.clone().prop_map(Cmd::AckCancel),
        2 => n.clone().prop_map(Cmd::RequestCancel),
        2 => n.clone().prop_map(Cmd::Resume),
        2 => proptest::option::of(n.clone()).prop_map(Cmd::Release),
        1 => n.prop_map(Cmd::Transcript),
    ]
}

fn create_strategy() -> impl Strategy<Value = Op> {
    (
        0..TASKS,
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        0u8..2,
    )
        .prop_map(|(t, retry, session, notify, checkpoint)| Op::Create {
            t,
            retry,
            session,
            notify: session && notify,
            checkpoint,
        })
}

/// Every task is created first (with random settings), then the random operations run.
fn script_strategy() -> impl Strategy<Value = Vec<Op>> {
    (
        prop::collection::vec(create_strategy(), TASKS),
        prop::collection::vec(op_strategy(), 1..40),
    )
        .prop_map(|(mut creates, ops)| {
            for (t, op) in creates.iter_mut().enumerate() {
                if let Op::Create { t: target, .. } = op {
                    *target = t;
                }
            }
            creates.extend(ops);
            creates
        })
}

fn op_strategy() -> impl Strategy<Value = Op> {
    let t = 0..TASKS;
    prop_oneof![
        1 => create_strategy(),
        14 => (t.clone(), prop_oneof![10 => Just(0i8), 1 => Just(-1i8), 1 => Just(1i8)], cmd_strategy())
            .prop_map(|(t, skew, cmd)| Op::Cmd { t, skew, cmd }),
        3 => (t, prop_oneof![6 => Just(0i8), 1 => Just(-1i8), 1 => Just(1i8)], 0u8..3, 1u8..3)
            .prop_map(|(t, attempt_skew, event, payload)| Op::Update { t, attempt_skew, event, payload }),
        2 => prop_oneof![Just(1_000u64), Just(15_000), Just(29_999), Just(30_000), Just(31_000)].prop_map(Op::Advance),
        1 => Just(Op::Reboot),
        1 => Just(Op::Drain),
    ]
}

// ---------------------------------------------------------------- the model

#[derive(Debug, Clone)]
struct MTask {
    id: String,
    retry: bool,
    session: bool,
    notify: bool,
    status: Status,
    version: u64,
    attempt: u64,
    checkpoint: Vec<u8>,
    cancel_at: Option<u64>,
    cancel_reason: String,
    lease: Option<u64>,
    pending_resume: Option<Vec<u8>>,
    result_data: Vec<u8>,
    result_error: String,
    output_error: String,
    context: Vec<u8>,
    created: u64,
    updated: u64,
    done: Option<u64>,
    updates: HashMap<String, Vec<u8>>,
}

#[derive(Debug, Default)]
struct Model {
    now: u64,
    tasks: Vec<Option<MTask>>,
    outbox: Vec<(String, usize)>,
}

type TaskOutcome = Result<(), &'static str>;

impl MTask {
    fn terminal(&self) -> bool {
        matches!(
            self.status,
            Status::Completed | Status::Failed | Status::Canceled
        )
    }

    fn bump(&mut self, now: u64) {
        self.version += 1;
        self.updated = now;
    }

    fn finish(&mut self, status: Status, error: String, now: u64) {
        self.status = status;
        self.result_error = error;
        self.result_data.clear();
        self.pending_resume = None;
        self.lease = None;
        self.done = Some(now);
    }

    fn cancel_error(&self, ack: &str) -> String {
        if !self.cancel_reason.is_empty() {
            self.cancel_reason.clone()
        } else if !ack.is_empty() {
            ack.to_owned()
        } else {
            DEFAULT_CANCEL_REASON.to_owned()
        }
    }
}

impl Model {
    fn notify(&mut self, t: usize, kind: &str) {
        let task = self.tasks[t].as_ref().unwrap();
        if task.session && (kind == "task_created" || task.notify) {
            let id = format!("{}:{}:{kind}", task.id, task.version);
            self.outbox.push((id, t));
        }
    }

    /// Lazy lease expiry at the model's clock.
    fn resolve(&mut self, t: usize) {
        let now = self.now;
        let Some(task) = self.tasks[t].as_mut() else {
            return;
        };
        if task.status != Status::Running || task.lease.is_none_or(|d| d > now) {
            return;
        }
        task.bump(now);
        let kind = if task.retry {
            task.status = Status::Pending;
            task.lease = None;
            None
        } else if task.cancel_at.is_some() {
            let error = task.cancel_error("");
            task.finish(Status::Canceled, error, now);
            Some("canceled")
        } else {
            task.finish(Status::Failed, LEASE_EXPIRED_ERROR.to_owned(), now);
            Some("failed")
        };
        if let Some(kind) = kind {
            self.notify(t, kind);
        }
    }

    fn create(
        &mut self,
        t: usize,
        retry: bool,
        session: bool,
        notify: bool,
        checkpoint: u8,
    ) -> TaskOutcome {
        if self.tasks[t].is_some() {
            return Err("AlreadyExists");
        }
        self.tasks[t] = Some(MTask {
            id: format!("t{t}"),
            retry,
            session,
            notify,
            status: Status::Pending,
            version: 1,
            attempt: 0,
            checkpoint: bytes(checkpoint),
            cancel_at: None,
            cancel_reason: String::new(),
            lease: None,
            pending_resume: None,
            result_data: Vec::new(),
            result_error: String::new(),
            output_error: String::new(),
            context: Vec::new(),
            created: self.now,
            updated: self.now,
            done: None,
            updates: HashMap::new(),
        });
        self.notify(t, "task_created");
        Ok(())
    }

    fn command(&mut self, t: usize, expected: u64, cmd: &Cmd) -> TaskOutcome {
        // 1. Validation, before any lookup.
        match cmd {
            Cmd::CommitStart(0) | Cmd::WaitInput(0) | Cmd::Suspend(0) | Cmd::Transcript(0) => {
                return Err("Invalid")
            }
            Cmd::Fail(0) => return Err("InvalidExecutionResult"),
            _ => {}
        }
        // 2. Existence.
        if self.tasks[t].is_none() {
            return Err("NotFound");
        }
        // 3. Lazy expiry.
        self.resolve(t);
        let now = self.now;
        let lease = now + LEASE_MS;
        let task = self.tasks[t].as_mut().unwrap();
        // RequestCancel: terminal first, then CAS, then first-wins.
        if let Cmd::RequestCancel(r) = cmd {
            if task.terminal() {
                return Err("AlreadyTerminal");
            }
            if task.version != expected {
                return Err("VersionConflict");
            }
            if task.cancel_at.is_some() {
                return Ok(());
            }
            task.cancel_at = Some(now);
            task.cancel_reason = text(*r);
            task.bump(now);
            let direct = match task.status {
                Status::Pending => task.attempt == 0 || !task.retry,
                Status::WaitingInput | Status::Suspended => true,
                _ => false,
            };
            if task.status == Status::Running {
                task.lease = Some(lease);
            }
            if direct {
                let error = task.cancel_error("");
                task.finish(Status::Canceled, error, now);
                self.notify(t, "canceled");
            }
            return Ok(());
        }
        // 4. CAS.
        if task.version != expected {
            return Err("VersionConflict");
        }
        // 5. Status / authority.
        let mut note = None;
        match cmd {
            Cmd::Start => {
                if task.status != Status::Pending {
                    return Err("IllegalTransition");
                }
                task.status = Status::Running;
                task.attempt += 1;
                task.lease = Some(lease);
            }
            Cmd::Resume(d) => {
                if task.status != Status::WaitingInput {
                    return Err("IllegalTransition");
                }
                task.status = Status::Pending;
                task.pending_resume = Some(bytes(*d));
            }
            Cmd::Release(ctx) => {
                if task.status != Status::Suspended {
                    return Err("IllegalTransition");
                }
                task.status = Status::Pending;
                if let Some(c) = ctx {
                    task.context = bytes(*c);
                }
            }
            _ => {
                if task.status != Status::Running || task.lease.is_none_or(|d| d <= now) {
                    return Err("LeaseLost");
                }
                let cancel_ok = matches!(cmd, Cmd::Transcript(_) | Cmd::AckCancel(_));
                if task.cancel_at.is_some() && !cancel_ok {
                    return Err("LeaseLost");
                }
                match cmd {
                    Cmd::Heartbeat => task.lease = Some(lease),
                    Cmd::CommitStart(c) => {
                        if !task.checkpoint.is_empty() {
                            return Err("IllegalTransition");
                        }
                        task.checkpoint = bytes(*c);
                    }
                    Cmd::Transcript(e) => {
                        if !task.output_error.is_empty() {
                            return Ok(());
                        }
                        task.output_error = text(*e);
                    }
                    Cmd::Complete(d) => {
                        task.finish(Status::Completed, String::new(), now);
                        task.result_data = bytes(*d);
                        note = Some("completed");
                    }
                    Cmd::Fail(e) => {
                        task.finish(Status::Failed, text(*e), now);
                        note = Some("failed");
                    }
                    Cmd::AckCancel(r) => {
                        let error = task.cancel_error(&text(*r));
                        task.finish(Status::Canceled, error, now);
                        note = Some("canceled");
                    }
                    Cmd::WaitInput(c) | Cmd::Suspend(c) => {
                        task.status = if matches!(cmd, Cmd::WaitInput(_)) {
                            note = Some("waiting_input");
                            Status::WaitingInput
                        } else {
                            Status::Suspended
                        };
                        task.checkpoint = bytes(*c);
                        task.pending_resume = None;
                        task.lease = None;
                    }
                    Cmd::Yield(c) => {
                        task.status = Status::Pending;
                        if *c != 0 {
                            task.checkpoint = bytes(*c);
                        }
                        task.lease = None;
                    }
                    _ => unreachable!(),
                }
            }
        }
        task.bump(now);
        if let Some(kind) = note {
            self.notify(t, kind);
        }
        Ok(())
    }

    fn update(
        &mut self,
        t: usize,
        attempt: u64,
        event: &str,
        payload: &[u8],
    ) -> Result<bool, &'static str> {
        if attempt == 0 {
            return Err("Invalid");
        }
        if self.tasks[t].is_none() {
            return Err("NotFound");
        }
        self.resolve(t);
        let now = self.now;
        let task = self.tasks[t].as_mut().unwrap();
        if task.status != Status::Running
            || task.cancel_at.is_some()
            || attempt != task.attempt
            || task.lease.is_none_or(|d| d <= now)
        {
            return Err("LeaseLost");
        }
        match task.updates.get(event) {
            Some(p) if p == payload => Ok(false),
            Some(_) => Err("EventIdConflict"),
            None => {
                task.updates.insert(event.to_owned(), payload.to_vec());
                Ok(true)
            }
        }
    }

    fn expect_snapshot(&self, t: usize, got: &TaskState) {
        let m = self.tasks[t].as_ref().unwrap();
        let ts = |v: u64| Timestamp(v);
        assert_eq!(got.spec.id, m.id);
        assert_eq!(got.status, m.status, "status of {}", m.id);
        assert_eq!(got.version, m.version, "version of {}", m.id);
        assert_eq!(got.attempt, m.attempt, "attempt of {}", m.id);
        assert_eq!(got.checkpoint, m.checkpoint, "checkpoint of {}", m.id);
        assert_eq!(
            got.cancel_requested_at,
            m.cancel_at.map(ts),
            "cancel of {}",
            m.id
        );
        assert_eq!(got.cancel_reason, m.cancel_reason);
        assert_eq!(got.lease_deadline, m.lease.map(ts), "lease of {}", m.id);
        assert_eq!(
            got.pending_resume, m.pending_resume,
            "pending resume of {}",
            m.id
        );
        assert_eq!(got.result_data, m.result_data);
        assert_eq!(got.result_error, m.result_error);
        assert_eq!(got.output_file_error, m.output_error);
        assert_eq!(got.context_snapshot, m.context);
        assert_eq!(got.created_at, ts(m.created));
        assert_eq!(got.updated_at, ts(m.updated), "updated_at of {}", m.id);
        assert_eq!(got.done_at, m.done.map(ts));
        assert_eq!(got.updates, m.updates.len() as u64);
        assert_eq!(got.policy == LeasePolicy::Retry, m.retry);
    }
}

fn to_command(cmd: &Cmd) -> Command {
    match cmd {
        Cmd::Start => Command::Start,
        Cmd::Heartbeat => Command::Heartbeat,
        Cmd::CommitStart(c) => Command::CommitStart {
            checkpoint: bytes(*c),
        },
        Cmd::Complete(d) => Command::Complete { data: bytes(*d) },
        Cmd::Fail(e) => Command::Fail { error: text(*e) },
        Cmd::WaitInput(c) => Command::WaitInput {
            checkpoint: bytes(*c),
        },
        Cmd::Suspend(c) => Command::Suspend {
            checkpoint: bytes(*c),
        },
        Cmd::Yield(c) => Command::Yield {
            checkpoint: bytes(*c),
        },
        Cmd::AckCancel(r) => Command::AckCancel { reason: text(*r) },
        Cmd::RequestCancel(r) => Command::RequestCancel { reason: text(*r) },
        Cmd::Resume(d) => Command::Resume {
            data: bytes(*d),
            context_snapshot: None,
        },
        Cmd::Release(c) => Command::ReleaseSuspension {
            context_snapshot: c.map(bytes),
        },
        Cmd::Transcript(e) => Command::ReportTranscriptFailure { error: text(*e) },
    }
}

fn model_outcome<T>(r: &Result<T, &'static str>) -> &'static str {
    match r {
        Ok(_) => "Ok",
        Err(e) => e,
    }
}

fn skewed(base: u64, skew: i8) -> u64 {
    base.saturating_add_signed(i64::from(skew))
}

async fn run(ops: Vec<Op>) {
    let mut env = Env::new();
    let mut model = Model {
        now: T0,
        tasks: vec![None; TASKS],
        outbox: Vec::new(),
    };
    for (i, op) in ops.iter().enumerate() {
        if matches!(op, Op::Reboot) {
            env.reopen();
            continue;
        }
        let store = env.store().clone();
        let touched = match op {
            Op::Create {
                t,
                retry,
                session,
                notify,
                checkpoint,
            } => {
                let spec = TaskSpec {
                    session_id: if *session { "s".into() } else { String::new() },
                    notify_session: *notify,
                    ..spec(&format!("t{t}"))
                };
                let policy = if *retry {
                    LeasePolicy::Retry
                } else {
                    LeasePolicy::Fail
                };
                let got = store
                    .create(CreateRequest {
                        spec,
                        policy: Some(policy),
                        checkpoint: bytes(*checkpoint),
                        context_snapshot: Vec::new(),
                    })
                    .await;
                let want = model.create(*t, *retry, *session, *notify, *checkpoint);
                assert_eq!(outcome(&got), model_outcome(&want), "op {i}: {op:?}");
                if let Ok(state) = got {
                    model.expect_snapshot(*t, &state);
                }
                Some(*t)
            }
            Op::Cmd { t, skew, cmd } => {
                let base = model.tasks[*t].as_ref().map_or(1, |m| m.version);
                let expected = skewed(base, *skew);
                let got = store
                    .execute(&format!("t{t}"), expected, to_command(cmd))
                    .await;
                let want = model.command(*t, expected, cmd);
                assert_eq!(
                    outcome(&got),
                    model_outcome(&want),
                    "op {i}: {op:?} (got {got:?})"
                );
                if let Ok(state) = got {
                    model.expect_snapshot(*t, &state);
                }
                Some(*t)
            }
            Op::Update {
                t,
                attempt_skew,
                event,
                payload,
            } => {
                let base = model.tasks[*t].as_ref().map_or(1, |m| m.attempt);
                let attempt = skewed(base, *attempt_skew);
                let event = format!("e{event}");
                let data = bytes(*payload);
                let request = UpdateRequest {
                    attempt,
                    event_id: event.clone(),
                    kind: "progress".into(),
                    data: data.clone(),
                    metadata: vec![],
                };
                let got = store.append_update(&format!("t{t}"), request).await;
                let want = model.update(*t, attempt, &event, &data);
                assert_eq!(outcome(&got), model_outcome(&want), "op {i}: {op:?}");
                if let (Ok((record, inserted)), Ok(want)) = (&got, &want) {
                    assert_eq!(inserted, want, "op {i}: inserted");
                    assert_eq!(record.data, data);
                    assert_eq!(record.event_id, event);
                }
                Some(*t)
            }
            Op::Advance(ms) => {
                env.advance(*ms);
                model.now += ms;
                None
            }
            Op::Reboot => unreachable!("handled above"),
            Op::Drain => {
                let got = receive_all(&store).await;
                let delivered: Vec<(String, usize)> = model.outbox.clone();
                // Receiving reads each notification's task, which resolves its lease.
                for (_, t) in &delivered {
                    model.resolve(*t);
                }
                model.outbox.drain(..delivered.len());
                let got_ids: Vec<&str> = got.iter().map(|n| n.id.as_str()).collect();
                let want_ids: Vec<&str> = delivered.iter().map(|(id, _)| id.as_str()).collect();
                assert_eq!(got_ids, want_ids, "op {i}: outbox");
                for n in &got {
                    store.ack_notification(&n.receipt).await.unwrap();
                }
                None
            }
        };
        if let Some(t) = touched {
            let got = store.get(&format!("t{t}")).await;
            model.resolve(t);
            match (&got, &model.tasks[t]) {
                (Ok(state), Some(_)) => model.expect_snapshot(t, state),
                (Err(e), None) => assert_eq!(kind(e), "NotFound"),
                _ => panic!("op {i}: existence differs: {got:?}"),
            }
        }
    }
    // Everything still queued is delivered, in order.
    let store = env.store();
    let got: Vec<String> = receive_all(store).await.into_iter().map(|n| n.id).collect();
    let want: Vec<String> = model.outbox.iter().map(|(id, _)| id.clone()).collect();
    assert_eq!(got, want, "final outbox");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, max_shrink_iters: 200, ..ProptestConfig::default() })]

    #[test]
    fn store_matches_model(ops in script_strategy()) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(run(ops));
    }
}
