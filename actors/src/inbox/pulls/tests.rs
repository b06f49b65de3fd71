use super::*;
use async_nats::jetstream::{self, consumer::pull, stream, AckKind};

const WITHIN: Duration = Duration::from_secs(10);

/// How many times `m` was delivered, as its ack subject says.
fn delivered(m: &async_nats::Message) -> u64 {
    protocol::subjects::parse_ack_info(m.reply.as_deref().unwrap())
        .unwrap()
        .delivered
}

/// A stream `P` on `p.>` with the durable pull consumers `names` (batch-sized ack pending).
async fn stream_with(client: &Client, names: &[&str]) -> jetstream::Context {
    let js = jetstream::new(client.clone());
    js.create_stream(stream::Config {
        name: "P".into(),
        subjects: vec!["p.>".into()],
        ..Default::default()
    })
    .await
    .unwrap();
    for name in names {
        js.create_consumer_on_stream(
            pull::Config {
                durable_name: Some((*name).into()),
                filter_subject: format!("p.{name}"),
                ack_wait: Duration::from_secs(30),
                ..Default::default()
            },
            "P",
        )
        .await
        .unwrap();
    }
    js
}

async fn put(js: &jetstream::Context, subject: &str, body: &str) {
    js.publish(subject.to_owned(), body.to_owned().into())
        .await
        .unwrap()
        .await
        .unwrap();
}

async fn next_body(puller: &mut Puller, repulls: &crate::counters::Counter) -> String {
    match tokio::time::timeout(WITHIN, puller.next(repulls)).await {
        Ok(Pulled::Message(m)) => {
            ack_with(&puller.pulls.0.client, m.reply.clone(), AckKind::Ack)
                .await
                .unwrap();
            String::from_utf8(m.payload.to_vec()).unwrap()
        }
        Ok(Pulled::Gone(why)) => panic!("gone: {why}"),
        Ok(Pulled::Ended) => panic!("ended"),
        Err(_) => panic!("nothing within {WITHIN:?}"),
    }
}

#[tokio::test]
async fn many_consumers_share_one_subscription_and_each_gets_its_own_messages_in_order() {
    let server = harness::run_server().await.unwrap();
    let client = server.client().await.unwrap();
    let js = stream_with(&client, &["a", "b"]).await;
    let pulls = InboxPulls::new(client.clone());
    let (mut a, mut b) = (
        pulls.register("P", "a", 4).await.unwrap(),
        pulls.register("P", "b", 4).await.unwrap(),
    );
    assert_eq!(pulls.registered(), 2);
    for i in 0..10 {
        put(&js, "p.a", &format!("a{i}")).await;
        put(&js, "p.b", &format!("b{i}")).await;
    }
    let repulls = crate::counters::Counter::default();
    for i in 0..10 {
        assert_eq!(next_body(&mut a, &repulls).await, format!("a{i}"));
    }
    for i in 0..10 {
        assert_eq!(next_body(&mut b, &repulls).await, format!("b{i}"));
    }
    assert_eq!(repulls.get(), 0);
    // Its pull is still open at the broker: parked, not gone.
    drop(a);
    assert_eq!((pulls.registered(), pulls.parked()), (2, 1));
}

#[tokio::test]
async fn a_message_that_reaches_a_pull_of_a_stopped_inbox_comes_back_to_the_next_at_once() {
    let server = harness::run_server().await.unwrap();
    let client = server.client().await.unwrap();
    let js = stream_with(&client, &["a"]).await;
    let pulls = InboxPulls::new(client.clone());
    let repulls = crate::counters::Counter::default();
    let mut first = pulls.register("P", "a", 4).await.unwrap();
    put(&js, "p.a", "one").await;
    assert_eq!(next_body(&mut first, &repulls).await, "one");
    // Its pull is still open at the broker when it stops: its slot is parked.
    drop(first);
    assert_eq!((pulls.registered(), pulls.parked()), (1, 1));
    put(&js, "p.a", "two").await;
    put(&js, "p.a", "three").await;
    let mut next = pulls.register("P", "a", 4).await.unwrap();
    assert_eq!(pulls.parked(), 0);
    for body in ["two", "three"] {
        match tokio::time::timeout(WITHIN, next.next(&repulls)).await {
            Ok(Pulled::Message(m)) => {
                assert_eq!(String::from_utf8_lossy(&m.payload), body);
                // Handed over as the next incarnation's own: delivered once.
                assert_eq!(delivered(&m), 1);
                ack_with(&client, m.reply.clone(), AckKind::Ack)
                    .await
                    .unwrap();
            }
            _ => panic!("{body} did not come within {WITHIN:?}"),
        }
    }
}

