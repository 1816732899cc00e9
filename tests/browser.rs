//! The web page of `dtask serve` in a real headless Chromium, driven over the W3C `WebDriver`
//! protocol (`chromedriver`), against a real journal: the task list shows every task and
//! updates live when a task is created, the status filter narrows it, a task's page shows its
//! timeline, records and the state at a position, and the journal page shows the storage
//! engine's figures and runs the audit.
//!
//! Needs Debian's `chromium` and `chromium-driver` (`apt-get install chromium
//! chromium-driver`); without them the test says so loudly and passes. `DTASK_SCREENSHOTS=1`
//! saves the pages as `docs/server-*.png`.
//!
//! The `WebDriver` calls are made with the HTTP client the other tests use (a handful of JSON
//! requests), not a `WebDriver` crate: fantoccini's dependencies would change the features of
//! crates RocksDB's build uses and rebuild it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_lines)]

#[path = "../engine/tests/support/models.rs"]
mod models;

use base64::Engine;
use dtask::server::{Server, ServerConfig};
use dtask_engine::{
    Command as Cmd, CreateRequest, StoreConfig, SystemClock, TaskStore, UpdateRequest,
};
use dtask_journal::{Journal, JournalOptions, LeasePolicy, TaskSpec};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::time::Duration;

fn program(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(name))
            .find(|path| path.is_file())
    })
}

fn create(id: &str, executor: &str, description: &str) -> CreateRequest {
    CreateRequest {
        spec: TaskSpec {
            id: id.into(),
            executor_key: executor.into(),
            kind: "tool_call".into(),
            payload: serde_json::to_vec(&json!({ "tool_name": executor })).unwrap(),
            description: description.into(),
            ..TaskSpec::default()
        },
        policy: Some(LeasePolicy::Retry),
        ..CreateRequest::default()
    }
}

/// Kills chromedriver when the test ends, however it ends.
struct DriverProcess(std::process::Child);

impl Drop for DriverProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A `WebDriver` session: the few commands the test needs.
struct Browser {
    http: reqwest::Client,
    session: String,
}

impl Browser {
    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let url = format!("{}{path}", self.session);
        let mut request = self.http.request(method, url);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let reply: Value = request.send().await.unwrap().json().await.unwrap();
        assert!(reply["value"].get("error").is_none(), "WebDriver: {reply}");
        reply["value"].clone()
    }

    async fn goto(&self, url: &str) {
        self.call(reqwest::Method::POST, "/url", Some(json!({ "url": url })))
            .await;
    }

    async fn run(&self, script: &str) -> Value {
        self.call(
            reqwest::Method::POST,
            "/execute/sync",
            Some(json!({ "script": script, "args": [] })),
        )
        .await
    }

    /// Runs `script` until it returns `true` (bounded: a minute).
    async fn until(&self, what: &str, script: &str) {
        for _ in 0..1200 {
            if self.run(script).await == json!(true) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("the page never showed {what}");
    }

    async fn screenshot(&self, name: &str) {
        if std::env::var_os("DTASK_SCREENSHOTS").is_none() {
            return;
        }
        let png = self.call(reqwest::Method::GET, "/screenshot", None).await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(png.as_str().unwrap())
            .unwrap();
        // The package directory as the test runs (a binary may be reused from another checkout).
        let path = std::env::var_os("CARGO_MANIFEST_DIR")
            .map_or_else(|| PathBuf::from("."), PathBuf::from)
            .join("docs")
            .join(name);
        std::fs::write(&path, png).unwrap();
        eprintln!("saved {}", path.display());
    }
}

