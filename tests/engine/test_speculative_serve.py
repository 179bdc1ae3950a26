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
