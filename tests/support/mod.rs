//! Helpers of the root package's tests that run the engine and watch it from outside: a tool
//! that counts its runs and returns when let go ([`Held`]), and a `dtask serve` server on a
//! loopback port ([`Served`]).
#![allow(dead_code, reason = "each test file uses a part of the helpers")]

use dtask::engine::{
    async_trait, AttemptContext, ExecutionError, ExecutionResult, Executor, ExecutorRegistry,
    Manager, SubmitRequest,
};
use dtask::journal::{LeasePolicy, TaskSpec};
use dtask::server::{Server, ServerError};
use serde_json::Value;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{oneshot, Notify, Semaphore};
use tokio::task::JoinHandle;

/// How long a helper waits for what must happen: a guard against a hang, no measure.
pub const PATIENCE: Duration = Duration::from_secs(120);

/// The tool of executor key `held`: counts its runs, says when one started, and completes
/// with `done` once let go ([`Held::let_go`]).
#[derive(Clone)]
pub struct Held {
    runs: Arc<AtomicUsize>,
    started: Arc<Notify>,
    release: Arc<Semaphore>,
}

impl Default for Held {
    fn default() -> Self {
        Self {
            runs: Arc::default(),
            started: Arc::default(),
            release: Arc::new(Semaphore::new(0)),
        }
    }
}

impl Held {
    /// The runs so far.
    pub fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }

    /// Lets `n` runs (under way or to come) complete.
    pub fn let_go(&self, n: usize) {
        self.release.add_permits(n);
    }

    /// Waits until a run starts (one that started before and was not waited for counts).
    pub async fn started(&self) {
        self.started.notified().await;
    }

    /// Submits a task of this tool to `manager`; its id.
    pub async fn submit(manager: &Manager) -> String {
        let id = manager.allocate_task_id("held").unwrap();
        manager
            .submit(SubmitRequest {
                spec: TaskSpec::new(id.as_str(), "held"),
                ..SubmitRequest::default()
            })
            .await
            .unwrap();
        id
    }

    /// A registry of executors holding this tool.
    pub fn registry(&self) -> ExecutorRegistry {
        let mut executors = ExecutorRegistry::new();
        executors.register(self.clone()).unwrap();
        executors
    }
}

#[async_trait]
impl Executor for Held {
    fn key(&self) -> &'static str {
        "held"
    }

    fn lease_policy(&self) -> LeasePolicy {
        LeasePolicy::Retry
    }

    async fn execute(
        &self,
        _attempt: AttemptContext,
        _task: dtask::TaskState,
    ) -> Result<ExecutionResult, ExecutionError> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        self.started.notify_one();
        self.release.acquire().await.unwrap().forget();
        Ok(ExecutionResult::Completed(b"done".to_vec()))
    }
}

/// A server serving on a loopback port.
pub struct Served {
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    http: reqwest::Client,
    stop: oneshot::Sender<()>,
    serving: JoinHandle<Result<(), ServerError>>,
}

impl Served {
    /// Serves `server` on a free loopback port.
    pub async fn start(server: Server) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let (stop, stopped) = oneshot::channel::<()>();
        let serving = tokio::spawn(server.serve(listener, async move {
            let _ = stopped.await;
        }));
        Self {
            base,
            http: reqwest::Client::new(),
            stop,
            serving,
        }
    }

    /// `GET path`: the status and the JSON body.
    pub async fn get(&self, path: &str) -> (u16, Value) {
        let response = self
            .http
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap())
    }

    /// `POST path` with the JSON `body`: the status and the JSON body.
    pub async fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let response = self
            .http
            .post(format!("{}{path}", self.base))
            .json(body)
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap())
    }

    /// `GET path`: the body as text.
    pub async fn text(&self, path: &str) -> String {
        let response = self.http.get(format!("{}{path}", self.base)).send().await;
        response.unwrap().text().await.unwrap()
    }

    /// The reasons `/readyz` gives once it answers 200 (`ready`) or 503.
    pub async fn readiness(&self, ready: bool) -> Value {
        let want = if ready { 200 } else { 503 };
        let asked = Instant::now();
        loop {
            let (status, body) = self.get("/readyz").await;
            if status == want {
                return body["reasons"].clone();
            }
            assert!(
                asked.elapsed() < PATIENCE,
                "/readyz never answered {want}: {status} {body}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Stops the server and waits for it.
    pub async fn stop(self) {
        self.stop.send(()).unwrap();
        self.serving.await.unwrap().unwrap();
    }
}
