//! `OpenAiChatModel` against a loopback HTTP server that speaks the chat completions protocol
//! with recorded answers: plain answers, one and several tool calls, streamed tool-call
//! arguments split across chunks, a 429 then success, a 500 then success, a 401, malformed
//! JSON, a call of a tool that does not exist, a stream cut in the middle.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::post;
use dtask_tool::{
    Agent, AssistantMessage, ChatModel, FunctionTool, Message, ModelError, OpenAiChatModel,
    OpenAiConfig, ToolCall, ToolChoice, ToolError, ToolInfo, ToolsNode, Usage,
};
use serde_json::{json, Value};

/// One recorded answer.
#[derive(Clone)]
enum Answer {
    /// A status, headers and a body.
    Plain(u16, Vec<(&'static str, String)>, String),
    /// A 200 event stream of these `data:` payloads; cut (the connection closed) before
    /// `[DONE]` when `cut`.
    Stream(Vec<String>, bool),
}

#[derive(Default)]
struct Script {
    answers: Mutex<VecDeque<Answer>>,
    requests: Mutex<Vec<(Value, Option<String>)>>,
}

/// Serves `answers` in order on a loopback port; returns the base URL and the script.
async fn serve(answers: Vec<Answer>) -> (String, Arc<Script>) {
    let script = Arc::new(Script {
        answers: Mutex::new(answers.into()),
        requests: Mutex::default(),
    });
    let shared = Arc::clone(&script);
    let app = axum::Router::new().route(
        "/v1/chat/completions",
        post(move |headers: HeaderMap, body: String| {
            let script = Arc::clone(&shared);
            async move {
                let auth = headers
                    .get("authorization")
                    .map(|v| v.to_str().unwrap().to_owned());
                script
                    .requests
                    .lock()
                    .unwrap()
                    .push((serde_json::from_str(&body).unwrap(), auth));
                let answer = script.answers.lock().unwrap().pop_front();
                match answer {
                    None => Response::builder()
                        .status(500)
                        .body(Body::from("no more answers"))
                        .unwrap(),
                    Some(Answer::Plain(status, headers, body)) => {
                        let mut response = Response::builder()
                            .status(StatusCode::from_u16(status).unwrap())
                            .header("content-type", "application/json");
                        for (name, value) in headers {
                            response = response.header(name, value);
                        }
                        response.body(Body::from(body)).unwrap()
                    }
                    Some(Answer::Stream(chunks, cut)) => {
                        let mut frames: Vec<Result<String, std::io::Error>> = chunks
                            .into_iter()
                            .map(|c| Ok(format!("data: {c}\n\n")))
                            .collect();
                        if cut {
                            frames.push(Err(std::io::Error::other("cut")));
                        } else {
                            frames.push(Ok("data: [DONE]\n\n".to_owned()));
                        }
                        Response::builder()
                            .status(200)
                            .header("content-type", "text/event-stream")
                            .body(Body::from_stream(futures::stream::iter(frames)))
                            .unwrap()
                    }
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}/v1", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (base, script)
}

fn config(base: &str) -> OpenAiConfig {
    OpenAiConfig::new(base, "test-model")
        .with_api_key("sk-test")
        .with_retries(2, Duration::from_millis(1), Duration::from_millis(5))
        .with_timeout(Duration::from_secs(10))
}

fn completion(message: &Value) -> Answer {
    Answer::Plain(
        200,
        vec![],
        json!({
            "id": "c1", "object": "chat.completion",
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}
        })
        .to_string(),
    )
}

fn add_tool() -> ToolInfo {
    ToolInfo::new(
        "add",
        "Add two integers",
        json!({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}),
    )
}

fn model_error(e: &ToolError) -> &ModelError {
    let ToolError::Model { source } = e else {
        panic!("not a model error: {e:?}")
    };
    source.downcast_ref::<ModelError>().expect("a ModelError")
}

#[tokio::test]
async fn a_plain_answer_with_usage_and_the_request_it_came_from() {
    let (base, script) = serve(vec![completion(
        &json!({"role": "assistant", "content": "Hello!", "refusal": null}),
    )])
    .await;
    let model = OpenAiChatModel::new(config(&base)).unwrap();
    let (answer, usage) = model
        .generate_with_usage(&[Message::system("Be brief."), Message::user("Hi")], &[])
        .await
        .unwrap();
    assert_eq!(answer, AssistantMessage::text("Hello!"));
    assert_eq!(
        usage,
        Some(Usage {
            prompt_tokens: 11,
            completion_tokens: 7,
            total_tokens: 18
        })
    );
    let requests = script.requests.lock().unwrap();
    let (body, auth) = &requests[0];
    assert_eq!(auth.as_deref(), Some("Bearer sk-test"));
    assert_eq!(body["model"], "test-model");
    assert_eq!(
        body["messages"][0],
        json!({"role": "system", "content": "Be brief."})
    );
    assert!(
        body.get("tools").is_none(),
        "no tools, no tools field: {body}"
    );
}

#[tokio::test]
async fn one_and_several_tool_calls_with_the_tools_and_tool_choice_sent() {
    let one = json!({"role": "assistant", "content": null, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": "{\"a\":1,\"b\":2}"}}
    ]});
    let two = json!({"role": "assistant", "content": null, "tool_calls": [
        {"id": "call_a", "type": "function", "function": {"name": "add", "arguments": "{\"a\":1,\"b\":1}"}},
        {"id": "call_b", "type": "function", "function": {"name": "add", "arguments": "{\"a\":2,\"b\":2}"}}
    ]});
    let (base, script) = serve(vec![completion(&one), completion(&two)]).await;
    let model =
        OpenAiChatModel::new(config(&base).with_tool_choice(ToolChoice::Function("add".into())))
            .unwrap();
    let tools = [add_tool()];
    let first = model
        .generate_with_usage(&[Message::user("1+2?")], &tools)
        .await
        .unwrap()
        .0;
    assert_eq!(
        first.tool_calls,
        vec![ToolCall::function("call_1", "add", r#"{"a":1,"b":2}"#)]
    );
    let second = model
        .generate_with_usage(&[Message::user("two sums")], &tools)
        .await
        .unwrap()
        .0;
    let ids: Vec<&str> = second.tool_calls.iter().map(|c| c.id.as_str()).collect();
    assert_eq!(ids, ["call_a", "call_b"]);
    let requests = script.requests.lock().unwrap();
    assert_eq!(requests[0].0["tools"][0]["function"]["name"], "add");
    assert_eq!(
        requests[0].0["tool_choice"],
        json!({"type": "function", "function": {"name": "add"}})
    );
}

#[tokio::test]
async fn streamed_tool_call_arguments_split_across_chunks_are_assembled() {
    let chunks = vec![
        json!({"choices": [{"index": 0, "delta": {"role": "assistant", "content": null,
            "tool_calls": [{"index": 0, "id": "call_s", "type": "function",
                "function": {"name": "add", "arguments": ""}}]}}]}),
        json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0,
            "function": {"arguments": "{\"a\":"}}]}}]}),
        json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0,
            "function": {"arguments": "40,\"b\""}}, {"index": 1, "id": "call_t",
            "function": {"name": "add", "arguments": "{\"a\":0,"}}]}}]}),
        json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0,
            "function": {"arguments": ":2}"}}, {"index": 1, "function": {"arguments": "\"b\":0}"}}]}}]}),
        json!({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 9, "total_tokens": 14}}),
    ]
    .into_iter()
    .map(|c| c.to_string())
    .collect();
    let text = vec![
        json!({"choices": [{"index": 0, "delta": {"content": "The sum "}}]}).to_string(),
        json!({"choices": [{"index": 0, "delta": {"content": "is 42."}}]}).to_string(),
    ];
    let (base, script) = serve(vec![
        Answer::Stream(chunks, false),
        Answer::Stream(text, false),
    ])
    .await;
    let model = OpenAiChatModel::new(config(&base).with_streaming(true)).unwrap();
    let (answer, usage) = model
        .generate_with_usage(&[Message::user("40+2?")], &[add_tool()])
        .await
        .unwrap();
    assert_eq!(
        answer.tool_calls,
        vec![
            ToolCall::function("call_s", "add", r#"{"a":40,"b":2}"#),
            ToolCall::function("call_t", "add", r#"{"a":0,"b":0}"#),
        ]
    );
    assert_eq!(usage.unwrap().total_tokens, 14);
    let (answer, _) = model
        .generate_with_usage(&[Message::user("and?")], &[])
        .await
        .unwrap();
    assert_eq!(answer.content.as_deref(), Some("The sum is 42."));
    assert_eq!(script.requests.lock().unwrap()[0].0["stream"], true);
}

#[tokio::test]
async fn a_429_then_success_honours_retry_after_and_a_500_then_success() {
    let ok = completion(&json!({"role": "assistant", "content": "fine"}));
    let (base, script) = serve(vec![
        Answer::Plain(
            429,
            vec![("retry-after", "0".into())],
            json!({"error": {"message": "slow down"}}).to_string(),
        ),
        ok.clone(),
        Answer::Plain(500, vec![], "boom".into()),
        ok,
    ])
    .await;
    let model = OpenAiChatModel::new(config(&base)).unwrap();
    for _ in 0..2 {
        let answer = model.generate(&[Message::user("hi")], &[]).await.unwrap();
        assert_eq!(answer.content.as_deref(), Some("fine"));
    }
    assert_eq!(script.requests.lock().unwrap().len(), 4);
}

#[tokio::test]
async fn retries_run_out_into_typed_errors() {
    let (base, script) = serve(vec![
        Answer::Plain(
            503,
            vec![],
            json!({"error": {"message": "overloaded"}}).to_string(),
        ),
        Answer::Plain(
            503,
            vec![],
            json!({"error": {"message": "overloaded"}}).to_string(),
        ),
        Answer::Plain(
            503,
            vec![],
            json!({"error": {"message": "overloaded"}}).to_string(),
        ),
    ])
    .await;
    let model = OpenAiChatModel::new(config(&base)).unwrap();
    let e = model
        .generate(&[Message::user("hi")], &[])
        .await
        .unwrap_err();
    match model_error(&e) {
        ModelError::Server {
            status: 503,
            attempts: 3,
            message,
        } => assert_eq!(message, "overloaded"),
        other => panic!("{other:?}"),
    }
    assert_eq!(script.requests.lock().unwrap().len(), 3);
}

#[tokio::test]
async fn a_401_is_not_retried_and_a_400_carries_the_servers_message() {
    let (base, script) = serve(vec![
        Answer::Plain(
            401,
            vec![],
            json!({"error": {"message": "Incorrect API key"}}).to_string(),
        ),
        Answer::Plain(
            400,
            vec![],
            json!({"error": {"message": "context too long"}}).to_string(),
        ),
    ])
    .await;
    let model = OpenAiChatModel::new(config(&base)).unwrap();
    let e = model
        .generate(&[Message::user("hi")], &[])
        .await
        .unwrap_err();
    assert!(
        matches!(model_error(&e), ModelError::Auth { status: 401, message } if message == "Incorrect API key"),
        "{e}"
    );
    let e = model
        .generate(&[Message::user("hi")], &[])
        .await
        .unwrap_err();
    assert!(
        matches!(model_error(&e), ModelError::BadRequest { status: 400, message } if message == "context too long"),
        "{e}"
    );
    assert_eq!(
        script.requests.lock().unwrap().len(),
        2,
        "neither was retried"
    );
}

#[tokio::test]
async fn malformed_json_is_a_typed_error() {
    let (base, _) = serve(vec![
        Answer::Plain(200, vec![], "{\"choices\": [ {".into()),
        Answer::Plain(200, vec![], json!({"choices": []}).to_string()),
    ])
    .await;
    let model = OpenAiChatModel::new(config(&base)).unwrap();
    for _ in 0..2 {
        let e = model
            .generate(&[Message::user("hi")], &[])
            .await
            .unwrap_err();
        assert!(matches!(model_error(&e), ModelError::Malformed(_)), "{e}");
    }
}

#[tokio::test]
async fn a_stream_cut_in_the_middle_is_retried_then_reported() {
    let partial =
        vec![json!({"choices": [{"index": 0, "delta": {"content": "Once upon"}}]}).to_string()];
    let whole = vec![json!({"choices": [{"index": 0, "delta": {"content": "Done."}}]}).to_string()];
    let (base, _) = serve(vec![
        Answer::Stream(partial.clone(), true),
        Answer::Stream(whole, false),
        Answer::Stream(partial.clone(), true),
        Answer::Stream(partial.clone(), true),
        Answer::Stream(partial, true),
    ])
    .await;
    let model = OpenAiChatModel::new(config(&base).with_streaming(true)).unwrap();
    // Cut once, then whole: the answer is the whole one, never a half.
    let answer = model
        .generate(&[Message::user("story")], &[])
        .await
        .unwrap();
    assert_eq!(answer.content.as_deref(), Some("Done."));
    // Cut every time: a transport error after every attempt.
    let e = model
        .generate(&[Message::user("story")], &[])
        .await
        .unwrap_err();
    assert!(
        matches!(model_error(&e), ModelError::Transport { attempts: 3, .. }),
        "{e}"
    );
}

#[tokio::test]
async fn a_call_of_a_tool_that_does_not_exist_reaches_the_agent_as_unknown() {
    let (base, _) = serve(vec![
        completion(&json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_x", "type": "function", "function": {"name": "teleport", "arguments": "{}"}}
        ]})),
        completion(&json!({"role": "assistant", "content": "I cannot teleport."})),
    ])
    .await;
    let model = OpenAiChatModel::new(config(&base)).unwrap();
    let add = FunctionTool::infer(
        "add",
        "Add",
        |args: serde_json::Map<String, Value>| async move {
            Ok::<_, std::convert::Infallible>(args.len())
        },
    );
    let tools = ToolsNode::builder().tool(add).build().unwrap();
    let agent = Agent::new(Arc::new(model), tools).with_max_steps(3);
    match agent.run(vec![Message::user("go to Mars")]).await {
        // The node's error policy decides: either the run fails naming the tool, or the model
        // is told and answers.
        Err(ToolError::UnknownTool { name }) => assert_eq!(name, "teleport"),
        Ok(run) => {
            let told = run.messages.iter().any(|m| {
                matches!(m, Message::Tool(t) if t.tool_call_id == "call_x" && t.content.contains("teleport"))
            });
            assert!(told, "{:?}", run.messages);
        }
        Err(other) => panic!("{other:?}"),
    }
}

