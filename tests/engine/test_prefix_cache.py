"""Prefix caching across tiers (engine/prefix_cache/) and closed-loop sessions through the
engine (engine/dispatch.py)."""

from __future__ import annotations

import numpy as np
import pytest

from rdu_cluster.backends.local import LocalBackend
from rdu_cluster.config import load_cluster
from rdu_cluster.engine import evictions, replica
from rdu_cluster.engine.prefix_cache import (
    PrefixCache,
    PrefixConfig,
    block_hashes,
    exposed,
    hashing,
)
from rdu_cluster.engine.requests import DONE, Request
from rdu_cluster.engine.schedulers import Limits
from rdu_cluster.engine.simulation import ServeConfig, Simulation
from workloads import traces
from workloads.catalog import load_model
from workloads.errors import ConfigError
from workloads.sessions import SessionSpec, ThinkTime, sessions

SPEC = SessionSpec(12, 4, 256, traces.LengthDist("uniform", 32, 160),
                   traces.LengthDist("uniform", 8, 48), ThinkTime.parse("exponential:0.5"),
                   rate=20.0)


def cols(tbl):
    return tbl.to_pydict()


def test_blocks_match_only_behind_the_same_prefix():
    a = block_hashes(((1, 40), (2, 8)), 48, 16)
    b = block_hashes(((1, 40), (3, 8)), 48, 16)
    c = block_hashes(((9, 16), (1, 32)), 48, 16)
    assert len(a) == 3 and a[:2] == b[:2] and a[2] != b[2]  # diverge in the third block
    assert not set(c) & set(a)  # the same chunk after another prefix is another block
    assert block_hashes(((1, 40),), 40, 16) == a[:2]  # a partial block is not cached
    assert not set(block_hashes(((1, 40), (2, 8)), 48, 16, root=3)) & set(a)  # another model


def test_block_hashes_are_the_chain_of_their_pieces():
    """The definition, pinned: block k hashes block k-1's hash and its (id, start, end) pieces."""
    h0 = hash((2, 7, 0, 16))
    h1 = hash((h0, 7, 16, 20, 8, 0, 12))
    assert block_hashes(((7, 20), (8, 30)), 50, 16, root=2) == [h0, h1, hash((h1, 8, 12, 28))]


@pytest.mark.parametrize("block", [16, 48])
def test_a_turn_hashes_its_new_chunks_behind_the_memo_of_the_last(block, monkeypatch):
    """The process's memo (hashing.CHAINS) gives the same hashes as hashing each request alone,
    across sessions, models (roots), truncation and two traces whose chunk ids mean other
    lengths; past CHAINS_MOST chunks it starts again."""
    monkeypatch.setattr(hashing, "CHAINS", {})
    for seed in (3, 4):
        trace = sessions(SPEC, seed=seed)
        for row, content in enumerate(trace.content):
            tokens = int(trace.prompt_len[row] + trace.output_len[row]) - row % 3 * 7
            root = 2 + row % 2
            assert block_hashes(content, tokens, block, root, memo=hashing.CHAINS) == \
                block_hashes(content, tokens, block, root)
    held = len(hashing.CHAINS)
    assert held > 1
    monkeypatch.setattr(hashing, "CHAINS_MOST", held)
    content = ((10**9, 100),)  # a chunk not held
    assert block_hashes(content, 100, block, 2, memo=hashing.CHAINS) == \
        block_hashes(content, 100, block, 2)
    assert list(hashing.CHAINS) == [10**9]


def test_lru_evicts_in_the_order_blocks_were_added_last():
    lru = evictions.get("lru")
    lru.add([1, 2, 3, 4])
    lru.use([2])  # in use: not evictable
    lru.add([5, 1])  # 1 again: it goes last
    assert lru.victims(3) == [3, 4, 5] and lru.victims(9) == [3, 4, 5, 1] and len(lru) == 4
    for k in range(6, 3000):  # keys removed by the thousand: the dict is rebuilt, same order
        lru.add([k])
        lru.drop(lru.victims(1))
    assert lru.victims(9) == [2996, 2997, 2998, 2999] and len(lru) == 4


