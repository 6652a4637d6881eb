"""NumPy code compiled by ember vs NumPy itself: one k-means step and one full k-means update.

    python3 benchmarks/numpy_kmeans.py [--n 1000000] [--d 8] [--k 16] [--repeat 5] [--dtype float64]

The functions are plain NumPy (ndarrays in, ndarrays out); ``ember.compile`` traces
them into one graph whose kernels fuse the (K, N, D) difference, the norm and
the argmin, which NumPy materializes (K*N*D elements: 1 GiB at the defaults).
On CUDA (when available) the same compiled function runs under
``with torch.device("cuda"):``: inputs go to the GPU, results come back as ndarrays,
so the timing includes both copies.  Times are medians over ``--repeat`` calls after
one warm-up call (which compiles); ratios are from this one run.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

import ember


def kmeans_step(X, means):
    labels = np.argmin(np.linalg.norm(X - means[:, None], axis=2), axis=0)
    return labels


def kmeans_update(X, means):
    k = means.shape[0]
    labels = np.argmin(np.linalg.norm(X - means[:, None], axis=2), axis=0)
    onehot = (labels[:, None] == np.arange(k)).astype(X.dtype)
    counts = onehot.sum(axis=0)
    new_means = onehot.T @ X / np.maximum(counts, 1)[:, None]
    return labels, new_means


def median_seconds(fn, args, repeat: int, sync=None) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn(*args)
        if sync is not None:
            sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def same(actual, expected) -> bool:
    if isinstance(expected, tuple):
        return all(same(a, e) for a, e in zip(actual, expected))
    if expected.dtype.kind == "f":
        return actual.dtype == expected.dtype and np.allclose(actual, expected, rtol=1e-5, atol=1e-6)
    # argmin over distances: a near-tie may pick the other centre under a different summation order
    return actual.dtype == expected.dtype and np.mean(actual == expected) > 0.9999


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--d", type=int, default=8)
    parser.add_argument("--k", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--dtype", default="float64", choices=["float64", "float32"])
    options = parser.parse_args()
    rng = np.random.default_rng(0)
    X = rng.standard_normal((options.n, options.d)).astype(options.dtype)
    means = rng.standard_normal((options.k, options.d)).astype(options.dtype)
    print(f"N={options.n} D={options.d} K={options.k} {options.dtype}, torch {torch.__version__}, "
          f"numpy {np.__version__}, {torch.get_num_threads()} torch threads")
    for fn in (kmeans_step, kmeans_update):
        report = ember.explain(fn, X[:1000], means)
        fast = ember.compile(fn)
        start = time.perf_counter()
        result = fast(X, means)
        first = time.perf_counter() - start
        assert same(result, fn(X, means)), f"{fn.__name__}: ember differs from NumPy"
        numpy_time = median_seconds(fn, (X, means), options.repeat)
        ember_time = median_seconds(fast, (X, means), options.repeat)
        print(f"{fn.__name__:14s} cpu : numpy {numpy_time * 1e3:9.2f} ms   ember {ember_time * 1e3:9.2f} ms   "
              f"speedup {numpy_time / ember_time:5.2f}x   (graphs {report.graph_count}, breaks "
              f"{report.break_count}, first call incl. compile {first:.2f} s)")
        if torch.cuda.is_available():
            with torch.device("cuda"):
                start = time.perf_counter()
                result = fast(X, means)
                first = time.perf_counter() - start
                assert same(result, fn(X, means)), f"{fn.__name__}: ember on CUDA differs from NumPy"
                cuda_time = median_seconds(fast, (X, means), options.repeat, torch.cuda.synchronize)
            print(f"{fn.__name__:14s} cuda: numpy {numpy_time * 1e3:9.2f} ms   ember {cuda_time * 1e3:9.2f} ms   "
                  f"speedup {numpy_time / cuda_time:5.2f}x   (host->device->host copies included, first "
                  f"call {first:.2f} s)")


if __name__ == "__main__":
    main()
