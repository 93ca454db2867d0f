//! Prometheus addresses: the allowlist match and the redaction of credentials.
//!
//! `spec.metrics.prometheus.address` is tenant input that the operator fetches from its own
//! network position. It is fetched only when its [`Origin`] (scheme, host, port, parsed the way
//! the HTTP client parses it) equals the origin of an allowed address: never a string prefix, so
//! `http://127.0.0.1.evil.example` is not `http://127.0.0.1`, and `http://127.0.0.1@evil` is
//! `evil`.
//!
//! A URL may carry credentials (`http://user:pass@host`). [`redact`] and [`redact_text`] remove
//! them from every URL before it is logged, put in status or in an Event.

use std::fmt;

use url::Url;

/// What an address is matched on: scheme, host and port (the default port of the scheme when
/// none is written). Path, query and credentials do not count.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Origin {
    scheme: String,
    host: String,
    port: u16,
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://{}:{}", self.scheme, self.host, self.port)
    }
}

/// Why an address is not a usable Prometheus URL.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AddressError {
    /// Not a URL at all.
    #[error("not a URL: {0}")]
    Invalid(String),
    /// Not `http` or `https`.
    #[error("scheme {0:?} is not http or https")]
    Scheme(String),
    /// No host.
    #[error("no host")]
    NoHost,
}

impl Origin {
    /// The origin of `address`, parsed as the HTTP client (reqwest, WHATWG URL rules) will:
    /// host lower-cased, IP addresses in canonical form, the scheme's default port filled in.
    pub fn parse(address: &str) -> Result<Origin, AddressError> {
        let url = Url::parse(address.trim()).map_err(|e| AddressError::Invalid(e.to_string()))?;
        let scheme = url.scheme().to_owned();
        if scheme != "http" && scheme != "https" {
            return Err(AddressError::Scheme(scheme));
        }
        let host = url.host().ok_or(AddressError::NoHost)?.to_string();
        let port = url.port_or_known_default().ok_or(AddressError::NoHost)?;
        Ok(Origin { scheme, host, port })
    }
}

/// Whether `address` has the origin of one of `allowed` (entries that do not parse allow
/// nothing). An entry whose port is `*` (`http://127.0.0.1:*`) allows every port of its scheme
/// and host: for development machines and tests, where each Prometheus has a random port.
pub fn is_allowed<'a>(address: &str, allowed: impl IntoIterator<Item = &'a str>) -> bool {
    let Ok(origin) = Origin::parse(address) else {
        return false;
    };
    allowed.into_iter().any(|entry| match any_port(entry) {
        Some(host) => {
            Origin::parse(&host).is_ok_and(|o| o.scheme == origin.scheme && o.host == origin.host)
        }
        None => Origin::parse(entry).is_ok_and(|o| o == origin),
    })
}

/// `entry` without its port if the port is `*` (`scheme://host:*[/...]`), else none.
fn any_port(entry: &str) -> Option<String> {
    let entry = entry.trim();
    let (scheme, rest) = entry.split_once("://")?;
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let host = authority.strip_suffix(":*")?;
    // Credentials in an allowlist entry make no sense; refuse rather than guess.
    (!host.contains('@')).then(|| format!("{scheme}://{host}{tail}"))
}

/// What [`redact`] shows for an address that does not parse (it may hold credentials in a form
/// no parser recognizes; it is never fetched).
pub const UNPARSABLE: &str = "<address that is not a URL>";

/// `address` without its credentials, and the credentials (percent-decoded) if it had any.
/// An address that does not parse becomes [`UNPARSABLE`].
pub fn split_credentials(address: &str) -> (String, Option<(String, String)>) {
    let Ok(mut url) = Url::parse(address.trim()) else {
        return (UNPARSABLE.to_owned(), None);
    };
    if url.username().is_empty() && url.password().is_none() {
        return (address.trim().to_owned(), None);
    }
    let decode = |s: &str| {
        percent_encoding::percent_decode_str(s)
            .decode_utf8_lossy()
            .into_owned()
    };
    let user = decode(url.username());
    let pass = decode(url.password().unwrap_or_default());
    // Cannot fail for http(s) URLs, which have a host.
    let _ = url.set_username("");
    let _ = url.set_password(None);
    (url.to_string(), Some((user, pass)))
}

/// `address` without credentials, for logs, status and events.
pub fn redact(address: &str) -> String {
    split_credentials(address).0
}

