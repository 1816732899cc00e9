//! One test per numbered guarantee of the reference task store that applies to the G2 core
//! (docs/semantics.md states the rules); one module per section.
//!
//! Skipped: 7 (G3 publication), 36–37 (mailbox sealing), 47 (manager-level cancel wait),
//! 59–63 (mailbox inputs), 77 (event parts), 84–88 (publication), 104 (nested tasks) and
//! 105 onwards (manager-level).

#![allow(clippy::unwrap_used, clippy::too_many_lines)]

#[path = "../common/mod.rs"]
mod common;

use common::*;
use dtask_engine::{
    Command, CreateRequest, NotificationRequest, StoreConfig, StoreError, UpdateRequest,
};
use dtask_journal::{Durability, Event, LeasePolicy, Timestamp};
use dtask_replay::{Status, DEFAULT_CANCEL_REASON, LEASE_EXPIRED_ERROR};
use std::time::Duration;

use LeasePolicy::{Fail, Retry};

fn update(attempt: u64, event_id: &str, data: &str) -> UpdateRequest {
    UpdateRequest {
        attempt,
        event_id: event_id.to_owned(),
        kind: "progress".to_owned(),
        data: data.as_bytes().to_vec(),
        metadata: vec![("k".to_owned(), "v".to_owned())],
        ..UpdateRequest::default()
    }
}

fn note(event_id: &str, kind: &str, data: &str) -> NotificationRequest {
    NotificationRequest {
        event_id: event_id.to_owned(),
        kind: kind.to_owned(),
        data: data.as_bytes().to_vec(),
        ..NotificationRequest::default()
    }
}

/// A session-routed running task.
async fn routed_running(env: &Env, id: &str, notify: bool, policy: LeasePolicy) -> u64 {
    let store = env.store();
    let t = store
        .create(request(session_spec(id, notify), policy))
        .await
        .unwrap();
    store.execute(id, t.version, Command::Start).await.unwrap();
    store.get(id).await.unwrap().version
}

mod claims;
mod commit_start;
mod create;
mod fencing;
mod terminal;
mod versions;
/// Every active-attempt command, with valid arguments.
fn active_commands() -> Vec<Command> {
    vec![
        Command::Heartbeat,
        Command::CommitStart {
            checkpoint: cp("c"),
        },
        Command::Complete { data: cp("d") },
        Command::Fail { error: "e".into() },
        Command::WaitInput {
            checkpoint: cp("w"),
        },
        Command::Suspend {
            checkpoint: cp("s"),
        },
        Command::Yield { checkpoint: vec![] },
    ]
}

mod cancellation;
mod expiry;
mod listing;
mod notifications;
mod transcript;
mod updates;
mod waiting;
mod yielding;
