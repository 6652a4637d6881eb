"""Worker processes that do not run the user's script again.

``multiprocessing``'s "spawn" start method makes each child import the parent's ``__main__``
module by path (as ``__mp_main__``) before it runs any task, so that functions defined there
unpickle.  For a training script without an ``if __name__ == "__main__":`` guard -- most of
them, and every notebook-turned-script -- that re-runs the whole script in every compile worker:
measured on an H100 with 16 workers, each loaded and stepped the model again, 46 GB of GPU
memory went to the copies and the user's own step ran out of memory.  Ember's workers only run
functions of ember's own modules, so they skip that import: the preparation data of a process
named ``ember-worker-*`` has no main module (``get_preparation_data`` is wrapped once; every
other process is prepared as before).
"""
from __future__ import annotations

import concurrent.futures
import itertools
import multiprocessing
import multiprocessing.context
import multiprocessing.spawn
import threading
from typing import Any

NAME_PREFIX = "ember-worker-"
_MAIN_KEYS = ("init_main_from_path", "init_main_from_name")
_numbers = itertools.count()
_lock = threading.Lock()


class _WorkerProcess(multiprocessing.context.SpawnProcess):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.name = f"{NAME_PREFIX}{next(_numbers)}"


class _WorkerContext(multiprocessing.context.SpawnContext):
    Process = _WorkerProcess


def _preparation_without_main(original: Any) -> Any:
    def get_preparation_data(name: str) -> dict:
        data = original(name)
        if name.startswith(NAME_PREFIX):
            for key in _MAIN_KEYS:
                data.pop(key, None)
        return data
    get_preparation_data.ember_wrapped = True       # type: ignore[attr-defined]
    return get_preparation_data


def process_pool(workers: int) -> concurrent.futures.ProcessPoolExecutor:
    """A pool of ``workers`` spawned processes that never import ``__main__``."""
    with _lock:
        if not getattr(multiprocessing.spawn.get_preparation_data, "ember_wrapped", False):
            multiprocessing.spawn.get_preparation_data = _preparation_without_main(
                multiprocessing.spawn.get_preparation_data)
    return concurrent.futures.ProcessPoolExecutor(workers, mp_context=_WorkerContext())
