//! The runtime's client on a 3-node JetStream cluster: given every node's URL (`NATS_URL` as a
//! comma-separated list), it connects past a dead node and reconnects to a live one when its
//! own is killed.

use std::time::Duration;

use harness::{wait_until_async, Cluster};
use runtime::NatsSettings;

const DEADLINE: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_given_every_nodes_url_connects_past_a_dead_node_and_reconnects_to_a_live_one() {
    let mut cluster = Cluster::start(3).await.unwrap();
    cluster.kill(0).await;
    let settings = NatsSettings::new(cluster.urls());
    let client = settings.connect("cluster-client").await.unwrap();
    let js = async_nats::jetstream::new(client.clone());
    let ports: Vec<u16> = (0..cluster.size())
        .map(|i| cluster.node(i).port())
        .collect();
    let node_of = |client: &async_nats::Client| {
        let port = client.server_info().port;
        ports.iter().position(|p| *p == port)
    };
    let first = node_of(&client).expect("connected to a node of the cluster");
    assert_ne!(first, 0, "the dead node is not the one it reached");
    js.query_account().await.unwrap();

    cluster.kill(first).await;
    cluster.restart(0).await.unwrap();
    wait_until_async(
        "a request answered through a live node",
        DEADLINE,
        || async {
            let answered = tokio::time::timeout(Duration::from_secs(2), js.query_account()).await;
            matches!(answered, Ok(Ok(_)))
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", cluster.logs()));
    let now = node_of(&client).expect("connected to a node of the cluster");
    assert_ne!(now, first, "it moved off the killed node");
}
