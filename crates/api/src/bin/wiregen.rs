//! Writes the generated files of the wire contract (`make wire`):
//!
//! - `wiregen schemas DIR`: the JSON Schemas of the documents (`docs/wire-contract/`);
//! - `wiregen hash-vectors FILE`: the hash test vectors (`conformance/vectors/hash.json`).

use std::path::PathBuf;
use std::process::ExitCode;

use backpressure_api::wire::{schema, vectors};

const USAGE: &str = "usage: wiregen schemas DIR | wiregen hash-vectors FILE";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.as_slice() {
        [cmd, dir] if cmd == "schemas" => write_schemas(&PathBuf::from(dir)),
        [cmd, file] if cmd == "hash-vectors" => {
            let path = PathBuf::from(file);
            vectors::write_hash_vectors(&path)
                .map(|()| println!("wrote {}", path.display()))
                .map_err(|e| format!("cannot write {}: {e}", path.display()))
        }
        _ => {
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("wiregen: {e}");
            ExitCode::FAILURE
        }
    }
}

fn write_schemas(dir: &std::path::Path) -> Result<(), String> {
    let schemas = schema::generated().map_err(|e| format!("cannot render the schemas: {e}"))?;
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    for (name, text) in schemas {
        let path = dir.join(name);
        std::fs::write(&path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        println!("wrote {}", path.display());
    }
    Ok(())
}
