//! A service that embeds `dtask serve`'s server over its own journal, store and manager, with
//! a worker running the tasks submitted over HTTP, and the health checks an orchestrator
//! would probe (`/healthz`, `/readyz`, the `dtask_ready` metric).
//!
//! Run: `cargo run --example serve_embedded` — it serves on a free loopback port, waits until
//! it is ready, submits one task of a session through the API, reads it back once the worker
//! has run it, takes the session's notifications from the outbox as a consumer in another
//! process would (lease, acknowledge), and drains: the manager closed, the server is no
//! longer ready; then it stops.
#![allow(clippy::unwrap_used, missing_docs)]

use dtask::engine::{
    async_trait, AttemptContext, ExecutionError, ExecutionResult, Executor, ExecutorRegistry,
    Manager, ManagerConfig, StoreConfig, SystemClock, TaskStore, Worker, WorkerConfig,
};
use dtask::journal::{Journal, JournalOptions, LeasePolicy};
use dtask::replay::TaskState;
use dtask::server::{Server, ServerConfig};
use serde_json::{json, Value};
use std::time::Duration;

/// A tool that answers its payload, a JSON string, in capitals.
struct Upper;

#[async_trait]
impl Executor for Upper {
    fn key(&self) -> &'static str {
        "upper"
    }

    fn lease_policy(&self) -> LeasePolicy {
        LeasePolicy::Retry
    }

    async fn execute(
        &self,
        attempt: AttemptContext,
        task: TaskState,
    ) -> Result<ExecutionResult, ExecutionError> {
        let text: String = serde_json::from_slice(&task.spec.payload)
            .map_err(|e| ExecutionError::failed(format!("the payload is not a string: {e}")))?;
        // A word to the task's session (its outbox), idempotent by its event id.
        attempt
            .notify(
                "chars",
                "progress",
                format!("{} chars", text.len()).into_bytes(),
            )
            .await
            .map_err(|e| ExecutionError::failed(e.to_string()))?;
        Ok(ExecutionResult::Completed(text.to_uppercase().into_bytes()))
    }
}

/// `GET url`: the status and the JSON body.
async fn get(http: &reqwest::Client, url: String) -> (u16, Value) {
    let response = http.get(url).send().await.unwrap();
    (response.status().as_u16(), response.json().await.unwrap())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let journal = Journal::open(dir.path().join("journal"), JournalOptions::default())?;
    let store = TaskStore::open(journal, SystemClock, StoreConfig::default())?;
    let mut executors = ExecutorRegistry::new();
    executors.register(Upper)?;
    let manager = Manager::new(store.clone(), executors, ManagerConfig::default());

    // The worker runs what is submitted, over HTTP or otherwise.
    let worker = Worker::new(manager.clone(), WorkerConfig::new(["upper"]))?;
    let (stop_worker, worker_stopped) = tokio::sync::oneshot::channel::<()>();
    let worker = tokio::spawn(worker.run(async move {
        let _ = worker_stopped.await;
    }));

    // The server, with the manager: submits are checked against its executors.
    let server = Server::owner(store, Some(manager.clone()), ServerConfig::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    let (stop_server, server_stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(server.serve(listener, async move {
        let _ = server_stopped.await;
    }));
    println!("serving on {base}");

    // Ready once the server has counted the journal: what a readiness probe waits for.
    let http = reqwest::Client::new();
    let ready = loop {
        let (status, body) = get(&http, format!("{base}/readyz")).await;
        if status == 200 {
            break body;
        }
        println!("not ready yet: {}", body["reasons"]);
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    println!("readyz: {ready}");
    let (status, live) = get(&http, format!("{base}/healthz")).await;
    println!("healthz: {status} {live}");

    // A task submitted through the API, run by the worker.
    let created: Value = http
        .post(format!("{base}/api/tasks"))
        .json(&json!({
            "executor_key": "upper",
            "payload": "hello, dtask",
            "session_id": "chat-1",
            "notify_session": true
        }))
        .send()
        .await?
        .json()
        .await?;
    let id = created["id"].as_str().unwrap().to_owned();
    println!("submitted {id}");
    manager.wait(&id).await?;
    let (_, task) = get(&http, format!("{base}/api/tasks/{id}")).await;
    println!(
        "{id}: {}: {}",
        task["state"]["status"], task["state"]["result_data"]["text"]
    );

    // The session's consumer: lease what the outbox holds (waiting up to 5 s for it), then
    // acknowledge each; an unacknowledged one would be handed out again when its lease ran out.
    let leased: Value = http
        .post(format!("{base}/api/notifications/receive"))
        .json(&json!({"lease_ms": 30_000, "wait_ms": 5_000}))
        .send()
        .await?
        .json()
        .await?;
    for n in leased["notifications"].as_array().into_iter().flatten() {
        println!(
            "notification for {}: {} {} ({})",
            n["session_id"], n["kind"], n["data"]["text"], n["delivery"]
        );
        http.post(format!("{base}/api/notifications/ack"))
            .json(&json!({"receipt": n["receipt"]}))
            .send()
            .await?
            .error_for_status()?;
    }
    let left: Value = http
        .post(format!("{base}/api/notifications/receive"))
        .json(&json!({"lease_ms": 30_000}))
        .send()
        .await?
        .json()
        .await?;
    println!(
        "outbox after the acknowledgements: {}",
        left["notifications"]
    );

    let metrics = http
        .get(format!("{base}/metrics"))
        .send()
        .await?
        .text()
        .await?;
    for line in metrics.lines().filter(|l| l.starts_with("dtask_ready ")) {
        println!("metric {line}");
    }

    // Draining: the manager closes first (submits refused), so the server stops being ready
    // and a load balancer sends no more; then the worker and the server stop.
    let _ = stop_worker.send(());
    worker.await??;
    manager.close(None, "the service stops").await?;
    let (status, body) = get(&http, format!("{base}/readyz")).await;
    println!("draining: readyz {status} {}", body["reasons"]);
    let _ = stop_server.send(());
    serving.await??;
    Ok(())
}
