//! The durable agent's persisted formats: the task payload, the journal entries of its run
//! (one progress update each) and the result of a finished run. All are versioned JSON; the
//! store treats them as opaque bytes.

use super::error::AgentError;
use crate::tool::{AssistantMessage, Message, Usage};
use serde::{de::DeserializeOwned, Deserialize, Serialize};

/// The executor key of durable agent runs (lease policy retry, drain by yield).
pub const AGENT_EXECUTOR_KEY: &str = "dtask.dev/agent";
/// The task kind of durable agent runs.
pub const AGENT_TASK_KIND: &str = "agent";
/// The update kind of a journaled model answer ([`TurnEntry`]).
pub const TURN_KIND: &str = "agent.turn";
/// The update kind of a journaled tool-call result ([`ToolResultEntry`]).
pub const TOOL_RESULT_KIND: &str = "agent.tool_result";
/// The kind of a message sent to a running run — an input of its mailbox, the data the
/// message's text in UTF-8 — and of the update that journals it ([`MessageEntry`]).
pub const MESSAGE_KIND: &str = "agent.message";
/// The kind of an input that closes an interactive run: once it has answered every message
/// sent before, the run completes with its last answer.
pub const CLOSE_KIND: &str = "agent.close";
/// The most model calls one run may be given.
pub const MAX_AGENT_STEPS: u32 = 1_000;

/// The one version of every format here (but an interactive run's payload).
const VERSION: u32 = 1;
/// The version of an interactive run's payload: a build that reads only version 1 refuses
/// it rather than run it as a run that ends at its first answer.
const INTERACTIVE_VERSION: u32 = 2;

/// What an agent run is asked: the opening conversation, its step limit, and whether it
/// waits for the next message after each answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentPayload {
    /// The format version: 1, or 2 for an interactive run.
    pub version: u32,
    /// The conversation the run starts from (a system and a user message, typically).
    pub messages: Vec<Message>,
    /// The most model calls the run may make (1 to [`MAX_AGENT_STEPS`]).
    pub max_steps: u32,
    /// Whether the run, after each final answer, waits for the next message (status
    /// `waiting_input`) rather than complete; an input of kind [`CLOSE_KIND`] ends it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub interactive: bool,
}

impl AgentPayload {
    /// A payload of `messages` with `max_steps`, checked.
    ///
    /// # Errors
    /// [`AgentError::EmptyConversation`], [`AgentError::InvalidMaxSteps`].
    pub fn new(messages: Vec<Message>, max_steps: u32) -> Result<Self, AgentError> {
        let payload = Self {
            version: VERSION,
            messages,
            max_steps,
            interactive: false,
        };
        payload.check()?;
        Ok(payload)
    }

    /// The payload of an interactive run (version 2): see [`AgentPayload::interactive`].
    #[must_use]
    pub fn into_interactive(mut self) -> Self {
        self.version = INTERACTIVE_VERSION;
        self.interactive = true;
        self
    }

    fn check(&self) -> Result<(), AgentError> {
        let expected = if self.interactive {
            INTERACTIVE_VERSION
        } else {
            VERSION
        };
        if self.version != expected {
            return Err(AgentError::UnsupportedVersion(self.version));
        }
        if self.messages.is_empty() {
            return Err(AgentError::EmptyConversation);
        }
        if self.max_steps == 0 || self.max_steps > MAX_AGENT_STEPS {
            return Err(AgentError::InvalidMaxSteps {
                max_steps: self.max_steps,
                max: MAX_AGENT_STEPS,
            });
        }
        Ok(())
    }

    /// The JSON bytes.
    #[must_use]
    pub fn encode(&self) -> Vec<u8> {
        encode(self)
    }

    /// Reads and checks a payload.
    ///
    /// # Errors
    /// [`AgentError::InvalidPayload`], and the checks of [`AgentPayload::new`].
    pub fn decode(bytes: &[u8]) -> Result<Self, AgentError> {
        let payload: Self =
            serde_json::from_slice(bytes).map_err(|e| AgentError::InvalidPayload(e.to_string()))?;
        payload.check()?;
        Ok(payload)
    }
}

