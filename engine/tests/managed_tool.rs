//! The managed-tool layer's acceptance scenarios (the behaviour docs/managed-tools.md
//! describes, a foreground wait for input being the explicit interrupted result), each on a
//! real journal. The tool is a scriptable double that records its calls; the journal is always
//! real.
#![allow(clippy::unwrap_used, clippy::too_many_lines)]

#[path = "support/probe.rs"]
mod probe;

use base64::Engine as _;
use dtask_engine::managed::codec::{ManagedCheckpoint, ToolPayload};
use dtask_engine::managed::{
    read_input_request, CallOptions, CallOutcome, EnvelopeType, InputRequest, InterruptStage,
    InterruptState, ManagedError, ManagedTool, ManagedToolConfig, ManagedTools, Prepared,
    ProgressReader, Registration, ResultPart, RunOutcome, ToolCall, ToolFailure, ToolRegistry,
    ToolResult, ToolRunError, Update, UpdateError, MAX_PROGRESS_BYTES, MAX_PROGRESS_EVENT_BYTES,
    MAX_UPDATE_DATA_BYTES, MAX_UPDATE_EVENT_ID_BYTES, MAX_UPDATE_KIND_BYTES, PLAIN_EXECUTOR_KEY,
    RECOVERABLE_EXECUTOR_KEY,
};
use dtask_engine::tool::{ToolError, ToolInfo};
use dtask_engine::{
    ExecutorRegistry, Manager, ManagerConfig, StoreConfig, StoreError, SubmitRequest, SystemClock,
    TaskOutcome, TaskStore,
};
use dtask_journal::{Durability, Journal, JournalOptions, LeasePolicy, TaskSpec};
use dtask_replay::Status;
use futures::StreamExt;
use probe::{update, Probe, Recorder, Script};
use std::sync::Arc;
use std::time::Duration;

const NAME: &str = "probe";

struct Env {
    _dir: tempfile::TempDir,
    store: TaskStore,
    tools: ManagedTools,
    manager: Manager,
}

fn open_store(path: &std::path::Path) -> TaskStore {
    // A previous "process" in the same test may still be letting go of the journal (its
    // detached tasks end a moment after its manager closed): wait for the lock, boundedly.
    let mut tries = 0;
    let journal = loop {
        match Journal::open(
            path,
            JournalOptions::default().with_durability(Durability::Buffered),
        ) {
            Ok(journal) => break journal,
            Err(e) if tries < 500 => {
                tries += 1;
                let _ = e;
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => panic!("{e}"),
        }
    };
    TaskStore::open(journal, SystemClock, StoreConfig::default()).unwrap()
}

/// A store on a journal in `dir` with a manual clock (and the clock).
fn manual_store(dir: &std::path::Path) -> (TaskStore, dtask_engine::ManualClock) {
    let journal = Journal::open(
        dir.join("journal"),
        JournalOptions::default().with_durability(Durability::Buffered),
    )
    .unwrap();
    let clock = dtask_engine::ManualClock::new(1_000_000);
    let store = TaskStore::open(journal, clock.clone(), StoreConfig::default()).unwrap();
    (store, clock)
}

/// A store with a manual clock (in `dir`), the tools of one registration, and their manager.
fn manual_env(
    dir: &std::path::Path,
    registration: Registration,
) -> (TaskStore, ManagedTools, Manager, dtask_engine::ManualClock) {
    let (store, clock) = manual_store(dir);
    let mut registry = ToolRegistry::new();
    registry.register(registration).unwrap();
    let tools = ManagedTools::new(registry);
    let manager = manager_for(&store, &tools);
    (store, tools, manager, clock)
}

fn manager_for(store: &TaskStore, tools: &ManagedTools) -> Manager {
    let mut runtime = ExecutorRegistry::new();
    tools.register_executors(&mut runtime).unwrap();
    Manager::new(store.clone(), runtime, ManagerConfig::default())
}

fn env_with(registration: Registration) -> Env {
    let dir = tempfile::tempdir().unwrap();
    let store = open_store(&dir.path().join("journal"));
    let mut registry = ToolRegistry::new();
    registry.register(registration).unwrap();
    let tools = ManagedTools::new(registry);
    let manager = manager_for(&store, &tools);
    Env {
        _dir: dir,
        store,
        tools,
        manager,
    }
}

fn registration(probe: &Probe) -> Registration {
    Registration::new(
        ToolInfo::without_parameters(NAME, "a scripted tool"),
        probe.clone(),
    )
    .with_description(Arc::new(|args: &str| format!("probe: {args}")))
}

fn env(probe: &Probe) -> Env {
    env_with(registration(probe))
}

fn managed(env: &Env, config: ManagedToolConfig) -> ManagedTool {
    ManagedTool::new(&env.tools, env.manager.clone(), NAME, config).unwrap()
}

fn background() -> ManagedToolConfig {
    ManagedToolConfig::default().with_run_in_background(|_| true)
}

fn done(outcome: CallOutcome) -> ToolResult {
    match outcome {
        CallOutcome::Done(result) => result,
        CallOutcome::Interrupted(i) => panic!("unexpected interrupt {i:?}"),
    }
}

fn task_count(store: &TaskStore) -> usize {
    store.journal().tasks().count()
}

async fn stored_updates(store: &TaskStore, id: &str) -> Vec<(String, Vec<u8>)> {
    store
        .list_updates(id, None, 100, false)
        .await
        .unwrap()
        .updates
        .into_iter()
        .map(|u| (u.event_id, u.data))
        .collect()
}

async fn terminal(manager: &Manager, id: &str) -> TaskOutcome {
    manager.wait(id).await.unwrap()
}

/// An explicit-background call of the tool with `{}`.
async fn launch(env: &Env) -> ToolResult {
    done(
        managed(env, background())
            .call("{}", &CallOptions::default())
            .await
            .unwrap(),
    )
}

/// The error of a task that must end failed.
async fn failure(manager: &Manager, id: &str) -> String {
    match terminal(manager, id).await {
        TaskOutcome::Failed(e) => e,
        other => panic!("expected a failure, got {other:?}"),
    }
}

fn launched_id(result: &ToolResult) -> String {
    assert_eq!(result.envelope.kind(), EnvelopeType::LaunchResult);
    result.envelope.task_id().unwrap().to_owned()
}

async fn collect(
    stream: dtask_engine::managed::ManagedStream,
) -> Vec<Result<ToolResult, ManagedError>> {
    stream.collect().await
}

// 21 + 30: a replayed update is stored once, shown once, materialized twice (repair).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s21_stream_background_replayed_update_is_stored_once_and_materialized_twice() {
    let probe = Probe::new(
        Script::complete(b"{}").with_updates(vec![update("e1", b"one"), update("e1", b"one")]),
    );
    let recorder = Arc::new(Recorder::default());
    let env = env_with(registration(&probe).with_materializer(recorder.clone()));
    let tool = managed(&env, background());
    let items = collect(tool.call_stream("{}", &CallOptions::default())).await;
    let kinds: Vec<_> = items
        .iter()
        .map(|i| i.as_ref().unwrap().envelope.kind())
        .collect();
    assert_eq!(kinds, [EnvelopeType::Update, EnvelopeType::LaunchResult]);
    let id = launched_id(items[1].as_ref().unwrap());
    terminal(&env.manager, &id).await;
    assert_eq!(stored_updates(&env.store, &id).await.len(), 1);
    let appended = recorder.appended.lock().unwrap().clone();
    assert_eq!(appended.len(), 2);
    assert!(appended.iter().all(|(_, e, d)| e == "e1" && d == b"one"));
}

// A streaming caller is shown each first emission as the tool gave it (event id, kind, bytes,
// metadata), and the store keeps the same update.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shown_update_is_the_tools_own() {
    let given = Update {
        kind: "progress".into(),
        metadata: [("b", "2"), ("a", "1")]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect(),
        ..update("e1", b"one")
    };
    let probe =
        Probe::new(Script::complete(b"{}").with_updates(vec![given.clone(), given.clone()]));
    let env = env(&probe);
    let items =
        collect(managed(&env, background()).call_stream("{}", &CallOptions::default())).await;
    let shown = items[0].as_ref().unwrap().envelope.as_update().unwrap();
    assert_eq!(
        (
            shown.event_id.as_str(),
            shown.kind.as_str(),
            &shown.metadata
        ),
        ("e1", "progress", &given.metadata)
    );
    assert_eq!(
        base64::engine::general_purpose::STANDARD
            .decode(&shown.data)
            .unwrap(),
        b"one"
    );
    let id = launched_id(items[1].as_ref().unwrap());
    terminal(&env.manager, &id).await;
    let stored = env.store.list_updates(&id, None, 100, false).await.unwrap();
    let stored: Vec<_> = stored
        .updates
        .iter()
        .map(|u| {
            (
                u.event_id.as_str(),
                u.kind.as_str(),
                u.data.as_slice(),
                &u.metadata,
            )
        })
        .collect();
    let metadata: Vec<_> = given.metadata.clone().into_iter().collect();
    assert_eq!(stored, [("e1", "progress", b"one".as_slice(), &metadata)]);
}

// 22: the same event id with other bytes fails the task.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s22_conflicting_event_id_fails_the_background_task() {
    let probe = Probe::new(
        Script::complete(b"{}").with_updates(vec![update("e1", b"one"), update("e1", b"two")]),
    );
    let env = env(&probe);
    let result = launch(&env).await;
    let id = launched_id(&result);
    let e = failure(&env.manager, &id).await;
    assert!(e.contains("persist update"), "{e}");
}

// 23: a recoverable tool's update needs an event id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s23_recoverable_update_without_event_id_fails_the_task() {
    let probe = Probe::new(Script::complete(b"{}").with_updates(vec![update("", b"x")]));
    let env = env(&probe);
    let result = launch(&env).await;
    let e = failure(&env.manager, &launched_id(&result)).await;
    assert!(e.contains("event id is required"), "{e}");
}

// 24 + 25: a start checkpoint over 256 KiB cannot be committed: the run is stopped (its stop
// error is appended), never waited on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s24_s25_uncommittable_start_stops_the_run_and_never_waits() {
    let mut probe = Probe::new(Script::complete(b"{}"));
    probe.start_checkpoint = vec![b'x'; (256 << 10) + 1];
    probe.stop_error = Some("stop unavailable".into());
    let env = env(&probe);
    let result = launch(&env).await;
    let e = failure(&env.manager, &launched_id(&result)).await;
    assert!(e.contains("commit external start"), "{e}");
    assert!(e.contains("tool checkpoint exceeds"), "{e}");
    assert!(e.contains("stop operation: stop unavailable"), "{e}");
    let calls = probe.calls();
    assert_eq!(calls.stops, 1);
    assert_eq!(calls.waits, 0);
}

// 29: a plain tool may not return a checkpoint, in the background or the foreground.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s29_plain_tool_checkpoint_is_refused_and_the_run_stopped() {
    let mut probe = Probe::new(Script::complete(b"{}")).plain();
    probe.start_checkpoint = b"cp".to_vec();
    let env = env(&probe);
    let result = launch(&env).await;
    let e = failure(&env.manager, &launched_id(&result)).await;
    assert!(e.contains("plain tool cannot return a checkpoint"));
    let err = managed(&env, ManagedToolConfig::default())
        .call("{}", &CallOptions::default())
        .await
        .unwrap_err();
    assert!(err
        .to_string()
        .contains("plain tool cannot return a checkpoint"));
    assert_eq!(probe.calls().stops, 2);
}

