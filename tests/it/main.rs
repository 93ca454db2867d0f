//! The operator's integration tests, one binary: `cargo test -p backpressure-operator --test it`.
//!
//! Each module is one area (`conformance`, `crd`, `operator`, `faults`, `guard`, `gitops`, `hostile`,
//! `observability`, `plugin`, `policy`, `presets`, `tenancy`); `common` holds the harness they share. Every test that
//! needs Kubernetes uses the one control plane of the run (`TestEnv::shared()`: a real
//! kube-apiserver + etcd, started on first use) and holds [`common::serial`] for its whole
//! duration, since the operator watches every namespace and several tests read cluster-wide
//! state (the audit log, the leader Lease) or restart the API server. Tests that need no server
//! (the kstatus and Argo CD health table, promtool, the queue presets on promtool, the proptest
//! of `resolve`) run in parallel with them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

mod chart;
mod conformance;
mod crd;
mod faults;
mod gitops;
mod guard;
mod hostile;
mod keda;
mod node;
mod observability;
mod operator;
mod plugin;
mod policy;
mod presets;
mod producers;
mod tenancy;
