//! `dtask serve` over real HTTP on loopback, against real RocksDB journals in temporary
//! directories: every endpoint's success and client errors, the control endpoints changing
//! what the journal holds, the streams, metrics, the token, and the OpenAPI document against
//! its committed copy (`DTASK_BLESS=1 cargo test -p dtask --test server` rewrites it).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::too_many_lines,
    clippy::similar_names
)]

#[path = "../engine/tests/support/models.rs"]
mod models;
mod pg;

mod support;
use dtask::server::{Server, ServerConfig, ServerError};
use dtask_engine::{
    Command as Cmd, CreateRequest, ManualClock, NotificationRequest, StoreConfig, SystemClock,
    TaskStore, UpdateRequest,
};
use dtask_journal::observe::BatchWritten;
use dtask_journal::{
    Event, Journal, JournalOptions, LeasePolicy, TaskSpec, Timestamp, WriteObserver,
};
use dtask_replay::{FoldView, Status};
use futures::StreamExt;
use reqwest::StatusCode;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// A server running in this process on a loopback port.
struct Running {
    base: String,
    http: reqwest::Client,
    stop: Option<oneshot::Sender<()>>,
    handle: JoinHandle<Result<(), ServerError>>,
}

impl Running {
    async fn start(server: Server) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let (stop, stopped) = oneshot::channel::<()>();
        let handle = tokio::spawn(server.serve(listener, async move {
            let _ = stopped.await;
        }));
        Self {
            base,
            http: reqwest::Client::new(),
            stop: Some(stop),
            handle,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    async fn get(&self, path: &str) -> (StatusCode, Value) {
        let response = self.http.get(self.url(path)).send().await.unwrap();
        let status = response.status();
        (status, response.json().await.unwrap())
    }

    async fn post(&self, path: &str, body: &Value) -> (StatusCode, Value) {
        let response = self
            .http
            .post(self.url(path))
            .json(body)
            .send()
            .await
            .unwrap();
        let status = response.status();
        (status, response.json().await.unwrap())
    }

    /// The body of `GET path` as text (the metrics' exposition).
    async fn text(&self, path: &str) -> String {
        let response = self.http.get(self.url(path)).send().await.unwrap();
        response.text().await.unwrap()
    }

    /// Opens the event stream at `path`, answered 200.
    async fn stream(&self, path: &str) -> reqwest::Response {
        let response = self.http.get(self.url(path)).send().await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        response
    }

    /// Stops the server and waits for it (a hang fails the test after a minute).
    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            stop.send(()).unwrap();
        }
        tokio::time::timeout(Duration::from_secs(60), self.handle)
            .await
            .expect("the server stops")
            .unwrap()
            .unwrap();
    }

    /// `POST path` with `body` from a task of its own: the status and the JSON body.
    fn spawn_post(&self, path: &str, body: Value) -> JoinHandle<(StatusCode, Value)> {
        let (http, url) = (self.http.clone(), self.url(path));
        tokio::spawn(async move {
            let response = http.post(url).json(&body).send().await.unwrap();
            (response.status(), response.json::<Value>().await.unwrap())
        })
    }

    /// Waits until a receive of notifications waits (the gauge counts it; bounded).
    async fn until_receive_waits(&self) {
        for _ in 0..3_000 {
            let metrics = self.text("/metrics").await;
            if metrics.contains("dtask_notification_receives_waiting 1\n") {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the receive never waited");
    }

    /// Waits until the server's counts have read up to `seq` (bounded).
    async fn wait_seq(&self, seq: u64) -> Value {
        for _ in 0..600 {
            let (_, stats) = self.get("/api/stats").await;
            if stats["counted"] == json!(true) && stats["last_seq"].as_u64().unwrap() >= seq {
                return stats;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("the server never read up to sequence {seq}");
    }
}

fn fast() -> ServerConfig {
    ServerConfig::default().with_poll_interval(Duration::from_millis(10))
}

fn open_store(dir: &Path) -> TaskStore {
    let journal = Journal::open(dir, JournalOptions::default()).unwrap();
    TaskStore::open(journal, SystemClock, StoreConfig::default()).unwrap()
}

fn create(id: &str, executor: &str, payload: &Value) -> CreateRequest {
    CreateRequest {
        spec: TaskSpec {
            id: id.into(),
            executor_key: executor.into(),
            kind: "tool_call".into(),
            payload: serde_json::to_vec(payload).unwrap(),
            description: format!("the {id} task"),
            ..TaskSpec::default()
        },
        policy: Some(LeasePolicy::Retry),
        ..CreateRequest::default()
    }
}

/// The status folded from the journal at `dir` once the stopped server has let it go. The
/// journal is opened for writing, which succeeds only after the last handle's close (its
/// flush and settling) is over: the server's last handles can be dropped a moment after it
/// stops, and a read-only open beside a close under way can see the close's
/// flush half done.
async fn status_in_journal(dir: &Path, task: &str) -> Status {
    let mut tries = 0;
    let journal = loop {
        match Journal::open(dir, JournalOptions::default()) {
            Ok(journal) => break journal,
            Err(dtask_journal::Error::InUse { .. }) if tries < 1_000 => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(e) => panic!("the journal does not open: {e}"),
        }
    };
    let view = FoldView::read(&journal, task, |_| {}).unwrap();
    view.task.unwrap().state.status
}

fn code(body: &Value) -> &str {
    body["error"]["code"]
        .as_str()
        .unwrap_or_else(|| panic!("not an error body: {body}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owner_submits_and_cancels_and_every_read_shows_it() {
    let dir = tempfile::tempdir().unwrap();
    let server = Running::start(Server::owner(open_store(dir.path()), None, fast())).await;

    let (status, created) = server
        .post(
            "/api/tasks",
            &json!({
                "id": "job-1", "executor_key": "shell", "kind": "tool_call",
                "payload": {"tool_name": "shell", "command": "make test"},
                "description": "run the tests"
            }),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    assert_eq!(created["status"], "pending");
    assert_eq!(created["tool"], "shell");
    let (status, generated) = server
        .post(
            "/api/tasks",
            &json!({"executor_key": "fetch", "kind": "dl", "max_recoveries": 2}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{generated}");
    assert_eq!(generated["max_recoveries"], 2);
    assert_eq!(generated["recoveries"], 0);
    assert_eq!(created["max_recoveries"], Value::Null);
    assert_eq!(created["not_before"], Value::Null);
    assert!(
        generated["id"].as_str().unwrap().starts_with("dl_"),
        "{generated}"
    );

    let (status, list) = server.get("/api/tasks").await;
    assert_eq!(status, StatusCode::OK);
    let ids: Vec<&str> = list["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids.len(), 2);
    assert!(ids.contains(&"job-1"));
    let (_, shells) = server.get("/api/tasks?tool=shell&status=pending").await;
    assert_eq!(shells["tasks"].as_array().unwrap().len(), 1);
    assert_eq!(shells["tasks"][0]["id"], "job-1");
    let (_, searched) = server.get("/api/tasks?q=THE%20TESTS").await;
    assert_eq!(searched["tasks"][0]["id"], "job-1");
    let (_, none) = server.get("/api/tasks?executor=nobody").await;
    assert_eq!(none["tasks"], json!([]));

    // A delayed run: pending, not claimable before its time.
    let later = 4_102_444_800_000_u64; // 2100-01-01
    let (status, delayed) = server
        .post(
            "/api/tasks",
            &json!({"id": "later-1", "executor_key": "fetch", "not_before": later}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{delayed}");
    assert_eq!(delayed["not_before"], later);
    assert_eq!(delayed["status"], "pending");
    let (_, listed) = server.get("/api/tasks?q=later-1").await;
    assert_eq!(listed["tasks"][0]["not_before"], later, "{listed}");

    let (status, task) = server.get("/api/tasks/job-1").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(task["state"]["status"], "pending");
    assert_eq!(
        task["state"]["payload"]["text"],
        r#"{"command":"make test","tool_name":"shell"}"#
    );
    assert_eq!(task["problems"], json!([]));

    let (status, cancel) = server
        .post("/api/tasks/job-1/cancel", &json!({"reason": "not needed"}))
        .await;
    assert_eq!(status, StatusCode::OK, "{cancel}");
    assert_eq!(cancel["status"], "canceled");

    let (status, records) = server.get("/api/tasks/job-1/records").await;
    assert_eq!(status, StatusCode::OK);
    let types: Vec<&str> = records["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["type"].as_str().unwrap())
        .collect();
    // A pending task's cancel is direct: one record, and the task is canceled.
    assert_eq!(types, ["created", "cancel_requested"]);
    assert_eq!(records["records"][1]["event"]["direct"], true);
    assert_eq!(records["records"][1]["event"]["reason"], "not needed");
    let first = &records["records"][0];
    assert_eq!(first["position"], 0);
    assert_eq!(first["crc"].as_str().unwrap().len(), 8);
    assert_eq!(first["digest"].as_str().unwrap().len(), 64);
    assert_eq!(first["event"]["spec"]["id"], "job-1");
    let (_, paged) = server.get("/api/tasks/job-1/records?from=1&limit=1").await;
    assert_eq!(paged["records"].as_array().unwrap().len(), 1);
    assert_eq!(paged["records"][0]["position"], 1);

    let (status, at0) = server.get("/api/tasks/job-1/state?at=0").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(at0["at"]["type"], "created");
    assert_eq!(at0["state"]["status"], "pending");
    let (_, last) = server.get("/api/tasks/job-1/state").await;
    assert_eq!(last["state"]["status"], "canceled");

    // The canceled task rerun: a new pending task from its creation, each naming the other;
    // the same named rerun asked for again is the same task.
    let (status, rerun) = server.post("/api/tasks/job-1/rerun", &json!({})).await;
    assert_eq!(status, StatusCode::CREATED, "{rerun}");
    assert_eq!(rerun["id"], "job-1.rerun-1");
    assert_eq!(rerun["status"], "pending");
    assert_eq!(rerun["rerun_of"], "job-1");
    assert_eq!(rerun["tool"], "shell");
    assert_eq!(rerun["description"], "run the tests");
    let (status, named) = server
        .post("/api/tasks/job-1/rerun", &json!({"id": "job-1-again"}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{named}");
    let (status, repeat) = server
        .post("/api/tasks/job-1/rerun", &json!({"id": "job-1-again"}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{repeat}");
    assert_eq!(repeat["created_at"], named["created_at"]);
    let (_, original) = server.get("/api/tasks/job-1").await;
    assert_eq!(
        original["state"]["rerun_as"],
        json!(["job-1.rerun-1", "job-1-again"])
    );
    assert_eq!(original["state"]["rerun_of"], Value::Null);
    let (_, records) = server.get("/api/tasks/job-1.rerun-1/records").await;
    assert_eq!(records["records"][1]["type"], "rerun_of");
    assert_eq!(records["records"][1]["event"]["task"], "job-1");
    let taken = generated["id"].as_str().unwrap();
    for (path, body, want, error) in [
        // Not finished, an id another task holds, an unknown task, an unknown field.
        (
            "/api/tasks/job-1.rerun-1/rerun",
            json!({}),
            StatusCode::CONFLICT,
            "conflict",
        ),
        (
            "/api/tasks/job-1/rerun",
            json!({ "id": taken }),
            StatusCode::CONFLICT,
            "conflict",
        ),
        (
            "/api/tasks/nope/rerun",
            json!({}),
            StatusCode::NOT_FOUND,
            "not_found",
        ),
        (
            "/api/tasks/job-1/rerun",
            json!({"new": "x"}),
            StatusCode::BAD_REQUEST,
            "invalid_json",
        ),
    ] {
        let (status, body) = server.post(path, &body).await;
        assert_eq!((status, code(&body)), (want, error), "{path}: {body}");
    }

    server.stop().await;
    // What the journal holds, read back by another open.
    assert_eq!(
        status_in_journal(dir.path(), "job-1").await,
        Status::Canceled
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resume_and_release_answer_waiting_and_suspended_tasks_and_updates_page() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_store(dir.path());
    let payload = json!({"tool_name": "approval"});
    store
        .create(create("ask", "approval", &payload))
        .await
        .unwrap();
    let s = store.execute("ask", 1, Cmd::Start).await.unwrap();
    for i in 0..3 {
        store
            .append_update(
                "ask",
                UpdateRequest {
                    attempt: s.attempt,
                    event_id: format!("u{i}"),
                    kind: "progress".into(),
                    data: format!("step {i}").into_bytes(),
                    metadata: vec![("n".into(), i.to_string())],
                    ..UpdateRequest::default()
                },
            )
            .await
            .unwrap();
    }
    let s = store
        .execute(
            "ask",
            s.version,
            Cmd::WaitInput {
                checkpoint: b"question".to_vec(),
            },
        )
        .await
        .unwrap();
    store
        .create(create("nap", "sleeper", &payload))
        .await
        .unwrap();
    let n = store.execute("nap", 1, Cmd::Start).await.unwrap();
    store
        .execute(
            "nap",
            n.version,
            Cmd::Suspend {
                checkpoint: b"zz".to_vec(),
            },
        )
        .await
        .unwrap();
    let server = Running::start(Server::owner(store, None, fast())).await;

    let (status, page) = server.get("/api/tasks/ask/updates?limit=2").await;
    assert_eq!(status, StatusCode::OK);
    let updates = page["updates"].as_array().unwrap();
    assert_eq!(updates.len(), 2);
    assert_eq!(updates[0]["event_id"], "u0");
    assert_eq!(updates[0]["data"]["text"], "step 0");
    assert_eq!(updates[0]["metadata"][0], json!({"key": "n", "value": "0"}));
    let cursor = page["next_cursor"].as_str().unwrap().to_owned();
    let (_, rest) = server
        .get(&format!("/api/tasks/ask/updates?cursor={cursor}"))
        .await;
    assert_eq!(rest["updates"].as_array().unwrap().len(), 1);
    assert_eq!(rest["updates"][0]["event_id"], "u2");

    let (status, resumed) = server
        .post(
            "/api/tasks/ask/resume",
            &json!({"data": "yes", "expected_version": s.version}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{resumed}");
    assert_eq!(resumed["status"], "pending");
    assert_eq!(resumed["pending_resume"]["text"], "yes");
    let (status, again) = server
        .post("/api/tasks/ask/resume", &json!({"data": "twice"}))
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{again}");
    assert_eq!(code(&again), "conflict");

    let (status, released) = server.post("/api/tasks/nap/release", &json!({})).await;
    assert_eq!(status, StatusCode::OK, "{released}");
    assert_eq!(released["status"], "pending");
    // An empty body is an empty request.
    let response = server
        .http
        .post(server.url("/api/tasks/nap/release"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::CONFLICT);

    server.stop().await;
    assert_eq!(status_in_journal(dir.path(), "ask").await, Status::Pending);
    assert_eq!(status_in_journal(dir.path(), "nap").await, Status::Pending);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_mistakes_are_json_4xx_errors() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_store(dir.path());
    store
        .create(create("t1", "shell", &json!({})))
        .await
        .unwrap();
    let server = Running::start(Server::owner(store, None, fast().with_body_limit(4096))).await;
    let raw = |path: &str| server.http.post(server.url(path));

    // Bodies.
    let r = raw("/api/tasks")
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert_eq!(code(&r.json().await.unwrap()), "invalid_json");
    let (status, body) = server
        .post("/api/tasks", &json!({"executor_key": "x", "colour": "red"}))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(code(&body), "invalid_json");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("unknown field"),
        "{body}"
    );
    let (status, body) = server.post("/api/tasks", &json!({"id": "x"})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "a missing field: {body}");
    let r = raw("/api/tasks")
        .header("content-type", "text/plain")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
    assert_eq!(code(&r.json().await.unwrap()), "unsupported_media_type");
    let big = json!({"executor_key": "x", "description": "d".repeat(10_000)});
    let (status, body) = server.post("/api/tasks", &big).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{body}");
    assert_eq!(code(&body), "payload_too_large");
    let (status, body) = server
        .post("/api/tasks", &json!({"executor_key": ""}))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(code(&body), "invalid_request");
    let (status, body) = server
        .post("/api/tasks", &json!({"id": "t1", "executor_key": "shell"}))
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    let (status, body) = server
        .post(
            "/api/tasks",
            &json!({"executor_key": "x", "policy": "sometimes"}),
        )
        .await;
    assert_eq!(
        (status, code(&body)),
        (StatusCode::BAD_REQUEST, "invalid_request")
    );
    let (status, body) = server
        .post(
            "/api/tasks/t1/resume",
            &json!({"data": "a", "data_base64": "YQ=="}),
        )
        .await;
    assert_eq!(
        (status, code(&body)),
        (StatusCode::BAD_REQUEST, "invalid_request")
    );

    // Unknown tasks.
    for path in [
        "/api/tasks/nope",
        "/api/tasks/nope/records",
        "/api/tasks/nope/state",
        "/api/tasks/nope/updates",
        "/api/tasks/nope/stream",
    ] {
        let (status, body) = server.get(path).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}: {body}");
        assert_eq!(code(&body), "not_found");
    }
    for path in [
        "/api/tasks/nope/cancel",
        "/api/tasks/nope/resume",
        "/api/tasks/nope/release",
    ] {
        let (status, body) = server.post(path, &json!({})).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}: {body}");
    }
    let (status, body) = server.post("/api/verify?task=nope", &json!({})).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    // An id holding NUL is no task's: its keys would be read as t1's.
    for path in [
        "/api/tasks/t1%00",
        "/api/tasks/t1%00/records",
        "/api/tasks/t1%00/updates",
        "/api/tasks/t1%00/state?at=0",
    ] {
        let (status, body) = server.get(path).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path}: {body}");
    }
    let (status, body) = server.post("/api/verify?task=t1%00", &json!({})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");

    // Queries, cursors, positions.
    for (path, expected) in [
        ("/api/tasks?cursor=!!", "invalid_cursor"),
        ("/api/tasks?cursor=eyJ2IjoxfQ", "invalid_cursor"),
        ("/api/tasks/t1/updates?cursor=AAAA", "invalid_cursor"),
        ("/api/tasks?status=sleeping", "bad_request"),
        ("/api/tasks?colour=red", "bad_request"),
        ("/api/tasks?limit=many", "bad_request"),
        ("/api/tasks/t1/state?at=99", "out_of_range"),
        ("/api/stream?from_seq=-1", "bad_request"),
    ] {
        let (status, body) = server.get(path).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path}: {body}");
        assert_eq!(code(&body), expected, "{path}");
    }
    let r = server
        .http
        .get(server.url("/api/stream"))
        .header("last-event-id", "yesterday")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);

    // Routes and methods.
    let (status, body) = server.get("/api/nothing").await;
    assert_eq!((status, code(&body)), (StatusCode::NOT_FOUND, "not_found"));
    let r = server
        .http
        .put(server.url("/api/tasks/t1"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(code(&r.json().await.unwrap()), "method_not_allowed");

    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_a_browser_makes_for_another_site_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_store(dir.path());
    store
        .create(create("t", "shell", &json!({})))
        .await
        .unwrap();
    let server = Running::start(Server::owner(store.clone(), None, fast())).await;
    let cancel = |headers: &[(&str, &str)]| {
        let mut request = server.http.post(server.url("/api/tasks/t/cancel"));
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        async move {
            let response = request.send().await.unwrap();
            let status = response.status();
            (status, response.json::<Value>().await.unwrap())
        }
    };
    // A page elsewhere posting to the loopback server (no preflight for an empty body).
    for headers in [
        &[("origin", "http://evil.example")][..],
        &[("sec-fetch-site", "cross-site")],
        &[("sec-fetch-site", "same-site")],
    ] {
        let (status, body) = cancel(headers).await;
        assert_eq!(
            (status, code(&body)),
            (StatusCode::FORBIDDEN, "forbidden_origin"),
            "{headers:?}: {body}"
        );
    }
    assert_eq!(store.get("t").await.unwrap().status, Status::Pending);
    // A name made to resolve to the loopback (DNS rebinding): refused, reads too.
    let (status, body) = {
        let response = server
            .http
            .get(server.url("/api/tasks"))
            .header("host", "evil.example:7700")
            .send()
            .await
            .unwrap();
        let status = response.status();
        (status, response.json::<Value>().await.unwrap())
    };
    assert_eq!(
        (status, code(&body)),
        (StatusCode::FORBIDDEN, "forbidden_origin"),
        "{body}"
    );
    // The server's own page, and clients that are not browsers, go through.
    let own = server.base.clone();
    let (status, body) =
        cancel(&[("origin", own.as_str()), ("sec-fetch-site", "same-origin")]).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(store.get("t").await.unwrap().status, Status::Canceled);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_follower_sees_new_commits_and_refuses_control() {
    let dir = tempfile::tempdir().unwrap();
    let writer = Journal::open(dir.path(), JournalOptions::default()).unwrap();
    let created = |id: &str| {
        Event::created(
            TaskSpec::new(id, "shell"),
            LeasePolicy::Retry,
            Timestamp(1_000),
        )
    };
    writer.append_async("a", 0, &[created("a")]).await.unwrap();
    let scratch = tempfile::tempdir().unwrap();
    let follower = Journal::open_follower(dir.path(), scratch.path()).unwrap();
    let server = Running::start(Server::follower(follower, fast())).await;

    let stats = server.wait_seq(1).await;
    assert_eq!(stats["mode"], "follower");
    // A follower reports the storage too: the memtables it replayed the writer's log into.
    let spaces = stats["storage"]["spaces"].as_array().unwrap();
    assert!(spaces.iter().any(|s| s["name"] == "events"), "{stats}");
    assert_eq!(
        stats["storage"]["direct_table_io"], false,
        "a follower writes no table files: {stats}"
    );
    let (status, task) = server.get("/api/tasks/a").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(task["state"]["status"], "pending");
    for (path, body) in [
        ("/api/tasks", json!({"executor_key": "shell"})),
        ("/api/tasks/a/cancel", json!({})),
        ("/api/tasks/a/resume", json!({})),
        ("/api/tasks/a/release", json!({})),
        ("/api/tasks/a/rerun", json!({})),
        ("/api/notifications/receive", json!({"lease_ms": 1000})),
        ("/api/notifications/ack", json!({"receipt": "lease:1"})),
        ("/api/tasks/a/messages", json!({"text": "hi"})),
        ("/api/tasks/a/close", json!({})),
    ] {
        let (status, body) = server.post(path, &body).await;
        assert_eq!(
            (status, code(&body)),
            (StatusCode::FORBIDDEN, "read_only"),
            "{path}"
        );
    }

    // The writer goes on; the follower catches up.
    writer.append_async("b", 0, &[created("b")]).await.unwrap();
    let run = [
        Event::AttemptStarted {
            attempt: 1,
            lease_deadline: Timestamp(31_000),
            at: Timestamp(1_000),
        },
        Event::Completed {
            data: b"ok".to_vec(),
            at: Timestamp(2_000),
        },
    ];
    writer.append_async("a", 1, &run).await.unwrap();
    let stats = server.wait_seq(4).await;
    assert_eq!(stats["tasks"], 2);
    assert_eq!(stats["by_status"]["completed"], 1);
    assert_eq!(stats["by_status"]["pending"], 1);
    assert!(stats["postgres_schema"].is_null(), "{stats}");
    let (_, a) = server.get("/api/tasks/a").await;
    assert_eq!(a["state"]["status"], "completed");
    assert_eq!(a["state"]["result_data"]["text"], "ok");
    assert_eq!(a["problems"], json!([]));
    let (_, report) = server.post("/api/verify", &json!({})).await;
    assert_eq!(report["clean"], true, "{report}");
    assert_eq!(report["tasks"], 2);
    server.stop().await;
}

/// Holds the next batch written, once armed, after its write and before its sync: its
/// records are in the journal and not yet durable until the test lets it go.
#[derive(Debug)]
struct HoldNextBatch {
    armed: std::sync::atomic::AtomicBool,
    held: std::sync::Mutex<std::sync::mpsc::SyncSender<()>>,
    release: std::sync::Mutex<std::sync::mpsc::Receiver<()>>,
}

impl WriteObserver for HoldNextBatch {
    fn batch_written(&self, _: &BatchWritten) {
        if self.armed.swap(false, std::sync::atomic::Ordering::AcqRel) {
            self.held.lock().unwrap().send(()).unwrap();
            self.release.lock().unwrap().recv().unwrap();
        }
    }
}

/// A store on a new journal at `dir` whose batches all go through the writer thread, with a
/// [`HoldNextBatch`] gate on it (disarmed): the gate, the receiver told when it holds a batch,
/// and the sender that lets the batch go.
fn gated_store(
    dir: &Path,
) -> (
    TaskStore,
    std::sync::Arc<HoldNextBatch>,
    std::sync::mpsc::Receiver<()>,
    std::sync::mpsc::SyncSender<()>,
) {
    let options = JournalOptions::default().with_inline_lone_appends(false);
    let journal = Journal::open(dir, options).unwrap();
    let (held_tx, held) = std::sync::mpsc::sync_channel(1);
    let (release, release_rx) = std::sync::mpsc::sync_channel(1);
    let gate = std::sync::Arc::new(HoldNextBatch {
        armed: std::sync::atomic::AtomicBool::new(false),
        held: std::sync::Mutex::new(held_tx),
        release: std::sync::Mutex::new(release_rx),
    });
    assert!(journal.observe(gate.clone()));
    let store = TaskStore::open(journal, SystemClock, StoreConfig::default()).unwrap();
    (store, gate, held, release)
}

/// Waits until the gate holds the batch `op` writes; fails at once if `op` ends without one
/// (an operation whose batch is held cannot end: its append waits for the sync).
async fn until_held<T>(
    mut held: std::sync::mpsc::Receiver<()>,
    op: &JoinHandle<T>,
) -> std::sync::mpsc::Receiver<()> {
    use std::sync::mpsc::RecvTimeoutError;
    loop {
        let (back, got) = tokio::task::spawn_blocking(move || {
            let got = held.recv_timeout(Duration::from_millis(50));
            (held, got)
        })
        .await
        .unwrap();
        held = back;
        match got {
            Ok(()) => return held,
            Err(RecvTimeoutError::Timeout) => {
                assert!(
                    !op.is_finished(),
                    "the operation ended without a held batch"
                );
            }
            Err(RecvTimeoutError::Disconnected) => panic!("the gate is gone"),
        }
    }
}

/// An embedded owner shows no record before it is durable: while the batch that creates a
/// task is written and not yet synced, the task is neither listed nor found, once synced it
/// is both; and while a later record of it waits for its sync, no page counts it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_shows_no_task_before_its_first_record_is_durable() {
    let dir = tempfile::tempdir().unwrap();
    let (store, gate, held, release) = gated_store(dir.path());
    let server = Running::start(Server::owner(store.clone(), None, fast())).await;

    gate.armed.store(true, std::sync::atomic::Ordering::Release);
    let creating = tokio::spawn({
        let store = store.clone();
        async move { store.create(create("early", "shell", &json!({}))).await }
    });
    let held = until_held(held, &creating).await;
    let (_, list) = server.get("/api/tasks").await;
    assert_eq!(list["tasks"], json!([]), "{list}");
    let (status, task) = server.get("/api/tasks/early").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{task}");

    release.send(()).unwrap();
    creating.await.unwrap().unwrap();
    let (_, list) = server.get("/api/tasks").await;
    assert_eq!(list["tasks"][0]["id"], "early", "{list}");
    assert_eq!(list["tasks"][0]["status"], "pending", "{list}");
    let (status, _) = server.get("/api/tasks/early").await;
    assert_eq!(status, StatusCode::OK);

    // A progress update written and not yet durable: no page counts it, and the updates'
    // cursor does not pass it (a reader going on from there gets it once it is durable).
    let started = store.execute("early", 1, Cmd::Start).await.unwrap();
    let (_, page) = server.get("/api/tasks/early/updates").await;
    let cursor = page["next_cursor"].as_str().unwrap().to_owned();
    gate.armed.store(true, std::sync::atomic::Ordering::Release);
    let updating = tokio::spawn({
        let store = store.clone();
        let update = UpdateRequest {
            attempt: started.attempt,
            event_id: "held".into(),
            kind: "progress".into(),
            data: b"half".to_vec(),
            ..UpdateRequest::default()
        };
        async move { store.append_update("early", update).await }
    });
    until_held(held, &updating).await;
    let (_, records) = server.get("/api/tasks/early/records").await;
    let length = records["length"].as_u64().unwrap();
    assert_eq!(records["records"].as_array().unwrap().len() as u64, length);
    assert_eq!(records["next_from"], json!(null), "{records}");
    let (_, state) = server.get("/api/tasks/early/state").await;
    assert_eq!(state["last_position"].as_u64(), Some(length - 1), "{state}");
    let (_, page) = server
        .get(&format!("/api/tasks/early/updates?cursor={cursor}"))
        .await;
    assert_eq!(page["updates"], json!([]), "{page}");
    let cursor = page["next_cursor"].as_str().unwrap().to_owned();

    release.send(()).unwrap();
    updating.await.unwrap().unwrap();
    let (_, records) = server.get("/api/tasks/early/records").await;
    assert_eq!(records["length"].as_u64(), Some(length + 1), "{records}");
    let (_, page) = server
        .get(&format!("/api/tasks/early/updates?cursor={cursor}"))
        .await;
    assert_eq!(page["updates"][0]["event_id"], "held", "{page}");
    server.stop().await;
}

/// An owner's counts and its stream "from now on" start from what is durable: a task whose
/// first record waits for its sync when the server counts the journal, and when a subscriber
/// asks for what comes next, is counted once (not as a problem) and streamed once durable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_counts_and_streams_a_record_that_waited_for_its_sync() {
    let dir = tempfile::tempdir().unwrap();
    let (store, gate, held, release) = gated_store(dir.path());
    store
        .create(create("first", "shell", &json!({})))
        .await
        .unwrap();
    gate.armed.store(true, std::sync::atomic::Ordering::Release);
    let creating = tokio::spawn({
        let store = store.clone();
        async move { store.create(create("held", "fetch", &json!({}))).await }
    });
    let _held = until_held(held, &creating).await;

    // The first count runs while the second task's record is written and not yet durable.
    let server = Running::start(Server::owner(store.clone(), None, fast())).await;
    let stats = server.wait_seq(1).await;
    assert_eq!(stats["last_seq"], 1, "{stats}");
    assert_eq!(stats["tasks"], 1, "{stats}");
    assert_eq!(stats["tasks_with_problems"], 0, "{stats}");
    let live = server.stream("/api/stream").await;

    release.send(()).unwrap();
    creating.await.unwrap().unwrap();
    let events = read_events(live, 1).await;
    assert_eq!(events[0].0, 2);
    assert_eq!(events[0].1["task"], "held", "{:?}", events[0]);
    let stats = server.wait_seq(2).await;
    assert_eq!(stats["tasks"], 2, "{stats}");
    assert_eq!(stats["tasks_with_problems"], 0, "{stats}");
    assert_eq!(stats["by_status"]["pending"], 2, "{stats}");
    assert_eq!(stats["records"], 2, "{stats}");
    server.stop().await;
}

/// An owner on a PostgreSQL journal reads through its store's durable view: its own submit
/// reads back at once, and another node's commits reach its list and its stream (woken by the
/// database's announcements).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_on_postgres_shows_its_own_and_another_nodes_commits() {
    let Some(url) = pg::pg_url("server", "owner") else {
        return;
    };
    let open = || {
        let journal = Journal::open_postgres(&url, JournalOptions::default()).unwrap();
        TaskStore::open(journal, SystemClock, StoreConfig::default()).unwrap()
    };
    let (mine, theirs) = (open(), open());
    // An hour between polls: the stream is woken by the database's announcements.
    let config = ServerConfig::default().with_poll_interval(Duration::from_secs(3600));
    let server = Running::start(Server::owner(mine, None, config)).await;
    let live = server.stream("/api/stream?from_seq=1").await;

    let (status, created) = server
        .post(
            "/api/tasks",
            &json!({"id": "mine", "executor_key": "shell", "kind": "tool_call"}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let (status, task) = server.get("/api/tasks/mine").await;
    assert_eq!(status, StatusCode::OK, "{task}");
    assert_eq!(task["state"]["status"], "pending");

    theirs
        .create(create("theirs", "fetch", &json!({})))
        .await
        .unwrap();
    let events = read_events(live, 2).await;
    let tasks: Vec<(u64, &str)> = events
        .iter()
        .map(|(seq, data)| (*seq, data["task"].as_str().unwrap()))
        .collect();
    assert_eq!(tasks, [(1, "mine"), (2, "theirs")]);
    let (_, list) = server.get("/api/tasks").await;
    let ids: Vec<&str> = list["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["mine", "theirs"]);
    let (_, stats) = server.get("/api/stats").await;
    assert_eq!(stats["mode"], "owner");
    assert!(stats["postgres_schema"].as_u64().is_some(), "{stats}");
    server.stop().await;
}

/// Reads server-sent events from `response` until `n` records arrived; returns their ids and
/// data.
async fn read_events(response: reqwest::Response, n: usize) -> Vec<(u64, Value)> {
    let mut body = response.bytes_stream();
    let mut text = String::new();
    let mut events = Vec::new();
    while events.len() < n {
        let chunk = tokio::time::timeout(Duration::from_secs(60), body.next())
            .await
            .expect("an event within a minute")
            .expect("the stream goes on")
            .unwrap();
        text.push_str(std::str::from_utf8(&chunk).unwrap());
        while let Some(end) = text.find("\n\n") {
            let block: String = text.drain(..end + 2).collect();
            let (mut id, mut data, mut kind) = (None, None, None);
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("id: ") {
                    id = Some(v.parse::<u64>().unwrap());
                } else if let Some(v) = line.strip_prefix("data: ") {
                    data = Some(serde_json::from_str::<Value>(v).unwrap());
                } else if let Some(v) = line.strip_prefix("event: ") {
                    kind = Some(v.to_owned());
                }
            }
            if let (Some(id), Some(data)) = (id, data) {
                assert_eq!(kind.as_deref(), Some("record"));
                events.push((id, data));
            }
        }
    }
    events
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stream_carries_commits_in_order_and_resumes_after_last_event_id() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_store(dir.path());
    let server = Running::start(Server::owner(store.clone(), None, fast())).await;
    let live = server.stream("/api/stream?from_seq=1").await;
    assert!(live.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let only_b = server.http.get(server.url("/api/tasks/b/stream"));
    for id in ["a", "b", "c"] {
        store.create(create(id, "shell", &json!({}))).await.unwrap();
    }
    let only_b = only_b.send().await.unwrap();
    store.execute("b", 1, Cmd::Start).await.unwrap();
    store
        .execute("a", 1, Cmd::RequestCancel { reason: "r".into() })
        .await
        .unwrap();

    let events = read_events(live, 5).await;
    let seqs: Vec<u64> = events.iter().map(|e| e.0).collect();
    assert_eq!(seqs, [1, 2, 3, 4, 5], "every commit, in order");
    for (seq, data) in &events {
        assert_eq!(data["seq"].as_u64(), Some(*seq));
    }
    assert_eq!(events[0].1["task"], "a");
    assert_eq!(events[0].1["type"], "created");
    assert_eq!(events[3].1["type"], "attempt_started");

    let b = read_events(only_b, 2).await;
    assert!(b.iter().all(|(_, d)| d["task"] == "b"), "{b:?}");
    assert_eq!(b[0].1["type"], "created");
    assert_eq!(b[1].1["type"], "attempt_started");

    let resumed = server
        .http
        .get(server.url("/api/stream"))
        .header("last-event-id", "3")
        .send()
        .await
        .unwrap();
    let after = read_events(resumed, 2).await;
    assert_eq!(after.iter().map(|e| e.0).collect::<Vec<_>>(), [4, 5]);
    // A task's stream resumes after its own last event id, and after one of another task's.
    for (last, expected) in [("2", 4), ("3", 4)] {
        let resumed = server
            .http
            .get(server.url("/api/tasks/b/stream"))
            .header("last-event-id", last)
            .send()
            .await
            .unwrap();
        let after = read_events(resumed, 1).await;
        assert_eq!(after[0].0, expected, "after {last}");
        assert_eq!(after[0].1["type"], "attempt_started");
    }

    // A stream open at shutdown does not hold the server.
    let _open = server
        .http
        .get(server.url("/api/stream"))
        .send()
        .await
        .unwrap();
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_that_falls_behind_its_buffer_misses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_store(dir.path());
    let config = fast().with_stream_buffer(16);
    let server = Running::start(Server::owner(store.clone(), None, config)).await;
    let slow = server
        .http
        .get(server.url("/api/stream?from_seq=1"))
        .send()
        .await
        .unwrap();
    let tasks = 400;
    for i in 0..tasks {
        store
            .create(create(&format!("t{i:04}"), "shell", &json!({})))
            .await
            .unwrap();
    }
    let events = read_events(slow, tasks).await;
    let seqs: Vec<u64> = events.iter().map(|e| e.0).collect();
    assert_eq!(seqs, (1..=tasks as u64).collect::<Vec<_>>());
    server.stop().await;
}

/// Pages of records and updates end at a byte budget too (with `next_from` and a cursor
/// going on from there): records of a megabyte each made pages of gigabytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_of_large_records_end_at_their_byte_budget() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_store(dir.path());
    store
        .create(create("big", "shell", &json!({})))
        .await
        .unwrap();
    let s = store.execute("big", 1, Cmd::Start).await.unwrap();
    for i in 0..12 {
        store
            .append_update(
                "big",
                UpdateRequest {
                    attempt: s.attempt,
                    event_id: format!("u{i}"),
                    kind: "chunk".into(),
                    data: vec![b'x'; 1_000_000],
                    ..UpdateRequest::default()
                },
            )
            .await
            .unwrap();
    }
    let server = Running::start(Server::owner(store, None, fast())).await;
    let (status, page) = server.get("/api/tasks/big/records?limit=5000").await;
    assert_eq!(status, StatusCode::OK);
    let listed = page["records"].as_array().unwrap().len();
    assert!((1..14).contains(&listed), "{listed} records in one page");
    assert_eq!(page["next_from"], json!(listed));
    let (_, rest) = server
        .get(&format!("/api/tasks/big/records?from={listed}&limit=5000"))
        .await;
    assert_eq!(
        listed + rest["records"].as_array().unwrap().len(),
        14,
        "the next page goes on where the first ended"
    );
    // Updates, by their cursor: every one once.
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..20 {
        let path = match &cursor {
            None => "/api/tasks/big/updates?limit=1000".to_owned(),
            Some(c) => format!("/api/tasks/big/updates?limit=1000&cursor={c}"),
        };
        let (status, page) = server.get(&path).await;
        assert_eq!(status, StatusCode::OK);
        let updates = page["updates"].as_array().unwrap();
        if updates.is_empty() {
            break;
        }
        assert!(updates.len() < 12, "one page held them all");
        seen.extend(
            updates
                .iter()
                .map(|u| u["event_id"].as_str().unwrap().to_owned()),
        );
        cursor = Some(page["next_cursor"].as_str().unwrap().to_owned());
    }
    let expected: Vec<String> = (0..12).map(|i| format!("u{i}")).collect();
    assert_eq!(seen, expected);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_task_list_pages_with_a_cursor() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_store(dir.path());
    for i in 0..7 {
        let executor = if i % 2 == 0 { "even" } else { "odd" };
        store
            .create(create(&format!("t{i}"), executor, &json!({})))
            .await
            .unwrap();
    }
    let server = Running::start(Server::owner(store, None, fast())).await;
    let mut seen = Vec::new();
    let mut path = "/api/tasks?limit=3&executor=even".to_owned();
    loop {
        let (status, page) = server.get(&path).await;
        assert_eq!(status, StatusCode::OK, "{page}");
        for t in page["tasks"].as_array().unwrap() {
            assert_eq!(t["executor"], "even");
            seen.push(t["id"].as_str().unwrap().to_owned());
        }
        match page["next_cursor"].as_str() {
            Some(c) => path = format!("/api/tasks?limit=3&executor=even&cursor={c}"),
            None => break,
        }
    }
    assert_eq!(seen, ["t0", "t2", "t4", "t6"]);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_of_long_streams_ends_at_its_record_budget_and_goes_on_from_its_cursor() {
    // Four tasks of 20,000 records each: a page folds at most 50,000 records, so the first
    // page ends after the third task (the budget is checked before each task) and the next
    // page, from its cursor, has the fourth.
    let dir = tempfile::tempdir().unwrap();
    let writer = Journal::open(dir.path(), JournalOptions::default()).unwrap();
    for t in 0..4 {
        let id = format!("long{t}");
        let mut events = vec![
            Event::created(
                TaskSpec::new(&id, "shell"),
                LeasePolicy::Retry,
                Timestamp(1_000),
            ),
            Event::AttemptStarted {
                attempt: 1,
                lease_deadline: Timestamp(u64::MAX / 2),
                at: Timestamp(1_000),
            },
        ];
        events.extend((0..19_998).map(|i| Event::UpdateAppended {
            attempt: 1,
            event_id: format!("e{i}"),
            kind: "progress".into(),
            data: vec![],
            metadata: vec![],
            at: Timestamp(1_001),
        }));
        let mut position = 0;
        for chunk in events.chunks(1_000) {
            writer.append_async(&id, position, chunk).await.unwrap();
            position += chunk.len() as u64;
        }
    }
    drop(writer);
    let server = Running::start(Server::follower(
        Journal::open_read_only(dir.path()).unwrap(),
        fast(),
    ))
    .await;
    let (status, first) = server.get("/api/tasks?limit=50").await;
    assert_eq!(status, StatusCode::OK, "{first}");
    let ids = |page: &Value| -> Vec<String> {
        page["tasks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["id"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(ids(&first), ["long0", "long1", "long2"], "{first}");
    assert_eq!(first["tasks"][0]["records"], 20_000);
    assert_eq!(first["scanned"], 3);
    let cursor = first["next_cursor"]
        .as_str()
        .expect("a cursor after the budget");
    let (status, second) = server
        .get(&format!("/api/tasks?limit=50&cursor={cursor}"))
        .await;
    assert_eq!(status, StatusCode::OK, "{second}");
    assert_eq!(ids(&second), ["long3"], "{second}");
    assert_eq!(second["next_cursor"], Value::Null);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_stats_and_metrics_describe_the_journal() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_store(dir.path());
    store
        .create(create("a", "shell", &json!({})))
        .await
        .unwrap();
    store
        .create(create("b", "fetch", &json!({})))
        .await
        .unwrap();
    store.execute("b", 1, Cmd::Start).await.unwrap();
    let server = Running::start(Server::owner(store, None, fast())).await;

    let (status, report) = server.post("/api/verify", &json!({})).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(report["clean"], true, "{report}");
    assert_eq!(
        (report["scope"].as_str(), report["tasks"].as_u64()),
        (Some("journal"), Some(2))
    );
    let (_, one) = server.post("/api/verify?task=b", &json!({})).await;
    assert_eq!(
        (
            one["scope"].as_str(),
            one["tasks"].as_u64(),
            one["records"].as_u64()
        ),
        (Some("task"), Some(1), Some(2))
    );

    let stats = server.wait_seq(3).await;
    assert_eq!(stats["tasks"], 2);
    assert_eq!(stats["records"], 3);
    assert_eq!(stats["by_status"]["pending"], 1);
    assert_eq!(stats["by_status"]["running"], 1);
    assert_eq!(stats["by_executor"]["fetch"], 1);
    assert_eq!(stats["by_type"]["created"], 2);
    // The storage engine's figures: the records wait in a memtable (none flushed yet).
    let spaces = stats["storage"]["spaces"].as_array().unwrap();
    let events = spaces.iter().find(|s| s["name"] == "events").unwrap();
    assert!(events["memtable_bytes"].as_u64().unwrap() > 0, "{stats}");
    assert_eq!(stats["storage"]["write_stopped"], false, "{stats}");
    assert!(stats["storage"]["direct_table_io"].is_boolean(), "{stats}");
    // What a synced append promises where the journal lies, as `dtask probe` judges it.
    let promise = stats["sync_promise"]["promise"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        ["stable", "flushed", "lost", "unknown"].contains(&promise.as_str()),
        "{stats}"
    );
    assert!(stats["sync_promise"]["why"]
        .as_str()
        .is_some_and(|w| !w.is_empty()));

    let (status, _) = server.get("/api/tasks/nope").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let response = server
        .http
        .get(server.url("/metrics"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert!(response.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("application/openmetrics-text"));
    let text = response.text().await.unwrap();
    for line in [
        r#"dtask_http_requests_total{route="/api/tasks/{id}",method="GET",status="404"} 1"#,
        r#"dtask_http_requests_total{route="/api/verify",method="POST",status="200"} 2"#,
        r#"dtask_tasks{status="running"} 1"#,
        r#"dtask_tasks{status="pending"} 1"#,
        r#"dtask_tasks{status="completed"} 0"#,
        r#"dtask_tasks_by_executor{executor="shell"} 1"#,
        r#"dtask_journal_records_by_type{event_type="attempt_started"} 1"#,
        "dtask_journal_last_sequence 3",
        r#"dtask_verify_runs_total{result="clean"} 2"#,
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "missing {line:?} in\n{text}"
        );
    }
    // A method of the client's own making is counted as `other`: the labels stay bounded.
    let odd = server
        .http
        .request(
            reqwest::Method::from_bytes(b"FROBNICATE").unwrap(),
            server.url("/x"),
        )
        .send()
        .await
        .unwrap();
    assert!(odd.status().is_client_error(), "{}", odd.status());
    let text = server.text("/metrics").await;
    assert!(
        text.contains(r#"route="unmatched",method="other""#) && !text.contains("FROBNICATE"),
        "{text}"
    );
    let promised = format!(r#"dtask_journal_sync_promise{{promise="{promise}"}} 1"#);
    assert!(
        text.lines().any(|l| l == promised),
        "missing {promised:?} in\n{text}"
    );
    assert!(text.ends_with("# EOF\n"));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_web_page_and_its_assets_are_served() {
    let dir = tempfile::tempdir().unwrap();
    let server = Running::start(Server::owner(open_store(dir.path()), None, fast())).await;
    let page = server.http.get(server.url("/")).send().await.unwrap();
    assert_eq!(page.status(), StatusCode::OK);
    assert!(page.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/html"));
    assert!(page.headers().contains_key("content-security-policy"));
    let html = page.text().await.unwrap();
    assert!(html.contains(r#"<script src="/assets/app.js"></script>"#));
    for (path, kind, needle) in [
        ("/assets/app.js", "text/javascript", "new EventSource"),
        ("/assets/app.js", "text/javascript", "sync-promise"),
        ("/assets/style.css", "text/css", ".timeline"),
    ] {
        let r = server.http.get(server.url(path)).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::OK, "{path}");
        assert!(
            r.headers()["content-type"]
                .to_str()
                .unwrap()
                .starts_with(kind),
            "{path}"
        );
        assert!(r.text().await.unwrap().contains(needle), "{path}");
    }
    server.stop().await;
}

/// `/healthz` and `/readyz` answer without the token (and tell only the names of states);
/// readiness waits for the server's first count of the journal — a router served without
/// its pump never counts, and is never ready — and a served one becomes ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn liveness_and_readiness_answer_without_the_token_and_readiness_waits_for_the_count() {
    let token = "s3cret-token-for-tests";
    let dir = tempfile::tempdir().unwrap();
    let store = open_store(dir.path());
    let server = Server::owner(store.clone(), None, fast().with_token(token));

    // The routes alone, without the pump that counts the journal.
    let server_routes = server.router();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let routes = tokio::spawn(async move { axum::serve(listener, server_routes).await });
    let http = reqwest::Client::new();
    let get = |path: &str| {
        let request = http.get(format!("{base}{path}"));
        async move {
            let response = request.send().await.unwrap();
            (response.status(), response.json::<Value>().await.unwrap())
        }
    };
    assert_eq!(
        get("/healthz").await,
        (StatusCode::OK, json!({"status": "ok", "reasons": []}))
    );
    assert_eq!(
        get("/readyz").await,
        (
            StatusCode::SERVICE_UNAVAILABLE,
            json!({"status": "unavailable", "reasons": ["counting"]})
        )
    );
    let (status, body) = get("/api/stats").await;
    assert_eq!(
        (status, code(&body)),
        (StatusCode::UNAUTHORIZED, "unauthorized")
    );
    routes.abort();

    // Served: the pump counts, and the server is ready.
    let running = Running::start(server).await;
    let mut answer = (StatusCode::SERVICE_UNAVAILABLE, Value::Null);
    // Bounded: a guard against a hang, no measure.
    for _ in 0..1_000 {
        answer = running.get("/readyz").await;
        if answer.0 == StatusCode::OK {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        answer,
        (StatusCode::OK, json!({"status": "ok", "reasons": []}))
    );
    assert_eq!(running.get("/healthz").await.0, StatusCode::OK);
    let metrics = running
        .http
        .get(running.url("/metrics"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(metrics.contains("\ndtask_ready 1\n"), "{metrics}");
    assert!(metrics.contains("\ndtask_journal_stopped 0\n"), "{metrics}");
    running.stop().await;
    drop(store);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_is_required_off_loopback_and_checked_on_every_request() {
    let off_loopback: std::net::SocketAddr = "0.0.0.0:7700".parse().unwrap();
    assert!(matches!(
        Server::check_listen(off_loopback, None),
        Err(ServerError::TokenRequired(_))
    ));
    assert!(matches!(
        Server::check_listen(off_loopback, Some("short")),
        Err(ServerError::WeakToken { .. })
    ));
    assert!(Server::check_listen(off_loopback, Some("a-long-enough-token")).is_ok());
    assert!(Server::check_listen("127.0.0.1:7700".parse().unwrap(), None).is_ok());
    assert!(Server::check_listen("[::1]:7700".parse().unwrap(), None).is_ok());

    // Serving on an unspecified address without a token refuses to start.
    let dir = tempfile::tempdir().unwrap();
    let listener = tokio::net::TcpListener::bind("0.0.0.0:0").await.unwrap();
    let refused = Server::owner(open_store(dir.path()), None, fast())
        .serve(listener, std::future::pending())
        .await;
    assert!(
        matches!(refused, Err(ServerError::TokenRequired(_))),
        "{refused:?}"
    );

    let token = "s3cret-token-for-tests";
    let other = tempfile::tempdir().unwrap();
    let server = Running::start(Server::owner(
        open_store(other.path()),
        None,
        fast().with_token(token),
    ))
    .await;
    for path in [
        "/api/tasks",
        "/metrics",
        "/",
        "/openapi.json",
        "/api/stream",
    ] {
        let r = server.http.get(server.url(path)).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "{path}");
        let r = server
            .http
            .get(server.url(path))
            .bearer_auth("s3cret-token-for-testz")
            .send()
            .await
            .unwrap();
        assert_eq!(
            r.status(),
            StatusCode::UNAUTHORIZED,
            "{path} with a wrong token"
        );
    }
    let (status, body) = {
        let r = server
            .http
            .get(server.url("/api/tasks"))
            .send()
            .await
            .unwrap();
        (r.status(), r.json::<Value>().await.unwrap())
    };
    assert_eq!(
        (status, code(&body)),
        (StatusCode::UNAUTHORIZED, "unauthorized")
    );
    let r = server
        .http
        .get(server.url("/api/tasks"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let r = server
        .http
        .post(server.url("/api/tasks"))
        .bearer_auth(token)
        .json(&json!({"executor_key": "x"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    // The browser's way: the token once in the address, then a cookie.
    let no_redirects = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let r = no_redirects
        .get(server.url(&format!("/?token={token}")))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let cookie = r.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_owned();
    assert_eq!(cookie, format!("dtask_token={token}"));
    let r = server
        .http
        .get(server.url("/api/stats"))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    // The page behind a proxy that passes its own `Host`: the public origin cannot match
    // it, and the browser's `Sec-Fetch-Site` says the page is the server's own.
    let posted = |site: &'static str| {
        server
            .http
            .post(server.url("/api/tasks"))
            .header("cookie", &cookie)
            .header("origin", "https://dtask.example.com")
            .header("sec-fetch-site", site)
            .json(&json!({"executor_key": "x"}))
            .send()
    };
    assert_eq!(
        posted("same-origin").await.unwrap().status(),
        StatusCode::CREATED
    );
    assert_eq!(
        posted("cross-site").await.unwrap().status(),
        StatusCode::FORBIDDEN
    );
    let r = no_redirects
        .get(server.url("/?token=wrong"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    server.stop().await;
}

/// The committed document, found through the package directory read when the test runs (not
/// when it was compiled), so a test binary reused from a build in another checkout — one
/// shared target directory — compares against this checkout's file.
fn committed_openapi() -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| PathBuf::from("."), PathBuf::from)
        .join("docs/openapi.json")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_served_openapi_document_is_the_committed_one() {
    let dir = tempfile::tempdir().unwrap();
    let server = Running::start(Server::owner(open_store(dir.path()), None, fast())).await;
    let r = server
        .http
        .get(server.url("/openapi.json"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let served = r.text().await.unwrap();
    server.stop().await;
    let document: Value = serde_json::from_str(&served).unwrap();
    assert!(document["openapi"].as_str().unwrap().starts_with("3."));
    for path in [
        "/api/tasks",
        "/api/tasks/{id}",
        "/api/tasks/{id}/records",
        "/api/tasks/{id}/state",
        "/api/tasks/{id}/updates",
        "/api/tasks/{id}/cancel",
        "/api/tasks/{id}/resume",
        "/api/tasks/{id}/release",
        "/api/tasks/{id}/rerun",
        "/api/verify",
        "/api/stats",
        "/api/stream",
        "/api/tasks/{id}/stream",
        "/metrics",
        "/openapi.json",
    ] {
        assert!(
            document["paths"].get(path).is_some(),
            "{path} is not in the document"
        );
    }
    let committed = committed_openapi();
    if std::env::var_os("DTASK_BLESS").is_some() {
        std::fs::write(&committed, &served).unwrap();
        return;
    }
    let on_disk = std::fs::read_to_string(&committed).unwrap_or_default();
    assert!(
        on_disk == served,
        "docs/openapi.json differs from the served document: rerun with DTASK_BLESS=1 to \
         rewrite it, and review the diff"
    );
}

#[test]
fn the_cli_refuses_a_non_loopback_address_without_a_token() {
    let dir = tempfile::tempdir().unwrap();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_dtask"))
        .args(["serve", "--listen", "0.0.0.0:0", "--journal"])
        .arg(dir.path())
        .env_remove("DTASK_TOKEN")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("refusing to listen on 0.0.0.0:0 without a token"),
        "{stderr}"
    );
    assert!(stderr.contains("--token"), "{stderr}");
}

/// `dtask serve` run on loopback over the journal `dir`, its standard error read up to the
/// line that names its address.
struct ServedCli {
    child: std::process::Child,
    stderr: std::io::BufReader<std::process::ChildStderr>,
    /// The first line: the address, the mode, the journal.
    first: String,
    addr: String,
}

impl ServedCli {
    fn start(dir: &std::path::Path) -> Self {
        use std::io::BufRead;
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_dtask"))
            .args(["serve", "--listen", "127.0.0.1:0", "--journal"])
            .arg(dir)
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut stderr = std::io::BufReader::new(child.stderr.take().unwrap());
        let mut first = String::new();
        stderr.read_line(&mut first).unwrap();
        let addr = first
            .split("http://")
            .nth(1)
            .and_then(|rest| rest.split('/').next())
            .unwrap_or_else(|| panic!("no address in {first:?}"))
            .to_owned();
        Self {
            child,
            stderr,
            first,
            addr,
        }
    }

    /// The next line of its standard error.
    fn line(&mut self) -> String {
        let mut line = String::new();
        std::io::BufRead::read_line(&mut self.stderr, &mut line).unwrap();
        line
    }

    /// The bodies of GETs of `paths`.
    fn get(&self, paths: &[&str]) -> Vec<String> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let mut bodies = Vec::new();
            for path in paths {
                let url = format!("http://{}{path}", self.addr);
                bodies.push(reqwest::get(url).await.unwrap().text().await.unwrap());
            }
            bodies
        })
    }

    /// Stops it with SIGTERM: its exit code and the rest of its standard error.
    fn stop(mut self) -> (Option<i32>, String) {
        let killed = std::process::Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(killed.success());
        let status = self.child.wait().unwrap();
        let mut rest = String::new();
        std::io::Read::read_to_string(&mut self.stderr, &mut rest).unwrap();
        (status.code(), rest)
    }
}

#[test]
fn the_cli_serves_until_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let served = ServedCli::start(dir.path());
    assert!(served.first.contains("owner"), "{}", served.first);
    let stats: Value = serde_json::from_str(&served.get(&["/api/stats"])[0]).unwrap();
    assert_eq!(stats["mode"], "owner");
    let (code, rest) = served.stop();
    assert_eq!(code, Some(0));
    assert!(rest.contains("stopped"), "{rest}");
    // The journal is free again: a writable open succeeds.
    Journal::open(dir.path(), JournalOptions::default()).unwrap();
}

/// A journal in memory is served, with a warning after the address that its synced appends
/// do not survive a power failure; the API and the metrics say it too.
#[cfg(target_os = "linux")]
#[test]
fn the_cli_warns_when_it_serves_a_journal_in_memory() {
    let Ok(shm) = tempfile::tempdir_in("/dev/shm") else {
        eprintln!("SKIPPED the_cli_warns_when_it_serves_a_journal_in_memory: no /dev/shm");
        return;
    };
    let mut served = ServedCli::start(shm.path());
    let second = served.line();
    let bodies = served.get(&["/api/stats", "/metrics"]);
    let (code, _) = served.stop();
    assert_eq!(code, Some(0));
    assert!(
        second.contains("warning: the journal's synced appends will not survive a power failure")
            && second.contains("tmpfs"),
        "{second}"
    );
    let stats: Value = serde_json::from_str(&bodies[0]).unwrap();
    assert_eq!(stats["sync_promise"]["promise"], "lost", "{stats}");
    assert!(
        bodies[1]
            .lines()
            .any(|l| l == r#"dtask_journal_sync_promise{promise="lost"} 1"#),
        "{}",
        bodies[1]
    );
}

/// `POST /api/tasks/{id}/inputs` puts an input into a running task's mailbox (the task keeps
/// running), deduplicates by event id, wakes a task waiting for input, and refuses an ended
/// task's sealed mailbox and bad bodies with JSON 4xx errors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inputs_reach_a_running_task_and_are_deduplicated() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_store(dir.path());
    let payload = json!({"tool_name": "agent"});
    store
        .create(create("run", "agent", &payload))
        .await
        .unwrap();
    store.execute("run", 1, Cmd::Start).await.unwrap();
    store
        .create(create("done", "agent", &payload))
        .await
        .unwrap();
    let d = store.execute("done", 1, Cmd::Start).await.unwrap();
    store
        .execute("done", d.version, Cmd::Complete { data: vec![] })
        .await
        .unwrap();
    let server = Running::start(Server::owner(store.clone(), None, fast())).await;

    let body = json!({"event_id": "m1", "kind": "user_message", "data": "use the replica"});
    let (status, sent) = server.post("/api/tasks/run/inputs", &body).await;
    assert_eq!(status, StatusCode::OK, "{sent}");
    assert_eq!(
        (sent["sequence"].as_u64(), sent["inserted"].as_bool()),
        (Some(1), Some(true))
    );
    let (_, again) = server.post("/api/tasks/run/inputs", &body).await;
    assert_eq!(again["inserted"], false);
    let (_, task) = server.get("/api/tasks/run").await;
    assert_eq!(task["state"]["status"], "running");
    assert_eq!(task["state"]["inputs_received"], 1);
    assert_eq!(
        store.list_inputs("run", 0, 10).await.unwrap().inputs[0].data,
        b"use the replica"
    );

    let (status, err) = server
        .post(
            "/api/tasks/run/inputs",
            &json!({"event_id": "m1", "kind": "user_message", "data": "other"}),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{err}");
    let (status, err) = server
        .post(
            "/api/tasks/done/inputs",
            &json!({"event_id": "m", "kind": "k"}),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{err}");
    assert!(err["error"]["message"].as_str().unwrap().contains("sealed"));
    let (status, err) = server
        .post(
            "/api/tasks/run/inputs",
            &json!({"event_id": "m2", "kind": "k", "delivery": "someday"}),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{err}");
    let (status, _) = server
        .post(
            "/api/tasks/run/inputs",
            &json!({"event_id": "m2", "kind": "k", "extra": 1}),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    server.stop().await;
}

/// The outbox over HTTP: a session's notifications are leased with fresh receipts (each
/// with its delivery and its whole data), skipped while leased, handed out again once a
/// lease expires (the old receipt superseded), and gone for good once acknowledged; an
/// acknowledgement after its lease is refused and the notification stays. The lease runs on
/// the store's manual clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_outbox_is_leased_and_acknowledged_over_http() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(1_700_000_000_000);
    let journal = Journal::open(dir.path(), JournalOptions::default()).unwrap();
    let store = TaskStore::open(journal.clone(), clock.clone(), StoreConfig::default()).unwrap();
    let mut request = create("job", "agent", &json!({"tool_name": "agent"}));
    request.spec.session_id = "chat-1".into();
    store.create(request).await.unwrap();
    let started = store.execute("job", 1, Cmd::Start).await.unwrap();
    store
        .enqueue_notification(
            "job",
            started.attempt,
            NotificationRequest::new("stop", "urgent", b"over budget".to_vec()).preempt(),
        )
        .await
        .unwrap();
    let server = Running::start(Server::owner(store.clone(), None, fast())).await;
    let receive = |lease_ms: u64| json!({"lease_ms": lease_ms});
    let stats = server.wait_seq(store.journal().last_seq().unwrap()).await;
    assert_eq!(stats["outbox"], 2, "the backlog: {stats}");

    // Another session's consumer gets nothing; this session's gets both.
    let (status, other) = server
        .post(
            "/api/notifications/receive",
            &json!({"lease_ms": 60_000, "session": "chat-2"}),
        )
        .await;
    assert_eq!(
        (status, &other["notifications"]),
        (StatusCode::OK, &json!([]))
    );
    let (status, got) = server
        .post(
            "/api/notifications/receive",
            &json!({"lease_ms": 60_000, "session": "chat-1"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{got}");
    let list = got["notifications"].as_array().unwrap();
    let seen: Vec<_> = list
        .iter()
        .map(|n| {
            (
                n["kind"].as_str().unwrap(),
                n["delivery"].as_str().unwrap(),
                n["task_id"].as_str().unwrap(),
                n["session_id"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            ("task_created", "queued", "job", "chat-1"),
            ("urgent", "preempt", "job", "chat-1")
        ]
    );
    assert_eq!(list[1]["data"]["text"], "over budget");
    assert_eq!(list[1]["data"]["base64"], "b3ZlciBidWRnZXQ=");
    assert_eq!(list[1]["created_at"], 1_700_000_000_000u64);
    let (created, urgent) = (
        list[0]["receipt"].as_str().unwrap().to_owned(),
        list[1]["receipt"].as_str().unwrap().to_owned(),
    );
    assert_ne!(created, urgent);

    // Leased: nothing more to hand out.
    let (_, again) = server
        .post("/api/notifications/receive", &receive(60_000))
        .await;
    assert_eq!(again["notifications"], json!([]));

    // Acknowledged once; a second time the receipt is unknown.
    let (status, acked) = server
        .post("/api/notifications/ack", &json!({"receipt": created}))
        .await;
    assert_eq!(
        (status, &acked["receipt"]),
        (StatusCode::OK, &json!(created))
    );
    let (status, err) = server
        .post("/api/notifications/ack", &json!({"receipt": created}))
        .await;
    assert_eq!((status, code(&err)), (StatusCode::NOT_FOUND, "not_found"));

    // A receive that waits (long polling) answers with what is queued while it waits: once
    // it waits (the gauge counts it), a notification is queued.
    let waiting = server.spawn_post(
        "/api/notifications/receive",
        json!({"lease_ms": 60_000, "wait_ms": 30_000}),
    );
    server.until_receive_waits().await;
    store
        .enqueue_notification(
            "job",
            started.attempt,
            NotificationRequest::new("more", "finding", b"src/a.rs".to_vec()),
        )
        .await
        .unwrap();
    let (status, woke) = waiting.await.unwrap();
    assert_eq!(status, StatusCode::OK, "{woke}");
    assert_eq!(woke["notifications"][0]["kind"], "finding", "{woke}");
    assert_eq!(woke["notifications"][0]["delivery"], "queued");
    assert!(server
        .text("/metrics")
        .await
        .contains("dtask_notification_receives_waiting 0\n"));
    let more = woke["notifications"][0]["receipt"].clone();
    let (status, _) = server
        .post("/api/notifications/ack", &json!({ "receipt": more }))
        .await;
    assert_eq!(status, StatusCode::OK);

    // The lease runs out: the notification comes again with a fresh receipt, the old one
    // superseded.
    clock.advance(Duration::from_mins(1));
    let (_, redelivered) = server
        .post("/api/notifications/receive", &receive(1_000))
        .await;
    let list = redelivered["notifications"].as_array().unwrap();
    assert_eq!(list.len(), 1, "{redelivered}");
    assert_eq!(list[0]["kind"], "urgent");
    let fresh = list[0]["receipt"].as_str().unwrap().to_owned();
    assert_ne!(fresh, urgent);
    let (status, _) = server
        .post("/api/notifications/ack", &json!({"receipt": urgent}))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // An acknowledgement after its lease is refused; the notification stays deliverable.
    clock.advance(Duration::from_secs(1));
    let (status, err) = server
        .post("/api/notifications/ack", &json!({"receipt": fresh}))
        .await;
    assert_eq!(
        (status, code(&err)),
        (StatusCode::CONFLICT, "conflict"),
        "{err}"
    );
    assert_eq!(journal.outbox_len().unwrap(), 1);
    let (_, last) = server
        .post("/api/notifications/receive", &receive(1_000))
        .await;
    let receipt = last["notifications"][0]["receipt"]
        .as_str()
        .unwrap()
        .to_owned();
    let (status, _) = server
        .post("/api/notifications/ack", &json!({"receipt": receipt}))
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(journal.outbox_len().unwrap(), 0, "the outbox is empty");
    // The backlog the stats answer is the counts' (as of the last record the server read).
    let stats = server.wait_seq(journal.last_seq().unwrap()).await;
    assert_eq!(stats["outbox"], 0, "{stats}");

    // Client mistakes.
    for body in [
        json!({"lease_ms": 0}),
        json!({}),
        json!({"lease_ms": 10, "extra": true}),
        json!({"lease_ms": -1}),
        json!({"lease_ms": 10, "wait_ms": 60_001}),
    ] {
        let (status, err) = server.post("/api/notifications/receive", &body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {err}");
    }
    let (status, _) = server.post("/api/notifications/ack", &json!({})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);

    // A receive waiting when the server stops answers, empty, rather than holding the
    // shutdown for its whole wait.
    let waiting = server.spawn_post(
        "/api/notifications/receive",
        json!({"lease_ms": 1_000, "wait_ms": 60_000}),
    );
    server.until_receive_waits().await;
    server.stop().await;
    let (status, body) = tokio::time::timeout(Duration::from_secs(30), waiting)
        .await
        .expect("the waiting receive answered at the stop")
        .unwrap();
    assert_eq!(
        (status, &body["notifications"]),
        (StatusCode::OK, &json!([]))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_path_and_engine_metrics_count_what_happened() {
    let dir = tempfile::tempdir().unwrap();
    let clock = dtask_engine::ManualClock::new(1_000);
    let journal = Journal::open(dir.path(), JournalOptions::default()).unwrap();
    let store = TaskStore::open(
        journal,
        clock.clone(),
        StoreConfig::default().with_lease_duration(Duration::from_secs(10)),
    )
    .unwrap();
    // The server installs its observer: every append from here on is counted.
    let server = Running::start(Server::owner(store.clone(), None, fast())).await;

    store
        .create(create("r", "shell", &json!({})))
        .await
        .unwrap(); // 1 append
    let running = store.execute("r", 1, Cmd::Start).await.unwrap(); // 2
    let marked = store
        .execute(
            "r",
            running.version,
            Cmd::CommitStart {
                checkpoint: b"pid 42".to_vec(),
            },
        )
        .await
        .unwrap(); // 3
    let update = UpdateRequest {
        attempt: 1,
        event_id: "e1".into(),
        kind: "progress".into(),
        data: b"half".to_vec(),
        ..UpdateRequest::default()
    };
    let (_, new) = store.append_update("r", update.clone()).await.unwrap(); // 4
    assert!(new);
    let (_, new) = store.append_update("r", update).await.unwrap(); // answered, no append
    assert!(!new);
    // The lease runs out: the attempt expires (5), and the next one recovers the tool (6).
    clock.advance(Duration::from_secs(11));
    assert_eq!(store.sweep_expired().await.unwrap(), 1);
    let state = store.get("r").await.unwrap();
    assert_eq!(state.status, Status::Pending);
    assert!(state.version > marked.version);
    let again = store.execute("r", state.version, Cmd::Start).await.unwrap();
    assert_eq!(again.attempt, 2);

    let last = store.journal().last_seq().unwrap();
    server.wait_seq(last).await;
    let text = server.text("/metrics").await;
    // Every value asked for is a whole number (a histogram's sum prints as `6.0`).
    let value = |name: &str| -> u64 {
        text.lines()
            .find_map(|l| {
                let v = l.strip_prefix(name)?.strip_prefix(' ')?;
                v.strip_suffix(".0").unwrap_or(v).parse().ok()
            })
            .unwrap_or_else(|| panic!("no {name} in\n{text}"))
    };
    assert_eq!(value("dtask_journal_appends_total"), 6);
    assert_eq!(value("dtask_journal_records_written_total"), last);
    assert!(value("dtask_journal_bytes_written_total") > 0);
    assert_eq!(value("dtask_journal_append_conflicts_total"), 0);
    assert_eq!(value("dtask_journal_append_seconds_count"), 6);
    assert_eq!(value("dtask_journal_batch_appends_sum"), 6);
    assert!(value("dtask_journal_batches_total") >= 1);
    assert!(value("dtask_journal_sync_seconds_count") >= 1);
    assert_eq!(value("dtask_journal_sync_failures_total"), 0);
    assert_eq!(value("dtask_journal_batch_failures_total"), 0);
    assert_eq!(value("dtask_journal_disk_full"), 0);
    assert_eq!(value("dtask_attempts_started"), 2);
    assert_eq!(value("dtask_attempts_recovered"), 1);
    assert_eq!(value("dtask_leases_expired"), 1);
    assert_eq!(value("dtask_updates_deduplicated_total"), 1);
    assert_eq!(value("dtask_inputs_deduplicated_total"), 0);
    assert_eq!(value("dtask_progress_capped_total"), 0);
    assert_eq!(value("dtask_updates_over_limit_total"), 0);
    assert_eq!(value("dtask_outbox_backlog"), 0);
    // The storage engine's own state: the records wait in the `events` memtable (nothing
    // flushed in so short a run), no write is held back.
    assert!(value(r#"dtask_storage_memtable_bytes{space="events"}"#) > 0);
    assert_eq!(value(r#"dtask_storage_table_bytes{space="events"}"#), 0);
    assert_eq!(value(r#"dtask_storage_level0_files{space="commits"}"#), 0);
    assert!(value(r#"dtask_storage_estimated_keys{space="commits"}"#) >= last);
    assert_eq!(value("dtask_storage_write_stopped"), 0);
    assert_eq!(value("dtask_storage_delayed_write_rate_bytes"), 0);
    assert_eq!(value("dtask_storage_background_errors"), 0);
    let direct = store
        .journal()
        .storage_stats()
        .unwrap()
        .unwrap()
        .direct_table_io;
    assert_eq!(value("dtask_storage_direct_table_io"), u64::from(direct));
    server.stop().await;
}

/// An owner's audit reads a view of the journal that does not move: run while eight callers
/// create tasks as fast as they can, every report is clean (read without the frozen view,
/// the passes over the streams and the indexes saw different moments and reported commit
/// entries, live entries and a tail marker that did not match).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owners_audit_while_tasks_are_created_finds_nothing_wrong() {
    let dir = tempfile::tempdir().unwrap();
    audit_while_creating(open_store(dir.path())).await;
}

/// The same on PostgreSQL: the audit reads one snapshot of the database.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owners_audit_on_postgres_while_tasks_are_created_finds_nothing_wrong() {
    let Some(url) = pg::pg_url("server", "audit") else {
        return;
    };
    let journal = Journal::open_postgres(&url, JournalOptions::default()).unwrap();
    audit_while_creating(TaskStore::open(journal, SystemClock, StoreConfig::default()).unwrap())
        .await;
}

/// Audits `store`'s journal through an owner server while eight callers create tasks, until
/// ten audits were overtaken by appends: every report clean.
async fn audit_while_creating(store: TaskStore) {
    let server = Running::start(Server::owner(store.clone(), None, fast())).await;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writers: Vec<_> = (0..8)
        .map(|w| {
            let (store, stop) = (store.clone(), stop.clone());
            tokio::spawn(async move {
                let mut i = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let id = format!("w{w}-{i}");
                    store
                        .create(create(&id, "shell", &json!({})))
                        .await
                        .unwrap();
                    i += 1;
                }
            })
        })
        .collect();
    // Audits until ten of them were overtaken by appends (bounded).
    let (mut overtaken, mut audits) = (0, 0);
    while overtaken < 10 && audits < 2_000 {
        let (status, report) = server.post("/api/verify", &json!({})).await;
        assert_eq!(status, StatusCode::OK, "{report}");
        assert_eq!(report["clean"], json!(true), "{report}");
        audits += 1;
        let audited = report["last_seq"].as_u64().unwrap();
        if audited > 0 && store.journal().last_seq().unwrap() > audited {
            overtaken += 1;
        }
    }
    assert_eq!(
        overtaken, 10,
        "the appends never overtook an audit in {audits}"
    );
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for writer in writers {
        writer.await.unwrap();
    }
    server.stop().await;
}

/// Purges and writes interleaved: each purge has the server count the journal again beside
/// its pump, which goes on reading (and streaming) meanwhile and brings the new counts up to
/// what it read once the count is done. The counts end equal to a fresh count of the same
/// journal by a server started on it afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counts_made_again_after_purges_beside_writes_end_equal_to_a_fresh_count() {
    let dir = tempfile::tempdir().unwrap();
    {
        // Long streams, so that each count takes a while and the writes land during counts.
        let journal = Journal::open(dir.path(), JournalOptions::default()).unwrap();
        let now = dtask_engine::Clock::now(&SystemClock);
        for b in 0..8 {
            let id = format!("bulk-{b}");
            let spec = TaskSpec::new(id.clone(), "bulk");
            let mut events = vec![
                Event::created(spec, LeasePolicy::Retry, now),
                Event::AttemptStarted {
                    attempt: 1,
                    lease_deadline: now.plus_millis(86_400_000),
                    at: now,
                },
            ];
            events.extend((0..1000).map(|i| Event::UpdateAppended {
                attempt: 1,
                event_id: format!("e{i}"),
                kind: "progress".into(),
                data: vec![7; 16],
                metadata: vec![],
                at: now,
            }));
            journal.append_async(&id, 0, &events).await.unwrap();
        }
    }
    let store = open_store(dir.path());
    for i in 0..40 {
        let id = format!("old-{i:02}");
        store
            .create(create(&id, "shell", &json!({})))
            .await
            .unwrap();
        store.execute(&id, 1, Cmd::Start).await.unwrap();
        store
            .execute(&id, 2, Cmd::Fail { error: "e".into() })
            .await
            .unwrap();
    }
    let server = Running::start(Server::owner(store.clone(), None, fast())).await;
    server.wait_seq(store.journal().last_seq().unwrap()).await;
    let writer = {
        let store = store.clone();
        tokio::spawn(async move {
            for i in 0..40 {
                let id = format!("new-{i:02}");
                store.create(create(&id, "http", &json!({}))).await.unwrap();
                store.execute(&id, 1, Cmd::Start).await.unwrap();
                tokio::task::yield_now().await;
            }
        })
    };
    for i in 0..40 {
        let url = server.url(&format!("/api/tasks/old-{i:02}"));
        let response = server.http.delete(url).send().await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
    }
    writer.await.unwrap();
    let last = store.journal().last_seq().unwrap();
    let counted = server.wait_seq(last).await;
    server.stop().await;
    drop(store);
    let fresh = Running::start(Server::owner(open_store(dir.path()), None, fast())).await;
    let recounted = fresh.wait_seq(last).await;
    for field in [
        "tasks",
        "records",
        "bytes",
        "tasks_purged",
        "by_status",
        "by_executor",
        "by_type",
        "outbox",
    ] {
        assert_eq!(
            counted[field], recounted[field],
            "{field}: {counted} / {recounted}"
        );
    }
    assert_eq!(counted["tasks"], 48, "{counted}");
    assert_eq!(counted["tasks_purged"], 40, "{counted}");
    fresh.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_purges_a_finished_task_and_reads_of_it_answer_gone() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_store(dir.path());
    for id in ["done", "busy"] {
        store.create(create(id, "shell", &json!({}))).await.unwrap();
        store.execute(id, 1, Cmd::Start).await.unwrap();
    }
    store
        .execute("done", 2, Cmd::Fail { error: "e".into() })
        .await
        .unwrap();
    let server = Running::start(Server::owner(store, None, fast())).await;
    let stats = server.wait_seq(5).await;
    assert_eq!(stats["tasks"], 2);
    let delete = |path: &str| {
        let request = server.http.delete(server.url(path));
        async move {
            let response = request.send().await.unwrap();
            let status = response.status();
            (status, response.json::<Value>().await.unwrap())
        }
    };

    let (status, refused) = delete("/api/tasks/busy").await;
    assert_eq!(status, StatusCode::CONFLICT, "{refused}");
    // Held, it is kept; lifted, it may go.
    let (status, held) = server
        .post("/api/tasks/done/hold", &json!({"reason": "case 3"}))
        .await;
    assert_eq!(
        (status, held["hold"].as_str()),
        (StatusCode::OK, Some("case 3")),
        "{held}"
    );
    let (status, kept) = delete("/api/tasks/done").await;
    assert_eq!(status, StatusCode::CONFLICT, "{kept}");
    assert!(
        code(&kept) == "conflict" && kept.to_string().contains("on hold"),
        "{kept}"
    );
    let (status, lifted) = delete("/api/tasks/done/hold").await;
    assert_eq!(
        (status, &lifted["hold"]),
        (StatusCode::OK, &Value::Null),
        "{lifted}"
    );
    let failed_records = r#"dtask_journal_records_by_type{event_type="failed"} 1"#;
    let metrics = server.text("/metrics").await;
    assert!(metrics.lines().any(|l| l == failed_records), "{metrics}");
    let (status, purged) = delete("/api/tasks/done").await;
    assert_eq!(status, StatusCode::OK, "{purged}");
    assert_eq!(purged["purged"][0]["task"], "done");
    assert_eq!(
        purged["purged"][0]["records"], 5,
        "with the hold and its lifting"
    );
    let (status, gone) = server.get("/api/tasks/done").await;
    assert_eq!(
        (status, code(&gone)),
        (StatusCode::GONE, "purged"),
        "{gone}"
    );
    let (status, again) = delete("/api/tasks/done").await;
    assert_eq!(
        (status, code(&again)),
        (StatusCode::GONE, "purged"),
        "{again}"
    );
    let (_, list) = server.get("/api/tasks").await;
    assert_eq!(list["tasks"].as_array().unwrap().len(), 1, "{list}");
    assert_eq!(list["tasks"][0]["id"], "busy");
    // The counts forget the purged task (counted again once the pump reads the tombstone).
    let stats = server.wait_seq(8).await;
    assert_eq!(
        (stats["tasks"].as_u64(), stats["records"].as_u64()),
        (Some(1), Some(2)),
        "{stats}"
    );
    assert_eq!(stats["by_status"]["failed"], 0, "{stats}");
    assert_eq!(stats["tasks_purged"], 1, "{stats}");
    let metrics = server.text("/metrics").await;
    assert!(
        metrics.lines().any(|l| l == "dtask_journal_tasks_purged 1"),
        "{metrics}"
    );
    // The only failed record went with its task: its type is gone from the metrics, not
    // left at its last count.
    assert!(!metrics.contains(r#"event_type="failed""#), "{metrics}");
    let (_, report) = server.post("/api/verify", &json!({})).await;
    assert_eq!(report["clean"], true, "{report}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_trims_a_tasks_progress_and_its_updates_read_as_trimmed() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_store(dir.path());
    store
        .create(create("t", "shell", &json!({})))
        .await
        .unwrap();
    let s = store.execute("t", 1, Cmd::Start).await.unwrap();
    for i in 0..3 {
        store
            .append_update(
                "t",
                UpdateRequest {
                    attempt: s.attempt,
                    event_id: format!("u{i}"),
                    kind: "stdout".into(),
                    data: format!("line {i}").into_bytes(),
                    ..UpdateRequest::default()
                },
            )
            .await
            .unwrap();
    }
    let server = Running::start(Server::owner(store, None, fast())).await;
    let (status, trimmed) = server.post("/api/tasks/t/trim", &json!({"keep": 1})).await;
    assert_eq!(status, StatusCode::OK, "{trimmed}");
    assert_eq!(
        (&trimmed["task"], &trimmed["records"]),
        (&json!("t"), &json!(2))
    );
    let (_, page) = server.get("/api/tasks/t/updates").await;
    let seen: Vec<(Value, Value, Value)> = page["updates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| {
            (
                u["event_id"].clone(),
                u["trimmed"].clone(),
                u["data"]["text"].clone(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            (json!("u0"), json!(true), json!("")),
            (json!("u1"), json!(true), json!("")),
            (json!("u2"), json!(false), json!("line 2")),
        ],
        "{page}"
    );
    let (_, task) = server.get("/api/tasks/t").await;
    assert_eq!(
        (&task["state"]["updates"], &task["state"]["trimmed_updates"]),
        (&json!(3), &json!(2)),
        "{task}"
    );
    // Held: refused; a bad body: refused; a purged task: gone.
    server
        .post("/api/tasks/t/hold", &json!({"reason": "case 5"}))
        .await;
    let (status, refused) = server.post("/api/tasks/t/trim", &json!({"keep": 0})).await;
    assert_eq!(
        (status, code(&refused)),
        (StatusCode::CONFLICT, "conflict"),
        "{refused}"
    );
    let (status, bad) = server.post("/api/tasks/t/trim", &json!({"keep": -1})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}");
    let (status, missing) = server
        .post("/api/tasks/nobody/trim", &json!({"keep": 0}))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{missing}");
}

/// A rerun through a server without a manager treats a managed tool's task as a manager
/// would: its creation checkpoint (a hand-off's started marker) is not carried; another
/// executor's is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rerun_served_without_a_manager_starts_a_managed_call_afresh() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_store(dir.path());
    for (id, executor) in [
        (
            "managed",
            dtask::engine::managed::codec::RECOVERABLE_EXECUTOR_KEY,
        ),
        ("plain", "shell"),
    ] {
        let mut request = create(id, executor, &json!({}));
        request.checkpoint = b"marker".to_vec();
        store.create(request).await.unwrap();
        let s = store.execute(id, 1, Cmd::Start).await.unwrap();
        store
            .execute(
                id,
                s.version,
                Cmd::Fail {
                    error: "boom".into(),
                },
            )
            .await
            .unwrap();
    }
    let server = Running::start(Server::owner(store, None, fast())).await;
    for (id, kept) in [("managed", false), ("plain", true)] {
        let (status, rerun) = server
            .post(&format!("/api/tasks/{id}/rerun"), &json!({}))
            .await;
        assert_eq!(status, StatusCode::CREATED, "{rerun}");
        assert_eq!(
            rerun["checkpoint"]["size"] != json!(0),
            kept,
            "{id}: {rerun}"
        );
    }
    server.stop().await;
}

/// Control answers the same with and without an embedded manager, and says what a client
/// did: a cancel of an ended task is a conflict, a control of a purged task is gone, a run
/// under the agent's key that is no run is unprocessable, a record over the journal's limit
/// (the body limit raised past it) is too large — none of them a server error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_answers_what_the_client_did() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_store(dir.path());
    let manager = dtask::engine::Manager::new(
        store.clone(),
        support::Held::default().registry(),
        dtask::engine::ManagerConfig::default()
            .with_id_generator(std::sync::Arc::new(|kind: &str| format!("n7-{kind}-1"))),
    );
    let server = Running::start(Server::owner(
        store.clone(),
        Some(manager),
        fast().with_body_limit(16 << 20),
    ))
    .await;
    // The manager's ids.
    let (status, made) = server
        .post(
            "/api/tasks",
            &json!({"executor_key": "held", "kind": "job"}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{made}");
    assert_eq!(made["id"], "n7-job-1");
    // Canceled (pending: at once), then canceled again: a conflict, as without a manager.
    let (status, _) = server
        .post("/api/tasks/n7-job-1/cancel", &json!({"reason": "r"}))
        .await;
    assert_eq!(status, StatusCode::OK);
    let (status, again) = server
        .post("/api/tasks/n7-job-1/cancel", &json!({"reason": "r"}))
        .await;
    assert_eq!(
        (status, code(&again)),
        (StatusCode::CONFLICT, "conflict"),
        "{again}"
    );
    // Purged: every control of it is gone.
    let response = server
        .http
        .delete(server.url("/api/tasks/n7-job-1"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    for path in ["cancel", "resume", "inputs"] {
        let (status, gone) = server
            .post(
                &format!("/api/tasks/n7-job-1/{path}"),
                &json!({"reason": "r", "data": "d", "kind": "k", "event_id": "e"}),
            )
            .await;
        assert!(
            status == StatusCode::GONE || status == StatusCode::BAD_REQUEST,
            "{path}: {status} {gone}"
        );
    }
    let (status, gone) = server
        .post("/api/tasks/n7-job-1/cancel", &json!({"reason": "r"}))
        .await;
    assert_eq!(
        (status, code(&gone)),
        (StatusCode::GONE, "purged"),
        "{gone}"
    );
    // Under the agent's key, a payload that is no run.
    store
        .create(create("fake", "dtask.dev/agent", &json!({"x": 1})))
        .await
        .unwrap();
    let (status, err) = server.post("/api/tasks/fake/close", &json!({})).await;
    assert_eq!(
        (status, code(&err)),
        (StatusCode::UNPROCESSABLE_ENTITY, "invalid_agent_run"),
        "{err}"
    );
    // A record over the journal's limit.
    let (status, err) = server
        .post(
            "/api/tasks",
            &json!({"executor_key": "held", "description": "d".repeat(5 << 20)}),
        )
        .await;
    assert_eq!(
        (status, code(&err)),
        (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large"),
        "{err}"
    );
    server.stop().await;
}

/// The counts after a trim — its updates and parts rewritten in place, their sequences kept,
/// so no commit of theirs comes to the pump — are those a fresh count makes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counts_after_a_trim_equal_a_fresh_count() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_store(dir.path());
    store
        .create(create("t", "shell", &json!({})))
        .await
        .unwrap();
    let s = store.execute("t", 1, Cmd::Start).await.unwrap();
    let update = |event_id: &str, part_id: &str, last: bool| UpdateRequest {
        attempt: s.attempt,
        event_id: event_id.to_owned(),
        kind: "stdout".into(),
        data: vec![b'x'; 1_000],
        part_id: part_id.to_owned(),
        last,
        ..UpdateRequest::default()
    };
    for request in [
        update("u0", "", true),
        update("m", "p0", false),
        update("m", "p1", true),
        update("u1", "", true),
        update("u2", "", true),
    ] {
        store.append_update("t", request).await.unwrap();
    }
    let server = Running::start(Server::owner(
        store,
        None,
        fast().with_recount_after_trim(Duration::ZERO),
    ))
    .await;
    let (_, before) = server.get("/api/tasks/t").await;
    server.wait_seq(before["last_seq"].as_u64().unwrap()).await;
    let (status, trimmed) = server.post("/api/tasks/t/trim", &json!({"keep": 1})).await;
    assert_eq!(status, StatusCode::OK, "{trimmed}");
    assert_eq!(trimmed["records"], json!(4), "{trimmed}");
    let (_, after) = server.get("/api/tasks/t").await;
    let last = after["last_seq"].as_u64().unwrap();
    server.wait_seq(last).await;
    // The trim has the journal counted again (at once here): bounded, a guard, no measure.
    let mut counted = Value::Null;
    for _ in 0..1_000 {
        let (_, stats) = server.get("/api/stats").await;
        counted = stats;
        if counted["by_type"]["update_trimmed"] == json!(4) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    server.stop().await;
    let fresh = Running::start(Server::owner(open_store(dir.path()), None, fast())).await;
    let recounted = fresh.wait_seq(last).await;
    for field in ["tasks", "records", "bytes", "by_type"] {
        assert_eq!(
            counted[field], recounted[field],
            "{field}: {counted} / {recounted}"
        );
    }
    assert_eq!(counted["by_type"]["update_trimmed"], json!(4), "{counted}");
    fresh.stop().await;
}

/// A durable agent's run over HTTP: `GET /api/tasks/{id}/conversation` serves it (404 for a
/// task that is not a run, and for none), and a message sent to preempt through `POST
/// /api/tasks/{id}/messages` drops the model call in flight and reaches the model; the
/// endpoint's refusals, and `/close`'s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_runs_conversation_is_served_and_a_message_steers_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_store(dir.path());
    let (model, _, manager) = models::counting_run(&store, "run").await;
    store
        .create(create("plain", "shell", &json!({"tool_name": "shell"})))
        .await
        .unwrap();
    let server = Running::start(Server::owner(store.clone(), Some(manager.clone()), fast())).await;
    let running = {
        let manager = manager.clone();
        tokio::spawn(async move { manager.execute("run").await })
    };
    model.called.notified().await;

    let (status, conversation) = server.get("/api/tasks/run/conversation").await;
    assert_eq!(status, StatusCode::OK, "{conversation}");
    assert_eq!(conversation["messages"][0]["content"], "count to a million");
    assert_eq!(conversation["turns"], json!([]));
    assert_eq!(conversation["sent_messages"], json!([]));
    assert_eq!(conversation["max_steps"], 10);

    // Blank text, an unknown field: 400, nothing sent.
    let (status, err) = server
        .post("/api/tasks/run/messages", &json!({"text": "  "}))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{err}");
    let (status, _) = server
        .post(
            "/api/tasks/run/messages",
            &json!({"text": "x", "kind": "k"}),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    // The close's own id: a message under it would make every close a conflict.
    let (status, err) = server
        .post(
            "/api/tasks/run/messages",
            &json!({"text": "x", "event_id": "agent.close"}),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{err}");
    let message = json!({"text": "stop counting", "preempt": true, "event_id": "m1"});
    let (status, sent) = server.post("/api/tasks/run/messages", &message).await;
    assert_eq!(status, StatusCode::OK, "{sent}");
    assert_eq!(
        (sent["sequence"].as_u64(), sent["inserted"].as_bool()),
        (Some(1), Some(true))
    );
    models::steered(running, &model, "stop counting").await;

    let (status, conversation) = server.get("/api/tasks/run/conversation").await;
    assert_eq!(status, StatusCode::OK, "{conversation}");
    assert_eq!(conversation["turns"][0]["content"], "stopped");
    assert_eq!(
        conversation["sent_messages"],
        json!([{"sequence": 1, "after_turn": 0, "content": "stop counting"}])
    );

    // The same message again is the one sent; a new one to the ended run is refused, and
    // so is closing a run that is not interactive.
    let (status, again) = server.post("/api/tasks/run/messages", &message).await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(again["inserted"], false);
    let (status, err) = server
        .post("/api/tasks/run/messages", &json!({"text": "more?"}))
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{err}");
    let (status, err) = server.post("/api/tasks/run/close", &json!({})).await;
    assert_eq!(status, StatusCode::CONFLICT, "{err}");
    assert_eq!(code(&err), "not_interactive");

    let (status, err) = server.get("/api/tasks/plain/conversation").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{err}");
    assert_eq!(code(&err), "not_an_agent_run");
    for path in ["/api/tasks/plain/messages", "/api/tasks/plain/close"] {
        let (status, err) = server.post(path, &json!({"text": "hi"})).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}: {err}");
        assert_eq!(code(&err), "not_an_agent_run");
    }
    let (status, err) = server.get("/api/tasks/nope/conversation").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{err}");
    assert_eq!(code(&err), "not_found");
    server.stop().await;
}

/// Reads server-sent events from `response` until `records` records arrived: every event,
/// in order, as its `event` name, its `id` (if any) and its data.
async fn read_all_events(
    response: reqwest::Response,
    records: usize,
) -> Vec<(String, Option<u64>, Value)> {
    let mut body = response.bytes_stream();
    let mut text = String::new();
    let mut events = Vec::new();
    let mut seen = 0;
    while seen < records {
        let chunk = tokio::time::timeout(Duration::from_secs(60), body.next())
            .await
            .expect("an event within a minute")
            .expect("the stream goes on")
            .unwrap();
        text.push_str(std::str::from_utf8(&chunk).unwrap());
        while let Some(end) = text.find("\n\n") {
            let block: String = text.drain(..end + 2).collect();
            let (mut id, mut data, mut kind) = (None, None, None);
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("id: ") {
                    id = Some(v.parse::<u64>().unwrap());
                } else if let Some(v) = line.strip_prefix("data: ") {
                    data = Some(serde_json::from_str::<Value>(v).unwrap());
                } else if let Some(v) = line.strip_prefix("event: ") {
                    kind = Some(v.to_owned());
                }
            }
            if let (Some(kind), Some(data)) = (kind, data) {
                seen += usize::from(kind == "record");
                events.push((kind, id, data));
            }
        }
    }
    events
}

/// A task's first record: its creation.
fn created_event(id: &str) -> Event {
    Event::created(
        TaskSpec::new(id, "shell"),
        LeasePolicy::Retry,
        Timestamp(1_000),
    )
}

/// Flips one payload byte of `task`'s record at `position` in the journal at `dir` (closed),
/// as a bad disk would: its checksum no longer matches.
fn flip(dir: &Path, task: &str, position: u64) {
    let cfs: Vec<_> = dtask_journal::keys::COLUMN_FAMILIES.to_vec();
    let db = rocksdb::DB::open_cf(&rocksdb::Options::default(), dir, cfs).unwrap();
    let cf = db.cf_handle(dtask_journal::Space::Events.name()).unwrap();
    let key = dtask_journal::keys::event_key(task, position);
    let mut value = db.get_cf(cf, &key).unwrap().unwrap();
    value[23] ^= 0x01;
    db.put_cf(cf, &key, value).unwrap();
}

/// The value of the sample `name` (a metric without labels) in a metrics exposition.
fn sample(metrics: &str, name: &str) -> u64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in\n{metrics}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_journal_stream_passes_over_a_damaged_record_and_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    {
        let journal = Journal::open(dir.path(), JournalOptions::default()).unwrap();
        for id in ["a", "b", "c"] {
            journal
                .append_async(id, 0, &[created_event(id)])
                .await
                .unwrap();
        }
    }
    flip(dir.path(), "b", 0);
    let journal = Journal::open_read_only(dir.path()).unwrap();
    let server = Running::start(Server::follower(journal, fast())).await;

    // Read from the start, and again from a Last-Event-ID before the damage: each time the
    // damaged record is named and the record after it arrives.
    for resumed in [false, true] {
        let request = server.http.get(server.url("/api/stream?from_seq=1"));
        let request = if resumed {
            request.header("last-event-id", "1")
        } else {
            request
        };
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let events = read_all_events(response, if resumed { 1 } else { 2 }).await;
        let mut expected = vec![
            ("record".to_owned(), Some(1), "a"),
            ("damaged".to_owned(), None, "b"),
            ("record".to_owned(), Some(3), "c"),
        ];
        if resumed {
            expected.remove(0);
        }
        let got: Vec<_> = events
            .iter()
            .map(|(kind, id, data)| (kind.clone(), *id, data["task"].as_str().unwrap()))
            .collect();
        assert_eq!(got, expected, "{events:?}");
        let damaged = &events.iter().find(|e| e.0 == "damaged").unwrap().2;
        assert_eq!(damaged["position"], 0, "{damaged}");
        assert_eq!(damaged["after_seq"], 1, "{damaged}");
        assert!(
            damaged["error"].as_str().unwrap().contains("checksum"),
            "{damaged}"
        );
    }
    server.stop().await;
}

/// A real RocksDB journal whose reads can be damaged or failed on demand: what a bad disk does
/// under a running server ([`Journal::open_wrapped`]).
mod faulty {
    use dtask_journal::{
        Backend, BatchOp, CommitFlush, Cursor, Durability, Error, KeyValue, LastRecord, Range,
        RawIter, Result, Source, Space, StorageStats, WriteLock,
    };
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::{Arc, Mutex};

    /// The byte of a record flipped by the damage (one of its payload's).
    const FLIPPED: usize = 23;

    /// The real backend of a journal in a temporary directory, every method delegated to
    /// it, the provided ones included (RocksDB implements most of them itself) — but for
    /// [`Backend::frozen_copy`], declined (its reads would go around the faults) — and two
    /// faults injected on demand:
    ///
    /// - a damaged record: every read of one event key — [`Backend::get`], [`Backend::scan`],
    ///   and each cursor over the records ([`Backend::cursor`], [`Backend::lookup_cursor`],
    ///   [`Backend::live_records_cursor`], [`Backend::unmoved_records_cursor`]), and the
    ///   bulk reads [`Backend::records_by_seq`] and [`Backend::last_records`] — returns its
    ///   bytes with one flipped;
    /// - an unreadable commit order: every forward read of the `commits` space (a scan, a
    ///   cursor's seek) fails with a storage error.
    pub struct Faulty {
        /// The real backend.
        inner: Arc<dyn Backend>,
        /// The event key whose record reads damaged.
        damaged: Mutex<Option<Vec<u8>>>,
        /// Reads of the damaged record.
        damaged_reads: AtomicU64,
        /// Whether the forward reads of the commit order fail.
        failing_commits: AtomicBool,
        /// The journal's directory: dropped after `inner`, once the journal is gone.
        _dir: tempfile::TempDir,
    }

    impl Faulty {
        /// The record at `task`'s `position` reads damaged from now on.
        pub fn damage(&self, task: &str, position: u64) {
            *self.damaged.lock().unwrap() = Some(dtask_journal::keys::event_key(task, position));
        }

        /// How many times the damaged record was read.
        pub fn damaged_reads(&self) -> u64 {
            self.damaged_reads.load(Ordering::SeqCst)
        }

        /// The forward reads of the commit order fail from now on (or no longer).
        pub fn fail_commits(&self, failing: bool) {
            self.failing_commits.store(failing, Ordering::SeqCst);
        }

        /// Whether `key` of `space` is the damaged record.
        fn is_damaged(&self, space: Space, key: &[u8]) -> bool {
            space == Space::Events && self.damaged.lock().unwrap().as_deref() == Some(key)
        }

        /// `value`, read at `key` of `space`, damaged if that is the damaged record.
        fn read(&self, space: Space, key: &[u8], value: &mut [u8]) {
            if self.is_damaged(space, key) {
                self.damaged_reads.fetch_add(1, Ordering::SeqCst);
                value[FLIPPED] ^= 0x01;
            }
        }

        /// Whether a forward read of `space` fails now.
        fn fails(&self, space: Space) -> bool {
            space == Space::Commits && self.failing_commits.load(Ordering::SeqCst)
        }

        fn unreadable() -> Error {
            Error::storage("injected: the commit order cannot be read")
        }

        fn wrap<'a>(&'a self, space: Space, inner: Box<dyn Cursor + 'a>) -> Box<dyn Cursor + 'a> {
            Box::new(FaultyCursor {
                faulty: self,
                space,
                inner,
                damaged: None,
                failed: false,
            })
        }
    }

    /// A cursor of the real backend, its reads faulty as [`Faulty`] says.
    struct FaultyCursor<'a> {
        faulty: &'a Faulty,
        space: Space,
        inner: Box<dyn Cursor + 'a>,
        /// The damaged bytes of the current entry, when it is the damaged record.
        damaged: Option<Vec<u8>>,
        /// The last seek failed (an unreadable commit order).
        failed: bool,
    }

    impl FaultyCursor<'_> {
        /// Notes the current entry's damaged bytes, if it is the damaged record.
        fn settle(&mut self) {
            self.damaged = None;
            if let (Some(key), Some(value)) = (self.inner.key(), self.inner.value()) {
                if self.faulty.is_damaged(self.space, key) {
                    let mut value = value.to_vec();
                    value[FLIPPED] ^= 0x01;
                    self.damaged = Some(value);
                }
            }
        }
    }

    impl Cursor for FaultyCursor<'_> {
        fn seek(&mut self, key: &[u8]) {
            self.failed = self.faulty.fails(self.space);
            if !self.failed {
                self.inner.seek(key);
            }
            self.settle();
        }
        fn next(&mut self) {
            if !self.failed {
                self.inner.next();
            }
            self.settle();
        }
        fn key(&self) -> Option<&[u8]> {
            if self.failed {
                return None;
            }
            self.inner.key()
        }
        fn value(&self) -> Option<&[u8]> {
            if self.failed {
                return None;
            }
            if let Some(damaged) = &self.damaged {
                self.faulty.damaged_reads.fetch_add(1, Ordering::SeqCst);
                return Some(damaged);
            }
            self.inner.value()
        }
        fn status(&self) -> Result<()> {
            if self.failed {
                return Err(Faulty::unreadable());
            }
            self.inner.status()
        }
        fn source(&self) -> Source {
            self.inner.source()
        }
    }

    impl Backend for Faulty {
        fn write(&self, ops: Vec<BatchOp>, durability: Durability) -> Result<()> {
            self.inner.write(ops, durability)
        }
        fn sync(&self) -> Result<()> {
            self.inner.sync()
        }
        fn sync_through(&self, last_seq: u64) -> Result<()> {
            self.inner.sync_through(last_seq)
        }
        fn max_batch_bytes(&self) -> usize {
            self.inner.max_batch_bytes()
        }
        fn sync_failure_is_final(&self) -> bool {
            self.inner.sync_failure_is_final()
        }
        fn get(&self, space: Space, key: &[u8]) -> Result<Option<Vec<u8>>> {
            let mut value = self.inner.get(space, key)?;
            if let Some(value) = value.as_mut() {
                self.read(space, key, value);
            }
            Ok(value)
        }
        fn scan(&self, space: Space, range: Range) -> RawIter<'_> {
            if !range.reverse && self.fails(space) {
                return Box::new(std::iter::once(Err(Self::unreadable())));
            }
            Box::new(self.inner.scan(space, range).map(move |entry| {
                let (key, mut value) = entry?;
                self.read(space, &key, &mut value);
                Ok((key, value))
            }))
        }
        fn cursor(&self, space: Space) -> Box<dyn Cursor + '_> {
            self.wrap(space, self.inner.cursor(space))
        }
        fn lookup_cursor(&self, space: Space) -> Box<dyn Cursor + '_> {
            self.wrap(space, self.inner.lookup_cursor(space))
        }
        fn records_by_seq(&self, first: u64, last: u64) -> Option<Result<Vec<KeyValue>>> {
            // RocksDB answers `None` (the records are found by the commit index's keys,
            // through the cursors above); damaged here all the same if it ever reads them.
            let mut records = self.inner.records_by_seq(first, last)?;
            if let Ok(records) = records.as_mut() {
                for (key, value) in records {
                    self.read(Space::Events, key, value);
                }
            }
            Some(records)
        }
        fn live_records_cursor(&self) -> Option<Box<dyn Cursor + '_>> {
            let inner = self.inner.live_records_cursor()?;
            Some(self.wrap(Space::Events, inner))
        }
        fn unmoved_records_cursor(&self) -> Option<Box<dyn Cursor + '_>> {
            let inner = self.inner.unmoved_records_cursor()?;
            Some(self.wrap(Space::Events, inner))
        }
        fn catch_up(&self) -> Result<()> {
            self.inner.catch_up()
        }
        fn read_only(&self) -> bool {
            self.inner.read_only()
        }
        fn is_secondary(&self) -> bool {
            self.inner.is_secondary()
        }
        fn frozen_copy(&self) -> Result<Option<tempfile::TempDir>> {
            // Declined: a frozen copy is a database of its own, which the journal opens
            // without this wrapper, so its reads would go around the faults. Without one the
            // journal's frozen views read through this wrapper.
            Ok(None)
        }
        fn frozen_view(&self) -> Result<Option<Arc<dyn Backend>>> {
            // `None` from RocksDB (it makes copies instead, declined above).
            self.inner.frozen_view()
        }
        fn start_compactions(&self) -> Result<()> {
            self.inner.start_compactions()
        }
        fn compact(&self) -> Result<bool> {
            self.inner.compact()
        }
        fn flush(&self) -> Result<()> {
            self.inner.flush()
        }
        fn flush_in_background(&self) -> Result<()> {
            self.inner.flush_in_background()
        }
        fn settle(&self, timeout: std::time::Duration) -> Result<bool> {
            self.inner.settle(timeout)
        }
        fn foreign_keys(&self, max: usize) -> Result<Vec<Vec<u8>>> {
            self.inner.foreign_keys(max)
        }
        fn has_legacy_heads(&self) -> bool {
            self.inner.has_legacy_heads()
        }
        fn describe(&self) -> String {
            self.inner.describe()
        }
        fn schema_version(&self) -> Option<u32> {
            self.inner.schema_version()
        }
        fn scan_snapshot_rows(&self) -> usize {
            self.inner.scan_snapshot_rows()
        }
        fn is_shared(&self) -> bool {
            self.inner.is_shared()
        }
        fn dir(&self) -> Option<&std::path::Path> {
            self.inner.dir()
        }
        fn lock_for_write(&self, since: u64, lacks: &[String]) -> Result<Option<WriteLock>> {
            self.inner.lock_for_write(since, lacks)
        }
        fn write_locked(&self, ops: Vec<BatchOp>, flush: CommitFlush) -> Result<()> {
            self.inner.write_locked(ops, flush)
        }
        fn write_expecting(
            &self,
            ops: Vec<BatchOp>,
            expected: &[u8],
            flush: CommitFlush,
        ) -> Result<bool> {
            self.inner.write_expecting(ops, expected, flush)
        }
        fn unlock_write(&self) {
            self.inner.unlock_write();
        }
        fn last_records(&self, tasks: &[String]) -> Option<Result<Vec<LastRecord>>> {
            // RocksDB answers `None` (heads are read one by one, through the reads above);
            // damaged here all the same if it ever reads them.
            let mut found = self.inner.last_records(tasks)?;
            if let Ok(found) = found.as_mut() {
                for ((key, value), _) in found.iter_mut().flatten() {
                    self.read(Space::Events, key, value);
                }
            }
            Some(found)
        }
        fn watch_commits(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
            self.inner.watch_commits()
        }
        fn durable_reader(&self) -> Option<Arc<dyn Backend>> {
            // `None` from RocksDB (its readers stop at the durable watermark themselves).
            self.inner.durable_reader()
        }
        fn storage_stats(&self) -> Result<Option<StorageStats>> {
            self.inner.storage_stats()
        }
    }

    /// A writable journal in a new temporary directory over a [`Faulty`] backend, no fault
    /// injected yet.
    pub fn open() -> (dtask_journal::Journal, Arc<Faulty>) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_owned();
        let mut faulty = None;
        let journal = dtask_journal::Journal::open_wrapped(
            &path,
            dtask_journal::JournalOptions::default(),
            |inner| {
                let wrapper = Arc::new(Faulty {
                    inner,
                    damaged: Mutex::new(None),
                    damaged_reads: AtomicU64::new(0),
                    failing_commits: AtomicBool::new(false),
                    _dir: dir,
                });
                faulty = Some(Arc::clone(&wrapper));
                wrapper
            },
        )
        .unwrap();
        (journal, faulty.unwrap())
    }
}
use faulty::Faulty;

/// An owner server over a [`Faulty`] journal, its pump looking again every `poll` when
/// nothing wakes it (the journal's durable watermark does, at each commit).
async fn faulty_owner(poll: Duration) -> (Running, TaskStore, std::sync::Arc<Faulty>) {
    let (journal, backend) = faulty::open();
    let store = TaskStore::open(journal, SystemClock, StoreConfig::default()).unwrap();
    let config = ServerConfig::default().with_poll_interval(poll);
    let server = Running::start(Server::owner(store.clone(), None, config)).await;
    server.wait_seq(0).await;
    (server, store, backend)
}

/// A record that reads damaged under a running server: the pump passes over it (counted
/// once), the live stream names it and goes on with the records after it, and the pump does
/// not read it again and again while nothing follows it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pump_passes_over_a_damaged_record_and_the_live_stream_goes_on() {
    // Woken by the journal at each commit; an hour between looks otherwise.
    let (server, store, backend) = faulty_owner(Duration::from_secs(3600)).await;
    let live = server.stream("/api/stream").await;
    store
        .create(create("a", "shell", &json!({})))
        .await
        .unwrap();
    backend.damage("b", 0);
    store
        .create(create("b", "shell", &json!({})))
        .await
        .unwrap();

    // The damage is the last thing committed: the pump reads it, reports it once, and waits.
    for i in 0.. {
        let metrics = server.text("/metrics").await;
        if sample(&metrics, "dtask_pump_damaged_records_total") == 1 {
            break;
        }
        assert!(i < 3_000, "the damage was never counted:\n{metrics}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let reads = backend.damaged_reads();
    for _ in 0..50 {
        server.text("/metrics").await;
    }
    assert!(
        backend.damaged_reads() <= reads + 1,
        "the pump read the damaged record {} more times",
        backend.damaged_reads() - reads
    );

    store
        .create(create("c", "shell", &json!({})))
        .await
        .unwrap();
    let events = read_all_events(live, 2).await;
    let got: Vec<_> = events
        .iter()
        .map(|(kind, id, data)| (kind.as_str(), *id, data["task"].as_str().unwrap()))
        .collect();
    assert_eq!(
        got,
        [
            ("record", Some(1), "a"),
            ("damaged", None, "b"),
            ("record", Some(3), "c")
        ],
        "{events:?}"
    );
    assert_eq!(events[1].2["position"], 0);
    assert_eq!(events[1].2["after_seq"], 1);
    // The counts go on past it; the damage was counted once, and is no failed read.
    let stats = server.wait_seq(3).await;
    assert_eq!(stats["tasks"], 2, "{stats}");
    let metrics = server.text("/metrics").await;
    assert_eq!(sample(&metrics, "dtask_pump_damaged_records_total"), 1);
    assert_eq!(sample(&metrics, "dtask_pump_errors_total"), 0);
    server.stop().await;
}

/// A read of the commits that fails is tried again after the poll interval, not at once: a
/// lasting failure (here the commit order unreadable) is not a busy loop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_read_of_the_commits_waits_the_interval_before_the_next() {
    let (server, store, backend) = faulty_owner(Duration::from_secs(3600)).await;
    backend.fail_commits(true);
    // A commit wakes the pump, whose read fails.
    store
        .create(create("a", "shell", &json!({})))
        .await
        .unwrap();
    for i in 0.. {
        let metrics = server.text("/metrics").await;
        if sample(&metrics, "dtask_pump_errors_total") >= 1 {
            break;
        }
        assert!(i < 3_000, "the read never failed:\n{metrics}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (status, ready) = server.get("/readyz").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{ready}");
    assert!(
        ready["reasons"]
            .as_array()
            .unwrap()
            .contains(&json!("journal_unreadable")),
        "{ready}"
    );
    // However many requests are answered meanwhile, the pump tried once.
    for _ in 0..50 {
        server.text("/metrics").await;
    }
    let metrics = server.text("/metrics").await;
    assert_eq!(
        sample(&metrics, "dtask_pump_errors_total"),
        1,
        "the pump read again at once"
    );
    server.stop().await;
}

/// Executor keys are the clients' to choose: the metrics and the statistics name the 50 with
/// the most tasks and sum the others under `other`, however many keys there are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_by_executor_name_the_most_common_keys_and_sum_the_others() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_store(dir.path());
    let server = Running::start(Server::owner(store.clone(), None, fast())).await;
    for i in 0..3 {
        store
            .create(create(&format!("busy-{i}"), "busy", &json!({})))
            .await
            .unwrap();
    }
    let keys = 80;
    for i in 0..keys {
        store
            .create(create(&format!("t{i}"), &format!("key-{i:03}"), &json!({})))
            .await
            .unwrap();
    }
    let tasks = 3 + keys;
    let stats = server.wait_seq(tasks).await;
    let by_executor = stats["by_executor"].as_object().unwrap();
    assert_eq!(by_executor.len(), 51, "{stats}");
    assert_eq!(by_executor["busy"], 3, "{stats}");
    // The others by name among equals: key-000 … key-048 named, the 31 after summed.
    assert_eq!(by_executor["key-048"], 1, "{stats}");
    assert!(by_executor.get("key-049").is_none(), "{stats}");
    assert_eq!(by_executor["other"], keys - 49, "{stats}");
    let total: u64 = by_executor.values().map(|n| n.as_u64().unwrap()).sum();
    assert_eq!(total, tasks);

    let metrics = server.text("/metrics").await;
    let series: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("dtask_tasks_by_executor{"))
        .collect();
    assert_eq!(series.len(), 51, "{series:?}");
    assert!(series.contains(&r#"dtask_tasks_by_executor{executor="busy"} 3"#));
    assert!(series.contains(&r#"dtask_tasks_by_executor{executor="other"} 31"#));
    server.stop().await;
}

/// A `not_before` that is no time in milliseconds (nanoseconds, say) is refused: no page could
/// show it as a date.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_not_before_past_the_year_9999_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let server = Running::start(Server::owner(open_store(dir.path()), None, fast())).await;
    let (status, body) = server
        .post(
            "/api/tasks",
            &json!({"id": "ns", "executor_key": "shell", "not_before": 1_700_000_000_000_000_000_u64}),
        )
        .await;
    assert_eq!(
        (status, code(&body)),
        (StatusCode::BAD_REQUEST, "invalid_request"),
        "{body}"
    );
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("253402300799999"),
        "{body}"
    );
    let (status, _) = server.get("/api/tasks/ns").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "nothing was created");
    // The last millisecond of the year 9999 is taken.
    let (status, task) = server
        .post(
            "/api/tasks",
            &json!({"id": "late", "executor_key": "shell", "not_before": 253_402_300_799_999_u64}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{task}");
    assert_eq!(task["not_before"], 253_402_300_799_999_u64, "{task}");
    // The document says so.
    let (_, document) = server.get("/openapi.json").await;
    assert_eq!(
        document["components"]["schemas"]["SubmitBody"]["properties"]["not_before"]["maximum"],
        253_402_300_799_999_u64,
        "{}",
        document["components"]["schemas"]["SubmitBody"]
    );
    server.stop().await;
}

/// An updates page always gives a cursor (at the end, the end of what is stored now, to poll
/// with), and the document says so: a required string, never `null`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_updates_pages_next_cursor_is_always_a_string() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_store(dir.path());
    let server = Running::start(Server::owner(store.clone(), None, fast())).await;
    store
        .create(create("u", "shell", &json!({})))
        .await
        .unwrap();
    let (status, page) = server.get("/api/tasks/u/updates").await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert_eq!(page["updates"], json!([]));
    assert!(page["next_cursor"].is_string(), "{page}");
    let (_, document) = server.get("/openapi.json").await;
    let schema = &document["components"]["schemas"]["UpdatePage"];
    assert!(
        schema["required"]
            .as_array()
            .unwrap()
            .contains(&json!("next_cursor")),
        "{schema}"
    );
    assert_eq!(
        schema["properties"]["next_cursor"]["type"], "string",
        "{schema}"
    );
    server.stop().await;
}
