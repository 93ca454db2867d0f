//! The committed CRDs (under `crds/` and in the Helm chart) must equal what the types generate.
//! A changed doc comment, bound or CEL rule without `make crds` fails here.

use std::path::Path;

#[test]
fn committed_crds_match_the_types() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let generated = backpressure_api::crd::generated().expect("render CRDs");
    for dir in ["crds", "charts/backpressure-operator/files/crds"] {
        for (name, yaml) in &generated {
            let path = root.join(dir).join(name);
            let committed = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("{}: {e}; run `make crds`", path.display()));
            assert!(
                committed == *yaml,
                "{} differs from the CRD generated from crates/api; run `make crds` and commit",
                path.display()
            );
        }
    }
}
