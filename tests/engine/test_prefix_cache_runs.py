"""The prefix cache's per-request bookkeeping (engine/prefix_cache/: a running request's own
blocks as a count, blocks no request can find again as one count per run of the eviction order)
against the per-block cache it replaced (prefix_reference.ReferenceCache): the same lookups,
claims, tiers and evictions operation by operation, the same tables end to end, and no residue
of finished requests."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import pytest

from rdu_cluster.backends.local import LocalBackend
from rdu_cluster.config import load_cluster
from rdu_cluster.engine import evictions
from rdu_cluster.engine.prefix_cache import Liveness, PrefixCache, PrefixConfig
from rdu_cluster.engine.prefix_cache import cache as cache_module
from rdu_cluster.engine.requests import DONE, RUNNING, WAITING, Request
from rdu_cluster.engine.schedulers import Limits
from rdu_cluster.engine.simulation import ServeConfig, Simulation
from tests.engine.prefix_reference import ReferenceCache
from workloads import traces
from workloads.catalog import load_model
from workloads.sessions import SessionSpec, ThinkTime, sessions

SPEC = SessionSpec(12, 4, 256, traces.LengthDist("uniform", 32, 160),
                   traces.LengthDist("uniform", 8, 48), ThinkTime.parse("exponential:0.5"),
                   rate=20.0)
MOONCAKE = Path(__file__).resolve().parents[1] / "data/traces/mooncake_conversation_200.jsonl"


def _contents(rng: random.Random, n: int) -> list[tuple]:
    """Requests sharing prefixes: a system chunk, a few shared documents, session-like
    histories (each turn repeats the one before), and requests whose tokens are their own."""
    out, history = [], {}
    for i in range(n):
        kind = rng.choice(("system", "doc", "turn", "own"))
        if kind == "own":
            out.append(())
            continue
        head = ((0, rng.choice((16, 40, 64))),) if kind != "doc" else ()
        if kind == "turn":
            s = rng.randrange(3)
            history[s] = history.get(s, head) + ((1000 + i, rng.randint(8, 60)),)
            out.append(history[s] + ((2000 + i, 64),))
            continue
        out.append(head + ((100 + rng.randrange(4), rng.randint(20, 90)), (3000 + i, 64)))
    return out


def _requests(contents: list[tuple], rng: random.Random) -> list[Request]:
    reqs = []
    for i, c in enumerate(contents):
        total = sum(n for _, n in c) if c else rng.randint(20, 150)
        out = rng.randint(2, 40) if not c else min(40, max(1, total // 3))
        reqs.append(Request(i, 0.0, total - out if c else total, out, content=c))
    return reqs


def _same(a: ReferenceCache, b: PrefixCache, reqs: list[Request], tiers: tuple) -> None:
    for t in tiers:
        assert a.blocks_in(t) == b.blocks_in(t), t
        assert len(a.evictable[t]) == b.tiers.size[t], t
    for r in reqs:
        if r.state == WAITING:
            assert a.peek(r) == b.peek(r), r.id
            assert a.lookup(r) == b.lookup(r), r.id


@pytest.mark.parametrize("eviction", evictions.names())
@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("lower_blocks", [0, 3, 40])
def test_every_operation_matches_the_per_block_cache(seed, lower_blocks, eviction):
    rng = random.Random(seed)
    contents = _contents(rng, 40)
    reqs = _requests(contents, rng)
    lower = "ddr" if lower_blocks else None
    ref = ReferenceCache(16, 16, lower, lower_blocks, 0.25, eviction)
    new = PrefixCache(16, 16, lower, lower_blocks, 0.25, eviction,
                      live=Liveness(tuple(c or ((-(i + 2), 1),) for i, c in enumerate(contents))))
    tiers = ("hbm", "ddr") if lower else ("hbm",)
    running: list[Request] = []
    for _ in range(400):
        waiting = [r for r in reqs if r.state == WAITING]
        op = rng.random()
        if op < 0.35 and waiting:
            r = rng.choice(waiting)
            a, b = ref.claim(r), new.claim(r)
            assert (a.tokens, a.copy_s) == (b.tokens, b.copy_s)
            r.state, r.cached = RUNNING, a.total
            for c in (ref, new):
                c.computed(r, r.prompt_len + r.generated)
            r.cached = r.prompt_len + r.generated
            running.append(r)
        elif op < 0.7 and running:
            r = running.pop(rng.randrange(len(running)))
            if rng.random() < 0.7:
                r.generated, r.state = r.output_len, DONE
                tokens = r.prompt_len + r.output_len - 1
            else:  # preempted part-way through its answer
                r.generated = rng.randint(r.generated, r.output_len - 1)
                r.state, tokens = WAITING, r.prompt_len + r.generated
            for c in (ref, new):
                c.release(r, tokens)
        elif op < 0.97:
            free = rng.randint(0, 30)
            ref.fit(free)
            new.fit(free)
        else:  # a failed socket: running requests go back to the queue
            for r in running:
                r.state, r.cached = WAITING, 0
            running.clear()
            ref.clear()
            new.clear()
        _same(ref, new, reqs, tiers)


def _run(trace, model, cluster, monkeypatch=None, **config):
    if monkeypatch is not None:  # the per-block cache in the engine
        monkeypatch.setattr(cache_module, "PrefixCache", lambda *a: ReferenceCache(*a[:6]))
    sim = Simulation(load_model(model), load_cluster(cluster), trace, ServeConfig(**config),
                     LocalBackend())
    tables = sim.run()
    if monkeypatch is not None:
        monkeypatch.undo()
    return sim, tables


def _synthetic():
    return traces.synthetic(60, 50.0, "poisson", traces.LengthDist("uniform", 64, 1024),
                            traces.LengthDist("uniform", 4, 96), seed=1)


def _mooncake():
    t = traces.read_trace(MOONCAKE)
    return traces.Trace(t.arrival_s[:30], t.prompt_len[:30], t.output_len[:30],
                        content=t.content[:30], source="excerpt[:30]")


# (trace, model, cluster, config, prefix tokens found in HBM / DDR / host memory as the
# per-block cache printed them at commit 8c01fc7, under LRU). The exact counts follow the
# chips' timing (a recalibration moves them), so the test checks which tiers serve hits under
# the default policy (another policy may keep other blocks: an MRU finds none below HBM in
# "own tokens, preemptions"); exactness comes from the table-by-table comparison with the
# per-block cache, for every policy.
RUNS = {
    "sessions, small HBM, DDR": (lambda: sessions(SPEC, seed=5), "llama-3.1-70b", "sn40l-16",
                                 {"kv_memory_fraction": 0.002, "limits": Limits(max_batch=8)},
                                 (15280, 5264, 0)),
    "sessions, host memory": (lambda: sessions(SPEC, seed=5), "llama-3.1-70b", "dgx-h100",
                              {"kv_memory_fraction": 0.002, "limits": Limits(max_batch=8),
                               "prefix": PrefixConfig("tiered")},  # a GPU's default: hbm
                              (15216, 0, 5840)),
    "sessions, preemptions": (lambda: sessions(SPEC, seed=5), "llama-3.1-70b", "sn40l-16",
                              {"kv_memory_fraction": 0.001}, (15136, 8016, 0)),
    "own tokens, preemptions": (_synthetic, "llama-3.1-70b", "sn40l-16",
                                {"kv_memory_fraction": 0.004}, (2944, 48, 0)),
    "mooncake, hbm": (_mooncake, "llama-3.1-8b", "sn40l-16",
                      {"limits": Limits(chunked_prefill=True), "prefix": PrefixConfig("hbm")},
                      (14336, 0, 0)),
    "sessions, prefix-aware routing": (lambda: sessions(SPEC, seed=5), "llama-3.1-8b",
                                       "sn40l-16", {"plan": "tp4", "routing": "prefix-aware"},
                                       (18640, 0, 0)),
}


@pytest.mark.parametrize("eviction", evictions.names())
@pytest.mark.parametrize("name", list(RUNS))
def test_serve_tables_equal_the_per_block_cache(name, eviction, monkeypatch):
    make, model, cluster, config, found = RUNS[name]
    config = {**config, "prefix": replace(config.get("prefix", PrefixConfig()), eviction=eviction)}
    _, ref = _run(make(), model, cluster, monkeypatch, **config)
    sim, new = _run(make(), model, cluster, **config)
    for table in ("requests", "steps", "sockets"):
        assert getattr(ref, table).equals(getattr(new, table)), table
    r = new.requests.to_pydict()
    hits = tuple(sum(r[f"prefix_{t}_tokens"]) for t in ("hbm", "ddr", "host"))
    if eviction == evictions.DEFAULT:  # the runs reach the tiers (another policy may keep
        assert tuple(h > 0 for h in hits) == tuple(f > 0 for f in found), hits  # others)
    caches = [rep.prefix for rep in sim.replicas]
    assert not any(c.seqs for c in caches)  # nothing is kept per finished request
    if len(caches) == 1 and all(s == DONE for s in r["state"]):
        assert not caches[0].tree.heads  # and nothing it cached can be found any more


def test_a_light_trace_leaves_counts_not_entries():
    """Requests whose tokens are their own leave nothing findable when they finish: what they
    cached is one count per run of each tier's eviction order, whatever the trace's length."""
    trace = traces.synthetic(200, 50.0, "poisson", traces.LengthDist("fixed", 256),
                             traces.LengthDist("fixed", 32))
    sim, _ = _run(trace, "llama-3.1-8b", "sn40l-8")
    (cache,) = [rep.prefix for rep in sim.replicas]
    assert not cache.tree.heads and not cache.seqs
    # each leaves the full blocks of its KV: prompt and answer but the last token (not computed)
    assert cache.blocks_in("hbm") + cache.blocks_in("ddr") == 200 * ((256 + 32 - 1) // 16)
    assert all(len(p) <= 2 for p in cache.tiers.evictable.values())


def test_dead_blocks_demote_and_evict_as_one_block_at_a_time():
    """Eviction order across a tier's runs: dead blocks (a finished request's own) and findable
    ones (a shared document) interleave in LRU order, and demotion past a full lower tier keeps
    the newest blocks."""
    own = Request(0, 0.0, 64, 1)
    doc = Request(1, 0.0, 63, 1, content=((5, 64),))
    reader = Request(2, 0.0, 64, 1, content=((5, 64), (9, 1)))
    live = Liveness((((-2, 65),), ((5, 64),), ((5, 64), (9, 1))))
    ref = ReferenceCache(16, 16, "ddr", 5, 0.5)
    new = PrefixCache(16, 16, "ddr", 5, 0.5, live=live)
    for r in (own, doc):
        r.state = DONE
        for c in (ref, new):
            c.release(r, 64)  # own: 4 dead blocks, then the document's 4 findable ones
    assert new.tiers.size["hbm"] == 8 and len(new.tree.entries) == 4 and new.tiers.dead["hbm"] == 4
    for free in (6, 3, 0):
        ref.fit(free)
        new.fit(free)
        assert [ref.blocks_in(t) for t in ("hbm", "ddr")] == \
            [new.blocks_in(t) for t in ("hbm", "ddr")]
    # the 5 DDR blocks kept are the newest: the four document blocks and one dead block
    assert new.tiers.dead["ddr"] == 1 and ref.peek(reader) == new.peek(reader) == 48


@pytest.mark.parametrize("lower_blocks", [0, 100])
def test_a_session_is_a_few_runs_not_an_entry_per_block(lower_blocks):
    """A 10-turn session (a 1,024-token system prompt, 256-token messages and answers) under
    LRU: each turn finds the history the last one left and adds its own; the cache's radix tree
    and each tier's order hold a few runs a turn, not a key per block (about 380 blocks), and
    evicting part of the history (to DDR, or dropped) keeps them runs."""
    lower = "ddr" if lower_blocks else None
    cache = PrefixCache(16, 16, lower, lower_blocks, 0.25)
    ref = ReferenceCache(16, 16, lower, lower_blocks, 0.25)
    history: tuple = ((0, 1024),)
    for turn in range(10):
        history += ((100 + turn, 256),)
        r = Request(turn, 0.0, sum(n for _, n in history), 256,
                    content=history + ((200 + turn, 256),))
        history = r.content
        a, b = ref.claim(r), cache.claim(r)
        assert (a.tokens, a.copy_s) == (b.tokens, b.copy_s)
        assert turn == 0 or sum(b.tokens.values()) > 1024  # its history, found
        r.state = RUNNING
        r.generated, r.state = r.output_len, DONE
        for c in (ref, cache):
            c.computed(r, r.prompt_len)
            c.release(r, r.prompt_len + r.output_len - 1)
            c.fit(400 - 20 * turn)  # HBM shrinks: the oldest blocks leave
    tiers = ("hbm", "ddr") if lower else ("hbm",)
    assert [cache.blocks_in(t) for t in tiers] == [ref.blocks_in(t) for t in tiers]
    assert sum(cache.blocks_in(t) for t in tiers) > 200
    assert len(cache.tree.heads) <= 30
    assert all(len(cache.tiers.evictable[t]) <= 30 for t in tiers)