/// One model answer, journaled before any of its tool calls runs (update kind
/// [`TURN_KIND`], event id `turn-<turn>`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TurnEntry {
    /// The format version (1).
    pub version: u32,
    /// The turn's number: 1 for the first model call.
    pub turn: u32,
    /// What the model answered.
    pub message: AssistantMessage,
    /// What it cost, when the model said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

impl TurnEntry {
    /// The entry of turn `turn`.
    #[must_use]
    pub fn new(turn: u32, message: AssistantMessage, usage: Option<Usage>) -> Self {
        Self {
            version: VERSION,
            turn,
            message,
            usage,
        }
    }

    /// The update's event id: `turn-<turn>`.
    #[must_use]
    pub fn event_id(&self) -> String {
        format!("turn-{}", self.turn)
    }

    /// The entry, made to fit an update of `max_bytes` once in JSON: a model's answer may
    /// take more (a tool call writing a large file: its arguments are escaped twice). The
    /// largest part goes first, again and again until the entry fits: the text, cut as
    /// [`MessageEntry::within`] cuts a message's, or a tool call's arguments, replaced by a
    /// note of their length ([`cut_arguments`] reads it: such a call is refused, its tool
    /// never run, and the model told why). Arguments no longer than the note are never
    /// replaced. An answer of so many calls that even that does not fit stays as it is (the
    /// store refuses it, and the run fails).
    #[must_use]
    pub fn within(mut self, max_bytes: usize) -> Self {
        let note_len = |len: usize| format!("{CUT_ARGUMENTS}{len}{CUT_ARGUMENTS_END}").len();
        let mut text_cut = false;
        while encode(&self).len() > max_bytes {
            let largest = self
                .message
                .tool_calls
                .iter()
                .enumerate()
                .map(|(i, c)| (c.function.arguments.len(), i))
                .filter(|&(len, _)| len > note_len(len))
                .max();
            let text = self.message.content.as_ref().map_or(0, String::len);
            match largest {
                Some((len, i)) if text_cut || len > text => {
                    self.message.tool_calls[i].function.arguments =
                        format!("{CUT_ARGUMENTS}{len}{CUT_ARGUMENTS_END}");
                }
                _ if !text_cut && text > 0 => {
                    text_cut = true;
                    self = cut_to_fit(
                        self,
                        |e| e.message.content.get_or_insert_with(String::new),
                        "answer",
                        max_bytes,
                    );
                }
                _ => break,
            }
        }
        self
    }
}

/// What a turn's tool call carries in place of arguments too large for the run's journal:
/// this, their length, then [`CUT_ARGUMENTS_END`] ([`TurnEntry::within`]).
const CUT_ARGUMENTS: &str = "[…arguments cut: they had ";
const CUT_ARGUMENTS_END: &str = " bytes]";

/// The length of the arguments a tool call had before [`TurnEntry::within`] cut them, if it
/// did: such a call is refused, never run.
///
/// ```
/// use dtask_engine::agent::cut_arguments;
/// assert_eq!(cut_arguments("[…arguments cut: they had 3012 bytes]"), Some(3012));
/// assert_eq!(cut_arguments(r#"{"a":1}"#), None);
/// ```
#[must_use]
pub fn cut_arguments(arguments: &str) -> Option<usize> {
    arguments
        .strip_prefix(CUT_ARGUMENTS)?
        .strip_suffix(CUT_ARGUMENTS_END)?
        .parse()
        .ok()
}

/// How a tool call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum CallStatus {
    /// Its task completed; the content is the tool's output.
    Completed,
    /// Its task failed; the content is `Error: <error>`.
    Failed,
    /// Its task was canceled; the content is `Canceled: <reason>`.
    Canceled,
    /// No task was created: the tool does not exist or refused the arguments; the content
    /// is `Error: <why>`, so the model can correct itself.
    Refused,
}

impl CallStatus {
    /// The status as written (`completed`, `failed`, `canceled`, `refused`).
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Canceled => "canceled",
            Self::Refused => "refused",
        }
    }
}

