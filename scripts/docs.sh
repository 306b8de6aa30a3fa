#!/usr/bin/env bash
# Builds the documentation site into docs/_build/html with Sphinx, warnings as errors (-W), in
# the Relax environment (.venv, made by `bash scripts/test.sh fast relax --co -q` or
# `pip install -e ".[test]"`, which brings Sphinx, myst-parser and furo).
#
# Usage: bash scripts/docs.sh [extra sphinx-build arguments...]
#
# The Relay API page is rendered from docs/api/relay_api.json, which
# `.venv310/bin/python docs/api/relay_api.py` writes in the Relay environment (docs/README.md).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
if ! "$PYTHON" -c "import sphinx, myst_parser, furo" 2>/dev/null; then
    echo "scripts/docs.sh: $PYTHON lacks Sphinx, myst-parser or furo: pip install -e '.[test]' (or delete .venv and run bash scripts/test.sh fast relax --co -q)" >&2
    exit 2
fi
exec "$PYTHON" -m sphinx -W --keep-going -b html docs docs/_build/html "$@"
