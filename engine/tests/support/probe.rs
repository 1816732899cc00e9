//! A scriptable managed tool that records every call made to it: the test double of a
//! tool (never of the journal, which is always real).
#![allow(dead_code, clippy::unwrap_used, clippy::missing_panics_doc)]

use async_trait::async_trait;
use dtask_engine::managed::{
    AdoptRequest, AdoptResult, BackgroundTool, ForegroundHandoffTool, InputPreparer,
    OutputMaterializer, PrepareRequest, Prepared, RecoverRequest, RecoverableTool, ResumableTool,
    ResumeRequest, Run, RunOutcome, StartRequest, StartResult, ToolFailure, ToolRunError, Update,
    UpdateStream,
};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Everything the tool was asked.
#[derive(Debug, Default, Clone)]
pub struct Calls {
    pub starts: Vec<StartRequest>,
    pub recovers: Vec<RecoverRequest>,
    pub resumes: Vec<ResumeRequest>,
    pub prepares: Vec<PrepareRequest>,
    pub adopts: usize,
    pub waits: usize,
    pub stops: usize,
}

/// What a run does.
#[derive(Clone)]
pub struct Script {
    /// Updates emitted before the outcome.
    pub updates: Vec<Update>,
    /// A delay before the updates are emitted.
    pub update_delay: Option<Duration>,
    /// The outcome; `None` blocks until stopped (then canceled).
    pub outcome: Option<RunOutcome>,
    /// The update stream never ends.
    pub never_close: bool,
}

impl Script {
    pub fn complete(data: &[u8]) -> Self {
        Self {
            updates: vec![],
            update_delay: None,
            outcome: Some(RunOutcome::Completed(data.to_vec())),
            never_close: false,
        }
    }

    pub fn block() -> Self {
        Self {
            updates: vec![],
            update_delay: None,
            outcome: None,
            never_close: false,
        }
    }

    pub fn with_updates(mut self, updates: Vec<Update>) -> Self {
        self.updates = updates;
        self
    }
}

pub type ResumeFn = Arc<dyn Fn(&ResumeRequest) -> Result<Script, ToolRunError> + Send + Sync>;
pub type PrepareFn = Arc<dyn Fn(&PrepareRequest) -> Result<Prepared, ToolFailure> + Send + Sync>;

/// The tool's capabilities and behaviour.
#[derive(Clone)]
pub struct Probe {
    pub calls: Arc<Mutex<Calls>>,
    pub recoverable: bool,
    pub handoff: bool,
    pub resume: Option<ResumeFn>,
    pub prepare: Option<PrepareFn>,
    pub script: Script,
    pub recover_script: Option<Script>,
    pub start_checkpoint: Vec<u8>,
    pub start_error: Option<String>,
    pub stop_error: Option<String>,
    pub validate_error: Option<String>,
    /// When set, a run's `wait` takes one permit before it returns its scripted outcome: the
    /// test decides when the run ends.
    pub gate: Option<Arc<tokio::sync::Semaphore>>,
    /// When set, a run's update stream takes one permit before each update: the test decides
    /// when each update is emitted.
    pub update_gate: Option<Arc<tokio::sync::Semaphore>>,
    /// When set, `adopt` takes one permit (after counting the call) before it returns: the
    /// test decides when a hand-off's adopt ends.
    pub adopt_gate: Option<Arc<tokio::sync::Semaphore>>,
    /// When set, `validate_arguments` passes through this gate: the test decides when a
    /// validation (a dispatched attempt's, before its claim) returns.
    pub validate_gate: Option<Arc<ValidateGate>>,
}

/// Holds `validate_arguments` calls once armed, after letting a number of them through,
/// until it is opened. A validation is synchronous: the calling thread waits, inside
/// `block_in_place` (a multi-threaded runtime only), its tasks left to the other workers.
#[derive(Default)]
pub struct ValidateGate {
    /// Whether calls are held, and how many more pass before they are.
    state: Mutex<(bool, usize)>,
    opened: std::sync::Condvar,
}

impl ValidateGate {
    /// Holds calls from now on, after `pass` more have gone through.
    pub fn arm(&self, pass: usize) {
        *self.state.lock().unwrap() = (true, pass);
    }