def req(i, content, prompt, out=4):
    return Request(i, 0.0, prompt, out, content=content)


def test_lru_demotes_to_the_lower_tier_and_a_hit_there_is_copied():
    cache = PrefixCache(16, 16, "ddr", lower_blocks=2, copy_s_per_block=0.5)
    first = req(0, ((7, 64), (-2, 4)), 64)
    first.state = DONE
    cache.release(first, 64)  # 4 blocks cached, evictable, in HBM
    assert cache.blocks_in("hbm") == 4
    cache.fit(2)  # room for 2 blocks: the deepest two go down
    assert cache.blocks_in("hbm") == 2 and cache.blocks_in("ddr") == 2
    cache.fit(0)  # no room: the DDR tier holds 2, the oldest of its blocks are dropped
    assert cache.blocks_in("hbm") == 0 and cache.blocks_in("ddr") == 2
    second = req(1, ((7, 64), (-3, 4)), 65)
    assert cache.peek(second) == 32  # the head of the prefix survived, in DDR
    assert cache.lookup(second) == {"ddr": 32}
    claim = cache.claim(second)
    assert claim.tokens == {"hbm": 0, "ddr": 32} and claim.copy_s == 1.0
    assert cache.blocks_in("hbm") == 2  # in use by `second`, counted in its KV


def test_hbm_only_drops_what_does_not_fit():
    cache = PrefixCache(16, 16, None, 0, 0.0)
    r = req(0, ((7, 64), (-2, 4)), 64)
    r.state = DONE
    cache.release(r, 64)
    cache.fit(1)
    assert cache.blocks_in("hbm") == 1
    assert cache.peek(req(1, ((7, 64), (-3, 4)), 65)) == 16


def test_a_hit_leaves_the_last_prompt_token_to_compute():
    cache = PrefixCache(16, 16, None, 0, 0.0)
    r = req(0, ((7, 64), (-2, 4)), 64)
    r.state = DONE
    cache.release(r, 64)
    assert cache.peek(req(1, ((7, 64), (-3, 4)), 64)) == 48  # not all 64


def test_exposed_copy_is_hidden_behind_compute_but_for_one_layer():
    got = exposed(np.array([0.0, 1.0, 4.0]), np.array([2.0, 2.0, 2.0]), layers=4)
    assert got.tolist() == [0.0, 0.25, 2.5]


def test_modes_are_checked():
    with pytest.raises(ConfigError, match="--prefix-cache: unknown 'x'"):
        PrefixConfig("x").check()
    with pytest.raises(ConfigError, match="no tier below HBM"):
        PrefixConfig("tiered").resolved(None, True)
    assert PrefixConfig().resolved("ddr", True) == "tiered"
    assert PrefixConfig().resolved(None, True) == "hbm"
    assert PrefixConfig().resolved("host", False) == "hbm"  # a GPU's runtime spills nowhere
    accepted = ", ".join(evictions.names())
    with pytest.raises(ConfigError, match=f"--prefix-eviction: unknown 'no-such-policy'; accepted: {accepted}$"):
        PrefixConfig(eviction="no-such-policy").check()


def run(mode=None, trace=None, backend=None, model="llama-3.1-8b", cluster="sn40l-16",
        **config):
    trace = trace or sessions(SPEC, seed=5)
    sim = Simulation(load_model(model), load_cluster(cluster), trace,
                     ServeConfig(prefix=PrefixConfig(mode), **config), backend or LocalBackend())
    return sim, sim.run()


@pytest.fixture(scope="module")
def tiered():
    return run()


def test_a_hit_skips_the_prefill_of_cached_tokens(tiered):
    _, on = tiered
    _, off = run("off")
    r, s = cols(on.requests), cols(on.steps)
    served = sum(r["prefix_hbm_tokens"]) + sum(r["prefix_ddr_tokens"])
    assert served > 0 and sum(r["prefix_host_tokens"]) == 0
    assert sum(s["prefill_tokens"]) + served == sum(r["prompt_len"])  # nothing twice
    assert sum(s["prefix_hit_tokens"]) == served
    assert sum(cols(off.steps)["prefill_tokens"]) == sum(r["prompt_len"])
    assert on.summary["prefix_cache"] == "tiered" and off.summary["prefix_cache"] == "off"
    assert on.summary["prefix_cache_hit_rate"] == pytest.approx(served / sum(r["prompt_len"]))
    assert off.summary["prefix_cache_hit_rate"] == 0.0
    mean = lambda t: np.mean(cols(t.requests)["ttft_s"])
    assert mean(on) < mean(off)


