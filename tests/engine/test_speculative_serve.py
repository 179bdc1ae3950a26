"""Speculative decoding in the engine: a decode step costs k draft steps plus a verification of
k + 1 tokens, and emits a seeded draw of accepted tokens + 1 per sequence."""

from __future__ import annotations

import numpy as np
import pytest

from workloads import traces
from workloads.speculative import ConstantAcceptance, Speculation, closed_form_tokens_per_step

RATE, K = 0.7, 4
LONG = traces.LengthDist("fixed", 1500)
SHORT_PROMPT = traces.LengthDist("fixed", 128)


@pytest.fixture(scope="module")
def spec_run(serve):
    spec = Speculation(K, ConstantAcceptance(RATE))
    return serve(cluster="sn40l-8", n=16, rate=float("inf"), prompt=SHORT_PROMPT, output=LONG,
                 speculation=spec, draft="llama-3.2-1b")


def test_mean_tokens_per_step_matches_the_closed_form(spec_run):
    _, t = spec_run
    steps = t.steps.to_pydict()
    decode = np.asarray(steps["decode_tokens"], dtype=float)
    emitted = np.asarray(steps["emitted_tokens"], dtype=float)
    mean = emitted.sum() / decode.sum()  # ~9,000 sequence-steps: standard error ~0.014
    expected = closed_form_tokens_per_step(RATE, K)  # 2.773
    assert mean == pytest.approx(expected, rel=0.02)  # 2%: about 4 standard errors
    assert t.summary["tokens_per_decode"] == pytest.approx(mean)
    assert set(t.requests.column("generated_tokens").to_pylist()) == {1500}


def test_tpot_reflects_the_tokens_per_step_and_the_draft_cost(serve, spec_run):
    _, spec = spec_run
    _, plain = serve(cluster="sn40l-8", n=16, rate=float("inf"), prompt=SHORT_PROMPT,
                     output=LONG)
    step = lambda t: np.mean([s for s, p in zip(t.steps.column("time_s").to_pylist(),
                                                 t.steps.column("phase").to_pylist())
                              if p == "decode"])
    assert step(spec) > step(plain)  # 4 draft steps + a 5-token verification
    tpot = lambda t: np.mean(t.requests.column("tpot_s").to_pylist())
    per_token = step(spec) / spec.summary["tokens_per_decode"]
    assert tpot(spec) == pytest.approx(per_token, rel=0.03)
    assert spec.summary["decode_steps"] < plain.summary["decode_steps"] / 2


def test_speculative_runs_are_seeded(serve, spec_run):
    spec = Speculation(K, ConstantAcceptance(RATE))
    _, again = serve(cluster="sn40l-8", n=16, rate=float("inf"), prompt=SHORT_PROMPT,
                     output=LONG, speculation=spec, draft="llama-3.2-1b")
    assert again.steps.to_pylist() == spec_run[1].steps.to_pylist()


# ---- tree speculation and a draft on sockets of its own --------------------------------------

TREE = Speculation(3, ConstantAcceptance(RATE), (3, 2, 1))  # verifies 1 + 3 + 6 + 6 = 16 tokens
PROMPT_128 = traces.LengthDist("fixed", 128)
SEPARATE = {"draft_placement": "separate", "draft_sockets": 4, "plan": "tp4"}


def _one_request(serve, spec, output=40, **kw):
    return serve(cluster="sn40l-8", n=1, rate=float("inf"), prompt=PROMPT_128,
                 output=traces.LengthDist("fixed", output), speculation=spec,
                 draft="llama-3.2-1b", **kw)


def _estimate(spec, tp=None, **kw):
    """simulate's speculative step (rdu_cluster/scenarios/speculative.py, its own composition of the
    same execution model) at the context of the engine's first decode step: the 128 prompt
    tokens cached."""
    from partitioning.scenario import Scenario, tensor_plan
    from rdu_cluster.config import load_cluster
    from rdu_cluster.scenarios.speculative import speculative_estimate
    from workloads.catalog import load_model

    cluster = load_cluster("sn40l-8")
    scenario = Scenario(load_model("llama-3.1-8b"), cluster, tensor_plan(cluster, tp), 1, 128, 1)
    return speculative_estimate(scenario, spec, "llama-3.2-1b", **kw)