// 31: the materializer sees updates in emission order, never sorted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s31_materializer_order_is_emission_order() {
    let probe = Probe::new(
        Script::complete(b"{}")
            .with_updates(vec![update("z-event", b"z"), update("a-event", b"a")]),
    );
    let recorder = Arc::new(Recorder::default());
    let env = env_with(registration(&probe).with_materializer(recorder.clone()));
    let result = launch(&env).await;
    terminal(&env.manager, &launched_id(&result)).await;
    let order: Vec<_> = recorder
        .appended
        .lock()
        .unwrap()
        .iter()
        .map(|a| a.1.clone())
        .collect();
    assert_eq!(order, ["z-event", "a-event"]);
}

// 32: update data cannot forge a record; bytes survive exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s32_update_data_cannot_forge_a_launch_result() {
    let forged = b"}\n{\"type\":\"launch_result\",\"task_id\":\"forged\"".to_vec();
    let probe = Probe::new(Script::complete(b"{}").with_updates(vec![update("e1", &forged)]));
    let env = env(&probe);
    let items =
        collect(managed(&env, background()).call_stream("{}", &CallOptions::default())).await;
    let mut lines = String::new();
    for item in &items {
        lines.push_str(&item.as_ref().unwrap().text());
    }
    let records: Vec<serde_json::Value> = lines
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(records.len(), 2);
    let data = records[0]["update"]["data"].as_str().unwrap();
    assert_eq!(
        base64::engine::general_purpose::STANDARD
            .decode(data)
            .unwrap(),
        forged
    );
    let real = records[1]["task_id"].as_str().unwrap();
    assert_ne!(real, "forged");
    assert!(env.store.get(real).await.is_ok());
}

// 33: an update stream that stays open after the outcome fails the task (after 5 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s33_update_stream_that_never_closes_fails_the_task() {
    let mut script = Script::complete(b"{}");
    script.never_close = true;
    let probe = Probe::new(script);
    let env = env(&probe);
    let result = launch(&env).await;
    let e = failure(&env.manager, &launched_id(&result)).await;
    assert!(e.contains("update stream did not close"), "{e}");
}

// 34: read_input_request returns an owned copy, and only for waiting managed-tool tasks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s34_read_input_request_is_a_copy_and_refuses_foreign_tasks() {
    let mut probe = Probe::new(Script {
        outcome: Some(RunOutcome::WaitingInput {
            request: InputRequest {
                id: "approval".into(),
                data: Some(serde_json::json!({"question": "ok?"})),
            },
            checkpoint: vec![],
        }),
        ..Script::block()
    });
    probe.resume = Some(Arc::new(|_| Ok(Script::complete(b"{}"))));
    let env = env(&probe);
    let result = launch(&env).await;
    let id = launched_id(&result);
    let TaskOutcome::Interrupted(task) = terminal(&env.manager, &id).await else {
        panic!()
    };
    let mut request = read_input_request(&task).unwrap();
    request.id = "mutated".into();
    assert_eq!(read_input_request(&task).unwrap().id, "approval");
    let mut foreign = (*task).clone();
    std::sync::Arc::make_mut(&mut foreign.spec).executor_key = "other".into();
    assert!(read_input_request(&foreign).is_err());
    let mut kind = (*task).clone();
    std::sync::Arc::make_mut(&mut kind.spec).kind = "other".into();
    assert!(read_input_request(&kind).is_err());
}

// 35: a plain tool's id-less update gets a generated id, shown as stored; no materializing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s35_plain_update_gets_a_generated_id_shown_live() {
    let probe = Probe::new(Script::complete(b"{}").with_updates(vec![update("", b"x")])).plain();
    let recorder = Arc::new(Recorder::default());
    let env = env_with(registration(&probe).with_materializer(recorder.clone()));
    let items =
        collect(managed(&env, background()).call_stream("{}", &CallOptions::default())).await;
    let shown = items[0]
        .as_ref()
        .unwrap()
        .envelope
        .as_update()
        .cloned()
        .unwrap();
    assert!(!shown.event_id.is_empty());
    let id = launched_id(items[1].as_ref().unwrap());
    terminal(&env.manager, &id).await;
    assert_eq!(stored_updates(&env.store, &id).await[0].0, shown.event_id);
    assert!(recorder.appended.lock().unwrap().is_empty());
}

// 37: a preparer error is returned as is; nothing is created or started.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s37_preparer_error_is_returned_and_nothing_happens() {
    let mut probe = Probe::new(Script::complete(b"{}"));
    probe.prepare = Some(Arc::new(|_| Err("region unknown".into())));
    let env = env(&probe);
    let tool = managed(&env, ManagedToolConfig::default());
    let err = tool.call("{}", &CallOptions::default()).await.unwrap_err();
    assert_eq!(err.to_string(), "region unknown");
    let items = collect(tool.call_stream("{}", &CallOptions::default())).await;
    assert_eq!(items.len(), 1);
    assert_eq!(items[0].as_ref().unwrap_err().to_string(), "region unknown");
    assert!(probe.calls().starts.is_empty());
    assert_eq!(task_count(&env.store), 0);
}

// 38: a preparer interrupt is answered; the tool starts once with the prepared arguments.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s38_preparer_interrupt_is_resumed_with_an_answer() {
    let mut probe = Probe::new(Script::complete(b"{\"ok\":true}"));
    probe.prepare = Some(Arc::new(|request| match &request.resume {
        None => Ok(Prepared::Interrupt {
            info: serde_json::json!("Which region should be used?"),
            state: b"asked-region".to_vec(),
        }),
        Some(resume) => {
            assert_eq!(resume.state, b"asked-region");
            let region: String = serde_json::from_slice(&resume.answer).unwrap();
            let mut args: serde_json::Value = serde_json::from_str(&request.arguments).unwrap();
            args["region"] = region.into();
            Ok(Prepared::Arguments(args.to_string()))
        }
    }));
    let env = env(&probe);
    let tool = managed(&env, ManagedToolConfig::default());
    let CallOutcome::Interrupted(interrupt) = tool
        .call(r#"{"value":"original"}"#, &CallOptions::default())
        .await
        .unwrap()
    else {
        panic!("expected an interrupt")
    };
    assert_eq!(
        interrupt.info,
        serde_json::json!("Which region should be used?")
    );
    assert!(probe.calls().starts.is_empty());
    // The state travels as text.
    let state = InterruptState::decode(&interrupt.state.encode()).unwrap();
    let result = done(
        tool.resume(&state, b"\"us-east\"", &CallOptions::default())
            .await
            .unwrap(),
    );
    assert_eq!(result.envelope.kind(), EnvelopeType::ForegroundResult);
    let starts = probe.calls().starts;
    assert_eq!(starts.len(), 1);
    let args: serde_json::Value = serde_json::from_str(&starts[0].arguments).unwrap();
    assert_eq!(
        args,
        serde_json::json!({"value":"original","region":"us-east"})
    );
    assert_eq!(task_count(&env.store), 0);
}

// 40: a fast foreground completion publishes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s40_fast_foreground_completion_publishes_nothing() {
    let probe = Probe::new(Script::complete(br#"{"answer":42}"#));
    let env = env(&probe);
    let result = done(
        managed(&env, ManagedToolConfig::default())
            .call("{}", &CallOptions::default())
            .await
            .unwrap(),
    );
    assert_eq!(
        result.text(),
        "{\"type\":\"foreground_result\",\"status\":\"completed\",\"description\":\"probe: {}\",\"output\":{\"answer\":42}}\n"
    );
    let starts = probe.calls().starts;
    assert_eq!(starts[0].attempt, 0);
    assert!(starts[0].task_id.starts_with("background_tool"));
    assert!(matches!(
        env.store.get(&starts[0].task_id).await,
        Err(StoreError::NotFound(_))
    ));
}

fn approval_probe() -> Probe {
    let mut probe = Probe::new(Script {
        outcome: Some(RunOutcome::WaitingInput {
            request: InputRequest {
                id: "approval".into(),
                data: Some(serde_json::json!({"question": "approve?"})),
            },
            checkpoint: vec![],
        }),
        ..Script::block()
    });
    probe.start_checkpoint = b"start-cp".to_vec();
    probe.resume = Some(Arc::new(
        |request| match serde_json::from_slice::<String>(&request.data)
            .unwrap()
            .as_str()
        {
            "yes" => Ok(Script::complete(b"\"approved\"")),
            _ => Err(ToolRunError::InputRejected("yes only".into())),
        },
    ));
    probe
}

// 41: a foreground wait for input is an explicit interrupt; resume finishes in the foreground.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s41_foreground_waiting_input_interrupts_and_resumes() {
    let probe = approval_probe();
    let env = env(&probe);
    let tool = managed(&env, ManagedToolConfig::default());
    let CallOutcome::Interrupted(interrupt) =
        tool.call("{}", &CallOptions::default()).await.unwrap()
    else {
        panic!()
    };
    assert_eq!(interrupt.info, serde_json::json!({"question": "approve?"}));
    assert_eq!(task_count(&env.store), 0);
    // A rejected answer keeps the call interrupted on the same state.
    let again = tool
        .resume(&interrupt.state, b"\"maybe\"", &CallOptions::default())
        .await
        .unwrap();
    assert_eq!(again, CallOutcome::Interrupted(interrupt.clone()));
    let result = done(
        tool.resume(&interrupt.state, b"\"yes\"", &CallOptions::default())
            .await
            .unwrap(),
    );
    assert_eq!(result.envelope.status(), Some(Status::Completed));
    assert_eq!(result.envelope.task_id(), None);
    let calls = probe.calls();
    assert_eq!(calls.resumes.len(), 1);
    let resume = &calls.resumes[0];
    assert_eq!(resume.attempt, 0);
    assert_eq!(resume.task_id, calls.starts[0].task_id);
    assert_eq!(resume.request_id, "approval");
    assert_eq!(resume.data, b"\"yes\"");
    assert_eq!(resume.checkpoint, b"start-cp");
    assert!(calls.recovers.is_empty());
    assert_eq!(task_count(&env.store), 0);
    // A state of another tool is refused.
    let mut foreign = interrupt.state.clone();
    foreign.tool_name = "other".into();
    assert!(matches!(
        tool.resume(&foreign, b"\"yes\"", &CallOptions::default())
            .await,
        Err(ManagedError::InvalidInterruptState(_))
    ));
    // Through the Tool trait, the interrupt is a typed error carrying the state.
    let err = dtask_engine::tool::Tool::invoke(&tool, "{}")
        .await
        .unwrap_err();
    let ToolError::Interrupted { state, .. } = err else {
        panic!("{err:?}")
    };
    assert!(matches!(
        InterruptState::decode(&state).unwrap().stage,
        InterruptStage::Foreground { .. }
    ));
}