#[test]
fn the_key_is_never_shown() {
    let config = OpenAiConfig::new("http://x/v1", "m").with_api_key("sk-secret-value");
    assert!(!format!("{config:?}").contains("sk-secret-value"));
}

// Servers that number every call 0 and tell them apart by id; a call index far past the
// calls so far; `"tool_calls": null` in a delta and in a whole answer.
#[tokio::test]
async fn streamed_calls_told_apart_by_id_huge_indexes_and_null_tool_calls() {
    let same_index = vec![
        json!({"choices": [{"delta": {"content": null, "tool_calls": null}}]}),
        json!({"choices": [{"delta": {"tool_calls": [{"index": 0, "id": "call_a",
            "function": {"name": "add", "arguments": "{\"a\":1,"}}]}}]}),
        json!({"choices": [{"delta": {"tool_calls": [{"index": 0,
            "function": {"arguments": "\"b\":2}"}}]}}]}),
        json!({"choices": [{"delta": {"tool_calls": [{"index": 0, "id": "call_b",
            "function": {"name": "add", "arguments": "{\"a\":3,\"b\":4}"}}]}}]}),
    ]
    .into_iter()
    .map(|c| c.to_string())
    .collect();
    let huge = vec![
        json!({"choices": [{"delta": {"tool_calls": [{"index": 100_000_000_000_u64,
        "id": "call_h", "function": {"name": "add", "arguments": "{}"}}]}}]})
        .to_string(),
    ];
    let (base, _) = serve(vec![
        Answer::Stream(same_index, false),
        Answer::Stream(huge, false),
        completion(&json!({"role": "assistant", "content": "plain", "tool_calls": null})),
    ])
    .await;
    let streaming = OpenAiChatModel::new(config(&base).with_streaming(true)).unwrap();
    let (answer, _) = streaming
        .generate_with_usage(&[Message::user("1+2, 3+4?")], &[add_tool()])
        .await
        .unwrap();
    assert_eq!(
        answer.tool_calls,
        vec![
            ToolCall::function("call_a", "add", r#"{"a":1,"b":2}"#),
            ToolCall::function("call_b", "add", r#"{"a":3,"b":4}"#),
        ]
    );
    // An index is a name, not a size: one call, whatever its number.
    let (answer, _) = streaming
        .generate_with_usage(&[Message::user("again")], &[add_tool()])
        .await
        .unwrap();
    assert_eq!(
        answer.tool_calls,
        vec![ToolCall::function("call_h", "add", "{}")]
    );
    let whole = OpenAiChatModel::new(config(&base)).unwrap();
    let answer = whole.generate(&[Message::user("hi")], &[]).await.unwrap();
    assert_eq!(answer, AssistantMessage::text("plain"));
}

// An error event in the middle of a stream is an error (retried, then reported with the
// server's message), never an empty answer.
#[tokio::test]
async fn an_error_event_in_a_stream_is_an_error_not_an_empty_answer() {
    let failing = || {
        Answer::Stream(
            vec![
                json!({"choices": [{"delta": {"content": "Once"}}]}).to_string(),
                json!({"error": {"message": "the engine is overloaded", "code": 503}}).to_string(),
            ],
            false,
        )
    };
    let old_style = Answer::Stream(
        vec![json!({"object": "error", "message": "out of memory"}).to_string()],
        false,
    );
    let (base, _) = serve(vec![failing(), failing(), failing(), old_style]).await;
    let model = OpenAiChatModel::new(config(&base).with_streaming(true)).unwrap();
    let e = model
        .generate(&[Message::user("story")], &[])
        .await
        .unwrap_err();
    assert!(
        matches!(model_error(&e), ModelError::Stream { attempts: 3, message } if message == "the engine is overloaded"),
        "{e}"
    );
    let model = OpenAiChatModel::new(config(&base).with_streaming(true).with_retries(
        0,
        Duration::from_millis(1),
        Duration::from_millis(1),
    ))
    .unwrap();
    let e = model
        .generate(&[Message::user("story")], &[])
        .await
        .unwrap_err();
    assert!(
        matches!(model_error(&e), ModelError::Stream { message, .. } if message == "out of memory"),
        "{e}"
    );
}

// An answer over the limit fails the request — whole or streamed — instead of filling memory.
#[tokio::test]
async fn answers_over_the_limit_are_refused() {
    let long = "x".repeat(8 << 10);
    let (base, _) = serve(vec![
        completion(&json!({"role": "assistant", "content": long})),
        Answer::Stream(
            vec![json!({"choices": [{"delta": {"content": long}}]}).to_string()],
            false,
        ),
    ])
    .await;
    for streaming in [false, true] {
        let model = OpenAiChatModel::new(
            config(&base)
                .with_streaming(streaming)
                .with_max_response_bytes(4 << 10),
        )
        .unwrap();
        let e = model
            .generate(&[Message::user("long")], &[])
            .await
            .unwrap_err();
        assert!(
            matches!(model_error(&e), ModelError::Malformed(m) if m.contains("4096 bytes")),
            "{e}"
        );
    }
}

// A base URL that is not http(s) is refused when the client is made, not retried as an
// unreachable server; a redirect is not followed (the conversation goes nowhere else).
#[tokio::test]
async fn a_wrong_base_url_is_a_config_error_and_redirects_are_not_followed() {
    for base in ["localhost:8000/v1", "not a url"] {
        let e = OpenAiChatModel::new(OpenAiConfig::new(base, "m")).unwrap_err();
        assert!(
            matches!(model_error(&e), ModelError::Config(_)),
            "{base}: {e}"
        );
    }
    let (base, script) = serve(vec![Answer::Plain(
        307,
        vec![(
            "location",
            "http://127.0.0.1:9/v1/chat/completions".to_owned(),
        )],
        String::new(),
    )])
    .await;
    let model = OpenAiChatModel::new(config(&base)).unwrap();
    let e = model
        .generate(&[Message::user("hi")], &[])
        .await
        .unwrap_err();
    assert!(
        matches!(model_error(&e), ModelError::BadRequest { status: 307, .. }),
        "{e}"
    );
    assert_eq!(script.requests.lock().unwrap().len(), 1);
}

/// The payloads of a stream of one choice whose deltas are these `tool_calls` entries.
fn call_deltas(deltas: &[Value]) -> Vec<String> {
    deltas
        .iter()
        .map(|d| json!({"choices": [{"index": 0, "delta": {"tool_calls": [d]}}]}).to_string())
        .collect()
}

// Servers that repeat the function name in every delta of a call (the name is not doubled),
// and servers (LM Studio) that send a new id with every fragment of a call at the same index
// (the fragments are one call, under its first id).
#[tokio::test]
async fn repeated_names_and_a_new_id_per_fragment_are_one_call() {
    let repeated_name = call_deltas(&[
        json!({"index": 0, "id": "A", "type": "function",
            "function": {"name": "read_file", "arguments": ""}}),
        json!({"index": 0, "function": {"name": "read_file", "arguments": "{"}}),
        json!({"index": 0, "function": {"name": "read_file", "arguments": "}"}}),
    ]);
    let id_per_fragment = call_deltas(&[
        json!({"index": 0, "id": "A", "type": "function",
            "function": {"name": "add", "arguments": ""}}),
        json!({"index": 0, "id": "B", "function": {"arguments": "{\"a\":1,"}}),
        json!({"index": 0, "id": "C", "function": {"arguments": "\"b\":2}"}}),
    ]);
    let (base, _) = serve(vec![
        Answer::Stream(repeated_name, false),
        Answer::Stream(id_per_fragment, false),
    ])
    .await;
    let model = OpenAiChatModel::new(config(&base).with_streaming(true)).unwrap();
    let (answer, _) = model
        .generate_with_usage(&[Message::user("read it")], &[add_tool()])
        .await
        .unwrap();
    assert_eq!(
        answer.tool_calls,
        [ToolCall::function("A", "read_file", "{}")]
    );
    let (answer, _) = model
        .generate_with_usage(&[Message::user("1+2?")], &[add_tool()])
        .await
        .unwrap();
    assert_eq!(
        answer.tool_calls,
        [ToolCall::function("A", "add", r#"{"a":1,"b":2}"#)]
    );
}

// Whole calls sent one after the other at one index, each with its own id, are separate
// calls — also when a call's name comes after its id — and a server that sends a new id and
// the name again with every fragment of a call still makes one call.
#[tokio::test]
async fn a_new_id_after_a_whole_call_starts_another_and_fragments_of_one_stay_one() {
    let whole_then_named_later = call_deltas(&[
        json!({"index": 0, "id": "A", "function": {"name": "add", "arguments": "{}"}}),
        json!({"index": 0, "id": "B", "function": {"arguments": ""}}),
        json!({"index": 0, "function": {"name": "read_file", "arguments": "{\"p\":1}"}}),
    ]);
    let fragments_with_names = call_deltas(&[
        json!({"index": 0, "id": "A", "function": {"name": "add", "arguments": "{\"a\":1,"}}),
        json!({"index": 0, "id": "B", "function": {"name": "add", "arguments": "\"b\":2}"}}),
    ]);
    let (base, _) = serve(vec![
        Answer::Stream(whole_then_named_later, false),
        Answer::Stream(fragments_with_names, false),
    ])
    .await;
    let model = OpenAiChatModel::new(config(&base).with_streaming(true)).unwrap();
    let answer = model.generate(&[Message::user("two")], &[]).await.unwrap();
    assert_eq!(
        answer.tool_calls,
        [
            ToolCall::function("A", "add", "{}"),
            ToolCall::function("B", "read_file", r#"{"p":1}"#)
        ]
    );
    let answer = model.generate(&[Message::user("one")], &[]).await.unwrap();
    assert_eq!(
        answer.tool_calls,
        [ToolCall::function("A", "add", r#"{"a":1,"b":2}"#)]
    );
}

// A name split across deltas is joined.
#[tokio::test]
async fn a_name_split_across_deltas_is_joined() {
    let split = call_deltas(&[
        json!({"index": 0, "id": "A", "function": {"name": "read_", "arguments": ""}}),
        json!({"index": 0, "function": {"name": "file", "arguments": "{}"}}),
    ]);
    let (base, _) = serve(vec![Answer::Stream(split, false)]).await;
    let model = OpenAiChatModel::new(config(&base).with_streaming(true)).unwrap();
    let answer = model.generate(&[Message::user("read")], &[]).await.unwrap();
    assert_eq!(
        answer.tool_calls,
        [ToolCall::function("A", "read_file", "{}")]
    );
}

// An answer cut at the token limit in the middle of a tool call's arguments is a typed error,
// not a call with broken arguments — whole or streamed, and not retried; a text answer cut
// there is an answer, whose finish reason the reply tells.
#[tokio::test]
async fn tool_calls_cut_at_the_token_limit_are_a_typed_error() {
    let cut_call = Answer::Plain(
        200,
        vec![],
        json!({"choices": [{"index": 0, "finish_reason": "length", "message": {
            "role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
                "function": {"name": "add", "arguments": "{\"a\":1,\"b\""}}]}}]})
        .to_string(),
    );
    let cut_text = Answer::Plain(
        200,
        vec![],
        json!({"choices": [{"index": 0, "finish_reason": "length",
            "message": {"role": "assistant", "content": "Once upon a"}}]})
        .to_string(),
    );
    let mut streamed_call = call_deltas(&[
        json!({"index": 0, "id": "c1", "function": {"name": "add", "arguments": "{\"a\":"}}),
    ]);
    streamed_call.push(
        json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}).to_string(),
    );
    let streamed_text = vec![
        json!({"choices": [{"index": 0, "delta": {"content": "Once"}}]}).to_string(),
        json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}).to_string(),
    ];
    let (base, script) = serve(vec![
        cut_call,
        cut_text,
        Answer::Stream(streamed_call, false),
        Answer::Stream(streamed_text, false),
    ])
    .await;
    let whole = OpenAiChatModel::new(config(&base)).unwrap();
    let e = whole
        .reply(&[Message::user("1+2?")], &[add_tool()])
        .await
        .unwrap_err();
    assert!(matches!(model_error(&e), ModelError::Truncated), "{e}");
    let reply = whole
        .reply(&[Message::user("a story")], &[add_tool()])
        .await
        .unwrap();
    assert_eq!(reply.message, AssistantMessage::text("Once upon a"));
    assert_eq!(reply.finish_reason.as_deref(), Some("length"));
    let streaming = OpenAiChatModel::new(config(&base).with_streaming(true)).unwrap();
    let e = streaming
        .reply(&[Message::user("1+2?")], &[add_tool()])
        .await
        .unwrap_err();
    assert!(matches!(model_error(&e), ModelError::Truncated), "{e}");
    let reply = streaming
        .reply(&[Message::user("a story")], &[add_tool()])
        .await
        .unwrap();
    assert_eq!(reply.message, AssistantMessage::text("Once"));
    assert_eq!(reply.finish_reason.as_deref(), Some("length"));
    assert_eq!(
        script.requests.lock().unwrap().len(),
        4,
        "nothing was retried"
    );
}
