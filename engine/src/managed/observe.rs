//! Observing a tool's run, shared by the foreground call (attempt 0, nothing persisted) and the
//! background executors: wait for the outcome while taking the run's updates, let the caller's
//! own event (a control, the foreground timer, the caller going away) interrupt the
//! observation, drain the updates after the outcome within [`UPDATE_DRAIN_TIMEOUT`], check each
//! update (the stream's errors, the bounds, the event-id rule) before its side records it, and
//! check the outcome against the layer's rules.
//!
//! What a side does with a checked update is its own: the background persists it as a journal
//! update event, the foreground deduplicates it in memory. Both feed the output materializer
//! through one [`MaterializerFeed`].

use super::codec::{InputRequest, ManagedCheckpoint};
use super::error::{RuleViolation, ToolFailure, UpdateError};
use super::registry::Registration;
use super::tool::{OutputMaterializer, Run, RunOutcome, Update, UpdateStream};
use futures::StreamExt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

/// How long the update stream may stay open after the run's outcome: the time spent waiting
/// on the stream for its next update or its end — not the time the updates take to be kept
/// (a synced append each), which grows with their number, not with the tool.
pub const UPDATE_DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// Why an update ended the observation, before the side saw it.
#[derive(Debug, thiserror::Error)]
pub(crate) enum UpdateFailure {
    /// The update broke a bound.
    #[error(transparent)]
    Bounds(UpdateError),
    /// The stream failed, an event id is missing or conflicts, the materializer failed, or the
    /// stream stayed open after the outcome.
    #[error(transparent)]
    Rule(RuleViolation),
}

impl From<RuleViolation> for UpdateFailure {
    fn from(violation: RuleViolation) -> Self {
        Self::Rule(violation)
    }
}

/// Where one side records the checked updates of a run.
pub(crate) trait UpdateSink: Send {
    /// The side's error; the observer's own update failures convert into it.
    type Error: From<UpdateFailure> + Send;

    /// Records one checked update (bounds kept, an event id where the rule needs one).
    fn accept(&mut self, update: Update) -> impl Future<Output = Result<(), Self::Error>> + Send;
}

/// What ended an observation.
pub(crate) enum Observed<E> {
    /// The run's outcome (a failed wait is a failed outcome), its updates drained.
    Outcome(RunOutcome),
    /// The caller's event came first; the run goes on, and its update stream is dropped.
    Event(E),
}

/// Observes `run` until its outcome or `event`, whichever comes first — the outcome when both
/// are there (a run that ended as its foreground timer fired ended, it did not time out) —
/// handing each update of `updates` to `sink` once checked. A recoverable tool's updates need
/// an event id.
///
/// # Errors
/// The first update that fails (a stream error, a broken bound, a missing event id, the
/// sink's own error), or an update stream still open [`UPDATE_DRAIN_TIMEOUT`] after the
/// outcome.
pub(crate) async fn observe<S: UpdateSink, E>(
    run: &Arc<dyn Run>,
    mut updates: Option<UpdateStream>,
    recoverable: bool,
    sink: &mut S,
    event: impl Future<Output = E>,
) -> Result<Observed<E>, S::Error> {
    let waiter = Arc::clone(run);
    let wait = async move { waiter.wait().await };
    tokio::pin!(wait);
    tokio::pin!(event);
    let outcome = loop {
        // The outcome first: a run that ended as the caller's event came (its foreground
        // timer firing at the same instant, say) ended — it is not interrupted.
        tokio::select! {
            biased;
            outcome = &mut wait => break outcome,
            event = &mut event => {
                // The run may have ended between the two polls: its outcome still wins.
                match futures::FutureExt::now_or_never(&mut wait) {
                    Some(outcome) => break outcome,
                    None => return Ok(Observed::Event(event)),
                }
            }
            item = next_update(&mut updates) => match item {
                Some(item) => take(sink, item, recoverable).await?,
                None => updates = None,
            },
        }
    };
    if let Some(stream) = updates.as_mut() {
        // The stream's own time only: a command that printed 100,000 lines closes its
        // stream at once, however long its updates take to append.
        let mut left = UPDATE_DRAIN_TIMEOUT;
        loop {
            let asked = tokio::time::Instant::now();
            let Ok(item) = tokio::time::timeout(left, stream.next()).await else {
                return Err(UpdateFailure::Rule(RuleViolation::UpdateStreamOpen).into());
            };
            left = left.saturating_sub(asked.elapsed());
            match item {
                Some(item) => take(sink, item, recoverable).await?,
                None => break,
            }
        }
    }
    Ok(Observed::Outcome(
        outcome.unwrap_or_else(|e| RunOutcome::Failed(e.to_string())),
    ))
}

