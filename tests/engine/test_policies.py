"""The invariance tests, over every registered policy (a plug-in gets them without editing
this file): a scheduler's multi-span windows, and its windows timed as they are planned, give
the tables of a step-by-step loop (the StepPlan.saturated contract, engine/schedulers/); a
replica routing policy's coupled windows give the requests of a step-by-step loop. The prefix
cache against its per-block reference runs every eviction policy
(tests/engine/test_prefix_cache_runs.py)."""

from __future__ import annotations

import pytest

from rdu_cluster.engine import replica, replica_routing, schedulers
from rdu_cluster.engine.schedulers import Limits
from rdu_cluster.engine.simulation import Simulation
from rdu_cluster.scenarios.coe import CoEScenario
from workloads import traces
from workloads.errors import ConfigError

KEEP = ["request_id", "replica", "state", "arrival_s", "ttft_s", "e2e_s", "finish_s",
        "generated_tokens", "preemptions"]
# prompts of 16 to 2,048 tokens arriving while others decode: admissions stop at the batch and
# the token budget (KV pressure is left to the direct contract test below)
RUN = {"n": 40, "rate": 60.0, "seed": 3, "prompt": traces.LengthDist("uniform", 16, 2048),
       "output": traces.LengthDist("uniform", 4, 64),
       "limits": Limits(max_batch=6, token_budget=3072)}


def _config(name: str) -> dict:
    """A run of scheduler `name` (the coe policy serves a Composition of Experts)."""
    if name == "coe":
        return {**RUN, "scheduler": name, "model": "llama-2-7b", "cluster": "sn40l-8",
                "coe": CoEScenario.copies(4)}
    return {**RUN, "scheduler": name, "plan": "tp8"}


def _one_step_at_a_time(monkeypatch) -> None:
    """Every window one span, every span one step: the oracle."""
    monkeypatch.setattr(replica, "MAX_SPANS", 1)
    monkeypatch.setattr(replica, "_fit", lambda kv, decodes, limit, growth: 1)


def _steps(tables):
    return tables.steps.drop_columns(["window"]).sort_by([("replica", "ascending"),
                                                          ("step", "ascending")])


@pytest.mark.slow  # 3-4 s a policy: two serving runs, one a step per window
@pytest.mark.parametrize("name", schedulers.names())
def test_every_scheduler_s_windows_equal_a_step_by_step_loop(serve, monkeypatch, name):
    _, fast = serve(**_config(name))
    _one_step_at_a_time(monkeypatch)
    sim, slow = serve(**_config(name))
    assert sim.windows > fast.summary["windows"]
    assert fast.requests.select(KEEP).equals(slow.requests.select(KEEP))
    assert _steps(fast).select(["phase", "batch", "time_s"]).equals(
        _steps(slow).select(["phase", "batch", "time_s"]))


@pytest.mark.parametrize("name", [n for n in schedulers.names() if n != "coe"])
def test_every_scheduler_s_timed_windows_equal_untimed_ones(serve, monkeypatch, name):
    """Light load, where windows are timed as they are planned (engine/lookahead.py; a CoE run
    never is): the same tables as windows cut at each arrival."""
    light = {**_config(name), "rate": 2.0, "n": 30}
    sim, ahead = serve(**light)
    assert sim.lookahead
    monkeypatch.setattr(Simulation, "_can_look_ahead", lambda self: False)
    _, one = serve(**light)
    assert ahead.requests.equals(one.requests)
    assert _steps(ahead).equals(_steps(one))


