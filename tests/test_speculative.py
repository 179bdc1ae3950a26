"""Speculative decoding: acceptance models, the closed form, and the costed composition."""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

from partitioning.scenario import Scenario
from rdu_cluster.cli import main
from rdu_cluster.config import load_cluster
from rdu_cluster.scenarios.speculative import best_k, default_acceptance, speculative_estimate
from workloads.catalog import load_model
from workloads.errors import ConfigError
from workloads.speculative import (
    PROFILES,
    ConstantAcceptance,
    PositionalAcceptance,
    SampledAcceptance,
    Speculation,
    closed_form_tokens_per_step,
    decaying,
    parse_acceptance,
    parse_tree,
)


@pytest.mark.parametrize("rate", [0.0, 0.3, 0.6, 0.8, 0.95, 1.0])
@pytest.mark.parametrize("k", [1, 2, 4, 7, 16])
def test_constant_rate_matches_closed_form(rate, k):
    # Leviathan et al. 2023 eq. 1: (1 - a^(k+1)) / (1 - a); k + 1 at a = 1
    expected = k + 1 if rate == 1.0 else (1 - rate ** (k + 1)) / (1 - rate)
    spec = Speculation(k, ConstantAcceptance(rate))
    assert spec.tokens_per_step() == pytest.approx(expected, rel=1e-12)
    assert closed_form_tokens_per_step(rate, k) == pytest.approx(expected, rel=1e-12)
    assert spec.verify_tokens() == k + 1


def test_positional_vector_and_cumulative_conversion():
    acc = PositionalAcceptance.from_cumulative((0.805, 0.632, 0.483))
    assert acc.values[0] == pytest.approx(0.805)
    spec = Speculation(3, acc)
    assert spec.tokens_per_step() == pytest.approx(1 + 0.805 + 0.632 + 0.483)
    with pytest.raises(ConfigError, match="exceeds"):
        Speculation(4, acc).tokens_per_step()


def test_sampled_acceptance_is_seeded_and_consistent():
    a = Speculation(5, SampledAcceptance(0.7, 8.0, seed=3, samples=20000))
    b = Speculation(5, SampledAcceptance(0.7, 8.0, seed=3, samples=20000))
    assert a.tokens_per_step() == b.tokens_per_step()
    assert a.expected_sampled() == b.expected_sampled()
    # the Beta mixture's analytic expectation and a direct simulation agree to MC error
    assert a.expected_sampled() == pytest.approx(a.tokens_per_step(), rel=0.03)
    # per-step variation of the rate: E[r^i] >= E[r]^i (Jensen), so at least a constant rate's
    assert a.tokens_per_step() > Speculation(5, ConstantAcceptance(0.7)).tokens_per_step() - 1e-9


def test_sample_tokens_constant_rate_mean():
    spec = Speculation(4, ConstantAcceptance(0.8))
    draws = spec.sample_tokens(np.random.default_rng(0), 50000)
    assert draws.min() >= 1 and draws.max() <= 5
    assert draws.mean() == pytest.approx(spec.tokens_per_step(), rel=0.02)


def test_tree_speculation():
    acc = ConstantAcceptance(0.6)
    chain = Speculation(3, acc)
    flat = Speculation(3, acc, (1, 1, 1))
    assert flat.tokens_per_step() == pytest.approx(chain.tokens_per_step())
    tree = Speculation(3, acc, (4, 2, 1))
    assert tree.tokens_per_step() > chain.tokens_per_step()
    assert tree.verify_tokens() == 1 + 4 + 8 + 8
    assert tree.frontier() == (1, 4, 8)
    with pytest.raises(ConfigError):
        Speculation(2, acc, (4, 2, 1))


def test_parsers_and_bad_input():
    assert isinstance(parse_acceptance("0.8"), ConstantAcceptance)
    assert isinstance(parse_acceptance("0.9,0.8"), PositionalAcceptance)
    assert isinstance(parse_acceptance("beta:0.7:5:1"), SampledAcceptance)
    assert parse_tree("4,2,1") == (4, 2, 1)
    for bad in ("x", "1.5", "beta:", "beta:1.2"):
        with pytest.raises(ConfigError):
            parse_acceptance(bad)
    with pytest.raises(ConfigError):
        Speculation(0, ConstantAcceptance(0.5))


