//! Liveness and readiness, for an orchestrator's probes and a load balancer's checks.
//!
//! - `GET /healthz` (**liveness**) fails only when nothing but a restart of the process can
//!   help: the journal's writer **stopped** after a failed sync ([`WriteState::Stopped`]);
//!   what that sync covered is known only once the journal is reopened.
//! - `GET /readyz` (**readiness**) fails while the server cannot do its whole job, each cause
//!   named in `reasons`: the journal stopped; its disk is full ([`WriteState::DiskFull`]:
//!   appends fail until there is room, and the server answers them 507); its last write
//!   failed otherwise ([`WriteState::Failing`]); the first count of the journal is not done
//!   (counts, statistics and streams would miss records); the last read of the journal's
//!   commits failed (a PostgreSQL journal's database out of reach, a follower that cannot
//!   catch up); its manager is closed (submits refused: a service draining); the server is
//!   stopping.
//!
//! Both answer without the token — they tell only the names of those states — and read
//! nothing but flags the writer and the pump keep ([`Journal::write_state`]), so a probe
//! costs no journal read.
//!
//! [`Journal::write_state`]: dtask_journal::Journal::write_state

use super::model::{Health, HealthReason, HealthStatus};
use super::Shared;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use dtask_journal::WriteState;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// The paths that answer without the token.
pub(crate) const OPEN_PATHS: [&str; 2] = ["/healthz", "/readyz"];

/// The state of the journal this server writes (an owner's store's journal; a follower
/// writes nothing).
fn write_state(shared: &Shared) -> WriteState {
    shared.owner.as_ref().map_or(WriteState::ReadOnly, |owner| {
        owner.store.journal().write_state()
    })
}

/// Whether the journal this server writes stopped after a failed sync.
pub(crate) fn journal_stopped(shared: &Shared) -> bool {
    matches!(write_state(shared), WriteState::Stopped(_))
}

/// Why the server is not ready, in a fixed order (empty: ready).
pub(crate) fn not_ready(shared: &Shared) -> Vec<HealthReason> {
    let mut reasons = Vec::new();
    match write_state(shared) {
        WriteState::Stopped(_) => reasons.push(HealthReason::JournalStopped),
        WriteState::DiskFull => reasons.push(HealthReason::DiskFull),
        WriteState::Failing => reasons.push(HealthReason::JournalFailing),
        _ => {}
    }
    if !shared.projection.is_counted() {
        reasons.push(HealthReason::Counting);
    }
    if shared.read_failing.load(Ordering::Relaxed) {
        reasons.push(HealthReason::JournalUnreadable);
    }
    if shared
        .owner
        .as_ref()
        .and_then(|owner| owner.manager.as_ref())
        .is_some_and(dtask_engine::Manager::is_closed)
    {
        reasons.push(HealthReason::ManagerClosed);
    }
    if *shared.stop.borrow() {
        reasons.push(HealthReason::Stopping);
    }
    reasons
}

fn answer(reasons: Vec<HealthReason>) -> Response {
    let (code, status) = if reasons.is_empty() {
        (StatusCode::OK, HealthStatus::Ok)
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, HealthStatus::Unavailable)
    };
    (code, Json(Health { status, reasons })).into_response()
}

/// Liveness: 503 once the journal stopped (restart the process), else 200.
#[utoipa::path(
    get, path = "/healthz", tag = "health",
    responses(
        (status = 200, description = "Alive", body = Health),
        (status = 503, description = "The journal stopped after a failed sync: restart the process", body = Health),
    )
)]
pub async fn live(State(shared): State<Arc<Shared>>) -> Response {
    answer(if journal_stopped(&shared) {
        vec![HealthReason::JournalStopped]
    } else {
        Vec::new()
    })
}

/// Readiness: 200 when the server can do its whole job, else 503 with the reasons.
#[utoipa::path(
    get, path = "/readyz", tag = "health",
    responses(
        (status = 200, description = "Ready", body = Health),
        (status = 503, description = "Not ready; `reasons` says why", body = Health),
    )
)]
pub async fn ready(State(shared): State<Arc<Shared>>) -> Response {
    answer(not_ready(&shared))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::server::{Server, ServerConfig};
    use dtask_journal::{Journal, JournalOptions};

    /// A server that has not counted its journal is not ready (`counting`), and one that is
    /// stopping says so too, in that order; it is alive all along.
    #[test]
    fn readiness_names_each_cause_in_order() {
        let dir = tempfile::tempdir().unwrap();
        drop(Journal::open(dir.path(), JournalOptions::default()).unwrap());
        let journal = Journal::open_read_only(dir.path()).unwrap();
        let server = Server::follower(journal, ServerConfig::default());
        assert_eq!(not_ready(&server.shared), vec![HealthReason::Counting]);
        server.stop.send_replace(true);
        assert_eq!(
            not_ready(&server.shared),
            vec![HealthReason::Counting, HealthReason::Stopping]
        );
        server
            .shared
            .read_failing
            .store(true, std::sync::atomic::Ordering::Relaxed);
        assert_eq!(
            not_ready(&server.shared),
            vec![
                HealthReason::Counting,
                HealthReason::JournalUnreadable,
                HealthReason::Stopping
            ]
        );
        assert!(
            !journal_stopped(&server.shared),
            "a follower writes nothing"
        );
    }
}
