//! The foreground attempt of a call (attempt 0): started — or resumed after an interrupt — in
//! the caller's call, observed through the shared run observer with updates checked and
//! deduplicated in memory (nothing is persisted), until the run's outcome, the foreground
//! timer, or the caller going away.

use super::call::{failed_foreground, CallOptions, CallOutcome, ManagedTool, Records};
use super::envelope::{ResponseEvent, ResultStatus};
use super::error::{ManagedError, RuleViolation, ToolRunError};
use super::interrupt::{Interrupt, InterruptStage, InterruptState, InterruptStateError};
use super::observe::{
    check_outcome, observe, CheckedOutcome, MaterializerFeed, Observed, UpdateFailure, UpdateSink,
};
use super::result::ToolResult;
use super::submit::build_spec;
use super::tool::{PreparerResume, ResumeRequest, Run, RunOutcome, StartRequest, Update};
use dtask_journal::TaskSpec;
use std::collections::HashMap;
use std::sync::Arc;

/// The live foreground attempt of one call.
pub(super) struct Foreground {
    pub(super) spec: TaskSpec,
    pub(super) arguments: String,
    pub(super) run: Arc<dyn Run>,
    pub(super) tool_checkpoint: Vec<u8>,
    pub(super) started: tokio::time::Instant,
}

/// Stops a run if the call is dropped while it owns it (a caller that goes away).
struct StopOnDrop(Option<Arc<dyn Run>>);

impl StopOnDrop {
    fn disarm(&mut self) {
        self.0 = None;
    }
}

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        if let Some(run) = self.0.take() {
            if let Ok(handle) = tokio::runtime::Handle::try_current() {
                handle.spawn(async move {
                    let _ = run.stop().await;
                });
            }
        }
    }
}

/// What interrupted a foreground observation.
enum Interruption {
    /// The foreground time ran out.
    TimedOut,
    /// The streaming caller went away.
    Abandoned,
}

impl ManagedTool {
    /// Starts the foreground attempt 0 of a call whose spec is built but not persisted. A
    /// start error is a model-visible failure, the same record for a call and a stream.
    pub(super) async fn start_foreground(
        &self,
        spec: TaskSpec,
        arguments: String,
        options: &CallOptions,
        records: Option<Records>,
    ) -> Result<CallOutcome, ManagedError> {
        let started = self
            .registration
            .tool
            .start(StartRequest {
                task_id: spec.id.clone(),
                arguments: arguments.clone(),
                attempt: 0,
            })
            .await;
        let started = match started {
            Ok(started) => started,
            Err(e) => return Ok(failed_foreground(&spec.description, &e.to_string())),
        };
        if !self.registration.is_recoverable() && !started.checkpoint.is_empty() {
            let _ = started.run.stop().await;
            return Err(ManagedError::PlainToolCheckpoint { task_id: spec.id });
        }
        let foreground = Foreground {
            spec,
            arguments,
            run: started.run,
            tool_checkpoint: started.checkpoint,
            started: tokio::time::Instant::now(),
        };
        self.observe_foreground(foreground, options, records.as_ref())
            .await
    }