/// Starts chromedriver and a headless Chromium session with a fresh profile; the driver
/// process and the profile live as long as the values returned.
async fn start_browser(
    driver: &std::path::Path,
    chromium: &std::path::Path,
) -> (Browser, DriverProcess, tempfile::TempDir) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let driver_process = DriverProcess(
        std::process::Command::new(driver)
            .arg(format!("--port={port}"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let profile = tempfile::tempdir().unwrap();
    let capabilities = json!({ "capabilities": { "alwaysMatch": {
        "browserName": "chrome",
        "goog:chromeOptions": {
            "binary": chromium,
            "args": [
                "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                "--disable-component-update", "--no-first-run", "--window-size=1280,800",
                format!("--user-data-dir={}", profile.path().display()),
            ],
        },
    }}});
    let http = reqwest::Client::new();
    let driver_url = format!("http://127.0.0.1:{port}");
    let mut session = None;
    for _ in 0..300 {
        if let Ok(reply) = http
            .post(format!("{driver_url}/session"))
            .json(&capabilities)
            .send()
            .await
        {
            let reply: Value = reply.json().await.unwrap();
            let id = reply["value"]["sessionId"].as_str().expect("a session");
            session = Some(format!("{driver_url}/session/{id}"));
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let browser = Browser {
        http,
        session: session.expect("chromedriver answers"),
    };
    (browser, driver_process, profile)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_lists_tasks_live_and_shows_a_timeline_and_the_audit() {
    let (Some(driver), Some(chromium)) = (program("chromedriver"), program("chromium")) else {
        eprintln!(
            "SKIPPED the_page_lists_tasks_live_and_shows_a_timeline_and_the_audit: chromium and \
             chromedriver are not installed (apt-get install chromium chromium-driver)"
        );
        return;
    };

    let dir = tempfile::tempdir().unwrap();
    let journal = Journal::open(dir.path(), JournalOptions::default()).unwrap();
    let store = TaskStore::open(journal, SystemClock, StoreConfig::default()).unwrap();
    store
        .create(create("build-1", "shell", "make release"))
        .await
        .unwrap();
    let s = store.execute("build-1", 1, Cmd::Start).await.unwrap();
    for i in 0..3 {
        let update = UpdateRequest {
            attempt: s.attempt,
            event_id: format!("line-{i}"),
            kind: "stdout".into(),
            data: format!("compiling part {i}").into_bytes(),
            ..UpdateRequest::default()
        };
        store.append_update("build-1", update).await.unwrap();
    }
    store
        .execute("build-1", s.version, Cmd::Heartbeat)
        .await
        .unwrap();
    store
        .create(create("ask-1", "approval", "deploy to production?"))
        .await
        .unwrap();
    let a = store.execute("ask-1", 1, Cmd::Start).await.unwrap();
    let wait = Cmd::WaitInput {
        checkpoint: b"approve?".to_vec(),
    };
    store.execute("ask-1", a.version, wait).await.unwrap();
    store
        .create(create("fetch-1", "fetch", "download the dataset"))
        .await
        .unwrap();
    let f = store.execute("fetch-1", 1, Cmd::Start).await.unwrap();
    let done = Cmd::Complete {
        data: b"42 files".to_vec(),
    };
    store.execute("fetch-1", f.version, done).await.unwrap();

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let config = ServerConfig::default().with_poll_interval(Duration::from_millis(20));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = Server::owner(store.clone(), None, config);
    let server = tokio::spawn(server.serve(listener, async {
        let _ = stopped.await;
    }));

    let (browser, _driver, _profile) = start_browser(&driver, &chromium).await;

    // The task list, with every task.
    browser.goto(&format!("{base}/")).await;
    let has_row =
        |id: &str| format!("return document.querySelector(\"tr[data-id='{id}']\") !== null");
    for id in ["build-1", "ask-1", "fetch-1"] {
        browser.until(id, &has_row(id)).await;
    }
    let ask = browser
        .run("return document.querySelector(\"tr[data-id='ask-1']\").textContent")
        .await;
    let ask = ask.as_str().unwrap();
    assert!(
        ask.contains("waiting_input") && ask.contains("approval"),
        "{ask}"
    );

    // Live: a task created now appears without a reload.
    browser
        .until(
            "the live badge",
            "return document.querySelector('.live.on') !== null",
        )
        .await;
    store
        .create(create("late-1", "shell", "created while the page is open"))
        .await
        .unwrap();
    browser.until("late-1, live", &has_row("late-1")).await;
    browser.screenshot("server-tasks.png").await;

    // Progress of a shown task is counted in its row from the stream alone: the page reads
    // no task for it (a read folds the task's whole stream).
    let reads_before = task_reads(&base).await;
    let running = store.get("build-1").await.unwrap();
    for i in 3..6 {
        let update = UpdateRequest {
            attempt: running.attempt,
            event_id: format!("line-{i}"),
            kind: "stdout".into(),
            data: format!("compiling part {i}").into_bytes(),
            ..UpdateRequest::default()
        };
        store.append_update("build-1", update).await.unwrap();
    }
    browser
        .until(
            "build-1's new records counted",
            &format!(
                "return document.querySelector(\"tr[data-id='build-1'] td:nth-child(6)\")\
                 .textContent === '{}'",
                running.position + 3
            ),
        )
        .await;
    assert_eq!(
        task_reads(&base).await,
        reads_before,
        "progress made the page read the task"
    );

    // The status filter.
    browser
        .run(
            "const s = document.getElementById('status-filter'); s.value = 'completed'; \
             s.dispatchEvent(new Event('change')); return true",
        )
        .await;
    browser
        .until(
            "only the completed task",
            "const rows = document.querySelectorAll('#tasks tbody tr'); \
             return rows.length === 1 && rows[0].dataset.id === 'fetch-1'",
        )
        .await;

    // A task's page: timeline, records, the state at a position.
    let records = store.get("build-1").await.unwrap().position;
    browser.goto(&format!("{base}/#/task/build-1")).await;
    browser
        .until(
            "every record",
            &format!("return document.querySelectorAll('#records tbody tr').length === {records}"),
        )
        .await;
    let timeline = browser
        .run("return document.querySelector('.timeline').textContent")
        .await;
    let timeline = timeline.as_str().unwrap();
    assert!(
        timeline.contains("attempt 1 started · 1 heartbeat"),
        "{timeline}"
    );
    assert!(
        timeline.contains("update stdout #line-2 (attempt 1)"),
        "{timeline}"
    );
    // A record written while the page is open joins it, and the state at the last position
    // follows (answered from the task's state, without a second read).
    let held = store.hold("build-1", "case 7").await.unwrap();
    browser
        .until(
            "the state after the new last record",
            &format!(
                "return document.body.textContent.includes('after #{} hold')",
                held.position - 1
            ),
        )
        .await;
    store.lift_hold("build-1").await.unwrap();
    browser
        .run(
            "const s = document.getElementById('at'); s.value = '0'; \
             s.dispatchEvent(new Event('input')); return true",
        )
        .await;
    browser
        .until(
            "the state at position 0",
            "return document.body.textContent.includes('after #0 created')",
        )
        .await;
    browser.screenshot("server-task.png").await;

    // The journal page shows the server's readiness and the storage engine's figures, and
    // runs the audit.
    browser.goto(&format!("{base}/#/journal")).await;
    browser
        .until(
            "the verify button",
            "return document.getElementById('verify') !== null",
        )
        .await;
    browser
        .until(
            "the storage table",
            "return document.getElementById('storage') !== null",
        )
        .await;
    let storage = browser
        .run("return document.getElementById('storage').textContent")
        .await;
    let storage = storage.as_str().unwrap();
    assert!(
        storage.contains("events") && storage.contains("COMPACTION OWED"),
        "{storage}"
    );
    // What a synced append promises where the journal lies, as `dtask probe` judges it.
    let promise = browser
        .run("return document.getElementById('sync-promise').textContent")
        .await;
    assert!(
        promise
            .as_str()
            .is_some_and(|p| p.starts_with("synced appends: ")),
        "{promise}"
    );
    let ready = browser
        .run("return document.getElementById('health').textContent")
        .await;
    assert_eq!(ready.as_str(), Some("ready"), "{ready}");
    // The header's badge says nothing once the server is found ready.
    browser
        .until(
            "the readiness checked",
            "return document.getElementById('ready').textContent === ''",
        )
        .await;
    let badge = browser
        .run("return document.getElementById('ready').className")
        .await;
    assert_eq!(badge.as_str(), Some("ready"), "{badge}");
    let writes = browser
        .run("return document.getElementById('storage-writes').textContent")
        .await;
    assert!(
        writes.as_str().unwrap().contains("writes not held back"),
        "{writes}"
    );
    browser
        .run("document.getElementById('verify').click(); return true")
        .await;
    browser
        .until(
            "the audit's verdict",
            "return document.getElementById('verify-result') !== null",
        )
        .await;
    let verdict = browser
        .run("return document.getElementById('verify-result').textContent")
        .await;
    assert!(
        verdict.as_str().unwrap().starts_with("clean: 4 tasks"),
        "{verdict}"
    );
    browser.screenshot("server-journal.png").await;

    // A finished task's rerun button opens the new task, which links back to it.
    browser.goto(&format!("{base}/#/task/fetch-1")).await;
    browser
        .until(
            "the rerun button",
            "return document.getElementById('rerun') !== null",
        )
        .await;
    browser
        .run("document.getElementById('rerun').click(); return true")
        .await;
    browser
        .until(
            "the rerun's page",
            "return location.hash === '#/task/fetch-1.rerun-1' && \
             [...document.querySelectorAll('dl.kv dt')].some((dt) => dt.textContent === 'rerun of' \
               && dt.nextSibling.textContent === 'fetch-1')",
        )
        .await;
    let rerun = store.get("fetch-1.rerun-1").await.unwrap();
    assert_eq!(rerun.rerun_of(), Some("fetch-1"));
    assert_eq!(rerun.status, dtask_replay::Status::Pending);
    assert_eq!(
        store.get("fetch-1").await.unwrap().rerun_as(),
        ["fetch-1.rerun-1"]
    );

    // Its purge button, clicked twice, deletes its records; the page then says so.
    browser.goto(&format!("{base}/#/task/fetch-1")).await;
    browser
        .until(
            "the purge button",
            "return document.getElementById('purge') !== null",
        )
        .await;
    browser
        .run("document.getElementById('purge').click(); return true")
        .await;
    browser
        .until(
            "the purge button armed",
            "return document.getElementById('purge').dataset.armed === 'yes'",
        )
        .await;
    assert!(
        store.get("fetch-1").await.is_ok(),
        "one click purges nothing"
    );
    browser
        .run("document.getElementById('purge').click(); return true")
        .await;
    browser
        .until(
            "the purged task's page",
            "return document.body.textContent.includes('was purged') && \
             document.getElementById('purge') === null",
        )
        .await;
    assert!(matches!(
        store.get("fetch-1").await,
        Err(dtask_engine::StoreError::Purged { .. })
    ));

    browser.call(reqwest::Method::DELETE, "", None).await;
    stop.send(()).unwrap();
    server.await.unwrap().unwrap();
}

/// Waits until task `id` is pending (bounded: a minute).
/// How many times the server answered `GET /api/tasks/{id}`, from its metrics.
async fn task_reads(base: &str) -> u64 {
    let text = reqwest::get(format!("{base}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .filter(|l| {
            l.starts_with(r#"dtask_http_requests_total{route="/api/tasks/{id}",method="GET""#)
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

async fn until_pending(store: &TaskStore, id: &str) {
    for _ in 0..1200 {
        if store.get(id).await.unwrap().status == dtask_replay::Status::Pending {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{id} never went back to pending");
}

/// A durable agent's run on its page: the conversation is shown and follows the run, and a
/// message typed into the page (sent to preempt) drops the model call in flight; the model's
/// answer and the message, where the model saw it, appear without a reload, and the message
/// box goes once the run has ended. An interactive run's page also closes it: a message
/// sent from the page wakes the waiting run, the close button ends it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_runs_page_shows_its_conversation_and_sends_it_a_message() {
    use dtask_engine::agent::AgentRequest;
    use dtask_engine::tool::Message;

    let (Some(driver), Some(chromium)) = (program("chromedriver"), program("chromium")) else {
        eprintln!(
            "SKIPPED an_agent_runs_page_shows_its_conversation_and_sends_it_a_message: chromium \
             and chromedriver are not installed (apt-get install chromium chromium-driver)"
        );
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let journal = Journal::open(dir.path(), JournalOptions::default()).unwrap();
    let store = TaskStore::open(journal, SystemClock, StoreConfig::default()).unwrap();
    let (model, agent, manager) = models::counting_run(&store, "run-1").await;
    let running = {
        let manager = manager.clone();
        tokio::spawn(async move { manager.execute("run-1").await })
    };
    model.called.notified().await;

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let config = ServerConfig::default().with_poll_interval(Duration::from_millis(20));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = Server::owner(store.clone(), Some(manager.clone()), config);
    let server = tokio::spawn(server.serve(listener, async {
        let _ = stopped.await;
    }));
    let (browser, _driver, _profile) = start_browser(&driver, &chromium).await;

    browser.goto(&format!("{base}/#/task/run-1")).await;
    browser
        .until(
            "the conversation",
            "const c = document.getElementById('conversation'); \
             return c !== null && c.textContent.includes('count to a million')",
        )
        .await;
    browser
        .until(
            "the message box",
            "const m = document.getElementById('agent-message'); \
             return m !== null && !m.parentElement.hidden",
        )
        .await;
    browser
        .run(
            "document.getElementById('agent-message').value = 'stop counting'; \
             document.getElementById('agent-preempt').checked = true; \
             document.getElementById('agent-send').click(); return true",
        )
        .await;
    browser
        .until(
            "the message sent",
            "const s = document.getElementById('agent-sent'); \
             return s !== null && s.textContent === 'message sent (input 1)'",
        )
        .await;
    models::steered(running, &model, "stop counting").await;
    let input = store.list_inputs("run-1", 0, 10).await.unwrap().inputs;
    assert_eq!(
        (input[0].kind.as_str(), input[0].data.as_slice()),
        ("agent.message", b"stop counting".as_slice())
    );
    assert_eq!(input[0].delivery, dtask_journal::Delivery::Preempt);
    browser
        .until(
            "the answer and the message where the model saw it",
            "const c = document.getElementById('conversation'); \
             if (c === null) return false; \
             const rows = [...c.querySelectorAll('.msg')].map((m) => m.textContent); \
             return rows.length === 3 && rows[1] === 'user (sent, input 1)stop counting' \
               && rows[2].startsWith('assistant · turn 1') && rows[2].endsWith('stopped')",
        )
        .await;
    // The timeline names the input, its delivery, and how far the run read its mailbox.
    browser
        .until(
            "the input in the timeline",
            "const t = document.querySelector('.timeline'); \
             return t !== null && t.textContent.includes('input 1: agent.message #') \
               && t.textContent.includes('(to preempt)') \
               && t.textContent.includes('inputs read up to 1 (attempt 1)')",
        )
        .await;
    browser
        .until(
            "the message box gone",
            "return document.getElementById('agent-message').parentElement.hidden",
        )
        .await;
    browser
        .run("document.querySelector('h2:not([hidden])').scrollIntoView(); return true")
        .await;
    browser.screenshot("server-agent.png").await;

    // An interactive run waits for its next message: the page sends one and closes it.
    agent
        .submit(
            &manager,
            AgentRequest::new(vec![Message::user("let us talk")])
                .with_task_id("chat-1")
                .interactive(),
        )
        .await
        .unwrap();
    let waiting = manager.execute("chat-1").await.unwrap();
    assert_eq!(waiting.status, dtask_replay::Status::WaitingInput);
    browser.goto(&format!("{base}/#/task/chat-1")).await;
    browser
        .until(
            "the close button of an interactive run",
            "const c = document.getElementById('agent-close'); \
             return c !== null && !c.hidden && !c.parentElement.hidden \
               && document.getElementById('conversation').textContent.includes('interactive')",
        )
        .await;
    browser
        .run(
            "document.getElementById('agent-message').value = 'and now?'; \
             document.getElementById('agent-send').click(); return true",
        )
        .await;
    // The message, sent from the page, wakes the run.
    until_pending(&store, "chat-1").await;
    let waiting = manager.execute("chat-1").await.unwrap();
    assert_eq!(waiting.status, dtask_replay::Status::WaitingInput);
    browser
        .run("document.getElementById('agent-close').click(); return true")
        .await;
    browser
        .until(
            "the close sent",
            "return document.getElementById('agent-closed') !== null",
        )
        .await;
    until_pending(&store, "chat-1").await;
    let done = manager.execute("chat-1").await.unwrap();
    assert_eq!(done.status, dtask_replay::Status::Completed, "{done:?}");
    browser
        .until(
            "the conversation answered and the box gone",
            "const c = document.getElementById('conversation'); \
             return c !== null && c.textContent.includes('and now?') \
               && document.getElementById('agent-message').parentElement.hidden",
        )
        .await;

    browser.call(reqwest::Method::DELETE, "", None).await;
    stop.send(()).unwrap();
    server.await.unwrap().unwrap();
}

/// The page stands what a client may have sent and what a server may answer: a `not_before`
/// no date can hold (nanoseconds taken for milliseconds, stored by a client of the store) is
/// shown as its number, and a live stream the server refused (503: every stream taken) is
/// opened again once there is room, so that the list goes live.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_shows_an_impossible_date_and_reopens_a_refused_stream() {
    let (Some(driver), Some(chromium)) = (program("chromedriver"), program("chromium")) else {
        eprintln!(
            "SKIPPED the_page_shows_an_impossible_date_and_reopens_a_refused_stream: chromium \
             and chromedriver are not installed (apt-get install chromium chromium-driver)"
        );
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let journal = Journal::open(dir.path(), JournalOptions::default()).unwrap();
    let store = TaskStore::open(journal, SystemClock, StoreConfig::default()).unwrap();
    let nanoseconds = 1_700_000_000_000_000_000_u64;
    store
        .create(CreateRequest {
            not_before: Some(dtask_journal::Timestamp(nanoseconds)),
            ..create("ns-1", "shell", "delayed in nanoseconds")
        })
        .await
        .unwrap();

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let mut config = ServerConfig::default().with_poll_interval(Duration::from_millis(20));
    config.max_streams = 1;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = Server::owner(store.clone(), None, config);
    let server = tokio::spawn(server.serve(listener, async {
        let _ = stopped.await;
    }));
    // The one stream allowed, taken: the page's is refused.
    let taken = reqwest::get(format!("{base}/api/stream")).await.unwrap();
    assert_eq!(taken.status(), reqwest::StatusCode::OK);
    let refused = reqwest::get(format!("{base}/api/stream")).await.unwrap();
    assert_eq!(refused.status(), reqwest::StatusCode::SERVICE_UNAVAILABLE);

    let (browser, _driver, _profile) = start_browser(&driver, &chromium).await;
    browser.goto(&format!("{base}/")).await;
    browser
        .until(
            "the row of ns-1, its time as a number",
            "const r = document.querySelector(\"tr[data-id='ns-1']\"); \
             return r !== null && r.textContent.includes('until 1700000000000000000')",
        )
        .await;
    browser
        .until(
            "the refused stream",
            "return document.querySelector('.live.off') !== null",
        )
        .await;
    // The stream taken is let go: the page's gets in at a later try, and the list goes live.
    drop(taken);
    browser
        .until(
            "the live badge",
            "return document.querySelector('.live.on') !== null",
        )
        .await;
    store
        .create(create("late-1", "shell", "created once the page is live"))
        .await
        .unwrap();
    browser
        .until(
            "late-1, live",
            "return document.querySelector(\"tr[data-id='late-1']\") !== null",
        )
        .await;

    // The task's page shows the number too.
    browser.goto(&format!("{base}/#/task/ns-1")).await;
    browser
        .until(
            "the task's state",
            "const dts = [...document.querySelectorAll('dl.kv dt')]; \
             const d = dts.find((dt) => dt.textContent === 'not before'); \
             return d !== undefined && d.nextSibling.textContent === '1700000000000000000'",
        )
        .await;

    browser.call(reqwest::Method::DELETE, "", None).await;
    stop.send(()).unwrap();
    server.await.unwrap().unwrap();
}