    /// Lets every call through, the held ones included.
    pub fn open(&self) {
        self.state.lock().unwrap().0 = false;
        self.opened.notify_all();
    }

    fn pass(&self) {
        {
            let mut state = self.state.lock().unwrap();
            if !state.0 {
                return;
            }
            if state.1 > 0 {
                state.1 -= 1;
                return;
            }
        }
        tokio::task::block_in_place(|| {
            let mut state = self.state.lock().unwrap();
            while state.0 {
                state = self.opened.wait(state).unwrap();
            }
        });
    }
}

impl Probe {
    pub fn new(script: Script) -> Self {
        Self {
            calls: Arc::default(),
            recoverable: true,
            handoff: false,
            resume: None,
            prepare: None,
            script,
            recover_script: None,
            start_checkpoint: Vec::new(),
            start_error: None,
            stop_error: None,
            validate_error: None,
            gate: None,
            update_gate: None,
            adopt_gate: None,
            validate_gate: None,
        }
    }

    pub fn plain(mut self) -> Self {
        self.recoverable = false;
        self
    }

    pub fn calls(&self) -> Calls {
        self.calls.lock().unwrap().clone()
    }

    fn run(&self, script: Script) -> Arc<dyn Run> {
        Arc::new(ProbeRun {
            script,
            calls: Arc::clone(&self.calls),
            stopped: tokio::sync::Notify::new(),
            stop_error: self.stop_error.clone(),
            updates_taken: Mutex::new(false),
            gate: self.gate.clone(),
            update_gate: self.update_gate.clone(),
        })
    }
}

pub struct ProbeRun {
    script: Script,
    calls: Arc<Mutex<Calls>>,
    stopped: tokio::sync::Notify,
    stop_error: Option<String>,
    updates_taken: Mutex<bool>,
    gate: Option<Arc<tokio::sync::Semaphore>>,
    update_gate: Option<Arc<tokio::sync::Semaphore>>,
}

#[async_trait]
impl Run for ProbeRun {
    async fn wait(&self) -> Result<RunOutcome, ToolRunError> {
        self.calls.lock().unwrap().waits += 1;
        if let Some(gate) = &self.gate {
            gate.acquire().await.unwrap().forget();
        }
        if let Some(outcome) = &self.script.outcome {
            if let Some(delay) = self.script.update_delay {
                tokio::time::sleep(delay * 2).await;
            }
            return Ok(outcome.clone());
        }
        self.stopped.notified().await;
        Ok(RunOutcome::Canceled("stopped".into()))
    }

    async fn stop(&self) -> Result<(), ToolRunError> {
        self.calls.lock().unwrap().stops += 1;
        self.stopped.notify_waiters();
        self.stopped.notify_one();
        match &self.stop_error {
            Some(e) => Err(ToolRunError::failed(e.clone())),
            None => Ok(()),
        }
    }

    fn updates(&self) -> Option<UpdateStream> {
        let mut taken = self.updates_taken.lock().unwrap();
        assert!(!*taken, "updates() called twice on one run");
        *taken = true;
        let updates = self.script.updates.clone();
        let delay = self.script.update_delay;
        let never_close = self.script.never_close;
        let stream = async_stream(updates, delay, never_close, self.update_gate.clone());
        Some(stream)
    }
}

fn async_stream(
    updates: Vec<Update>,
    delay: Option<Duration>,
    never_close: bool,
    gate: Option<Arc<tokio::sync::Semaphore>>,
) -> UpdateStream {
    use futures::StreamExt;
    let head = futures::stream::once(async move {
        if let Some(delay) = delay {
            tokio::time::sleep(delay).await;
        }
    })
    .filter_map(|()| async { None });
    let items = futures::stream::iter(updates).then(move |update| {
        let gate = gate.clone();
        async move {
            if let Some(gate) = gate {
                gate.acquire().await.unwrap().forget();
            }
            Ok(update)
        }
    });
    let tail = futures::stream::once(async move {
        if never_close {
            std::future::pending::<()>().await;
        }
    })
    .filter_map(|()| async { None });
    head.chain(items).chain(tail).boxed()
}

