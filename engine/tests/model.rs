//! A model test: random operation sequences against the real store (RocksDB in a tempdir)
//! and against a small in-memory model of the reference rules, written here independently of
//! `decide` and the fold. After every operation the outcome (Ok, or which error) and the
//! task's snapshot must agree; the outbox is compared whenever it is drained.
//!
//! The model covers the G3 layer too: mailbox inputs (and the `*IfNoInputs` commands),
//! publication, and children created under a running attempt, whose lifecycle notices go into
//! their parent's mailbox; and what the store adds: reruns and recovery limits (a second
//! script strategy loses workers again and again).

#![allow(
    clippy::unwrap_used,
    clippy::too_many_lines,
    clippy::struct_excessive_bools
)]

mod common;

use common::*;
use dtask_engine::{Command, CreateRequest, ExecutionContext, InputRequest, UpdateRequest};
use dtask_journal::{Delivery, LeasePolicy, Publication, TaskSpec, Timestamp};
use dtask_replay::{
    recovery_limit_error, Status, TaskState, DEFAULT_CANCEL_REASON, LEASE_EXPIRED_ERROR,
};
use proptest::prelude::*;
use std::collections::HashMap;

/// Root tasks (created by `Op::Create`).
const TASKS: usize = 2;
/// Slots for children (created by `Op::Child` under a running root task).
const CHILDREN: usize = 2;
/// Slots for reruns (created by `Op::Rerun` of a finished root task or rerun).
const RERUNS: usize = 2;
/// Every task slot: roots, children, reruns.
const SLOTS: usize = TASKS + CHILDREN + RERUNS;

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
    /// `YieldUntil` this many 20 s steps after the model's clock (0: now, a plain yield).
    YieldFor(u8),
    AckCancel(u8),
    RequestCancel(u8),
    Resume(u8),
    Release(Option<u8>),
    Transcript(u8),
    /// `CommitInput` from the consumed cursor forward by this much.
    CommitInput(u8),
    /// `CompleteIfNoInputs` at the consumed cursor.
    CompleteIfNoInputs(u8),
    /// `WaitInputIfNoInputs` at the consumed cursor plus this much.
    WaitIfNoInputs(u8),
    /// `SuspendIfNoInputs` at the consumed cursor.
    SuspendIfNoInputs,
}

