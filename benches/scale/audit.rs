//! The API server's audit log, read incrementally: the operator's writes by kind and time.

use std::io::Read;
use std::io::Seek;
use std::io::SeekFrom;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

use backpressure_envtest::TestEnv;

use super::operator;

/// The verbs that change something.
const WRITE_VERBS: &[&str] = &["create", "update", "patch", "delete", "deletecollection"];

#[derive(Debug, Clone)]
pub(super) struct AuditWrite {
    pub(super) at: f64,
    pub(super) resource: String,
    pub(super) subresource: String,
    pub(super) namespace: String,
    pub(super) name: String,
}

impl AuditWrite {
    /// `resource` or `resource/subresource`, for counting writes by kind.
    pub(super) fn kind(&self) -> String {
        if self.subresource.is_empty() {
            self.resource.clone()
        } else {
            format!("{}/{}", self.resource, self.subresource)
        }
    }
}

/// Follows `audit.log` across the API server's rotations (at 100 MB it renames the file and
/// starts a new one): the open handle is read to its end, then the new file from its start.
pub(super) struct Audit {
    path: PathBuf,
    file: std::fs::File,
    partial: String,
    user: String,
}

impl Audit {
    pub(super) fn open(env: &TestEnv) -> Audit {
        let path = env.dir().join("audit.log");
        let file = std::fs::File::open(&path).unwrap();
        Audit {
            path,
            file,
            partial: String::new(),
            user: operator::operator_user(),
        }
    }

    /// Skips everything written so far.
    pub(super) fn skip_to_end(&mut self) {
        let _ = self.file.seek(SeekFrom::End(0));
        self.partial.clear();
    }

    /// The operator's writes since the last call.
    pub(super) fn new_writes(&mut self) -> Vec<AuditWrite> {
        // Rotation is checked before reading: the renamed file is complete once the new one
        // exists, so reading the open handle to its end then loses nothing.
        let rotated = match (std::fs::metadata(&self.path), self.file.metadata()) {
            (Ok(now), Ok(open)) => now.ino() != open.ino() || now.dev() != open.dev(),
            _ => false,
        };
        let mut buf = String::new();
        let _ = self.file.read_to_string(&mut buf);
        if rotated && let Ok(file) = std::fs::File::open(&self.path) {
            self.file = file;
            let _ = self.file.read_to_string(&mut buf);
        }
        self.partial.push_str(&buf);
        let mut out = Vec::new();
        let complete = match self.partial.rfind('\n') {
            Some(i) => i + 1,
            None => return out,
        };
        let lines: String = self.partial.drain(..complete).collect();
        for line in lines.lines() {
            if !line.contains(&self.user) {
                continue;
            }
            let Ok(e) = serde_json::from_str::<serde_json::Value>(line) else {
                continue;
            };
            if e["stage"] != "ResponseComplete" || e["user"]["username"] != self.user.as_str() {
                continue;
            }
            // The control plane's audit policy also records a ServiceAccount's reads (the RBAC
            // test needs them): only writes count here.
            let verb = e["verb"].as_str().unwrap_or_default();
            if !WRITE_VERBS.contains(&verb) {
                continue;
            }
            let at = e["stageTimestamp"]
                .as_str()
                .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok())
                .map(|t| t.as_microsecond() as f64 / 1e6)
                .unwrap_or(0.0);
            let o = &e["objectRef"];
            let s = |v: &serde_json::Value| v.as_str().unwrap_or("").to_owned();
            out.push(AuditWrite {
                at,
                resource: s(&o["resource"]),
                subresource: s(&o["subresource"]),
                namespace: s(&o["namespace"]),
                name: s(&o["name"]),
            });
        }
        out
    }
}