def test_each_turn_arrives_think_time_after_the_last_one_finished(tiered):
    sim, t = tiered
    r = cols(t.requests)
    trace = sim.trace
    assert set(r["state"]) == {"done"}
    for i in range(len(trace)):
        j = trace.follows(i)
        if j >= 0:
            assert r["arrival_s"][i] == pytest.approx(r["finish_s"][j] + trace.think_s[i])
            assert r["replica"][i] == r["replica"][j] and r["session"][i] == r["session"][j]


def test_session_windows_equal_a_step_by_step_loop(monkeypatch):
    """Sessions keep the lookahead exact (engine/dispatch.py): a window timed as it is planned
    through a turn's arrivals and completions (Dispatcher.known_until) runs as windows of one
    span each. A window's energy is split over its spans' requests, and a span cut at a
    window's end is two, so the joules (and their cost) differ in the last bits."""
    _, many = run(plan="tp4")
    monkeypatch.setattr(replica, "MAX_SPANS", 1)
    sim_one, one = run(plan="tp4")
    assert sim_one.windows > many.summary["windows"]
    split = ["energy_j", "cost_usd"]
    assert many.requests.drop_columns(split).equals(one.requests.drop_columns(split))
    for k in split:
        assert cols(many.requests)[k] == pytest.approx(cols(one.requests)[k], rel=1e-12)
    # rows are appended window by window: in step order per replica
    drop = lambda tbl: tbl.drop_columns(["window"]).sort_by([("replica", "ascending"),
                                                             ("step", "ascending")])
    assert drop(many.steps).equals(drop(one.steps))


def test_a_small_hbm_spills_to_ddr_and_the_steps_show_the_copy():
    # 0.2% of the free HBM for KV (~2,900 tokens a socket): the history cannot stay in HBM
    _, t = run("tiered", model="llama-3.1-70b", kv_memory_fraction=0.002,
               limits=Limits(max_batch=8))
    _, hbm = run("hbm", model="llama-3.1-70b", kv_memory_fraction=0.002,
                 limits=Limits(max_batch=8))
    r, s = cols(t.requests), cols(t.steps)
    assert sum(r["prefix_ddr_tokens"]) > 0 and t.summary["prefix_cache_hit_rate_by_tier"]["ddr"] > 0
    copy = np.asarray(s["prefix_copy_s"])
    assert copy.sum() == pytest.approx(sum(r["prefix_copy_s"])) and copy.sum() > 0
    assert np.all(np.asarray(s["prefix_exposed_s"]) <= copy + 1e-15)
    assert t.summary["prefix_cache_hit_rate"] > hbm.summary["prefix_cache_hit_rate"]
    assert sum(cols(hbm.requests)["prefix_ddr_tokens"]) == 0


def test_a_gpu_spills_to_host_memory_where_asked():
    """Under --prefix-cache tiered a GPU spills to host memory; by default it keeps its prefix
    cache in HBM, as SGLang (HiCache off), vLLM (no KV connector) and TensorRT-LLM
    (host_cache_size 0) do, where an RDU spills to its DDR (serving_stacks.spills_prefix_cache;
    the GPU default was tiered, as the RDU's)."""
    small = {"model": "llama-3.1-70b", "kv_memory_fraction": 0.002,
             "limits": Limits(max_batch=8)}
    _, t = run("tiered", cluster="dgx-h100", **small)
    assert t.summary["prefix_cache"] == "tiered"
    assert sum(cols(t.requests)["prefix_host_tokens"]) > 0
    _, t = run(None, cluster="dgx-h100", **small)
    assert t.summary["prefix_cache"] == "hbm"
    assert sum(cols(t.requests)["prefix_host_tokens"]) == 0
    _, t = run(None, cluster="sn40l-16", **small)
    assert t.summary["prefix_cache"] == "tiered" and sum(cols(t.requests)["prefix_ddr_tokens"])