#[tokio::test]
async fn a_parked_slot_nobody_takes_is_let_go_once_its_pulls_expired_and_its_messages_come_back() {
    let server = harness::run_server().await.unwrap();
    let client = server.client().await.unwrap();
    let js = stream_with(&client, &["a"]).await;
    let expires = Duration::from_secs(2);
    let pulls = InboxPulls::expiring(client.clone(), expires);
    let repulls = crate::counters::Counter::default();
    let mut first = pulls.register("P", "a", 4).await.unwrap();
    // It pulls when asked for a message: wait for the pull to be at the broker, then stop.
    let _ = tokio::time::timeout(Duration::from_millis(100), first.next(&repulls)).await;
    let mut consumer = js
        .get_consumer_from_stream::<pull::Config, _, _>("a", "P")
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + WITHIN;
    while consumer.info().await.unwrap().num_waiting == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no pull at the broker"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(first);
    put(&js, "p.a", "held").await;
    // Held by the parked slot (kept from redelivery), then let go and nak'd.
    let deadline = tokio::time::Instant::now() + WITHIN;
    while pulls.registered() > 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the parked slot stayed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Another process's inbox (a second connection) gets it at once, delivered twice.
    let other = InboxPulls::new(server.client().await.unwrap());
    let mut next = other.register("P", "a", 4).await.unwrap();
    match tokio::time::timeout(Duration::from_secs(5), next.next(&repulls)).await {
        Ok(Pulled::Message(m)) => {
            assert_eq!(&m.payload[..], b"held");
            assert_eq!(delivered(&m), 2);
        }
        _ => panic!("the nak'd message did not come back"),
    }
}

/// The watchdog may let go of a parked slot whose last pull expired at the very moment a
/// new registration takes it: the registration must own it (and get its messages), not an
/// orphan no longer in the map, whose messages the demultiplexer would nak for ever.
#[tokio::test]
async fn a_parked_slot_taken_over_as_the_watchdog_lets_it_go_is_the_new_registrations() {
    let server = harness::run_server().await.unwrap();
    let client = server.client().await.unwrap();
    let js = stream_with(&client, &["adopt"]).await;
    let expires = Duration::from_secs(2);
    let pulls = InboxPulls::expiring(client.clone(), expires);
    let repulls = crate::counters::Counter::default();
    let mut first = pulls.register("P", "adopt", 4).await.unwrap();
    let _ = tokio::time::timeout(Duration::from_millis(100), first.next(&repulls)).await;
    let parked = first.slot.clone();
    drop(first);
    assert_eq!(pulls.parked(), 1);
    // Its last pull long expired (the watchdog looks a minute later): it lets the slot go,
    // right between the registration finding the slot and owning it.
    let later = now_ms() + 60_000;
    let slots = pulls.0.slots.clone();
    ADOPTED.lock().unwrap().insert(
        "adopt".into(),
        Box::new(move || {
            let_go_if_expired(&slots, "adopt", &parked, later, expires);
        }),
    );
    let mut next = pulls.register("P", "adopt", 4).await.unwrap();
    assert_eq!(
        (pulls.registered(), pulls.parked()),
        (1, 0),
        "the registration owns the consumer's slot"
    );
    put(&js, "p.adopt", "mine").await;
    assert_eq!(next_body(&mut next, &repulls).await, "mine");
}

/// How many pull requests `pulls` of consumer `a` of `P` are waiting at the broker.
async fn waiting(js: &jetstream::Context, consumer: &str) -> usize {
    js.get_consumer_from_stream::<pull::Config, _, _>(consumer, "P")
        .await
        .unwrap()
        .info()
        .await
        .unwrap()
        .num_waiting
}

