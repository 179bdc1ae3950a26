"""`serve --timeline`: Chrome/Perfetto trace-event JSON with a track per socket and per link whose
slices add up to the steps table."""

from __future__ import annotations

import json
import os
import stat
from collections import defaultdict

import numpy as np
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from rdu_cluster.cli import main

BASE = ["serve", "--model", "llama-3.1-8b", "--requests", "12", "--rate", "20",
        "--prompt-len", "uniform:64:512", "--output-len", "24"]


def _run(tmp_path, *extra, cluster="sn40l-8"):
    out, path = tmp_path / "out", tmp_path / "run.json"
    tmp_path.mkdir(parents=True, exist_ok=True)  # serve creates nothing before it validates
    r = CliRunner().invoke(main, [*BASE, "--cluster", cluster, "--out", str(out),
                                  "--timeline", str(path), *extra])
    assert r.exit_code == 0, r.output + (r.stderr or "")
    assert "trace events; open in ui.perfetto.dev" in r.stderr
    trace = json.loads(path.read_text())
    return trace, pq.read_table(out / "steps.parquet").to_pandas(), path


def _slices(trace):
    """Complete events ("X") by process id, and process names."""
    names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_name"}
    by_pid = defaultdict(list)
    for e in trace["traceEvents"]:
        if e["ph"] == "X":
            by_pid[e["pid"]].append(e)
    return by_pid, names


def _per_step(events):
    out = defaultdict(float)
    for e in events:
        out[(e["args"]["replica"], e["args"]["step"])] += e["dur"] / 1e6
    return out


def test_plain_run_one_track_per_socket_summing_to_the_steps(tmp_path):
    trace, steps, path = _run(tmp_path)
    assert trace["displayTimeUnit"] == "ms"
    by_pid, names = _slices(trace)
    sockets = {p: n for p, n in names.items() if n.startswith("socket ")}
    assert sorted(sockets.values()) == [f"socket {s} (replica 0, node 0)" for s in range(8)]
    engine = steps[steps.phase != "recovery"]
    want = dict(zip(zip(engine.replica, engine.step), engine.time_s))
    for pid in sockets:
        got = _per_step(by_pid[pid])
        assert got.keys() == want.keys()  # a slice for every step on every socket
        np.testing.assert_allclose([got[k] for k in want], list(want.values()), rtol=1e-9)
        assert {e["name"] for e in by_pid[pid]} <= {"prefill", "decode", "mixed", "sync wait"}
    links = [n for n in names.values() if n.startswith("link ")]
    assert len(links) == 8  # the tp8 ring: one link per socket to the next
    counters = [e for e in trace["traceEvents"] if e["ph"] == "C"]
    assert counters and all(e["args"]["bytes/s"] >= 0 for e in counters)
    assert stat.S_IMODE(os.stat(path).st_mode) & 0o044 == 0o044  # others may read it
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".run.json")]  # no temp left


def test_pipeline_stages_and_activation_messages_add_up_to_each_step(tmp_path):
    trace, steps, _ = _run(tmp_path, "--plan", "tp4pp2")
    by_pid, names = _slices(trace)
    stage0 = next(p for p, n in names.items() if n.startswith("socket 0 "))
    stage1 = next(p for p, n in names.items() if n.startswith("socket 4 "))
    hop = next(p for p, n in names.items() if n == "link 0->4")
    assert {e["name"] for e in by_pid[hop]} == {"activations"}
    total = defaultdict(float)
    for pid in (stage0, stage1, hop):
        for k, v in _per_step(by_pid[pid]).items():
            total[k] += v
    for rep, step, t in zip(steps.replica, steps.step, steps.time_s):
        assert total[(rep, step)] == pytest.approx(t, rel=1e-9)
    # stage 1 starts when stage 0 and the activations are done: no overlap on one step
    first = {(e["args"]["step"]): e for e in by_pid[stage1] if e["name"] != "sync wait"}
    for e in by_pid[hop]:
        nxt = first[e["args"]["step"]]
        assert nxt["ts"] == pytest.approx(e["ts"] + e["dur"], abs=1e-3)


def test_separate_draft_shows_draft_verify_and_both_messages(tmp_path):
    trace, _, _ = _run(tmp_path, "--draft", "llama-3.2-1b", "--spec-k", "4",
                       "--draft-placement", "separate", "--draft-sockets", "4", "--plan", "tp4")
    by_pid, names = _slices(trace)
    draft = {e["name"] for e in by_pid[next(p for p, n in names.items()
                                            if n.startswith("socket 0 "))]}
    target = {e["name"] for e in by_pid[next(p for p, n in names.items()
                                             if n.startswith("socket 4 "))]}
    assert "draft (decode)" in draft and "verify (decode)" in target
    msgs = {e["name"] for p, n in names.items() if n.startswith("link ") for e in by_pid[p]}
    assert {"drafts", "verdict"} <= msgs


