//! backpressure-lab: the whole system on one machine with real parts.
//!
//! etcd + kube-apiserver + kube-controller-manager ([`cluster`]) with a real node where one can
//! start (containerd, kubelet, kube-proxy: the pods are containers of the images `make image`
//! built, [`pods`], and the operator is installed with `helm install`), else a kubelet stand-in
//! that turns the Deployment's pods into real worker processes on 127.0.0.N ([`kubelet`],
//! [`worker`]), a
//! Redis-streams queue, optionally limited in memory ([`queue`]), a fault-injectable dependency
//! ([`dependency`]), a producer, in the lab's process or as pods honouring the operator's
//! producer gate ([`producer`]), Prometheus ([`prom`]), the operator of this repository as a separate process
//! ([`operator`]) and, for comparison, real KEDA: its operator and metrics adapter with the HPA
//! controller of kube-controller-manager, scaling on the queue alone ([`scenario::KedaSpec`]).
//! [`run`] runs a scenario ([`scenario`]) through both, [`record`] holds what happened and the
//! end-to-end checks, and [`plot`] draws it.

pub mod cluster;
pub mod dependency;
pub mod hpa_trace;
pub mod kubelet;
pub mod operator;
pub mod plot;
pub mod pods;
pub mod polyglot;
pub mod producer;
pub mod prom;
pub mod queue;
pub mod record;
pub mod run;
pub mod scenario;
pub mod serve;
pub mod worker;

/// Installs the process-wide TLS crypto provider used by the kube and HTTP clients (idempotent).
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}
