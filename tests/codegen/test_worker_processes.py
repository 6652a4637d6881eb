"""Ember's compile workers never run the user's script again (runtime/worker_processes.py).

A script without an ``if __name__ == "__main__":`` guard is run in a fresh interpreter; it notes
each time its top level runs, then has ember's worker pool run tasks.  Plain "spawn" workers
import the script as ``__mp_main__`` first (it ran once per worker, and each copy loaded the
user's model onto the GPU); ember's must not."""
from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import concurrent.futures, multiprocessing, os, sys
    with open(sys.argv[1], "a") as marker:      # the user's script (a spawned child sees the same argv)
        marker.write(f"{os.getpid()}\\n")
    from ember.runtime.worker_processes import process_pool
    if sys.argv[2] == "ember":
        pool = process_pool(2)
    else:
        pool = concurrent.futures.ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn"))
    pids = {pool.submit(os.getpid).result() for _ in range(8)}
    pool.shutdown()
    print(len(pids - {os.getpid()}))
""")


def _runs_of_script(tmp_path, pool: str) -> tuple[int, str]:
    script, marker = tmp_path / f"user_script_{pool}.py", tmp_path / f"runs_{pool}.txt"
    script.write_text(SCRIPT)
    done = subprocess.run([sys.executable, str(script), str(marker), pool], capture_output=True, text=True,
                          timeout=300, cwd=str(tmp_path))
    return len(marker.read_text().split()), done.stdout + done.stderr


def test_workers_do_not_rerun_the_users_script(tmp_path):
    runs, output = _runs_of_script(tmp_path, "ember")
    assert output.strip().splitlines()[-1] in ("1", "2"), output      # the tasks ran in workers
    assert runs == 1, output


def test_plain_spawn_workers_would(tmp_path):
    """The hazard itself, so that the test above cannot pass for another reason."""
    runs, output = _runs_of_script(tmp_path, "spawn")
    assert runs > 1, output
