//! The conformance kit of the wire contract (issue 16): golden vectors generated from the Rust
//! implementation, which every implementation of the worker side (the Rust worker library and
//! the SDKs under `sdk/`) checks itself against (`conformance/README.md`), and the conformance
//! suite that checks a running worker from the outside ([`suite`]).

pub mod suite;
pub mod vectors;
