//! Function tools: constructors, schema inference, argument decoding,
//! encoders, panics and streaming.
#![allow(clippy::unwrap_used)]

use std::sync::{
    atomic::{AtomicUsize, Ordering},
    Arc,
};

use dtask_tool::{
    decode_arguments, parameters_schema, BoxError, FunctionTool, StreamingFunctionTool,
    StreamingTool, Tool, ToolError, ToolInfo,
};
use futures::{stream, StreamExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;

/// Arguments of the weather tool.
#[derive(Debug, Deserialize, JsonSchema)]
#[allow(dead_code)]
struct WeatherArgs {
    /// The city to look up.
    city: String,
    /// Temperature unit.
    unit: Option<Unit>,
    /// How many days to forecast.
    #[serde(default)]
    days: u8,
    /// Where exactly.
    location: Option<Location>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
enum Unit {
    Celsius,
    Fahrenheit,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[allow(dead_code)]
struct Location {
    /// Latitude in degrees.
    lat: f64,
    /// Longitude in degrees.
    #[schemars(range(min = -180.0, max = 180.0))]
    lon: f64,
}

#[derive(Debug, Serialize, PartialEq)]
struct Weather {
    city: String,
    celsius: i32,
}

fn weather_tool() -> FunctionTool<WeatherArgs, Weather> {
    FunctionTool::infer(
        "get_weather",
        "Current weather of a city",
        |args: WeatherArgs| async move {
            Ok::<_, BoxError>(Weather {
                city: args.city,
                celsius: 21,
            })
        },
    )
}

#[test]
fn inferred_schema_matches_the_type() {
    let schema = parameters_schema::<WeatherArgs>();
    let expected = json!({
        "description": "Arguments of the weather tool.",
        "type": "object",
        "properties": {
            "city": { "description": "The city to look up.", "type": "string" },
            "days": {
                "default": 0,
                "description": "How many days to forecast.",
                "format": "uint8",
                "maximum": 255,
                "minimum": 0,
                "type": "integer"
            },
            "location": {
                "description": "Where exactly.",
                "properties": {
                    "lat": { "description": "Latitude in degrees.", "format": "double", "type": "number" },
                    "lon": {
                        "description": "Longitude in degrees.",
                        "format": "double",
                        "maximum": 180.0,
                        "minimum": -180.0,
                        "type": "number"
                    }
                },
                "required": ["lat", "lon"],
                "type": ["object", "null"]
            },
            "unit": {
                "description": "Temperature unit.",
                "enum": ["celsius", "fahrenheit", null],
                "type": ["string", "null"]
            }
        },
        "required": ["city"]
    });
    assert_eq!(schema, expected);
    // No meta-schema noise and no `$ref`s for non-recursive types.
    assert!(schema.get("$schema").is_none());
    assert!(schema.get("title").is_none());
    assert!(!schema.to_string().contains("$ref"));
}

#[test]
fn infer_constructor_uses_the_inferred_schema() {
    let tool = weather_tool();
    let info = tool.info();
    assert_eq!(info.name, "get_weather");
    assert_eq!(info.description, "Current weather of a city");
    assert_eq!(info.parameters, parameters_schema::<WeatherArgs>());
    assert_eq!(
        info.to_openai_tool(),
        json!({
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Current weather of a city",
                "parameters": parameters_schema::<WeatherArgs>(),
            }
        })
    );
}

#[tokio::test]
async fn infer_tool_decodes_runs_and_encodes_as_json() {
    let out = weather_tool()
        .invoke(r#"{"city":"Oslo","unit":"celsius"}"#)
        .await
        .unwrap();
    assert_eq!(out, r#"{"city":"Oslo","celsius":21}"#);
}

#[derive(Debug, Deserialize)]
struct Pair {
    a: i64,
    b: i64,
}

#[tokio::test]
async fn new_constructor_keeps_the_explicit_schema() {
    let schema = json!({
        "type": "object",
        "properties": { "a": { "type": "integer" }, "b": { "type": "integer" } },
        "required": ["a", "b"]
    });
    let tool = FunctionTool::new(
        ToolInfo::new("mul", "Multiply", schema.clone()),
        |p: Pair| async move { Ok::<_, std::convert::Infallible>(p.a * p.b) },
    );
    assert_eq!(tool.tool_info().parameters, schema);
    assert_eq!(tool.info(), ToolInfo::new("mul", "Multiply", schema));
    assert_eq!(tool.invoke(r#"{"a":6,"b":7}"#).await.unwrap(), "42");
}

#[tokio::test]
async fn syntax_error_is_invalid_arguments_naming_the_tool() {
    let err = weather_tool().invoke(r#"{"city": tru}"#).await.unwrap_err();
    match err {
        ToolError::InvalidArguments {
            tool,
            path,
            message,
        } => {
            assert_eq!(tool, "get_weather");
            assert_eq!(path, "city");
            assert!(message.contains("expected ident"), "{message}");
        }
        other => panic!("unexpected error: {other:?}"),
    }
    let err = weather_tool().invoke("not json").await.unwrap_err();
    match err {
        ToolError::InvalidArguments {
            tool,
            path,
            message,
        } => {
            assert_eq!(tool, "get_weather");
            assert_eq!(path, ".");
            assert!(message.contains("line 1 column 2"), "{message}");
        }
        other => panic!("unexpected error: {other:?}"),
    }
}

#[tokio::test]
async fn schema_mismatch_reports_the_serde_path() {
    let err = weather_tool()
        .invoke(r#"{"city":"Oslo","location":{"lat":1.0,"lon":"east"}}"#)
        .await
        .unwrap_err();
    match err {
        ToolError::InvalidArguments {
            tool,
            path,
            message,
        } => {
            assert_eq!(tool, "get_weather");
            assert_eq!(path, "location.lon");
            assert!(message.contains("invalid type"), "{message}");
        }
        other => panic!("unexpected error: {other:?}"),
    }

    let err = weather_tool()
        .invoke(r#"{"unit":"kelvin","city":"x"}"#)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ToolError::InvalidArguments { path, .. } if path == "unit"),
        "{err:?}"
    );

    let err = weather_tool().invoke(r#"{"days":3}"#).await.unwrap_err();
    match err {
        ToolError::InvalidArguments { path, message, .. } => {
            assert_eq!(path, ".");
            assert!(message.contains("missing field `city`"), "{message}");
        }
        other => panic!("unexpected error: {other:?}"),
    }
}

#[test]
fn decode_arguments_rejects_trailing_data_and_accepts_empty_input() {
    #[derive(Debug, Deserialize)]
    struct NoArgs {}
    let err = decode_arguments::<Pair>("t", r#"{"a":1,"b":2} extra"#).unwrap_err();
    assert!(matches!(err, ToolError::InvalidArguments { ref tool, .. } if tool == "t"));
    decode_arguments::<NoArgs>("t", "").unwrap();
    decode_arguments::<NoArgs>("t", "  ").unwrap();
    let pair: Pair = decode_arguments("t", r#"{"a":1,"b":2}"#).unwrap();
    assert_eq!((pair.a, pair.b), (1, 2));
}

#[tokio::test]
async fn function_error_becomes_failed() {
    let tool = FunctionTool::infer("boom", "Always fails", |_: Empty| async move {
        Err::<(), _>("disk full")
    });
    let err = tool.invoke("{}").await.unwrap_err();
    match &err {
        ToolError::Failed { tool, source } => {
            assert_eq!(tool, "boom");
            assert_eq!(source.to_string(), "disk full");
        }
        other => panic!("unexpected error: {other:?}"),
    }
    assert_eq!(err.to_string(), "tool `boom` failed: disk full");
}

#[tokio::test]
async fn function_returning_tool_error_passes_through() {
    let tool = FunctionTool::infer("strict", "Rejects odd numbers", |n: Num| async move {
        if n.n % 2 == 1 {
            return Err(ToolError::invalid_arguments("strict", "n", "must be even"));
        }
        Ok(n.n / 2)
    });
    assert_eq!(tool.invoke(r#"{"n":4}"#).await.unwrap(), "2");
    let err = tool.invoke(r#"{"n":3}"#).await.unwrap_err();
    assert!(
        matches!(&err, ToolError::InvalidArguments { path, message, .. } if path == "n" && message == "must be even"),
        "{err:?}"
    );
}

#[derive(Debug, Deserialize, JsonSchema)]
struct Empty {}

#[derive(Debug, Deserialize, JsonSchema)]
struct Num {
    n: i64,
}

#[tokio::test]
async fn panicking_function_is_an_error_not_a_crash() {
    let tool = FunctionTool::infer("panicky", "Panics", |n: Num| async move {
        assert!(n.n <= 0, "index out of range: {}", n.n);
        Ok::<_, BoxError>(n.n)
    });
    let err = tool.invoke(r#"{"n":5}"#).await.unwrap_err();
    match err {
        ToolError::Panicked { tool, message } => {
            assert_eq!(tool, "panicky");
            assert_eq!(message, "index out of range: 5");
        }
        other => panic!("unexpected error: {other:?}"),
    }
    // The tool still works afterwards.
    assert_eq!(tool.invoke(r#"{"n":0}"#).await.unwrap(), "0");
}

#[tokio::test]
async fn custom_decoder_and_encoder_are_used() {
    let decoded = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&decoded);
    let tool = FunctionTool::infer("shout", "Upper-case text", |t: Text| async move {
        Ok::<_, BoxError>(t.text.to_uppercase())
    })
    // Accept a bare string as well as {"text": ...}.
    .with_decoder(move |raw: &str| {
        counter.fetch_add(1, Ordering::SeqCst);
        match serde_json::from_str::<String>(raw) {
            Ok(text) => Ok(Text { text }),
            Err(_) => Ok(serde_json::from_str::<Text>(raw)?),
        }
    })
    // Return raw text instead of a JSON string.
    .with_encoder(|s: &String| Ok(s.clone()));

    assert_eq!(tool.invoke(r#""hi""#).await.unwrap(), "HI");
    assert_eq!(tool.invoke(r#"{"text":"yo"}"#).await.unwrap(), "YO");
    assert_eq!(decoded.load(Ordering::SeqCst), 2);
    let err = tool.invoke("42").await.unwrap_err();
    assert!(
        matches!(&err, ToolError::InvalidArguments { tool, path, .. } if tool == "shout" && path == "."),
        "{err:?}"
    );
}

#[tokio::test]
async fn custom_decoder_path_errors_keep_their_path() {
    let tool = FunctionTool::infer(
        "n",
        "Number",
        |n: Num| async move { Ok::<_, BoxError>(n.n) },
    )
    .with_decoder(|raw: &str| {
        let de = &mut serde_json::Deserializer::from_str(raw);
        Ok(serde_path_to_error::deserialize::<_, Num>(de)?)
    });
    let err = tool.invoke(r#"{"n":"x"}"#).await.unwrap_err();
    assert!(
        matches!(&err, ToolError::InvalidArguments { path, .. } if path == "n"),
        "{err:?}"
    );
}

#[tokio::test]
async fn encoder_error_is_output_error() {
    let tool = FunctionTool::infer(
        "n",
        "Number",
        |n: Num| async move { Ok::<_, BoxError>(n.n) },
    )
    .with_encoder(|_: &i64| Err("cannot encode".into()));
    let err = tool.invoke(r#"{"n":1}"#).await.unwrap_err();
    assert!(
        matches!(&err, ToolError::Output { tool, source } if tool == "n" && source.to_string() == "cannot encode"),
        "{err:?}"
    );
}

#[derive(Debug, Deserialize, JsonSchema)]
struct Text {
    text: String,
}

#[tokio::test]
async fn tools_are_usable_as_trait_objects() {
    let tools: Vec<Arc<dyn Tool>> = vec![
        Arc::new(weather_tool()),
        Arc::new(FunctionTool::infer("n", "Number", |n: Num| async move {
            Ok::<_, BoxError>(n.n)
        })),
    ];
    let names: Vec<String> = tools.iter().map(|t| t.info().name).collect();
    assert_eq!(names, ["get_weather", "n"]);
    assert_eq!(tools[1].invoke(r#"{"n":9}"#).await.unwrap(), "9");
}

#[tokio::test]
async fn streaming_function_tool_streams_encoded_chunks() {
    let tool = StreamingFunctionTool::infer("words", "Split text into words", |t: Text| {
        stream::iter(
            t.text
                .split_whitespace()
                .map(|w| Ok::<_, BoxError>(w.to_owned()))
                .collect::<Vec<_>>(),
        )
    });
    assert_eq!(tool.info().parameters, parameters_schema::<Text>());
    let chunks: Vec<String> = tool
        .invoke_stream(r#"{"text":"a bb ccc"}"#)
        .await
        .unwrap()
        .map(Result::unwrap)
        .collect()
        .await;
    // Default encoding is JSON, chunk by chunk.
    assert_eq!(chunks, [r#""a""#, r#""bb""#, r#""ccc""#]);

    let err = tool.invoke_stream(r#"{"txt":1}"#).await.err().unwrap();
    assert!(matches!(err, ToolError::InvalidArguments { .. }), "{err:?}");
}

#[tokio::test]
async fn streaming_errors_and_panics_become_items() {
    let tool = StreamingFunctionTool::new(
        ToolInfo::without_parameters("flaky", "Fails midway"),
        |_: Empty| {
            stream::iter(0..3).map(|i| match i {
                0 => Ok::<_, BoxError>(i),
                1 => Err("midway".into()),
                _ => panic!("chunk {i} exploded"),
            })
        },
    )
    .with_encoder(|i: &i32| Ok(i.to_string()));
    let items: Vec<_> = tool.invoke_stream("{}").await.unwrap().collect().await;
    assert_eq!(items.len(), 3);
    assert_eq!(items[0].as_ref().unwrap(), "0");
    assert!(matches!(&items[1], Err(ToolError::Failed { tool, .. }) if tool == "flaky"));
    assert!(
        matches!(&items[2], Err(ToolError::Panicked { message, .. }) if message == "chunk 2 exploded"),
        "{:?}",
        items[2]
    );
}

/// The arguments of a tool with two shapes.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(tag = "op", rename_all = "snake_case")]
enum Command {
    Create {
        #[allow(dead_code)]
        name: String,
    },
    Delete {
        id: u64,
    },
}

/// A tool without parameters, as a unit struct.
#[derive(Debug, Deserialize, JsonSchema)]
struct Nothing;

// Models' APIs take only an object at the root of a function's parameters: an enum of
// objects is marked one, and a unit type takes the empty object — and decodes from `{}`.
#[tokio::test]
async fn enum_and_unit_arguments_have_an_object_at_the_root() {
    let schema = parameters_schema::<Command>();
    assert_eq!(schema["type"], "object", "{schema}");
    assert!(schema["oneOf"].is_array(), "{schema}");
    let unit = parameters_schema::<Nothing>();
    assert_eq!(
        unit,
        serde_json::json!({"type": "object", "properties": {}})
    );
    assert_eq!(parameters_schema::<()>(), unit);
    let tool = FunctionTool::infer("noop", "Does nothing", |_: Nothing| async move {
        Ok::<_, std::convert::Infallible>("done")
    });
    for arguments in ["{}", "", " { } "] {
        assert_eq!(
            tool.invoke(arguments).await.unwrap(),
            r#""done""#,
            "{arguments:?}"
        );
    }
    let command: Command = decode_arguments("t", r#"{"op":"delete","id":7}"#).unwrap();
    assert!(matches!(command, Command::Delete { id: 7 }));
}

// An error of an agent or tools node the function ran itself (here an inner agent's step
// limit) is not this tool's caller's own: it becomes `Failed` naming this tool, its source
// the original error.
#[tokio::test]
async fn an_inner_agents_error_becomes_failed_naming_the_tool() {
    let tool = FunctionTool::infer("outer", "Runs an inner agent", |_: Empty| async move {
        Err::<(), _>(ToolError::StepLimit {
            limit: 3,
            transcript: Vec::new(),
        })
    });
    let err = tool.invoke("{}").await.unwrap_err();
    match &err {
        ToolError::Failed { tool, source } => {
            assert_eq!(tool, "outer");
            assert!(
                matches!(
                    source.downcast_ref::<ToolError>(),
                    Some(ToolError::StepLimit { limit: 3, .. })
                ),
                "{source:?}"
            );
        }
        other => panic!("unexpected error: {other:?}"),
    }
    let inner_errors: [fn() -> ToolError; 3] = [
        || ToolError::model("down"),
        || ToolError::UnknownTool {
            name: "ghost".into(),
        },
        || ToolError::DuplicateTool {
            name: "twice".into(),
        },
    ];
    for inner in inner_errors {
        let tool =
            FunctionTool::infer("outer", "Runs an inner agent", move |_: Empty| async move {
                Err::<(), _>(inner())
            });
        let err = tool.invoke("{}").await.unwrap_err();
        assert!(
            matches!(&err, ToolError::Failed { tool, .. } if tool == "outer"),
            "{err:?}"
        );
    }
    // An inner tool's error is not this call's either (the caller would be told it sent bad
    // arguments to a tool it never called); the same error naming this tool passes through.
    for (named, passes) in [("inner", false), ("outer", true)] {
        let tool = FunctionTool::infer("outer", "Runs an inner node", move |_: Empty| async move {
            Err::<(), _>(ToolError::invalid_arguments(named, ".", "a is missing"))
        });
        let err = tool.invoke("{}").await.unwrap_err();
        if passes {
            assert!(
                matches!(&err, ToolError::InvalidArguments { tool, .. } if tool == "outer"),
                "{err:?}"
            );
        } else {
            assert!(
                matches!(&err, ToolError::Failed { tool, .. } if tool == "outer"),
                "{err:?}"
            );
        }
    }
}

// An encoder that panics ends the stream with `Panicked` (not `Output`), as a panicking
// chunk does: nothing comes after it.
#[tokio::test]
async fn a_panicking_encoder_ends_the_stream_with_panicked() {
    let tool = StreamingFunctionTool::new(
        ToolInfo::without_parameters("count", "Counts to 3"),
        |_: Empty| stream::iter((1..=3).map(Ok::<_, BoxError>)),
    )
    .with_encoder(|i: &i32| {
        assert!(*i != 2, "cannot encode {i}");
        Ok(i.to_string())
    });
    let items: Vec<_> = tool.invoke_stream("{}").await.unwrap().collect().await;
    assert_eq!(items.len(), 2, "{items:?}");
    assert_eq!(items[0].as_ref().unwrap(), "1");
    assert!(
        matches!(&items[1], Err(ToolError::Panicked { tool, message }) if tool == "count" && message == "cannot encode 2"),
        "{:?}",
        items[1]
    );
}
