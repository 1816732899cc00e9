//! Stopping a long command cleanly on SIGINT or SIGTERM: once [`Interrupt::install`] has run,
//! the first signal no longer ends the process; it sets a flag that the command looks at
//! between its steps ([`Interrupt::check`]), so that it can undo what it left half done (an
//! import's staging copy) before it exits with [`CliError::Interrupted`] (exit 130). A
//! second signal ends the process at once (exit 130), whatever is left behind.

use super::{CliError, Result};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tokio::signal::unix::{signal, SignalKind};

/// The flag SIGINT and SIGTERM set.
#[derive(Debug, Clone)]
pub struct Interrupt {
    flag: Arc<AtomicBool>,
}

impl Interrupt {
    /// Installs the handlers (on a thread of their own, with a runtime of its own: the
    /// commands that use this run off any runtime).
    pub fn install() -> Result<Self> {
        let failed = CliError::io("installing a signal handler");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()
            .map_err(CliError::io("installing a signal handler"))?;
        let (mut interrupt, mut terminate) = runtime
            .block_on(async {
                Ok::<_, std::io::Error>((
                    signal(SignalKind::interrupt())?,
                    signal(SignalKind::terminate())?,
                ))
            })
            .map_err(failed)?;
        let flag = Arc::new(AtomicBool::new(false));
        let set = Arc::clone(&flag);
        std::thread::Builder::new()
            .name("dtask-signals".into())
            .spawn(move || {
                runtime.block_on(async move {
                    let mut signals = 0;
                    loop {
                        tokio::select! {
                            _ = interrupt.recv() => {}
                            _ = terminate.recv() => {}
                        }
                        signals += 1;
                        set.store(true, Ordering::Release);
                        if signals > 1 {
                            // A second signal: the command did not stop at the first (a
                            // long audit, a database that does not answer) — the process
                            // ends now, as the signal would have ended it.
                            eprintln!("dtask: interrupted again: stopping at once");
                            std::process::exit(130);
                        }
                    }
                });
            })
            .map_err(CliError::io("installing a signal handler"))?;
        Ok(Self { flag })
    }

    /// Whether a signal came.
    pub fn is_set(&self) -> bool {
        self.flag.load(Ordering::Acquire)
    }

    /// [`CliError::Interrupted`] once a signal came, `what` saying what was undone.
    pub fn check(&self, what: &str) -> Result<()> {
        if self.is_set() {
            Err(CliError::Interrupted(what.to_owned()))
        } else {
            Ok(())
        }
    }
}
