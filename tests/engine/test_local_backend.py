"""LocalBackend's shared work (backends/local.py): sockets of equal memory apply a command's
region ops once, and sockets that differ only in their expert loads are costed in one
evaluation. A run must be the run of every socket on its own, table for table."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from chip.cost_tables import CHUNK, DECODE, PREFILL, Spans
from rdu_cluster.backends.local import LocalBackend
from rdu_cluster.engine.schedulers import Limits
from tests.engine.test_cost_window import _tables
from workloads import traces


class OneByOne(LocalBackend):
    """Every socket on its own: its own memory, its own ops, its own cost evaluation."""

    def _share(self) -> None:
        self.holders = {id(s.memory): (s.memory, [i]) for i, s in self.sockets.items()}

    def run(self, seq, ops, spans, loads, sockets) -> dict:
        out = {}
        for i in sockets:
            sock = self.sockets[i]
            load = loads.get(i) if loads else None
            s = spans if load is None else replace(spans, expert_load=load)
            rows, moves = sock.run(seq, ops, s)
            out[i] = (rows, moves, sock.occupancy())
        return out


class Watched(LocalBackend):
    """LocalBackend, keeping how many memories its sockets held when it closed."""

    def close(self) -> None:
        self.memories = len({id(s.memory) for s in self.sockets.values()})
        super().close()


def _same(a, b) -> None:
    for name in ("requests", "steps", "sockets", "links"):
        assert getattr(a, name).equals(getattr(b, name)), name
    assert a.summary == b.summary


@pytest.mark.parametrize("case", [
    # expert parallel: 8 groups of different loads each step, a degraded socket among them
    {"model": "mixtral-8x7b", "plan": "tp2ep8", "n": 6, "rate": 50.0,
     "faults": ("socket:3@0:degraded:0.5",)},
    # two replicas of shared memory at the start (split at their first commands), with KV
    # swapped to host memory (region moves that cost seconds)
    {"model": "llama-3.1-70b", "cluster": "dgx-h100", "plan": "tp4", "n": 32, "rate": 1000.0,
     "prompt": traces.LengthDist("fixed", 2048), "output": traces.LengthDist("fixed", 1024),
     "kv_memory_fraction": 0.02, "limits": Limits(max_batch=64, preemption="swap")},
])
def test_shared_memory_and_costs_are_each_socket_on_its_own(serve, case):
    sim, shared = serve(backend=Watched(), **case)
    _, alone = serve(backend=OneByOne(), **case)
    _same(shared, alone)
    if case["plan"] == "tp4":
        assert sum(shared.requests.column("swaps").to_pylist()) > 0
        assert sim.backend.memories == 2  # a replica's sockets hold one; the two their own


def test_costed_together_is_costed_alone():
    """CostTables.windows: each load's rows are `window`'s under that load, bit for bit."""
    rng = np.random.default_rng(3)
    # the last span's steps are more than CHUNK / 3: its loads evaluated a few at a time
    kind = np.array([DECODE, PREFILL, DECODE, DECODE, DECODE])
    steps = np.array([5, 1, 7, 3, CHUNK // 2])
    spans = Spans(kind=kind, steps=steps, batch=np.array([8, 0, 9, 3, 4]),
                  ctx_sum=np.array([4000, 0, 8100, 300, 20]), pre_seqs=np.array([0, 2, 0, 0, 0]),
                  pre_tokens=np.array([0, 300, 0, 0, 0]), pre_prefix=np.zeros(5, dtype=int))
    m = int(steps.sum())
    loads = [rng.uniform(0.5, 2.0, m) for _ in range(3)] + [np.ones(m)]
    loads[1][:5] = 1.0  # a span of mean loads among drawn ones
    t = _tables()
    together = t.windows(spans, loads)
    for ld, rows in zip(loads, together):
        alone = _tables().window(replace(spans, expert_load=ld))
        assert np.array_equal(rows, alone)


def test_a_windows_drawn_decode_steps_are_one_evaluation_whatever_their_spans():
    """CostTables.windows: the decode spans of a draining window (a batch that shrinks span
    by span) under drawn loads, a socket at the mean load among them, are the points of one
    evaluation (where each span took its own, and the mean-load socket one more), with the
    rows each socket's load gives alone."""
    rng = np.random.default_rng(5)
    batch = np.arange(300, 260, -4)  # each batch a table asked for once: every step a point
    steps = np.array([1, 2] * 5)
    spans = Spans(kind=np.full(10, DECODE), steps=steps, batch=batch,
                  ctx_sum=batch * 1500 + 7, pre_seqs=np.zeros(10, dtype=int),
                  pre_tokens=np.zeros(10, dtype=int), pre_prefix=np.zeros(10, dtype=int))
    m = int(steps.sum())
    loads = [rng.uniform(0.8, 1.3, m) for _ in range(5)] + [np.ones(m)]
    t = _tables()
    before = t.evaluations
    together = t.windows(spans, loads)
    assert t.evaluations - before == 1
    for ld, rows in zip(loads, together):
        assert np.array_equal(rows, _tables().window(replace(spans, expert_load=ld)))


