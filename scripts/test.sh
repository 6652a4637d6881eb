#!/usr/bin/env bash
# Installs ember with its test dependencies into a project-local virtual environment (.venv) and runs the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q torch==2.13.0
.venv/bin/python -m pip install -q -e ".[test]"
.venv/bin/python -m pytest tests -p no:cacheprovider "$@"