    /// Answers an interrupted call: the input preparer's question prepares the call again;
    /// a foreground wait for input resumes attempt 0 (a rejected answer keeps the call
    /// interrupted on the same state, a failing resume is a model-visible failure).
    pub(super) async fn drive_resume(
        &self,
        state: &InterruptState,
        answer: &[u8],
        options: &CallOptions,
        records: Option<Records>,
    ) -> Result<CallOutcome, ManagedError> {
        if state.tool_name != self.registration.info.name {
            return Err(InterruptStateError::OtherTool {
                tool: state.tool_name.clone(),
            }
            .into());
        }
        let (task_id, arguments, request, tool_checkpoint, output_file) = match &state.stage {
            InterruptStage::Prepare {
                arguments,
                state: preparer_state,
            } => {
                let resume = PreparerResume {
                    state: preparer_state.clone(),
                    answer: answer.to_vec(),
                };
                return match self.prepare(arguments, Some(resume)).await? {
                    Ok(prepared) => self.begin(prepared, options, records).await,
                    Err(interrupt) => Ok(CallOutcome::Interrupted(interrupt)),
                };
            }
            InterruptStage::Foreground {
                task_id,
                arguments,
                request,
                tool_checkpoint,
                output_file,
            } => (task_id, arguments, request, tool_checkpoint, output_file),
        };
        if task_id.is_empty() || arguments.is_empty() || request.id.is_empty() {
            return Err(InterruptStateError::Incomplete.into());
        }
        let resumable = self
            .registration
            .tool
            .as_resumable()
            .ok_or(InterruptStateError::NotResumable)?;
        let resumed = resumable
            .resume(ResumeRequest {
                task_id: task_id.clone(),
                arguments: arguments.clone(),
                attempt: 0,
                request_id: request.id.clone(),
                data: answer.to_vec(),
                checkpoint: tool_checkpoint.clone(),
            })
            .await;
        let run = match resumed {
            Ok(run) => run,
            Err(ToolRunError::InputRejected(_)) => {
                return Ok(CallOutcome::Interrupted(Interrupt {
                    info: request.data.clone().unwrap_or_default(),
                    state: state.clone(),
                }))
            }
            Err(e) => {
                return Ok(failed_foreground(
                    &self.registration.description(arguments),
                    &e.to_string(),
                ))
            }
        };
        let spec = build_spec(
            &self.registration,
            task_id.clone(),
            &self.tool_call(arguments, options),
            output_file.clone(),
        );
        let foreground = Foreground {
            spec,
            arguments: arguments.clone(),
            run,
            tool_checkpoint: tool_checkpoint.clone(),
            started: tokio::time::Instant::now(),
        };
        self.observe_foreground(foreground, options, records.as_ref())
            .await
    }