#[derive(Debug, Clone)]
enum Op {
    Create {
        t: usize,
        retry: bool,
        session: bool,
        notify: bool,
        checkpoint: u8,
        deferred: bool,
        /// The recovery limit (`None`: none).
        cap: Option<u8>,
        /// A delay, in 20 s steps after the model's clock (`None` or 0: none).
        delay: Option<u8>,
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
    Input {
        t: usize,
        event: u8,
        payload: u8,
    },
    Publish {
        t: usize,
    },
    Child {
        slot: usize,
        parent: usize,
        attempt_skew: i8,
        notify: bool,
    },
    /// Reruns task `of` as the task of rerun slot `slot`.
    Rerun {
        slot: usize,
        of: usize,
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
        1 => n.clone().prop_map(Cmd::YieldFor),
        1 => n.clone().prop_map(Cmd::AckCancel),
        2 => n.clone().prop_map(Cmd::RequestCancel),
        2 => n.clone().prop_map(Cmd::Resume),
        2 => proptest::option::of(n.clone()).prop_map(Cmd::Release),
        1 => n.clone().prop_map(Cmd::Transcript),
        2 => n.clone().prop_map(Cmd::CommitInput),
        2 => n.clone().prop_map(Cmd::CompleteIfNoInputs),
        2 => n.prop_map(Cmd::WaitIfNoInputs),
        1 => Just(Cmd::SuspendIfNoInputs),
    ]
}

fn create_strategy() -> impl Strategy<Value = Op> {
    (
        0..TASKS,
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        0u8..2,
        prop_oneof![3 => Just(false), 1 => Just(true)],
        prop_oneof![1 => Just(None), 1 => Just(Some(0u8)), 1 => Just(Some(1u8))],
        prop_oneof![3 => Just(None), 1 => (0u8..3).prop_map(Some)],
    )
        .prop_map(
            |(t, retry, session, notify, checkpoint, deferred, cap, delay)| Op::Create {
                t,
                retry,
                session,
                notify: session && notify,
                checkpoint,
                deferred,
                cap,
                delay,
            },
        )
}

/// Every task is created first (with random settings) and some are canceled at once (so that
/// reruns find finished tasks), then the random operations run.
fn script_strategy() -> impl Strategy<Value = Vec<Op>> {
    (
        prop::collection::vec(create_strategy(), TASKS),
        prop::collection::vec(any::<bool>(), TASKS),
        prop::collection::vec(op_strategy(), 1..40),
    )
        .prop_map(|(mut creates, cancel, ops)| {
            for (t, op) in creates.iter_mut().enumerate() {
                if let Op::Create { t: target, .. } = op {
                    *target = t;
                }
            }
            for (t, _) in cancel.iter().enumerate().filter(|(_, c)| **c) {
                creates.push(Op::Cmd {
                    t,
                    skew: 0,
                    cmd: Cmd::RequestCancel(1),
                });
            }
            creates.extend(ops);
            creates
        })
}

fn op_strategy() -> impl Strategy<Value = Op> {
    let t = 0..SLOTS;
    prop_oneof![
        1 => create_strategy(),
        14 => (t.clone(), prop_oneof![10 => Just(0i8), 1 => Just(-1i8), 1 => Just(1i8)], cmd_strategy())
            .prop_map(|(t, skew, cmd)| Op::Cmd { t, skew, cmd }),
        3 => (t.clone(), prop_oneof![6 => Just(0i8), 1 => Just(-1i8), 1 => Just(1i8)], 0u8..3, 1u8..3)
            .prop_map(|(t, attempt_skew, event, payload)| Op::Update { t, attempt_skew, event, payload }),
        4 => (t.clone(), 0u8..4, 1u8..3)
            .prop_map(|(t, event, payload)| Op::Input { t, event, payload }),
        1 => t.prop_map(|t| Op::Publish { t }),
        2 => (TASKS..TASKS + CHILDREN, 0..TASKS, prop_oneof![6 => Just(0i8), 1 => Just(-1i8)], any::<bool>())
            .prop_map(|(slot, parent, attempt_skew, notify)| Op::Child { slot, parent, attempt_skew, notify }),
        3 => (TASKS + CHILDREN..SLOTS, prop_oneof![3 => 0..TASKS, 1 => 0..SLOTS]).prop_map(|(slot, of)| Op::Rerun { slot, of }),
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
    deferred: bool,
    published: bool,
    /// The parent's slot, for a child.
    parent: Option<usize>,
    /// Inputs: (event id, data, kind), in sequence order.
    inputs: Vec<(String, Vec<u8>, String)>,
    consumed: u64,
    generation: u64,
    children: Vec<String>,
    parent_error: bool,
    /// The checkpoint the task was created with (a rerun starts from it).
    initial: Vec<u8>,
    /// The slot of the task this one reruns.
    rerun_of: Option<usize>,
    /// The ids of this task's reruns, oldest first.
    rerun_as: Vec<String>,
    /// The recovery limit, and the recoveries so far.
    cap: Option<u64>,
    recoveries: u64,
    /// A pending task's earliest claim time.
    not_before: Option<u64>,
}

#[derive(Debug, Default)]
struct Model {
    now: u64,
    tasks: Vec<Option<MTask>>,
    outbox: Vec<(String, usize)>,
}

type TaskOutcome = Result<(), &'static str>;

impl MTask {
    fn new(t: usize, retry: bool, session: bool, notify: bool, checkpoint: u8, now: u64) -> Self {
        Self {
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
            created: now,
            updated: now,
            done: None,
            updates: HashMap::new(),
            deferred: false,
            published: false,
            parent: None,
            inputs: Vec::new(),
            consumed: 0,
            generation: 1,
            children: Vec::new(),
            parent_error: false,
            initial: bytes(checkpoint),
            rerun_of: None,
            rerun_as: Vec::new(),
            cap: None,
            recoveries: 0,
            not_before: None,
        }
    }

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
        self.not_before = None;
        self.done = Some(now);
        self.generation += 1;
    }

    fn latest(&self) -> u64 {
        self.inputs.len() as u64
    }

    fn active(&self, now: u64) -> bool {
        self.status == Status::Running && self.lease.is_some_and(|d| d > now)
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
        let wanted = kind == "task_created" || kind == "task_backgrounded" || task.notify;
        if task.deferred && !task.published || !wanted {
            return;
        }
        let id = format!("{}:{}:{kind}", task.id, task.version);
        match task.parent {
            None if task.session => self.outbox.push((id, t)),
            None => {}
            Some(p) => {
                let child = task.id.clone();
                let parent = self.tasks[p].as_mut().unwrap();
                let delivered = parent.inputs.iter().any(|(e, ..)| *e == id);
                if parent.terminal() && !delivered {
                    self.tasks[t].as_mut().unwrap().parent_error = true;
                } else if !delivered {
                    parent
                        .inputs
                        .push((id, child.into_bytes(), kind.to_owned()));
                    if parent.status == Status::WaitingInput {
                        parent.status = Status::Pending;
                        parent.bump(self.now);
                    }
                }
            }
        }
    }

    fn input(&mut self, t: usize, event: &str, data: &[u8]) -> Result<bool, &'static str> {
        if self.tasks[t].is_none() {
            return Err("NotFound");
        }
        self.resolve(t);
        let now = self.now;
        let task = self.tasks[t].as_mut().unwrap();
        if let Some((_, d, _)) = task.inputs.iter().find(|(e, ..)| e == event) {
            return if d == data {
                Ok(false)
            } else {
                Err("InputConflict")
            };
        }
        if task.terminal() {
            return Err("MailboxSealed");
        }
        task.inputs
            .push((event.to_owned(), data.to_vec(), "message".to_owned()));
        if task.status == Status::WaitingInput {
            task.status = Status::Pending;
            task.bump(now);
        }
        Ok(true)
    }