async fn next_update(updates: &mut Option<UpdateStream>) -> Option<Result<Update, ToolFailure>> {
    match updates.as_mut() {
        Some(stream) => stream.next().await,
        None => std::future::pending().await,
    }
}

/// Checks one item of the update stream and hands it to the sink.
async fn take<S: UpdateSink>(
    sink: &mut S,
    item: Result<Update, ToolFailure>,
    recoverable: bool,
) -> Result<(), S::Error> {
    let update = item.map_err(|e| UpdateFailure::Rule(RuleViolation::UpdateStream(e)))?;
    update.validate().map_err(UpdateFailure::Bounds)?;
    if recoverable && update.event_id.is_empty() {
        return Err(UpdateFailure::Rule(RuleViolation::MissingEventId).into());
    }
    sink.accept(update).await
}

/// A run's outcome that keeps the layer's rules.
#[derive(Debug)]
pub(crate) enum CheckedOutcome {
    /// Completed with result data.
    Completed(Vec<u8>),
    /// Failed with a non-empty error.
    Failed(String),
    /// Canceled (the reason may be empty).
    Canceled(String),
    /// To be recovered after `after`, from the started marker `checkpoint` (encoded).
    CheckBackIn {
        /// The encoded managed checkpoint: started, with the tool checkpoint to recover from.
        checkpoint: Vec<u8>,
        /// How long to wait.
        after: std::time::Duration,
    },
    /// Waiting for input, with the checkpoint that keeps the request.
    WaitingInput {
        /// What is asked.
        request: InputRequest,
        /// The tool checkpoint to resume from (the outcome's replacement, else the current
        /// one).
        tool_checkpoint: Vec<u8>,
        /// The encoded managed checkpoint (within its bounds).
        checkpoint: Vec<u8>,
    },
}

/// Checks `outcome` against the rules: a failure needs an error; only a recoverable tool may
/// check back later; only a resumable tool may
/// wait for input, and its wait must fit a managed checkpoint (`tool_checkpoint` is the one
/// the run started from, kept when the outcome supplies none).
///
/// # Errors
/// [`RuleViolation::EmptyFailure`], [`RuleViolation::NotResumable`],
/// [`RuleViolation::WaitingCheckpoint`].
pub(crate) fn check_outcome(
    outcome: RunOutcome,
    registration: &Registration,
    tool_checkpoint: Vec<u8>,
) -> Result<CheckedOutcome, RuleViolation> {
    match outcome {
        RunOutcome::Completed(data) => Ok(CheckedOutcome::Completed(data)),
        RunOutcome::Failed(error) if error.is_empty() => Err(RuleViolation::EmptyFailure),
        RunOutcome::Failed(error) => Ok(CheckedOutcome::Failed(error)),
        RunOutcome::Canceled(reason) => Ok(CheckedOutcome::Canceled(reason)),
        RunOutcome::CheckBackIn { checkpoint, after } => {
            if !registration.is_recoverable() {
                return Err(RuleViolation::NotRecoverable);
            }
            let tool_checkpoint = if checkpoint.is_empty() {
                tool_checkpoint
            } else {
                checkpoint
            };
            let marker = ManagedCheckpoint::started(tool_checkpoint)
                .encode()
                .map_err(RuleViolation::WaitingCheckpoint)?;
            Ok(CheckedOutcome::CheckBackIn {
                checkpoint: marker,
                after,
            })
        }
        RunOutcome::WaitingInput {
            request,
            checkpoint,
        } => {
            if registration.tool.as_resumable().is_none() {
                return Err(RuleViolation::NotResumable);
            }
            let waiting = ManagedCheckpoint::waiting(request.clone(), checkpoint, tool_checkpoint);
            let encoded = waiting.encode().map_err(RuleViolation::WaitingCheckpoint)?;
            Ok(CheckedOutcome::WaitingInput {
                request,
                tool_checkpoint: waiting.tool_checkpoint,
                checkpoint: encoded,
            })
        }
    }
}

