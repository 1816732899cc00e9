//! The agent loop with a scripted model.
#![allow(clippy::unwrap_used)]

use std::sync::{
    atomic::{AtomicUsize, Ordering},
    Arc,
};

use dtask_tool::{
    Agent, AssistantMessage, BoxError, ChatModel, ErrorPolicy, FunctionTool, Message,
    ScriptedModel, Tool, ToolCall, ToolError, ToolInfo, ToolMessage, ToolsNode, DEFAULT_MAX_STEPS,
};
use schemars::JsonSchema;
use serde::Deserialize;

#[derive(Debug, Deserialize, JsonSchema)]
struct Num {
    n: i64,
}

fn double_node(policy: ErrorPolicy) -> ToolsNode {
    let double = FunctionTool::infer("double", "Double a number", |x: Num| async move {
        Ok::<_, BoxError>(x.n * 2)
    });
    ToolsNode::builder()
        .tool(double)
        .error_policy(policy)
        .build()
        .unwrap()
}

fn double_call(id: &str, n: i64) -> AssistantMessage {
    AssistantMessage::with_tool_calls(vec![ToolCall::function(
        id,
        "double",
        format!(r#"{{"n":{n}}}"#),
    )])
}

#[tokio::test]
async fn loops_until_the_model_stops_calling_tools() {
    let model = Arc::new(ScriptedModel::new([
        double_call("c1", 2),
        double_call("c2", 4),
        AssistantMessage::text("8"),
    ]));
    let agent = Agent::new(model.clone(), double_node(ErrorPolicy::Fail));
    assert_eq!(agent.max_steps(), DEFAULT_MAX_STEPS);
    let run = agent
        .run(vec![Message::user("double 2 twice")])
        .await
        .unwrap();

    assert_eq!(run.steps, 3);
    assert_eq!(run.answer, AssistantMessage::text("8"));
    assert_eq!(
        run.messages,
        vec![
            Message::user("double 2 twice"),
            Message::Assistant(double_call("c1", 2)),
            Message::tool("c1", "4"),
            Message::Assistant(double_call("c2", 4)),
            Message::tool("c2", "8"),
            Message::assistant("8"),
        ]
    );

    // The model saw the growing conversation and the tools every time.
    let requests = model.requests();
    assert_eq!(requests.len(), 3);
    assert_eq!(requests[0].messages.len(), 1);
    assert_eq!(requests[1].messages.len(), 3);
    assert_eq!(requests[2].messages.len(), 5);
    assert!(requests.iter().all(|r| r.tool_names == ["double"]));
    assert_eq!(model.remaining(), 0);
}

#[tokio::test]
async fn step_limit_is_a_typed_error_with_a_resumable_transcript() {
    let model = Arc::new(ScriptedModel::new([
        double_call("c1", 1),
        double_call("c2", 2),
        double_call("c3", 3),
        AssistantMessage::text("done"),
    ]));
    let agent = Agent::new(model.clone(), double_node(ErrorPolicy::Fail)).with_max_steps(2);
    let err = agent.run(vec![Message::user("go")]).await.unwrap_err();
    let ToolError::StepLimit { limit, transcript } = err else {
        panic!("expected StepLimit, got {err:?}");
    };
    assert_eq!(limit, 2);
    assert_eq!(model.requests().len(), 2);
    // Ends with the answers to the last step's calls.
    assert_eq!(transcript.len(), 5);
    assert_eq!(transcript.last(), Some(&Message::tool("c2", "4")));

    // Continue from the transcript.
    let run = agent.run(transcript).await.unwrap();
    assert_eq!(run.steps, 2);
    assert_eq!(run.answer.content.as_deref(), Some("done"));
    assert_eq!(run.messages.len(), 8);
}

#[tokio::test]
async fn tool_errors_fail_the_run_or_go_back_to_the_model() {
    // Fail policy: the run fails with the tool's error.
    let mut bad = double_call("c1", 1);
    bad.tool_calls[0].function.arguments = r#"{"n":"one"}"#.into();
    let model_bad = Arc::new(ScriptedModel::new([
        bad.clone(),
        AssistantMessage::text("sorry"),
    ]));
    let err = Agent::new(model_bad, double_node(ErrorPolicy::Fail))
        .run(vec![Message::user("x")])
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ToolError::InvalidArguments { tool, path, .. } if tool == "double" && path == "n"),
        "{err:?}"
    );

    // ReturnToModel: the model sees the error and answers.
    let model_bad = Arc::new(ScriptedModel::new([bad, AssistantMessage::text("sorry")]));
    let run = Agent::new(model_bad.clone(), double_node(ErrorPolicy::ReturnToModel))
        .run(vec![Message::user("x")])
        .await
        .unwrap();
    assert_eq!(run.answer.content.as_deref(), Some("sorry"));
    let seen = &model_bad.requests()[1].messages;
    assert!(
        seen[2]
            .content()
            .unwrap()
            .starts_with("Error: invalid arguments for tool `double` at `n`"),
        "{seen:?}"
    );
}

