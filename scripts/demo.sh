#!/usr/bin/env bash
# Installs ember and compiles a small transformer block: eager vs compiled time, max error.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q torch==2.13.0
python3 -m pip install -q -e .
python3 benchmarks/demo.py
