//! Runs a scripted chat model through the agent loop with two typed function
//! tools and prints the transcript.
//!
//! ```text
//! cargo run -p dtask-tool --example agent_loop
//! ```
//!
//! `tests/examples.rs` runs the same code and checks the transcript.

use std::sync::Arc;

use dtask_tool::{
    Agent, AgentRun, AssistantMessage, BoxError, FunctionTool, Message, ScriptedModel, ToolCall,
    ToolError, ToolsNode,
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Arguments of `get_weather`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct WeatherQuery {
    /// The city to look up.
    pub city: String,
}

/// Output of `get_weather`.
#[derive(Debug, Serialize)]
pub struct Weather {
    /// The city.
    pub city: String,
    /// The temperature in degrees Celsius.
    pub celsius: f64,
}

/// Arguments of `to_fahrenheit`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct Celsius {
    /// A temperature in degrees Celsius.
    pub celsius: f64,
}

/// Builds the tools node with the two tools.
///
/// # Errors
///
/// [`ToolError::DuplicateTool`] if the tool names clashed.
pub fn tools() -> Result<ToolsNode, ToolError> {
    let weather = FunctionTool::infer(
        "get_weather",
        "Get the current temperature of a city",
        |q: WeatherQuery| async move {
            let celsius = match q.city.as_str() {
                "Paris" => 18.0,
                "Oslo" => 7.0,
                other => return Err(BoxError::from(format!("no weather data for {other}"))),
            };
            Ok(Weather {
                city: q.city,
                celsius,
            })
        },
    );
    let fahrenheit = FunctionTool::infer(
        "to_fahrenheit",
        "Convert a temperature from Celsius to Fahrenheit",
        |c: Celsius| async move { Ok::<_, BoxError>(c.celsius * 9.0 / 5.0 + 32.0) },
    );
    ToolsNode::builder().tool(weather).tool(fahrenheit).build()
}

/// The scripted model: two parallel weather calls, a conversion, an answer.
pub fn model() -> ScriptedModel {
    ScriptedModel::new([
        AssistantMessage::with_tool_calls(vec![
            ToolCall::function("call_1", "get_weather", r#"{"city":"Paris"}"#),
            ToolCall::function("call_2", "get_weather", r#"{"city":"Oslo"}"#),
        ]),
        AssistantMessage::with_tool_calls(vec![ToolCall::function(
            "call_3",
            "to_fahrenheit",
            r#"{"celsius":18.0}"#,
        )]),
        AssistantMessage::text("Paris is warmer: 18 °C (64.4 °F), against 7 °C in Oslo."),
    ])
}

/// Runs the agent loop and returns the run.
///
/// # Errors
///
/// Any error of the loop (none with this script).
pub async fn run_demo() -> Result<AgentRun, ToolError> {
    let agent = Agent::new(Arc::new(model()), tools()?).with_max_steps(5);
    agent
        .run(vec![
            Message::system("You answer weather questions using the tools."),
            Message::user("Which is warmer right now, Paris or Oslo? Give Fahrenheit too."),
        ])
        .await
}

/// Renders a transcript, one line per message (or per tool call).
pub fn render(messages: &[Message]) -> String {
    let mut lines = Vec::new();
    for message in messages {
        match message {
            Message::Assistant(m) if m.has_tool_calls() => {
                lines.extend(m.tool_calls.iter().map(|call| {
                    format!(
                        "assistant -> {}({}) [{}]",
                        call.function.name, call.function.arguments, call.id
                    )
                }));
            }
            Message::Tool(m) => lines.push(format!("tool [{}]: {}", m.tool_call_id, m.content)),
            other => lines.push(format!(
                "{}: {}",
                other.role(),
                other.content().unwrap_or_default()
            )),
        }
    }
    let mut text = lines.join("\n");
    text.push('\n');
    text
}

#[tokio::main]
async fn main() -> Result<(), ToolError> {
    let run = run_demo().await?;
    print!("{}", render(&run.messages));
    println!("({} steps)", run.steps);
    Ok(())
}