// 42 + 59: a background wait: rejected answers keep it waiting, stages replace the checkpoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s42_background_waiting_task_walks_through_its_stages() {
    let mut probe = Probe::new(Script {
        outcome: Some(RunOutcome::WaitingInput {
            request: InputRequest {
                id: "approval".into(),
                data: None,
            },
            checkpoint: vec![],
        }),
        ..Script::block()
    });
    probe.start_checkpoint = b"current".to_vec();
    probe.resume = Some(Arc::new(|request| {
        let answer: String = serde_json::from_slice(&request.data).unwrap();
        match (request.request_id.as_str(), answer.as_str()) {
            ("approval", "approve") => Ok(Script {
                outcome: Some(RunOutcome::WaitingInput {
                    request: InputRequest {
                        id: "region".into(),
                        data: None,
                    },
                    checkpoint: b"next".to_vec(),
                }),
                ..Script::block()
            }),
            ("region", "us-east") => Ok(Script::complete(b"\"done\"")),
            _ => Err(ToolRunError::InputRejected("no".into())),
        }
    }));
    let env = env(&probe);
    let result = launch(&env).await;
    let id = launched_id(&result);
    let answer = |data: &'static str| {
        let manager = env.manager.clone();
        let id = id.clone();
        async move {
            let TaskOutcome::Interrupted(task) = manager.wait(&id).await.unwrap() else {
                panic!()
            };
            manager
                .resume(&id, task.version, data.as_bytes().to_vec())
                .await
                .unwrap();
            manager.execute(&id).await.unwrap()
        }
    };
    let TaskOutcome::Interrupted(task) = terminal(&env.manager, &id).await else {
        panic!()
    };
    assert_eq!(
        ManagedCheckpoint::decode(&task.checkpoint)
            .unwrap()
            .tool_checkpoint,
        b"current"
    );
    let after_reject = answer("\"reject\"").await;
    assert_eq!(after_reject.status, Status::WaitingInput);
    assert_eq!(read_input_request(&after_reject).unwrap().id, "approval");
    assert!(probe.calls().resumes.is_empty());
    let after_approve = answer("\"approve\"").await;
    assert_eq!(read_input_request(&after_approve).unwrap().id, "region");
    assert_eq!(
        ManagedCheckpoint::decode(&after_approve.checkpoint)
            .unwrap()
            .tool_checkpoint,
        b"next"
    );
    let wrong = answer("\"us-east-typo\"").await;
    assert_eq!(read_input_request(&wrong).unwrap().id, "region");
    let last = answer("\"us-east\"").await;
    assert_eq!(last.status, Status::Completed);
    assert_eq!(last.result_data, b"\"done\"");
    assert_eq!(last.pending_resume, None);
    let checkpoints: Vec<_> = probe
        .calls()
        .resumes
        .iter()
        .map(|r| r.checkpoint.clone())
        .collect();
    assert_eq!(checkpoints, [b"current".to_vec(), b"next".to_vec()]);
}

// 43: a resume interrupted by a drain is replayed, identical, by the next process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s43_resume_interrupted_by_drain_is_replayed_identically() {
    let mut probe = approval_probe();
    probe.resume = Some(Arc::new(|_| Ok(Script::block())));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal");
    let id;
    {
        let store = open_store(&path);
        let mut registry = ToolRegistry::new();
        registry.register(registration(&probe)).unwrap();
        let tools = ManagedTools::new(registry);
        let manager = manager_for(&store, &tools);
        let tool = ManagedTool::new(&tools, manager.clone(), NAME, background()).unwrap();
        id = launched_id(&done(
            tool.call("{}", &CallOptions::default()).await.unwrap(),
        ));
        let TaskOutcome::Interrupted(task) = manager.wait(&id).await.unwrap() else {
            panic!()
        };
        manager
            .resume(&id, task.version, b"\"yes\"".to_vec())
            .await
            .unwrap();
        let running = tokio::spawn({
            let manager = manager.clone();
            let id = id.clone();
            async move {
                // The first attempt (which asked for input) may not have let go of the task
                // in this process yet.
                loop {
                    match manager.execute(&id).await {
                        Err(dtask_engine::RuntimeError::AlreadyExecuting(_)) => {
                            tokio::task::yield_now().await;
                        }
                        other => return other,
                    }
                }
            }
        });
        while probe.calls().resumes.is_empty() {
            // An attempt that ended before the tool saw the resume is the failure to report,
            // not a reason to wait for ever.
            assert!(
                !running.is_finished(),
                "the attempt ended before the resume reached the tool"
            );
            tokio::task::yield_now().await;
        }
        manager
            .close(
                Some(tokio::time::Instant::now() + Duration::from_secs(5)),
                "shutting down",
            )
            .await
            .unwrap();
        let yielded = running.await.unwrap().unwrap();
        assert_eq!(yielded.status, Status::Pending);
        assert_eq!(yielded.pending_resume.as_deref(), Some(&b"\"yes\""[..]));
    }
    let mut second = approval_probe();
    second.resume = Some(Arc::new(|_| Ok(Script::complete(b"\"ok\""))));
    let store = open_store(&path);
    let mut registry = ToolRegistry::new();
    registry.register(registration(&second)).unwrap();
    let tools = ManagedTools::new(registry);
    let manager = manager_for(&store, &tools);
    let task = manager.execute(&id).await.unwrap();
    assert_eq!(task.status, Status::Completed);
    assert_eq!(task.attempt, 3);
    let first = &probe.calls().resumes[0];
    let replay = &second.calls().resumes[0];
    assert_eq!(
        (&first.request_id, &first.data),
        (&replay.request_id, &replay.data)
    );
}

fn handoff_probe(script: Script) -> Probe {
    let mut probe = Probe::new(script);
    probe.handoff = true;
    probe
}

fn handoff(timeout_ms: u64) -> ManagedToolConfig {
    ManagedToolConfig::default()
        .with_foreground_timeout(Duration::from_millis(timeout_ms))
        .with_auto_background(|_| true)
}

// 44: a foreground call that outlives its time is handed off, and can be canceled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s44_handoff_after_timeout_then_cancel() {
    let probe = handoff_probe(Script::block());
    let env = env(&probe);
    let result = done(
        managed(&env, handoff(5))
            .call("{}", &CallOptions::default())
            .await
            .unwrap(),
    );
    let id = launched_id(&result);
    assert_eq!(result.envelope.status(), Some(Status::Pending));
    assert_eq!(probe.calls().adopts, 1);
    // The adopted run is observed by attempt 1: no new start.
    while env.store.get(&id).await.unwrap().status != Status::Running {
        tokio::task::yield_now().await;
    }
    let task = env.store.get(&id).await.unwrap();
    assert_eq!(task.attempt, 1);
    assert!(ManagedCheckpoint::decode(&task.checkpoint).unwrap().started);
    env.manager.request_cancel(&id, "operator").await.unwrap();
    assert_eq!(
        terminal(&env.manager, &id).await,
        TaskOutcome::Canceled("operator".into())
    );
    assert_eq!(
        probe.calls().starts.len(),
        1,
        "the operation started once, in the foreground"
    );
}

/// A hand-off whose first attempt, dispatched in this process, cannot claim its task before
/// the test lets it: the policy arms the tool's validation gate so that the hand-off's submit
/// validates and the dispatched attempt's validation, before its claim, is held.
fn held_handoff() -> (Probe, Arc<probe::ValidateGate>, ManagedToolConfig) {
    let mut probe = handoff_probe(Script::block());
    let gate = Arc::new(probe::ValidateGate::default());
    probe.validate_gate = Some(Arc::clone(&gate));
    let arm = Arc::clone(&gate);
    let config = handoff(5).with_auto_background(move |_| {
        arm.arm(1);
        true
    });
    (probe, gate, config)
}

// A hand-off canceled before its first attempt claimed it (the cancel is direct: a pending
// task never claimed) stops the run this process adopted for that attempt, which no attempt
// will take now. It used to stay in the process's table, running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handoff_canceled_before_its_first_attempt_stops_the_adopted_run() {
    let (probe, gate, config) = held_handoff();
    let env = env(&probe);
    let result = done(
        managed(&env, config)
            .call("{}", &CallOptions::default())
            .await
            .unwrap(),
    );
    let id = launched_id(&result);
    let task = env.manager.request_cancel(&id, "operator").await;
    gate.open();
    let task = task.unwrap();
    assert_eq!((task.status, task.attempt), (Status::Canceled, 0));
    let calls = probe.calls();
    assert_eq!(calls.adopts, 1);
    assert_eq!(calls.stops, 1, "the adopted run is stopped");
    assert!(calls.recovers.is_empty());
}

// The same cancel written by another (a process without the run, or straight to the store):
// the attempt the hand-off dispatched finds the task ended, and stops the run adopted for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handoff_canceled_elsewhere_before_its_first_attempt_stops_the_adopted_run() {
    let (probe, gate, config) = held_handoff();
    let env = env(&probe);
    let result = done(
        managed(&env, config)
            .call("{}", &CallOptions::default())
            .await
            .unwrap(),
    );
    let id = launched_id(&result);
    let pending = env.store.get(&id).await.unwrap();
    let task = env
        .store
        .execute(
            &id,
            pending.version,
            dtask_engine::Command::RequestCancel {
                reason: "elsewhere".into(),
            },
        )
        .await;
    gate.open();
    let task = task.unwrap();
    assert_eq!((task.status, task.attempt), (Status::Canceled, 0));
    // A deadlock guard, not a timing: the dispatched attempt ends at once.
    let stopped = async {
        while probe.calls().stops == 0 {
            tokio::task::yield_now().await;
        }
    };
    tokio::time::timeout(Duration::from_secs(30), stopped)
        .await
        .expect("the adopted run is stopped");
    assert_eq!(probe.calls().stops, 1);
}

// A caller that goes away while its call is being handed off (its future dropped inside the
// tool's adopt) leaves the hand-off to finish: the task is created, and its first attempt
// carries the adopted run. The hand-off used to be dropped with the caller: no task, and
// the run — its stop-on-drop guard already disarmed — running unseen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_gone_during_a_handoff_leaves_the_run_to_its_task() {
    let mut probe = handoff_probe(Script::block());
    let adopting = Arc::new(tokio::sync::Semaphore::new(0));
    probe.adopt_gate = Some(Arc::clone(&adopting));
    let env = env(&probe);
    let tool = managed(&env, handoff(5));
    let call = tokio::spawn(async move { tool.call("{}", &CallOptions::default()).await });
    // Deadlock guards, not timings: each wait ends as soon as the hand-off gets there.
    let guard = Duration::from_secs(30);
    let adopted = async {
        while probe.calls().adopts == 0 {
            tokio::task::yield_now().await;
        }
    };
    tokio::time::timeout(guard, adopted)
        .await
        .expect("adopting");
    call.abort();
    assert!(call.await.unwrap_err().is_cancelled());
    adopting.add_permits(1);
    let created = async {
        loop {
            if let Some(task) = env.store.journal().tasks().next() {
                break task.unwrap().0;
            }
            tokio::task::yield_now().await;
        }
    };
    let id = tokio::time::timeout(guard, created)
        .await
        .expect("the handed-off task is created");
    let mut version = 0;
    loop {
        let task = env.store.wait_for_task_version(&id, version).await.unwrap();
        if task.status == Status::Running {
            break;
        }
        version = task.version;
    }
    env.manager.request_cancel(&id, "operator").await.unwrap();
    assert_eq!(
        terminal(&env.manager, &id).await,
        TaskOutcome::Canceled("operator".into())
    );
    let calls = probe.calls();
    assert_eq!(calls.starts.len(), 1, "started once, in the foreground");
    assert!(calls.recovers.is_empty(), "attempt 1 took the adopted run");
    assert_eq!(calls.stops, 1);
}

// A foreground run that asked to be looked at again later went to the background as a
// delayed task, its started marker durable; a direct cancel of it (pending, never claimed)
// recovers the operation and stops it, as the next claim of a task with cancel intent does.
// It used to end the task at once, the remote operation running on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_back_later_task_canceled_while_delayed_stops_its_operation() {
    let mut probe = Probe::new(Script {
        outcome: Some(RunOutcome::CheckBackIn {
            checkpoint: b"job-7".to_vec(),
            after: Duration::from_secs(3600),
        }),
        ..Script::block()
    });
    probe.recover_script = Some(Script::block());
    let env = env(&probe);
    let result = done(
        managed(&env, ManagedToolConfig::default())
            .call("{}", &CallOptions::default())
            .await
            .unwrap(),
    );
    let id = launched_id(&result);
    assert_eq!(result.envelope.status(), Some(Status::Pending));
    let task = env.manager.request_cancel(&id, "operator").await.unwrap();
    assert_eq!(task.status, Status::Canceled);
    let calls = probe.calls();
    assert_eq!(calls.recovers.len(), 1);
    assert_eq!(calls.recovers[0].checkpoint, b"job-7");
    assert_eq!(calls.stops, 1, "the operation is stopped");
}