/// `text` with the credentials of every URL in it removed (`scheme://user:pass@host` becomes
/// `scheme://host`), for error messages that quote a URL (HTTP client errors do).
pub fn redact_text(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("://") {
        let (head, tail) = rest.split_at(i + 3);
        out.push_str(head);
        // The authority ends at the first of these; userinfo is what precedes its last '@'.
        let end = tail
            .find(|c: char| {
                matches!(c, '/' | '?' | '#' | '"' | '\'' | '<' | '>' | '`')
                    || c.is_whitespace()
                    || c == ')'
            })
            .unwrap_or(tail.len());
        let authority = &tail[..end];
        match authority.rfind('@') {
            Some(at) => out.push_str(&authority[at + 1..]),
            None => out.push_str(authority),
        }
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_match_on_scheme_host_and_port_only() {
        let allowed = ["http://127.0.0.1:9090", "https://prom.example"];
        assert!(is_allowed("http://127.0.0.1:9090", allowed));
        assert!(is_allowed("http://127.0.0.1:9090/prometheus/", allowed));
        assert!(is_allowed("HTTPS://PROM.example:443/x?y=1", allowed));
        assert!(is_allowed("https://u:p@prom.example", allowed));
        for bad in [
            "http://127.0.0.1:9091",
            "https://127.0.0.1:9090",
            "http://127.0.0.1.evil.example:9090",
            "http://127.0.0.1:9090@evil.example:9090",
            "http://evil.example:9090#@127.0.0.1:9090",
            "http://prom.example",
            "https://prom.example.evil",
            "https://prom.example:8443",
            "file:///etc/passwd",
            "not a url",
            "",
        ] {
            assert!(!is_allowed(bad, allowed), "{bad}");
        }
        // Canonical forms of one host are one origin.
        assert!(is_allowed("http://0x7f.0.0.1:9090", allowed));
        assert!(is_allowed("http://127.1:9090", allowed));
        assert!(!is_allowed("http://[::1]:9090", allowed));
        assert!(is_allowed("http://x", ["not a url", "http://x:80"]));
        assert!(!is_allowed("http://x", ["not a url"]));
    }

    #[test]
    fn a_star_port_allows_every_port_of_one_host() {
        let allowed = ["http://127.0.0.1:*"];
        assert!(is_allowed("http://127.0.0.1:41234", allowed));
        assert!(is_allowed("http://127.0.0.1", allowed));
        for bad in [
            "https://127.0.0.1:41234",
            "http://127.0.0.2:41234",
            "http://localhost:41234",
            "http://127.0.0.1.evil.example:41234",
            "http://127.0.0.1:1@evil.example:41234",
        ] {
            assert!(!is_allowed(bad, allowed), "{bad}");
        }
        assert!(!is_allowed("http://evil", ["http://u@evil:*"]));
        assert!(!is_allowed("http://evil", ["http://*:*"]));
    }

    #[test]
    fn credentials_are_split_off_and_redacted() {
        assert_eq!(
            split_credentials("http://user:secret%40pass@127.0.0.1:9090/p"),
            (
                "http://127.0.0.1:9090/p".to_owned(),
                Some(("user".to_owned(), "secret@pass".to_owned()))
            )
        );
        assert_eq!(
            split_credentials("http://a+b:c+d@h"),
            (
                "http://h/".to_owned(),
                Some(("a+b".to_owned(), "c+d".to_owned()))
            )
        );
        assert_eq!(
            split_credentials("http://h:9090"),
            ("http://h:9090".to_owned(), None)
        );
        assert_eq!(redact("http://user@h:1"), "http://h:1/");
        assert!(!redact("http://u:secretpass@h").contains("secretpass"));
        assert!(!redact("::not a url u:secretpass@h").contains("secretpass"));
    }

    #[test]
    fn credentials_in_free_text_are_removed() {
        let text = "error sending request for url (http://user:secretpass@127.0.0.1:9/api/v1/query?q=1): refused; also https://a@b and http://@c d://e";
        let r = redact_text(text);
        assert!(!r.contains("secretpass") && !r.contains("user"), "{r}");
        assert_eq!(
            r,
            "error sending request for url (http://127.0.0.1:9/api/v1/query?q=1): refused; also https://b and http://c d://e"
        );
        assert_eq!(redact_text("no url here"), "no url here");
        assert_eq!(redact_text("x://"), "x://");
    }
}
