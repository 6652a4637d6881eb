"""One kernel cache directory per test session (shared by tests/lower, tests/codegen, tests/runtime)."""
import os
import tempfile

import pytest


@pytest.fixture(scope="session", autouse=True)
def ember_kernel_cache_dir():
    previous = os.environ.get("EMBER_CACHE_DIR")
    shared = os.environ.get("EMBER_TEST_CACHE_DIR") or tempfile.mkdtemp(prefix="ember-test-cache-")
    os.environ["EMBER_TEST_CACHE_DIR"] = shared
    os.environ["EMBER_CACHE_DIR"] = shared
    yield shared
    if previous is None:
        os.environ.pop("EMBER_CACHE_DIR", None)
    else:
        os.environ["EMBER_CACHE_DIR"] = previous