#[tokio::test]
async fn model_errors_are_reported() {
    let model: Arc<dyn ChatModel> = Arc::new(ScriptedModel::new([double_call("c1", 1)]));
    let err = Agent::new(model, double_node(ErrorPolicy::Fail))
        .run(vec![Message::user("x")])
        .await
        .unwrap_err();
    assert!(matches!(err, ToolError::Model { .. }), "{err:?}");
    assert!(err.to_string().contains("no replies left"), "{err}");
}

#[tokio::test]
async fn the_agent_runs_on_a_spawned_task() {
    // `Agent::run` is `Send`, so the engine can spawn it.
    let model = Arc::new(ScriptedModel::new([
        double_call("c1", 5),
        AssistantMessage::text("10"),
    ]));
    let agent = Agent::new(model, double_node(ErrorPolicy::Fail));
    let run = tokio::spawn(async move { agent.run(vec![Message::user("double 5")]).await })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(run.messages[2], Message::tool("c1", "10"));
}

/// A tool that asks for approval (as a managed tool's foreground call does).
struct Approval;

#[async_trait::async_trait]
impl Tool for Approval {
    fn info(&self) -> ToolInfo {
        ToolInfo::without_parameters("approve", "Asks a person")
    }

    async fn invoke(&self, _arguments: &str) -> Result<String, ToolError> {
        Err(ToolError::Interrupted {
            tool: "approve".into(),
            info: serde_json::json!("May I?"),
            state: "approval-state".into(),
        })
    }
}

// Calls waiting for input end the run with their states and a transcript that holds the
// results of the turn's other calls: the run continues from it once the interrupted calls
// are answered, and no call runs twice.
#[tokio::test]
async fn an_interrupt_ends_the_run_with_a_resumable_transcript() {
    let doubled = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&doubled);
    let double = FunctionTool::infer("double", "Double a number", move |x: Num| {
        counter.fetch_add(1, Ordering::SeqCst);
        async move { Ok::<_, BoxError>(x.n * 2) }
    });
    let tools = ToolsNode::builder()
        .tool(double)
        .tool(Approval)
        .build()
        .unwrap();
    let turn = AssistantMessage::with_tool_calls(vec![
        ToolCall::function("c1", "double", r#"{"n":1}"#),
        ToolCall::function("c2", "approve", "{}"),
    ]);
    let model = Arc::new(ScriptedModel::new([
        turn.clone(),
        AssistantMessage::text("approved, and 1 doubled is 2"),
    ]));
    let agent = Agent::new(model.clone(), tools);
    let err = agent.run(vec![Message::user("go")]).await.unwrap_err();
    let ToolError::CallsInterrupted {
        interrupts,
        finished,
        mut transcript,
    } = err
    else {
        panic!("expected CallsInterrupted, got {err:?}");
    };
    assert_eq!(interrupts.len(), 1);
    assert_eq!(interrupts[0].call_id, "c2");
    assert_eq!(interrupts[0].state, "approval-state");
    assert_eq!(finished, [ToolMessage::new("c1", "2")]);
    assert_eq!(
        transcript,
        [
            Message::user("go"),
            Message::Assistant(turn),
            Message::tool("c1", "2"),
        ]
    );
    // The person answers; the run goes on without running `double` again.
    transcript.push(Message::tool("c2", "yes"));
    let run = agent.run(transcript).await.unwrap();
    assert_eq!(
        run.answer.content.as_deref(),
        Some("approved, and 1 doubled is 2")
    );
    assert_eq!(model.requests()[1].messages.len(), 4);
    assert_eq!(doubled.load(Ordering::SeqCst), 1);
}
