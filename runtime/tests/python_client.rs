//! The wire protocol is language-neutral: a nats-py client (examples/python/dm.py) sends DMs
//! through the router and reads them back through attach + its inbox consumer.

use std::time::Duration;

use runtime::{ActorSystem, NatsSettings};

#[tokio::test]
async fn python_client_sends_and_receives_dms_through_the_router() {
    let root = harness::workspace_root();
    let pylib = root.join(".tools/pylib");
    assert!(
        pylib.join("nats").is_dir(),
        "nats-py is missing from {}: run scripts/setup.sh",
        pylib.display()
    );
    let server = harness::run_server().await.unwrap();
    let system = ActorSystem::builder()
        .nats(NatsSettings::new(server.url()))
        .durable(true)
        .build()
        .await
        .unwrap();
    system.start_router().await.unwrap();

    let run = tokio::process::Command::new("python3")
        .arg(root.join("examples/python/dm.py"))
        .args([server.url().as_str(), "alice", "bob", "3"])
        .env("PYTHONPATH", &pylib)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("python client finishes")
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "python client failed: {}\n{}",
        stdout,
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 3);
    for (i, line) in lines.iter().enumerate() {
        // The router stamped the sender from the subject identity, and kept the order.
        assert_eq!(line["from"], "alice");
        assert_eq!(line["body"], format!("hello {i} from python"));
    }
    system.shutdown(Duration::from_secs(10)).await.unwrap();
}
