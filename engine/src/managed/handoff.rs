//! The hand-off to the background: when a call's foreground time runs out and the policy says
//! so, the tool adopts the live attempt-0 run, and a background task — whose started marker is
//! the adopted checkpoint — carries it on from its first attempt, in this process.

use super::call::{CallOutcome, CandidateInfo, ManagedTool};
use super::codec::ManagedCheckpoint;
use super::error::ManagedError;
use super::foreground::Foreground;
use super::tool::{AdoptRequest, ForegroundHandoffTool};
use crate::runtime::{RuntimeError, SubmitRequest};
use dtask_journal::TaskSpec;
use dtask_replay::TaskState;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

impl ManagedTool {
    /// The foreground time ran out: hand the run off when the policy allows, else stop it.
    pub(super) async fn timed_out(
        &self,
        fg: Foreground,
        timeout: Duration,
    ) -> Result<CallOutcome, ManagedError> {
        if let (Some(policy), Some(handoff)) = (
            &self.config.should_auto_background,
            self.registration.tool.as_handoff(),
        ) {
            let candidate = CandidateInfo {
                task_id: fg.spec.id.clone(),
                kind: fg.spec.kind.clone(),
                description: fg.spec.description.clone(),
                output_file: fg.spec.output_file.clone(),
                elapsed: fg.started.elapsed(),
            };
            if policy(&candidate) {
                match self.hand_off(&fg, handoff).await {
                    Ok(task) => return Ok(CallOutcome::Done(self.launch_result(&task)?)),
                    Err(e) => tracing::debug!(task = %fg.spec.id, error = %e, "hand-off not taken"),
                }
            }
        }
        let _ = fg.run.stop().await;
        Err(ManagedError::ForegroundTimeout {
            timeout,
            task_id: fg.spec.id,
        })
    }

    /// Adopt → started marker → adopted-run table → submit with the marker as the initial
    /// checkpoint → the first attempt, detached from the caller.
    async fn hand_off(
        &self,
        fg: &Foreground,
        handoff: &dyn ForegroundHandoffTool,
    ) -> Result<TaskState, ManagedError> {
        let adopted = handoff
            .adopt(AdoptRequest {
                task_id: fg.spec.id.clone(),
                arguments: fg.arguments.clone(),
                run: Arc::clone(&fg.run),
                tool_checkpoint: fg.tool_checkpoint.clone(),
            })
            .await
            .map_err(ManagedError::Adopt)?;
        let marker = match ManagedCheckpoint::started(adopted.tool_checkpoint).encode() {
            Ok(marker) => marker,
            Err(e) => {
                let _ = adopted.run.stop().await;
                return Err(e.into());
            }
        };
        let live = self.tools.live();
        if !live.adopt(&fg.spec.id, Arc::clone(&adopted.run)) {
            let _ = adopted.run.stop().await;
            return Err(ManagedError::AlreadyAdopted {
                task_id: fg.spec.id.clone(),
            });
        }
        let submitted = self
            .manager
            .submit(SubmitRequest {
                spec: fg.spec.clone(),
                initial_checkpoint: marker,
                ..SubmitRequest::default()
            })
            .await;
        match submitted {
            Ok(task) => {
                drop(self.dispatch(&task.spec.id));
                Ok(task)
            }
            Err(e) => {
                if let Some(run) = live.take_adopted(&fg.spec.id) {
                    let _ = run.stop().await;
                }
                Err(e.into())
            }
        }
    }

    /// The foreground run asked to be looked at again later: its task goes to the background
    /// with `marker` (the started marker, with the tool checkpoint to recover from) as its
    /// initial checkpoint, not to be claimed before `after` has passed — the next attempt, in
    /// any process, recovers the tool.
    pub(super) async fn check_back_in(
        &self,
        spec: TaskSpec,
        marker: Vec<u8>,
        after: Duration,
    ) -> Result<TaskState, ManagedError> {
        let store = self.manager.store();
        let until = store
            .now()
            .plus_millis(u64::try_from(after.as_millis()).unwrap_or(u64::MAX));
        Ok(self
            .manager
            .submit(SubmitRequest {
                spec,
                initial_checkpoint: marker,
                not_before: Some(until),
                ..SubmitRequest::default()
            })
            .await?)
    }

    /// Runs `work` on this tool in a task of its own, and awaits it: a caller that stops
    /// waiting (its future dropped) leaves it to finish — a hand-off, say, whose run is
    /// adopted, submitted and dispatched, or else stopped, never left between.
    pub(super) async fn detached<T, F, Fut>(&self, work: F) -> Result<T, ManagedError>
    where
        F: FnOnce(Self) -> Fut,
        Fut: Future<Output = Result<T, ManagedError>> + Send + 'static,
        T: Send + 'static,
    {
        match tokio::spawn(work(self.clone())).await {
            Ok(result) => result,
            Err(join) if join.is_panic() => std::panic::resume_unwind(join.into_panic()),
            // The runtime is shutting down.
            Err(_) => Err(RuntimeError::Closed.into()),
        }
    }

    /// Runs the task's next attempt in this process, detached from the caller. A worker of
    /// this process may claim it first; either way the attempt sees this process's tables.
    /// A task that ended before it was claimed (canceled directly, by a request this
    /// process's manager did not make) leaves a run adopted for it to nobody: it is stopped.
    pub(super) fn dispatch(&self, task_id: &str) -> tokio::task::JoinHandle<bool> {
        let manager = self.manager.clone();
        let live = Arc::clone(self.tools.live());
        let id = task_id.to_owned();
        tokio::spawn(async move {
            match manager.execute(&id).await {
                Ok(_) => true,
                Err(e) => {
                    tracing::debug!(task = %id, error = %e, "dispatch of a managed task");
                    let ended = manager.get(&id).await.is_ok_and(|task| task.is_terminal());
                    if let Some(run) = ended.then(|| live.take_adopted(&id)).flatten() {
                        if let Err(e) = run.stop().await {
                            tracing::warn!(task = %id, error = %e, "the canceled task's operation was not stopped");
                        }
                    }
                    false
                }
            }
        })
    }
}
