//! Tools shipped with the crate, as examples and for tests: a recoverable shell tool and a
//! resumable approval tool.

mod approval;
mod shell;

pub use approval::ApprovalTool;
pub use shell::ShellTool;
