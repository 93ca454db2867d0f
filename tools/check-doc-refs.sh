#!/usr/bin/env bash
# Every document a comment cites must exist in the repository.
#
# Scans the comment lines (`//`, `///`, `//!`, `#`) of the tracked Rust, TOML, YAML, shell and
# Make files for `*.md` paths and resolves each against the repository root, the citing file's
# directory and its crate's directory; a bare file name may also live anywhere in the tree.
# Prints every reference that resolves nowhere and exits 1 if there is one.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

tracked=$(git ls-files)
bad=0
while IFS=: read -r file line text; do
  dir=$(dirname "$file")
  crate=$dir
  while [ "$crate" != "." ] && [ ! -f "$crate/Cargo.toml" ]; do crate=$(dirname "$crate"); done
  for ref in $(grep -oE '[A-Za-z0-9_./-]+\.md\b' <<<"$text" | sort -u); do
    ref=${ref#/}
    case $ref in target/*) continue ;; esac # build output a tool writes, not a citation
    if [ -e "$ref" ] || [ -e "$dir/$ref" ] || [ -e "$crate/$ref" ]; then continue; fi
    if [[ $ref != */* ]] && grep -qE "(^|/)${ref//./\\.}$" <<<"$tracked"; then continue; fi
    echo "$file:$line: cites $ref, which is not in the repository"
    bad=1
  done
done < <(git ls-files -z -- '*.rs' '*.toml' '*.yaml' '*.yml' '*.sh' 'Makefile' '.ci/*' \
  | xargs -0 grep -nE '^[[:space:]]*(//|#).*[A-Za-z0-9_-]\.md\b' || true)
if [ "$bad" = 0 ]; then echo "doc references: every cited document exists"; fi
exit "$bad"
