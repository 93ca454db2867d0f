//! The conformance kit of the wire contract (issue 16): golden vectors generated from the Rust
//! implementation, which every implementation of the worker side (the Rust worker library and
//! the SDKs under `sdk/`) checks itself against (`conformance/README.md`).

pub mod vectors;
