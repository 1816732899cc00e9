//! The recovery conformance kit (docs/managed-tools.md, "Recovery conformance kit"): a healthy
//! tool passes, and each kind of broken tool is caught with its own error. The shipped shell
//! tool passes against its real backend (detached processes and files). With an answer, the
//! kit's resume scenarios (resume, then the same resume replayed) catch each broken resumable
//! tool too.
#![allow(clippy::unwrap_used)]

use async_trait::async_trait;
use dtask_engine::managed::conformance::{
    check_recovery_conformance, compare_histories, ConformanceBackend, ConformanceCase,
    ConformanceError, OperationSnapshot,
};
use dtask_engine::managed::tools::ShellTool;
use dtask_engine::managed::{
    BackgroundTool, InputRequest, RecoverRequest, RecoverableTool, ResumableTool, ResumeRequest,
    Run, RunOutcome, StartRequest, StartResult, ToolFailure, ToolRunError, Update,
};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// How the tool under test misbehaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Fault {
    #[default]
    None,
    NilTool,
    Validate,
    FirstStart,
    SnapshotFails,
    NewOperationOnDuplicate,
    DuplicateStartFails,
    DuplicateCheckpoint,
    RecoverFails,
    LosesRecords,
    ChangesBytes,
    StopFails,
    EmptyOperationId,
    // The input path of a resumable tool.
    NotWaiting,
    WaitKeepsCheckpoint,
    ResumeRejects,
    ReplayRejected,
    ReplayNewOperation,
    ResumeLosesRecords,
}

/// An external backend: operations by task id, each with an id and an update history.
#[derive(Default)]
struct Backend {
    fault: Fault,
    /// The operation asks for input (its runs wait for it until resumed).
    resumable: bool,
    operations: Mutex<HashMap<String, OperationSnapshot>>,
    starts: Mutex<usize>,
    recovered_checkpoints: Mutex<Vec<Vec<u8>>>,
    resumes: Mutex<Vec<ResumeRequest>>,
}

struct Tool(Arc<Backend>);

/// A run of the operation; `waiting` runs end waiting for input.
struct Handle(Arc<Backend>, bool);

impl Handle {
    fn run(backend: &Arc<Backend>) -> Arc<dyn Run> {
        let waiting = backend.resumable && backend.fault != Fault::NotWaiting;
        Arc::new(Handle(Arc::clone(backend), waiting))
    }
}

#[async_trait]
impl Run for Handle {
    async fn wait(&self) -> Result<RunOutcome, ToolRunError> {
        if self.1 {
            let checkpoint = if self.0.fault == Fault::WaitKeepsCheckpoint {
                Vec::new()
            } else {
                b"waiting-cp".to_vec()
            };
            return Ok(RunOutcome::WaitingInput {
                request: InputRequest {
                    id: "approval".into(),
                    data: Some(serde_json::json!({"question": "go?"})),
                },
                checkpoint,
            });
        }
        Ok(RunOutcome::Completed(vec![]))
    }
    async fn stop(&self) -> Result<(), ToolRunError> {
        if self.0.fault == Fault::StopFails {
            return Err(ToolRunError::failed("stop unavailable"));
        }
        Ok(())
    }
}

fn upd(id: &str, data: &[u8]) -> Update {
    Update {
        event_id: id.into(),
        data: data.to_vec(),
        ..Update::default()
    }
}

#[async_trait]
impl BackgroundTool for Tool {
    fn validate_arguments(&self, _arguments: &str) -> Result<(), ToolFailure> {
        if self.0.fault == Fault::Validate {
            return Err("bad".into());
        }
        Ok(())
    }

    async fn start(&self, request: StartRequest) -> Result<StartResult, ToolRunError> {
        let b = &self.0;
        let n = {
            let mut starts = b.starts.lock().unwrap();
            *starts += 1;
            *starts
        };
        match (b.fault, n) {
            (Fault::FirstStart, 1) | (Fault::DuplicateStartFails, 2) => {
                return Err(ToolRunError::failed("backend down"))
            }
            _ => {}
        }
        let mut ops = b.operations.lock().unwrap();
        let fresh = b.fault == Fault::NewOperationOnDuplicate;
        let op = ops
            .entry(request.task_id.clone())
            .or_insert_with(|| OperationSnapshot {
                operation_id: if b.fault == Fault::EmptyOperationId {
                    String::new()
                } else {
                    "op-1".into()
                },
                updates: vec![upd("u1", b"one"), upd("u2", b"two")],
            });
        if fresh && n == 2 {
            op.operation_id = "op-2".into();
        }
        let checkpoint = if b.fault == Fault::DuplicateCheckpoint && n == 2 {
            b"other".to_vec()
        } else {
            br#"{"run_id":"business-run"}"#.to_vec()
        };
        Ok(StartResult {
            run: Handle::run(b),
            checkpoint,
        })
    }

    fn as_recoverable(&self) -> Option<&dyn RecoverableTool> {
        Some(self)
    }

