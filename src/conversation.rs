//! A durable agent's run as a conversation — its opening messages, each model answer with
//! its tool calls (their task ids, how their tasks stand, their results), the messages sent
//! to the run where the model first saw them, and the token usage the model reported —
//! folded from the run's journal entries by the engine's own transcript fold
//! ([`dtask_engine::agent::Transcript`]). `dtask show` prints it; `dtask serve` answers it
//! at `GET /api/tasks/{id}/conversation` and the web page shows it.
//!
//! ```
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use dtask::conversation::Conversation;
//! let dir = tempfile::tempdir()?;
//! let journal = dtask::Journal::open(dir.path(), dtask::JournalOptions::default())?;
//! // Not a run: no conversation.
//! assert!(Conversation::read(&journal, "no-such-task")?.is_none());
//! # Ok(()) }
//! ```

use dtask_engine::agent::{AgentPayload, Transcript, AGENT_EXECUTOR_KEY};
use dtask_engine::tool::{Message, Usage};
use dtask_journal::{Event, Journal, Record};
use dtask_replay::{FoldView, TaskState};
use serde::Serialize;
use std::fmt::Write as _;
use utoipa::ToSchema;

/// Collects a run's updates while its stream is read for something else (`dtask show`
/// folds the stream once for the timeline and the conversation).
#[derive(Debug, Default)]
pub struct Collector {
    updates: Vec<(String, Vec<u8>)>,
    /// The stream's creation named another executor than the agent's: nothing is kept (a
    /// long-running tool's millions of updates are not a conversation).
    not_a_run: bool,
}

impl Collector {
    /// Takes one record of the run's stream.
    pub fn add(&mut self, record: &Record) {
        match &record.event {
            Event::Created { spec, .. } | Event::CreatedV2 { spec, .. } => {
                self.not_a_run = spec.executor_key != AGENT_EXECUTOR_KEY;
            }
            Event::UpdateAppended { kind, data, .. } if !self.not_a_run => {
                self.updates.push((kind.clone(), data.clone()));
            }
            _ => {}
        }
    }

    /// The run's conversation, when `state` is an agent run's (`None` for another task).
    /// Entries that do not fold make a conversation that says why.
    ///
    /// # Errors
    /// The journal's, reading the tasks of the run's tool calls.
    pub fn conversation(
        self,
        journal: &Journal,
        state: &TaskState,
    ) -> Result<Option<Conversation>, dtask_journal::Error> {
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
        // Each call's status is its task folded whole: bounded by records over the run, as a
        // page of the task list is, so that a run of long tool streams costs no more.
        let mut budget = STATUS_RECORD_BUDGET;
        for turn in transcript.turns() {
            for call in &turn.calls {
                let status = match journal.stream_len(&call.task_id)? {
                    Some(len) if len <= budget => {
                        budget -= len;
                        FoldView::read(journal, &call.task_id, |_| {})?
                            .task
                            .map(|t| t.state.status.as_str().to_owned())
                    }
                    Some(_) | None => None,
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

/// The records a conversation folds at most for its calls' statuses: past them a call's
/// `task_status` is not given (the task's own reads give it).
const STATUS_RECORD_BUDGET: u64 = 50_000;

/// A run's conversation, with the status of each call's task (in call order).
#[derive(Debug)]
pub struct Conversation {
    transcript: Option<Transcript>,
    problem: Option<String>,
    call_status: Vec<Option<String>>,
}

/// A run's conversation for machines (`dtask show --json`'s `conversation`, `GET
/// /api/tasks/{id}/conversation`).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ConversationView {
    /// Why the run's entries do not fold (then nothing else is set).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
    /// The run's step limit (model calls).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_steps: Option<u32>,
    /// Whether the run is interactive: it waits for the next message after each answer
    /// until it is closed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interactive: Option<bool>,
    /// The opening conversation (chat messages: `role`, `content`, …).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Vec<Object>>)]
    pub messages: Option<Vec<serde_json::Value>>,
    /// The model's answers, in order.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub turns: Option<Vec<TurnView>>,
    /// The messages sent to the run that it took, in order.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sent_messages: Option<Vec<SentMessageView>>,
    /// The tokens of every turn, as far as the model reported them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<UsageView>,
}

/// One model answer.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TurnView {
    /// Its number (1 for the first model call).
    pub turn: u32,
    /// Its text, if any.
    pub content: Option<String>,
    /// What it cost, when the model said.
    pub usage: Option<UsageView>,
    /// The tool calls it asked for.
    pub calls: Vec<CallView>,
}

/// One tool call of a turn.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct CallView {
    /// Its place in the turn (0-based).
    pub index: u32,
    /// The model's id of the call.
    pub tool_call_id: String,
    /// The tool's name.
    pub tool: String,
    /// The arguments, as the model wrote them.
    pub arguments: String,
    /// The call's task.
    pub task_id: String,
    /// That task's status (`null`: no such task — refused, or not created yet — or the run's
    /// calls' tasks already folded 50,000 records for this view).
    pub task_status: Option<String>,
    /// The journaled result, once the call's task ended.
    pub result: Option<CallResultView>,
}

/// A tool call's journaled result.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct CallResultView {
    /// `completed`, `failed`, `canceled` or `refused`.
    pub status: String,
    /// What the model is told.
    pub content: String,
}

/// A message sent to the run, where it took it.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct SentMessageView {
    /// The input's sequence in the run's mailbox.
    pub sequence: u64,
    /// The turn the model saw it after (0: before the first).
    pub after_turn: u32,
    /// The text.
    pub content: String,
}

