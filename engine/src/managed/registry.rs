//! The managed-tool registry: registrations by name, in two maps (plain and recoverable).

use super::codec::{PLAIN_EXECUTOR_KEY, RECOVERABLE_EXECUTOR_KEY};
use super::error::ToolRegistryError;
use super::result::RenderFn;
use super::tool::{BackgroundTool, OutputMaterializer};
use crate::tool::ToolInfo;
use std::collections::HashMap;
use std::sync::Arc;

/// A task description derived from a call's arguments (pure, deterministic).
pub type DescribeFn = Arc<dyn Fn(&str) -> String + Send + Sync>;

/// One registered tool.
#[derive(Clone)]
pub struct Registration {
    /// What the model is told about the tool.
    pub info: ToolInfo,
    /// The tool.
    pub tool: Arc<dyn BackgroundTool>,
    /// The task description of a call (default: the tool's name).
    pub describe: Option<DescribeFn>,
    /// Where transcripts go, if anywhere.
    pub materializer: Option<Arc<dyn OutputMaterializer>>,
    /// Renders completed results as rich parts (the envelope then omits `output`).
    pub render: Option<RenderFn>,
    /// How many times a background call of a recoverable tool may be recovered after its
    /// engine died before the next loss fails it (`None`: no limit; see
    /// [`crate::Executor::max_recoveries`]).
    pub max_recoveries: Option<u64>,
}

impl std::fmt::Debug for Registration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registration")
            .field("name", &self.info.name)
            .field("recoverable", &self.is_recoverable())
            .finish_non_exhaustive()
    }
}

impl Registration {
    /// A registration of `tool` described by `info`.
    pub fn new(info: ToolInfo, tool: impl BackgroundTool) -> Self {
        Self {
            info,
            tool: Arc::new(tool),
            describe: None,
            materializer: None,
            render: None,
            max_recoveries: None,
        }
    }

    /// Caps how many times a background call of this tool is recovered after its engine died
    /// (a recoverable tool's; a plain tool's call fails at the first loss anyway).
    #[must_use]
    pub fn with_max_recoveries(mut self, max_recoveries: u64) -> Self {
        self.max_recoveries = Some(max_recoveries);
        self
    }

    /// Sets the result renderer.
    #[must_use]
    pub fn with_renderer(mut self, render: RenderFn) -> Self {
        self.render = Some(render);
        self
    }

    /// Sets the description function.
    #[must_use]
    pub fn with_description(mut self, describe: DescribeFn) -> Self {
        self.describe = Some(describe);
        self
    }

    /// Sets the output materializer.
    #[must_use]
    pub fn with_materializer(mut self, materializer: Arc<dyn OutputMaterializer>) -> Self {
        self.materializer = Some(materializer);
        self
    }

    /// Whether the tool can be recovered after the engine dies.
    #[must_use]
    pub fn is_recoverable(&self) -> bool {
        self.tool.as_recoverable().is_some()
    }

    /// The executor key tasks of this tool run under.
    #[must_use]
    pub fn executor_key(&self) -> &'static str {
        if self.is_recoverable() {
            RECOVERABLE_EXECUTOR_KEY
        } else {
            PLAIN_EXECUTOR_KEY
        }
    }

    /// The description of a call with `arguments`.
    #[must_use]
    pub fn description(&self, arguments: &str) -> String {
        self.describe
            .as_ref()
            .map_or_else(|| self.info.name.clone(), |d| d(arguments))
    }
}

/// Registered managed tools. The same name may exist once in each map (for migrations);
/// resolution of a new call prefers the recoverable one, while a stored task resolves only in
/// the map of its executor key.
#[derive(Debug, Clone, Default)]
pub struct ToolRegistry {
    plain: HashMap<String, Arc<Registration>>,
    recoverable: HashMap<String, Arc<Registration>>,
}

impl ToolRegistry {
    /// An empty registry.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers a tool.
    ///
    /// # Errors
    /// [`ToolRegistryError::EmptyName`], or [`ToolRegistryError::Duplicate`] when a tool of the
    /// same class has the name already.
    pub fn register(&mut self, registration: Registration) -> Result<(), ToolRegistryError> {
        let name = registration.info.name.clone();
        let map = if registration.is_recoverable() {
            &mut self.recoverable
        } else {
            &mut self.plain
        };
        if name.is_empty() {
            return Err(ToolRegistryError::EmptyName);
        }
        if map.contains_key(&name) {
            return Err(ToolRegistryError::Duplicate { name });
        }
        map.insert(name, Arc::new(registration));
        Ok(())
    }

    /// The registration for a new call of `name` (recoverable first).
    #[must_use]
    pub fn resolve_any(&self, name: &str) -> Option<Arc<Registration>> {
        self.recoverable
            .get(name)
            .or_else(|| self.plain.get(name))
            .cloned()
    }

    /// What the model is told about every registered tool, by name (a name registered in
    /// both maps once, as [`ToolRegistry::resolve_any`] resolves it).
    #[must_use]
    pub fn infos(&self) -> Vec<ToolInfo> {
        let mut names: Vec<&String> = self.recoverable.keys().chain(self.plain.keys()).collect();
        names.sort();
        names.dedup();
        names
            .into_iter()
            .filter_map(|name| self.resolve_any(name).map(|r| r.info.clone()))
            .collect()
    }

    /// The registration of `name` under `executor_key`.
    #[must_use]
    pub fn resolve(&self, executor_key: &str, name: &str) -> Option<Arc<Registration>> {
        match executor_key {
            RECOVERABLE_EXECUTOR_KEY => self.recoverable.get(name).cloned(),
            PLAIN_EXECUTOR_KEY => self.plain.get(name).cloned(),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::managed::error::{ToolFailure, ToolRunError};
    use crate::managed::tool::{StartRequest, StartResult};
    use crate::managed::tools::ApprovalTool;
    use async_trait::async_trait;

    struct Plain;

    #[async_trait]
    impl BackgroundTool for Plain {
        fn validate_arguments(&self, _arguments: &str) -> Result<(), ToolFailure> {
            Ok(())
        }

        async fn start(&self, _request: StartRequest) -> Result<StartResult, ToolRunError> {
            Err(ToolRunError::failed("never started"))
        }
    }

    fn registration(name: &str, tool: impl BackgroundTool) -> Registration {
        Registration::new(ToolInfo::without_parameters(name, "a tool"), tool)
    }

    #[test]
    fn a_name_is_registered_once_per_class() {
        let mut registry = ToolRegistry::new();
        assert_eq!(
            registry.register(registration("", Plain)),
            Err(ToolRegistryError::EmptyName)
        );
        registry
            .register(registration("ask", ApprovalTool))
            .unwrap();
        // The same name once in each class (a migration).
        registry.register(registration("ask", Plain)).unwrap();
        let again = registry.register(registration("ask", ApprovalTool));
        assert_eq!(
            again,
            Err(ToolRegistryError::Duplicate { name: "ask".into() })
        );
        assert_eq!(
            again.unwrap_err().to_string(),
            "managed tool \"ask\" is registered already"
        );
        assert!(registry.resolve_any("ask").unwrap().is_recoverable());
        assert!(!registry
            .resolve(PLAIN_EXECUTOR_KEY, "ask")
            .unwrap()
            .is_recoverable());
    }
}
