import pytest

from ember import capture


def eager_backend(graph, example_inputs):
    return graph.as_callable()


@pytest.fixture
def compile_fn():
    """compile_function with the eager backend (graph.as_callable)."""
    def make(fn, **kwargs):
        return capture.compile_function(fn, backend=eager_backend, **kwargs)
    yield make
    capture.reset()
