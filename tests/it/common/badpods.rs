//! Pods whose admin port misbehaves: it refuses every config push with an HTTP status, or
//! accepts the connection and never answers. Each records when it was asked.

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
}

impl BadPod {
    /// The arrival times so far.
    pub fn push_times(&self) -> Vec<Instant> {
        self.pushes.lock().unwrap().clone()
    }
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
    let p2 = pushes.clone();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for mut conn in listener.incoming().flatten() {
            let mut buf = [0u8; 4096];
            let n = conn.read(&mut buf).unwrap_or(0);
            let head = String::from_utf8_lossy(&buf[..n]).into_owned();
            if head.starts_with("PUT ") {
                p2.lock().unwrap().push(Instant::now());
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
    }
}
