//! A Prometheus HTTP API on loopback whose answers the test chooses: a pass-through proxy to a
//! real Prometheus (optionally delayed), or crafted responses to `/api/v1/query` (HTTP errors,
//! NaN samples, empty vectors, garbage). Counts the queries it receives.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use backpressure_api::wire::metrics as m;

/// How the fake answers a query.
#[derive(Debug, Clone, PartialEq)]
pub enum PromMode {
    /// Forward to the upstream Prometheus.
    Pass,
    /// Forward to the upstream after this delay (a slow Prometheus).
    Delay(Duration),
    /// Answer with this HTTP status and a Prometheus error document.
    Status(u16),
    /// A successful instant vector with one series per workload whose value is NaN (with a
    /// fresh sample timestamp, so only the NaN makes it unknown).
    Nan,
    /// A successful, empty instant vector.
    Empty,
    /// HTTP 200 with this body, whatever it is.
    Raw(String),
}

#[derive(Debug)]
struct State {
    mode: PromMode,
    /// (namespace, workload) pairs the crafted vectors report.
    workloads: Vec<(String, String)>,
}

/// The fake Prometheus.
#[derive(Debug, Clone)]
pub struct FakeProm {
    state: Arc<Mutex<State>>,
    queries: Arc<AtomicU64>,
    /// `127.0.0.1:<port>`.
    pub address: String,
}

impl FakeProm {
    /// Starts a fake in front of `upstream` (`http://127.0.0.1:<port>`), in [`PromMode::Pass`].
    pub fn start(upstream: &str, workloads: &[(&str, &str)]) -> FakeProm {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let upstream = upstream
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .to_owned();
        let state = Arc::new(Mutex::new(State {
            mode: PromMode::Pass,
            workloads: workloads
                .iter()
                .map(|(n, w)| ((*n).to_owned(), (*w).to_owned()))
                .collect(),
        }));
        let queries = Arc::new(AtomicU64::new(0));
        let (s2, q2) = (state.clone(), queries.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let (s, q, up) = (s2.clone(), q2.clone(), upstream.clone());
                std::thread::spawn(move || serve(conn, &s, &q, &up));
            }
        });
        FakeProm {
            state,
            queries,
            address,
        }
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.address)
    }

    /// Switches the answers.
    pub fn set(&self, mode: PromMode) {
        self.state.lock().unwrap().mode = mode;
    }

    /// `/api/v1/query` requests received so far.
    pub fn queries(&self) -> u64 {
        self.queries.load(Ordering::Relaxed)
    }
}

fn read_head(conn: &mut TcpStream) -> Option<String> {
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        if conn.read(&mut byte).ok()? == 0 || buf.len() > 64 * 1024 {
            return None;
        }
        buf.push(byte[0]);
    }
    Some(String::from_utf8_lossy(&buf).into_owned())
}

fn respond(conn: &mut TcpStream, code: u16, body: &str) {
    let _ = write!(
        conn,
        "HTTP/1.1 {code} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = conn.flush();
}

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

fn vector(workloads: &[(String, String)], value: &str) -> String {
    let t = now();
    let mut result = Vec::new();
    for (ns, wl) in workloads {
        result.push(serde_json::json!({
            "metric": {m::LABEL_NAMESPACE: ns, m::LABEL_WORKLOAD: wl},
            "value": [t, value],
        }));
        result.push(serde_json::json!({
            "metric": {m::LABEL_NAMESPACE: ns, m::LABEL_WORKLOAD: wl, "bp_sample": "timestamp"},
            "value": [t, format!("{t}")],
        }));
    }
    serde_json::json!({"status": "success", "data": {"resultType": "vector", "result": result}})
        .to_string()
}

fn serve(mut conn: TcpStream, state: &Mutex<State>, queries: &AtomicU64, upstream: &str) {
    let Some(head) = read_head(&mut conn) else {
        return;
    };
    let path = head.split_whitespace().nth(1).unwrap_or("/").to_owned();
    let is_query = path.starts_with("/api/v1/query");
    if is_query {
        queries.fetch_add(1, Ordering::Relaxed);
    }
    let (mode, workloads) = {
        let s = state.lock().unwrap();
        (s.mode.clone(), s.workloads.clone())
    };
    let mode = if is_query { mode } else { PromMode::Pass };
    match mode {
        PromMode::Pass => forward(&mut conn, upstream, &path),
        PromMode::Delay(d) => {
            std::thread::sleep(d);
            forward(&mut conn, upstream, &path);
        }
        PromMode::Status(code) => respond(
            &mut conn,
            code,
            r#"{"status":"error","errorType":"unavailable","error":"injected fault"}"#,
        ),
        PromMode::Nan => respond(&mut conn, 200, &vector(&workloads, "NaN")),
        PromMode::Empty => respond(
            &mut conn,
            200,
            r#"{"status":"success","data":{"resultType":"vector","result":[]}}"#,
        ),
        PromMode::Raw(body) => respond(&mut conn, 200, &body),
    }
}

fn forward(conn: &mut TcpStream, upstream: &str, path: &str) {
    let Ok(mut up) = TcpStream::connect(upstream) else {
        respond(conn, 502, r#"{"status":"error","error":"upstream down"}"#);
        return;
    };
    let _ = up.set_read_timeout(Some(Duration::from_secs(30)));
    let _ = write!(up, "GET {path} HTTP/1.0\r\nHost: {upstream}\r\n\r\n");
    let mut resp = Vec::new();
    let _ = up.read_to_end(&mut resp);
    let text = String::from_utf8_lossy(&resp);
    let code: u16 = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(502);
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
    respond(conn, code, body);
}
