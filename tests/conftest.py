"""Shared pytest setup for ember's tests."""
from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))  # `import models` (the shared fixtures) from any test dir

import ember


@pytest.fixture(autouse=True)
def _fresh_ember_state():
    """Each test starts with empty compile caches and a fixed seed."""
    ember.reset()
    torch.manual_seed(0)
    yield
