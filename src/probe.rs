//! `backpressure-operator probe`: GET a URL (the operator's `/readyz`) until it answers 200 or
//! the wait runs out. The chart's `helm test` Pod runs it with the operator image, which has no
//! shell or HTTP client of its own.

use std::time::Duration;

/// Why the probe failed.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// The HTTP client could not be built.
    #[error("cannot build the HTTP client: {0}")]
    Client(#[source] reqwest::Error),
    /// No 200 within the wait: the last answer or error.
    #[error("{url} not ready after {waited:?}: {last}")]
    NotReady {
        /// The URL probed.
        url: String,
        /// How long it was tried.
        waited: Duration,
        /// The last status or error.
        last: String,
    },
}

/// GETs `url` every `interval` until it answers 200 (Ok with the body) or `wait` has passed
/// (at least one attempt is made).
pub async fn probe(url: &str, wait: Duration, interval: Duration) -> Result<String, ProbeError> {
    // reqwest is built without a TLS provider of its own: the process's one, as in `run`.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .map_err(ProbeError::Client)?;
    let started = tokio::time::Instant::now();
    loop {
        let last = match http.get(url).send().await {
            Ok(response) if response.status() == reqwest::StatusCode::OK => {
                return Ok(response.text().await.unwrap_or_default());
            }
            Ok(response) => {
                let status = response.status();
                let body = response.text().await.unwrap_or_default();
                format!("HTTP {status}: {}", body.trim())
            }
            Err(e) => format!(
                "{e}: {}",
                std::error::Error::source(&e)
                    .map(|s| s.to_string())
                    .unwrap_or_default()
            ),
        };
        tracing::info!(url, last = %last, "not ready yet");
        if started.elapsed() + interval > wait {
            return Err(ProbeError::NotReady {
                url: url.to_owned(),
                waited: started.elapsed(),
                last,
            });
        }
        tokio::time::sleep(interval).await;
    }
}
