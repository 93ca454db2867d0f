//! The conformance suite: checks a running worker, in any language, against the wire contract
//! (`docs/wire-contract.md`) from the outside, the way the operator talks to it.
//!
//! [`run`] pushes valid, stale, oversized, malformed and unauthenticated configurations to the
//! worker's admin port and checks each answer and that a refused push leaves the running
//! configuration alone; scrapes `/metrics` and checks the names, types and labels; and, when the
//! worker serves the conformance hook ([`HOOK_PATH`]), replays every golden controller vector
//! (`conformance/vectors/controller.json`) through it and compares each step.
//!
//! Every check runs even when an earlier one failed (a worker learns all its gaps in one run),
//! except those that need a configuration the worker refused to take. Authentication failures
//! are kept below the contract's failure limit (10 in a row per source), so the suite itself is
//! never throttled with 429.
//!
//! Tokens come from [`KubeTokens`], which mints real ServiceAccount tokens with
//! the TokenRequest API, which the worker reviews with its API server, so the suite needs a
//! cluster (or a bare API server) that the worker also trusts.

mod checks;
mod exposition;
mod hook;
mod tokens;

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

pub use hook::HOOK_PATH;
pub use tokens::{KubeTokens, ServiceAccountRef};

/// The worker under test.
#[derive(Debug, Clone)]
pub struct Target {
    /// The admin port's base URL, e.g. `http://10.0.0.7:9464` (no trailing path).
    pub base_url: String,
    /// The worker's namespace: with the workload, it names the token audience it accepts.
    pub namespace: String,
    /// The worker's workload name (its metrics' `workload` label).
    pub workload: String,
}

impl Target {
    /// `base_url` + `path`.
    pub(crate) fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base_url.trim_end_matches('/'))
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    /// The golden controller vectors to replay through the hook; `None` skips the hook checks
    /// (reported as skipped, not passed).
    pub controller_vectors: Option<PathBuf>,
    /// Time allowed for each request.
    pub timeout: Duration,
    /// How long the metrics may take to show a pushed configuration.
    pub settle: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            controller_vectors: None,
            timeout: Duration::from_secs(10),
            settle: Duration::from_secs(5),
        }
    }
}

/// How one check ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The worker did what the contract says.
    Pass,
    /// It did not; the text says what it did instead.
    Fail(String),
    /// Not run, and why.
    Skip(String),
}

/// One named check and its verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    /// A stable, kebab-case name (what a team greps for in CI output).
    pub name: String,
    /// The verdict.
    pub verdict: Verdict,
}

/// Every check of one run, in the order they ran.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// The checks.
    pub checks: Vec<Check>,
}

impl Report {
    fn record(&mut self, name: impl Into<String>, result: Result<(), String>) {
        let verdict = match result {
            Ok(()) => Verdict::Pass,
            Err(why) => Verdict::Fail(why),
        };
        self.checks.push(Check {
            name: name.into(),
            verdict,
        });
    }

    fn skip(&mut self, name: impl Into<String>, why: impl Into<String>) {
        self.checks.push(Check {
            name: name.into(),
            verdict: Verdict::Skip(why.into()),
        });
    }

    /// The checks that failed.
    pub fn failures(&self) -> impl Iterator<Item = &Check> {
        self.checks
            .iter()
            .filter(|c| matches!(c.verdict, Verdict::Fail(_)))
    }

    /// Whether no check failed.
    pub fn passed(&self) -> bool {
        self.failures().next().is_none()
    }

    /// The verdict of the check called `name`, if it ran.
    pub fn verdict(&self, name: &str) -> Option<&Verdict> {
        self.checks
            .iter()
            .find(|c| c.name == name)
            .map(|c| &c.verdict)
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for c in &self.checks {
            match &c.verdict {
                Verdict::Pass => writeln!(f, "PASS {}", c.name)?,
                Verdict::Fail(why) => writeln!(f, "FAIL {}: {why}", c.name)?,
                Verdict::Skip(why) => writeln!(f, "SKIP {}: {why}", c.name)?,
            }
        }
        let failed = self.failures().count();
        let skipped = self
            .checks
            .iter()
            .filter(|c| matches!(c.verdict, Verdict::Skip(_)))
            .count();
        write!(
            f,
            "{} checks: {} passed, {failed} failed, {skipped} skipped",
            self.checks.len(),
            self.checks.len() - failed - skipped
        )
    }
}

/// Why the suite could not run at all (a failing worker is a [`Report`], not an error).
#[derive(Debug, thiserror::Error)]
pub enum SuiteError {
    /// The HTTP client could not be built.
    #[error("building the HTTP client: {0}")]
    Client(#[source] reqwest::Error),
    /// A token could not be minted.
    #[error("minting a token for {who}: {source}")]
    Token {
        /// The ServiceAccount.
        who: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// The TokenRequest answer had no token.
    #[error("the TokenRequest for {0} returned no token")]
    EmptyToken(String),
    /// The vectors file could not be read or parsed.
    #[error("reading the controller vectors {path}: {reason}")]
    Vectors {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
}

/// Runs every check against `target`.
pub async fn run(
    target: &Target,
    tokens: &KubeTokens,
    options: &Options,
) -> Result<Report, SuiteError> {
    // A connection per request: a worker may close one after refusing a body it did not read
    // (413 on the declared length), and a reused connection would fail the next check.
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .timeout(options.timeout)
        .build()
        .map_err(SuiteError::Client)?;
    let mut report = Report::default();
    let ctx = checks::Ctx {
        http: &http,
        target,
        options,
    };
    checks::run(&ctx, tokens, &mut report).await?;
    match &options.controller_vectors {
        Some(path) => hook::run(&ctx, path, &mut report).await?,
        None => report.skip("controller-vectors", "no vectors file given"),
    }
    Ok(report)
}
