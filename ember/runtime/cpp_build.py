"""Build generated C++ into a shared library, cached on disk, and load it with ctypes.

The cache key is sha256(source, flags, compiler version), so a second process
(or a second compile of the same graph) loads the .so without running g++.
The .cpp is written beside the .so so a person can read what runs, and the
sha256 of the .so's bytes beside it (``.so.sha256``): a cached library is
loaded only when it matches, so a corrupted, truncated or foreign file is
rebuilt instead of failing ("invalid ELF header") or running unknown code.
"""
from __future__ import annotations

import atexit
import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable

from ember import config
from ember.errors import CompileError

CXX = os.environ.get("CXX", "g++")
BASE_FLAGS = ["-O3", "-fopenmp", "-shared", "-fPIC", "-fno-math-errno", "-fno-trapping-math", "-std=c++17", "-w"]
NATIVE_FLAGS = ["-march=native"]
# AVX2 without AVX-512: 256-bit vectors.  g++ tunes some such CPUs (-march=znver1) for 128-bit ones,
# which made the generated row kernels 15-25% slower than 256-bit ones and libmvec's 4-lane exp/erf
# half as fast as its 8-lane ones
WIDE_VECTOR_FLAGS = ["-mprefer-vector-width=256"]
KNOWN_PROBED_FLAGS = frozenset({*NATIVE_FLAGS, *WIDE_VECTOR_FLAGS, "-DEMBER_USE_LIBMVEC"})   # what compile_flags may add

# statistics for benchmarks and tests: how many times g++ really ran
stats = {"compiles": 0, "cache_hits": 0, "compile_seconds": 0.0}

_loaded: dict[str, ctypes.CDLL] = {}


@functools.cache
def compiler_version() -> str:
    try:
        return subprocess.run([CXX, "--version"], capture_output=True, text=True, check=True).stdout.splitlines()[0]
    except (OSError, subprocess.CalledProcessError) as exc:
        raise CompileError(f"C++ compiler {CXX!r} not usable: {exc}", stage="runtime",
                           hint="install g++ or set CXX") from exc


def _probe(flags: list[str], source: str = 'extern "C" int probe() { return 1; }\n') -> bool:
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "probe.cpp")
        with open(src, "w") as f:
            f.write(source)
        result = subprocess.run([CXX, *BASE_FLAGS, *flags, src, "-o", os.path.join(tmp, "probe.so")],
                                capture_output=True, check=False)
        return result.returncode == 0


_LIBMVEC_PROBE = """
extern "C" float tanhf(float) noexcept __attribute__((simd("notinbranch")));
extern "C" void probe(const float* __restrict__ a, float* __restrict__ b) {
#pragma omp simd
  for (int i = 0; i < 64; ++i) b[i] = tanhf(a[i]);
}
"""


def _target_macros(flags: list[str]) -> set[str] | None:
    """The macros g++ predefines for ``flags`` (preprocessing only: a tenth of a compile), or None
    when it refuses them."""
    result = subprocess.run([CXX, *flags, "-dM", "-E", "-x", "c++", os.devnull], capture_output=True,
                            text=True, check=False)
    if result.returncode != 0:
        return None
    return {line.split()[1] for line in result.stdout.splitlines() if line.startswith("#define ")}


_flags_lock = threading.Lock()     # guards _prefetched; one prober at a time


@functools.cache
def compile_flags() -> tuple[str, ...]:
    """Flags that work on this host, probed once per process and cached in a file per compiler."""
    global _prefetched
    with _flags_lock:
        runs, _prefetched = _prefetched, None
        try:
            return _probed_flags(runs)
        finally:
            if runs is not None:
                runs.close()


def _flags_marker() -> str:
    # the probes' version in the name: a file that an older ember wrote lacks the newer probes' flags
    return os.path.join(config.kernel_cache_dir(), "cpp", "flags_" + hashlib.sha256(
        (compiler_version() + "\0probes 2").encode()).hexdigest()[:16] + ".txt")


