//! A TCP proxy between clients and a nats-server that can lose chosen client publishes on the
//! way, as a broker that forgot them would: the client believes it sent them, the server never
//! saw them. Nothing else is touched (plain TCP, no TLS).
//!
//! ```no_run
//! # async fn demo(server: &harness::NatsServer) -> Result<(), harness::HarnessError> {
//! let proxy = harness::Proxy::start(server.port()).await?;
//! // The next publish to a subject starting with this prefix is lost.
//! proxy.lose_next("$JS.API.CONSUMER.MSG.NEXT.", 1);
//! let client = async_nats::connect(proxy.url()).await.unwrap();
//! # drop(client);
//! # Ok(()) }
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::HarnessError;

/// What to lose: publishes whose subject starts with `prefix`, `count` more of them.
#[derive(Default)]
struct Losing {
    rule: Mutex<Option<(String, u64)>>,
    lost: AtomicU64,
}

/// A running proxy (it stops when dropped).
pub struct Proxy {
    port: u16,
    losing: Arc<Losing>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Listens on a free loopback port and forwards every connection to `server_port`.
    ///
    /// # Errors
    /// [`HarnessError::Io`] when it cannot listen.
    pub async fn start(server_port: u16) -> Result<Proxy, HarnessError> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(HarnessError::Io)?;
        let port = listener.local_addr().map_err(HarnessError::Io)?.port();
        let losing = Arc::new(Losing::default());
        let shared = losing.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let losing = shared.clone();
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(("127.0.0.1", server_port)).await {
                        relay(client, server, losing).await;
                    }
                });
            }
        });
        Ok(Proxy { port, losing, task })
    }

    /// The URL clients connect to.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Loses the next `count` publishes (PUB or HPUB, from any client) whose subject starts
    /// with `prefix`.
    pub fn lose_next(&self, prefix: &str, count: u64) {
        *self.losing.rule.lock().expect("proxy lock") = Some((prefix.to_owned(), count));
    }

    /// How many publishes were lost so far.
    pub fn lost(&self) -> u64 {
        self.losing.lost.load(Ordering::Acquire)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn relay(client: TcpStream, server: TcpStream, losing: Arc<Losing>) {
    let (mut client_rd, mut client_wr) = client.into_split();
    let (mut server_rd, mut server_wr) = server.into_split();
    let down = async {
        let _ = tokio::io::copy(&mut server_rd, &mut client_wr).await;
    };
    let up = async {
        let mut pending: Vec<u8> = Vec::new();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match client_rd.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            pending.extend_from_slice(&buf[..n]);
            let (out, used) = filter(&pending, &losing);
            pending.drain(..used);
            if server_wr.write_all(&out).await.is_err() {
                return;
            }
        }
    };
    tokio::select! {
        _ = down => {}
        _ = up => {}
    }
}

/// The complete client operations at the start of `bytes`, minus the publishes to lose, and
/// how many bytes they took (the rest waits for more).
fn filter(bytes: &[u8], losing: &Losing) -> (Vec<u8>, usize) {
    let mut out = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while let Some(eol) = find_crlf(&bytes[at..]) {
        let line = &bytes[at..at + eol];
        let mut words = line.split(|b| *b == b' ').filter(|w| !w.is_empty());
        let op = words.next().unwrap_or_default().to_ascii_uppercase();
        let mut end = at + eol + 2;
        let mut subject: &[u8] = b"";
        if op == b"PUB" || op == b"HPUB" {
            let args: Vec<&[u8]> = words.collect();
            subject = args.first().copied().unwrap_or_default();
            let size = args
                .last()
                .and_then(|s| std::str::from_utf8(s).ok())
                .and_then(|s| s.parse::<usize>().ok())
                .unwrap_or(0);
            // The payload (with headers, for HPUB) and its CRLF.
            end += size + 2;
            if end > bytes.len() {
                break;
            }
        }
        if !subject.is_empty() && take_loss(losing, subject) {
            losing.lost.fetch_add(1, Ordering::AcqRel);
        } else {
            out.extend_from_slice(&bytes[at..end]);
        }
        at = end;
    }
    (out, at)
}

fn take_loss(losing: &Losing, subject: &[u8]) -> bool {
    let mut rule = losing.rule.lock().expect("proxy lock");
    match rule.as_mut() {
        Some((prefix, count)) if *count > 0 && subject.starts_with(prefix.as_bytes()) => {
            *count -= 1;
            true
        }
        _ => false,
    }
}

fn find_crlf(bytes: &[u8]) -> Option<usize> {
    bytes.windows(2).position(|w| w == b"\r\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_chosen_publishes_are_lost_and_partial_ones_wait() {
        let losing = Losing::default();
        *losing.rule.lock().unwrap() = Some(("$JS.API.CONSUMER.MSG.NEXT.".into(), 1));
        let ops = b"PING\r\nPUB a.b _INBOX.1 2\r\nhi\r\nPUB $JS.API.CONSUMER.MSG.NEXT.S.c _INBOX.2 11\r\n{\"batch\":1}\r\nHPUB x 12 14\r\nNATS/1.0\r\n\r\nhi\r\nPUB $JS.API.CONSUMER.MSG.NEXT.S.c _INBOX.3 11\r\n{\"batch\":1}\r\nPUB partial 5\r\nab";
        let (out, used) = filter(ops, &losing);
        let out = String::from_utf8(out).unwrap();
        assert_eq!(
            out,
            "PING\r\nPUB a.b _INBOX.1 2\r\nhi\r\nHPUB x 12 14\r\nNATS/1.0\r\n\r\nhi\r\nPUB $JS.API.CONSUMER.MSG.NEXT.S.c _INBOX.3 11\r\n{\"batch\":1}\r\n"
        );
        assert_eq!(&ops[used..], b"PUB partial 5\r\nab");
        assert_eq!(losing.lost.load(Ordering::Acquire), 1);
    }
}