/// The result of one tool call, journaled once its task ended (update kind
/// [`TOOL_RESULT_KIND`], event id `result-<turn>.<index>`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolResultEntry {
    /// The format version (1).
    pub version: u32,
    /// The turn whose answer asked for the call.
    pub turn: u32,
    /// The call's place among the turn's tool calls (0-based).
    pub index: u32,
    /// The model's id of the call.
    pub tool_call_id: String,
    /// The call's task (`None` when it was refused before one was created).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_id: Option<String>,
    /// How it ended.
    pub status: CallStatus,
    /// What the model is told (the tool message's content).
    pub content: String,
}

impl ToolResultEntry {
    /// The update's event id: `result-<turn>.<index>`.
    #[must_use]
    pub fn event_id(&self) -> String {
        format!("result-{}.{}", self.turn, self.index)
    }
}

/// A message sent to the run while it ran (an input of kind [`MESSAGE_KIND`]), journaled
/// when the run took it: the model sees it as a user message after the tool results of
/// turn `after_turn` (update kind [`MESSAGE_KIND`], event id `message-<sequence>`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MessageEntry {
    /// The format version (1).
    pub version: u32,
    /// The input's sequence in the run's mailbox.
    pub sequence: u64,
    /// The turn it follows (0: before the first model call).
    pub after_turn: u32,
    /// The text (the input's bytes; any that are not UTF-8 replaced by U+FFFD).
    pub content: String,
}

impl MessageEntry {
    /// The entry of the input `sequence`, taken after turn `after_turn`.
    #[must_use]
    pub fn new(sequence: u64, after_turn: u32, content: impl Into<String>) -> Self {
        Self {
            version: VERSION,
            sequence,
            after_turn,
            content: content.into(),
        }
    }

    /// The update's event id: `message-<sequence>`.
    #[must_use]
    pub fn event_id(&self) -> String {
        format!("message-{}", self.sequence)
    }

    /// The entry, its content cut so that its JSON takes at most `max_bytes` (the store's
    /// limit of an update's data), a note of the original length at the cut: an input may
    /// take the whole limit, and its JSON (escapes, replaced bytes) can take more. The cut
    /// is the longest prefix, on a character boundary, that fits.
    #[must_use]
    pub fn within(self, max_bytes: usize) -> Self {
        cut_to_fit(self, |e| &mut e.content, "message", max_bytes)
    }
}

impl ToolResultEntry {
    /// The entry, its content cut as [`MessageEntry::within`] cuts a message's: a tool's
    /// output may take up to the store's limit of a task's result, and its JSON here (escapes,
    /// replaced bytes) more than the limit of an update — the model is told the cut, and the
    /// run goes on.
    #[must_use]
    pub fn within(self, max_bytes: usize) -> Self {
        cut_to_fit(self, |e| &mut e.content, "result", max_bytes)
    }
}

/// `entry` with its text (`text` names it) cut so that the entry's JSON takes at most
/// `max_bytes`, a note of the original length at the cut (`[…what cut: its text had N
/// bytes]`). The cut is the longest prefix, on a character boundary, that fits; where not
/// even the note fits (a limit of a few dozen bytes), the text is dropped whole.
fn cut_to_fit<T: Serialize>(
    mut entry: T,
    text: fn(&mut T) -> &mut String,
    what: &str,
    max_bytes: usize,
) -> T {
    if text(&mut entry).is_empty() || encode(&entry).len() <= max_bytes {
        return entry;
    }
    let content = std::mem::take(text(&mut entry));
    let note = format!(" […{what} cut: its text had {} bytes]", content.len());
    let fits = |keep: usize, entry: &mut T| {
        *text(entry) = format!("{}{note}", &content[..keep]);
        encode(&*entry).len() <= max_bytes
    };
    // The places a cut may fall (character boundaries); the search keeps the last that fits.
    let cuts: Vec<usize> = content.char_indices().map(|(i, _)| i).collect();
    if !fits(0, &mut entry) {
        text(&mut entry).clear();
        return entry;
    }
    let (mut lo, mut hi) = (0, cuts.len() - 1);
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if fits(cuts[mid], &mut entry) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    let _ = fits(cuts[lo], &mut entry);
    entry
}