#[async_trait]
impl BackgroundTool for Probe {
    fn validate_arguments(&self, arguments: &str) -> Result<(), ToolFailure> {
        if let Some(gate) = &self.validate_gate {
            gate.pass();
        }
        if let Some(e) = &self.validate_error {
            return Err(e.as_str().into());
        }
        serde_json::from_str::<serde_json::Value>(arguments)
            .map(drop)
            .map_err(|e| ToolFailure::with_source(e.to_string(), e))
    }

    async fn start(&self, request: StartRequest) -> Result<StartResult, ToolRunError> {
        self.calls.lock().unwrap().starts.push(request);
        if let Some(e) = &self.start_error {
            return Err(ToolRunError::failed(e.clone()));
        }
        Ok(StartResult {
            run: self.run(self.script.clone()),
            checkpoint: self.start_checkpoint.clone(),
        })
    }

    fn as_recoverable(&self) -> Option<&dyn RecoverableTool> {
        self.recoverable.then_some(self as &dyn RecoverableTool)
    }

    fn as_resumable(&self) -> Option<&dyn ResumableTool> {
        self.resume.as_ref().map(|_| self as &dyn ResumableTool)
    }

    fn as_handoff(&self) -> Option<&dyn ForegroundHandoffTool> {
        self.handoff.then_some(self as &dyn ForegroundHandoffTool)
    }

    fn as_input_preparer(&self) -> Option<&dyn InputPreparer> {
        self.prepare.as_ref().map(|_| self as &dyn InputPreparer)
    }
}

#[async_trait]
impl RecoverableTool for Probe {
    async fn recover(&self, request: RecoverRequest) -> Result<Arc<dyn Run>, ToolRunError> {
        self.calls.lock().unwrap().recovers.push(request);
        Ok(self.run(
            self.recover_script
                .clone()
                .unwrap_or_else(|| self.script.clone()),
        ))
    }
}

#[async_trait]
impl ResumableTool for Probe {
    async fn resume(&self, request: ResumeRequest) -> Result<Arc<dyn Run>, ToolRunError> {
        let script = (self.resume.as_ref().unwrap())(&request);
        if script.is_ok() {
            self.calls.lock().unwrap().resumes.push(request);
        }
        Ok(self.run(script?))
    }
}

#[async_trait]
impl ForegroundHandoffTool for Probe {
    async fn adopt(&self, request: AdoptRequest) -> Result<AdoptResult, ToolRunError> {
        self.calls.lock().unwrap().adopts += 1;
        if let Some(gate) = &self.adopt_gate {
            gate.acquire().await.unwrap().forget();
        }
        // A fresh handle on the same operation, with its own update stream.
        Ok(AdoptResult {
            run: self.run(self.script.clone()),
            tool_checkpoint: request.tool_checkpoint,
        })
    }
}

#[async_trait]
impl InputPreparer for Probe {
    async fn prepare_input(&self, request: PrepareRequest) -> Result<Prepared, ToolFailure> {
        self.calls.lock().unwrap().prepares.push(request.clone());
        (self.prepare.as_ref().unwrap())(&request)
    }
}

/// A materializer that records its calls (and can fail them).
#[derive(Default)]
pub struct Recorder {
    pub appended: Mutex<Vec<(String, String, Vec<u8>)>>,
    pub fail: Option<String>,
    pub reserve_error: Option<String>,
    pub empty_path: bool,
}

#[async_trait]
impl OutputMaterializer for Recorder {
    async fn reserve_output(&self, task_id: &str) -> Result<String, ToolFailure> {
        if let Some(e) = &self.reserve_error {
            return Err(e.as_str().into());
        }
        if self.empty_path {
            return Ok(String::new());
        }
        Ok(format!("/outputs/{task_id}"))
    }

    async fn append_output(
        &self,
        task_id: &str,
        event_id: &str,
        _path: &str,
        data: &[u8],
    ) -> Result<(), ToolFailure> {
        self.appended.lock().unwrap().push((
            task_id.to_owned(),
            event_id.to_owned(),
            data.to_vec(),
        ));
        match &self.fail {
            Some(e) => Err(e.as_str().into()),
            None => Ok(()),
        }
    }
}

pub fn update(event_id: &str, data: &[u8]) -> Update {
    Update {
        event_id: event_id.into(),
        kind: "stdout".into(),
        data: data.to_vec(),
        ..Update::default()
    }
}