def _probed_flags(runs: _ProbeRuns | None = None) -> tuple[str, ...]:
    marker = _flags_marker()
    if os.path.exists(marker):
        with open(marker) as f:
            flags = tuple(f.read().split())
        if set(flags) <= KNOWN_PROBED_FLAGS:   # never pass g++ flags ember did not write
            return flags
    flags = []
    macros = runs.macros() if runs is not None else _target_macros(NATIVE_FLAGS)   # -march=native can fail in odd containers
    if macros is not None:
        flags += NATIVE_FLAGS
        if "__AVX2__" in macros and "__AVX512F__" not in macros:
            flags += WIDE_VECTOR_FLAGS
    # the prefetched probe ran with -march=native alone: -mprefer-vector-width only tunes the code
    # g++ emits, it does not change whether the simd declarations compile
    if runs is not None and macros is not None:
        libmvec = runs.libmvec_compiles()
    else:
        libmvec = _probe(flags + ["-DEMBER_USE_LIBMVEC"], _LIBMVEC_PROBE)
    if libmvec:
        flags.append("-DEMBER_USE_LIBMVEC")                         # glibc >= 2.35: vector math
    os.makedirs(os.path.dirname(marker), exist_ok=True)
    _write_atomically(marker, " ".join(flags).encode())    # a concurrent reader never sees half of it
    return tuple(flags)