def test_link_bytes_are_each_windows_sent_bytes_added_in_window_order(serve):
    """engine/record.py adds a window's bytes to its links as one array: the links table must
    be the sockets table's sent bytes added one window at a time, link by link (a full mesh:
    a socket's bytes spread over every other socket of its stage), to the last bit."""
    from rdu_cluster.engine.record import _sends

    sim, t = serve(model="llama-3.1-8b", cluster="sn40l-16", plan="tp8", n=16, rate=40.0)
    rows = t.sockets.to_pydict()
    stage = {s: st for lay in sim.layouts.values() for st in lay.stages for s in st}
    want: dict = {}
    for s, sent in zip(rows["socket"], rows["sent_bytes"]):
        for src, targets, share in _sends(stage[s], True):
            if src == s:
                for dst in targets:
                    want[(s, dst)] = want.get((s, dst), 0.0) + sent * share
    links = t.links.to_pydict()
    got = {(a, b): x for a, b, x in zip(links["src"], links["dst"], links["bytes"])}
    assert len(sim.replicas) == 2 and got == want and max(got.values()) > 0


def test_shared_cost_tables_are_reused_and_bounded(monkeypatch):
    """backends/local.shared_tables: equal chip, program and collectives give the one
    CostTables of the process; past the newest, tables are kept only under SHARED_BYTES."""
    from rdu_cluster.backends import local
    from rdu_cluster.config import load_cluster
    from rdu_cluster.engine.simulation import ServeConfig, Simulation
    from workloads.catalog import load_model
    from workloads.spec import with_dtypes

    def setup(cluster: str, weights: str = "bf16", plan: str = "tp8"):
        trace = traces.synthetic(1, 1.0, "poisson", traces.LengthDist("fixed", 16),
                                 traces.LengthDist("fixed", 4))
        sim = Simulation(with_dtypes(load_model("llama-3.1-8b"), weights, None),
                         load_cluster(cluster), trace, ServeConfig(plan=plan), LocalBackend())
        sim.run()
        return next(iter(sim.build.setups(sim.layouts[0], sim.plan).values()))

    a, a2, fp8 = setup("sn40l-8"), setup("sn40l-8"), setup("sn40l-8", "fp8")
    b = setup("sn40l-16", plan="tp16")
    monkeypatch.setattr(local, "_shared", type(local._shared)())
    first = local.shared_tables(a)
    assert local.shared_tables(a2) is first  # another run's, the same tables
    # a tp8 group within a node of sn40l-16 (two a node) costs its collectives as one of
    # sn40l-8 (interconnect.alone_layout): the same tables
    assert local.shared_tables(setup("sn40l-16")) is first
    # the same model name at other weights: other tables (the program key names the model)
    assert fp8.program.key() == a.program.key() and local.shared_tables(fp8) is not first
    first._fill(8, 0)  # a decode table
    assert local._nbytes(first) > 0
    monkeypatch.setattr(local, "SHARED_BYTES", local._nbytes(first) / 2)
    local.shared_tables(b)
    assert first not in local._shared.values()  # past the bound: dropped
    monkeypatch.setattr(local, "SHARED_BYTES", 256e6)
    again = local.shared_tables(a)
    assert again is not first


