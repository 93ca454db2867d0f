//! A minimal HTTP/1 server on loopback for the lab's own endpoints (dependency, exporters).

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// A response body.
pub type Body = Full<Bytes>;

/// Builds a plain response.
pub fn response(status: u16, content_type: &str, body: impl Into<Bytes>) -> Response<Body> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = http::StatusCode::from_u16(status).unwrap_or(http::StatusCode::OK);
    if let Ok(v) = http::HeaderValue::from_str(content_type) {
        r.headers_mut().insert(http::header::CONTENT_TYPE, v);
    }
    r
}

/// Serves `handler` on `addr` (a loopback address; port 0 picks one) until the task is aborted.
/// Returns the bound address and the server task.
pub async fn serve<H, F>(
    addr: SocketAddr,
    handler: H,
) -> std::io::Result<(SocketAddr, JoinHandle<()>)>
where
    H: Fn(Request<Incoming>) -> F + Send + Sync + 'static,
    F: Future<Output = Response<Body>> + Send + 'static,
{
    let listener = TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    let handler = Arc::new(handler);
    let task = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let handler = handler.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req| {
                    let handler = handler.clone();
                    async move { Ok::<_, Infallible>(handler(req).await) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .keep_alive(true)
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    Ok((local, task))
}

/// Prometheus text exposition, written by hand for the few series the lab exports.
#[derive(Debug, Default)]
pub struct Exposition {
    text: String,
    declared: Vec<String>,
}

impl Exposition {
    /// Appends one sample of `name` (declared once with `kind` and `help`).
    pub fn sample(&mut self, name: &str, kind: &str, help: &str, labels: &[(&str, &str)], v: f64) {
        use std::fmt::Write as _;
        if !self.declared.iter().any(|d| d == name) {
            let _ = writeln!(self.text, "# HELP {name} {help}");
            let _ = writeln!(self.text, "# TYPE {name} {kind}");
            self.declared.push(name.to_owned());
        }
        let labels: Vec<String> = labels
            .iter()
            .map(|(k, v)| format!("{k}=\"{}\"", v.replace('\\', "\\\\").replace('"', "\\\"")))
            .collect();
        let _ = writeln!(self.text, "{name}{{{}}} {v}", labels.join(","));
    }

    /// The exposition text.
    pub fn finish(self) -> String {
        self.text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposition_declares_once_and_escapes() {
        let mut e = Exposition::default();
        e.sample("x_total", "counter", "X.", &[("a", "b\"c")], 1.0);
        e.sample("x_total", "counter", "X.", &[("a", "d")], 2.5);
        let t = e.finish();
        assert_eq!(t.matches("# TYPE x_total counter").count(), 1);
        assert!(t.contains("x_total{a=\"b\\\"c\"} 1\n"), "{t}");
        assert!(t.contains("x_total{a=\"d\"} 2.5\n"), "{t}");
    }
}