    /// Observes the foreground attempt until its outcome, its timer, or the caller's end.
    async fn observe_foreground(
        &self,
        fg: Foreground,
        options: &CallOptions,
        records: Option<&Records>,
    ) -> Result<CallOutcome, ManagedError> {
        let timeout = self.foreground_timeout(&fg.arguments, options);
        let mut guard = StopOnDrop(Some(Arc::clone(&fg.run)));
        // A streaming caller that may hand off leaves the run's single update stream to the
        // background attempt that adopts it.
        let leave_updates = records.is_some() && self.config.should_auto_background.is_some();
        let updates = if leave_updates {
            None
        } else {
            fg.run.updates()
        };
        let mut sink = MemorySink {
            seen: HashMap::new(),
            feed: MaterializerFeed::new(&self.registration, &fg.spec.id, &fg.spec.output_file),
            records,
        };
        let interruption = async {
            let timer = async {
                match timeout {
                    Some(t) => tokio::time::sleep(t).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = timer => Interruption::TimedOut,
                () = closed(records) => Interruption::Abandoned,
            }
        };
        let observed = observe(
            &fg.run,
            updates,
            self.registration.is_recoverable(),
            &mut sink,
            interruption,
        )
        .await;
        guard.disarm();
        match observed {
            Ok(Observed::Outcome(outcome)) => self.finish(&fg, outcome).await,
            Ok(Observed::Event(Interruption::TimedOut)) => {
                // Handed off or stopped in a task of its own: a caller that goes away
                // meanwhile leaves neither a run adopted without its task nor one running
                // unseen.
                let timeout = timeout.unwrap_or_default();
                self.detached(move |tool| async move { tool.timed_out(fg, timeout).await })
                    .await
            }
            Ok(Observed::Event(Interruption::Abandoned)) => {
                let _ = fg.run.stop().await;
                Err(ManagedError::Abandoned)
            }
            Err(failure) => self.update_failure(&fg, failure, records).await,
        }
    }

    /// An invalid update or update-stream failure in the foreground: the run is stopped;
    /// a call answers with a failed result, a stream ends with the error
    /// ([`ManagedError::InvalidUpdate`] for a broken bound, else
    /// [`ManagedError::InvalidOutcome`]).
    async fn update_failure(
        &self,
        fg: &Foreground,
        failure: UpdateFailure,
        records: Option<&Records>,
    ) -> Result<CallOutcome, ManagedError> {
        let _ = fg.run.stop().await;
        if records.is_some() {
            return Err(match failure {
                UpdateFailure::Bounds(e) => ManagedError::InvalidUpdate(e),
                UpdateFailure::Rule(e) => ManagedError::InvalidOutcome(e),
            });
        }
        Ok(failed_foreground(
            &fg.spec.description,
            &failure.to_string(),
        ))
    }

    /// The foreground outcome: an interrupt, or the foreground result.
    async fn finish(
        &self,
        fg: &Foreground,
        outcome: RunOutcome,
    ) -> Result<CallOutcome, ManagedError> {
        let description = &fg.spec.description;
        let record = |status| {
            Ok(CallOutcome::Done(ToolResult::record(
                ResponseEvent::foreground_result(description, status),
            )))
        };
        match check_outcome(outcome, &self.registration, fg.tool_checkpoint.clone()) {
            Ok(CheckedOutcome::WaitingInput {
                request,
                tool_checkpoint,
                ..
            }) => Ok(CallOutcome::Interrupted(Interrupt {
                info: request.data.clone().unwrap_or_default(),
                state: InterruptState {
                    tool_name: self.registration.info.name.clone(),
                    stage: InterruptStage::Foreground {
                        task_id: fg.spec.id.clone(),
                        arguments: fg.arguments.clone(),
                        request,
                        tool_checkpoint,
                        output_file: fg.spec.output_file.clone(),
                    },
                },
            })),
            Ok(CheckedOutcome::CheckBackIn { checkpoint, after }) => {
                // Submitted in a task of its own: the operation goes on without a run, and a
                // caller that goes away must not leave it without its task.
                let spec = fg.spec.clone();
                let task = self
                    .detached(move |tool| async move {
                        tool.check_back_in(spec, checkpoint, after).await
                    })
                    .await?;
                Ok(CallOutcome::Done(self.launch_result(&task)?))
            }
            Ok(CheckedOutcome::Failed(error)) => record(ResultStatus::Failed { error }),
            Ok(CheckedOutcome::Canceled(error)) => record(ResultStatus::Canceled { error }),
            Ok(CheckedOutcome::Completed(data)) => Ok(CallOutcome::Done(self.completed(
                &fg.spec,
                &data,
                ResponseEvent::foreground_result(description, ResultStatus::completed(&data)),
            )?)),
            Err(RuleViolation::NotResumable) => record(ResultStatus::Failed {
                error: "foreground waiting-input requires a resumable tool".into(),
            }),
            Err(RuleViolation::NotRecoverable) => record(ResultStatus::Failed {
                error: "checking back later requires a recoverable tool".into(),
            }),
            Err(violation) => Err(ManagedError::InvalidOutcome(violation)),
        }
    }
}

/// Records the updates of a foreground attempt in memory: deduplicated by event id (the same
/// bytes again are dropped, other bytes are a conflict), fed to the materializer, and shown to
/// a streaming caller on their first sighting. Nothing is persisted.
struct MemorySink<'a> {
    seen: HashMap<String, Vec<u8>>,
    feed: MaterializerFeed,
    records: Option<&'a Records>,
}

impl UpdateSink for MemorySink<'_> {
    type Error = UpdateFailure;

    async fn accept(&mut self, update: Update) -> Result<(), UpdateFailure> {
        if !update.event_id.is_empty() {
            match self.seen.get(&update.event_id) {
                Some(data) if *data == update.data => return Ok(()),
                Some(_) => {
                    return Err(RuleViolation::EventIdConflict {
                        event_id: update.event_id,
                    }
                    .into())
                }
                None => {
                    self.seen
                        .insert(update.event_id.clone(), update.data.clone());
                }
            }
            self.feed
                .append(&update.event_id, &update.data)
                .await
                .map_err(RuleViolation::Materialize)?;
        }
        if let Some(records) = self.records {
            let _ = records
                .send(Ok(ToolResult::record(ResponseEvent::update(&update))))
                .await;
        }
        Ok(())
    }
}

async fn closed(records: Option<&Records>) {
    match records {
        Some(records) => records.closed().await,
        None => std::future::pending().await,
    }
}
