"""Shared pytest setup for ember's tests."""
from __future__ import annotations

import os
import sys
import tempfile

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))  # `import models` (the shared fixtures) from any test dir

import ember


@pytest.fixture(scope="session", autouse=True)
def ember_kernel_cache_dir():
    """One kernel cache directory per test session: no test reads or pollutes ~/.cache/ember."""
    previous = os.environ.get("EMBER_CACHE_DIR")
    shared = os.environ.get("EMBER_TEST_CACHE_DIR") or tempfile.mkdtemp(prefix="ember-test-cache-")
    os.environ["EMBER_TEST_CACHE_DIR"] = shared
    os.environ["EMBER_CACHE_DIR"] = shared
    yield shared
    if previous is None:
        os.environ.pop("EMBER_CACHE_DIR", None)
    else:
        os.environ["EMBER_CACHE_DIR"] = previous


@pytest.fixture(autouse=True)
def _fresh_ember_state():
    """Each test starts with empty compile caches and a fixed seed."""
    ember.reset()
    torch.manual_seed(0)
    yield
