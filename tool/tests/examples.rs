//! Runs the code of `examples/agent_loop.rs` and checks its transcript.
#![allow(clippy::unwrap_used)]

#[path = "../examples/agent_loop.rs"]
#[allow(dead_code)]
mod agent_loop;

#[tokio::test]
async fn agent_loop_example_produces_the_expected_transcript() {
    let run = agent_loop::run_demo().await.unwrap();
    assert_eq!(run.steps, 3);
    assert_eq!(
        agent_loop::render(&run.messages),
        "system: You answer weather questions using the tools.\n\
         user: Which is warmer right now, Paris or Oslo? Give Fahrenheit too.\n\
         assistant -> get_weather({\"city\":\"Paris\"}) [call_1]\n\
         assistant -> get_weather({\"city\":\"Oslo\"}) [call_2]\n\
         tool [call_1]: {\"city\":\"Paris\",\"celsius\":18.0}\n\
         tool [call_2]: {\"city\":\"Oslo\",\"celsius\":7.0}\n\
         assistant -> to_fahrenheit({\"celsius\":18.0}) [call_3]\n\
         tool [call_3]: 64.4\n\
         assistant: Paris is warmer: 18 °C (64.4 °F), against 7 °C in Oslo.\n"
    );
}
