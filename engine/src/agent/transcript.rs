//! The transcript of an agent run: a pure fold over its payload and its journaled entries,
//! used alike by a live attempt, by the next attempt after a crash, and by `dtask show`.

use super::codec::{
    call_task_id, decode_entry, AgentAnswer, AgentPayload, MessageEntry, ToolResultEntry,
    TurnEntry, MESSAGE_KIND, TOOL_RESULT_KIND, TURN_KIND,
};
use super::error::AgentError;
use crate::tool::{AssistantMessage, Message, ToolCall, ToolMessage, Usage};

/// One model call of a run and the tool calls it asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Turn {
    /// The turn's number (1 for the first model call).
    pub number: u32,
    /// What the model answered.
    pub message: AssistantMessage,
    /// What it cost, when the model said.
    pub usage: Option<Usage>,
    /// Its tool calls, in the order the model gave them.
    pub calls: Vec<Call>,
}

/// One tool call of a turn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    /// The call's place in its turn (0-based).
    pub index: u32,
    /// What the model asked for.
    pub call: ToolCall,
    /// The id of the call's child task (fixed by its place: [`call_task_id`]).
    pub task_id: String,
    /// Its result, once journaled.
    pub result: Option<ToolResultEntry>,
}

/// What an attempt does next, as the transcript says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// Ask the model for turn `turn`.
    CallModel {
        /// The turn's number.
        turn: u32,
    },
    /// Run the tool calls of turn `turn` that have no result yet.
    RunTools {
        /// The turn's number.
        turn: u32,
        /// The indexes of the calls without a result.
        pending: Vec<u32>,
    },
    /// The run is over: the model answered without tool calls (and no message came after).
    Finish(AgentAnswer),
    /// The step limit is reached and the last answer still asked for tools.
    StepLimit {
        /// The limit.
        max_steps: u32,
    },
}

/// The folded run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transcript {
    task_id: String,
    payload: AgentPayload,
    turns: Vec<Turn>,
    messages: Vec<MessageEntry>,
}

impl Transcript {
    /// The transcript of run `task_id` before its first entry.
    #[must_use]
    pub fn new(task_id: impl Into<String>, payload: AgentPayload) -> Self {
        Self {
            task_id: task_id.into(),
            payload,
            turns: Vec::new(),
            messages: Vec::new(),
        }
    }

