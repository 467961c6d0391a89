#!/usr/bin/env bash
# Lay out and lint the whole tree the way the README's test command checks it
# (docs/STYLE.md, "Formatter and linter"): ruff format, then ruff check's safe fixes
# (import order among them). What `ruff check .` still reports after this needs a person.
# RUFF names another ruff binary; by default the repository's .venv, else the one on PATH.
set -euo pipefail
cd "$(dirname "$0")/.."
ruff="${RUFF:-.venv/bin/ruff}"
if [ ! -x "$ruff" ]; then
    ruff=$(command -v ruff) || { echo "no ruff: pip install -e '.[test]' first" >&2; exit 1; }
fi
"$ruff" format .
"$ruff" check --fix .
