//! Chat models for the durable agent's tests: `HangsFirst`, whose first call never answers
//! (a run must drop it — for a message sent to preempt, say) and whose later calls answer
//! "stopped", recording what each call was sent; and `counting_run`, a manager with an
//! agent of that model and a run submitted.
#![allow(dead_code, clippy::unwrap_used, clippy::missing_panics_doc)]

use dtask_engine::agent::{AgentRequest, DurableAgent};
use dtask_engine::async_trait;
use dtask_engine::managed::{ManagedTools, ToolRegistry};
use dtask_engine::tool::{AssistantMessage, ChatModel, Message, ToolError, ToolInfo};
use dtask_engine::{ExecutorRegistry, Manager, ManagerConfig, TaskStore};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;

/// A model whose first call never answers and whose later calls answer "stopped".
#[derive(Default)]
pub struct HangsFirst {
    calls: AtomicUsize,
    /// Notified at each call.
    pub called: Notify,
    requests: Mutex<Vec<Vec<Message>>>,
}

impl HangsFirst {
    /// What each call was sent, in order.
    pub fn requests(&self) -> Vec<Vec<Message>> {
        self.requests.lock().unwrap().clone()
    }
}

#[async_trait]
impl ChatModel for HangsFirst {
    async fn generate(
        &self,
        messages: &[Message],
        _tools: &[ToolInfo],
    ) -> Result<AssistantMessage, ToolError> {
        self.requests.lock().unwrap().push(messages.to_vec());
        self.called.notify_one();
        if self.calls.fetch_add(1, Ordering::SeqCst) == 0 {
            std::future::pending::<()>().await;
        }
        Ok(AssistantMessage::text("stopped"))
    }
}

/// A manager over `store` with an agent of a fresh [`HangsFirst`] (no tools), and the run
/// `run` submitted, asking it to count to a million.
pub async fn counting_run(
    store: &TaskStore,
    run: &str,
) -> (Arc<HangsFirst>, DurableAgent, Manager) {
    let model = Arc::new(HangsFirst::default());
    let agent = DurableAgent::new(model.clone(), ManagedTools::new(ToolRegistry::new()))
        .with_poll_interval(Duration::from_millis(20));
    let mut executors = ExecutorRegistry::new();
    agent.register_executors(&mut executors).unwrap();
    let manager = Manager::new(store.clone(), executors, ManagerConfig::default());
    agent
        .submit(
            &manager,
            AgentRequest::new(vec![Message::user("count to a million")]).with_task_id(run),
        )
        .await
        .unwrap();
    (model, agent, manager)
}

/// Awaits `running` (the run of a [`counting_run`], steered by a message sent to preempt)
/// and checks it was: completed, its model asked twice, the second time with `text` last.
pub async fn steered<E: std::fmt::Debug>(
    running: tokio::task::JoinHandle<Result<dtask_replay::TaskState, E>>,
    model: &HangsFirst,
    text: &str,
) -> dtask_replay::TaskState {
    let done = tokio::time::timeout(Duration::from_secs(60), running)
        .await
        .expect("the model call in flight was dropped for the message")
        .expect("the run's task")
        .expect("the run");
    assert_eq!(done.status, dtask_replay::Status::Completed, "{done:?}");
    let requests = model.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[1].last(), Some(&Message::user(text)));
    done
}
