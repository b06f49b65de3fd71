//! The harness's own tests against a real nats-server.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, stream};
use async_nats::Event;
use harness::{run_server, wait_until, NatsServer, ServerOptions};

const DEADLINE: Duration = Duration::from_secs(20);

#[tokio::test]
async fn message_published_to_a_stream_survives_restart() {
    let mut server = NatsServer::run(ServerOptions {
        sync_always: true,
        ..Default::default()
    })
    .await
    .unwrap();
    let js = jetstream::new(server.client().await.unwrap());
    let stream = js
        .create_stream(stream::Config {
            name: "SURVIVE".into(),
            subjects: vec!["survive.>".into()],
            ..Default::default()
        })
        .await
        .unwrap();
    drop(stream);
    let ack = js
        .publish("survive.one", "kept".into())
        .await
        .unwrap()
        .await
        .unwrap();
    assert_eq!(ack.sequence, 1);

    server.restart().await.unwrap();

    let js = jetstream::new(server.client().await.unwrap());
    let stream = js.get_stream("SURVIVE").await.unwrap();
    let msg = stream.get_raw_message(ack.sequence).await.unwrap();
    assert_eq!(msg.subject.as_str(), "survive.one");
    assert_eq!(&msg.payload[..], b"kept");
}

#[tokio::test]
async fn client_sees_outage_and_reconnects_after_start() {
    let mut server = run_server().await.unwrap();
    let disconnects = Arc::new(AtomicUsize::new(0));
    let connects = Arc::new(AtomicUsize::new(0));
    let (d, c) = (disconnects.clone(), connects.clone());
    let client = async_nats::ConnectOptions::new()
        .event_callback(move |event| {
            let (d, c) = (d.clone(), c.clone());
            async move {
                match event {
                    Event::Disconnected => {
                        d.fetch_add(1, Ordering::SeqCst);
                    }
                    Event::Connected => {
                        c.fetch_add(1, Ordering::SeqCst);
                    }
                    _ => {}
                }
            }
        })
        .connect(server.url())
        .await
        .unwrap();

    server.stop().await;
    wait_until("client sees the outage", DEADLINE, || {
        disconnects.load(Ordering::SeqCst) >= 1
    })
    .await
    .unwrap();
    assert_eq!(
        client.connection_state(),
        async_nats::connection::State::Disconnected
    );

    let connected_before = connects.load(Ordering::SeqCst);
    server.start().await.unwrap();
    wait_until("client reconnects", DEADLINE, || {
        connects.load(Ordering::SeqCst) > connected_before
    })
    .await
    .unwrap();

    // The reconnected client really works: a request/reply round trip through the server.
    let mut sub = client.subscribe("echo").await.unwrap();
    let responder = client.clone();
    tokio::spawn(async move {
        use futures::StreamExt;
        if let Some(msg) = sub.next().await {
            if let Some(reply) = msg.reply {
                responder.publish(reply, msg.payload).await.unwrap();
            }
        }
    });
    client.flush().await.unwrap();
    let reply = tokio::time::timeout(DEADLINE, client.request("echo", "ping".into()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&reply.payload[..], b"ping");
}

#[tokio::test]
async fn store_is_deleted_on_drop() {
    let server = run_server().await.unwrap();
    let store = server.store_dir();
    assert!(store.exists(), "jetstream store dir exists while running");
    drop(server);
    assert!(!store.exists(), "store dir removed on drop");
}