/// Tokens, as the model reported them.
#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
pub struct UsageView {
    /// Prompt tokens.
    pub prompt_tokens: u64,
    /// Completion tokens.
    pub completion_tokens: u64,
    /// Both.
    pub total_tokens: u64,
}

impl From<Usage> for UsageView {
    fn from(u: Usage) -> Self {
        Self {
            prompt_tokens: u.prompt_tokens,
            completion_tokens: u.completion_tokens,
            total_tokens: u.total_tokens,
        }
    }
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
    /// The conversation of task `id` as the journal has it: `None` for an unknown task or
    /// one that is not an agent run.
    ///
    /// # Errors
    /// The journal's.
    pub fn read(journal: &Journal, id: &str) -> Result<Option<Self>, dtask_journal::Error> {
        if journal.stream_len(id)?.is_none() {
            return Ok(None);
        }
        let mut collector = Collector::default();
        let folded = FoldView::read(journal, id, |r| collector.add(r))?;
        match &folded.task {
            Some(task) => collector.conversation(journal, &task.state),
            None => Ok(None),
        }
    }

    /// For humans.
    #[must_use]
    pub fn text(&self) -> String {
        let Some(t) = &self.transcript else {
            return format!(
                "\nconversation: does not fold: {}\n",
                self.problem.as_deref().unwrap_or("")
            );
        };
        let reported = t.turns().iter().any(|turn| turn.usage.is_some());
        let mut out = format!(
            "\n{}conversation ({} turns of at most {}, {})\n",
            if t.payload().interactive {
                "interactive "
            } else {
                ""
            },
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
    #[must_use]
    pub fn view(&self) -> ConversationView {
        let Some(t) = &self.transcript else {
            return ConversationView {
                problem: self.problem.clone(),
                max_steps: None,
                interactive: None,
                messages: None,
                turns: None,
                sent_messages: None,
                usage: None,
            };
        };
        let mut statuses = self.call_status.iter();
        let turns = t
            .turns()
            .iter()
            .map(|turn| TurnView {
                turn: turn.number,
                content: turn.message.content.clone(),
                usage: turn.usage.map(UsageView::from),
                calls: turn
                    .calls
                    .iter()
                    .map(|call| CallView {
                        index: call.index,
                        tool_call_id: call.call.id.clone(),
                        tool: call.call.function.name.clone(),
                        arguments: call.call.function.arguments.clone(),
                        task_id: call.task_id.clone(),
                        task_status: statuses.next().cloned().flatten(),
                        result: call.result.as_ref().map(|r| CallResultView {
                            status: r.status.as_str().to_owned(),
                            content: r.content.clone(),
                        }),
                    })
                    .collect(),
            })
            .collect();
        ConversationView {
            problem: None,
            max_steps: Some(t.payload().max_steps),
            interactive: Some(t.payload().interactive),
            messages: Some(t.payload().messages.iter().map(message_json).collect()),
            turns: Some(turns),
            sent_messages: Some(
                t.sent_messages()
                    .iter()
                    .map(|m| SentMessageView {
                        sequence: m.sequence,
                        after_turn: m.after_turn,
                        content: m.content.clone(),
                    })
                    .collect(),
            ),
            usage: Some(t.usage().into()),
        }
    }
}

fn message_json(m: &Message) -> serde_json::Value {
    serde_json::to_value(m).unwrap_or(serde_json::Value::Null)
}

#[cfg(test)]
mod tests {
    use super::Collector;
    use dtask_engine::agent::AGENT_EXECUTOR_KEY;
    use dtask_journal::{Event, Journal, JournalOptions, LeasePolicy, TaskSpec, Timestamp};

    /// The updates a collector keeps of a stream created for `executor` (by a `created`
    /// record, or with `nested`, a nested task's `created_v2`).
    fn kept(executor: &str, nested: bool) -> usize {
        let dir = tempfile::tempdir().unwrap();
        let journal = Journal::open(dir.path(), JournalOptions::default()).unwrap();
        let spec = TaskSpec::new("t", executor);
        let created = if nested {
            Event::CreatedV2 {
                spec: spec.into(),
                policy: LeasePolicy::Retry,
                checkpoint: vec![],
                context_snapshot: vec![],
                publication: dtask_journal::Publication::OnCreate,
                parent_task_id: "run".into(),
                root_session_id: String::new(),
                at: Timestamp(1),
            }
        } else {
            Event::created(spec, LeasePolicy::Retry, Timestamp(1))
        };
        let mut events = vec![created];
        events.extend((0..3).map(|i| Event::UpdateAppended {
            attempt: 1,
            event_id: format!("e{i}"),
            kind: "stdout".into(),
            data: vec![b'x'; 10],
            metadata: vec![],
            at: Timestamp(2),
        }));
        journal.append("t", 0, &events).unwrap();
        let mut collector = Collector::default();
        for record in journal.read_stream("t", 0) {
            collector.add(&record.unwrap());
        }
        collector.updates.len()
    }

    #[test]
    fn a_collector_keeps_the_updates_of_an_agent_run_only() {
        assert_eq!(kept(AGENT_EXECUTOR_KEY, false), 3);
        assert_eq!(
            kept("shell", false),
            0,
            "a tool's progress is not a conversation"
        );
        // An agent's tool call is a nested task: created by `created_v2`.
        assert_eq!(
            kept("shell", true),
            0,
            "a tool call's progress is not a conversation"
        );
    }
}
