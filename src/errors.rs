//! Printing errors with their causes.
//!
//! An error's message names only what failed at its own level; the cause is its
//! [`source`](std::error::Error::source) and is not repeated in the message. Whoever prints an
//! error prints the chain: [`Chain`] in logs, [`with_cause`] in status conditions and events.

use std::error::Error;
use std::fmt;

/// Displays an error and every cause under it, `: `-separated. A cause whose text is already
/// in what was printed is skipped: some libraries (kube's errors among them) include their
/// source in their own message.
#[derive(Debug, Clone, Copy)]
pub struct Chain<'a>(pub &'a dyn Error);

impl fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut printed = self.0.to_string();
        let mut cause = self.0.source();
        while let Some(c) = cause {
            let text = c.to_string();
            if !printed.contains(&text) {
                printed.push_str(": ");
                printed.push_str(&text);
            }
            cause = c.source();
        }
        f.write_str(&printed)
    }
}

/// An error and its direct cause, `message: cause`: the form of the condition and event
/// messages made from an error (the cause's own causes are in its message when it is a kube
/// error, the only cause these errors have).
pub fn with_cause(err: &dyn Error) -> String {
    match err.source() {
        Some(cause) => format!("{err}: {cause}"),
        None => err.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] Middle);

    #[derive(Debug, thiserror::Error)]
    #[error("middle says {0}")]
    struct Middle(#[source] Inner);

    #[derive(Debug, thiserror::Error)]
    #[error("inner")]
    struct Inner;

    #[test]
    fn the_chain_prints_each_cause_once() {
        let e = Outer(Middle(Inner));
        // `Middle` repeats its source in its message: `inner` is printed once.
        assert_eq!(Chain(&e).to_string(), "outer: middle says inner");
        assert_eq!(with_cause(&e), "outer: middle says inner");
        assert_eq!(with_cause(&Inner), "inner");
        assert_eq!(Chain(&Inner).to_string(), "inner");
    }
}