/// Feeds a task's updates to the registration's output materializer: only updates with a
/// caller-supplied event id, and only while a path is reserved and the feed is on.
pub(crate) struct MaterializerFeed {
    materializer: Option<Arc<dyn OutputMaterializer>>,
    task_id: String,
    path: String,
}

impl MaterializerFeed {
    /// The feed of `task_id`'s transcript at `path` (off without a materializer or a path).
    pub(crate) fn new(registration: &Registration, task_id: &str, path: &str) -> Self {
        Self {
            materializer: registration
                .materializer
                .clone()
                .filter(|_| !path.is_empty()),
            task_id: task_id.to_owned(),
            path: path.to_owned(),
        }
    }

    /// Turns the feed off.
    pub(crate) fn stop(&mut self) {
        self.materializer = None;
    }

    /// Whether updates are fed.
    pub(crate) fn is_on(&self) -> bool {
        self.materializer.is_some()
    }

    /// Appends one update's data (nothing when the feed is off or `event_id` is empty).
    ///
    /// # Errors
    /// The materializer's error.
    pub(crate) async fn append(&self, event_id: &str, data: &[u8]) -> Result<(), ToolFailure> {
        match &self.materializer {
            Some(materializer) if !event_id.is_empty() => {
                materializer
                    .append_output(&self.task_id, event_id, &self.path, data)
                    .await
            }
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::managed::tool::Update;
    use std::time::Duration;

    /// A run that ends at once; its stream's updates come only after its outcome.
    struct Ended {
        done: tokio::sync::watch::Sender<bool>,
    }

    #[async_trait::async_trait]
    impl Run for Ended {
        async fn wait(&self) -> Result<RunOutcome, crate::managed::ToolRunError> {
            self.done.send_replace(true);
            Ok(RunOutcome::Completed(b"ok".to_vec()))
        }

        async fn stop(&self) -> Result<(), crate::managed::ToolRunError> {
            Ok(())
        }
    }

    /// A store that takes a second to keep each update.
    struct Slow(Vec<Update>);

    impl UpdateSink for Slow {
        type Error = UpdateFailure;

        async fn accept(&mut self, update: Update) -> Result<(), UpdateFailure> {
            tokio::time::sleep(Duration::from_secs(1)).await;
            self.0.push(update);
            Ok(())
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_drain_counts_the_streams_time_not_the_stores() {
        let (done, mut ended) = tokio::sync::watch::channel(false);
        let run: Arc<dyn Run> = Arc::new(Ended { done });
        // Ten updates, ready as soon as the run has ended: ten seconds for the store to
        // keep them, none for the stream to give them.
        let updates = futures::stream::once(async move {
            let _ = ended.wait_for(|ended| *ended).await;
            futures::stream::iter((0..10).map(|i| {
                Ok(Update {
                    event_id: format!("e{i}"),
                    kind: "stdout".into(),
                    data: vec![b'x'],
                    metadata: std::collections::BTreeMap::new(),
                })
            }))
        })
        .flatten();
        let mut sink = Slow(Vec::new());
        let observed = observe(
            &run,
            Some(Box::pin(updates)),
            true,
            &mut sink,
            std::future::pending::<()>(),
        )
        .await;
        assert!(
            matches!(observed, Ok(Observed::Outcome(RunOutcome::Completed(_)))),
            "the drain was cut short"
        );
        assert_eq!(sink.0.len(), 10);
    }
}
