//! Chat messages against literal OpenAI-shaped JSON.
#![allow(clippy::unwrap_used)]

use dtask_tool::{AssistantMessage, FunctionCall, Message, ToolCall, ToolCallKind, ToolMessage};
use serde_json::{json, Value};

/// A request `messages` array as sent to OpenAI's chat completions API.
fn openai_conversation() -> Value {
    json!([
        { "role": "system", "content": "You are a helpful assistant." },
        { "role": "user", "content": "What's the weather in Paris and in Oslo?" },
        {
            "role": "assistant",
            "content": null,
            "tool_calls": [
                {
                    "id": "call_abc123",
                    "type": "function",
                    "function": { "name": "get_weather", "arguments": "{\"city\":\"Paris\"}" }
                },
                {
                    "id": "call_def456",
                    "type": "function",
                    "function": { "name": "get_weather", "arguments": "{\"city\":\"Oslo\"}" }
                }
            ]
        },
        { "role": "tool", "tool_call_id": "call_abc123", "content": "{\"celsius\":18}" },
        { "role": "tool", "tool_call_id": "call_def456", "content": "{\"celsius\":7}" },
        { "role": "assistant", "content": "Paris: 18°C, Oslo: 7°C." }
    ])
}

#[test]
fn conversation_round_trips_exactly() {
    let wire = openai_conversation();
    let messages: Vec<Message> = serde_json::from_value(wire.clone()).unwrap();
    assert_eq!(
        messages,
        vec![
            Message::system("You are a helpful assistant."),
            Message::user("What's the weather in Paris and in Oslo?"),
            Message::Assistant(AssistantMessage::with_tool_calls(vec![
                ToolCall::function("call_abc123", "get_weather", r#"{"city":"Paris"}"#),
                ToolCall::function("call_def456", "get_weather", r#"{"city":"Oslo"}"#),
            ])),
            Message::tool("call_abc123", r#"{"celsius":18}"#),
            Message::tool("call_def456", r#"{"celsius":7}"#),
            Message::assistant("Paris: 18°C, Oslo: 7°C."),
        ]
    );
    assert_eq!(serde_json::to_value(&messages).unwrap(), wire);
}

#[test]
fn reads_an_openai_response_message_with_extra_fields() {
    // `choices[0].message` of a chat completions response.
    let response = json!({
        "role": "assistant",
        "content": null,
        "refusal": null,
        "annotations": [],
        "tool_calls": [{
            "id": "call_1",
            "type": "function",
            "function": { "name": "add", "arguments": "{\"a\":1,\"b\":2}" }
        }]
    });
    let message: AssistantMessage = serde_json::from_value(response.clone()).unwrap();
    assert_eq!(message.content, None);
    assert!(message.has_tool_calls());
    assert_eq!(
        message.tool_calls[0],
        ToolCall {
            id: "call_1".into(),
            kind: ToolCallKind::Function,
            function: FunctionCall {
                name: "add".into(),
                arguments: r#"{"a":1,"b":2}"#.into()
            }
        }
    );
    // Through `Message`, the role tag is read too.
    let as_message: Message = serde_json::from_value(response).unwrap();
    assert_eq!(as_message, Message::Assistant(message));
    assert_eq!(as_message.role(), "assistant");
    assert_eq!(as_message.content(), None);
}

#[test]
fn text_only_assistant_omits_tool_calls() {
    let value = serde_json::to_value(Message::assistant("done")).unwrap();
    assert_eq!(value, json!({ "role": "assistant", "content": "done" }));
    // A missing `content` reads as `None`.
    let m: AssistantMessage = serde_json::from_value(json!({ "tool_calls": [] })).unwrap();
    assert_eq!(m, AssistantMessage::default());
}

#[test]
fn tool_message_wire_shape() {
    let value = serde_json::to_value(Message::Tool(ToolMessage::new("call_9", "ok"))).unwrap();
    assert_eq!(
        value,
        json!({ "role": "tool", "tool_call_id": "call_9", "content": "ok" })
    );
}

#[test]
fn rejects_unknown_roles_and_call_types() {
    assert!(
        serde_json::from_value::<Message>(json!({ "role": "wizard", "content": "x" })).is_err()
    );
    let bad_type = json!({
        "id": "c", "type": "custom", "function": { "name": "n", "arguments": "{}" }
    });
    assert!(serde_json::from_value::<ToolCall>(bad_type).is_err());
}

/// Usages add up without overflowing: a server's counts are not trusted to fit.
#[test]
fn usages_add_up_saturating() {
    let huge = dtask_tool::Usage {
        prompt_tokens: u64::MAX,
        completion_tokens: 1,
        total_tokens: u64::MAX,
    };
    let sum = huge.plus(huge);
    assert_eq!(
        (sum.prompt_tokens, sum.completion_tokens, sum.total_tokens),
        (u64::MAX, 2, u64::MAX)
    );
}