// 45: a foreground stream shows its updates, then the foreground result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s45_foreground_stream_shows_updates_then_the_result() {
    let probe = Probe::new(Script::complete(b"{}").with_updates(vec![
        update("1", b"a"),
        update("2", b"b"),
        update("3", b"c"),
    ]));
    let env = env(&probe);
    let items = collect(
        managed(&env, ManagedToolConfig::default()).call_stream("{}", &CallOptions::default()),
    )
    .await;
    let kinds: Vec<_> = items
        .iter()
        .map(|i| i.as_ref().unwrap().envelope.kind())
        .collect();
    assert_eq!(
        kinds,
        [
            EnvelopeType::Update,
            EnvelopeType::Update,
            EnvelopeType::Update,
            EnvelopeType::ForegroundResult
        ]
    );
    assert_eq!(items[3].as_ref().unwrap().envelope.task_id(), None);
    assert_eq!(task_count(&env.store), 0);
}

// 46: a handed-off run whose worker drained is recovered from the adopted checkpoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s46_handoff_then_drain_recovers_from_the_adopted_checkpoint() {
    let mut probe = handoff_probe(Script::block());
    probe.start_checkpoint = br#"{"run_id":"business-run"}"#.to_vec();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal");
    let id;
    {
        let store = open_store(&path);
        let mut registry = ToolRegistry::new();
        registry.register(registration(&probe)).unwrap();
        let tools = ManagedTools::new(registry);
        let manager = manager_for(&store, &tools);
        let tool = ManagedTool::new(&tools, manager.clone(), NAME, handoff(5)).unwrap();
        id = launched_id(&done(
            tool.call("{}", &CallOptions::default()).await.unwrap(),
        ));
        while store.get(&id).await.unwrap().status != Status::Running {
            tokio::task::yield_now().await;
        }
        manager
            .close(
                Some(tokio::time::Instant::now() + Duration::from_secs(5)),
                "shutting down",
            )
            .await
            .unwrap();
        assert_eq!(store.get(&id).await.unwrap().status, Status::Pending);
    }
    let mut second = probe.clone();
    second.calls = Arc::default();
    second.script = Script::complete(b"\"recovered\"");
    let store = open_store(&path);
    let mut registry = ToolRegistry::new();
    registry.register(registration(&second)).unwrap();
    let tools = ManagedTools::new(registry);
    let manager = manager_for(&store, &tools);
    let task = manager.execute(&id).await.unwrap();
    assert_eq!(task.status, Status::Completed);
    let calls = second.calls();
    assert_eq!(calls.recovers.len(), 1);
    assert_eq!(calls.recovers[0].attempt, 2);
    assert_eq!(
        calls.recovers[0].checkpoint,
        br#"{"run_id":"business-run"}"#
    );
    assert!(calls.starts.is_empty());
    assert_eq!(
        probe.calls().stops,
        0,
        "a drain never stops a recoverable run"
    );
}

/// Submits a call of the tool under `executor_key` whose started marker (with no tool
/// checkpoint) is already durable, as a hand-off leaves it; its id.
async fn submit_started(env: &Env, executor_key: &str) -> String {
    let id = env.manager.allocate_task_id("background_tool").unwrap();
    let spec = TaskSpec {
        id: id.clone(),
        executor_key: executor_key.into(),
        kind: "background_tool".into(),
        payload: ToolPayload::new(NAME, None, "{}").encode(),
        ..TaskSpec::default()
    };
    env.manager
        .submit(SubmitRequest {
            spec,
            initial_checkpoint: ManagedCheckpoint::started(vec![]).encode().unwrap(),
            context_snapshot: vec![],
            parent: None,
            not_before: None,
        })
        .await
        .unwrap();
    id
}

// 47: a started marker without a tool checkpoint recovers with an empty one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s47_started_marker_without_checkpoint_recovers() {
    let probe = Probe::new(Script::complete(b"{}"));
    let env = env(&probe);
    let id = submit_started(&env, RECOVERABLE_EXECUTOR_KEY).await;
    let task = env.manager.execute(&id).await.unwrap();
    assert_eq!(task.status, Status::Completed);
    let calls = probe.calls();
    assert_eq!(calls.recovers.len(), 1);
    assert!(calls.recovers[0].checkpoint.is_empty());
    assert!(calls.starts.is_empty());
}

// A plain tool's handed-off task whose adopted run was lost with its process (no run in this
// process's table at attempt 1) fails: starting it again would repeat its side effects, and a
// plain tool cannot be recovered. (The reference starts it again; dtask does not.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_handed_off_task_whose_run_was_lost_fails_without_a_second_start() {
    let probe = handoff_probe(Script::complete(b"{}")).plain();
    let env = env(&probe);
    let id = submit_started(&env, PLAIN_EXECUTOR_KEY).await;
    let task = env.manager.execute(&id).await.unwrap();
    assert_eq!(task.status, Status::Failed);
    assert!(
        task.result_error.contains("handed-off run was lost"),
        "{}",
        task.result_error
    );
    let calls = probe.calls();
    assert!(
        calls.starts.is_empty(),
        "the operation is not started again"
    );
    assert!(calls.recovers.is_empty());
    // Rerun, it starts from the beginning: the hand-off's started marker is not carried
    // (the rerun failed at once on it, as its original did).
    let rerun = env.manager.rerun(&id, None).await.unwrap();
    assert!(rerun.checkpoint.is_empty());
    let done = env.manager.execute(rerun.id()).await.unwrap();
    assert_eq!(done.status, Status::Completed, "{}", done.result_error);
    assert_eq!(probe.calls().starts.len(), 1);
}

// 48: a materializer failure is recorded once; the task completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s48_materializer_failure_is_recorded_and_the_task_completes() {
    let probe = Probe::new(Script::complete(b"{}").with_updates(vec![update("e1", b"x")]));
    let recorder = Arc::new(Recorder {
        fail: Some("disk full".into()),
        ..Recorder::default()
    });
    let env = env_with(registration(&probe).with_materializer(recorder.clone()));
    let result = launch(&env).await;
    let id = launched_id(&result);
    terminal(&env.manager, &id).await;
    let task = env.store.get(&id).await.unwrap();
    assert_eq!(task.status, Status::Completed);
    assert_eq!(task.spec.output_file, format!("/outputs/{id}"));
    assert!(task.output_file_error.contains("disk full"));
    assert_eq!(stored_updates(&env.store, &id).await.len(), 1);
    assert_eq!(recorder.appended.lock().unwrap().len(), 1);
}

// 49: a plain tool's task runs under the plain key with the fail policy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s49_plain_background_task_uses_the_fail_policy() {
    let probe = Probe::new(Script::complete(b"{}")).plain();
    let env = env(&probe);
    let result = launch(&env).await;
    let task = env.store.get(&launched_id(&result)).await.unwrap();
    assert_eq!(task.spec.executor_key, PLAIN_EXECUTOR_KEY);
    assert_eq!(task.policy, LeasePolicy::Fail);
}

// 50 + 51: result rendering.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s50_s51_renderer_adds_parts_or_fails_the_call() {
    let probe = Probe::new(Script::complete(b"{\"n\":1}"));
    let env = env_with(registration(&probe).with_renderer(Arc::new(|_, _| Ok(None))));
    let err = managed(&env, ManagedToolConfig::default())
        .call("{}", &CallOptions::default())
        .await
        .unwrap_err();
    assert_eq!(err.to_string(), "result renderer returned nil");

    let env = env_with(registration(&probe).with_renderer(Arc::new(|_, data| {
        Ok(Some(vec![
            ResultPart::Text(String::from_utf8_lossy(data).into_owned()),
            ResultPart::Image {
                mime_type: "image/png".into(),
                data: vec![137, 80],
            },
        ]))
    })));
    let result = done(
        managed(&env, ManagedToolConfig::default())
            .call("{}", &CallOptions::default())
            .await
            .unwrap(),
    );
    assert_eq!(result.envelope.output(), None);
    assert_eq!(result.envelope.status(), Some(Status::Completed));
    let parts = result.into_parts();
    assert_eq!(parts.len(), 3);
    assert_eq!(parts[1], ResultPart::Text("{\"n\":1}".into()));
}

// 52: after a streaming hand-off, a late update reaches the journal, not the stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s52_late_update_after_streaming_handoff_is_stored_once() {
    let mut script = Script::complete(b"{}").with_updates(vec![update("late", b"late")]);
    script.update_delay = Some(Duration::from_millis(200));
    let probe = handoff_probe(script);
    let env = env(&probe);
    let items = collect(managed(&env, handoff(5)).call_stream("{}", &CallOptions::default())).await;
    assert_eq!(items.len(), 1);
    let id = launched_id(items[0].as_ref().unwrap());
    assert_eq!(
        terminal(&env.manager, &id).await,
        TaskOutcome::Completed(b"{}".to_vec())
    );
    assert_eq!(
        stored_updates(&env.store, &id).await,
        [("late".to_owned(), b"late".to_vec())]
    );
}

// 54: specs the executors refuse.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s54_invalid_specs_are_refused() {
    let recoverable = Probe::new(Script::complete(b"{}"));
    let env = env(&recoverable);
    let spec = |key: &str, kind: &str, payload: Vec<u8>| TaskSpec {
        id: env.manager.allocate_task_id("background_tool").unwrap(),
        executor_key: key.into(),
        kind: kind.into(),
        payload,
        ..TaskSpec::default()
    };
    let good = ToolPayload::new(NAME, None, "{}").encode();
    let mut v2 = ToolPayload::new(NAME, None, "{}");
    v2.version = 2;
    let bad = [
        spec(RECOVERABLE_EXECUTOR_KEY, "other", good.clone()),
        spec(RECOVERABLE_EXECUTOR_KEY, "background_tool", b"{".to_vec()),
        spec(RECOVERABLE_EXECUTOR_KEY, "background_tool", v2.encode()),
        spec(
            RECOVERABLE_EXECUTOR_KEY,
            "background_tool",
            ToolPayload::new("missing", None, "{}").encode(),
        ),
        spec(PLAIN_EXECUTOR_KEY, "background_tool", good.clone()),
    ];
    for spec in bad {
        let submitted = env
            .manager
            .submit(SubmitRequest {
                spec,
                ..SubmitRequest::default()
            })
            .await;
        assert!(submitted.is_err(), "{submitted:?}");
    }
    let ok = spec(RECOVERABLE_EXECUTOR_KEY, "background_tool", good);
    assert!(env
        .manager
        .submit(SubmitRequest {
            spec: ok,
            ..SubmitRequest::default()
        })
        .await
        .is_ok());
}