/// What a finished run completes with (the task's result data).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentAnswer {
    /// The format version (1).
    pub version: u32,
    /// The final assistant message (without tool calls).
    pub answer: AssistantMessage,
    /// How many model calls the run made.
    pub steps: u32,
    /// The tokens of all its model calls, as far as the model reported them.
    pub usage: Usage,
}

impl AgentAnswer {
    /// The JSON bytes.
    #[must_use]
    pub fn encode(&self) -> Vec<u8> {
        encode(self)
    }

    /// Reads a completed run's result data.
    ///
    /// # Errors
    /// [`AgentError::InvalidEntry`] when the bytes are not an answer of version 1.
    pub fn decode(bytes: &[u8]) -> Result<Self, AgentError> {
        let answer: Self = decode_entry("answer", bytes)?;
        Ok(answer)
    }

    pub(crate) fn new(answer: AssistantMessage, steps: u32, usage: Usage) -> Self {
        Self {
            version: VERSION,
            answer,
            steps,
            usage,
        }
    }
}

/// The id of the child task of tool call `index` of turn `turn` of the run `agent`:
/// `<agent>.t<turn>.c<index>`. Fixed by the call's place, so a later attempt finds the task
/// an earlier one created.
#[must_use]
pub fn call_task_id(agent: &str, turn: u32, index: u32) -> String {
    format!("{agent}.t{turn}.c{index}")
}

fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    // These types hold strings, numbers and messages only: serializing them cannot fail.
    serde_json::to_vec(value).unwrap_or_default()
}

/// Decodes a journal entry of version 1.
pub(crate) fn decode_entry<T: DeserializeOwned + Versioned>(
    what: &'static str,
    bytes: &[u8],
) -> Result<T, AgentError> {
    let entry: T = serde_json::from_slice(bytes).map_err(|e| AgentError::InvalidEntry {
        what,
        reason: e.to_string(),
    })?;
    if entry.version() != VERSION {
        return Err(AgentError::InvalidEntry {
            what,
            reason: format!("unsupported version {}", entry.version()),
        });
    }
    Ok(entry)
}

/// A format with a version field.
pub(crate) trait Versioned {
    fn version(&self) -> u32;
}

impl Versioned for TurnEntry {
    fn version(&self) -> u32 {
        self.version
    }
}

impl Versioned for ToolResultEntry {
    fn version(&self) -> u32 {
        self.version
    }
}

impl Versioned for MessageEntry {
    fn version(&self) -> u32 {
        self.version
    }
}

