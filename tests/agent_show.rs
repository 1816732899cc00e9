//! `dtask show` on a durable agent's run: the run is made with the engine on a real journal,
//! then the CLI, as a process, renders it as a conversation (messages, tool calls with their
//! task ids and outcomes, token usage) for humans and in `--json`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../engine/tests/support/ledger.rs"]
mod ledger;

use assert_cmd::Command;
use dtask_engine::agent::{send_message, AgentMessage, AgentRequest, DurableAgent};
use dtask_engine::managed::{ManagedTools, ToolRegistry};
use dtask_engine::tool::{
    AssistantMessage, ChatModel, Message, ModelReply, ScriptedModel, ToolCall, ToolError, ToolInfo,
    Usage,
};
use dtask_engine::{ExecutorRegistry, Manager, ManagerConfig, ManualClock, StoreConfig, TaskStore};
use dtask_journal::{Journal, JournalOptions};
use serde_json::Value;
use std::path::Path;
use std::sync::Arc;

/// The scripted model, reporting 7 tokens per answer.
struct Costly(ScriptedModel);

#[dtask_engine::async_trait]
impl ChatModel for Costly {
    async fn generate(
        &self,
        messages: &[Message],
        tools: &[ToolInfo],
    ) -> Result<AssistantMessage, ToolError> {
        self.0.generate(messages, tools).await
    }

    async fn reply(
        &self,
        messages: &[Message],
        tools: &[ToolInfo],
    ) -> Result<ModelReply, ToolError> {
        Ok(ModelReply {
            message: self.generate(messages, tools).await?,
            usage: Some(Usage {
                prompt_tokens: 5,
                completion_tokens: 2,
                total_tokens: 7,
            }),
            finish_reason: None,
        })
    }
}

fn make_run(dir: &Path) {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let journal = Journal::open(dir.join("journal"), JournalOptions::default()).unwrap();
        let store = TaskStore::open(
            journal,
            ManualClock::new(1_700_000_000_000),
            StoreConfig::default(),
        )
        .unwrap();
        let mut tools = ToolRegistry::new();
        tools
            .register(ledger::LedgerTool::registration(&dir.join("ledger")))
            .unwrap();
        let model = Costly(ScriptedModel::new([
            AssistantMessage::with_tool_calls(vec![
                ToolCall::function("c1", "add", r#"{"a":2,"b":3}"#),
                ToolCall::function("c2", "nope", "{}"),
            ]),
            AssistantMessage::text("2 + 3 = 5"),
        ]));
        let agent = DurableAgent::new(Arc::new(model), ManagedTools::new(tools));
        let mut executors = ExecutorRegistry::new();
        agent.register_executors(&mut executors).unwrap();
        let manager = Manager::new(store, executors, ManagerConfig::default());
        agent
            .submit(
                &manager,
                AgentRequest::new(vec![Message::user("What is 2 + 3?")]).with_task_id("run"),
            )
            .await
            .unwrap();
        send_message(manager.store(), "run", AgentMessage::new("Show your work."))
            .await
            .unwrap();
        manager.execute("run").await.unwrap();
    });
}

fn dtask(dir: &Path) -> Command {
    let mut cmd = Command::cargo_bin("dtask").unwrap();
    cmd.env_remove("DTASK_JOURNAL")
        .arg("--journal")
        .arg(dir.join("journal"));
    cmd
}

#[test]
fn show_renders_an_agent_run_as_a_conversation() {
    let dir = tempfile::tempdir().unwrap();
    make_run(dir.path());

    let output = dtask(dir.path())
        .args(["--json", "show", "run"])
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let shown: Value = serde_json::from_slice(&output.stdout).unwrap();
    let conversation = &shown["conversation"];
    assert_eq!(conversation["usage"]["total_tokens"], 14);
    assert_eq!(conversation["messages"][0]["content"], "What is 2 + 3?");
    let turns = conversation["turns"].as_array().unwrap();
    assert_eq!(turns.len(), 2);
    let calls = turns[0]["calls"].as_array().unwrap();
    assert_eq!(calls[0]["task_id"], "run.t1.c0");
    assert_eq!(calls[0]["task_status"], "completed");
    assert_eq!(calls[0]["result"]["content"], "5");
    assert_eq!(calls[1]["task_status"], Value::Null);
    assert_eq!(calls[1]["result"]["status"], "refused");
    assert_eq!(turns[1]["content"], "2 + 3 = 5");
    assert_eq!(turns[1]["usage"]["total_tokens"], 7);
    let sent = conversation["sent_messages"].as_array().unwrap();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0]["after_turn"], 0);
    assert_eq!(sent[0]["content"], "Show your work.");

    let text = dtask(dir.path()).args(["show", "run"]).output().unwrap();
    let text = String::from_utf8(text.stdout).unwrap();
    assert!(
        text.contains("conversation (2 turns of at most 10, 14 tokens (10 prompt, 4 completion))"),
        "{text}"
    );
    assert!(
        text.contains("→ add {\"a\":2,\"b\":3}  (call c1, task run.t1.c0 completed)"),
        "{text}"
    );
    assert!(text.contains("← completed: 5"), "{text}");
    // The message sent to the run, where the model first saw it: before turn 1.
    let sent = text
        .find("user      [sent, input 1] Show your work.")
        .unwrap();
    assert!(sent < text.find("assistant [turn 1").unwrap(), "{text}");
    assert!(
        text.contains("← refused: Error: tool \"nope\" is not registered"),
        "{text}"
    );
    assert!(
        text.contains("assistant [turn 2, 7 tokens] 2 + 3 = 5"),
        "{text}"
    );

    // A task that is not an agent run has no conversation.
    let child = dtask(dir.path())
        .args(["--json", "show", "run.t1.c0"])
        .output()
        .unwrap();
    let child: Value = serde_json::from_slice(&child.stdout).unwrap();
    assert!(child.get("conversation").is_none());
}