def _first(t, phase):
    steps = t.steps.to_pydict()
    return steps["time_s"][steps["phase"].index(phase)]


def test_tree_step_is_frontier_drafts_plus_one_verification_of_the_whole_tree(serve):
    _, t = _one_request(serve, TREE)
    est = _estimate(TREE, placement="shared", draft_tp=8)
    assert [c.time_s for c in est.draft_steps] != [est.draft_steps[0].time_s] * 3  # widths 1,3,6
    assert _first(t, "decode") == pytest.approx(float(est.step_time_s), rel=1e-12)
    _, chain = _one_request(serve, Speculation(3, ConstantAcceptance(RATE)))
    assert _first(t, "decode") > _first(chain, "decode")  # 16 tokens verified, not 4


def test_tree_tokens_per_step_follow_its_depth_rates(serve):
    _, t = serve(cluster="sn40l-8", n=16, rate=float("inf"), prompt=SHORT_PROMPT, output=LONG,
                 speculation=TREE, draft="llama-3.2-1b")
    steps = t.steps.to_pydict()
    mean = np.sum(steps["emitted_tokens"]) / np.sum(steps["decode_tokens"])
    # 1 + sum_d prod_{j<=d} (1 - (1 - 0.7)^b_j) = 3.48 (workloads/speculative.py); ~7,000
    # sequence-steps: standard error ~0.012, so 2% is about 6 of them
    assert mean == pytest.approx(TREE.tokens_per_step(), rel=0.02)
    assert TREE.tokens_per_step() > closed_form_tokens_per_step(RATE, 3)


def test_separate_draft_step_is_draft_then_verify_plus_two_routed_hops(serve):
    spec = Speculation(K, ConstantAcceptance(RATE))
    sim, t = _one_request(serve, spec, **SEPARATE)
    lay = sim.layouts[0]
    assert lay.draft_stage and lay.stages == ((0, 1, 2, 3), (4, 5, 6, 7))
    est = _estimate(spec, placement="separate", draft_sockets=4, tp=4)
    # the estimate charges the hops' latency only; the engine's routed messages also stream
    # 20 and 8 bytes of token ids (~0.6 ns at 50 GB/s): a relative 1e-6 of the step
    assert _first(t, "decode") == pytest.approx(float(est.step_time_s), rel=1e-6)
    assert _first(t, "decode") > float(est.draft_s + est.verify.time_s)


def test_separate_draft_prefills_side_by_side_with_the_target(serve):
    from partitioning.estimate import estimate
    from partitioning.plan import Plan
    from partitioning.scenario import Scenario
    from rdu_cluster.config import load_cluster
    from workloads.catalog import load_model

    _, t = _one_request(serve, Speculation(K, ConstantAcceptance(RATE)), **SEPARATE)
    cluster = load_cluster("sn40l-8")
    prefill = lambda m: float(estimate(Scenario(load_model(m), cluster, Plan(tp=4, dp=2), 1, 128,
                                                1)).prefill.time_s)
    target, draft = prefill("llama-3.1-8b"), prefill("llama-3.2-1b")
    assert _first(t, "prefill") == pytest.approx(max(target, draft), rel=1e-12)
    assert _first(t, "prefill") < target + draft


@pytest.mark.parametrize("placement", [{}, SEPARATE])
def test_simulate_ttft_is_the_engines_prefill_with_the_draft(serve, placement):
    # simulate --draft's TTFT (SpecEstimate.ttft_s) is the engine's prefill step: a shared
    # draft's prefill after the target's, a separate one's beside it
    spec = Speculation(K, ConstantAcceptance(RATE))
    _, t = _one_request(serve, spec, **placement)
    est = _estimate(spec, **({"placement": "separate", "draft_sockets": 4, "tp": 4}
                             if placement else {}))
    assert _first(t, "prefill") == pytest.approx(float(est.ttft_s), rel=1e-12)
    # shared: the target's prefill and the draft's; separate: the slower (here the target)
    assert (float(est.ttft_s) > float(est.base.ttft_s)) != bool(placement)


