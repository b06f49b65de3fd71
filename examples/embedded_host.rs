//! A custom host that embeds the hub runtime as a library.
//!
//! ```sh
//! scripts/run.sh &                       # or any nats-server with JetStream on 127.0.0.1:4222
//! cargo run -p examples --example embedded_host
//! ```
//!
//! It builds an [`ActorSystem`], starts a durable router under its supervisor, attaches bob's
//! inbox with a handler, sends bob a DM from alice, prints the snapshot of every actor, and
//! shuts down gracefully on Ctrl-C (`EMBEDDED_HOST_ONESHOT=1` exits after the first DM).

use std::time::Duration;

use runtime::{ActorSystem, AgentId, NatsSettings};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    examples::args::from_env_or_exit(
        "embedded_host",
        &[],
        "runs a durable router and bob's inbox against NATS_URL (default nats://127.0.0.1:4222); \
         EMBEDDED_HOST_ONESHOT=1 exits after the first DM",
    );
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

    let (alice, bob) = (AgentId::new("alice")?, AgentId::new("bob")?);
    let (got_tx, mut got_rx) = tokio::sync::mpsc::unbounded_channel();
    system
        .attach_inbox(&bob, move |delivery| {
            let from = delivery.envelope.meta.from.clone();
            println!("bob got {} from {from:?}", delivery.envelope.body);
            let _ = got_tx.send(());
            Box::pin(async {})
        })
        .await?;
    let receipt = system
        .send(
            &alice,
            &bob,
            serde_json::json!("hello from an embedded host"),
        )
        .await?;
    println!(
        "alice's DM accepted at ingress sequence {:?}",
        receipt.ingress_seq
    );
    got_rx.recv().await;

    let snapshot = system.snapshot().await?;
    println!("{}", serde_json::to_string_pretty(&snapshot)?);
    tracing::info!("embedded router running; Ctrl-C stops it");

    if std::env::var_os("EMBEDDED_HOST_ONESHOT").is_none() {
        runtime::shutdown::wait_for_signal().await?;
    }
    system.shutdown(Duration::from_secs(10)).await?;
    Ok(())
}
