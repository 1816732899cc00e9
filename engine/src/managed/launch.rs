//! The explicit-background launch: a call its policy sends to the background at once is
//! submitted as a task, its first attempt dispatched in this process, and the caller waits in
//! a start window (forwarding first emissions to a streaming caller) before it is answered
//! with the task's launch result.

use super::call::{CallOutcome, ManagedTool, Records, DEFAULT_FOREGROUND_TIMEOUT};
use super::envelope::ResponseEvent;
use super::error::ManagedError;
use super::live::PROJECTION_BUFFER;
use super::result::ToolResult;
use crate::runtime::SubmitRequest;
use dtask_journal::TaskSpec;
use tokio::sync::mpsc;

impl ManagedTool {
    /// Explicit background: submit, dispatch, and hold a start window open — until the start
    /// boundary (a call) or the attempt's end (a stream, which forwards first emissions
    /// meanwhile), bounded by the foreground time — then answer with the task's launch result.
    pub(super) async fn launch_background(
        &self,
        spec: TaskSpec,
        records: Option<&Records>,
    ) -> Result<CallOutcome, ManagedError> {
        let live = self.tools.live();
        let id = spec.id.clone();
        let mut projection = None;
        if records.is_some() {
            let (tx, rx) = mpsc::channel(PROJECTION_BUFFER);
            if !live.project(&id, tx) {
                return Err(ManagedError::AlreadyProjected { task_id: id });
            }
            projection = Some(rx);
        }
        let mut window = live.open_window(&id);
        let submitted = match self
            .manager
            .submit(SubmitRequest {
                spec,
                ..SubmitRequest::default()
            })
            .await
        {
            Ok(task) => task,
            Err(e) => {
                live.detach(&id);
                live.close_window(&id);
                return Err(e.into());
            }
        };
        let mut attempt = self.dispatch(&id);
        let mut attempt_done = false;
        let limit = self
            .config
            .foreground_timeout
            .unwrap_or(DEFAULT_FOREGROUND_TIMEOUT);
        let timer = async {
            if limit.is_zero() {
                std::future::pending::<()>().await;
            } else {
                tokio::time::sleep(limit).await;
            }
        };
        tokio::pin!(timer);
        match (records, projection.as_mut()) {
            (Some(records), Some(rx)) => {
                let end = self.manager.wait(&id);
                tokio::pin!(end);
                loop {
                    tokio::select! {
                        update = rx.recv() => match update {
                            Some(update) => {
                                let _ = records.send(Ok(ToolResult::record(ResponseEvent::update(&update)))).await;
                            }
                            None => break,
                        },
                        _ = &mut end => break,
                        ran = &mut attempt, if !attempt_done => {
                            attempt_done = true;
                            // An attempt of this dispatch ended (a yield, say); a lost race
                            // means another attempt of this process runs it: keep watching.
                            if ran.unwrap_or(false) {
                                break;
                            }
                        }
                        () = &mut timer => break,
                        () = records.closed() => break,
                    }
                }
                live.detach(&id);
                while let Ok(update) = rx.try_recv() {
                    let _ = records
                        .send(Ok(ToolResult::record(ResponseEvent::update(&update))))
                        .await;
                }
            }
            _ => {
                tokio::select! {
                    _ = window.wait_for(|started| *started) => {}
                    // The dispatched attempt ended before its start boundary (it failed, or
                    // another attempt of this process runs the task).
                    _ = &mut attempt => {}
                    () = &mut timer => {}
                }
            }
        }
        live.close_window(&id);
        let task = self.manager.get(&id).await.unwrap_or(submitted);
        Ok(CallOutcome::Done(self.launch_result(&task)?))
    }
}
