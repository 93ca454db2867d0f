//! Pods whose admin port misbehaves: it refuses every config push with an HTTP status, or
//! accepts the connection and never answers. Each records when it was asked and what
//! `Authorization` header came with the push (a malicious pod keeps the operator's token).

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// What the pod does with a push.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Answer with this status (500, 403, ...).
    Status(u16),
    /// Accept the connection, read the request, never answer.
    Hang,
}

/// A misbehaving pod.
#[derive(Debug, Clone)]
pub struct BadPod {
    /// Pod name.
    pub name: String,
    /// When each push arrived.
    pub pushes: Arc<Mutex<Vec<Instant>>>,
    /// The bearer token of each push that carried one.
    pub tokens: Arc<Mutex<Vec<String>>>,
}

impl BadPod {
    /// The arrival times so far.
    pub fn push_times(&self) -> Vec<Instant> {
        self.pushes.lock().unwrap().clone()
    }

    /// The bearer tokens captured so far.
    pub fn captured_tokens(&self) -> Vec<String> {
        self.tokens.lock().unwrap().clone()
    }
}

/// Reads a request head (up to the blank line, at most 64 KiB).
fn read_head(conn: &mut std::net::TcpStream) -> String {
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 64 * 1024 {
        match conn.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    String::from_utf8_lossy(&head).into_owned()
}

/// Starts a Ready pod `name` of `app` in `ns` whose admin port behaves as `refusal`.
pub async fn start(
    client: &kube::Client,
    ns: &str,
    app: &str,
    name: &str,
    refusal: Refusal,
) -> BadPod {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let pushes: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let tokens: Arc<Mutex<Vec<String>>> = Arc::default();
    let (p2, t2) = (pushes.clone(), tokens.clone());
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for mut conn in listener.incoming().flatten() {
            let head = read_head(&mut conn);
            if head.starts_with("PUT ") {
                p2.lock().unwrap().push(Instant::now());
                let token = head.lines().find_map(|l| {
                    let (name, value) = l.split_once(':')?;
                    let value = value.trim();
                    (name.eq_ignore_ascii_case("authorization")
                        && value.len() > 7
                        && value[..7].eq_ignore_ascii_case("bearer "))
                    .then(|| value[7..].trim().to_owned())
                });
                t2.lock().unwrap().extend(token);
            }
            match refusal {
                Refusal::Status(code) => {
                    let body = format!(r#"{{"error":"injected {code}"}}"#);
                    let _ = write!(
                        conn,
                        "HTTP/1.1 {code} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    );
                }
                // Keep the socket open and silent.
                Refusal::Hang => held.push(conn),
            }
        }
    });
    super::pods::create_ready(client, ns, app, name, port).await;
    BadPod {
        name: name.to_owned(),
        pushes,
        tokens,
    }
}
