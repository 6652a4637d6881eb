"""Process-wide settings.  Environment variables set the defaults; code may change them."""
from __future__ import annotations

import os

# how many compiled entries one code object may hold before it runs eagerly
cache_size_limit: int = int(os.environ.get("EMBER_CACHE_SIZE_LIMIT", "8"))

# where generated kernels and their builds are cached across processes
cache_dir: str = os.environ.get("EMBER_CACHE_DIR") or os.path.join(
    os.path.expanduser("~"), ".cache", "ember")


def kernel_cache_dir() -> str:
    """The cache directory as set now (EMBER_CACHE_DIR is re-read, as the bench harness sets it per run)."""
    return os.environ.get("EMBER_CACHE_DIR") or cache_dir

# training graphs: recompute cheap pointwise chains in the backward instead of saving them
# (EMBER_RECOMPUTE=0 saves every value the backward reads: more memory, no recomputation)
recompute: bool = os.environ.get("EMBER_RECOMPUTE", "1") != "0"

# where's gradient reads its test from the output when that is exact (relu: the mask is
# relu(x) <= 0, so a bool mask is not saved beside the output; autodiff/prim_rules.py);
# EMBER_MASK_FROM_OUTPUT=0 reads it from the input (A/B runs)
mask_from_output: bool = os.environ.get("EMBER_MASK_FROM_OUTPUT", "1") != "0"

# the partitioner's recompute ban and tie-break (autodiff/partition.py); EMBER_PARTITION_REFINE=0
# turns them off (A/B runs: bytes saved alone decide the cut)
partition_refine: bool = os.environ.get("EMBER_PARTITION_REFINE", "1") != "0"

# GPU reductions with few output rows and a long reduced range run as two kernels
# (lower/split_reductions.py); EMBER_SPLIT_REDUCTIONS=0 keeps them one kernel (for A/B runs)
split_reductions: bool = os.environ.get("EMBER_SPLIT_REDUCTIONS", "1") != "0"

# a GPU column reduction (bias and norm-weight gradients) with fewer programs of 64 columns than
# this takes blocks of 32 columns, twice the programs (codegen/triton.py choose_config);
# EMBER_COLUMN_MIN_PROGRAMS=0 keeps 64 (A/B runs)
column_min_programs: int = int(os.environ.get("EMBER_COLUMN_MIN_PROGRAMS", "1024"))

# when a training graph's backward compiles: "cuda" (default: in a thread from the moment the forward
# is scheduled, for CUDA graphs), "always" (CPU graphs too), "never" (at the first backward call)
compile_backward_early: str = os.environ.get("EMBER_COMPILE_BACKWARD_EARLY", "cuda")

# GPU kernels compile in this many worker processes (Triton's front end holds the GIL, so threads
# compiled one kernel at a time); EMBER_COMPILE_PROCESSES=0 compiles in threads of this process
compile_processes: int = int(os.environ.get("EMBER_COMPILE_PROCESSES", str(min(16, os.cpu_count() or 1))))

# symbolic sizes in CUDA graphs with convolution/pooling externs (on since the H100 zoo of session 11:
# resnet50 2.28x and mobilenet_v3 1.86x over eager with them, 1.77x and 1.23x compiled static);
# EMBER_DYNAMIC_CONV_CUDA=0 compiles such graphs with static sizes under dynamic shapes (A/B runs)
dynamic_conv_cuda: bool = os.environ.get("EMBER_DYNAMIC_CONV_CUDA", "1") != "0"

# devices where 2-D max pooling is generated (prims/decompositions/pooling.py): none by default.
# CUDA (H200): ResNet-50's training step 11.90 -> 11.43 GPU ms (session 25), but Triton 3.6 compiles
# a kernel holding two of these gradients to wrong code unless LLVM's optimizer is off (session 26:
# benchmarks/triton_llvm_repro/run.py; each gradient alone, or the interpreter, is right).  CPU:
# 0.5-0.6x of eager's kernels (benchmarks/cpu_max_pool.py): the kernels loop in logical order and
# wrap every tap's index with a modulo; and with a symbolic batch size a channels-last input's pooled
# output was contiguous (tests/dynamic, case pools_batch).  EMBER_GENERATED_MAX_POOL=cpu,cuda
generated_max_pool_devices: set[str] = {d for d in os.environ.get("EMBER_GENERATED_MAX_POOL", "").split(",") if d}