// 65 + 66 + 67: construction and argument errors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s65_s66_s67_bad_configuration_and_arguments() {
    let probe = Probe::new(Script::complete(b"{}"));
    let env = env(&probe);
    let missing = ManagedTool::new(
        &env.tools,
        env.manager.clone(),
        "missing",
        ManagedToolConfig::default(),
    );
    assert_eq!(
        missing.unwrap_err().to_string(),
        "tool \"missing\" is not registered"
    );
    let no_handoff = ManagedTool::new(&env.tools, env.manager.clone(), NAME, handoff(5));
    assert!(no_handoff
        .unwrap_err()
        .to_string()
        .contains("does not support foreground handoff"));
    let tool = managed(&env, ManagedToolConfig::default());
    let opts = CallOptions::default();
    assert!(tool
        .call("", &opts)
        .await
        .unwrap_err()
        .to_string()
        .contains("arguments are required"));
    let huge = format!("\"{}\"", "x".repeat(1 << 20));
    assert!(tool
        .call(&huge, &opts)
        .await
        .unwrap_err()
        .to_string()
        .contains("arguments exceed"));
    assert!(tool
        .call("{", &opts)
        .await
        .unwrap_err()
        .to_string()
        .contains("validate arguments"));
    assert!(probe.calls().starts.is_empty());

    let failing = Arc::new(Recorder {
        reserve_error: Some("no space".into()),
        ..Recorder::default()
    });
    let env = env_with(registration(&probe).with_materializer(failing));
    let err = managed(&env, ManagedToolConfig::default())
        .call("{}", &opts)
        .await
        .unwrap_err();
    assert_eq!(err.to_string(), "reserve output: no space");
    let empty = Arc::new(Recorder {
        empty_path: true,
        ..Recorder::default()
    });
    let env = env_with(registration(&probe).with_materializer(empty));
    let err = managed(&env, ManagedToolConfig::default())
        .call("{}", &opts)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("empty path"));
}

// 71 (+89): the per-call timeout wins; the run is stopped; the id was never persisted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s71_foreground_timeout_stops_the_run() {
    let probe = Probe::new(Script::block());
    let env = env(&probe);
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = Arc::clone(&calls);
    let config = ManagedToolConfig::default().with_invocation_timeout(move |_| {
        counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Some(Duration::from_millis(5))
    });
    let err = managed(&env, config)
        .call("{}", &CallOptions::default())
        .await
        .unwrap_err();
    let ManagedError::ForegroundTimeout { timeout, task_id } = err else {
        panic!("{err}")
    };
    assert_eq!(timeout, Duration::from_millis(5));
    assert!(!task_id.is_empty());
    assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert_eq!(probe.calls().stops, 1);
    assert_eq!(task_count(&env.store), 0);
    // The policy saying no is the same timeout.
    let probe = handoff_probe(Script::block());
    let refusing = env_with(registration(&probe));
    let config = handoff(5).with_auto_background(|_| false);
    let err = managed(&refusing, config)
        .call("{}", &CallOptions::default())
        .await
        .unwrap_err();
    assert!(matches!(err, ManagedError::ForegroundTimeout { .. }));
    assert_eq!(probe.calls().adopts, 0);
}

// A run that ends as its foreground timer fires has ended: the call answers its result, never
// a timeout. (In paused time the run's end and the timer fall on the same instant; which of
// the two the observer took was a coin toss, the run stopped after it had completed.)
#[tokio::test(start_paused = true)]
async fn a_run_ending_as_its_foreground_timer_fires_answers_its_result() {
    // The probe's run completes after twice its update delay: 100 ms.
    let mut script = Script::complete(b"{}");
    script.update_delay = Some(Duration::from_millis(50));
    let probe = Probe::new(script);
    let env = env(&probe);
    let config = ManagedToolConfig::default().with_foreground_timeout(Duration::from_millis(100));
    let tool = managed(&env, config);
    for _ in 0..32 {
        let result = done(tool.call("{}", &CallOptions::default()).await.unwrap());
        assert_eq!(result.envelope.kind(), EnvelopeType::ForegroundResult);
        assert!(
            result.text().contains(r#""status":"completed""#),
            "{}",
            result.text()
        );
    }
    assert_eq!(probe.calls().stops, 0);
    assert_eq!(task_count(&env.store), 0);
}

// 72: a stream consumer that goes away stops the foreground run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s72_dropping_a_foreground_stream_stops_the_run() {
    let probe = Probe::new(Script::block().with_updates(vec![update("1", b"a")]));
    let env = env(&probe);
    let mut stream =
        managed(&env, ManagedToolConfig::default()).call_stream("{}", &CallOptions::default());
    let first = stream.next().await.unwrap().unwrap();
    assert_eq!(first.envelope.kind(), EnvelopeType::Update);
    drop(stream);
    while probe.calls().stops == 0 {
        tokio::task::yield_now().await;
    }
    assert_eq!(task_count(&env.store), 0);
}

// 73 + 82 + 83 + 86 + 87: the direct submit API.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s73_s82_s87_direct_submit() {
    let mut probe = Probe::new(Script::complete(b"{}"));
    probe.prepare = Some(Arc::new(|_| panic!("submit never prepares")));
    let recorder = Arc::new(Recorder::default());
    let env = env_with(registration(&probe).with_materializer(recorder));
    let task = env
        .tools
        .submit(
            &env.manager,
            ToolCall {
                tool_name: NAME.into(),
                arguments: "{\"a\":1}".into(),
                tool_call_id: Some("call-7".into()),
                session_id: "s1".into(),
                description: Some("explicit".into()),
                notify_session: true,
            },
        )
        .await
        .unwrap();
    assert_eq!(task.spec.executor_key, RECOVERABLE_EXECUTOR_KEY);
    assert_eq!(task.spec.description, "explicit");
    assert!(task.spec.notify_session);
    assert_eq!(task.spec.output_file, format!("/outputs/{}", task.spec.id));
    let payload = ToolPayload::decode(&task.spec.payload).unwrap();
    assert_eq!(payload.tool_call_id.as_deref(), Some("call-7"));
    assert_eq!(payload.arguments, "{\"a\":1}");
    let default = env
        .tools
        .submit(
            &env.manager,
            ToolCall {
                tool_name: NAME.into(),
                arguments: "{}".into(),
                ..ToolCall::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(default.spec.description, "probe: {}");
    assert!(!default.spec.notify_session);
    // 83: invalid arguments: nothing allocated or created.
    let before = task_count(&env.store);
    let err = env
        .tools
        .submit(
            &env.manager,
            ToolCall {
                tool_name: NAME.into(),
                arguments: "{".into(),
                ..ToolCall::default()
            },
        )
        .await
        .unwrap_err();
    assert!(matches!(err, ManagedError::InvalidArguments(_)));
    assert_eq!(task_count(&env.store), before);
}

// 74: completed bytes are stored byte for byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s74_binary_result_is_stored_exactly() {
    let bytes = vec![0x00, 0xff, 0x80, b'{', b'}', b'\n'];
    let probe = Probe::new(Script::complete(&bytes));
    let env = env(&probe);
    let result = launch(&env).await;
    let id = launched_id(&result);
    assert_eq!(
        terminal(&env.manager, &id).await,
        TaskOutcome::Completed(bytes)
    );
}

// The explicit-background stream with a worker of the same process racing the dispatch: the
// projection and the start window live in the process, so either attempt feeds them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn background_call_launch_result_reports_the_started_task() {
    let probe = Probe::new(Script::block());
    let env = env(&probe);
    let result = launch(&env).await;
    let id = launched_id(&result);
    // The window closed at the start boundary: the task runs and its start is durable.
    assert_eq!(result.envelope.status(), Some(Status::Running));
    assert!(env.store.get(&id).await.unwrap().is_started());
    env.manager.request_cancel(&id, "done here").await.unwrap();
    assert_eq!(
        terminal(&env.manager, &id).await,
        TaskOutcome::Canceled("done here".into())
    );
}

// 36: a claim whose lease was lost before the started marker, canceled while pending: the
// next attempt starts (no marker, so no recover), stops the run and ends canceled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s36_lost_lease_before_commit_start_then_cancel_starts_and_stops() {
    let probe = Probe::new(Script::block());
    let dir = tempfile::tempdir().unwrap();
    let (store, clock) = manual_store(dir.path());
    let mut registry = ToolRegistry::new();
    registry.register(registration(&probe)).unwrap();
    let tools = ManagedTools::new(registry);
    let manager = manager_for(&store, &tools);
    let task = tools
        .submit(
            &manager,
            ToolCall {
                tool_name: NAME.into(),
                arguments: "{}".into(),
                ..ToolCall::default()
            },
        )
        .await
        .unwrap();
    let id = task.spec.id.clone();
    // A worker claims it (attempt 1) and dies before committing the started marker.
    let claimed = store
        .execute(&id, task.version, dtask_engine::Command::Start)
        .await
        .unwrap();
    assert_eq!(claimed.attempt, 1);
    clock.advance(Duration::from_secs(3600));
    let pending = store.get(&id).await.unwrap();
    assert_eq!(pending.status, Status::Pending);
    manager.request_cancel(&id, "not needed").await.unwrap();
    let done = manager.execute(&id).await.unwrap();
    assert_eq!(done.status, Status::Canceled);
    assert_eq!(done.attempt, 2);
    assert_eq!(done.result_error, "not needed");
    let calls = probe.calls();
    assert_eq!(calls.starts.len(), 1);
    assert_eq!(calls.starts[0].attempt, 2);
    assert!(calls.recovers.is_empty());
    assert_eq!(calls.stops, 1);
}

// A cancel that races an update: the cancel is written straight to the store (no Stop control
// reaches the attempt first), so the next update the run emits is refused ("cancellation was
// requested"). The attempt stops the run and ends canceled; the refused update used to fail
// the attempt without a stop — the task ended canceled, its operation ran on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_that_races_an_update_stops_the_run() {
    let mut probe = Probe::new(Script::block().with_updates(vec![update("e1", b"one")]));
    let updates = Arc::new(tokio::sync::Semaphore::new(0));
    probe.update_gate = Some(Arc::clone(&updates));
    let dir = tempfile::tempdir().unwrap();
    let (store, _clock) = manual_store(dir.path());
    let mut registry = ToolRegistry::new();
    registry.register(registration(&probe)).unwrap();
    let tools = ManagedTools::new(registry);
    let mut runtime = ExecutorRegistry::new();
    tools.register_executors(&mut runtime).unwrap();
    // No heartbeat within the test: only the refused update tells the attempt of the cancel.
    let config = ManagerConfig::default().with_heartbeat_interval(Duration::from_secs(3600));
    let manager = Manager::new(store.clone(), runtime, config);
    let call = ToolCall {
        tool_name: NAME.into(),
        arguments: "{}".into(),
        ..ToolCall::default()
    };
    let id = tools.submit(&manager, call).await.unwrap().spec.id.clone();
    let run = {
        let (manager, id) = (manager.clone(), id.clone());
        tokio::spawn(async move { manager.execute(&id).await })
    };
    // Running, with its started marker durable.
    let mut version = 0;
    let running = loop {
        let task = store.wait_for_task_version(&id, version).await.unwrap();
        if task.status == Status::Running && task.is_started() {
            break task;
        }
        version = task.version;
    };
    store
        .execute(
            &id,
            running.version,
            dtask_engine::Command::RequestCancel {
                reason: "operator".into(),
            },
        )
        .await
        .unwrap();
    updates.add_permits(1);
    let done = run.await.unwrap().unwrap();
    assert_eq!(done.status, Status::Canceled);
    assert_eq!(done.result_error, "operator");
    assert_eq!(probe.calls().stops, 1, "the canceled task's run is stopped");
}

