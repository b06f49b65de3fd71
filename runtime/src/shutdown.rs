//! Waiting for SIGINT or SIGTERM.

/// Resolves at the first SIGINT (Ctrl-C) or SIGTERM.
///
/// # Errors
/// When the signal handlers cannot be installed.
///
/// # Cancel safety
/// Cancel safe.
pub async fn wait_for_signal() -> std::io::Result<()> {
    Signals::install()?.recv().await;
    Ok(())
}

/// SIGINT/SIGTERM handlers installed up front, so that a signal during startup is not fatal.
pub struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Signals {
    /// Installs both handlers.
    ///
    /// # Errors
    /// When the signal handlers cannot be installed.
    pub fn install() -> std::io::Result<Signals> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Signals {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
        })
    }

    /// Resolves at the first SIGINT or SIGTERM (also one received since `install`).
    pub async fn recv(mut self) {
        tokio::select! {
            _ = self.term.recv() => tracing::info!("SIGTERM received"),
            _ = self.int.recv() => tracing::info!("SIGINT received"),
        }
    }
}
