"""C++ kernels run on torch's OpenMP runtime (the libgomp torch loaded, found by its soname when a
kernel library is loaded), so their parallel regions take ``torch.get_num_threads()`` threads and
follow ``torch.set_num_threads``: no second thread pool competing with torch's."""
from __future__ import annotations

import ctypes
import os

import pytest
import torch

from ember.runtime import cpp_build

SOURCE = """
#include <omp.h>
extern "C" int parallel_region_threads() {
  int threads = 0;
#pragma omp parallel
  {
#pragma omp single
    threads = omp_get_num_threads();
  }
  return threads;
}
"""


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_kernels_take_torchs_thread_count(restore_threads):
    lib = cpp_build.load(cpp_build.build(SOURCE, "threads_test"))
    lib.parallel_region_threads.restype = ctypes.c_int
    assert lib.parallel_region_threads() == torch.get_num_threads()
    torch.set_num_threads(1)
    assert lib.parallel_region_threads() == 1
    if (os.cpu_count() or 1) >= 2:
        torch.set_num_threads(2)
        assert lib.parallel_region_threads() == 2