    fn as_resumable(&self) -> Option<&dyn ResumableTool> {
        self.0.resumable.then_some(self as &dyn ResumableTool)
    }
}

#[async_trait]
impl ResumableTool for Tool {
    async fn resume(&self, request: ResumeRequest) -> Result<Arc<dyn Run>, ToolRunError> {
        let b = &self.0;
        let n = {
            let mut resumes = b.resumes.lock().unwrap();
            resumes.push(request.clone());
            resumes.len()
        };
        if request.data != b"\"yes\"" || (b.fault == Fault::ResumeRejects && n == 1) {
            return Err(ToolRunError::InputRejected("answer yes".into()));
        }
        let mut ops = b.operations.lock().unwrap();
        let op = ops.get_mut(&request.task_id).unwrap();
        match (b.fault, n) {
            (Fault::ReplayRejected, 2) => {
                return Err(ToolRunError::InputRejected("already answered".into()))
            }
            (Fault::ReplayNewOperation, 2) => op.operation_id = "op-3".into(),
            (Fault::ResumeLosesRecords, 1) => op.updates.clear(),
            // The answer is applied once, by request id: a replay changes nothing.
            (_, 1) => op.updates.push(upd("answer", b"yes")),
            _ => {}
        }
        Ok(Arc::new(Handle(Arc::clone(b), false)))
    }
}

#[async_trait]
impl RecoverableTool for Tool {
    async fn recover(&self, request: RecoverRequest) -> Result<Arc<dyn Run>, ToolRunError> {
        let b = &self.0;
        if b.fault == Fault::RecoverFails {
            return Err(ToolRunError::failed("lost"));
        }
        b.recovered_checkpoints
            .lock()
            .unwrap()
            .push(request.checkpoint.clone());
        let mut ops = b.operations.lock().unwrap();
        let op = ops.get_mut(&request.task_id).unwrap();
        match b.fault {
            Fault::LosesRecords => {
                op.updates.pop();
            }
            Fault::ChangesBytes => op.updates[1].data = b"TWO".to_vec(),
            _ => op.updates.push(upd("u3", b"three")),
        }
        Ok(Handle::run(b))
    }
}

struct Shared(Arc<Backend>);

#[async_trait]
impl ConformanceBackend for Shared {
    fn new_tool(&self) -> Option<Arc<dyn BackgroundTool>> {
        if self.0.fault == Fault::NilTool {
            return None;
        }
        Some(Arc::new(Tool(Arc::clone(&self.0))))
    }

    async fn snapshot(&self, task_id: &str) -> Result<OperationSnapshot, ToolFailure> {
        if self.0.fault == Fault::SnapshotFails {
            return Err("unreachable".into());
        }
        self.0
            .operations
            .lock()
            .unwrap()
            .get(task_id)
            .cloned()
            .ok_or_else(|| "no operation".into())
    }
}

async fn check(fault: Fault) -> (Result<(), ConformanceError>, Arc<Backend>) {
    let backend = Arc::new(Backend {
        fault,
        ..Backend::default()
    });
    let result = check_recovery_conformance(
        &Shared(Arc::clone(&backend)),
        &ConformanceCase::new("t1", "{}"),
    )
    .await;
    (result, backend)
}

