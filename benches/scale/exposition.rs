//! The generated exposition: every workload's backoff, outcomes and queue metrics.

use std::collections::HashSet;
use std::fmt::Write as _;
use std::io::Read;
use std::io::Write as _;
use std::sync::Arc;
use std::sync::RwLock;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;

use backpressure_api::wire::metrics as m;

use super::TARGET_AGE;

/// (namespace, workload, queue age) of the workloads of one endpoint, with a version that
/// grows on every change.
pub(super) type Part = (u64, Vec<(String, String, f64)>);

pub(super) struct Exposition {
    endpoints: Vec<RwLock<Part>>,
    rendered: Vec<RwLock<(u64, Arc<String>)>>,
    pub(super) scrapes: AtomicU64,
}

impl Exposition {
    pub(super) fn new(workloads: &[(String, String)], endpoints: usize) -> Arc<Self> {
        let mut parts: Vec<Vec<(String, String, f64)>> = vec![Vec::new(); endpoints];
        for (i, (ns, w)) in workloads.iter().enumerate() {
            parts[i % endpoints].push((ns.clone(), w.clone(), TARGET_AGE));
        }
        Arc::new(Exposition {
            endpoints: parts.into_iter().map(|p| RwLock::new((1, p))).collect(),
            rendered: (0..endpoints)
                .map(|_| RwLock::new((0, Arc::new(String::new()))))
                .collect(),
            scrapes: AtomicU64::new(0),
        })
    }

    /// Sets the queue age of the given workloads; returns when the change is visible.
    pub(super) fn set_age(&self, which: &HashSet<(String, String)>, age: f64) {
        for e in &self.endpoints {
            let mut g = e.write().unwrap();
            let mut changed = false;
            for (ns, w, a) in g.1.iter_mut() {
                if which.contains(&(ns.clone(), w.clone())) {
                    *a = age;
                    changed = true;
                }
            }
            if changed {
                g.0 += 1;
            }
        }
    }

    pub(super) fn render(&self, i: usize) -> Arc<String> {
        let (version, parts) = {
            let g = self.endpoints[i].read().unwrap();
            (g.0, g.1.clone())
        };
        if let Some(hit) = {
            let r = self.rendered[i].read().unwrap();
            (r.0 == version).then(|| r.1.clone())
        } {
            return hit;
        }
        let mut out = String::with_capacity(parts.len() * 700);
        let _ = writeln!(out, "# TYPE {} gauge", m::BACKOFF);
        let labels = |ns: &str, w: &str| {
            format!(
                "{}=\"{ns}\",{}=\"{w}\"",
                m::LABEL_NAMESPACE,
                m::LABEL_WORKLOAD
            )
        };
        for (ns, w, _) in &parts {
            let _ = writeln!(out, "{}{{{}}} 0", m::BACKOFF, labels(ns, w));
        }
        let _ = writeln!(out, "# TYPE {} counter", m::OUTCOMES_TOTAL);
        for (ns, w, _) in &parts {
            let l = labels(ns, w);
            let _ = writeln!(
                out,
                "{o}{{{l},{c}=\"{s}\"}} 1000\n{o}{{{l},{c}=\"{f}\"}} 0",
                o = m::OUTCOMES_TOTAL,
                c = m::LABEL_CLASS,
                s = m::CLASS_SUCCESS,
                f = m::CLASS_DEPENDENCY_FAILURE
            );
        }
        for (name, kind) in [
            (m::QUEUE_AGE, "gauge"),
            (m::QUEUE_DEPTH, "gauge"),
            (m::QUEUE_ARRIVALS_TOTAL, "counter"),
            (m::QUEUE_COMPLETIONS_TOTAL, "counter"),
        ] {
            let _ = writeln!(out, "# TYPE {name} {kind}");
            for (ns, w, age) in &parts {
                let v = if name == m::QUEUE_AGE { *age } else { 0.0 };
                let _ = writeln!(out, "{name}{{{}}} {v}", labels(ns, w));
            }
        }
        let out = Arc::new(out);
        *self.rendered[i].write().unwrap() = (version, out.clone());
        out
    }

    /// Serves endpoint `i` on a loopback port; returns `127.0.0.1:<port>`.
    pub(super) fn serve(self: &Arc<Self>, i: usize) -> String {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let me = self.clone();
        std::thread::spawn(move || {
            for mut conn in listener.incoming().flatten() {
                let mut buf = [0u8; 4096];
                let _ = conn.read(&mut buf);
                let body = me.render(i);
                me.scrapes.fetch_add(1, Ordering::Relaxed);
                let _ = write!(
                    conn,
                    "HTTP/1.0 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\n\r\n",
                    body.len()
                );
                let _ = conn.write_all(body.as_bytes());
            }
        });
        addr
    }
}