def test_coe_expert_copies_are_slices_before_their_step(tmp_path):
    trace, steps, _ = _run(tmp_path, "--coe-experts", "30", "--coe-hbm-slots", "2",
                           "--coe-distribution", "uniform")
    by_pid, names = _slices(trace)
    s0 = next(p for p, n in names.items() if n.startswith("socket 0 "))
    copies = [e for e in by_pid[s0] if e["name"] == "expert copy (CoE switch)"]
    assert len(copies) == int((steps.switch_s > 0).sum()) > 0
    assert sum(e["dur"] for e in copies) / 1e6 == pytest.approx(steps.switch_s.sum(), rel=1e-9)


def test_timeline_path_errors_are_one_line(tmp_path):
    for bad, why in ((tmp_path, "is a folder"), (tmp_path / "no" / "t.json", "does not exist")):
        r = CliRunner().invoke(main, [*BASE, "--out", str(tmp_path / "o"), "--timeline",
                                      str(bad)])
        assert r.exit_code == 2 and why in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_shared_draft_and_a_failure_recovery(tmp_path):
    trace, _, _ = _run(tmp_path, "--draft", "llama-3.2-1b", "--spec-k", "3")
    by_pid, names = _slices(trace)
    s0 = next(p for p, n in names.items() if n.startswith("socket 0 "))
    assert "speculative decode (draft + verify)" in {e["name"] for e in by_pid[s0]}

    trace, steps, _ = _run(tmp_path / "f", "--fault", "socket:3@0.05", "--plan", "tp8")
    by_pid, names = _slices(trace)
    reloads = [e for evs in by_pid.values() for e in evs if e["name"] == "weight reload (recovery)"]
    rec = steps[steps.phase == "recovery"]
    assert len(rec) == 1 and len(reloads) == int(rec.sockets.iloc[0]) > 0
    assert all(e["dur"] / 1e6 == pytest.approx(rec.time_s.iloc[0]) for e in reloads)
    assert all(e["pid"] != 3 for e in reloads)  # the failed socket reloads nothing


@pytest.mark.slow  # two serve runs
def test_a_run_that_fails_leaves_out_and_the_timeline_as_they_were(tmp_path, monkeypatch):
    """The timeline is streamed to a hidden file beside it and appears after the tables; a
    failure before (the timeline held the whole trace and ran out of memory after --out was
    already replaced) leaves both as they were, with no temporary file."""
    from rdu_cluster.output import timeline

    _, _, path = _run(tmp_path)
    out = tmp_path / "out"
    before = {p.name: p.stat().st_mtime_ns for p in [*out.iterdir(), path]}

    def fail(self):
        raise MemoryError("the trace")

    monkeypatch.setattr(timeline.Timeline, "finish", fail)
    r = CliRunner().invoke(main, [*BASE, "--cluster", "sn40l-8", "--out", str(out),
                                  "--timeline", str(path), "--seed", "3"])
    assert r.exit_code == 1 and "MemoryError" in r.stderr
    assert {p.name: p.stat().st_mtime_ns for p in [*out.iterdir(), path]} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "run.json"]


def test_a_pair_draws_both_pools_and_each_kv_hand_over(tmp_path):
    """--prefill-pool/--decode-pool: each pool's sockets named by their pool, their slices
    adding up to their replica's steps; a fabric track per (prefill, decode) replica pair with
    a slice per hand-over, from its ports' free interval to the KV's arrival."""
    out, path = tmp_path / "out", tmp_path / "run.json"
    r = CliRunner().invoke(main, [*BASE, "--prefill-pool", "dgx-h100:tp2:2", "--decode-pool",
                                  "sn40l-8:tp4:2", "--out", str(out), "--timeline", str(path)])
    assert r.exit_code == 0, r.output + (r.stderr or "")
    by_pid, names = _slices(json.loads(path.read_text()))
    steps = pq.read_table(out / "steps.parquet").to_pandas()
    requests = pq.read_table(out / "requests.parquet").to_pandas()
    want = dict(zip(zip(steps.replica, steps.step), steps.time_s))
    for pool, first, sockets in (("prefill", 0, 4), ("decode", 2, 8)):  # decode replicas 2, 3
        tracks = {p: n for p, n in names.items() if n.startswith(f"{pool} socket ")}
        assert len(tracks) == sockets
        for pid in tracks:
            for (rep, step), t in _per_step(by_pid[pid]).items():
                assert t == pytest.approx(want[(first + rep, step)], rel=1e-9)
    fabric = [p for p, n in names.items() if n.startswith("fabric: prefill replica ")]
    hand = sorted((e for p in fabric for e in by_pid[p]), key=lambda e: e["args"]["request"])
    assert [e["args"]["request"] for e in hand] == sorted(requests.request_id)
    moved = requests.set_index("request_id")
    for e in hand:
        row = moved.loc[e["args"]["request"]]
        assert e["args"]["bytes"] == row.kv_transfer_bytes
        assert 0 < e["dur"] / 1e6 <= row.kv_transfer_s * (1 + 1e-9)  # a wait for ports before