#[tokio::test]
async fn a_healthy_tool_passes_and_recover_gets_the_start_checkpoint_bytes() {
    let (result, backend) = check(Fault::None).await;
    result.unwrap();
    assert_eq!(*backend.starts.lock().unwrap(), 2, "A and B both started");
    assert_eq!(
        *backend.recovered_checkpoints.lock().unwrap(),
        [br#"{"run_id":"business-run"}"#.to_vec()]
    );
}

#[tokio::test]
async fn each_broken_tool_is_caught_with_its_own_error() {
    let cases = [
        (Fault::NilTool, "recovery factory returned nil"),
        (Fault::Validate, "validate conformance arguments"),
        (Fault::FirstStart, "first start"),
        (Fault::SnapshotFails, "snapshot after first start"),
        (Fault::EmptyOperationId, "empty operation id"),
        (Fault::DuplicateStartFails, "duplicate start"),
        (
            Fault::DuplicateCheckpoint,
            "duplicate start changed checkpoint",
        ),
        (Fault::NewOperationOnDuplicate, "logical operation changed"),
        (Fault::RecoverFails, "recover"),
        (Fault::LosesRecords, "lost records"),
        (
            Fault::ChangesBytes,
            "did not preserve event identity and bytes",
        ),
        (Fault::StopFails, "stop recovered operation"),
    ];
    for (fault, message) in cases {
        let (result, _) = check(fault).await;
        let err = result.expect_err(&format!("{fault:?} must fail"));
        assert!(err.to_string().contains(message), "{fault:?}: {err}");
    }
}

#[tokio::test]
async fn an_incomplete_case_is_refused() {
    let backend = Shared(Arc::new(Backend::default()));
    let err = check_recovery_conformance(&backend, &ConformanceCase::new("", ""))
        .await
        .unwrap_err();
    assert_eq!(err, ConformanceError::Config);
}

#[test]
fn histories_compare_by_event_identity_and_bytes() {
    let before = [upd("a", b"1"), upd("b", b"2")];
    assert!(compare_histories(&before, &[upd("a", b"1"), upd("b", b"2"), upd("c", b"3")]).is_ok());
    assert!(matches!(
        compare_histories(&before, &[upd("a", b"1")]),
        Err(ConformanceError::LostRecords { .. })
    ));
    assert!(matches!(
        compare_histories(&before, &[upd("a", b"1"), upd("b", b"X")]),
        Err(ConformanceError::EventIdentity { index: 1 })
    ));
    assert!(matches!(
        compare_histories(&[upd("", b"1")], &[upd("", b"1")]),
        Err(ConformanceError::EventIdentity { index: 0 })
    ));
}

struct Shell(std::path::PathBuf);

#[async_trait]
impl ConformanceBackend for Shell {
    fn new_tool(&self) -> Option<Arc<dyn BackgroundTool>> {
        Some(Arc::new(ShellTool::new(&self.0)))
    }

    async fn snapshot(&self, task_id: &str) -> Result<OperationSnapshot, ToolFailure> {
        ShellTool::new(&self.0).snapshot(task_id)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shell_tool_is_recovery_conformant() {
    let dir = tempfile::tempdir().unwrap();
    let backend = Shell(dir.path().to_path_buf());
    let case = ConformanceCase::new("task-1", r#"{"command":"echo one; echo two; sleep 1"}"#);
    check_recovery_conformance(&backend, &case).await.unwrap();
}

async fn check_resumable(
    fault: Fault,
    answer: &[u8],
) -> (Result<(), ConformanceError>, Arc<Backend>) {
    let backend = Arc::new(Backend {
        fault,
        resumable: true,
        ..Backend::default()
    });
    let result = check_recovery_conformance(
        &Shared(Arc::clone(&backend)),
        &ConformanceCase::new("t1", "{}").with_answer(answer),
    )
    .await;
    (result, backend)
}

// The resume scenarios: the recovered run waits; the answer is resumed at attempt 3 with the
// waiting checkpoint, then replayed identically at attempt 4; a tool that applies it once
// passes.
#[tokio::test]
async fn a_resumable_tool_passes_the_resume_and_replayed_resume() {
    let (result, backend) = check_resumable(Fault::None, b"\"yes\"").await;
    result.unwrap();
    let resumes = backend.resumes.lock().unwrap().clone();
    assert_eq!(resumes.len(), 2, "a resume and its replay");
    assert_eq!(resumes[0].attempt, 3);
    assert_eq!(resumes[1].attempt, 4);
    for resume in &resumes {
        assert_eq!(resume.task_id, "t1");
        assert_eq!(resume.request_id, "approval");
        assert_eq!(resume.data, b"\"yes\"");
        assert_eq!(resume.checkpoint, b"waiting-cp");
    }
    // A wait that keeps the checkpoint resumes from the start checkpoint.
    let (result, backend) = check_resumable(Fault::WaitKeepsCheckpoint, b"\"yes\"").await;
    result.unwrap();
    assert!(backend
        .resumes
        .lock()
        .unwrap()
        .iter()
        .all(|r| r.checkpoint == br#"{"run_id":"business-run"}"#));
}

#[tokio::test]
async fn each_broken_resume_is_caught_with_its_own_error() {
    let cases = [
        (Fault::NotWaiting, "recovered run did not wait for input"),
        (Fault::ResumeRejects, "resume: resume input rejected"),
        (
            Fault::ReplayRejected,
            "replayed resume: resume input rejected",
        ),
        (Fault::ReplayNewOperation, "logical operation changed"),
        (Fault::ResumeLosesRecords, "lost records"),
        (Fault::StopFails, "stop recovered operation"),
    ];
    for (fault, message) in cases {
        let (result, _) = check_resumable(fault, b"\"yes\"").await;
        let err = result.expect_err(&format!("{fault:?} must fail"));
        assert!(err.to_string().contains(message), "{fault:?}: {err}");
    }
    // An answer the tool refuses fails the resume; without the replay.
    let (result, backend) = check_resumable(Fault::None, b"\"no\"").await;
    assert!(
        matches!(result, Err(ConformanceError::Resume(_))),
        "{result:?}"
    );
    assert_eq!(backend.resumes.lock().unwrap().len(), 1);
    // A case with an answer needs a resumable tool.
    let backend = Shared(Arc::new(Backend::default()));
    let err = check_recovery_conformance(
        &backend,
        &ConformanceCase::new("t1", "{}").with_answer(b"\"yes\"".to_vec()),
    )
    .await
    .unwrap_err();
    assert_eq!(err, ConformanceError::NotResumable);
}
