//! Waiting for SIGINT or SIGTERM.

/// Resolves at the first SIGINT (Ctrl-C) or SIGTERM.
///
/// # Errors
/// When the signal handlers cannot be installed.
///
/// # Cancel safety
/// Cancel safe.
pub async fn wait_for_signal() -> std::io::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM received"),
        _ = int.recv() => tracing::info!("SIGINT received"),
    }
    Ok(())
}