/// Pull numbers start again at every registration: the late end (`408`) of an earlier
/// registration's pull must not close the current one's pull of the same number, which
/// would make it pull again while that pull is still open (two pulls for a batch of one).
#[tokio::test]
async fn the_late_end_of_an_earlier_registrations_pull_closes_none_of_the_next_ones() {
    let server = harness::run_server().await.unwrap();
    let client = server.client().await.unwrap();
    let js = stream_with(&client, &["late"]).await;
    let expires = Duration::from_secs(2);
    let pulls = InboxPulls::expiring(client.clone(), expires);
    let repulls = crate::counters::Counter::default();
    let mut first = pulls.register("P", "late", 1).await.unwrap();
    let started = tokio::time::Instant::now();
    let _ = tokio::time::timeout(Duration::from_millis(100), first.next(&repulls)).await;
    drop(first);
    // The next registration pulls a second later: its pull #1 is open from 1 s to 3 s, the
    // first one's pull #1 ends (408) at 2 s.
    tokio::time::sleep_until(started + Duration::from_secs(1)).await;
    let mut next = pulls.register("P", "late", 1).await.unwrap();
    let watch = async {
        tokio::time::sleep_until(started + Duration::from_millis(2_300)).await;
        let mut most = 0;
        while tokio::time::Instant::now() < started + Duration::from_millis(2_900) {
            most = most.max(waiting(&js, "late").await);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        most
    };
    let (most, _) = tokio::join!(
        watch,
        tokio::time::timeout(Duration::from_millis(2_900), next.next(&repulls))
    );
    assert_eq!(most, 1, "pulls waiting at the broker for a batch of one");
}

/// A `409` that ends a pull and may end the next at once (a leadership change, in a
/// cluster that keeps electing) is pulled again after a pause, not at once in a loop. The
/// broker's `409` is sent here by a raw client on each pull's reply subject, as the
/// cluster's consumer leader would.
#[tokio::test]
async fn a_pull_ended_by_a_409_is_issued_again_after_a_pause_not_at_once() {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    let server = harness::run_server().await.unwrap();
    let client = server.client().await.unwrap();
    let _js = stream_with(&client, &["busy"]).await;
    let other = server.client().await.unwrap();
    let mut requests = other
        .subscribe("$JS.API.CONSUMER.MSG.NEXT.P.busy")
        .await
        .unwrap();
    other.flush().await.unwrap();
    // A raw connection that can send a status line.
    let address = server.url().trim_start_matches("nats://").to_owned();
    let raw = tokio::net::TcpStream::connect(address).await.unwrap();
    let (read, mut write) = raw.into_split();
    let mut read = tokio::io::BufReader::new(read);
    let mut info = String::new();
    read.read_line(&mut info).await.unwrap();
    write
        .write_all(b"CONNECT {\"verbose\":false,\"headers\":true,\"protocol\":1}\r\nPING\r\n")
        .await
        .unwrap();
    let mut pong = String::new();
    read.read_line(&mut pong).await.unwrap();
    assert_eq!(pong.trim_end(), "PONG");
    let status = "NATS/1.0 409 Leadership Change\r\n\r\n";
    let seen = Arc::new(AtomicU64::new(0));
    let counted = seen.clone();
    let responder = tokio::spawn(async move {
        while let Some(request) = requests.next().await {
            counted.fetch_add(1, Ordering::Relaxed);
            let reply = request.reply.unwrap();
            let frame = format!("HPUB {reply} {n} {n}\r\n{status}\r\n", n = status.len());
            write.write_all(frame.as_bytes()).await.unwrap();
        }
    });
    let pulls = InboxPulls::new(client.clone());
    let repulls = crate::counters::Counter::default();
    let mut puller = pulls.register("P", "busy", 4).await.unwrap();
    let _ = tokio::time::timeout(Duration::from_secs(1), puller.next(&repulls)).await;
    responder.abort();
    let issued = seen.load(Ordering::Relaxed);
    assert!(
        (2..=6).contains(&issued),
        "{issued} pulls within a second of 409s"
    );
}

#[tokio::test]
async fn a_consumer_deleted_under_its_puller_is_gone_and_a_replaced_registration_ends() {
    let server = harness::run_server().await.unwrap();
    let client = server.client().await.unwrap();
    let js = stream_with(&client, &["a", "b"]).await;
    let pulls = InboxPulls::new(client.clone());
    let repulls = crate::counters::Counter::default();
    let mut a = pulls.register("P", "a", 4).await.unwrap();
    put(&js, "p.a", "one").await;
    assert_eq!(next_body(&mut a, &repulls).await, "one");
    js.delete_consumer_from_stream("a", "P").await.unwrap();
    match tokio::time::timeout(WITHIN, a.next(&repulls)).await {
        Ok(Pulled::Gone(why)) => assert_eq!(why, "Consumer Deleted"),
        _ => panic!("the deletion was not seen"),
    }
    let mut old = pulls.register("P", "b", 4).await.unwrap();
    let mut new = pulls.register("P", "b", 4).await.unwrap();
    assert!(matches!(
        tokio::time::timeout(WITHIN, old.next(&repulls)).await,
        Ok(Pulled::Ended)
    ));
    // The replaced one going does not take the new one's slot.
    drop(old);
    assert_eq!(pulls.registered(), 2);
    put(&js, "p.b", "b1").await;
    assert_eq!(next_body(&mut new, &repulls).await, "b1");
}

#[tokio::test]
async fn a_burst_s_room_is_kept_while_the_inbox_is_busy_and_given_back_once_idle() {
    let server = harness::run_server().await.unwrap();
    let client = server.client().await.unwrap();
    let js = stream_with(&client, &["a"]).await;
    for i in 0..40 {
        put(&js, "p.a", &format!("m{i}")).await;
    }
    let pulls = InboxPulls::new(client.clone());
    let repulls = crate::counters::Counter::default();
    let mut a = pulls.register("P", "a", 64).await.unwrap();
    assert_eq!(next_body(&mut a, &repulls).await, "m0");
    // The rest of the burst arrives while nobody takes it.
    let deadline = tokio::time::Instant::now() + WITHIN;
    while a.slot.queue.lock().unwrap().len() < 39 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the burst did not come"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let room = a.slot.queue.lock().unwrap().capacity();
    assert!(room >= 39);
    for i in 1..40 {
        assert_eq!(next_body(&mut a, &repulls).await, format!("m{i}"));
    }
    // Emptied, and looked at again: the room stays for the next burst (messages came
    // during this watchdog tick).
    let _ = tokio::time::timeout(Duration::from_millis(50), a.next(&repulls)).await;
    assert_eq!(a.slot.queue.lock().unwrap().capacity(), room);
    // A whole tick without a message: given back.
    let deadline = tokio::time::Instant::now() + WITHIN;
    while a.slot.queue.lock().unwrap().capacity() > 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "an idle inbox kept its room"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // And the inbox still receives.
    put(&js, "p.a", "m40").await;
    assert_eq!(next_body(&mut a, &repulls).await, "m40");
}