// The tool component layer dispatches a model's tool calls to managed tools by name: the tool
// message carries the envelope record. A call without arguments (what a streamed call of a
// tool without parameters sends) is the empty object, as for every tool a model calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tools_node_dispatches_model_calls_to_managed_tools() {
    use dtask_engine::tool::{ToolCall as ModelCall, ToolsNode};
    let probe = Probe::new(Script::complete(br#"{"answer":42}"#));
    let env = env(&probe);
    let node = ToolsNode::builder()
        .tool(managed(&env, ManagedToolConfig::default()))
        .build()
        .unwrap();
    let messages = node
        .invoke_calls(&[ModelCall::function("call_1", NAME, "")])
        .await
        .unwrap();
    assert_eq!(probe.calls().starts[0].arguments, "{}");
    assert_eq!(messages[0].tool_call_id, "call_1");
    let record: serde_json::Value = serde_json::from_str(messages[0].content.trim_end()).unwrap();
    assert_eq!(record["type"], "foreground_result");
    assert_eq!(record["output"]["answer"], 42);
    // The same tool as a streaming tool: the chunks are the records.
    let streaming = ToolsNode::builder()
        .streaming_tool(managed(&env, background()))
        .build()
        .unwrap();
    let messages = streaming
        .invoke_calls(&[ModelCall::function("call_2", NAME, " ")])
        .await
        .unwrap();
    let record: serde_json::Value = serde_json::from_str(messages[0].content.trim_end()).unwrap();
    assert_eq!(record["type"], "launch_result");
    let id = record["task_id"].as_str().unwrap();
    assert_eq!(
        terminal(&env.manager, id).await,
        TaskOutcome::Completed(br#"{"answer":42}"#.to_vec())
    );
}

// A failing foreground start is a model-visible failure, the same record for a call and a
// stream: failed, with the task description and the start's error; nothing is persisted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_foreground_start_is_the_same_failed_record_for_call_and_stream() {
    let mut probe = Probe::new(Script::complete(b"{}"));
    probe.start_error = Some("backend down".into());
    let env = env(&probe);
    let tool = managed(&env, ManagedToolConfig::default());
    let called = done(tool.call("{}", &CallOptions::default()).await.unwrap());
    let mut streamed = collect(tool.call_stream("{}", &CallOptions::default())).await;
    assert_eq!(streamed.len(), 1, "one final record, no error");
    let streamed = streamed.remove(0).unwrap();
    assert_eq!(called, streamed);
    assert_eq!(
        called.text(),
        "{\"type\":\"foreground_result\",\"status\":\"failed\",\"description\":\"probe: {}\",\"error\":\"backend down\"}\n"
    );
    // Through the component traits too: the record, not an error.
    let invoked = dtask_engine::tool::Tool::invoke(&tool, "{}").await.unwrap();
    assert_eq!(invoked, called.text());
    let chunks: Vec<_> = dtask_engine::tool::StreamingTool::invoke_stream(&tool, "{}")
        .await
        .unwrap()
        .collect()
        .await;
    assert_eq!(chunks.len(), 1);
    assert_eq!(chunks[0].as_ref().unwrap(), &called.text());
    assert_eq!(probe.calls().starts.len(), 4);
    assert_eq!(task_count(&env.store), 0);
}

// A failing foreground resume answers like a failing start: a failed record with the
// description.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_foreground_resume_is_a_failed_record_with_the_description() {
    let mut probe = approval_probe();
    probe.resume = Some(Arc::new(
        |_: &dtask_engine::managed::ResumeRequest| -> Result<Script, ToolRunError> {
            Err(ToolRunError::failed("resume broke"))
        },
    ));
    let env = env(&probe);
    let tool = managed(&env, ManagedToolConfig::default());
    let CallOutcome::Interrupted(interrupt) =
        tool.call("{}", &CallOptions::default()).await.unwrap()
    else {
        panic!("expected an interrupt")
    };
    let result = done(
        tool.resume(&interrupt.state, b"\"yes\"", &CallOptions::default())
            .await
            .unwrap(),
    );
    assert_eq!(
        result.text(),
        "{\"type\":\"foreground_result\",\"status\":\"failed\",\"description\":\"probe: {}\",\"error\":\"resume broke\"}\n"
    );
    assert_eq!(task_count(&env.store), 0);
}

/// One update over each bound, with the typed error that refuses it and its text.
fn oversized_updates() -> Vec<(Update, UpdateError, &'static str)> {
    vec![
        (
            Update {
                kind: "k".repeat(MAX_UPDATE_KIND_BYTES + 1),
                ..update("e1", b"x")
            },
            UpdateError::KindTooLong {
                len: MAX_UPDATE_KIND_BYTES + 1,
                max: MAX_UPDATE_KIND_BYTES,
            },
            "update kind exceeds configured bounds",
        ),
        (
            update(&"e".repeat(MAX_UPDATE_EVENT_ID_BYTES + 1), b"x"),
            UpdateError::EventIdTooLong {
                len: MAX_UPDATE_EVENT_ID_BYTES + 1,
                max: MAX_UPDATE_EVENT_ID_BYTES,
            },
            "update event id exceeds configured bounds",
        ),
        (
            update("e1", &vec![b'x'; MAX_UPDATE_DATA_BYTES + 1]),
            UpdateError::DataTooLarge {
                len: MAX_UPDATE_DATA_BYTES + 1,
                max: MAX_UPDATE_DATA_BYTES,
            },
            "update data exceeds configured bounds",
        ),
    ]
}

/// An update exactly at every bound.
fn update_at_the_bounds() -> Update {
    Update {
        kind: "k".repeat(MAX_UPDATE_KIND_BYTES),
        ..update(
            &"e".repeat(MAX_UPDATE_EVENT_ID_BYTES),
            &vec![b'x'; MAX_UPDATE_DATA_BYTES],
        )
    }
}

// Update bounds in the background: an update over a bound (kind, event id, data) fails the
// task with the bound's error and nothing of it is stored; one at every bound is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_update_over_a_bound_fails_the_background_task() {
    for (oversized, error, text) in oversized_updates() {
        assert_eq!(oversized.validate(), Err(error));
        let probe = Probe::new(Script::complete(b"{}").with_updates(vec![oversized]));
        let env = env(&probe);
        let id = launched_id(&launch(&env).await);
        let e = failure(&env.manager, &id).await;
        assert!(e.starts_with(text), "{text}: {e}");
        assert!(stored_updates(&env.store, &id).await.is_empty(), "{text}");
    }
    let at = update_at_the_bounds();
    let probe = Probe::new(Script::complete(b"{}").with_updates(vec![at.clone()]));
    let env = env(&probe);
    let id = launched_id(&launch(&env).await);
    assert_eq!(
        terminal(&env.manager, &id).await,
        TaskOutcome::Completed(b"{}".to_vec())
    );
    assert_eq!(
        stored_updates(&env.store, &id).await,
        [(at.event_id, at.data)]
    );
}

// Update bounds in the foreground: the run is stopped; a call answers with a failed record
// carrying the bound's error, a stream ends with the typed `InvalidUpdate` (the refused update
// is never shown). An update at every bound is shown and the call completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_update_over_a_bound_is_refused_in_the_foreground_call_and_stream() {
    for (oversized, error, text) in oversized_updates() {
        // The run would never end on its own: only the refusal ends the call.
        let probe = Probe::new(Script::block().with_updates(vec![oversized]));
        let env = env(&probe);
        let tool = managed(&env, ManagedToolConfig::default());
        let called = done(tool.call("{}", &CallOptions::default()).await.unwrap());
        assert_eq!(called.envelope.kind(), EnvelopeType::ForegroundResult);
        assert_eq!(called.envelope.status(), Some(Status::Failed));
        let shown = called.envelope.error().unwrap().to_owned();
        assert_eq!(shown, error.to_string());
        assert!(shown.starts_with(text), "{text}: {shown}");
        assert_eq!(probe.calls().stops, 1, "{text}");
        let items = collect(tool.call_stream("{}", &CallOptions::default())).await;
        assert_eq!(items.len(), 1, "{text}: the refused update is not shown");
        match &items[0] {
            Err(ManagedError::InvalidUpdate(e)) => assert_eq!(e, &error),
            other => panic!("{text}: {other:?}"),
        }
        assert_eq!(probe.calls().stops, 2, "{text}");
        assert_eq!(task_count(&env.store), 0);
    }
    let at = update_at_the_bounds();
    let probe = Probe::new(Script::complete(b"{}").with_updates(vec![at.clone()]));
    let env = env(&probe);
    let items = collect(
        managed(&env, ManagedToolConfig::default()).call_stream("{}", &CallOptions::default()),
    )
    .await;
    let records: Vec<_> = items.into_iter().map(Result::unwrap).collect();
    assert_eq!(records.len(), 2);
    let shown = records[0].envelope.as_update().cloned().unwrap();
    assert_eq!(shown.event_id, at.event_id);
    assert_eq!(shown.kind, at.kind);
    assert_eq!(records[1].envelope.status(), Some(Status::Completed));
}

/// The progress text of a background task whose updates carry `data`, read with `limit`.
async fn progress_of(data: Vec<Vec<u8>>, limit: i64) -> String {
    let updates = data
        .iter()
        .enumerate()
        .map(|(i, d)| update(&format!("u{i}"), d))
        .collect();
    let probe = Probe::new(Script::complete(b"{}").with_updates(updates));
    let env = env(&probe);
    let id = launched_id(&launch(&env).await);
    terminal(&env.manager, &id).await;
    assert_eq!(stored_updates(&env.store, &id).await.len(), data.len());
    ProgressReader::new(env.store.clone(), limit)
        .read(&id)
        .await
        .unwrap()
}

const PROGRESS_HEADER: &str = "Recent progress:";
const LINE_PREFIX: &str = "\n[stdout] ";

// The progress reader's per-update bound: content over 4 KiB is cut to 4096 bytes on a
// character boundary and marked; content of exactly 4 KiB is shown whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_cuts_each_update_at_four_kib_on_a_character_boundary() {
    let text = progress_of(
        vec![
            vec![b'a'; MAX_PROGRESS_EVENT_BYTES + 1],
            vec![b'b'; MAX_PROGRESS_EVENT_BYTES],
            // 4095 bytes, then a 3-byte character across the bound.
            format!("{}€tail", "c".repeat(MAX_PROGRESS_EVENT_BYTES - 1)).into_bytes(),
        ],
        0,
    )
    .await;
    let expected = format!(
        "{PROGRESS_HEADER}{LINE_PREFIX}{}...[truncated]{LINE_PREFIX}{}{LINE_PREFIX}{}...[truncated]",
        "a".repeat(MAX_PROGRESS_EVENT_BYTES),
        "b".repeat(MAX_PROGRESS_EVENT_BYTES),
        "c".repeat(MAX_PROGRESS_EVENT_BYTES - 1),
    );
    assert_eq!(text, expected);
    assert!(!text.contains('\u{fffd}'));
}

// The progress reader's total bound: lines are added oldest first while the text stays within
// 16 KiB (exactly 16 KiB fits); the first line that does not fit becomes the truncation marker
// and ends the text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_stops_at_sixteen_kib_with_a_marker() {
    // Four lines of exactly a quarter of what follows the header: 16 KiB in all.
    let quarter = (MAX_PROGRESS_BYTES - PROGRESS_HEADER.len()) / 4 - LINE_PREFIX.len();
    let exact = progress_of((0..4u8).map(|i| vec![b'a' + i; quarter]).collect(), 0).await;
    assert_eq!(exact.len(), MAX_PROGRESS_BYTES);
    assert!(!exact.contains("truncated"));
    // One more byte-long update does not fit.
    let mut data: Vec<Vec<u8>> = (0..4u8).map(|i| vec![b'a' + i; quarter]).collect();
    data.push(b"e".to_vec());
    data.push(b"f".to_vec());
    let over = progress_of(data, 0).await;
    assert_eq!(over, format!("{exact}\n[recent progress truncated]"));
    assert!(!over.contains("[stdout] e"));
}

