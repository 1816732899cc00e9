//! # dtask-replay
//!
//! Pure functions of events. [`Task::apply`] is the fold — the only place task state changes —
//! shared by the live engine, recovery and the audit. [`Replay`] is the trait every consumer of
//! a task's stream implements; [`replay_task`] feeds it verified records from a journal.
//!
//! [`audit`] checks a journal — damage, legality, indexes — as a library call (the same audit
//! `dtask verify` runs).
//!
//! No clock, no randomness, no I/O beyond reading a journal.
//!
//! ```
//! use dtask_journal::{Event, LeasePolicy, TaskSpec, Timestamp};
//! use dtask_replay::{Status, Task};
//!
//! let spec = TaskSpec { id: "t".into(), executor_key: "x".into(), ..TaskSpec::default() };
//! let events = [
//!     Event::Created { spec: spec.into(), policy: LeasePolicy::Retry, checkpoint: vec![], context_snapshot: vec![], at: Timestamp(1) },
//!     Event::AttemptStarted { attempt: 1, lease_deadline: Timestamp(30_001), at: Timestamp(1) },
//!     Event::Completed { data: b"done".to_vec(), at: Timestamp(2) },
//! ];
//! let task = Task::fold("t", &events).expect("legal stream").expect("non-empty");
//! assert_eq!(task.state.status, Status::Completed);
//! assert_eq!(task.state.version, 3);
//! assert_eq!(task.state.result_data, b"done");
//! ```

pub mod audit;
mod fold;
mod ids;
mod parallel;
mod replay;
mod state;

pub use audit::{
    audit_journal, audit_task, AuditError, AuditReport, Problem, ProblemKind, TaskReport,
};
pub use fold::{cancel_error, part_key, FoldError, Task, TaskLayer};
pub use ids::IdIndex;
pub use replay::{
    load_listed_tasks_each, load_task, load_task_at, load_tasks, load_tasks_each, load_tasks_with,
    replay_task, FoldView, FoldViews, Replay, ReplayError, TaskFold,
};
pub use state::{
    recovery_limit_error, Fenced, Lineage, Mailbox, Status, TaskState, DEFAULT_CANCEL_REASON,
    LEASE_EXPIRED_ERROR,
};