def test_mooncake_hashes_share_the_system_block():
    trace = traces.read_trace(
        __import__("pathlib").Path(__file__).resolve().parents[1] / "data" / "traces"
        / "mooncake_conversation_200.jsonl")
    short = traces.Trace(trace.arrival_s[:30], trace.prompt_len[:30], trace.output_len[:30],
                         content=trace.content[:30], source="excerpt[:30]")
    _, t = run("hbm", trace=short, limits=Limits(chunked_prefill=True))
    r = cols(t.requests)
    # every request but those admitted before the first finished its prefill finds block 0
    assert sum(1 for n in r["prefix_hbm_tokens"] if n >= 512) >= 20


def test_an_unserved_turn_takes_its_session_with_it(monkeypatch):
    from rdu_cluster.engine import build

    spec = SessionSpec(2, 3, 100, traces.LengthDist("fixed", 4000),
                       traces.LengthDist("fixed", 10), ThinkTime())
    monkeypatch.setattr(build.Build, "_kv_blocks", lambda self, prog, bt, act: 10240 // 16)
    _, t = run(trace=sessions(spec), limits=Limits(token_budget=8192))
    r = cols(t.requests)
    # turn 3's prompt and answer, 100 + 3 x 4000 + 3 x 10 tokens, are past a KV cache of
    # 10,240: refused, not waited for
    assert r["state"] == ["done", "done", "unserved"] * 2


@pytest.mark.slow
def test_ray_gives_the_local_tables_with_sessions_and_a_tiered_cache(ray_session, tiered):
    from rdu_cluster.backends.ray_backend import RayBackend

    _, local = tiered
    _, remote = run(backend=RayBackend())
    for name in ("requests", "steps", "sockets", "links"):
        assert getattr(local, name).to_pylist() == getattr(remote, name).to_pylist(), name


@pytest.fixture(scope="module")
def prefix_aware():
    """tp4 on sn40l-16 (4 replicas) routed prefix-aware: both tests below read the one run."""
    return run(plan="tp4", routing="prefix-aware")


@pytest.mark.slow  # seconds: end to end
def test_prefix_aware_routing_keeps_sessions_warm_and_spreads_load(prefix_aware):
    """tp4 on sn40l-16: 4 replicas. Least-outstanding scatters a session's turns; the
    prefix-aware policy sends a turn back to the replica holding its history more often, and
    spreads the sessions."""
    _, lo = run(plan="tp4", routing="least-outstanding")
    _, pa = prefix_aware
    counts = np.bincount(cols(pa.requests)["replica"], minlength=4)
    assert counts.max() <= 2 * counts.mean()  # least-outstanding's: 26/12/7/3
    assert pa.summary["prefix_cache_hit_rate"] > lo.summary["prefix_cache_hit_rate"]
    assert _stays(pa) > _stays(lo)


def _stays(t) -> int:
    """Turns served by the replica that served the turn before."""
    r = cols(t.requests)
    return sum(r["replica"][i] == r["replica"][i - 1] for i in range(1, len(r["replica"]))
               if r["session"][i] == r["session"][i - 1])


@pytest.mark.slow  # seconds: end to end
def test_prefix_aware_routing_equals_a_one_step_loop(prefix_aware, monkeypatch):
    _, fast = prefix_aware
    monkeypatch.setattr(replica, "MAX_SPANS", 1)
    monkeypatch.setattr(replica, "_fit", lambda kv, decodes, limit, growth: 1)
    sim, slow = run(plan="tp4", routing="prefix-aware")
    assert sim.windows > fast.summary["windows"]
    keep = ["request_id", "replica", "state", "arrival_s", "ttft_s", "e2e_s", "finish_s",
            "prefix_hbm_tokens", "prefix_ddr_tokens"]
    assert fast.requests.select(keep).equals(slow.requests.select(keep))


def test_the_prefix_aware_policy_is_registered():
    from rdu_cluster.engine import replica_routing

    assert "prefix-aware" in replica_routing.names()