def test_per_position_lists_give_cumulative_products():
    acc = parse_acceptance("0.9,0.7,0.5")
    # 1 + 0.9 + 0.9 x 0.7 + 0.9 x 0.7 x 0.5
    assert Speculation(3, acc).tokens_per_step() == pytest.approx(1 + 0.9 + 0.63 + 0.315)
    assert Speculation(2, acc).tokens_per_step() == pytest.approx(1 + 0.9 + 0.63)
    with pytest.raises(ConfigError, match="exceeds the 3 positions"):
        Speculation(4, acc).tokens_per_step()
    # a constant is the same rate at every position
    one = parse_acceptance("0.8")
    assert Speculation(3, one).tokens_per_step() == pytest.approx(
        Speculation(3, parse_acceptance("0.8,0.8,0.8")).tokens_per_step())


def test_named_profiles_and_their_derivation():
    mtp = parse_acceptance("deepseek-mtp")
    assert mtp is PROFILES["deepseek-mtp"] and mtp.source and "deepseek-mtp" in mtp.describe()
    # the two published figures it is built from: 0.85 first, 3.20 tokens a step at k = 7
    assert mtp.values[0] == 0.85 and len(mtp.values) == 7
    assert Speculation(7, mtp).tokens_per_step() == pytest.approx(3.20, abs=1e-9)
    assert all(a > b for a, b in zip(mtp.values, mtp.values[1:]))  # falls with the position
    # the old constant counted 4.15 tokens a step at k = 5; the profile 3.15
    assert Speculation(5, ConstantAcceptance(0.85)).tokens_per_step() == pytest.approx(4.152, 1e-3)
    assert Speculation(5, mtp).tokens_per_step() == pytest.approx(3.151, abs=1e-3)
    assert default_acceptance("mtp", "deepseek-v3") is mtp
    eagle = PROFILES["eagle3"]
    assert np.cumprod(eagle.values) == pytest.approx([0.805, 0.632, 0.483])
    with pytest.raises(ConfigError, match="needs a rate of 0.9 first"):
        decaying(0.9, 5.0, 3)  # past the 3.44 a constant 0.9 gives at k = 3


@pytest.mark.parametrize("args, message", [
    (["--acceptance", "deepseek"], "a profile (deepseek-mtp, eagle3)"),
    (["--acceptance", "0.9,x"], "acceptance: '0.9,x' not understood"),
    (["--acceptance", "deepseek-mtp", "--spec-k", "9"], "exceeds the 7 positions"),
])
def test_bad_acceptance_is_one_line(args, message):
    r = CliRunner().invoke(main, ["simulate", "--model", "deepseek-v3", "--weights", "fp8",
                                  "--cluster", "hgx-h200", "--draft", "mtp", *args])
    lines = r.output.strip().splitlines()
    assert r.exit_code == 2 and len(lines) == 1 and message in lines[0], r.output


@pytest.fixture(scope="module")
def sn16():
    return load_cluster("sn40l-16")


def test_step_is_k_drafts_plus_verification(sn16):
    target = load_model("llama-3.1-70b")
    spec = Speculation(4, ConstantAcceptance(0.8))
    est = speculative_estimate(Scenario(target, sn16, prompt_len=2048, gen_len=128), spec,
                               "llama-3.2-1b")
    assert len(est.draft_steps) == 4
    total = sum(float(c.time_s) for c in est.draft_steps) + float(est.verify.time_s)
    assert float(est.step_time_s) == pytest.approx(total)
    # 127 tokens after the prefill's: the closed form, less the last step's truncation
    assert est.tokens_per_step == pytest.approx(spec.tokens_per_step_over(127))
    assert 0.98 * closed_form_tokens_per_step(0.8, 4) < est.tokens_per_step
    assert est.tokens_per_step < closed_form_tokens_per_step(0.8, 4)
    # verification of 5 tokens does ~5x the matmul work of one decode step
    assert float(est.verify.flops) == pytest.approx(5 * float(est.base.decode.flops), rel=0.1)
    assert float(est.speedup) > 1.0
    # nothing accepted: every step pays k drafts for one token, slower than plain decode
    none = speculative_estimate(Scenario(target, sn16, prompt_len=2048, gen_len=128),
                                Speculation(4, ConstantAcceptance(0.0)), "llama-3.2-1b")
    assert float(none.speedup) < 1.0


