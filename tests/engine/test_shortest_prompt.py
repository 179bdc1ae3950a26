"""The shortest-prompt-first scheduler (engine/schedulers/shortest_prompt.py): a plug-in in one
file. Its windows equal a step-by-step loop (tests/engine/test_policies.py runs every policy)."""

from __future__ import annotations

import numpy as np
import pytest

from rdu_cluster.engine.kv import KVConfig, KVManager
from rdu_cluster.engine.requests import RUNNING, Request
from rdu_cluster.engine.schedulers import Limits, View, get
from workloads import traces


def test_it_admits_the_shortest_waiting_prompts_first():
    kv = KVManager(KVConfig(1000, 16, 1.0))
    waiting = [Request(i, 0.1 * i, p, 8) for i, p in enumerate((900, 40, 300, 40))]
    plan = get("shortest-prompt-first", Limits(max_batch=2)).step(
        View([], waiting, [], kv, True))
    assert [r.id for r in plan.admit] == [1, 3]  # 40, 40 (arrival order), not 900 first
    # not saturated: a prompt shorter than 40 arriving would be admitted before request 3
    assert not plan.saturated
    budget = get("shortest-prompt-first", Limits(token_budget=100)).step(
        View([], waiting, [], kv, True))
    assert [r.id for r in budget.admit] == [1, 3]  # 40 + 40, then 300 is over the 20 left
    assert not budget.saturated  # a shorter arrival would still fit in the budget
    for r in plan.admit:
        kv.set(r, r.prompt_len)
        r.state, r.cached = RUNNING, r.prompt_len
    full = get("shortest-prompt-first", Limits(max_batch=2)).step(
        View(list(plan.admit), waiting[::2], [], kv, True))
    assert full.saturated and not full.admit  # the batch is full: no arrival joins it
    assert get("shortest-prompt-first", Limits(token_budget=400)).step(
        View([], waiting, [], kv, False)).saturated  # nothing more arrives


@pytest.mark.slow  # two serving runs of 48 requests, ~3 s
def test_it_lowers_the_mean_time_to_first_token_of_a_mixed_queue(serve):
    """Every request queued at once, prompts of 64 to 8,192 tokens served one at a time (the
    prefill is most of a request's time): shortest first serves the short ones before the long,
    as SJF does, which lowers the mean TTFT (here by 23%), and the longest prompt waits longer."""
    mixed = {"n": 48, "rate": float("inf"), "seed": 3,
             "prompt": traces.LengthDist("uniform", 64, 8192),
             "output": traces.LengthDist("fixed", 2), "limits": Limits(max_batch=1)}
    _, fcfs = serve(**mixed)
    _, spf = serve(**mixed, scheduler="shortest-prompt-first")
    a, b = fcfs.requests.to_pydict(), spf.requests.to_pydict()
    assert np.mean(b["ttft_s"]) < 0.85 * np.mean(a["ttft_s"])
    longest = int(np.argmax(b["prompt_len"]))
    assert b["ttft_s"][longest] > a["ttft_s"][longest]
