"""rdu_cluster/processes.py: tasks over forked processes come back in the tasks' order."""

from __future__ import annotations

import os

from rdu_cluster import processes


def _square_and_pid(x: int) -> tuple[int, int]:
    return x * x, os.getpid()


def test_forked_tasks_come_back_in_their_order_whichever_start_first():
    tasks = list(range(12))
    out = processes.map_forked(_square_and_pid, tasks, 2, first=[11, 5, 5])
    assert [v for v, _ in out] == [x * x for x in tasks]
    assert processes.map_forked(_square_and_pid, tasks, 1) == [(x * x, os.getpid())
                                                               for x in tasks]


def test_the_tasks_run_in_forked_workers():
    """In a fresh interpreter: this test's process may have joined Ray (the Ray tests share a
    pytest worker with others), and there the tasks run in it (below)."""
    import subprocess
    import sys
    from pathlib import Path

    code = ("import os; from rdu_cluster import processes; "
            "out = processes.map_forked(lambda x: (x * x, os.getpid()), list(range(8)), 2, "
            "first=[7]); "
            "assert [v for v, _ in out] == [x * x for x in range(8)], out; "
            "assert os.getpid() not in {p for _, p in out}, out; print('in workers')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       cwd=Path(__file__).resolve().parents[1], check=False)
    assert r.returncode == 0 and r.stdout.strip() == "in workers", r.stderr[-2000:]


def test_a_closure_goes_along_with_the_fork_unpickled():
    seen = {"a": 1}  # what a task reads without being sent: set before the fork
    assert processes.map_forked(lambda k: seen[k] + 1, ["a", "a"], 2) == [2, 2]
    assert processes.available_cores() >= 1


def test_each_ended_task_is_handed_to_done_in_this_process():
    for jobs in (1, 2):
        ended: list[tuple[int, int, int]] = []

        def done(i: int, r: tuple[int, int], ended=ended) -> None:
            ended.append((i, r[0], os.getpid()))

        out = processes.map_forked(_square_and_pid, list(range(5)), jobs, first=[4], done=done)
        assert sorted(ended) == [(i, i * i, os.getpid()) for i in range(5)]
        assert [v for v, _ in out] == [i * i for i in range(5)]


def test_a_process_that_joined_ray_runs_the_tasks_itself(monkeypatch):
    """Ray's threads (gRPC's among them) make a fork unsafe: once joined, no pool."""
    import sys
    import types

    monkeypatch.setitem(sys.modules, "ray", types.SimpleNamespace(is_initialized=lambda: True))
    out = processes.map_forked(_square_and_pid, list(range(4)), 2)
    assert out == [(x * x, os.getpid()) for x in range(4)]


def test_the_workers_are_gone_when_the_block_ends_done_or_not():
    import multiprocessing

    assert processes.map_forked(_square_and_pid, list(range(6)), 2)
    assert multiprocessing.active_children() == []
    with processes.started(lambda x: x, list(range(6)), 2):
        pass  # left with every task under way: the workers are ended, not waited for
    assert multiprocessing.active_children() == []