def test_a_step_emits_no_more_than_the_output_has_left():
    """Over a request, a step emits no more tokens than the output has left: tokens per step
    is the decoded tokens over the expected steps, which tends to the closed form as outputs
    grow, and matches a direct simulation of the steps."""
    chain = Speculation(64, ConstantAcceptance(1.0))
    assert chain.tokens_per_step_over(9) == pytest.approx(9.0)  # one step, not 65 tokens
    assert chain.tokens_per_step_over(100) == pytest.approx(50.0)  # two steps: 65 + 35
    assert chain.tokens_per_step_over(2**24) == pytest.approx(2**24 / -(-(2**24) // 65))
    spec = Speculation(4, ConstantAcceptance(0.8))
    assert spec.tokens_per_step_over(10**6) == pytest.approx(spec.tokens_per_step(), rel=1e-5)
    rng, steps, runs = np.random.default_rng(0), 0, 4000
    draws = iter(spec.sample_tokens(rng, runs * 10))
    for _ in range(runs):
        left = 10
        while left > 0:
            left -= next(draws)
            steps += 1
    assert spec.tokens_per_step_over(10) == pytest.approx(10 * runs / steps, rel=0.02)


def test_a_short_output_gains_nothing_from_many_drafts(sn16):
    """64 drafts, all accepted, for an output of 10 tokens: one step of 64 drafts and a
    65-token verification emits the 9 tokens left, slower a token than plain decode. Counted at
    65 tokens a step, simulate printed a 3.7x speed-up."""
    target = load_model("llama-3.1-8b")
    est = speculative_estimate(Scenario(target, sn16, prompt_len=1024, gen_len=10),
                               Speculation(64, ConstantAcceptance(1.0)), "llama-3.2-1b")
    assert est.tokens_per_step == pytest.approx(9.0)
    assert float(est.speedup) < 1.0


def test_a_separate_draft_counts_its_sockets_in_the_rows():
    """--tp 4 with 1 draft socket of its own on sn40l-8: one replica of 5 sockets. The row said
    4 sockets while its cost and energy per token were those of 5."""
    import json

    out = CliRunner().invoke(main, [
        "simulate", "--model", "llama-3.1-8b", "--cluster", "sn40l-8", "--draft", "llama-3.2-1b",
        "--spec-k", "4", "--placement", "separate", "--draft-sockets", "1", "--tp", "4",
        "--json"])
    assert out.exit_code == 0, out.output
    row = json.loads(out.output.splitlines()[0])
    assert row["sockets"] == 5 and row["replicas"] == 1
    assert row["joules_per_token"] == pytest.approx(
        row["power_w"] * row["sockets"] / row["tokens_per_s_total"])
    assert row["cost_per_million_tokens_usd"] == pytest.approx(
        row["socket_hour_usd"] * row["sockets"] / 3600 / row["tokens_per_s_total"] * 1e6)


def test_best_k_and_separate_placement(sn16):
    target = load_model("llama-3.1-70b")
    acc = default_acceptance("llama-3.1-8b", target.name)
    assert acc.rate == 0.88 and acc.source
    scenario = Scenario(target, sn16, prompt_len=2048, gen_len=64)
    best = best_k(scenario, acc, "llama-3.1-8b", ks=range(1, 9))
    for k in (1, 8):
        other = speculative_estimate(scenario, Speculation(k, acc), "llama-3.1-8b")
        assert float(best.tokens_per_s_per_request) >= float(other.tokens_per_s_per_request)
    sep = speculative_estimate(scenario, Speculation(3, acc), "llama-3.1-8b",
                               placement="separate", draft_sockets=2)
    assert sep.sockets_per_replica == 18 and sep.draft_tp == 2 and float(sep.transfer_s) > 0


def test_draft_errors(sn16):
    target = load_model("llama-3.1-70b")
    with pytest.raises(ConfigError, match="tokenizer"):
        speculative_estimate(Scenario(target, sn16), Speculation(2, ConstantAcceptance(0.5)),
                             "llama-2-7b")
    with pytest.raises(ConfigError, match="multi-token"):
        speculative_estimate(Scenario(target, sn16), Speculation(2, ConstantAcceptance(0.5)),
                             "mtp")


def test_cli_draft_and_bad_acceptance():
    r = CliRunner().invoke(main, ["simulate", "--model", "llama-3.1-70b", "--cluster", "sn40l-16",
                                  "--draft", "llama-3.2-1b", "--spec-k", "3", "--json"])
    assert r.exit_code == 0, r.output
    assert '"spec_k": 3' in r.output and '"joules_per_token"' in r.output
    r = CliRunner().invoke(main, ["simulate", "--draft", "llama-3.2-1b", "--acceptance", "2"])
    assert r.exit_code == 2 and r.output.count("\n") == 1
