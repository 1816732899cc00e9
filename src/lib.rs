//! # dtask
//!
//! A durable task engine for the tools of LLM agents. Every state transition of a task is
//! appended to a checksummed, hash-chained journal in RocksDB; a task's state is a pure fold
//! over its events; after a crash the journal is replayed and work continues.
//!
//! This crate is the facade: it re-exports the journal ([`journal`]), the fold and audit
//! ([`replay`]), the live engine ([`engine`]) and the tool component layer ([`tool`]), and
//! holds the HTTP server of `dtask serve` ([`server`]) and the conversation view of a
//! durable agent's run that it and `dtask show` share ([`conversation`]).

pub mod conversation;
pub mod server;

pub use dtask_engine as engine;
pub use dtask_engine::tool;
pub use dtask_journal as journal;
pub use dtask_replay as replay;

pub use dtask_engine::{
    Clock, Command, CreateRequest, ExecutionContext, InputRequest, ManualClock, StoreConfig,
    StoreError, SystemClock, TaskStore,
};
pub use dtask_journal::{
    Delivery, Durability, Event, Journal, JournalOptions, LeasePolicy, Publication, TaskSpec,
};
pub use dtask_replay::{Status, Task, TaskState};