def test_separate_draft_sockets_hold_the_draft_and_its_own_kv_cache(serve):
    from rdu_cluster.engine.plan import resident_weight_bytes
    from workloads import graph as graphs
    from workloads.catalog import load_model

    # arrivals 20 ms apart cut windows while earlier requests still hold their KV cache
    sim, t = serve(cluster="sn40l-8", n=4, rate=50.0, prompt=PROMPT_128, output=LONG,
                   speculation=Speculation(K, ConstantAcceptance(RATE)), draft="llama-3.2-1b",
                   **SEPARATE)
    programs = sim.layouts[0].programs
    assert programs[0].model.name == "llama-3.2-1b" and programs[4].model.name == "llama-3.1-8b"
    row = {r["socket"]: r for r in t.sockets.to_pylist() if r["window"] == 1}
    lay = sim.layouts[0]  # the target's sockets also hold one prompt's activations
    # and every socket what its runtime reserves (chip/runtime_memory.py)
    w = {s: resident_weight_bytes(programs[s]) for s in (0, 4)}
    act = {s: sim.build.activations(lay, s) for s in (0, 4)}
    kv = {s: row[s]["hbm_used_bytes"] - w[s] - act[s]
          - sim.build.reserved(programs[s], w[s], act[s]) for s in (0, 4)}
    assert sim.build.activations(lay, 0) == 0 < sim.build.activations(lay, 4)
    draft, target = load_model("llama-3.2-1b"), load_model("llama-3.1-8b")
    ratio = graphs.kv_bytes_per_token(draft) / graphs.kv_bytes_per_token(target)
    assert kv[4] > 0 and kv[0] == pytest.approx(ratio * kv[4], rel=1e-9)
    assert resident_weight_bytes(programs[0]) == pytest.approx(graphs.weight_bytes(draft) / 4,
                                                               rel=0.02)


def test_separate_placement_bad_input_names_the_field(serve):
    from workloads.errors import ConfigError

    spec = Speculation(K, ConstantAcceptance(RATE))
    with pytest.raises(ConfigError, match="--draft-sockets: 3 must divide the 8 sockets"):
        _one_request(serve, spec, draft_placement="separate", draft_sockets=3, plan="tp4")
    with pytest.raises(ConfigError, match="--draft-sockets: 8 .* leave room"):
        _one_request(serve, spec, draft_placement="separate", draft_sockets=8, plan="tp4")
    with pytest.raises(ConfigError, match="--draft-placement: 'far' unknown"):
        _one_request(serve, spec, draft_placement="far")


# ---- speculation under KV pressure ----------------------------------------------------------

@pytest.mark.parametrize("preemption", ["recompute", "swap"])
def test_a_speculative_step_never_writes_past_the_kv_cache(serve, preemption):
    """A decode step writes up to k + 1 tokens a sequence: the scheduler preempts until that
    lookahead fits (vLLM's lookahead slots), not one token's block. It checked one block, so
    the KV cache ran past its capacity, and the prefix cache, fitting into a negative count of
    free blocks, failed with an internal error (serve --draft ... --kv-fraction 0.001)."""
    from rdu_cluster.engine.schedulers import Limits

    least = []
    watch = lambda sim, _: least.append(min(rep.kv.free for rep in sim.replicas))
    spec = Speculation(8, ConstantAcceptance(0.9))
    _, t = serve(cluster="sn40l-8", n=30, rate=float("inf"), prompt=traces.LengthDist(
        "fixed", 512), output=traces.LengthDist("fixed", 64), speculation=spec,
        draft="llama-3.2-1b", kv_memory_fraction=0.001, limits=Limits(preemption=preemption),
        hooks=[watch])
    assert min(least) >= 0
    pushed = t.requests.column("preemptions").to_pylist() + t.requests.column("swaps").to_pylist()
    assert sum(pushed) > 0
    assert set(t.requests.column("generated_tokens").to_pylist()) == {64}
