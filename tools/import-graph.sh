#!/usr/bin/env bash
# The import graph between the top-level modules of the operator crate (src/), and a check that
# it has no cycle: imports run one way, runtime → reconcile → observe/act → core → api.
#
# Usage: tools/import-graph.sh        prints the edges and a topological order; exits 1 on a
#                                     cycle (printing the modules on it) or on an import form
#                                     it cannot read.
#
# How it reads the code (grep and sed, no compiler):
# - a module is src/<name>.rs or src/<name>/ (every file below it); src/lib.rs is `lib` (the
#   crate root: `run` and the module list), src/main.rs is `main`, src/bin/<name>.rs is
#   `bin/<name>` (binaries reach the library through `backpressure_operator::`);
# - an edge A → B is a path `crate::B…` in a file of A (`backpressure_operator::B…` in a
#   binary; a bare `B::…` in lib.rs, whose paths start at the crate root); a path to an item of
#   the crate root (`crate::run`) is an edge to `lib`; comments are ignored, test modules are
#   not (a test importing upwards is an upward import too);
# - `use crate::{a, b}` is refused: one `use crate::module::…` per module keeps this readable
#   by grep. `super::` is not followed (inside src/<name>/ it stays in the module; from a
#   top-level file it would reach the crate root: use `crate::` there).
#
# The check is `tsort` (coreutils), which fails on a loop and names the modules on it.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root/src"

# Top-level modules of the library.
modules=()
for f in *.rs */; do
    name="${f%.rs}"
    name="${name%/}"
    case "$name" in lib | main | bin) continue ;; esac
    modules+=("$name")
done
is_module() {
    local m
    for m in "${modules[@]}"; do [[ "$m" == "$1" ]] && return 0; done
    return 1
}

node_of() {
    case "$1" in
        lib.rs) echo lib ;;
        main.rs) echo main ;;
        bin/*) echo "bin/$(basename "$1" .rs)" ;;
        */*) echo "${1%%/*}" ;;
        *) echo "${1%.rs}" ;;
    esac
}

# Code without comments (`//` to the end of the line, doc comments included).
code_of() { sed -e 's://.*$::' "$1"; }

edges=$(mktemp)
trap 'rm -f "$edges"' EXIT
status=0
while IFS= read -r file; do
    from=$(node_of "$file")
    echo "$from $from" >>"$edges" # every module is a node, even without edges
    case "$from" in
        main | bin/*) prefix='backpressure_operator' ;;
        *) prefix='crate' ;;
    esac
    if code_of "$file" | grep -qE "\b${prefix}::\{"; then
        echo "import-graph: $file: \`${prefix}::{…}\` imports are not read by this script; write one use per module" >&2
        status=1
    fi
    names=$(code_of "$file" | grep -oE "\b${prefix}::[A-Za-z_][A-Za-z0-9_]*" | sed "s/^${prefix}:://" || true)
    if [[ "$from" == lib ]]; then
        # The crate root names its modules without `crate::`.
        names+=$'\n'$(code_of "$file" | grep -oE '(^|[^A-Za-z0-9_:])[a-z_][a-z0-9_]*::' |
            sed -E 's/^[^A-Za-z0-9_]//; s/::$//' || true)
    fi
    for name in $names; do
        if is_module "$name"; then
            to="$name"
        elif [[ "$from" == lib ]]; then
            continue # an external crate (`kube::`, `tokio::`…)
        else
            to=lib # an item of the crate root
        fi
        [[ "$to" == "$from" ]] || echo "$from $to" >>"$edges"
    done
done < <(find . -name '*.rs' | sed 's:^\./::' | sort)

echo "Imports between the top-level modules of src/ (A -> B: A imports B):"
awk '$1 != $2 { print "  " $1 " -> " $2 }' "$edges" | sort -u

if ! order=$(sort -u "$edges" | tsort 2>&1); then
    echo >&2
    echo "import-graph: the imports of src/ have a cycle; tsort names the modules on it:" >&2
    echo "$order" | grep '^tsort:' | sed 's/^tsort: /  /' >&2
    exit 1
fi
echo
echo "No cycle. Topological order (each module imports only modules below it):"
echo "$order" | sed 's/^/  /'
exit "$status"
