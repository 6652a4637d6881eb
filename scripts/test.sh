#!/usr/bin/env bash
# Installs ember with its test dependencies and runs the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q torch==2.13.0
python3 -m pip install -q -e ".[test]"
python3 -m pytest tests -p no:cacheprovider
