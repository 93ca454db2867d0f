//! Upstream test cases.