impl Versioned for AgentAnswer {
    fn version(&self) -> u32 {
        self.version
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tool::ToolCall;

    /// A turn too large for an update loses its largest part first, again and again: a long
    /// text is cut before a small call's arguments are touched, and arguments no longer
    /// than the note are never replaced; large arguments go before a shorter text.
    #[test]
    fn a_turn_too_large_loses_its_largest_part_first() {
        let entry = |text: &str, calls: Vec<ToolCall>| {
            let mut message = AssistantMessage::with_tool_calls(calls);
            message.content = Some(text.to_owned());
            TurnEntry::new(1, message, None)
        };
        let long_text = entry(
            &"t".repeat(8000),
            vec![ToolCall::function("c", "add", "{}")],
        );
        let fitted = long_text.within(4096);
        assert!(encode(&fitted).len() <= 4096);
        assert_eq!(fitted.message.tool_calls[0].function.arguments, "{}");
        assert!(fitted
            .message
            .content
            .as_deref()
            .is_some_and(|t| t.ends_with(" […answer cut: its text had 8000 bytes]")));

        let large = format!(r#"{{"x":"{}"}}"#, "a".repeat(6000));
        let large_call = entry(
            "short",
            vec![
                ToolCall::function("c0", "add", "{}"),
                ToolCall::function("c1", "write", large.clone()),
            ],
        );
        let fitted = large_call.within(4096);
        assert!(encode(&fitted).len() <= 4096);
        let calls = &fitted.message.tool_calls;
        assert_eq!(calls[0].function.arguments, "{}");
        assert_eq!(
            cut_arguments(&calls[1].function.arguments),
            Some(large.len())
        );
        assert_eq!(fitted.message.content.as_deref(), Some("short"));
    }

    #[test]
    fn payloads_are_checked_both_ways() {
        assert!(matches!(
            AgentPayload::new(vec![], 3),
            Err(AgentError::EmptyConversation)
        ));
        assert!(matches!(
            AgentPayload::new(vec![Message::user("hi")], 0),
            Err(AgentError::InvalidMaxSteps { .. })
        ));
        let payload = AgentPayload::new(vec![Message::user("hi")], 3).unwrap();
        assert_eq!(AgentPayload::decode(&payload.encode()).unwrap(), payload);
        let newer = br#"{"version":3,"messages":[{"role":"user","content":"hi"}],"max_steps":3}"#;
        assert!(matches!(
            AgentPayload::decode(newer),
            Err(AgentError::UnsupportedVersion(3))
        ));
        // Version 2 is an interactive run's, and only its.
        let interactive = payload.clone().into_interactive();
        let bytes = interactive.encode();
        assert!(String::from_utf8_lossy(&bytes).contains(r#""version":2"#));
        assert_eq!(AgentPayload::decode(&bytes).unwrap(), interactive);
        let plain_v2 =
            br#"{"version":2,"messages":[{"role":"user","content":"hi"}],"max_steps":3}"#;
        assert!(matches!(
            AgentPayload::decode(plain_v2),
            Err(AgentError::UnsupportedVersion(2))
        ));
        // A plain run's bytes are as they were: no `interactive` field.
        assert!(!String::from_utf8_lossy(&payload.encode()).contains("interactive"));
        assert!(matches!(
            AgentPayload::decode(b"{"),
            Err(AgentError::InvalidPayload(_))
        ));
    }

    #[test]
    fn entries_round_trip_and_refuse_other_versions() {
        let turn = TurnEntry::new(
            1,
            AssistantMessage::with_tool_calls(vec![ToolCall::function("c", "add", "{}")]),
            Some(Usage {
                prompt_tokens: 3,
                completion_tokens: 4,
                total_tokens: 7,
            }),
        );
        let bytes = encode(&turn);
        assert_eq!(decode_entry::<TurnEntry>("turn", &bytes).unwrap(), turn);
        assert_eq!(turn.event_id(), "turn-1");
        let other = String::from_utf8(bytes)
            .unwrap()
            .replace("\"version\":1", "\"version\":9");
        assert!(decode_entry::<TurnEntry>("turn", other.as_bytes()).is_err());
        assert_eq!(call_task_id("agent_1", 2, 0), "agent_1.t2.c0");
        let message = MessageEntry::new(7, 2, "and in euros?");
        let bytes = encode(&message);
        assert_eq!(
            decode_entry::<MessageEntry>("message", &bytes).unwrap(),
            message
        );
        assert_eq!(message.event_id(), "message-7");
        // Content whose JSON exceeds the limit (quotes escape to two bytes each) is cut on a
        // character boundary, with a note, to the longest prefix that fits.
        let long = MessageEntry::new(8, 2, "\"é".repeat(1000));
        assert!(encode(&long).len() > 2000);
        let cut = long.clone().within(2000);
        let len = encode(&cut).len();
        assert!(len <= 2000 && len > 1980, "{len}");
        assert!(cut
            .content
            .ends_with(" […message cut: its text had 3000 bytes]"));
        assert!(long
            .content
            .starts_with(cut.content.split(" […").next().unwrap()));
        assert_eq!(
            message.clone().within(2000),
            message,
            "what fits is kept whole"
        );
        // A tool's result is cut the same way (control characters escape to six bytes).
        let result = ToolResultEntry {
            version: 1,
            turn: 2,
            index: 0,
            tool_call_id: "c".into(),
            task_id: Some("r.t2.c0".into()),
            status: CallStatus::Completed,
            content: "\u{1b}[1m".repeat(500),
        };
        assert!(encode(&result).len() > 2000);
        let cut = result.clone().within(2000);
        let len = encode(&cut).len();
        assert!(len <= 2000 && len > 1980, "{len}");
        assert!(cut
            .content
            .ends_with(" […result cut: its text had 2000 bytes]"));
        assert_eq!(
            (cut.turn, cut.index, &cut.status),
            (2, 0, &CallStatus::Completed)
        );
    }
}