class _ProbeRuns:
    """compile_flags' two probes, started as g++ processes ahead of need (prefetch_compile_flags)
    and read by compile_flags: about 0.08 s that then overlaps the Python stages of a first compile
    instead of preceding its build.  Processes, not a thread: a thread waiting on g++ needs the GIL
    after each step, which the busy compiling thread holds (it finished after the compile did)."""

    def __init__(self) -> None:
        self.tmp = tempfile.mkdtemp(prefix="ember-probe-")
        source = os.path.join(self.tmp, "probe.cpp")
        with open(source, "w") as f:
            f.write(_LIBMVEC_PROBE)
        self.macros_path = os.path.join(self.tmp, "macros.txt")
        self.processes: list[subprocess.Popen] = []
        with open(self.macros_path, "w") as out:
            self.processes.append(subprocess.Popen([CXX, *NATIVE_FLAGS, "-dM", "-E", "-x", "c++", os.devnull],
                                                   stdout=out, stderr=subprocess.DEVNULL))
        self.processes.append(subprocess.Popen(
            [CXX, *BASE_FLAGS, *NATIVE_FLAGS, "-DEMBER_USE_LIBMVEC", source, "-o", os.path.join(self.tmp, "probe.so")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

    def macros(self) -> set[str] | None:
        """As _target_macros(NATIVE_FLAGS)."""
        if self.processes[0].wait() != 0:
            return None
        with open(self.macros_path) as f:
            return {line.split()[1] for line in f.read().splitlines() if line.startswith("#define ")}

    def libmvec_compiles(self) -> bool:
        """As _probe(NATIVE_FLAGS + ["-DEMBER_USE_LIBMVEC"], _LIBMVEC_PROBE)."""
        return self.processes[1].wait() == 0

    def close(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.kill()
            process.wait()
        shutil.rmtree(self.tmp, ignore_errors=True)


_prefetched: _ProbeRuns | None = None


def prefetch_compile_flags() -> None:
    """Start compile_flags' probes in the background unless their result is known (in this
    process or in the cache directory's file).  A failure is left for build() to raise."""
    global _prefetched
    with _flags_lock:
        if _prefetched is not None or compile_flags.cache_info().currsize:
            return
        try:
            if os.path.exists(_flags_marker()):
                return
            _prefetched = _ProbeRuns()
        except (OSError, CompileError):
            return


def _close_prefetched() -> None:
    """At exit: probes started and never read (a process whose graphs built no kernels)."""
    global _prefetched
    with _flags_lock:
        runs, _prefetched = _prefetched, None
    if runs is not None:
        runs.close()


atexit.register(_close_prefetched)


def vectorization_report(source: str) -> str | None:
    """g++'s report of the loops it vectorized in ``source`` (``-fopt-info-vec-optimized``, built
    with the kernels' flags; None when the compiler has no such report).  For tests."""
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "report.cpp")
        with open(src, "w") as f:
            f.write(source)
        result = subprocess.run([CXX, *BASE_FLAGS, *compile_flags(), "-fopt-info-vec-optimized", src,
                                 "-o", os.path.join(tmp, "report.so")], capture_output=True, text=True, check=False)
    return result.stderr if result.returncode == 0 and "optimized" in result.stderr else None


def cache_key(source: str, flags: list[str]) -> str:
    text = "\0".join([source, " ".join(flags), compiler_version()])
    return hashlib.sha256(text.encode()).hexdigest()


def build(source: str, name_hint: str = "kernels") -> str:
    """Path of a .so built from source (reused from the disk cache when ember wrote it intact).

    A cached .so is loaded only if the sha256 recorded beside it (``.so.sha256``, written by
    ember after the build) matches its bytes: a truncated, corrupted or foreign file is
    rebuilt.  Every file is written under a private name and renamed into place, so
    concurrent builders (threads or processes) never see half a file."""
    flags = BASE_FLAGS + list(compile_flags())
    key = cache_key(source, flags)
    directory = os.path.join(config.kernel_cache_dir(), "cpp", key[:2])
    so_path = os.path.join(directory, f"{name_hint}_{key[:24]}.so")
    with _lock_for(so_path):       # threads of one process build a kernel once; processes may race safely
        if verified(so_path):
            stats["cache_hits"] += 1
            return so_path
        _build_into(source, flags, directory, so_path)
    return so_path


_locks_guard = threading.Lock()
_build_locks: dict[str, threading.Lock] = {}


def _lock_for(path: str) -> threading.Lock:
    with _locks_guard:
        return _build_locks.setdefault(path, threading.Lock())


def _build_into(source: str, flags: list[str], directory: str, so_path: str) -> None:
    os.makedirs(directory, exist_ok=True)
    cpp_path = so_path[:-3] + ".cpp"
    _write_atomically(cpp_path, source.encode())
    fd, tmp_so = tempfile.mkstemp(suffix=".so", dir=directory)
    os.close(fd)
    # g++ reads a private copy of the source: another builder may be renaming cpp_path right now
    fd, tmp_cpp = tempfile.mkstemp(suffix=".cpp", dir=directory)
    with os.fdopen(fd, "w") as f:
        f.write(source)
    start = time.perf_counter()
    try:
        result = subprocess.run([CXX, *flags, tmp_cpp, "-o", tmp_so], capture_output=True, text=True, check=False)
        stats["compile_seconds"] += time.perf_counter() - start
        stats["compiles"] += 1
        if result.returncode != 0:
            raise CompileError(f"g++ failed on {cpp_path}:\n{result.stderr[-4000:]}", stage="runtime")
        with open(tmp_so, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
        # the hash first, then the .so: a reader that sees the new .so also sees its hash
        _write_atomically(so_path + ".sha256", digest.encode())
        os.replace(tmp_so, so_path)
    finally:
        for tmp in (tmp_so, tmp_cpp):
            if os.path.exists(tmp):
                os.unlink(tmp)


def verified(so_path: str) -> bool:
    """Is ``so_path`` a library ember built, intact (its bytes hash to the recorded sha256)?"""
    try:
        with open(so_path + ".sha256") as f:
            expected = f.read().strip()
        with open(so_path, "rb") as f:
            actual = hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return False
    return len(expected) == 64 and actual == expected


def _write_atomically(path: str, data: bytes) -> None:
    """Write under a private name and rename: readers see the old file or the whole new one."""
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".", suffix=".tmp", dir=os.path.dirname(path))
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def load(so_path: str) -> ctypes.CDLL:
    """dlopen a library ``build`` returned (once per process per path)."""
    lib = _loaded.get(so_path)
    if lib is None:
        lib = _loaded[so_path] = ctypes.CDLL(so_path)
    return lib


def load_function(lib: ctypes.CDLL, name: str, num_pointers: int, num_sizes: int = 0, error_record: bool = False):
    """A ctypes function taking raw pointers (Python ints), then int64 sizes (dynamic shapes),
    then the error record's pointer."""
    fn = getattr(lib, name)
    fn.argtypes = [ctypes.c_void_p] * num_pointers + [ctypes.c_int64] * num_sizes + \
        [ctypes.c_void_p] * error_record
    fn.restype = None
    return fn


def with_size_arguments(launch: Callable[..., None], names: list[str]) -> Callable[..., None]:
    """Mark a launcher as taking the size symbols ``names`` after its pointers: the host program
    passes their values (read from the inputs at each call)."""
    try:
        launch.size_arguments = tuple(names)
        return launch
    except AttributeError:
        def launch_with_sizes(*arguments: int) -> None:
            launch(*arguments)
        launch_with_sizes.size_arguments = tuple(names)
        return launch_with_sizes


def index_checked(launch: Callable[..., None]) -> Callable[..., None]:
    """``launch`` of a kernel that checks indirect indices: it takes one more pointer, an error
    record (one per calling thread, so concurrent calls never see each other's errors), and an
    out-of-range index it found raises eager's exception here (codegen/cpp_prelude.py)."""
    per_thread = threading.local()

    def checked_launch(*pointers: int) -> None:
        record = getattr(per_thread, "record", None)
        if record is None:
            record = per_thread.record = (ctypes.c_int64 * 4)()
            per_thread.address = ctypes.addressof(record)
        launch(*pointers, per_thread.address)
        if record[0]:
            from ember.lower.lower_indexing import index_error
            value, size, code = record[1], record[2], record[3]
            record[0] = 0
            raise index_error(value, size, code)
    return checked_launch
