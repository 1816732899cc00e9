//! The conversation view of `dtask show` for a durable agent's run: its messages, each
//! tool call with its task id and how it ended, and the token usage the model reported —
//! folded from the run's journal entries by the engine's own transcript fold.

use super::{fold_task, Result};
use dtask_engine::agent::{AgentPayload, Transcript, AGENT_EXECUTOR_KEY};
use dtask_engine::tool::{Message, Usage};
use dtask_journal::{Event, Journal, Record};
use dtask_replay::TaskState;
use serde_json::{json, Value};
use std::fmt::Write as _;

/// Collects a run's updates while `show` folds its stream.
#[derive(Debug, Default)]
pub struct Collector {
    updates: Vec<(String, Vec<u8>)>,
}

impl Collector {
    /// Takes one record of the run's stream.
    pub fn add(&mut self, record: &Record) {
        if let Event::UpdateAppended { kind, data, .. } = &record.event {
            self.updates.push((kind.clone(), data.clone()));
        }
    }

    /// The run's conversation, when `state` is an agent run whose entries fold.
    pub fn conversation(
        self,
        journal: &Journal,
        state: &TaskState,
    ) -> Result<Option<Conversation>> {
        if state.spec.executor_key != AGENT_EXECUTOR_KEY {
            return Ok(None);
        }
        let folded = AgentPayload::decode(&state.spec.payload).and_then(|payload| {
            Transcript::fold(
                state.spec.id.clone(),
                payload,
                self.updates.iter().map(|(k, d)| (k.as_str(), d.as_slice())),
            )
        });
        let transcript = match folded {
            Ok(t) => t,
            Err(e) => {
                return Ok(Some(Conversation {
                    transcript: None,
                    problem: Some(e.to_string()),
                    call_status: Vec::new(),
                }))
            }
        };
        let mut call_status = Vec::new();
        for turn in transcript.turns() {
            for call in &turn.calls {
                let status = match journal.stream_len(&call.task_id)? {
                    Some(_) => fold_task(journal, &call.task_id, |_| {})?
                        .task
                        .map(|t| t.state.status.as_str().to_owned()),
                    None => None,
                };
                call_status.push(status);
            }
        }
        Ok(Some(Conversation {
            transcript: Some(transcript),
            problem: None,
            call_status,
        }))
    }
}

/// A run's conversation, with the status of each call's task (in call order).
#[derive(Debug)]
pub struct Conversation {
    transcript: Option<Transcript>,
    problem: Option<String>,
    call_status: Vec<Option<String>>,
}

fn usage_text(u: Usage) -> String {
    format!(
        "{} tokens ({} prompt, {} completion)",
        u.total_tokens, u.prompt_tokens, u.completion_tokens
    )
}

fn one_line(text: &str) -> String {
    text.replace('\n', " ⏎ ")
}

impl Conversation {
    /// For humans.
    pub fn text(&self) -> String {
        let Some(t) = &self.transcript else {
            return format!(
                "\nconversation: does not fold: {}\n",
                self.problem.as_deref().unwrap_or("")
            );
        };
        let reported = t.turns().iter().any(|turn| turn.usage.is_some());
        let mut out = format!(
            "\nconversation ({} turns of at most {}, {})\n",
            t.turns().len(),
            t.payload().max_steps,
            if reported {
                usage_text(t.usage())
            } else {
                "no token usage reported".to_owned()
            }
        );
        for m in &t.payload().messages {
            let _ = writeln!(
                out,
                "  {:<9} {}",
                m.role(),
                one_line(m.content().unwrap_or(""))
            );
        }
        let mut statuses = self.call_status.iter();
        let mut sent = t.sent_messages().iter().peekable();
        let mut write_sent = |out: &mut String, after: u32| {
            while let Some(m) = sent.next_if(|m| m.after_turn == after) {
                let _ = writeln!(
                    out,
                    "  user      [sent, input {}] {}",
                    m.sequence,
                    one_line(&m.content)
                );
            }
        };
        write_sent(&mut out, 0);
        for turn in t.turns() {
            let cost = turn
                .usage
                .map(|u| format!(", {} tokens", u.total_tokens))
                .unwrap_or_default();
            let text = turn.message.content.as_deref().unwrap_or("");
            let _ = writeln!(
                out,
                "  assistant [turn {}{cost}]{}{}",
                turn.number,
                if text.is_empty() { "" } else { " " },
                one_line(text)
            );
            for call in &turn.calls {
                let task = statuses.next().cloned().flatten();
                let _ = writeln!(
                    out,
                    "    → {} {}  (call {}, task {} {})",
                    call.call.function.name,
                    one_line(&call.call.function.arguments),
                    call.call.id,
                    call.task_id,
                    task.unwrap_or_else(|| "not created".to_owned()),
                );
                match &call.result {
                    Some(r) => {
                        let _ =
                            writeln!(out, "    ← {}: {}", r.status.as_str(), one_line(&r.content));
                    }
                    None => out.push_str("    ← (no result yet)\n"),
                }
            }
            write_sent(&mut out, turn.number);
        }
        out
    }

    /// For machines.
    pub fn json(&self) -> Value {
        let Some(t) = &self.transcript else {
            return json!({ "problem": self.problem });
        };
        let mut statuses = self.call_status.iter();
        let turns: Vec<Value> = t
            .turns()
            .iter()
            .map(|turn| {
                let calls: Vec<Value> = turn
                    .calls
                    .iter()
                    .map(|call| {
                        json!({
                            "index": call.index,
                            "tool_call_id": call.call.id,
                            "tool": call.call.function.name,
                            "arguments": call.call.function.arguments,
                            "task_id": call.task_id,
                            "task_status": statuses.next().cloned().flatten(),
                            "result": call.result.as_ref().map(|r| json!({
                                "status": r.status.as_str(),
                                "content": r.content,
                            })),
                        })
                    })
                    .collect();
                json!({
                    "turn": turn.number,
                    "content": turn.message.content,
                    "usage": turn.usage,
                    "calls": calls,
                })
            })
            .collect();
        json!({
            "max_steps": t.payload().max_steps,
            "messages": t.payload().messages.iter().map(message_json).collect::<Vec<_>>(),
            "turns": turns,
            "sent_messages": t.sent_messages().iter().map(|m| json!({
                "sequence": m.sequence,
                "after_turn": m.after_turn,
                "content": m.content,
            })).collect::<Vec<_>>(),
            "usage": t.usage(),
        })
    }
}

fn message_json(m: &Message) -> Value {
    serde_json::to_value(m).unwrap_or(Value::Null)
}
