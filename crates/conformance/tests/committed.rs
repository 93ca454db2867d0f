//! The committed `conformance/vectors/controller.json` is what the generator writes.

use backpressure_conformance::vectors;

#[test]
fn committed_controller_vectors_are_up_to_date() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../conformance/vectors/controller.json"
    );
    let committed = std::fs::read_to_string(path).unwrap_or_default();
    let generated = vectors::render(&vectors::generate()).unwrap();
    assert!(
        committed == generated,
        "{path} differs from the generator: run `cargo run -p backpressure-conformance -- vectors` and commit it"
    );
}
