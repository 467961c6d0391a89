#!/usr/bin/env bash
# Lay out and lint the whole tree the way the README's test command checks it
# (docs/STYLE.md, "Formatter and linter"): ruff format, then ruff check's safe fixes
# (import order among them). What is left after this needs a person.
set -euo pipefail
cd "$(dirname "$0")/.."
ruff="${RUFF:-.venv/bin/ruff}"
if [ ! -x "$ruff" ]; then
    ruff=ruff
fi
"$ruff" format .
"$ruff" check --fix .