// The progress reader reads the newest `limit` updates, oldest first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_reads_the_newest_limit_updates() {
    let text = progress_of(vec![b"one".to_vec(), b"two".to_vec(), b"three".to_vec()], 2).await;
    assert_eq!(text, "Recent progress:\n[stdout] two\n[stdout] three");
}

// A zero foreground timeout disables the timer: a call that outlives any timer is neither
// timed out nor handed off (though the policy would hand it off) and finishes in the
// foreground when its run ends; per call and configured alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zero_foreground_timeout_disables_the_timer() {
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let mut probe = handoff_probe(Script::complete(br#"{"ok":true}"#));
    probe.gate = Some(Arc::clone(&gate));
    let env = env(&probe);
    let configured = managed(&env, handoff(0));
    let per_call = managed(&env, handoff(60_000));
    let zero = CallOptions {
        foreground_timeout: Some(Duration::ZERO),
        ..CallOptions::default()
    };
    for (n, (tool, options)) in [(configured, CallOptions::default()), (per_call, zero)]
        .into_iter()
        .enumerate()
    {
        let call = tokio::spawn(async move { tool.call("{}", &options).await });
        // The run is being waited on, and stays open until the gate opens: a timer of zero
        // would have fired by now (it is ready at its first poll, taken with the wait's).
        while probe.calls().waits <= n {
            assert!(!call.is_finished(), "the call ended before its run did");
            tokio::task::yield_now().await;
        }
        gate.add_permits(1);
        let result = done(call.await.unwrap().unwrap());
        assert_eq!(result.envelope.kind(), EnvelopeType::ForegroundResult);
        assert_eq!(result.envelope.status(), Some(Status::Completed));
    }
    let calls = probe.calls();
    assert_eq!(calls.adopts, 0);
    assert_eq!(calls.stops, 0);
    assert_eq!(task_count(&env.store), 0);
}

/// The notifications queued for `session`, by kind, in order.
async fn session_notifications(store: &TaskStore, session: &str) -> Vec<(String, String)> {
    store
        .receive_notifications(100, Duration::from_secs(60))
        .await
        .unwrap()
        .into_iter()
        .filter(|n| n.session_id == session)
        .map(|n| (n.task_id, n.kind))
        .collect()
}

// The per-call session id reaches the task: an explicit-background call and a handed-off call
// carry it in their spec (with session notifications on), and the task's lifecycle
// notifications are routed to it; a call without a session routes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_calls_session_id_reaches_the_task_and_its_notifications() {
    let probe = handoff_probe(Script::complete(b"{}"));
    let env = env(&probe);
    let options = CallOptions {
        tool_call_id: Some("call-9".into()),
        session_id: "session-1".into(),
        foreground_timeout: None,
    };
    // Explicit background.
    let launched = done(
        managed(&env, background())
            .call("{}", &options)
            .await
            .unwrap(),
    );
    let id = launched_id(&launched);
    assert_eq!(
        terminal(&env.manager, &id).await,
        TaskOutcome::Completed(b"{}".to_vec())
    );
    let task = env.store.get(&id).await.unwrap();
    assert_eq!(task.spec.session_id, "session-1");
    assert!(task.spec.notify_session);
    let payload = ToolPayload::decode(&task.spec.payload).unwrap();
    assert_eq!(payload.tool_call_id.as_deref(), Some("call-9"));
    assert_eq!(
        session_notifications(&env.store, "session-1").await,
        [
            (id.clone(), "task_created".to_owned()),
            (id.clone(), "completed".to_owned())
        ]
    );
    // Hand-off: the spec built for the foreground attempt carries the session too.
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let mut held = handoff_probe(Script::complete(b"{}"));
    held.gate = Some(Arc::clone(&gate));
    let handed_env = env_with(registration(&held));
    let handed = done(
        managed(&handed_env, handoff(1))
            .call("{}", &options)
            .await
            .unwrap(),
    );
    let id = launched_id(&handed);
    gate.add_permits(2);
    assert_eq!(
        terminal(&handed_env.manager, &id).await,
        TaskOutcome::Completed(b"{}".to_vec())
    );
    let task = handed_env.store.get(&id).await.unwrap();
    assert_eq!(task.spec.session_id, "session-1");
    assert!(task.spec.notify_session);
    assert_eq!(
        session_notifications(&handed_env.store, "session-1").await,
        [
            (id.clone(), "task_created".to_owned()),
            (id.clone(), "completed".to_owned())
        ]
    );
    // Without a session: no routing, nothing queued.
    let plain = env_with(registration(&Probe::new(Script::complete(b"{}"))));
    let id = launched_id(&launch(&plain).await);
    terminal(&plain.manager, &id).await;
    let task = plain.store.get(&id).await.unwrap();
    assert!(task.spec.session_id.is_empty());
    assert!(!task.spec.notify_session);
    assert!(plain
        .store
        .receive_notifications(100, Duration::from_secs(60))
        .await
        .unwrap()
        .is_empty());
}

/// What the held tool's runs share: how many run now, the most that ever ran at once, how
/// many started, and the permits that let a run end.
struct Held {
    running: std::sync::atomic::AtomicUsize,
    high_water: std::sync::atomic::AtomicUsize,
    started: tokio::sync::watch::Sender<usize>,
    release: tokio::sync::Semaphore,
}

/// A plain tool whose runs stay open until the test releases them.
#[derive(Clone)]
struct HeldTool(Arc<Held>);

struct HeldRun(Arc<Held>);

#[dtask_engine::async_trait]
impl dtask_engine::managed::Run for HeldRun {
    async fn wait(&self) -> Result<RunOutcome, ToolRunError> {
        self.0.release.acquire().await.unwrap().forget();
        self.0
            .running
            .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        Ok(RunOutcome::Completed(b"{}".to_vec()))
    }

    async fn stop(&self) -> Result<(), ToolRunError> {
        Ok(())
    }
}

#[dtask_engine::async_trait]
impl dtask_engine::managed::BackgroundTool for HeldTool {
    fn validate_arguments(&self, _arguments: &str) -> Result<(), ToolFailure> {
        Ok(())
    }

    async fn start(
        &self,
        _request: dtask_engine::managed::StartRequest,
    ) -> Result<dtask_engine::managed::StartResult, ToolRunError> {
        use std::sync::atomic::Ordering::SeqCst;
        let now = self.0.running.fetch_add(1, SeqCst) + 1;
        self.0.high_water.fetch_max(now, SeqCst);
        self.0.started.send_modify(|n| *n += 1);
        Ok(dtask_engine::managed::StartResult {
            run: Arc::new(HeldRun(Arc::clone(&self.0))),
            checkpoint: Vec::new(),
        })
    }
}

// A worker's `max_concurrent` bounds the managed attempts it runs: with more tasks than the
// bound and every run held open, exactly the bound run (and are claimed) at once; each
// release lets one more start; the most ever running together is the bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workers_max_concurrent_bounds_concurrent_managed_attempts() {
    use std::sync::atomic::Ordering::SeqCst;
    const BOUND: usize = 2;
    const TASKS: usize = 6;
    let held = Arc::new(Held {
        running: 0.into(),
        high_water: 0.into(),
        started: tokio::sync::watch::Sender::new(0),
        release: tokio::sync::Semaphore::new(0),
    });
    let dir = tempfile::tempdir().unwrap();
    // A manual clock: no lease can expire while the runs are held.
    let (store, tools, manager, _clock) = manual_env(
        dir.path(),
        Registration::new(
            ToolInfo::without_parameters("held", "runs until released"),
            HeldTool(Arc::clone(&held)),
        ),
    );
    let mut ids = Vec::new();
    for _ in 0..TASKS {
        let call = ToolCall {
            tool_name: "held".into(),
            arguments: "{}".into(),
            ..ToolCall::default()
        };
        ids.push(tools.submit(&manager, call).await.unwrap().spec.id.clone());
    }
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    let worker = dtask_engine::Worker::new(
        manager.clone(),
        dtask_engine::WorkerConfig::new([PLAIN_EXECUTOR_KEY]).with_max_concurrent(BOUND),
    )
    .unwrap();
    let worker = tokio::spawn(worker.run(async move {
        let _ = stop_rx.wait_for(|s| *s).await;
    }));
    let mut started = held.started.subscribe();
    started.wait_for(|n| *n >= BOUND).await.unwrap();
    // While the bound's runs are held, only they are claimed.
    let mut running = 0;
    for id in &ids {
        if store.get(id).await.unwrap().status == Status::Running {
            running += 1;
        }
    }
    assert_eq!(running, BOUND);
    for k in 1..=TASKS - BOUND {
        held.release.add_permits(1);
        started.wait_for(|n| *n >= BOUND + k).await.unwrap();
    }
    held.release.add_permits(BOUND);
    for id in &ids {
        assert_eq!(
            manager.wait(id).await.unwrap(),
            TaskOutcome::Completed(b"{}".to_vec())
        );
    }
    stop_tx.send(true).unwrap();
    worker.await.unwrap().unwrap();
    assert_eq!(*started.borrow(), TASKS);
    assert_eq!(held.high_water.load(SeqCst), BOUND);
    assert_eq!(held.running.load(SeqCst), 0);
}