    fn publish(&mut self, t: usize, expected: u64) -> TaskOutcome {
        if self.tasks[t].is_none() {
            return Err("NotFound");
        }
        self.resolve(t);
        let task = self.tasks[t].as_mut().unwrap();
        // The CAS comes after lazy expiry, which may have raised the version.
        if task.version != expected {
            return Err("VersionConflict");
        }
        if !task.deferred {
            return Err("IllegalTransition");
        }
        if task.published {
            return Ok(());
        }
        if task.terminal() {
            return Err("AlreadyTerminal");
        }
        task.published = true;
        self.notify(t, "task_backgrounded");
        Ok(())
    }

    fn child(&mut self, slot: usize, parent: usize, attempt: u64, notify: bool) -> TaskOutcome {
        if self.tasks[parent].is_none() {
            return Err("NotFound");
        }
        self.resolve(parent);
        let now = self.now;
        let p = self.tasks[parent].as_mut().unwrap();
        if p.terminal() {
            return Err("MailboxSealed");
        }
        if p.status != Status::Running
            || attempt != p.attempt
            || !p.active(now)
            || p.cancel_at.is_some()
        {
            return Err("LeaseLost");
        }
        if self.tasks[slot].is_some() {
            return Err("AlreadyExists");
        }
        let p = self.tasks[parent].as_mut().unwrap();
        p.children.push(format!("t{slot}"));
        self.tasks[slot] = Some(MTask {
            parent: Some(parent),
            notify,
            ..MTask::new(slot, true, false, false, 0, now)
        });
        self.notify(slot, "task_created");
        Ok(())
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
        let recoverable = task.retry && task.cap.is_none_or(|cap| task.recoveries < cap);
        let kind = if recoverable {
            task.status = Status::Pending;
            task.lease = None;
            task.recoveries += 1;
            None
        } else if task.cancel_at.is_some() {
            let error = task.cancel_error("");
            task.finish(Status::Canceled, error, now);
            Some("canceled")
        } else {
            let error = if task.retry {
                recovery_limit_error(task.recoveries)
            } else {
                LEASE_EXPIRED_ERROR.to_owned()
            };
            task.finish(Status::Failed, error, now);
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
        self.tasks[t] = Some(MTask::new(t, retry, session, notify, checkpoint, self.now));
        self.notify(t, "task_created");
        Ok(())
    }

    /// `TaskStore::rerun` of `of` as the task of `slot`, named.
    fn rerun(&mut self, slot: usize, of: usize) -> TaskOutcome {
        if self.tasks[of].is_none() {
            return Err("NotFound");
        }
        self.resolve(of);
        let now = self.now;
        let id = format!("t{slot}");
        let o = self.tasks[of].as_ref().unwrap();
        if o.rerun_as.contains(&id) {
            // A repeat: the store reads the rerun back, resolving its lease.
            self.resolve(slot);
            return Ok(());
        }
        if !o.terminal() {
            return Err("IllegalTransition");
        }
        if o.parent.is_some() || slot == of {
            return Err("Invalid");
        }
        if self.tasks[slot].is_some() {
            return Err("AlreadyExists");
        }
        let rerun = MTask {
            checkpoint: o.initial.clone(),
            initial: o.initial.clone(),
            rerun_of: Some(of),
            cap: o.cap,
            ..MTask::new(slot, o.retry, o.session, o.notify, 0, now)
        };
        self.tasks[of].as_mut().unwrap().rerun_as.push(id);
        self.tasks[slot] = Some(rerun);
        self.notify(slot, "task_created");
        Ok(())
    }

    fn command(&mut self, t: usize, expected: u64, cmd: &Cmd) -> TaskOutcome {
        // 1. Validation, before any lookup.
        match cmd {
            Cmd::CommitStart(0) | Cmd::WaitInput(0) | Cmd::Suspend(0) | Cmd::Transcript(0) => {
                return Err("Invalid")
            }
            Cmd::Fail(0) => return Err("InvalidExecutionResult"),
            Cmd::CommitInput(0) => return Err("Invalid"),
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
                if task.not_before.is_some_and(|until| until > now) {
                    return Err("NotDue");
                }
                task.status = Status::Running;
                task.attempt += 1;
                task.lease = Some(lease);
                task.not_before = None;
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
                    Cmd::YieldFor(steps) => {
                        task.status = Status::Pending;
                        task.lease = None;
                        if *steps > 0 {
                            task.not_before = Some(now + u64::from(*steps) * 20_000);
                        }
                    }
                    Cmd::CommitInput(by) => {
                        let cursor = task.consumed + u64::from(*by);
                        if cursor > task.latest() {
                            return Err("InvalidCursor");
                        }
                        task.consumed = cursor;
                        task.checkpoint = b"ci".to_vec();
                    }
                    Cmd::CompleteIfNoInputs(d) => {
                        if task.latest() > task.consumed {
                            task.status = Status::Pending;
                            task.lease = None;
                            task.bump(now);
                            return Err("InputsPending");
                        }
                        task.finish(Status::Completed, String::new(), now);
                        task.result_data = bytes(*d);
                        note = Some("completed");
                    }
                    Cmd::WaitIfNoInputs(by) => {
                        let cursor = task.consumed + u64::from(*by);
                        if cursor > task.latest() {
                            return Err("InvalidCursor");
                        }
                        task.consumed = cursor;
                        task.checkpoint = b"wait".to_vec();
                        task.lease = None;
                        if task.latest() > cursor {
                            task.status = Status::Pending;
                            task.bump(now);
                            return Err("InputsPending");
                        }
                        task.status = Status::WaitingInput;
                        task.pending_resume = None;
                        note = Some("waiting_input");
                    }
                    Cmd::SuspendIfNoInputs => {
                        task.checkpoint = b"zz".to_vec();
                        task.lease = None;
                        if task.latest() > task.consumed {
                            task.status = Status::Pending;
                            task.bump(now);
                            return Err("InputsPending");
                        }
                        task.status = Status::Suspended;
                        task.pending_resume = None;
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
        assert_eq!(got.mailbox.latest, m.latest(), "inputs of {}", m.id);
        assert_eq!(got.mailbox.consumed, m.consumed, "consumed of {}", m.id);
        assert_eq!(
            got.mailbox.generation, m.generation,
            "generation of {}",
            m.id
        );
        let publication = match (m.deferred, m.published) {
            (false, _) => Publication::OnCreate,
            (true, false) => Publication::Deferred,
            (true, true) => Publication::OnBackground,
        };
        assert_eq!(got.publication, publication, "publication of {}", m.id);
        assert_eq!(
            got.parent_task_id,
            m.parent.map(|p| format!("t{p}")).unwrap_or_default()
        );
        assert_eq!(
            got.rerun_of(),
            m.rerun_of.map(|o| format!("t{o}")).as_deref(),
            "rerun of {}",
            m.id
        );
        assert_eq!(got.rerun_as(), m.rerun_as, "reruns of {}", m.id);
        assert_eq!(got.max_recoveries, m.cap, "recovery limit of {}", m.id);
        assert_eq!(got.recoveries, m.recoveries, "recoveries of {}", m.id);
        assert_eq!(
            got.not_before,
            m.not_before.map(ts),
            "not-before of {}",
            m.id
        );
        assert_eq!(
            !got.parent_notification_error.is_empty(),
            m.parent_error,
            "parent notice of {}",
            m.id
        );
    }
}

/// The store command of `cmd`, whose cursor arguments are relative to the model's consumed
/// cursor `consumed`.
fn to_command(cmd: &Cmd, consumed: u64, now: u64) -> Command {
    match cmd {
        Cmd::YieldFor(steps) => Command::YieldUntil {
            checkpoint: Vec::new(),
            until: Timestamp(now + u64::from(*steps) * 20_000),
        },
        Cmd::CommitInput(by) => Command::CommitInput {
            expected_cursor: consumed,
            cursor: consumed + u64::from(*by),
            checkpoint: b"ci".to_vec(),
        },
        Cmd::CompleteIfNoInputs(d) => Command::CompleteIfNoInputs {
            cursor: consumed,
            data: bytes(*d),
        },
        Cmd::WaitIfNoInputs(by) => Command::WaitInputIfNoInputs {
            cursor: consumed + u64::from(*by),
            checkpoint: b"wait".to_vec(),
        },
        Cmd::SuspendIfNoInputs => Command::SuspendIfNoInputs {
            cursor: consumed,
            checkpoint: b"zz".to_vec(),
        },
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
        tasks: vec![None; SLOTS],
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
                deferred,
                cap,
                delay,
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
                        publication: if *deferred {
                            Publication::Deferred
                        } else {
                            Publication::OnCreate
                        },
                        max_recoveries: cap.map(u64::from),
                        not_before: delay
                            .map(|steps| Timestamp(model.now + u64::from(steps) * 20_000)),
                        ..CreateRequest::default()
                    })
                    .await;
                let want = model.create(*t, *retry, *session, *notify, *checkpoint);
                if want.is_ok() {
                    model.tasks[*t].as_mut().unwrap().deferred = *deferred;
                    model.tasks[*t].as_mut().unwrap().cap = cap.map(u64::from);
                    model.tasks[*t].as_mut().unwrap().not_before = delay
                        .filter(|steps| *steps > 0)
                        .map(|steps| model.now + u64::from(steps) * 20_000);
                    if *deferred {
                        // Created deferred: its task_created was not sent.
                        let id = format!("t{t}:1:task_created");
                        model.outbox.retain(|(n, _)| *n != id);
                    }
                }
                assert_eq!(outcome(&got), model_outcome(&want), "op {i}: {op:?}");
                if let Ok(state) = got {
                    model.expect_snapshot(*t, &state);
                }
                Some(*t)
            }
            Op::Cmd { t, skew, cmd } => {
                let base = model.tasks[*t].as_ref().map_or(1, |m| m.version);
                let expected = skewed(base, *skew);
                let consumed = model.tasks[*t].as_ref().map_or(0, |m| m.consumed);
                let got = store
                    .execute(
                        &format!("t{t}"),
                        expected,
                        to_command(cmd, consumed, model.now),
                    )
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
                    ..UpdateRequest::default()
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
            Op::Input { t, event, payload } => {
                let event = format!("i{event}");
                let data = bytes(*payload);
                let request = InputRequest {
                    event_id: event.clone(),
                    kind: "message".into(),
                    data: data.clone(),
                    delivery: Delivery::Queued,
                };
                let got = store.send_input(&format!("t{t}"), request).await;
                let want = model.input(*t, &event, &data);
                assert_eq!(outcome(&got), model_outcome(&want), "op {i}: {op:?}");
                if let (Ok((record, inserted)), Ok(want)) = (&got, &want) {
                    assert_eq!(inserted, want, "op {i}: inserted");
                    assert_eq!(record.data, data);
                }
                Some(*t)
            }
            Op::Publish { t } => {
                let version = model.tasks[*t].as_ref().map_or(1, |m| m.version);
                let got = store.publish(&format!("t{t}"), version).await;
                let want = model.publish(*t, version);
                assert_eq!(outcome(&got), model_outcome(&want), "op {i}: {op:?}");
                Some(*t)
            }
            Op::Child {
                slot,
                parent,
                attempt_skew,
                notify,
            } => {
                let base = model.tasks[*parent].as_ref().map_or(1, |m| m.attempt);
                let attempt = skewed(base, *attempt_skew).max(1);
                let got = store
                    .create(CreateRequest {
                        spec: TaskSpec {
                            notify_session: *notify,
                            ..spec(&format!("t{slot}"))
                        },
                        policy: Some(LeasePolicy::Retry),
                        parent: Some(ExecutionContext {
                            task_id: format!("t{parent}"),
                            attempt,
                            generation: 1,
                        }),
                        ..CreateRequest::default()
                    })
                    .await;
                let want = model.child(*slot, *parent, attempt, *notify);
                assert_eq!(
                    outcome(&got),
                    model_outcome(&want),
                    "op {i}: {op:?} ({got:?})"
                );
                if got.is_ok() {
                    let children = store
                        .list_children(&format!("t{parent}"), None, 100)
                        .await
                        .unwrap();
                    let ids: Vec<String> =
                        children.tasks.iter().map(|c| c.spec.id.clone()).collect();
                    let mut want = model.tasks[*parent].as_ref().unwrap().children.clone();
                    want.sort();
                    assert_eq!(ids, want, "op {i}: children");
                }
                Some(*parent)
            }
            Op::Rerun { slot, of } => {
                let got = store
                    .rerun(&format!("t{of}"), Some(format!("t{slot}")))
                    .await;
                let want = model.rerun(*slot, *of);
                assert_eq!(
                    outcome(&got),
                    model_outcome(&want),
                    "op {i}: {op:?} ({got:?})"
                );
                if let Ok(state) = got {
                    model.expect_snapshot(*slot, &state);
                }
                // The original's lineage too.
                if let Ok(original) = store.get(&format!("t{of}")).await {
                    model.resolve(*of);
                    model.expect_snapshot(*of, &original);
                }
                Some(*slot)
            }
            Op::Advance(ms) => {
                env.advance(*ms);
                model.now += ms;
                None
            }
            Op::Reboot => unreachable!("handled above"),
            Op::Drain => {
                let got = receive_all(&store).await;
                // Receiving touches no task: it reads each one's session off its creation,
                // so no lease is resolved by it.
                let delivered: Vec<(String, usize)> = model.outbox.clone();
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
            // A child's notice changes its parent: compare the parent too.
            let related = model.tasks[t].as_ref().and_then(|m| m.parent);
            if let Some(p) = related {
                let parent = store.get_task(&format!("t{p}")).await.unwrap();
                model.resolve(p);
                model.expect_snapshot(p, &parent.state);
            }
        }
    }
    // Everything still queued is delivered, in order.
    let store = env.store();
    let got: Vec<String> = receive_all(store).await.into_iter().map(|n| n.id).collect();
    let want: Vec<String> = model.outbox.iter().map(|(id, _)| id.clone()).collect();
    assert_eq!(got, want, "final outbox");
}

/// Scripts that lose workers often: retry-policy root tasks, most with a recovery limit, some
/// delayed, claimed and left to expire again and again, with timed yields, cancellations,
/// completions, reruns and reboots among the expiries.
fn recovery_script_strategy() -> impl Strategy<Value = Vec<Op>> {
    let create = (
        any::<bool>(),
        0u8..2,
        prop_oneof![1 => Just(None), 3 => (0u8..3).prop_map(Some)],
        prop_oneof![1 => Just(None), 1 => (0u8..3).prop_map(Some)],
    );
    let t = 0..TASKS;
    let op = prop_oneof![
        6 => t.clone().prop_map(|t| Op::Cmd { t, skew: 0, cmd: Cmd::Start }),
        2 => t.clone().prop_map(|t| Op::Cmd { t, skew: 0, cmd: Cmd::Heartbeat }),
        2 => (t.clone(), 0u8..3).prop_map(|(t, steps)| Op::Cmd { t, skew: 0, cmd: Cmd::YieldFor(steps) }),
        1 => t.clone().prop_map(|t| Op::Cmd { t, skew: 0, cmd: Cmd::RequestCancel(1) }),
        1 => t.clone().prop_map(|t| Op::Cmd { t, skew: 0, cmd: Cmd::Complete(1) }),
        5 => prop_oneof![Just(15_000u64), Just(30_000), Just(31_000)].prop_map(Op::Advance),
        2 => (TASKS + CHILDREN..SLOTS, t).prop_map(|(slot, of)| Op::Rerun { slot, of }),
        1 => Just(Op::Reboot),
        1 => Just(Op::Drain),
    ];
    (
        prop::collection::vec(create, TASKS),
        prop::collection::vec(op, 1..40),
    )
        .prop_map(|(creates, ops)| {
            let mut script: Vec<Op> = creates
                .into_iter()
                .enumerate()
                .map(|(t, (session, checkpoint, cap, delay))| Op::Create {
                    t,
                    retry: true,
                    session,
                    notify: session,
                    checkpoint,
                    deferred: false,
                    cap,
                    delay,
                })
                .collect();
            script.extend(ops);
            script
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, max_shrink_iters: 200, ..ProptestConfig::default() })]

    #[test]
    fn store_matches_model(ops in script_strategy()) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(run(ops));
    }

    #[test]
    fn recovery_limits_and_delays_match_model(ops in recovery_script_strategy()) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(run(ops));
    }
}