@pytest.mark.slow  # 1-3 s a case: two serving runs, one a step per window
@pytest.mark.parametrize("concurrency", [None, 6])
@pytest.mark.parametrize("routing", replica_routing.names())
def test_every_routing_policy_s_windows_equal_a_step_by_step_loop(serve, monkeypatch, routing,
                                                                   concurrency):
    # outputs of 4-64 tokens (engine/conftest's 4-96 cost a third more steps): with them the
    # cases still catch each planted bug that 4-96 caught (a view's KV read after the window
    # rather than at t, a request counted out at its state rather than its completion time, a
    # window not cut at another replica's window end), each in as many or more cases
    run = {"n": 40, "rate": 60.0, "seed": 3, "plan": "tp4", "routing": routing,
           "concurrency": concurrency, "output": traces.LengthDist("uniform", 4, 64)}
    _, fast = serve(**run)
    _one_step_at_a_time(monkeypatch)
    sim, slow = serve(**run)
    assert sim.windows > fast.summary["windows"]
    keep = ["request_id", "replica", "state", "arrival_s", "ttft_s", "e2e_s", "finish_s"]
    assert fast.requests.select(keep).equals(slow.requests.select(keep))


def _view(rng, limits: Limits, experts: int):
    """A random scheduler view: running sequences (some still prefilling), a queue, and a KV
    cache of 60-400 blocks."""
    from rdu_cluster.engine.kv import KVConfig, KVManager
    from rdu_cluster.engine.requests import RUNNING, Request
    from rdu_cluster.engine.schedulers import View

    kv = KVManager(KVConfig(rng.randint(60, 400), 16, 1.0))
    expert = rng.randrange(experts) if experts else -1
    running = []
    for i in range(rng.randint(0, limits.max_batch)):
        prompt, done = rng.randint(8, 600), rng.random() < 0.7
        r = Request(i, 0.01 * i, prompt, rng.randint(2, 80), state=RUNNING, expert=expert,
                    target=prompt, cached=prompt if done else rng.randint(0, prompt - 1))
        r.generated = rng.randint(0, r.output_len - 1) if done else 0
        if not kv.fits(r.cached + r.generated, 0):
            break
        kv.set(r, r.cached + r.generated)
        running.append(r)
    waiting = [Request(100 + i, 1.0 + 0.01 * i, rng.randint(8, 1500), rng.randint(2, 80),
                       expert=rng.randrange(experts) if experts else -1)
               for i in range(rng.randint(0, 12))]
    return View(running, waiting, [], kv, True)


def _same(a, b) -> bool:
    ids = lambda rs: [r.id for r in rs]
    return (ids(a.decode) == ids(b.decode) and ids(a.admit) == ids(b.admit)
            and [(r.id, n) for r, n in a.prefill] == [(r.id, n) for r, n in b.prefill]
            and ids(a.preempt) == ids(b.preempt) and ids(a.swap_in) == ids(b.swap_in))


@pytest.mark.parametrize("chunked", [False, True])
@pytest.mark.parametrize("name", schedulers.names())
def test_every_scheduler_keeps_the_saturated_contract(name, chunked):
    """StepPlan.saturated, checked directly: a plan that says saturated is the plan the policy
    makes with one more request waiting (any prompt length, the last to arrive)."""
    import random
    from dataclasses import replace

    from rdu_cluster.engine.requests import Request

    rng = random.Random(7)
    checked = 0
    for trial in range(400):
        limits = Limits(max_batch=rng.randint(1, 8), token_budget=rng.choice([256, 1024, 4096]),
                        chunked_prefill=chunked)
        try:
            policy = schedulers.get(name, limits)
        except ConfigError:  # a policy refusing these limits (static: no chunked prefill)
            pytest.skip(f"{name} refuses chunked_prefill={chunked}")
        experts = 3 if name == "coe" else 0
        view = _view(rng, limits, experts)
        plan = policy.step(view)
        if not plan.saturated:
            continue
        new = Request(999, 9.0, rng.choice([1, 8, 64, 700]), rng.randint(2, 80),
                      expert=rng.randrange(experts) if experts else -1)
        more = policy.step(replace(view, waiting=[*view.waiting, new]))
        assert _same(plan, more), (trial, plan, more)
        checked += 1
    assert checked > 50