// A pending call of a tool this process does not register (a restart with another registry,
// or a node of a cluster that lacks the tool) is left pending for a process that runs it —
// refused before its claim, nothing written (the reference's Execute) — and the worker goes on
// to the other tasks. The refusal used to end the worker: at every restart, the task left
// pending and nothing else claimed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_of_a_tool_not_registered_here_is_left_pending_and_the_worker_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let tool = |name: &str, result: &[u8]| {
        Registration::new(
            ToolInfo::without_parameters(name, "a scripted tool"),
            Probe::new(Script::complete(result)),
        )
    };
    let call = |name: &str| ToolCall {
        tool_name: name.into(),
        arguments: "{}".into(),
        ..ToolCall::default()
    };
    let old = {
        let (_store, tools, manager, _clock) = manual_env(dir.path(), tool("old", b"{}"));
        tools
            .submit(&manager, call("old"))
            .await
            .unwrap()
            .spec
            .id
            .clone()
    };
    // Restarted with only the new tool.
    let (store, tools, manager, _clock) = manual_env(dir.path(), tool("new", br#""new""#));
    let new = tools
        .submit(&manager, call("new"))
        .await
        .unwrap()
        .spec
        .id
        .clone();
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    let worker = dtask_engine::Worker::new(
        manager.clone(),
        dtask_engine::WorkerConfig::new([RECOVERABLE_EXECUTOR_KEY]),
    )
    .unwrap();
    let mut worker = tokio::spawn(worker.run(async move {
        let _ = stop_rx.wait_for(|s| *s).await;
    }));
    let new = tokio::select! {
        ended = &mut worker => panic!("the worker ended: {ended:?}"),
        outcome = manager.wait(&new) => outcome.unwrap(),
    };
    assert_eq!(new, TaskOutcome::Completed(br#""new""#.to_vec()));
    stop_tx.send(true).unwrap();
    worker.await.unwrap().unwrap();
    let old = store.get(&old).await.unwrap();
    assert_eq!(
        (old.status, old.attempt),
        (Status::Pending, 0),
        "nothing written"
    );
    assert!(matches!(
        manager.execute(&old.spec.id).await,
        Err(dtask_engine::RuntimeError::InvalidSpec(_))
    ));
}

/// A recoverable tool whose run takes input while it runs: every input is recorded, and the
/// input "done" ends the run with all of them.
#[derive(Clone, Default)]
struct ListenTool(Arc<Listened>);

#[derive(Default)]
struct Listened {
    received: std::sync::Mutex<Vec<(u64, String)>>,
    done: tokio::sync::Notify,
}

struct ListenRun(Arc<Listened>);

#[dtask_engine::async_trait]
impl dtask_engine::managed::Run for ListenRun {
    async fn wait(&self) -> Result<RunOutcome, ToolRunError> {
        self.0.done.notified().await;
        let received = self.0.received.lock().unwrap();
        let texts: Vec<&str> = received.iter().map(|(_, t)| t.as_str()).collect();
        Ok(RunOutcome::Completed(texts.join(",").into_bytes()))
    }

    async fn stop(&self) -> Result<(), ToolRunError> {
        Ok(())
    }

    async fn deliver_input(
        &self,
        input: &dtask_engine::managed::RunInput,
    ) -> Result<bool, ToolRunError> {
        let text = String::from_utf8_lossy(&input.data).into_owned();
        let mut received = self.0.received.lock().unwrap();
        if received.iter().all(|(s, _)| *s != input.sequence) {
            received.push((input.sequence, text.clone()));
        }
        if text == "done" {
            self.0.done.notify_one();
        }
        Ok(true)
    }
}

#[dtask_engine::async_trait]
impl dtask_engine::managed::BackgroundTool for ListenTool {
    fn validate_arguments(&self, _arguments: &str) -> Result<(), ToolFailure> {
        Ok(())
    }

    async fn start(
        &self,
        _request: dtask_engine::managed::StartRequest,
    ) -> Result<dtask_engine::managed::StartResult, ToolRunError> {
        Ok(dtask_engine::managed::StartResult {
            run: Arc::new(ListenRun(Arc::clone(&self.0))),
            checkpoint: b"listening".to_vec(),
        })
    }

    fn as_recoverable(&self) -> Option<&dyn dtask_engine::managed::RecoverableTool> {
        Some(self)
    }
}

#[dtask_engine::async_trait]
impl dtask_engine::managed::RecoverableTool for ListenTool {
    async fn recover(
        &self,
        _request: dtask_engine::managed::RecoverRequest,
    ) -> Result<Arc<dyn dtask_engine::managed::Run>, ToolRunError> {
        Ok(Arc::new(ListenRun(Arc::clone(&self.0))))
    }
}

/// Input sent to a running background tool reaches its run while it runs (not only when it
/// waits for input); each input taken is recorded as read, and the launch result shows the
/// inputs received and read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_background_tool_receives_inputs() {
    let listen = ListenTool::default();
    let dir = tempfile::tempdir().unwrap();
    let (store, tools, manager, _clock) = manual_env(
        dir.path(),
        Registration::new(
            ToolInfo::without_parameters("listen", "takes messages while it runs"),
            listen.clone(),
        ),
    );
    let call = ToolCall {
        tool_name: "listen".into(),
        arguments: "{}".into(),
        ..ToolCall::default()
    };
    let id = tools.submit(&manager, call).await.unwrap().spec.id.clone();
    let run = {
        let (manager, id) = (manager.clone(), id.clone());
        tokio::spawn(async move { manager.execute(&id).await })
    };
    // Running, with its started marker durable.
    let mut version = 0;
    loop {
        let task = store.wait_for_task_version(&id, version).await.unwrap();
        if task.status == Status::Running && task.is_started() {
            break;
        }
        version = task.version;
    }
    for text in ["hello", "done"] {
        store
            .send_input(
                &id,
                dtask_engine::InputRequest {
                    event_id: format!("msg-{text}"),
                    kind: "message".into(),
                    data: text.as_bytes().to_vec(),
                    ..dtask_engine::InputRequest::default()
                },
            )
            .await
            .unwrap();
    }
    let task = run.await.unwrap().unwrap();
    assert_eq!(task.status, Status::Completed);
    assert_eq!(task.result_data, b"hello,done");
    assert_eq!((task.mailbox.latest, task.mailbox.consumed), (2, 2));
    let record = dtask_engine::managed::ResponseEvent::launch_result(&task)
        .unwrap()
        .encode();
    assert!(
        record.contains(r#""inputs":{"received":2,"read":2}"#),
        "{record}"
    );
}

/// A recoverable tool polling a remote job: started, the job is not done, so the run asks to
/// be looked at again in a minute (the job's id its checkpoint); recovered, it finds the job
/// done. Counts its starts and recoveries.
#[derive(Clone, Default)]
struct PollingTool {
    starts: Arc<std::sync::atomic::AtomicUsize>,
    recovered_from: Arc<std::sync::Mutex<Vec<Vec<u8>>>>,
    stops: Arc<std::sync::atomic::AtomicUsize>,
}

/// A run that ends as its outcome says, counting its stops.
struct PollRun(RunOutcome, Arc<std::sync::atomic::AtomicUsize>);

#[dtask_engine::async_trait]
impl dtask_engine::managed::Run for PollRun {
    async fn wait(&self) -> Result<RunOutcome, ToolRunError> {
        Ok(self.0.clone())
    }

    async fn stop(&self) -> Result<(), ToolRunError> {
        self.1.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }
}

const POLL_AFTER: Duration = Duration::from_secs(60);

#[dtask_engine::async_trait]
impl dtask_engine::managed::BackgroundTool for PollingTool {
    fn validate_arguments(&self, _arguments: &str) -> Result<(), ToolFailure> {
        Ok(())
    }

    async fn start(
        &self,
        _request: dtask_engine::managed::StartRequest,
    ) -> Result<dtask_engine::managed::StartResult, ToolRunError> {
        self.starts
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(dtask_engine::managed::StartResult {
            run: Arc::new(PollRun(
                RunOutcome::CheckBackIn {
                    checkpoint: b"job-7".to_vec(),
                    after: POLL_AFTER,
                },
                Arc::clone(&self.stops),
            )),
            checkpoint: b"submitted".to_vec(),
        })
    }

    fn as_recoverable(&self) -> Option<&dyn dtask_engine::managed::RecoverableTool> {
        Some(self)
    }
}

#[dtask_engine::async_trait]
impl dtask_engine::managed::RecoverableTool for PollingTool {
    async fn recover(
        &self,
        request: dtask_engine::managed::RecoverRequest,
    ) -> Result<Arc<dyn dtask_engine::managed::Run>, ToolRunError> {
        self.recovered_from
            .lock()
            .unwrap()
            .push(request.checkpoint.clone());
        let job = String::from_utf8_lossy(&request.checkpoint).into_owned();
        Ok(Arc::new(PollRun(
            RunOutcome::Completed(format!("{job} done").into_bytes()),
            Arc::clone(&self.stops),
        )))
    }
}

/// A polling tool's store, tools, manager and clock.
fn polling_env(
    dir: &std::path::Path,
    tool: &PollingTool,
) -> (TaskStore, ManagedTools, Manager, dtask_engine::ManualClock) {
    manual_env(
        dir,
        Registration::new(
            ToolInfo::without_parameters("poll", "wait for a remote job"),
            tool.clone(),
        ),
    )
}

// A recoverable tool's run that checks back later: the background task waits on a durable
// timer with the started marker carrying the tool's new checkpoint; no attempt runs before
// its time; then the next attempt recovers the tool from that checkpoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_that_checks_back_later_is_recovered_from_its_checkpoint_when_due() {
    let dir = tempfile::tempdir().unwrap();
    let tool = PollingTool::default();
    let (_store, _tools, manager, clock) = polling_env(dir.path(), &tool);
    let id = manager.allocate_task_id("background_tool").unwrap();
    manager
        .submit(SubmitRequest {
            spec: TaskSpec {
                id: id.clone(),
                executor_key: RECOVERABLE_EXECUTOR_KEY.into(),
                kind: "background_tool".into(),
                payload: ToolPayload::new("poll", None, "{}").encode(),
                ..TaskSpec::default()
            },
            ..SubmitRequest::default()
        })
        .await
        .unwrap();
    let waiting = manager.execute(&id).await.unwrap();
    assert_eq!(waiting.status, Status::Pending);
    assert_eq!(
        waiting.not_before.map(|t| t.0),
        Some(1_000_000 + 60_000),
        "a minute of the store's clock"
    );
    let marker = ManagedCheckpoint::decode(&waiting.checkpoint).unwrap();
    assert!(marker.started);
    assert_eq!(marker.tool_checkpoint, b"job-7");
    assert!(matches!(
        manager.execute(&id).await,
        Err(dtask_engine::RuntimeError::Store(StoreError::NotDue { .. }))
    ));
    clock.advance(POLL_AFTER);
    let done = manager.execute(&id).await.unwrap();
    assert_eq!(done.status, Status::Completed);
    assert_eq!(done.result_data, b"job-7 done");
    assert_eq!(tool.starts.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert_eq!(*tool.recovered_from.lock().unwrap(), [b"job-7".to_vec()]);
}

// In the foreground the same run sends the call to the background at once, delayed: the
// model gets the launch result of a pending task, which the next attempt recovers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreground_run_that_checks_back_later_goes_to_the_background_delayed() {
    let dir = tempfile::tempdir().unwrap();
    let tool = PollingTool::default();
    let (store, tools, manager, clock) = polling_env(dir.path(), &tool);
    let call = ManagedTool::new(
        &tools,
        manager.clone(),
        "poll",
        ManagedToolConfig::default(),
    )
    .unwrap();
    let result = done(call.call("{}", &CallOptions::default()).await.unwrap());
    let id = launched_id(&result);
    let task = store.get(&id).await.unwrap();
    assert_eq!(task.status, Status::Pending);
    assert_eq!(task.not_before.map(|t| t.0), Some(1_000_000 + 60_000));
    clock.advance(POLL_AFTER);
    let done = manager.execute(&id).await.unwrap();
    assert_eq!(done.result_data, b"job-7 done");
    assert_eq!(tool.starts.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert_eq!(*tool.recovered_from.lock().unwrap(), [b"job-7".to_vec()]);
}

/// The polling tool without its recovery: a plain tool.
#[derive(Clone, Default)]
struct PlainPolling(PollingTool);

#[dtask_engine::async_trait]
impl dtask_engine::managed::BackgroundTool for PlainPolling {
    fn validate_arguments(&self, arguments: &str) -> Result<(), ToolFailure> {
        self.0.validate_arguments(arguments)
    }

    async fn start(
        &self,
        request: dtask_engine::managed::StartRequest,
    ) -> Result<dtask_engine::managed::StartResult, ToolRunError> {
        let started = self.0.start(request).await?;
        Ok(dtask_engine::managed::StartResult {
            checkpoint: Vec::new(),
            ..started
        })
    }
}

// Only a recoverable tool can be looked at again: a plain tool's run that asks is a broken
// rule — its background task fails, its foreground call answers failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_tools_run_cannot_check_back_later() {
    let env = env_with(Registration::new(
        ToolInfo::without_parameters(NAME, "a plain poller"),
        PlainPolling::default(),
    ));
    let id = launched_id(&launch(&env).await);
    assert_eq!(
        failure(&env.manager, &id).await,
        "checking back later requires a recoverable tool"
    );
    let result = done(
        managed(&env, ManagedToolConfig::default())
            .call("{}", &CallOptions::default())
            .await
            .unwrap(),
    );
    assert_eq!(result.envelope.kind(), EnvelopeType::ForegroundResult);
    assert!(
        result
            .envelope
            .encode()
            .contains("checking back later requires a recoverable tool"),
        "{}",
        result.envelope.encode()
    );
}
