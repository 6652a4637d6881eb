#!/usr/bin/env bash
# Installs ember into a project-local virtual environment (.venv) and compiles a small transformer block:
# eager vs compiled time, max error.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q torch==2.13.0
.venv/bin/python -m pip install -q -e .
.venv/bin/python benchmarks/demo.py
