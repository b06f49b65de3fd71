//! A custom host that embeds the hub runtime as a library.
//!
//! ```sh
//! scripts/run.sh &                       # or any nats-server with JetStream on 127.0.0.1:4222
//! cargo run -p examples --example embedded_host
//! ```
//!
//! It builds an [`ActorSystem`], starts a durable router under its supervisor, prints the
//! snapshot of every actor, and shuts down gracefully on Ctrl-C.

use std::time::Duration;

use runtime::{ActorSystem, NatsSettings};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let _telemetry = runtime::telemetry::init(false, "info")?;
    let url = std::env::var("NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into());
    let delivery = runtime::config::load_delivery_config(
        std::env::var_os("NATS_HUB_DELIVERY_CONFIG")
            .map(std::path::PathBuf::from)
            .as_deref(),
    )?;

    let system = ActorSystem::builder()
        .nats(NatsSettings::new(url))
        .durable(true)
        .delivery_config(delivery)
        .build()
        .await?;
    system.start_router().await?;

    let snapshot = system.snapshot().await?;
    println!("{}", serde_json::to_string_pretty(&snapshot)?);
    tracing::info!("embedded router running; Ctrl-C stops it");

    if std::env::var_os("EMBEDDED_HOST_ONESHOT").is_none() {
        runtime::shutdown::wait_for_signal().await?;
    }
    system.shutdown(Duration::from_secs(10)).await?;
    Ok(())
}