    /// Folds the entries of run `task_id` (its updates as `(kind, data)`, in journal order;
    /// updates of other kinds are skipped).
    ///
    /// # Errors
    /// [`AgentError::InvalidEntry`] or [`AgentError::Fold`] for entries that do not make a
    /// run.
    pub fn fold<'a>(
        task_id: impl Into<String>,
        payload: AgentPayload,
        updates: impl IntoIterator<Item = (&'a str, &'a [u8])>,
    ) -> Result<Self, AgentError> {
        let mut transcript = Self::new(task_id, payload);
        for (kind, data) in updates {
            transcript.apply(kind, data)?;
        }
        Ok(transcript)
    }

    /// Applies one update of the run (other kinds are skipped).
    ///
    /// # Errors
    /// As for [`Transcript::fold`].
    pub fn apply(&mut self, kind: &str, data: &[u8]) -> Result<(), AgentError> {
        match kind {
            TURN_KIND => self.push_turn(decode_entry("turn", data)?),
            TOOL_RESULT_KIND => self.push_result(decode_entry("tool result", data)?),
            MESSAGE_KIND => self.push_message(decode_entry("message", data)?),
            _ => Ok(()),
        }
    }

    /// Adds a model answer: the next turn, after every call of the one before has a result.
    ///
    /// # Errors
    /// [`AgentError::Fold`] when it is not the next turn.
    pub fn push_turn(&mut self, entry: TurnEntry) -> Result<(), AgentError> {
        let expected = self.next_turn_number();
        if entry.turn != expected {
            return Err(AgentError::Fold(format!(
                "turn {} where turn {expected} was due",
                entry.turn
            )));
        }
        if let Some(last) = self.turns.last() {
            if last.calls.iter().any(|c| c.result.is_none()) {
                return Err(AgentError::Fold(format!(
                    "turn {} before every call of turn {} had a result",
                    entry.turn, last.number
                )));
            }
        }
        if self.turns.len() >= self.payload.max_steps as usize {
            return Err(AgentError::Fold(format!(
                "turn {} past the step limit of {}",
                entry.turn, self.payload.max_steps
            )));
        }
        let calls = entry
            .message
            .tool_calls
            .iter()
            .zip(0u32..)
            .map(|(call, index)| Call {
                index,
                call: call.clone(),
                task_id: call_task_id(&self.task_id, entry.turn, index),
                result: None,
            })
            .collect();
        self.turns.push(Turn {
            number: entry.turn,
            message: entry.message,
            usage: entry.usage,
            calls,
        });
        Ok(())
    }

    /// Adds a tool call's result.
    ///
    /// # Errors
    /// [`AgentError::Fold`] for a result of a call the last turn did not ask for, or a
    /// second result of a call.
    pub fn push_result(&mut self, entry: ToolResultEntry) -> Result<(), AgentError> {
        let Some(turn) = self.turns.last_mut().filter(|t| t.number == entry.turn) else {
            return Err(AgentError::Fold(format!(
                "a result for turn {}, which is not the last turn",
                entry.turn
            )));
        };
        let Some(call) = turn.calls.get_mut(entry.index as usize) else {
            return Err(AgentError::Fold(format!(
                "a result for call {} of turn {}, which asked for {}",
                entry.index,
                entry.turn,
                turn.calls.len()
            )));
        };
        if call.call.id != entry.tool_call_id {
            return Err(AgentError::Fold(format!(
                "the result of call {}.{} names call {:?}, not {:?}",
                entry.turn, entry.index, entry.tool_call_id, call.call.id
            )));
        }
        if call.result.is_some() {
            return Err(AgentError::Fold(format!(
                "a second result for call {}.{}",
                entry.turn, entry.index
            )));
        }
        call.result = Some(entry);
        Ok(())
    }

    /// Adds a message sent to the run, taken after the last turn.
    ///
    /// # Errors
    /// [`AgentError::Fold`] unless the run takes messages now
    /// ([`Transcript::takes_messages`]), the entry follows the last turn and its sequence
    /// follows the last message's.
    pub fn push_message(&mut self, entry: MessageEntry) -> Result<(), AgentError> {
        let last_turn = self.turns.last().map_or(0, |t| t.number);
        if entry.after_turn != last_turn {
            return Err(AgentError::Fold(format!(
                "message {} after turn {} where turn {last_turn} is the last",
                entry.sequence, entry.after_turn
            )));
        }
        if !self.takes_messages() {
            return Err(AgentError::Fold(format!(
                "message {} while turn {last_turn} waits for results or at the step limit",
                entry.sequence
            )));
        }
        if entry.sequence <= self.last_message_sequence() {
            return Err(AgentError::Fold(format!(
                "message {} after message {}",
                entry.sequence,
                self.last_message_sequence()
            )));
        }
        self.messages.push(entry);
        Ok(())
    }

    /// Whether a message sent to the run can be taken now: every call of the last turn has
    /// its result and another model call is within the step limit.
    #[must_use]
    pub fn takes_messages(&self) -> bool {
        let answered = self
            .turns
            .last()
            .is_none_or(|t| t.calls.iter().all(|c| c.result.is_some()));
        answered && self.turns.len() < self.payload.max_steps as usize
    }

    /// How many entries of the run's journal the transcript holds: turns, tool results and
    /// messages taken (a measure of how far the run has got).
    #[must_use]
    pub fn entries(&self) -> usize {
        let results: usize = self
            .turns
            .iter()
            .map(|t| t.calls.iter().filter(|c| c.result.is_some()).count())
            .sum();
        self.turns.len() + results + self.messages.len()
    }

    /// The mailbox sequence of the last message taken (0: none).
    #[must_use]
    pub fn last_message_sequence(&self) -> u64 {
        self.messages.last().map_or(0, |m| m.sequence)
    }

    /// The messages sent to the run that it took, in the order it took them.
    #[must_use]
    pub fn sent_messages(&self) -> &[MessageEntry] {
        &self.messages
    }

    fn next_turn_number(&self) -> u32 {
        self.turns.last().map_or(1, |t| t.number + 1)
    }

    /// The run's task id.
    #[must_use]
    pub fn task_id(&self) -> &str {
        &self.task_id
    }

    /// The payload the run started from.
    #[must_use]
    pub fn payload(&self) -> &AgentPayload {
        &self.payload
    }

    /// The turns so far.
    #[must_use]
    pub fn turns(&self) -> &[Turn] {
        &self.turns
    }

    /// The conversation as the model sees it: the opening messages, then each answer
    /// followed by the tool messages of its calls that have a result, with the messages sent
    /// to the run as user messages where it took them.
    #[must_use]
    pub fn messages(&self) -> Vec<Message> {
        let mut messages = self.payload.messages.clone();
        let mut sent = self.messages.iter().peekable();
        let mut take_sent = |messages: &mut Vec<Message>, after: u32| {
            while let Some(m) = sent.next_if(|m| m.after_turn == after) {
                messages.push(Message::user(m.content.clone()));
            }
        };
        take_sent(&mut messages, 0);
        for turn in &self.turns {
            messages.push(Message::Assistant(turn.message.clone()));
            for call in &turn.calls {
                if let Some(result) = &call.result {
                    messages.push(Message::Tool(ToolMessage::new(
                        call.call.id.clone(),
                        result.content.clone(),
                    )));
                }
            }
            take_sent(&mut messages, turn.number);
        }
        messages
    }

    /// The tokens of every turn, as far as the model reported them.
    #[must_use]
    pub fn usage(&self) -> Usage {
        self.turns
            .iter()
            .filter_map(|t| t.usage)
            .fold(Usage::default(), Usage::plus)
    }

    /// The run's latest final answer (a turn without tool calls), if any: what an
    /// interactive run waiting for its next message last said.
    #[must_use]
    pub fn latest_answer(&self) -> Option<AgentAnswer> {
        let turn = self.turns.iter().rev().find(|t| t.calls.is_empty())?;
        Some(AgentAnswer::new(
            turn.message.clone(),
            turn.number,
            self.usage(),
        ))
    }

    /// What to do next.
    #[must_use]
    pub fn next(&self) -> Next {
        let Some(last) = self.turns.last() else {
            return Next::CallModel { turn: 1 };
        };
        let told_since = self
            .messages
            .last()
            .is_some_and(|m| m.after_turn == last.number);
        if last.calls.is_empty() && !told_since {
            return Next::Finish(AgentAnswer::new(
                last.message.clone(),
                last.number,
                self.usage(),
            ));
        }
        let pending: Vec<u32> = last
            .calls
            .iter()
            .filter(|c| c.result.is_none())
            .map(|c| c.index)
            .collect();
        if !pending.is_empty() {
            return Next::RunTools {
                turn: last.number,
                pending,
            };
        }
        if self.turns.len() >= self.payload.max_steps as usize {
            return Next::StepLimit {
                max_steps: self.payload.max_steps,
            };
        }
        Next::CallModel {
            turn: last.number + 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::codec::CallStatus;

    fn payload(max_steps: u32) -> AgentPayload {
        AgentPayload::new(vec![Message::user("2 + 3?")], max_steps).unwrap()
    }

    fn asks(turn: u32, ids: &[&str]) -> TurnEntry {
        TurnEntry::new(
            turn,
            AssistantMessage::with_tool_calls(
                ids.iter()
                    .map(|id| ToolCall::function(*id, "add", r#"{"a":2,"b":3}"#))
                    .collect(),
            ),
            None,
        )
    }

    fn result(turn: u32, index: u32, id: &str) -> ToolResultEntry {
        ToolResultEntry {
            version: 1,
            turn,
            index,
            tool_call_id: id.into(),
            task_id: Some(call_task_id("a", turn, index)),
            status: CallStatus::Completed,
            content: "5".into(),
        }
    }

    #[test]
    fn a_run_folds_turn_by_turn() {
        let mut t = Transcript::new("a", payload(4));
        assert_eq!(t.next(), Next::CallModel { turn: 1 });
        t.push_turn(asks(1, &["x", "y"])).unwrap();
        assert_eq!(
            t.next(),
            Next::RunTools {
                turn: 1,
                pending: vec![0, 1]
            }
        );
        assert_eq!(t.turns()[0].calls[1].task_id, "a.t1.c1");
        t.push_result(result(1, 1, "y")).unwrap();
        assert_eq!(
            t.next(),
            Next::RunTools {
                turn: 1,
                pending: vec![0]
            }
        );
        t.push_result(result(1, 0, "x")).unwrap();
        assert_eq!(t.next(), Next::CallModel { turn: 2 });
        let final_turn = TurnEntry::new(
            2,
            AssistantMessage::text("5"),
            Some(Usage {
                prompt_tokens: 1,
                completion_tokens: 1,
                total_tokens: 2,
            }),
        );
        t.push_turn(final_turn).unwrap();
        let Next::Finish(answer) = t.next() else {
            panic!("not finished: {:?}", t.next())
        };
        assert_eq!(answer.steps, 2);
        assert_eq!(answer.usage.total_tokens, 2);
        // Tool messages follow their answer in call order, whatever order results came in.
        let roles: Vec<_> = t.messages().iter().map(Message::role).collect();
        assert_eq!(roles, ["user", "assistant", "tool", "tool", "assistant"]);
        assert_eq!(t.messages()[2], Message::tool("x", "5"));
    }

    #[test]
    fn entries_out_of_order_do_not_fold() {
        let mut t = Transcript::new("a", payload(4));
        assert!(matches!(
            t.push_turn(asks(2, &["x"])),
            Err(AgentError::Fold(_))
        ));
        t.push_turn(asks(1, &["x"])).unwrap();
        assert!(matches!(
            t.push_turn(asks(2, &["z"])),
            Err(AgentError::Fold(_))
        ));
        assert!(matches!(
            t.push_result(result(1, 3, "x")),
            Err(AgentError::Fold(_))
        ));
        assert!(matches!(
            t.push_result(result(1, 0, "other")),
            Err(AgentError::Fold(_))
        ));
        t.push_result(result(1, 0, "x")).unwrap();
        assert!(matches!(
            t.push_result(result(1, 0, "x")),
            Err(AgentError::Fold(_))
        ));
    }

    #[test]
    fn messages_sent_to_the_run_follow_the_turn_they_were_taken_after() {
        let mut t = Transcript::new("a", payload(3));
        assert!(t.takes_messages());
        t.push_message(MessageEntry::new(1, 0, "in euros, please"))
            .unwrap();
        t.push_turn(asks(1, &["x"])).unwrap();
        // Not while the turn's calls wait for their results: the model needs them first.
        assert!(!t.takes_messages());
        assert!(matches!(
            t.push_message(MessageEntry::new(2, 1, "hurry")),
            Err(AgentError::Fold(_))
        ));
        t.push_result(result(1, 0, "x")).unwrap();
        // Not after another turn than the last, nor a sequence taken already.
        assert!(matches!(
            t.push_message(MessageEntry::new(3, 0, "late")),
            Err(AgentError::Fold(_))
        ));
        assert!(matches!(
            t.push_message(MessageEntry::new(1, 1, "again")),
            Err(AgentError::Fold(_))
        ));
        t.push_message(MessageEntry::new(3, 1, "hurry")).unwrap();
        assert_eq!(t.next(), Next::CallModel { turn: 2 });
        t.push_turn(TurnEntry::new(2, AssistantMessage::text("5 EUR"), None))
            .unwrap();
        assert!(matches!(t.next(), Next::Finish(_)));
        // A message after the final answer asks the model again.
        t.push_message(MessageEntry::new(4, 2, "and in yen?"))
            .unwrap();
        assert_eq!(t.next(), Next::CallModel { turn: 3 });
        let roles: Vec<_> = t.messages().iter().map(Message::role).collect();
        assert_eq!(
            roles,
            [
                "user",
                "user",
                "assistant",
                "tool",
                "user",
                "assistant",
                "user"
            ]
        );
        assert_eq!(t.messages()[1], Message::user("in euros, please"));
        assert_eq!(t.messages()[6], Message::user("and in yen?"));
        assert_eq!(t.last_message_sequence(), 4);
        assert_eq!(t.sent_messages().len(), 3);
        t.push_turn(TurnEntry::new(3, AssistantMessage::text("750 JPY"), None))
            .unwrap();
        // At the step limit the run takes no message: no model call could answer it.
        assert!(!t.takes_messages());
        assert!(matches!(
            t.push_message(MessageEntry::new(5, 3, "and in CHF?")),
            Err(AgentError::Fold(_))
        ));
        assert!(matches!(t.next(), Next::Finish(_)));
    }

    #[test]
    fn the_step_limit_ends_a_run_after_its_tools_ran() {
        let mut t = Transcript::new("a", payload(1));
        t.push_turn(asks(1, &["x"])).unwrap();
        assert!(matches!(t.next(), Next::RunTools { .. }));
        t.push_result(result(1, 0, "x")).unwrap();
        assert_eq!(t.next(), Next::StepLimit { max_steps: 1 });
        assert!(matches!(
            t.push_turn(asks(2, &["y"])),
            Err(AgentError::Fold(_))
        ));
    }
}
