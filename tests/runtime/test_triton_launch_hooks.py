"""The Triton launchers pass no launch hook when Triton's hook chain is empty (the C launcher
calls any hook that is not None: two Python calls per launch), and the chain itself when a hook is
installed, so a profiler's hook still sees ember's launches."""
import pytest

from ember.runtime.triton_build import _hook_or_none


def test_empty_hook_chain_is_not_passed():
    knobs = pytest.importorskip("triton.knobs")
    chain = knobs.HookChain()
    assert _hook_or_none(chain) is None
    seen = []
    chain.add(seen.append)
    assert _hook_or_none(chain) is chain
    chain(1)
    assert seen == [1]


def test_other_hooks_pass_through():
    def hook(*args):
        return None
    assert _hook_or_none(hook) is hook
    assert _hook_or_none(None) is None
