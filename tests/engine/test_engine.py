"""The serving engine on the local backend: accounting, lookahead windows, policies, KV
preemption, MoE stragglers, simulated hardware faults."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from chip.cost import CAUSES
from rdu_cluster.engine import replica, schedulers
from rdu_cluster.engine.schedulers import Limits, get
from workloads import traces
from workloads.errors import ConfigError


def cols(tbl):
    return tbl.to_pydict()


def test_every_request_is_served_with_consistent_times(small_run):
    _sim, t = small_run
    r = cols(t.requests)
    assert set(r["state"]) == {"done"} and r["generated_tokens"] == r["output_len"]
    for q, ttft, e2e, tpot in zip(r["queue_s"], r["ttft_s"], r["e2e_s"], r["tpot_s"], strict=True):
        assert 0 <= q < ttft <= e2e and (tpot is None or tpot > 0)
    s = cols(t.steps)
    # every generated token is a step's token: prefill completions + decode tokens
    assert sum(s["decode_tokens"]) + len(r["state"]) == sum(r["output_len"])
    assert sum(s["prefill_tokens"]) == sum(r["prompt_len"])


def test_step_causes_partition_step_time(small_run):
    _, t = small_run
    s = cols(t.steps)
    parts = np.sum([s[f"{c}_s"] for c in CAUSES], axis=0) + np.asarray(s["kv_swap_s"])
    assert np.allclose(parts, s["time_s"], rtol=1e-9)
    starts, times = np.asarray(s["start_s"]), np.asarray(s["time_s"])
    assert np.all(starts[1:] >= starts[:-1] + times[:-1] - 1e-12)  # steps never overlap


def test_lookahead_windows_equal_a_step_by_step_loop(serve, monkeypatch):
    """A window of many spans gives the same tables as one span per round trip."""
    _, many = serve(n=30, rate=50.0, seed=4)
    monkeypatch.setattr(replica, "MAX_SPANS", 1)
    sim_one, one = serve(n=30, rate=50.0, seed=4)
    assert sim_one.windows > many.summary["windows"]
    assert many.requests.equals(one.requests)
    drop = lambda tbl: tbl.drop_columns(["window"])
    assert drop(many.steps).equals(drop(one.steps))


def test_saturated_trace_needs_few_round_trips(serve):
    _sim, t = serve(n=200, rate=float("inf"), prompt=traces.LengthDist("fixed", 512),
                   output=traces.LengthDist("fixed", 64))
    assert t.summary["served"] == 200 and t.summary["windows"] <= 3


def test_chunked_prefill_mixes_prefill_and_decode(serve):
    _, t = serve(limits=Limits(max_batch=16, token_budget=512, chunked_prefill=True))
    s = cols(t.steps)
    assert "mixed" in s["phase"] and max(np.add(s["prefill_tokens"], s["decode_tokens"])) <= 512
    assert t.summary["served"] == 40


def test_static_batching_waits_for_the_whole_batch(serve):
    _, cont = serve(n=24, rate=100.0, seed=2)
    _, stat = serve(n=24, rate=100.0, seed=2, scheduler="static")
    assert stat.summary["served"] == 24
    assert stat.summary["ttft_s"][90] > cont.summary["ttft_s"][90]


def test_static_batching_refuses_chunked_prefill(tmp_path):
    """A static batch prefills in one step, so it never admitted a prompt over the budget, which
    chunked prefill no longer refuses: serve exited 0 with every request 'waiting', no reason."""
    from click.testing import CliRunner

    from rdu_cluster.cli import main

    with pytest.raises(ConfigError, match="not with --scheduler static"):
        get("static", Limits(token_budget=128, chunked_prefill=True))
    out = CliRunner().invoke(main, [
        "serve", "--model", "llama-3.1-8b", "--cluster", "sn40l-8", "--requests", "4",
        "--rate", "inf", "--prompt-len", "1024", "--output-len", "4", "--scheduler", "static",
        "--chunked-prefill", "--token-budget", "128", "--out", str(tmp_path / "run")])
    assert out.exit_code == 2 and "--chunked-prefill: not with --scheduler static" in out.output
    assert not (tmp_path / "run").exists()


def test_unknown_scheduler_is_a_config_error():
    accepted = ", ".join(schedulers.names())  # every registered policy, in order
    with pytest.raises(ConfigError, match=f"unknown 'fifo'; accepted: {accepted}$"):
        get("fifo", Limits())
    with pytest.raises(ConfigError, match="--max-batch"):
        get("continuous", Limits(max_batch=0))


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_kv_pressure_preempts_and_still_serves_everything(serve, mode):
    # DGX H100 with Llama 3.1 70B at tp=8 leaves ~1.2 GB of KV per GPU at kv_fraction 0.02.
    _, t = serve(model="llama-3.1-70b", cluster="dgx-h100", n=48, rate=1000.0,
                 prompt=traces.LengthDist("fixed", 2048), output=traces.LengthDist("fixed", 256),
                 kv_memory_fraction=0.02, limits=Limits(max_batch=64, preemption=mode))
    r = cols(t.requests)
    assert set(r["state"]) == {"done"}
    if mode == "recompute":
        assert sum(r["preemptions"]) > 0
    else:
        assert sum(r["swaps"]) > 0 and max(cols(t.steps)["kv_swap_s"]) > 0
    assert max(cols(t.steps)["kv_used_bytes"]) <= 0.02 * 80e9


def test_a_prompt_past_the_token_budget_is_prefilled_alone(serve):
    """Without chunked prefill, a prompt longer than the token budget (8,192) goes alone in a
    step of its whole length, as SGLang (budget-sized prefill-only steps back to back) and vLLM
    V0 (its budget raised to the context) serve it: it was refused ('prompt exceeds the token
    budget'), so a 9,000-token trace served nothing. Shorter prompts still share a step."""
    _, t = serve(n=5, rate=1000.0, prompt=traces.LengthDist("fixed", 9000))
    r, s = cols(t.requests), cols(t.steps)
    assert set(r["state"]) == {"done"}
    assert sorted(n for n in s["prefill_tokens"] if n) == [9000] * 5
    _, t = serve(n=5, rate=1000.0, prompt=traces.LengthDist("fixed", 4000))
    assert sorted(n for n in cols(t.steps)["prefill_tokens"] if n) == [4000, 8000, 8000]


def test_requests_that_can_never_fit_are_reported_unserved(serve):
    _, t = serve(n=5, cluster="sn40l-8", prompt=traces.LengthDist("fixed", 120_000),
                 limits=Limits(max_batch=1, token_budget=8192), kv_memory_fraction=0.01)
    r = cols(t.requests)
    assert set(r["state"]) == {"unserved"} and "KV cache" in r["reason"][0]


def test_moe_expert_load_stragglers_show_in_the_steps_table(serve):
    _, t = serve(model="mixtral-8x7b", plan="tp2ep8", n=12, rate=50.0)
    s = cols(t.steps)
    assert min(s["expert_load_max"]) > 1.0  # the busiest group is always above the mean
    assert max(s["straggler_s"]) > 0 and len(set(s["straggler_socket"])) > 1


@pytest.fixture(scope="module")
def ten(serve):
    """The fault tests' run without a fault (10 requests), made once for the three of them."""
    return serve(n=10)


def test_degraded_socket_is_the_straggler(serve, ten):
    _, base = ten
    _, slow = serve(n=10, faults=("socket:5@0:degraded:0.5",))
    s = cols(slow.steps)
    assert set(s["straggler_socket"]) == {5}
    assert slow.summary["makespan_s"] > base.summary["makespan_s"]


def test_failed_socket_is_routed_around(serve):
    _, t = serve(n=30, rate=10.0, faults=("socket:3@0.5",))
    r, s = cols(t.requests), cols(t.steps)
    assert set(r["state"]) == {"done"}
    assert s["phase"].count("recovery") == 1
    after = [sock for ph, st, sock in zip(s["phase"], s["start_s"], s["straggler_socket"],
                                          strict=True) if st > 1.0 and ph != "recovery"]
    assert after and 3 not in after and max(after) < 9  # re-planned at tp=8 on 0-2, 4-8
    assert sum(r["preemptions"]) > 0  # the sequences cached at the failure were recomputed


def test_a_fault_after_the_last_request_changes_nothing(serve, ten):
    """Every request is through long before the fault: the run is over. Applied, the failure's
    weight reload was a recovery row at 1,000 s and the duration ran to it (throughput, power
    and cost over 1,000 s for a run of a few seconds)."""
    _, base = ten
    _, late = serve(n=10, faults=("socket:3@1000",))
    assert "recovery" not in cols(late.steps)["phase"]
    assert late.summary["makespan_s"] == base.summary["makespan_s"] < 1000
    assert late.summary["bench"] == base.summary["bench"]
    assert late.summary["energy_j"] == base.summary["energy_j"]


def test_a_second_failure_re_plans_over_every_healthy_socket(serve):
    """tp16 on 16 sockets: socket 3 fails (tp8 on 0-2, 4-8), then socket 4 of that group: 14
    sockets are healthy, so tp8 again. The re-plan took the healthy sockets of the smaller
    group only (7) and fell to tp4, leaving 7 healthy sockets idle for the rest of the run."""
    _, t = serve(n=30, rate=10.0, faults=("socket:3@0.5", "socket:4@1.0"))
    s = cols(t.steps)
    assert set(cols(t.requests)["state"]) == {"done"}
    rec = [n for ph, n in zip(s["phase"], s["sockets"], strict=True) if ph == "recovery"]
    assert rec == [8, 8]
    late = {n for ph, st, n in zip(s["phase"], s["start_s"], s["sockets"], strict=True)
            if st > 1.1 and ph != "recovery"}
    assert late == {8}


def test_sockets_failing_at_one_instant_are_re_planned_once(serve):
    """Two sockets of the group fail at 0.5 s: one re-plan over the 14 left, one recovery row.
    One by one, the first re-plan reloaded weights onto the second failing socket, in two
    recovery rows of the same step overlapping in time."""
    _, t = serve(n=30, rate=10.0, faults=("socket:0@0.5", "socket:1@0.5"))
    s = cols(t.steps)
    assert set(cols(t.requests)["state"]) == {"done"}
    rec = [(st, n) for ph, st, n in zip(s["phase"], s["start_s"], s["sockets"], strict=True)
           if ph == "recovery"]
    assert len(rec) == 1 and rec[0][1] == 8
    ends = sorted((st, st + dt) for st, dt in zip(s["start_s"], s["time_s"], strict=True))
    assert all(b[0] >= a[1] - 1e-12 for a, b in itertools.pairwise(ends))


@pytest.mark.parametrize("faults", [("socket:0@0.01",),
                                    tuple(f"socket:{i}@0.01" for i in range(9))])
def test_a_re_planned_moe_replica_takes_its_own_expert_groups(serve, faults):
    """tp2ep8 on 16 sockets re-planned at tp8ep8 (or at tp4ep4, 7 sockets left): each socket's
    expert load is its own group's share (one group a socket, then two of the run's groups merged), so the
    loads of a step average 1 over the sockets and the busiest is the step's expert_load_max.
    The re-planned replica took the run's ep: its comm plan divided tp 4 by ep 8 (internal
    error: integer modulo by zero), and at tp8ep8 its sockets read groups 0-3 twice each."""
    from rdu_cluster.backends.local import LocalBackend

    seen = []

    class Watch(LocalBackend):
        def run(self, seq, ops, spans, loads, sockets):
            if loads and len(sockets) < 16:  # the re-planned replica
                seen.append(np.array([loads[s] for s in sockets]))
            return super().run(seq, ops, spans, loads, sockets)

    _, t = serve(model="mixtral-8x7b", plan="tp2ep8", n=12, rate=50.0, faults=faults,
                 backend=Watch())
    assert set(cols(t.requests)["state"]) == {"done"}
    loads = np.concatenate(seen, axis=1)  # (sockets, steps)
    assert loads.mean(axis=0) == pytest.approx(np.ones(loads.shape[1]))
    assert set(cols(t.steps)["expert_load_max"]) >= set(loads.max(axis=0).tolist())


def test_failure_with_no_plan_left_reports_unserved(serve):
    _, t = serve(model="llama-3.1-405b", n=6, rate=2.0, faults=("socket:0@1.0",))
    states = cols(t.requests)["state"]
    assert "unserved" in states and "done" in states


def test_failed_link_slows_communication(serve, ten):
    _, base = ten
    _, t = serve(n=10, faults=("link:2-3@0",))
    assert sum(cols(t.steps)["communication_s"]) > sum(cols(base.steps)["communication_s"])


@pytest.mark.parametrize("case", ["swap", "recompute", "chunked-prefix", "speculative"])
def test_every_running_sequence_holds_the_blocks_of_its_cached_tokens(serve, case, monkeypatch):
    """Replica._fit bounds a span's KV growth by ceil(n / block) blocks a sequence, which holds
    only if each running sequence holds the blocks of its cached tokens at every plan: checked
    as every span opens, under KV pressure (preemption by swap and by recompute), with chunked
    prefill and a tiered prefix cache, and with speculative decoding (several tokens a step).
    A sequence decoding under engine/lockstep.py has its growth counted in aggregate: the
    blocks in use must then be what the sequences hold, each read as KVManager.blocks."""
    from rdu_cluster.engine.prefix_cache import PrefixConfig
    from rdu_cluster.engine.replica import Replica
    from workloads.speculative import ConstantAcceptance, Speculation

    seen = []
    open_span = Replica._open

    def checked(rep, plan, ops):
        rep._fresh()  # (engine/lockstep.py: a decode's counts stand where last read)
        bt = rep.kv.config.block_tokens
        for r in rep.running:
            aggregate = rep.together is not None and r.decoding_since >= 0
            assert aggregate or rep.kv.held.get(r.id, 0) >= -(-r.cached // bt), (case, r.id)
            seen.append(r.cached)
        assert rep.kv.used == sum(rep.kv.blocks(r) for r in rep.running), case
        return open_span(rep, plan, ops)

    monkeypatch.setattr(Replica, "_open", checked)
    tight = {"model": "llama-3.1-70b", "cluster": "dgx-h100", "n": 48, "rate": 1000.0,
             "prompt": traces.LengthDist("fixed", 2048), "output": traces.LengthDist("fixed", 256),
             "kv_memory_fraction": 0.02}
    kw = {
        "swap": {**tight, "limits": Limits(max_batch=64, preemption="swap")},
        "recompute": {**tight, "limits": Limits(max_batch=64, preemption="recompute")},
        "chunked-prefix": {"n": 60, "rate": 40.0, "prefix": PrefixConfig("tiered"),
                           "limits": Limits(max_batch=8, chunked_prefill=True)},
        "speculative": {"cluster": "sn40l-8", "n": 12, "rate": 30.0, "draft": "llama-3.2-1b",
                        "speculation": Speculation(4, ConstantAcceptance(0.7))},
    }[case]
    _, t = serve(**kw)
    assert set(cols(t.requests)["state"]) == {"done"} and len(seen) > 100


def test_busy_fraction_is_at_most_one_months_into_a_run(serve):
    """Arrivals 10^7 s in: a window's length, a difference of such times, rounds below the
    sum of its steps' times; busy_fraction read 1.0000000083."""
    _, t = serve(cluster="sn40l-8", n=6, rate=4e-7, output=traces.LengthDist("fixed", 30))
    assert max(t.requests.column("arrival_s").to_pylist()) > 5e6
    # at most one; a window its steps fill reads one within the rounding of a difference of
    # times 10^7 s in (their ulp, 1.9e-9 s, over a window of a few seconds)
    busiest = max(t.sockets.column("busy_fraction").to_pylist())
    assert busiest <= 1.0 and busiest == pytest.approx(1.0, rel=1e-8)


def test_links_on_a_full_mesh_carry_their_sockets_bytes_within_their_bandwidth(serve):
    """sn40l-8 is a full mesh: a socket's collectives spread over its links to the 7 others.
    Charged to one ring link, prefill-heavy traffic showed links at up to 5x their bandwidth."""
    _, t = serve(cluster="sn40l-8", n=50, rate=float("inf"),
                 output=traces.LengthDist("fixed", 1), prompt=traces.LengthDist("fixed", 1024))
    links, socks = cols(t.links), cols(t.sockets)
    assert max(links["utilization"]) <= 1.0
    assert sum(links["bytes"]) == pytest.approx(sum(socks["sent_bytes"]))
    assert len(set(zip(links["src"], links["dst"], strict=True))) == 8 * 7


def test_a_failure_during_a_reload_cuts_the_reload_short(serve):
    """Socket 3 fails, and socket 4 of the re-planned group 2 ms later, while its weights are
    still loading: the first reload stops where the second starts. Recorded whole, the two
    recovery rows overlapped in time and their idle energy was counted twice."""
    _, t = serve(n=30, rate=10.0, faults=("socket:3@0.5", "socket:4@0.502"))
    s = cols(t.steps)
    assert set(cols(t.requests)["state"]) == {"done"}
    rec = [(st, dt) for ph, st, dt in zip(s["phase"], s["start_s"], s["time_s"], strict=True)
           if ph == "recovery"]
    assert len(rec) == 2 and rec[0][1] < rec[1][1]
    assert rec[0][0] + rec[0][1] == pytest.approx(rec[1][0], abs=1e-12)
    ends = sorted((st, st + dt) for st, dt in zip(s["start_s"], s["time_s"], strict=True))
    assert all(b[0] >= a[1] - 1e-12 for a, b in itertools.pairwise(ends))


def test_a_request_left_neither_served_nor_refused_fails_the_run(serve, monkeypatch):
    """A policy that stalls (never admits, never refuses) leaves requests waiting when the
    trace runs out: the run raises instead of writing rows that read as neither completed nor
    failed (static batching under --chunked-prefill once did exactly that, exit 0)."""
    from rdu_cluster.engine import schedulers
    from rdu_cluster.engine.schedulers import StepPlan

    class Stall:
        name = "stall-test"
        lockstep = True

        def __init__(self, limits):
            self.limits = limits

        def step(self, view):
            return StepPlan(saturated=False)

    schedulers.REGISTRY._load()
    monkeypatch.setitem(schedulers.REGISTRY.classes, "stall-test", Stall)
    with pytest.raises(RuntimeError, match=r"5 requests neither completed nor refused .*"
                                           r"request 0 was waiting"):
        serve(model="llama-3.2-1b", cluster="sn40l-8", n=5, rate=50.0, scheduler="stall-test")


def test_guaranteed_no_evict_reserves_the_output_and_never_preempts(serve):
    """TensorRT-LLM's default capacity policy: a request starts only where the KV of its prompt
    and whole output fits, reserved at admission, so none is preempted; the continuous policy
    (vLLM's) admits on the prompt and preempts the newest when the decodes run out of blocks.
    Under a KV cache too small for every request's output, the one preempts and the other
    runs fewer at once."""
    small = {"n": 40, "rate": 1000.0, "output": traces.LengthDist("fixed", 2000),
             "kv_memory_fraction": 0.002, "limits": Limits(max_batch=64)}
    _, vllm = serve(**small)
    _, trt = serve(scheduler="guaranteed-no-evict", **small)
    assert vllm.summary["preemptions"] > 0 and trt.summary["preemptions"] == 0
    assert set(cols(trt.requests)["state"]) == {"done"}
    assert max(cols(trt.steps)["batch"]) < max(cols(vllm.steps)["batch"])


def test_guaranteed_no_evict_batches_whole_prompts_beside_the_decodes(serve):
    """TensorRT-LLM's in-flight batching without chunked context: a step decodes every running
    sequence and prefills whole prompts beside them, as far as the token budget holds them
    (never a part of one); vLLM V0's and SGLang's step (the continuous policy) prefills or
    decodes."""
    args = {"n": 30, "rate": 40.0, "prompt": traces.LengthDist("fixed", 3000),
            "output": traces.LengthDist("fixed", 64)}
    _, trt = serve(scheduler="guaranteed-no-evict", **args)
    _, vllm = serve(**args)
    mixed = lambda t: [(p, d) for p, d in zip(cols(t.steps)["prefill_tokens"],
                                              cols(t.steps)["decode_tokens"]) if p and d]
    assert mixed(trt) and not mixed(vllm)
    assert {p % 3000 for p, _ in mixed(trt)} == {0}  # whole prompts
    assert all(p + d <= 8192 for p, d in mixed(trt))  # within the token budget
