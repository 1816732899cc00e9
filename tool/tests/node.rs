//! The tools node: ordering, concurrency, unknown tools, error policy,
//! panics and time limits.
#![allow(clippy::unwrap_used)]

use std::{
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use async_trait::async_trait;
use dtask_tool::{
    AssistantMessage, BoxError, ErrorPolicy, Execution, FunctionTool, InterruptedCall,
    StreamingFunctionTool, Tool, ToolCall, ToolError, ToolInfo, ToolMessage, ToolsNode,
};
use futures::stream;
use schemars::JsonSchema;
use serde::Deserialize;
use tokio::sync::{oneshot, Barrier};

/// Generous bound that turns a deadlock into a test failure.
const DEADLOCK_GUARD: Duration = Duration::from_secs(20);

#[derive(Debug, Deserialize, JsonSchema)]
struct Text {
    text: String,
}

fn echo() -> FunctionTool<Text, String> {
    FunctionTool::infer("echo", "Echo the text", |t: Text| async move {
        Ok::<_, BoxError>(t.text)
    })
    .with_encoder(|s: &String| Ok(s.clone()))
}

fn call(id: &str, name: &str, arguments: &str) -> ToolCall {
    ToolCall::function(id, name, arguments)
}

fn message(calls: Vec<ToolCall>) -> AssistantMessage {
    AssistantMessage::with_tool_calls(calls)
}

/// A tool that counts its calls.
fn counting(name: &str, counter: Arc<AtomicUsize>) -> FunctionTool<Text, String> {
    FunctionTool::infer(name, "Counts calls", move |t: Text| {
        let counter = Arc::clone(&counter);
        async move {
            counter.fetch_add(1, Ordering::SeqCst);
            Ok::<_, BoxError>(t.text)
        }
    })
}

#[tokio::test]
async fn returns_tool_messages_in_call_order_with_ids() {
    let node = ToolsNode::builder().tool(echo()).build().unwrap();
    let out = node
        .invoke(&message(vec![
            call("c1", "echo", r#"{"text":"one"}"#),
            call("c2", "echo", r#"{"text":"two"}"#),
            call("c3", "echo", r#"{"text":"three"}"#),
        ]))
        .await
        .unwrap();
    assert_eq!(
        out,
        vec![
            ToolMessage::new("c1", "one"),
            ToolMessage::new("c2", "two"),
            ToolMessage::new("c3", "three"),
        ]
    );
    assert!(node
        .invoke(&AssistantMessage::text("no calls"))
        .await
        .unwrap()
        .is_empty());
}

#[derive(Debug, Deserialize, JsonSchema)]
struct Empty {}

#[tokio::test]
async fn order_is_call_order_even_when_completion_order_differs() {
    // `slow` can only finish after `fast` has run and sent it a signal.
    let (tx, rx) = oneshot::channel::<()>();
    let tx = Arc::new(Mutex::new(Some(tx)));
    let rx = Arc::new(tokio::sync::Mutex::new(Some(rx)));
    let finished = Arc::new(Mutex::new(Vec::new()));

    let slow_finished = Arc::clone(&finished);
    let slow = FunctionTool::infer("slow", "Waits for fast", move |_: Empty| {
        let rx = Arc::clone(&rx);
        let finished = Arc::clone(&slow_finished);
        async move {
            let rx = rx.lock().await.take().unwrap();
            rx.await.unwrap();
            finished.lock().unwrap().push("slow");
            Ok::<_, BoxError>("slow result")
        }
    });
    let fast_finished = Arc::clone(&finished);
    let fast = FunctionTool::infer("fast", "Signals slow", move |_: Empty| {
        let tx = tx.lock().unwrap().take();
        let finished = Arc::clone(&fast_finished);
        async move {
            tx.unwrap().send(()).unwrap();
            finished.lock().unwrap().push("fast");
            Ok::<_, BoxError>("fast result")
        }
    });
    let node = ToolsNode::builder().tool(slow).tool(fast).build().unwrap();
    let out = tokio::time::timeout(
        DEADLOCK_GUARD,
        node.invoke(&message(vec![
            call("a", "slow", "{}"),
            call("b", "fast", "{}"),
        ])),
    )
    .await
    .expect("the node deadlocked")
    .unwrap();
    assert_eq!(*finished.lock().unwrap(), ["fast", "slow"]);
    assert_eq!(
        out,
        vec![
            ToolMessage::new("a", r#""slow result""#),
            ToolMessage::new("b", r#""fast result""#),
        ]
    );
}

/// A tool that waits on a shared barrier: two calls only get through if they
/// run at the same time.
fn barrier_tool(barrier: Arc<Barrier>) -> FunctionTool<Text, String> {
    FunctionTool::infer("meet", "Waits for the other call", move |t: Text| {
        let barrier = Arc::clone(&barrier);
        async move {
            barrier.wait().await;
            Ok::<_, BoxError>(t.text)
        }
    })
}

#[tokio::test]
async fn concurrent_by_default() {
    let node = ToolsNode::builder()
        .tool(barrier_tool(Arc::new(Barrier::new(2))))
        .build()
        .unwrap();
    let calls = message(vec![
        call("c1", "meet", r#"{"text":"left"}"#),
        call("c2", "meet", r#"{"text":"right"}"#),
    ]);
    // Sequential execution would wait at the barrier forever.
    let out = tokio::time::timeout(DEADLOCK_GUARD, node.invoke(&calls))
        .await
        .expect("calls did not run concurrently")
        .unwrap();
    assert_eq!(out[0].content, r#""left""#);
    assert_eq!(out[1].content, r#""right""#);
}

/// A tool that logs when it starts and ends, yielding in between.
struct Logged {
    log: Arc<Mutex<Vec<String>>>,
}

#[async_trait]
impl Tool for Logged {
    fn info(&self) -> ToolInfo {
        ToolInfo::without_parameters("logged", "Logs its start and end")
    }

    async fn invoke(&self, arguments: &str) -> Result<String, ToolError> {
        self.log.lock().unwrap().push(format!("start {arguments}"));
        for _ in 0..3 {
            tokio::task::yield_now().await;
        }
        self.log.lock().unwrap().push(format!("end {arguments}"));
        Ok(String::new())
    }
}

async fn run_logged(execution: Execution) -> Vec<String> {
    let log = Arc::new(Mutex::new(Vec::new()));
    let node = ToolsNode::builder()
        .tool(Logged {
            log: Arc::clone(&log),
        })
        .execution(execution)
        .build()
        .unwrap();
    node.invoke(&message(vec![
        call("1", "logged", "a"),
        call("2", "logged", "b"),
    ]))
    .await
    .unwrap();
    let entries = log.lock().unwrap().clone();
    entries
}

#[tokio::test]
async fn sequential_runs_one_call_after_the_other() {
    assert_eq!(
        run_logged(Execution::Sequential).await,
        ["start a", "end a", "start b", "end b"]
    );
    // The same tools interleave when run concurrently.
    assert_eq!(
        run_logged(Execution::Concurrent).await,
        ["start a", "start b", "end a", "end b"]
    );
}

/// Two tools: `wait` finishes only once `signal` has run.
fn waiter_and_signaller(notify: &Arc<tokio::sync::Notify>) -> WaitAndSignal {
    let waiting = Arc::clone(notify);
    let wait = FunctionTool::infer("wait", "Waits for signal", move |_: Empty| {
        let notify = Arc::clone(&waiting);
        async move {
            notify.notified().await;
            Ok::<_, BoxError>("woken")
        }
    });
    let signalling = Arc::clone(notify);
    let signal = FunctionTool::infer("signal", "Wakes wait", move |_: Empty| {
        let notify = Arc::clone(&signalling);
        async move {
            notify.notify_one();
            Ok::<_, BoxError>("signalled")
        }
    });
    (wait, signal)
}

type WaitAndSignal = (
    FunctionTool<Empty, &'static str>,
    FunctionTool<Empty, &'static str>,
);

#[tokio::test]
async fn sequential_option_really_serialises() {
    let calls = message(vec![call("c1", "wait", "{}"), call("c2", "signal", "{}")]);

    // Concurrently, `wait` is woken by `signal`.
    let (wait, signal) = waiter_and_signaller(&Arc::new(tokio::sync::Notify::new()));
    let node = ToolsNode::builder()
        .tool(wait)
        .tool(signal)
        .build()
        .unwrap();
    let out = tokio::time::timeout(DEADLOCK_GUARD, node.invoke(&calls))
        .await
        .expect("calls did not run concurrently")
        .unwrap();
    assert_eq!(out[0].content, r#""woken""#);

    // Sequentially, `wait` runs alone and can only hit its time limit;
    // `signal` runs after it.
    let (wait, signal) = waiter_and_signaller(&Arc::new(tokio::sync::Notify::new()));
    let node = ToolsNode::builder()
        .tool(wait)
        .tool(signal)
        .sequential()
        .call_timeout(Duration::from_millis(100))
        .error_policy(ErrorPolicy::ReturnToModel)
        .build()
        .unwrap();
    let out = node.invoke(&calls).await.unwrap();
    assert_eq!(
        out,
        vec![
            ToolMessage::new("c1", "Error: tool `wait` timed out after 100ms"),
            ToolMessage::new("c2", r#""signalled""#),
        ]
    );
}

#[tokio::test]
async fn unknown_tool_fails_before_anything_runs() {
    let counter = Arc::new(AtomicUsize::new(0));
    let node = ToolsNode::builder()
        .tool(counting("count", Arc::clone(&counter)))
        .build()
        .unwrap();
    let err = node
        .invoke(&message(vec![
            call("c1", "count", r#"{"text":"x"}"#),
            call("c2", "nope", "{}"),
        ]))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ToolError::UnknownTool { name } if name == "nope"),
        "{err:?}"
    );
    assert_eq!(err.to_string(), "unknown tool `nope`");
    assert_eq!(counter.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn unknown_tool_handler_answers_unknown_calls() {
    let node = ToolsNode::builder()
        .tool(echo())
        .unknown_tool_handler(|call: ToolCall| async move {
            Ok(format!(
                "no tool named {} (arguments {})",
                call.function.name, call.function.arguments
            ))
        })
        .build()
        .unwrap();
    let out = node
        .invoke(&message(vec![
            call("c1", "echo", r#"{"text":"hi"}"#),
            call("c2", "ghost", r#"{"x":1}"#),
        ]))
        .await
        .unwrap();
    assert_eq!(out[0], ToolMessage::new("c1", "hi"));
    assert_eq!(
        out[1],
        ToolMessage::new("c2", r#"no tool named ghost (arguments {"x":1})"#)
    );
}

#[tokio::test]
async fn return_to_model_policy_turns_errors_into_tool_messages() {
    let node = ToolsNode::builder()
        .tool(echo())
        .error_policy(ErrorPolicy::ReturnToModel)
        .build()
        .unwrap();
    let out = node
        .invoke(&message(vec![
            call("c1", "echo", r#"{"text":1}"#),
            call("c2", "missing", "{}"),
            call("c3", "echo", r#"{"text":"fine"}"#),
        ]))
        .await
        .unwrap();
    assert_eq!(out.len(), 3);
    assert_eq!(out[0].tool_call_id, "c1");
    assert!(
        out[0]
            .content
            .starts_with("Error: invalid arguments for tool `echo` at `text`"),
        "{}",
        out[0].content
    );
    assert_eq!(
        out[1],
        ToolMessage::new("c2", "Error: unknown tool `missing`")
    );
    assert_eq!(out[2], ToolMessage::new("c3", "fine"));
}

#[tokio::test]
async fn fail_policy_returns_the_first_error_in_call_order() {
    let node = ToolsNode::builder().tool(echo()).build().unwrap();
    let err = node
        .invoke(&message(vec![
            call("c1", "echo", r#"{"text":"ok"}"#),
            call("c2", "echo", r#"{"text":2}"#),
            call("c3", "echo", "{}"),
        ]))
        .await
        .unwrap_err();
    match err {
        ToolError::InvalidArguments { tool, path, .. } => {
            assert_eq!(tool, "echo");
            assert_eq!(path, "text"); // c2's error, not c3's (missing field at `.`)
        }
        other => panic!("unexpected error: {other:?}"),
    }
}

#[tokio::test]
async fn sequential_fail_stops_at_the_first_error() {
    let counter = Arc::new(AtomicUsize::new(0));
    let node = ToolsNode::builder()
        .tool(counting("count", Arc::clone(&counter)))
        .sequential()
        .build()
        .unwrap();
    let err = node
        .invoke(&message(vec![
            call("c1", "count", r#"{"text":"a"}"#),
            call("c2", "count", "[]"),
            call("c3", "count", r#"{"text":"c"}"#),
        ]))
        .await
        .unwrap_err();
    assert!(matches!(err, ToolError::InvalidArguments { .. }), "{err:?}");
    assert_eq!(counter.load(Ordering::SeqCst), 1);
}

/// A hand-written tool that panics (not protected by `FunctionTool`).
struct Panics;

#[async_trait]
impl Tool for Panics {
    fn info(&self) -> ToolInfo {
        ToolInfo::without_parameters("panics", "Always panics")
    }

    async fn invoke(&self, _arguments: &str) -> Result<String, ToolError> {
        let v: Vec<u8> = Vec::new();
        let i = v.len() + 3;
        Ok(v[i].to_string())
    }
}

#[tokio::test]
async fn a_panicking_tool_does_not_crash_the_node() {
    let node = ToolsNode::builder()
        .tool(Panics)
        .tool(echo())
        .build()
        .unwrap();
    let calls = message(vec![
        call("c1", "panics", "{}"),
        call("c2", "echo", r#"{"text":"still here"}"#),
    ]);
    let err = node.invoke(&calls).await.unwrap_err();
    match &err {
        ToolError::Panicked { tool, message } => {
            assert_eq!(tool, "panics");
            assert!(message.contains("index out of bounds"), "{message}");
        }
        other => panic!("unexpected error: {other:?}"),
    }
    let outcomes = node.run_calls(&calls.tool_calls).await;
    assert!(matches!(outcomes[0], Err(ToolError::Panicked { .. })));
    assert_eq!(outcomes[1].as_ref().unwrap(), "still here");
}

#[tokio::test]
async fn call_timeout_bounds_a_hanging_tool() {
    let hang = FunctionTool::infer("hang", "Never returns", |_: Empty| async move {
        futures::future::pending::<Result<(), BoxError>>().await
    });
    let node = ToolsNode::builder()
        .tool(hang)
        .call_timeout(Duration::from_millis(50))
        .build()
        .unwrap();
    let err = tokio::time::timeout(
        DEADLOCK_GUARD,
        node.invoke(&message(vec![call("c", "hang", "{}")])),
    )
    .await
    .expect("the time limit was not applied")
    .unwrap_err();
    assert!(
        matches!(&err, ToolError::Timeout { tool, timeout } if tool == "hang" && *timeout == Duration::from_millis(50)),
        "{err:?}"
    );
}

#[test]
fn duplicate_names_are_rejected() {
    let err = ToolsNode::builder()
        .tool(echo())
        .tool(echo())
        .build()
        .unwrap_err();
    assert!(
        matches!(&err, ToolError::DuplicateTool { name } if name == "echo"),
        "{err:?}"
    );
    let tools: Vec<Arc<dyn Tool>> = vec![Arc::new(echo()), Arc::new(Panics)];
    let node = ToolsNode::new(tools).unwrap();
    let names: Vec<&str> = node.infos().iter().map(|i| i.name.as_str()).collect();
    assert_eq!(names, ["echo", "panics"]);
    assert!(node.tool("echo").is_some());
    assert!(node.tool("nope").is_none());
}

#[tokio::test]
async fn streaming_tools_are_collected_into_one_message() {
    let words = StreamingFunctionTool::infer("spell", "Spell a word", |t: Text| {
        stream::iter(t.text.chars().map(Ok::<_, BoxError>).collect::<Vec<_>>())
    })
    .with_encoder(|c: &char| Ok(format!("{c}-")));
    let node = ToolsNode::builder().streaming_tool(words).build().unwrap();
    let out = node
        .invoke(&message(vec![call("s", "spell", r#"{"text":"abc"}"#)]))
        .await
        .unwrap();
    assert_eq!(out, vec![ToolMessage::new("s", "a-b-c-")]);
}

#[tokio::test]
async fn a_panicking_unknown_tool_handler_is_isolated_too() {
    let node = ToolsNode::builder()
        .tool(echo())
        .unknown_tool_handler(|call: ToolCall| {
            // Panics before it even returns a future.
            assert!(
                call.function.name.is_empty(),
                "no handler for {}",
                call.function.name
            );
            async { Ok(String::new()) }
        })
        .build()
        .unwrap();
    let outcomes = node
        .run_calls(&[
            call("c1", "ghost", "{}"),
            call("c2", "echo", r#"{"text":"ok"}"#),
        ])
        .await;
    assert!(
        matches!(&outcomes[0], Err(ToolError::Panicked { tool, message }) if tool == "ghost" && message == "no handler for ghost"),
        "{outcomes:?}"
    );
    assert_eq!(outcomes[1].as_ref().unwrap(), "ok");
}

/// A tool that always asks for input (as a managed tool's foreground call does); its state
/// is its arguments.
struct Asks;

#[async_trait]
impl Tool for Asks {
    fn info(&self) -> ToolInfo {
        ToolInfo::without_parameters("asks", "Asks for approval")
    }

    async fn invoke(&self, arguments: &str) -> Result<String, ToolError> {
        Err(ToolError::Interrupted {
            tool: "asks".into(),
            info: serde_json::json!({"question": "approve?"}),
            state: arguments.to_owned(),
        })
    }
}

fn interrupted(call_id: &str, state: &str) -> InterruptedCall {
    InterruptedCall {
        call_id: call_id.into(),
        tool: "asks".into(),
        info: serde_json::json!({"question": "approve?"}),
        state: state.into(),
    }
}

// A call waiting for input is not an error to tell the model: its state is what the caller
// resumes it with, so the node returns it even when errors go back to the model — with every
// interrupted call's state and the results of the calls that ended (a resumed run must not
// run them again). Sequentially, the calls after an interrupted one are not run.
#[tokio::test]
async fn an_interrupt_reaches_the_caller_under_either_policy() {
    for policy in [ErrorPolicy::Fail, ErrorPolicy::ReturnToModel] {
        for execution in [Execution::Concurrent, Execution::Sequential] {
            let ran = Arc::new(AtomicUsize::new(0));
            let node = ToolsNode::builder()
                .tool(Asks)
                .tool(echo())
                .tool(counting("count", Arc::clone(&ran)))
                .error_policy(policy)
                .execution(execution)
                .build()
                .unwrap();
            let err = node
                .invoke(&message(vec![
                    call("c1", "echo", r#"{"text":"x"}"#),
                    call("c2", "asks", "s2"),
                    call("c3", "count", r#"{"text":"y"}"#),
                    call("c4", "asks", "s4"),
                ]))
                .await
                .unwrap_err();
            let ToolError::CallsInterrupted {
                interrupts,
                finished,
                transcript,
            } = err
            else {
                panic!("{policy:?}, {execution:?}: {err:?}");
            };
            assert!(transcript.is_empty(), "a node has no conversation");
            if execution == Execution::Concurrent {
                assert_eq!(
                    interrupts,
                    [interrupted("c2", "s2"), interrupted("c4", "s4")]
                );
                assert_eq!(
                    finished,
                    [
                        ToolMessage::new("c1", "x"),
                        ToolMessage::new("c3", r#""y""#)
                    ]
                );
                assert_eq!(ran.load(Ordering::SeqCst), 1);
            } else {
                assert_eq!(interrupts, [interrupted("c2", "s2")], "{policy:?}");
                assert_eq!(finished, [ToolMessage::new("c1", "x")], "{policy:?}");
                assert_eq!(
                    ran.load(Ordering::SeqCst),
                    0,
                    "{policy:?}: a call after the interrupt ran"
                );
            }
        }
    }
    // Raw outcomes: sequentially, they end with the interrupt.
    let node = ToolsNode::builder()
        .tool(Asks)
        .tool(echo())
        .sequential()
        .build()
        .unwrap();
    let outcomes = node
        .run_calls(&[
            call("c1", "asks", "s1"),
            call("c2", "echo", r#"{"text":"x"}"#),
        ])
        .await;
    assert_eq!(outcomes.len(), 1, "{outcomes:?}");
    assert!(matches!(&outcomes[0], Err(ToolError::Interrupted { state, .. }) if state == "s1"));
}

// Under `ErrorPolicy::Fail`, a call that failed fails the node even when another one waits
// for input: answering the interrupt would not save the turn.
#[tokio::test]
async fn under_fail_a_failure_outweighs_an_interrupt() {
    let node = ToolsNode::builder()
        .tool(Asks)
        .tool(echo())
        .build()
        .unwrap();
    let err = node
        .invoke(&message(vec![
            call("c1", "asks", "s1"),
            call("c2", "echo", r#"{"txt":"x"}"#),
        ]))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ToolError::InvalidArguments { tool, .. } if tool == "echo"),
        "{err:?}"
    );
}