class Counted(LocalBackend):
    """LocalBackend, counting the steps it was asked to cost."""

    steps = 0

    def run(self, seq, ops, spans, loads, sockets) -> dict:
        self.steps += int(spans.steps.sum())
        return super().run(seq, ops, spans, loads, sockets)


class Whole(Counted):
    """A window's steps costed in one command each, to their planned end."""

    reruns = False


def test_a_cut_span_of_drawn_loads_costed_in_rounds_is_the_run_costed_whole(serve):
    """engine/windows.py WindowExecutor._costed: a span cut at an arrival, its expert loads
    drawn, is costed FIRST_STEPS steps at a time, four times more each round, until it passes
    the cut: the tables are those of costing it to its planned end, in fewer steps costed."""
    case = {"model": "mixtral-8x7b", "plan": "tp2ep8", "n": 12, "rate": 20.0,
            "output": traces.LengthDist("fixed", 96)}
    sim, rounds = serve(backend=Counted(), **case)
    other, whole = serve(backend=Whole(), **case)
    _same(rounds, whole)
    steps = len(rounds.steps)  # 167 run; 223 costed in rounds, 683 costed whole
    assert sim.sampler is not None and steps < sim.backend.steps < 2 * steps
    assert other.backend.steps > 3 * steps


def test_a_steps_load_draw_does_not_depend_on_the_span_it_falls_in():
    """What _costed takes of the sampler (a span's first k steps' loads do not depend on how
    many steps were drawn), and what a window's end may cut (a span of 64 steps drawn as 17
    and 47 from the 17th step on draws the same loads): each step's draw is keyed by the step.
    Another replica, seed or step draws otherwise."""
    from rdu_cluster.engine.expert_loads import ExpertLoadSampler

    s = ExpertLoadSampler(256, 8, 32, seed=5)
    full = s.loads(0, 17, 500, 64)
    for k in (1, 4, 16, 64):
        assert np.array_equal(s.loads(0, 17, 500, k), full[:k])
    assert np.array_equal(np.concatenate([s.loads(0, 17, 500, 17), s.loads(0, 34, 500, 47)]),
                          full)
    for other in (s.loads(1, 17, 500, 1), ExpertLoadSampler(256, 8, 32, 6).loads(0, 17, 500, 1),
                  s.loads(0, 18, 500, 1)):
        assert not np.array_equal(other[0], full[0])
    assert full.shape == (64, 32) and np.allclose(full.mean(axis=1), 1.0)


class Started(LocalBackend):
    """LocalBackend, keeping the setups it started its sockets with."""

    def start(self, setups) -> None:
        self.setups = setups
        super().start(setups)


def test_a_command_after_its_sockets_memory_split_applies_its_ops_to_each_copy(serve):
    """LocalBackend.run keeps how a command's sockets share memory (_layout) until a memory
    is split: sockets 0 and 1 share one, a command to 0 alone gives 0 a copy, and the next
    command to both must apply its ops to both copies, as sockets on their own do."""
    started = Started()
    serve(backend=started, model="llama-3.1-8b", cluster="sn40l-16", plan="tp8", n=4, rate=40.0)
    one = Spans(kind=np.array([DECODE]), steps=np.array([1]), batch=np.array([4]),
                ctx_sum=np.array([400]), pre_seqs=np.zeros(1, dtype=int),
                pre_tokens=np.zeros(1, dtype=int), pre_prefix=np.zeros(1, dtype=int))
    commands = [([0, 1], ["alloc", "kv/a", "hbm", 3e6, "kv"]),
                ([0], ["alloc", "kv/b", "hbm", 5e6, "kv"]),  # 0's memory copied: its own
                ([0, 1], ["free", "kv/a"]), ([0, 1], ["alloc", "kv/c", "hbm", 2e6, "kv"])]
    got = []
    for backend in (LocalBackend(), OneByOne()):
        backend.start(started.setups)
        replies = [backend.run(seq, [[op], []], one, None, socks)
                   for seq, (socks, op) in enumerate(commands, 1)]
        got.append(([{i: occ for i, (_, _, occ) in r.items()} for r in replies],
                    [backend.sockets[i].memory.state() for i in (0, 1)]))
    assert got[0] == got[1]
    names = [{r[0] for r in state} for state in got[0][1]]
    assert "kv/a" not in names[0] | names[1] and "kv/b" in names[0] - names[1]
