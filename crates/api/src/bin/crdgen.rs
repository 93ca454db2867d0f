//! Writes the CRDs generated from the API types into each directory given on the command line
//! (`make crds` passes `crds/` and the Helm chart's `files/crds/`, which its
//! `templates/crds.yaml` renders).

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let dirs: Vec<PathBuf> = std::env::args_os().skip(1).map(PathBuf::from).collect();
    if dirs.is_empty() {
        eprintln!("usage: crdgen DIR [DIR...]");
        return ExitCode::from(2);
    }
    let crds = match backpressure_api::crd::generated() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("crdgen: cannot render CRDs: {e}");
            return ExitCode::FAILURE;
        }
    };
    for dir in &dirs {
        for (name, yaml) in &crds {
            let path = dir.join(name);
            if let Err(e) = std::fs::create_dir_all(dir).and_then(|()| std::fs::write(&path, yaml))
            {
                eprintln!("crdgen: cannot write {}: {e}", path.display());
                return ExitCode::FAILURE;
            }
            println!("wrote {}", path.display());
        }
    }
    ExitCode::SUCCESS
}
