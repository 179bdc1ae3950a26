"""`rdu-cluster capacity`: the analytic pre-filter, engine verification, the ranked table with
serve_args that reproduce each row, --json / --plot, and exit 1 when nothing meets the SLO."""

from __future__ import annotations

import json
import math
import re
from dataclasses import replace

import numpy as np
import pytest
from click.testing import CliRunner

from rdu_cluster.cli import main, workload
from rdu_cluster.config import load_fabric
from rdu_cluster.scenarios import capacity as cap
from rdu_cluster.scenarios.boundary import boundary
from rdu_cluster.scenarios.capacity import intervals, steady, verification
from workloads import sessions
from workloads.catalog import load_model, model_config
from workloads.errors import ConfigError
from workloads.spec import with_dtypes

BASE = ["capacity", "--model", "llama-3.1-8b", "--cluster", "sn40l-8", "--cluster", "dgx-h100",
        "--concurrency", "16", "--prompt-len", "512", "--output-len", "32", "--max-nodes", "2",
        "--shortlist", "1", "--steady-tolerance", "off"]


def run(*args):
    return CliRunner().invoke(main, list(args))


def test_max_batch_keeps_tpot_within_the_bound():
    rc = cap.replica_cost(load_model("llama-3.1-8b"), cap.Pool("dgx-h100", "tp2", 1), (512, 32),
                          load_fabric("ib-ndr"))
    assert np.all(np.diff(rc.tpot_s) >= 0)  # a bigger batch never steps faster
    b = rc.max_batch(0.006)
    assert rc.tpot_at(b) <= 0.006 and 0 < b <= rc.kv_batch
    assert rc.max_batch(1e-6) == 0  # faster than a batch of one: nothing
    # the smallest deployment that passes: one replica fewer fails the analytic test
    dep = cap.aggregated(rc, cap.Traffic(64, None), cap.SLO(500, 6), 2, 512, 32)
    assert dep is not None and dep.pools[0].replicas >= 1
    assert dep.max_batch == b and dep.sockets == 2 * dep.pools[0].replicas


def test_default_plans_run_from_one_socket_to_two_nodes():
    """Every power of two of sockets up to a node (one GPU a replica: vLLM's and SGLang's
    default), two nodes and tp x pp over them; an MoE model's attention DP where its experts
    divide; a plan that does not fit is the analytic pass's to drop."""
    dense, moe = load_model("llama-3.1-8b"), load_model("deepseek-v3")
    assert cap.replica_plans(dense, "dgx-h100", 2) == [
        "tp1", "tp2", "tp4", "tp8", "tp16", "tp8pp2"]
    assert cap.replica_plans(dense, "sn40l-16", 1) == ["tp1", "tp2", "tp4", "tp8", "tp16"]
    assert cap.replica_plans(moe, "hgx-h200", 2)[-2:] == ["adp8ep8", "adp16ep16"]


def test_a_node_of_other_than_a_power_of_two_keeps_its_whole_node_plan(tmp_path):
    six = tmp_path / "six.toml"
    six.write_text('extends = "dgx-h100"\nname = "six"\nsockets = 6\nsockets_per_node = 6\n')
    assert cap.replica_plans(load_model("llama-3.1-8b"), str(six), 2) == [
        "tp1", "tp2", "tp4", "tp6", "tp12", "tp6pp2"]


def test_a_model_that_fits_one_gpu_is_served_one_gpu_a_replica():
    """Llama 3.1 8B (16 GB of BF16 weights) for 32 users on an H100 node: one GPU, as vLLM and
    SGLang serve it by default (the narrowest default plan had been tp2: two GPUs)."""
    r = run("capacity", "--model", "llama-3.1-8b", "--cluster", "dgx-h100", "--concurrency",
            "32", "--prompt-len", "512", "--output-len", "64", "--slo", "ttft:500", "--slo",
            "tpot:20", "--max-nodes", "2", "--shortlist", "1", "--steady-tolerance", "off",
            "--json", "--no-progress")
    assert r.exit_code == 0, r.output
    row = json.loads(r.stdout.splitlines()[0])
    assert row["plan"] == "dgx-h100:tp1:1" and row["sockets"] == 1 and row["meets_slo"]


def test_a_pairs_prefill_plan_is_the_one_the_analytic_pass_prices_lowest():
    """An 8,192-token prompt takes one H100 194 ms to prefill (two 111 ms): under a 190 ms TTFT
    bound the pair prefills on tp2, where the smallest replica alone would leave it no
    candidate."""
    r = run("capacity", "--model", "llama-3.1-8b", "--pair", "dgx-h100:sn40l-8", "--cluster",
            "sn40l-8", "--concurrency", "16", "--prompt-len", "8192", "--output-len", "32",
            "--slo", "ttft:190", "--slo", "tpot:20", "--max-nodes", "4", "--shortlist", "1",
            "--steady-tolerance", "off", "--json", "--no-progress")
    assert r.exit_code == 0, r.output
    pairs = [row for row in map(json.loads, r.stdout.splitlines()) if row["disaggregated"]]
    assert len(pairs) == 1 and pairs[0]["plan"].startswith("dgx-h100:tp2:")
    assert pairs[0]["meets_slo"]


def test_of_prefill_plans_priced_alike_a_pair_takes_the_lower_analytic_ttft(monkeypatch):
    """The pair's prefill plan: the lowest price, then the fewest sockets, then the lower
    analytic p99 TTFT (the wider margin), then the smaller replica."""
    from rdu_cluster.scenarios.capacity import candidates

    def dep(cost, *_):  # each prefill replica cost makes the pair it names here
        price, sockets, ttft = cost.pair
        return cap.Deployment(cost.plan, (cap.Pool("dgx-h100", f"tp{sockets}", 1),), 1, 1.0,
                              (8,), (price / sockets,), {"ttft_s": ttft})

    monkeypatch.setattr(candidates, "disaggregated", dep)

    def pick(*costs) -> str:
        made = [type("Cost", (), {"plan": plan, "group": group, "prefill_s": 0.1,
                                  "pair": pair})() for plan, group, pair in costs]
        return candidates._pair(made, None, None, None, 8, None, None, None).label

    assert pick(("tp1", 1, (8.0, 8, 0.9)), ("tp2", 2, (8.0, 8, 0.4))) == "tp2"
    assert pick(("tp2", 2, (8.0, 8, 0.4)), ("tp1", 1, (8.0, 8, 0.4))) == "tp1"
    assert pick(("tp1", 1, (7.0, 8, 0.9)), ("tp2", 2, (8.0, 8, 0.4))) == "tp1"
    assert pick(("tp1", 1, (8.0, 4, 0.9)), ("tp2", 2, (8.0, 8, 0.4))) == "tp1"


def test_a_prefill_pool_is_sized_at_a_full_prefill_steps_share_of_each_prompt():
    """A loaded prefill pool's queue fills each step to the token budget: DeepSeek-V3 reads its
    experts' weights once for eight 1,024-token prompts, so each takes about half of what one
    alone does, and the pool is sized as a queue at that share (prefill_replicas; on the
    500-user question the boundary was 2 H200 nodes where one prompt at a time gave 5, four
    runs more to bisect). A prompt that fills the budget alone, or a dense model, gains little
    or nothing."""
    fab = load_fabric("ib-ndr")
    ds = cap.replica_cost(with_dtypes(load_model("deepseek-v3"), "fp8", None),
                          cap.Pool("hgx-h200", "tp8", 1), (1024, 256), fab)
    assert 0.4 < ds.prefill_service_s / ds.prefill_s < 0.6
    whole = cap.replica_cost(with_dtypes(load_model("deepseek-v3"), "fp8", None),
                             cap.Pool("hgx-h200", "tp8", 1), (8192, 256), fab)
    assert whole.prefill_service_s == whole.prefill_s
    dense = cap.replica_cost(load_model("llama-3.1-8b"), cap.Pool("dgx-h100", "tp2", 1),
                             (512, 32), fab)
    assert 0.8 < dense.prefill_service_s / dense.prefill_s <= 1
    traffic, slo = cap.Traffic(500, None), cap.SLO(1500, 25)
    dep = cap.disaggregated(ds, ds, traffic, slo, 24, (1024, 256), load_model("deepseek-v3"),
                            fab)
    lam, n_p = 500 / dep.analytic["e2e_s"], dep.pools[0].replicas  # closed loop, no think
    assert dep.analytic["rho"] == pytest.approx(lam * ds.prefill_service_s / n_p)
    assert n_p == cap.prefill_replicas(cap.PrefillLoad(
        lam, ds.prefill_service_s, ds.prefill_s, dep.analytic["kv_transfer_s"],
        dep.analytic["e2e_s"]), slo, 24 * 8)
    assert n_p == 2  # the boundary the engine verified (rho 0.82: 3 at rho <= 0.8)
    assert not dep.analytic["sessions"]  # clients: an Erlang-n queue, throttled
    # the pool's analytic p99 TTFT, which a pair's prefill plan is chosen by among equals
    load = cap.PrefillLoad(lam, ds.prefill_service_s, ds.prefill_s,
                           dep.analytic["kv_transfer_s"], dep.analytic["e2e_s"])
    assert dep.analytic["ttft_s"] == cap.pool_ttft(load, 2, 1.0, 99.0)[0] <= 1.5
    assert cap.pool_ttft(load, 1, 1.0, 99.0) is None  # one replica cannot carry it


def test_a_prefill_pool_starts_where_its_queue_keeps_ttft_and_the_loop_unthrottled():
    """prefill_replicas: each replica a queue fed every n-th prompt (ca2 = 1 / n) with a fixed
    pass, Kingman's mean wait rho / (1 - rho) x ca2 / 2 x service, its p99 4.6 times it (an
    exponential's); the fewest replicas whose p99 wait plus a prompt's own pass meets the TTFT
    bound and whose mean wait is at most 1% of the closed loop's cycle."""
    lam, service, own = 83.2, 0.0198, 0.043  # DeepSeek-V3's H200 tp8 prefill pool, 500 users
    load = lambda cycle: cap.PrefillLoad(lam, service, own, 0.0, cycle)

    def wait(n: int) -> float:
        rho = lam * service / n
        return rho / (1 - rho) / n / 2 * service

    # one replica would be saturated (rho 1.65); two wait 23 ms on average, 107 ms at p99
    assert cap.prefill_replicas(load(6.0), cap.SLO(1500, 25), 24) == 2
    assert wait(2) == pytest.approx(0.0232, rel=1e-2)
    # a tight TTFT bound: 2 replicas' p99 (150 ms) misses 100 ms, 3 (61 ms) meet it
    assert math.log(100) * wait(2) + own > 0.1 > math.log(100) * wait(3) + own
    assert cap.prefill_replicas(load(6.0), cap.SLO(100, 25), 24) == 3
    # a short cycle: 2 replicas' 23 ms wait is over 1% of a 1.5 s cycle, 3 replicas' 4 ms not
    assert wait(2) > cap.PREFILL_THROTTLE * 1.5 > wait(3)
    assert cap.prefill_replicas(load(1.5), cap.SLO(1500, 25), 24) == 3
    # an open loop (no cycle) and no TTFT bound: the fewest under saturation
    assert cap.prefill_replicas(load(None), cap.SLO(None, 25), 24) == 2
    # none within the replicas allowed
    assert cap.prefill_replicas(load(6.0), cap.SLO(100, 25), 2) is None


def test_a_sessions_prefill_queue_is_fed_poisson_and_not_throttled():
    """Sessions' turns come back after think times from decodes that end in bursts and bring
    prefills of unequal size: their queue is taken as Poisson-fed (ca2 = 1), not every n-th
    prompt: the sessions question's H200 tp2 BF16 pool (37.2 prompts/s of 316 ms each at 35%
    of their tokens, 1.5 s p99 TTFT) starts at 20 replicas (the engine verified 18 and 21
    with its two decode pools) where Erlang-n's ca2 = 1 / n started it at 13. Its mean wait
    there is ~2% of its 13.5 s cycle (think time in it): the 1% throttle, set for clients
    without think time, is not applied (it would start the pool at 26)."""
    lam, service, move, cycle = 37.157, 0.316, 0.0221, 13.4564
    slo, tail = cap.SLO(1500, 25), math.log(100)
    turns = cap.PrefillLoad(lam, service, service, move, cycle, sessions=True)
    clients = cap.PrefillLoad(lam, service, service, move, cycle)

    def wait(n: int, ca2: float) -> float:
        rho = lam * service / n
        return rho / (1 - rho) * ca2 / 2 * service

    assert cap.prefill_replicas(turns, slo, 48) == 20
    # by hand: 19 replicas' p99 wait and own pass miss 1.5 s, 20's meet it
    assert tail * wait(19, 1.0) + service + move > 1.5 > tail * wait(20, 1.0) + service + move
    assert 0.01 * cycle < wait(20, 1.0) < 0.03 * cycle
    assert cap.prefill_replicas(replace(turns, sessions=False, cycle=None), slo, 48) == 13
    assert tail * wait(12, 1 / 12) + service + move > 1.5 or lam * service / 12 >= 1
    # clients without think time, throttled: never fewer than 13
    assert cap.prefill_replicas(clients, slo, 48) >= 13
    # sessions throttled would have asked wait <= 1% of the cycle: 26
    assert min(n for n in range(12, 48) if wait(n, 1.0) <= 0.01 * cycle) == 26
    # resized sizes it again at k times the prefill a prompt brings (its hand-over unscaled)
    assert cap.PrefillLoad(1.0, 1.0, 1.0, 0.0, None).scaled(2.0) == cap.PrefillLoad(
        1.0, 2.0, 2.0, 0.0, None)


def test_a_pair_prefill_pool_is_sized_for_the_answers_it_never_cached():
    """Sessions over a pair: each later turn's prompt holds the last answer, decoded in the
    other pool, so the prefill pool prefills it with the message. Its rho is counted at that
    share (the 500-session question's pairs: 0.348 of the prompt tokens, where 0.304 with the
    answers cached started their prefill searches at 8 H100 replicas for boundaries of 10-14),
    and an aggregated replica's at the share with its answers cached."""
    fab = load_fabric("ib-ndr")
    rc = cap.replica_cost(load_model("llama-3.1-8b"), cap.Pool("dgx-h100", "tp2", 1),
                          (1024, 128), fab)
    t = sessions.sessions(sessions.SessionSpec(64, 4, 512, user=sessions.LengthDist(
        "fixed", 256), output=sessions.LengthDist("fixed", 128)), 0)
    traffic = cap.Traffic(64, None, trace=t, think_s=2.0)
    assert traffic.prefill_share(outputs=False) > traffic.prefill_share()
    dep = cap.disaggregated(rc, rc, traffic, cap.SLO(1500, 25), 8,
                            traffic.mean_lengths(), load_model("llama-3.1-8b"), fab)
    lam = 64 / (dep.analytic["e2e_s"] + 2.0)
    service = rc.prefill_service_s * traffic.prefill_share(outputs=False)
    assert dep.analytic["rho"] == pytest.approx(lam * service / dep.pools[0].replicas)


def test_a_traffics_kept_figures_are_its_own():
    """prefill_share, history_replicas and session_room keep their figures on the instance
    (the analytic pass asks them ~1,500 times): the same values as a fresh instance's, and
    none carried to a copy whose fields differ."""
    t = sessions.sessions(sessions.SessionSpec(16, 3, 512, user=sessions.LengthDist(
        "fixed", 128), output=sessions.LengthDist("fixed", 64)), 0)
    traffic = cap.Traffic(16, None, trace=t, think_s=1.0)
    asks = lambda tr: (tr.prefill_share(False, 2000.0), tr.prefill_share(), tr.history_replicas(
        1000.0, False), tr.session_room(4000.0, 3))
    first = asks(traffic)
    assert asks(traffic) == first == asks(replace(traffic))
    assert first[0] > first[1] and first[2] > 0  # a small room finds less
    off = replace(traffic, prefix_cache="off")
    assert off.prefill_share(False, 2000.0) == 1.0 and off.history_replicas(1000.0) == 0
    assert replace(traffic, ramp=False).session_room(4000.0, 3) == math.inf


def test_a_session_whose_history_its_replica_cannot_keep_finds_only_what_others_hold():
    """4 sessions x 3 turns of 128 + 32 tokens on a 1,024-token system prompt, in a pair's
    prefill pool (answers never cached): turn prompts of 1,152, 1,312 and 1,472 tokens, each
    later turn finding the last turn's prompt where every prefix is kept. A replica whose
    cache keeps 1,200 tokens of a session's history holds its first turn (1,152) but not its
    second (1,312): the third turns find only the system prompt (which every session's use
    keeps warm); under 1,152 neither later turn finds more. history_replicas is the fewest
    replicas that hold a turn's histories all at once (4 x 1,312 tokens)."""
    t = sessions.sessions(sessions.SessionSpec(4, 3, 1024, user=sessions.LengthDist("fixed", 128),
                                               output=sessions.LengthDist("fixed", 32)), 0)
    traffic = cap.Traffic(4, None, trace=t)
    total = 4 * (1152 + 1312 + 1472)
    first = 1152 + 3 * 128  # the first session brings the system prompt
    assert traffic.prefill_share(False) * total == pytest.approx(first + 8 * 160)
    assert traffic.prefill_share(False, 1200) * total == pytest.approx(first + 4 * 160 + 4 * 448)
    assert traffic.prefill_share(False, 1000) * total == pytest.approx(first + 4 * 288 + 4 * 448)
    assert traffic.history_replicas(2000, outputs=False) == 3  # 5,248 tokens in 2,000 each
    assert traffic.session_room(2000, 3) == 1500  # >= 1,312: three replicas hold them
    assert traffic.session_room(2000, 2) == 1000
    assert cap.Traffic(4, None).history_replicas(2000) == 0  # no sessions: no history
    rated = cap.Traffic(4, None, trace=t, ramp=False)  # a --rate starts them: not together
    assert rated.history_replicas(2000) == 0 and rated.session_room(2000, 1) == math.inf
    off = cap.Traffic(4, None, trace=t, prefix_cache="off")
    assert off.history_replicas(2000) == 0 and off.prefill_share(False, 0) == 1.0


def test_a_pairs_prefill_pool_starts_where_its_caches_hold_the_sessions_histories():
    """The queue alone would start the pool at a count whose caches cannot hold every
    session's last turn at once; an LRU cache then evicts each history before its session
    returns (the sessions question's H100 tp2 FP8 pool at 14 replicas found none of its
    fourth turns' histories and queued them ~10 s; 19 hold them, its boundary). The pool
    starts at history_replicas, and the search's saturation hint asks no fewer; a cache that
    spills to a lower tier holds them there. Where no count within --max-nodes holds them,
    the queue sizes the pool at the share of prompt tokens its caches leave it."""
    fab = load_fabric("ib-ndr")
    model = load_model("llama-3.1-8b")
    rc = cap.replica_cost(model, cap.Pool("dgx-h100", "tp2", 1), (1024, 128), fab)
    t = sessions.sessions(sessions.SessionSpec(64, 4, 512, user=sessions.LengthDist(
        "fixed", 256), output=sessions.LengthDist("fixed", 128)), 0)
    traffic, slo = cap.Traffic(64, None, trace=t, think_s=2.0), cap.SLO(1500, 25)
    size = lambda cost, most=8: cap.disaggregated(cost, rc, traffic, slo, most,
                                                  traffic.mean_lengths(), model, fab)
    queue = size(rc)
    n0 = queue.pools[0].replicas
    assert queue.analytic["sessions"]  # sessions' turns: a Poisson-fed queue
    assert queue.analytic["history_replicas"] <= n0  # a real H100's cache holds them all
    held = 64 * (768 + 3 * 384 - 384)  # each session's third-turn prompt, 1,536 tokens
    small = replace(rc, kv_tokens=held / (n0 + 3))
    dep = size(small)
    assert dep.pools[0].replicas == n0 + 3 == dep.analytic["history_replicas"]
    assert dep.analytic["prefill_share"] == pytest.approx(traffic.prefill_share(False))
    run = cap.Result(dep, {"bench": {"request_throughput": 1.0}}, 1.0, 1.0, -1.0, [])
    assert cap.saturated(run) == n0 + 3  # not the load's 1 x a prompt's service time
    # a cache that spills to the tier below (--prefix-cache tiered; an RDU's by default)
    # keeps the histories there: no floor
    tiered = replace(traffic, prefix_cache="tiered")
    assert cap.disaggregated(small, rc, tiered, slo, 8, traffic.mean_lengths(), model,
                             fab).pools[0].replicas == n0
    rdu = cap.replica_cost(model, cap.Pool("sn40l-8", "tp2", 1), (1024, 128), fab)
    assert size(replace(rdu, kv_tokens=100.0)).analytic["history_replicas"] == 0
    tiny = size(replace(rc, kv_tokens=100.0), most=1)  # no count holds them: thrashing
    assert tiny.analytic["prefill_share"] > traffic.prefill_share(False)
    assert tiny.analytic["prefill_share"] == pytest.approx(traffic.prefill_share(
        False, traffic.session_room(100.0, tiny.pools[0].replicas)))


RANKED = [*BASE, "--slo", "ttft:500", "--slo", "tpot:10", "--json"]


@pytest.fixture(scope="module")
def ranked():
    """`capacity` on RANKED, run once for the tests that read its table (the ranking, and the
    local table Ray and --jobs must reproduce)."""
    return run(*RANKED)


def test_capacity_ranks_verified_rows_and_their_serve_args_reproduce_them(ranked, tmp_path):
    r = ranked
    assert r.exit_code == 0, r.output
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    # the candidates verified, of those short-listed, on stderr (stdout: JSON lines only)
    assert re.search(r"^capacity: (\d+)/\1 candidates \(100%\) .*ETA", r.stderr, re.MULTILINE)
    assert rows and rows[0]["meets_slo"] and {row["system"] for row in rows} == {
        "sn40l-8", "dgx-h100"}
    prices = [row["usd_per_hour"] for row in rows if row["meets_slo"]]
    assert prices == sorted(prices)
    assert {row["calibration"] for row in rows} == {"default (sn40l)", "default (h100-sxm)"}
    best = rows[0]
    again = run("serve", *best["serve_args"], "--json", "--out", str(tmp_path))
    assert again.exit_code == 0, again.output
    doc = json.loads(again.stdout)
    assert doc["p99_ttft_ms"] == pytest.approx(best["p99_ttft_ms"])
    assert doc["p99_tpot_ms"] == pytest.approx(best["p99_tpot_ms"])
    assert doc["p99_ttft_ms"] <= 500 and doc["p99_tpot_ms"] <= 10


def test_disaggregated_pair_and_plot(tmp_path):
    page = tmp_path / "front.html"
    r = run(*BASE, "--pair", "dgx-h100:sn40l-8", "--slo", "tpot:10", "--plot", str(page))
    assert r.exit_code == 0, r.output
    assert "dgx-h100->sn40l-8" in r.output and "--prefill-pool dgx-h100:" in r.output
    html = page.read_text()
    assert "Pareto front per system" in html and "dgx-h100" in html and "sn40l-8" in html
    # self-contained: plotly.js inline, no script loaded over the network (blank offline)
    assert not re.search(r"<script[^>]*\ssrc=[\"']?https?:", html) and "Plotly.newPlot" in html


def test_nothing_meets_the_slo_shows_the_closest_and_exits_1():
    r = run(*BASE, "--slo", "tpot:0.5", "--slo", "ttft:1")
    assert r.exit_code == 1
    assert "nothing meets the SLO" in r.output


def test_no_progress_silences_the_progress_line_and_changes_no_row(ranked):
    quiet = run(*RANKED, "--no-progress")
    assert quiet.exit_code == 0 and quiet.stderr == ""
    assert "capacity:" in ranked.stderr and quiet.stdout == ranked.stdout


def test_json_says_on_stderr_why_nothing_meets_the_slo():
    """--json with no candidate past the pre-filter exited 1 with nothing on stdout or stderr."""
    r = run(*BASE, "--slo", "tpot:0.001", "--json")
    assert r.exit_code == 1 and r.stdout == ""
    assert "nothing meets the SLO: no candidate passed the analytic pre-filter" in r.stderr


@pytest.mark.parametrize("extra, message", [
    (["--slo", "tpot:10", "--rate", "5"], "give --concurrency N or --rate R"),
    (["--slo", "tpot:10", "--speculative", "on"], "--speculative on: give --draft MODEL"),
    (["--slo", "tpot:10", "--spec-k", "3"], "--spec-k: only with --draft"),
    (["--slo", "tpot:10", "--draft", "llama-3.2-1b", "--draft-placement", "separate"],
     "--draft-placement separate: capacity tries shared only"),
    (["--slo", "tpot:10", "--trace", "tests/data/traces/azure_llm_conv_2023_200.csv"],
     "--concurrency: not with --trace"),
    (["--slo", "tpot:10", "--sessions", "4"], "--concurrency: not with --sessions"),
    (["--slo", "ttfb:10"], "--slo: 'ttfb:10'; accepted: KEY:MS with KEY one of ttft, tpot"),
    (["--slo", "e2el:10"], "--slo: 'e2el:10'; accepted: KEY:MS with KEY one of ttft, tpot"),
    (["--slo", "tpot:10", "--pair", "dgx-h100"], "--pair: 'dgx-h100'"),
    (["--slo", "tpot:10", "--plot", "x.svg"], "--plot x.svg: expected an .html"),
])
def test_bad_input_is_one_line(extra, message):
    r = run(*BASE, *extra)
    assert r.exit_code == 2
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], r.output


def test_slo_parse():
    slo = cap.SLO.parse(["ttft:2000", "tpot:20"], 99)
    assert (slo.ttft_ms, slo.tpot_ms) == (2000, 20)
    assert slo.misses(1000, 22) == pytest.approx(0.1)
    with pytest.raises(ConfigError, match="--slo-percentile"):
        cap.SLO.parse(["tpot:1"], 100)


def test_serve_args_carry_a_non_default_calibration():
    r = run(BASE[0], "--calibration", "none", *BASE[1:], "--slo", "tpot:10", "--json")
    assert r.exit_code == 0, r.output
    row = json.loads(r.stdout.splitlines()[0])
    i = row["serve_args"].index("--calibration")
    assert row["serve_args"][i + 1] == "none"


SMALL = ["capacity", "--model", "llama-3.1-8b", "--cluster", "sn40l-8", "--max-nodes", "1",
         "--shortlist", "1", "--slo", "ttft:2000", "--slo", "tpot:20", "--json",
         "--steady-tolerance", "off"]


def reserved(row, tmp_path):
    """Re-serve a capacity row from its serve_args: the same p99 TTFT and TPOT."""
    again = run("serve", *row["serve_args"], "--json", "--out", str(tmp_path))
    assert again.exit_code == 0, again.output
    doc = json.loads(again.stdout)
    assert doc["p99_ttft_ms"] == pytest.approx(row["p99_ttft_ms"])
    assert doc["p99_tpot_ms"] == pytest.approx(row["p99_tpot_ms"])
    return doc


def test_trace_traffic_is_replayed_rescaled_to_the_rate(tmp_path):
    path = "tests/data/traces/mooncake_conversation_200.jsonl"
    # the excerpt's long prompts (up to 87,169 tokens, each prefilled alone) take seconds to
    # first token on one node, and the decodes wait for them
    slo = [{"ttft:2000": "ttft:10000", "tpot:20": "tpot:200"}.get(a, a) for a in SMALL]
    r = run(*slo, "--trace", path, "--requests", "30", "--rate", "4")
    assert r.exit_code == 0, r.output
    row = json.loads(r.stdout.splitlines()[0])
    args = row["serve_args"]
    assert args[args.index("--trace") + 1] == path and row["verified"] == "trace replayed"
    assert args[args.index("--requests") + 1] == "30" and "--concurrency" not in args
    doc = reserved(row, tmp_path)
    assert doc["num_prompts"] == 30


def test_file_trace_head_and_rescale():
    path = "tests/data/traces/azure_llm_conv_2023_200.csv"
    t = workload.file_trace(path, 40, 8.0)
    assert len(t) == 40 and t.arrival_s[0] == 0
    assert workload.trace_rate(t) == pytest.approx(8.0)
    own = workload.file_trace(path, 40)
    gaps = np.diff(own.arrival_s)
    assert np.allclose(np.diff(t.arrival_s), gaps * workload.trace_rate(own) / 8.0)


def test_sessions_traffic_with_the_prefix_cache(tmp_path):
    r = run(*SMALL, "--sessions", "4", "--turns", "3", "--think-time", "1", "--prompt-len",
            "128", "--output-len", "32", "--prefix-cache", "hbm")
    assert r.exit_code == 0, r.output
    row = json.loads(r.stdout.splitlines()[0])
    args = row["serve_args"]
    assert args[args.index("--sessions") + 1] == "4" and "--prefix-cache" in args
    assert row["verified"] == "sessions (a closed loop each)"
    doc = reserved(row, tmp_path)
    assert doc["prefix_cache_hit_rate"] > 0


def test_uncached_tokens_of_sessions():
    """4 sessions x 3 turns of 128 + 32 tokens on a 1,024-token system prompt: only the first
    system prompt and each turn's new user message are prefilled."""
    t = sessions.sessions(sessions.SessionSpec(4, 3, 1024, user=sessions.LengthDist("fixed", 128),
                                               output=sessions.LengthDist("fixed", 32)), 0)
    assert cap.uncached_tokens(t) == 1024 + 12 * 128
    # a pair's prefill pool never computed the answers: each later turn prefills the last
    # answer with its message
    assert cap.uncached_tokens(t, outputs=False) == 1024 + 4 * (128 + 2 * (32 + 128))
    traffic = cap.Traffic(4, None, trace=t, prefix_cache="off")
    assert traffic.prefill_share() == 1.0 == traffic.prefill_share(outputs=False)


def test_speculative_axis_both(tmp_path):
    r = run(*SMALL, "--concurrency", "8", "--prompt-len", "256", "--output-len", "32",
            "--requests", "16", "--speculative", "both", "--draft", "llama-3.2-1b",
            "--spec-k", "3", "--acceptance", "0.7")
    assert r.exit_code == 0, r.output
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    spec = [row for row in rows if row["speculative"]]
    assert spec and any(row["speculative"] is None for row in rows)
    assert spec[0]["speculative"] == {"draft": "llama-3.2-1b", "k": 3}
    args = spec[0]["serve_args"]
    assert args[args.index("--draft") + 1] == "llama-3.2-1b"
    assert args[args.index("--acceptance") + 1] == "0.7"
    reserved(spec[0], tmp_path)


TINY = ["capacity", "--model", "llama-3.2-1b", "--cluster", "sn40l-8", "--slo", "tpot:50",
         "--prompt-len", "64", "--output-len", "8", "--rate", "1"]


def setting(args: list[str], flag: str, value: str) -> list[str]:
    """`args` with `flag` given `value` (an option is given once: a repeat is refused)."""
    i = args.index(flag)
    return [*args[:i + 1], value, *args[i + 2:]]


@pytest.mark.parametrize("extra, message", [
    (["--think-time", "9", "--system-prompt", "5"],
     "--think-time/--system-prompt: only with --sessions"),
    (["--slo", "tpot:20"], "--slo: tpot given twice; give each key once"),
    (["--draft", "qwen2.5-7b"],
     "a vocabulary of 152064, llama-3.2-1b of 128256; a draft must share the target's tokenizer"),
    (["--draft", "llama-3.2-1b", "--draft-sockets", "4"],
     "--draft-sockets: only with --draft-placement separate"),
])
def test_options_with_no_effect_and_impossible_drafts_are_refused(extra, message):
    r = run(*TINY, *extra)
    lines = r.output.strip().splitlines()
    assert r.exit_code == 2 and len(lines) == 1 and message in lines[0], r.output


def test_lengths_are_refused_with_a_trace(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_len,output_len\n0,64,8\n1,64,8\n")
    r = run(*TINY[:7], "--trace", str(trace), "--prompt-len", "5000")
    assert r.exit_code == 2 and "error: --prompt-len: not with --trace" in r.output, r.output


def test_the_draft_context_is_checked(tmp_path):
    doc = {k: v for k, v in model_config("llama-3.2-1b").items() if k != "_rdu"}
    draft = tmp_path / "draft.json"
    draft.write_text(json.dumps({**doc, "max_position_embeddings": 2048}))
    args = [*TINY[:7], "--prompt-len", "4000", "--output-len", "8", "--rate", "1"]
    r = run(*args, "--draft", str(draft))
    assert r.exit_code == 2 and ("error: --draft: prompt 4,000 + output 8 tokens exceed the "
                                 "2,048-token context of") in r.output, r.output


@pytest.mark.parametrize("lengths", [["--output-len", "1"], ["--output-len", "uniform:1:1.4"]])
def test_a_tpot_slo_on_one_token_outputs_is_refused(lengths):
    r = run(*setting(TINY, *lengths), "--requests", "4")
    lines = r.output.strip().splitlines()
    assert r.exit_code == 2 and len(lines) == 1, r.output
    assert "--slo tpot: no request of the traffic has more than one output token" in lines[0]


def test_a_tpot_slo_on_a_trace_of_one_token_outputs_is_refused(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_len,output_len\n0,64,1\n1,64,1\n")
    r = run(*TINY[:7], "--trace", str(trace))
    assert r.exit_code == 2 and "no request of the traffic has more than one" in r.output


def test_one_token_outputs_under_a_ttft_slo_give_serves_zero_tpot():
    args = [a if a != "tpot:50" else "ttft:1000" for a in TINY]
    r = run(*setting(args, "--output-len", "1"), "--requests", "4", "--max-nodes", "1", "--json")
    assert r.exit_code == 0, r.output
    def strict(name):
        raise AssertionError(f"{name} is not JSON")

    rows = [json.loads(line, parse_constant=strict) for line in r.stdout.splitlines()]
    assert rows and all(row["p99_tpot_ms"] == 0.0 and row["meets_slo"] for row in rows)


@pytest.mark.parametrize("top", [1, 2, 7, 24, 100])
def test_bisection_finds_the_boundary_of_a_monotone_verdict(top):
    """Whatever the analytic start, the smallest n that meets, with n - 1 asked and missing,
    each n asked once, in about 2 log2 of the distance asks; None when `top` misses."""
    for threshold in range(1, top + 2):
        for start in {1, threshold - 1, threshold, threshold + 3, top}:
            asked = []

            def meets(n, asked=asked, threshold=threshold):
                asked.append(n)
                assert 1 <= n <= top
                return n >= threshold

            n = boundary(meets, start, top)
            assert len(asked) == len(set(asked))
            if threshold > top:
                assert n is None and top in asked
                continue
            assert n == threshold and n in asked and (n == 1 or n - 1 in asked)
            far = max(abs(start - threshold), 1)
            assert len(asked) <= 2 * math.ceil(math.log2(far + 1)) + 2


def test_a_margin_on_a_line_in_one_over_n_finds_the_boundary_in_a_few_asks():
    """A decode-bound row: TPOT = a + b N / n (the batch each of n replicas holds; a and b
    near the H200 tp2 rows' 23.95 / 23.03 / 17.45 ms at 21 / 23 / 51 replicas): its boundary
    at a bound of 19.43 ms (37) is found in 5 asks from 21 (21, 22, 26, 37, 36) and 6 from
    60 (a step at most 4x the last: 60, 59, 55, 39, 36, 37), where the bare verdicts take 10
    (21, 22, 24, 28, 36, 52, 44, 40, 38, 37)."""
    tpot = lambda n: 13.38 + 222.0 / n
    for bound, start in ((19.43, 21), (19.43, 60), (24.0, 5), (15.0, 24)):
        asked = []

        def miss(n, asked=asked, bound=bound):
            asked.append(n)
            return tpot(n) / bound - 1

        want = next((n for n in range(1, 101) if tpot(n) <= bound), None)
        assert boundary(miss, start, 100) == want
        assert len(asked) == len(set(asked)) and (want is None or want - 1 in asked
                                                   or want == 1)
        assert len(asked) <= 6, (bound, start, asked)


@pytest.mark.parametrize("seed", range(40))
def test_the_line_never_loses_the_boundary_of_a_monotone_margin(seed):
    """Margins that are monotone but on no line (convex, concave, steps, lower bounds given as
    bare verdicts): the boundary all the same, each n asked once, in at most twice the asks of
    the doubling steps and bisection."""
    rng = np.random.default_rng(seed)
    top = int(rng.integers(1, 120))
    drops = np.sort(rng.exponential(1.0, top))[::-1] * rng.choice([1, 10, 0.01])
    margin = np.cumsum(drops) - rng.uniform(0, drops.sum() * 1.2)  # rising; falls as n grows
    margin = margin[::-1]
    bare = rng.random(top) < 0.3  # some asks give a verdict only
    for start in {1, top, int(rng.integers(1, top + 1))}:
        asked = []

        def miss(n, asked=asked):
            asked.append(n)
            m = float(margin[n - 1])
            return m <= 0 if bare[n - 1] else m

        got = boundary(miss, start, top)
        want = next((n for n in range(1, top + 1) if margin[n - 1] <= 0), None)
        assert got == want and len(asked) == len(set(asked))
        if want is not None:
            assert want == 1 or want - 1 in asked
        far = max(abs(start - (want or top)), 1)
        assert len(asked) <= 2 * (2 * math.ceil(math.log2(far + 1)) + 2), (start, want, asked)


def test_a_saturation_hint_finds_a_queueing_boundary_from_above_in_three_asks():
    """A prefill pool's TTFT: flat until the pool nears saturation (c = 15.6 replicas: about
    the H200 tp2 BF16 pair's 60.7 requests/s x 0.264 s), then a queue's rho / (1 - rho), a
    count below c missing outright (a run stopped as certain to miss: a bare verdict). From
    20, where the boundary of 16 was found asking 20, 19, 18, 14, 16, 15 at 16,000 requests
    (every count above it runs to its end), the steps ask 20, 19, 15, 17, 16 here; with the
    hint of the saturation count (each meeting run's own), 20, 16, 15."""
    c, base, bound = 15.6, 760.0, 1500.0
    ttft = lambda n: base + 15.0 * (c / n) / (1 - c / n) if n > c else math.inf
    want = next(n for n in range(1, 49) if ttft(n) <= bound)
    for least in (None, lambda n: round(c)):
        asked = []

        def miss(n, asked=asked):
            asked.append(n)
            return ttft(n) / bound - 1 if math.isfinite(ttft(n)) else False

        assert boundary(miss, 20, 48, least) == want == 16
        assert want - 1 in asked and len(asked) == len(set(asked))
        assert asked == ([20, 16, 15] if least else [20, 19, 15, 17, 16])


@pytest.mark.parametrize("seed", range(40))
def test_a_wrong_saturation_hint_never_loses_the_boundary(seed):
    """Hints anywhere (below the boundary, above it, past the top, at counts asked): the
    boundary all the same, each n asked once, in at most one ask more than twice the doubling
    steps' and bisection's."""
    rng = np.random.default_rng(seed)
    top = int(rng.integers(1, 120))
    want = int(rng.integers(1, top + 2))  # top + 1: nothing meets
    hints = rng.integers(-2, top + 4, size=top + 1)
    for start in {1, top, int(rng.integers(1, top + 1))}:
        asked = []

        def meets(n, asked=asked):
            asked.append(n)
            return n >= want

        got = boundary(meets, start, top, lambda n: int(hints[n]))
        assert got == (want if want <= top else None) and len(asked) == len(set(asked))
        if got is not None:
            assert got == 1 or got - 1 in asked
        far = max(abs(start - min(want, top)), 1)
        assert len(asked) <= 2 * (2 * math.ceil(math.log2(far + 1)) + 2) + 1, (start, asked)


def _fake_serve(threshold):
    """A verify() that meets from `threshold` replicas of each pool (prefill, decode)."""
    served = []

    def serve(dep, stop="slo"):
        served.append(dep)
        need = max(n - p.replicas for n, p in zip(threshold, dep.pools))
        return cap.Result(dep, {}, 0.0, 0.0, need / 10, [])
    return serve, served


def test_search_returns_the_boundary_within_max_nodes():
    from rdu_cluster.engine.disagg import Pool

    dep = cap.Deployment("sn40l-8", (Pool("sn40l-8", "tp2", 3),), 8, 0.0, (8,), (1.0,))
    serve, served = _fake_serve((11,))
    res = cap.search(dep, serve, 2)  # 11 x tp2 = 22 sockets: 3 nodes, past --max-nodes 2
    assert not res.meets_slo and res.deployment.pools[0].replicas == 8
    assert all(d.within(2) for d in served)
    serve, served = _fake_serve((6,))
    res = cap.search(dep, serve, 2)
    assert res.meets_slo and res.deployment.pools[0].replicas == 6 and res.below > 0
    assert res.deployment.price_per_hour == 12.0  # 6 x tp2 sockets at 1 USD
    pair = cap.Deployment("a->b", (Pool("dgx-h100", "tp8", 4), Pool("sn40l-8", "tp2", 1)), 8,
                          0.0, (8, 8), (2.0, 1.0))
    serve, served = _fake_serve((2, 5))  # prefill searched after the decode pool
    res = cap.search(pair, serve, 4)
    assert [p.replicas for p in res.deployment.pools] == [2, 5] and res.below > 0
    serve, served = _fake_serve((6, 5))  # no decode pool meets at 4 prefill replicas: the
    res = cap.search(pair, serve, 8)     # prefill pool is searched, then both pools again
    assert [p.replicas for p in res.deployment.pools] == [6, 5] and res.meets_slo


def test_a_pairs_prefill_search_asks_the_count_its_throughput_saturates_next():
    """A meeting run's request throughput x the prompt's prefill service time (the analytic
    estimate's prefill_service_s) is the prefill count the load saturates: the search down
    from the analytic start asks it next, and the count below it (a queue without bound,
    stopped early): 12, 10, 9 where the steps ask 12, 11, 10, 7, 9. Only the prefill pool
    (TTFT) takes the hint, and only where the run has its figures."""
    from rdu_cluster.engine.disagg import Pool

    slo = cap.SLO(1500, 25)

    def serve(dep, stop="slo", asked=None):  # 60 requests/s of 0.16 s prefill each: 9.6
        p, d = (q.replicas for q in dep.pools)
        rho = 60 * 0.16 / p
        ttft = 800 + 20 * rho / (1 - rho) if rho < 1 else 9000.0
        tpot = 20.0 if d >= 2 else 40.0
        asked.append((p, d))
        bench = {"request_throughput": 60.0}
        return cap.Result(dep, {"bench": bench}, ttft, tpot, slo.misses(ttft, tpot), [],
                          slo=slo)

    for hint, want in ((0.16, [12, 10, 9]), (None, [12, 11, 10, 7, 9])):
        analytic = {} if hint is None else {"prefill_service_s": hint}
        pair = cap.Deployment("a->b", (Pool("dgx-h100", "tp8", 12), Pool("sn40l-8", "tp2", 2)),
                              8, 0.0, (8, 8), (2.0, 1.0), analytic)
        asked: list = []
        res = cap.search(pair, lambda d, stop="slo", a=asked: serve(d, stop, a), 24)
        assert [p.replicas for p in res.deployment.pools] == [10, 2]
        prefill = [p for p, d in asked if d == 2]
        assert prefill == want


def test_the_saturation_count_takes_the_share_of_prompt_tokens_the_run_prefilled():
    """A prompt's analytic service time keeps every cached prefix (the prefix cache's lower
    bound on the work); the run's own hit rate says what its pool prefilled: 60 requests/s of
    0.16 s at a 35% share saturate 9.6 replicas, at the 70% a 30% hit rate leaves 19.2."""
    from rdu_cluster.engine.disagg import Pool

    dep = cap.Deployment("a->b", (Pool("dgx-h100", "tp2", 24), Pool("sn40l-16", "tp8", 4)), 96,
                         0.0, (8, 16), (2.0, 1.0),
                         {"prefill_service_s": 0.16, "prefill_share": 0.35})
    at = lambda summary: cap.saturated(cap.Result(dep, summary, 1.0, 1.0, -1.0, []))
    bench = {"request_throughput": 60.0}
    assert at({"bench": bench}) == 10
    assert at({"bench": bench, "prefix_cache_hit_rate": 0.65}) == 10
    assert at({"bench": bench, "prefix_cache_hit_rate": 0.3}) == 19
    assert at({"prefix_cache_hit_rate": 0.3}) is None  # no throughput: a run stopped early


def test_a_later_pass_searches_the_prefill_pool_from_its_last_boundary_without_the_hint():
    """The saturation hint is a first pass's: a later pass's prefill pool starts at the last
    pass's boundary, one decode pool's change away, and asks one fewer there. On the sessions
    question the hint (its pool's load at the analytic share of a prompt's prefill) lay at 7
    and 12 where the boundaries were 18 and 19: the FP8 H100 tp2 -> SN40L-16 tp4 pair asked 7,
    13, 16, 18 before 19 in its second pass, where 19 and 18 now. The prefill pool's load here
    loads the decode pool: 24 prefill replicas meet TTFT but not TPOT at 6 decode ones."""
    from rdu_cluster.engine.disagg import Pool

    slo = cap.SLO(1500, 25)

    def run(start: int) -> list[tuple[int, int]]:
        asked: list = []  # (prefill, decode) replicas of each run

        def serve(dep, stop=None):
            p, d = (q.replicas for q in dep.pools)
            asked.append((p, d))
            ttft, tpot = 1500 * 17.5 / p, 25 * (p / 18) * 6.5 / d  # 18 prefill; 6 decode, 7
            return cap.Result(dep, {"bench": {"request_throughput": 40.0}}, ttft, tpot,
                              slo.misses(ttft, tpot), [], slo=slo)

        pair = cap.Deployment("a->b", (Pool("dgx-h100", "tp2", start), Pool("sn40l-16", "tp8",
                              6)), 96, 0.0, (8, 16), (2.0, 1.0), {"prefill_service_s": 0.18})
        res = cap.search(pair, serve, 24)
        assert [q.replicas for q in res.deployment.pools] == [18, 7] and res.below > 0
        return asked

    # from 13 up to 18, whose TPOT misses at 6 decode replicas; 7 meet, and the prefill pool
    # is asked one fewer there, not the hint (40 requests/s x 0.18 s: 7), then bracketed
    asked = run(13)
    assert [p for p, d in asked if d == 7] == [18, 17]


@pytest.mark.parametrize("boundary, asked", [(16, [16, 15]), (21, [16, 20]), (19, [16, 20])])
def test_one_fewer_at_the_steady_count_asks_a_pairs_saturation_count_first(boundary, asked):
    """steady._one_fewer: a pair's row at the steady count (21 prefill replicas, found at a
    shorter count whose start-up transient held the boundary up) asks the count its own run
    saturates first, 16, where it lies two or more below; that meets and the search goes on
    from there (16, 15: not 20, a run to its end, first). Where it misses, one fewer is asked
    as before: the row stands where that misses too, else the search goes on from it."""
    from rdu_cluster.engine.disagg import Pool

    slo = cap.SLO(1500, 25)
    runs: dict = {}

    def serve(dep, stop=None):  # each deployment served once (settle's runs are cached)
        if dep.pools not in runs:
            p, d = (q.replicas for q in dep.pools)
            ttft, tpot = (800.0 if p >= boundary else 3000.0), (20.0 if d >= 2 else 40.0)
            runs[dep.pools] = cap.Result(dep, {"bench": {"request_throughput": 100.0}}, ttft,
                                         tpot, slo.misses(ttft, tpot), [], slo=slo)
        return runs[dep.pools]

    # 100 requests/s of 0.16 s prefill each saturate 16 prefill replicas
    pair = cap.Deployment("a->b", (Pool("hgx-h200", "tp2", 21), Pool("sn40l-16", "tp16", 2)),
                          8, 0.0, (8, 8), (2.0, 1.0), {"prefill_service_s": 0.16})
    res = steady._one_fewer(serve(pair), serve, 24, hint=True)
    prefill = [k[0].replicas for k in runs if k[1].replicas == 2][1:]
    assert prefill[:len(asked)] == asked
    assert res.deployment.pools[0].replicas == boundary and res.meets_slo
    assert res.below > 0


@pytest.mark.parametrize("tol", [0.05, None])
def test_settle_asks_the_saturation_count_only_where_the_count_doubled(tol):
    """steady.settle: at the search's own count (not doubled: the sessions question, or
    --steady-tolerance off) the boundary's other side was served already, so the saturation
    count is not asked again there (on the sessions question it was 5 runs more, each a
    miss); doubled, it is asked first and, missing, one fewer after it."""
    from rdu_cluster.engine.disagg import Pool

    slo = cap.SLO(1500, 25)
    asked: list[tuple[int, int]] = []

    def serve(dep, t, on=None):
        p, d = (q.replicas for q in dep.pools)
        asked.append((p, t.n_requests(0.0)))
        ttft, tpot = (800.0 if p >= 21 else 3000.0), (20.0 if d >= 2 else 40.0)
        bench = {"request_throughput": 100.0, "output_throughput": 1000.0}
        return cap.Result(dep, {"bench": bench}, ttft, tpot, slo.misses(ttft, tpot), [],
                          slo=slo)

    # 100 requests/s of 0.1 s prefill each saturate 10 replicas; the search climbs from 12
    pair = cap.Deployment("a->b", (Pool("hgx-h200", "tp2", 12), Pool("sn40l-16", "tp16", 2)),
                          8, 0.0, (8, 8), (2.0, 1.0), {"prefill_service_s": 0.1})
    traffic = cap.Traffic(concurrency=50, rate=None, requests=200, steady_tol=tol)
    res = cap.settle(pair, serve, traffic, 24)
    assert res.deployment.pools[0].replicas == 21 and res.below > 0
    assert (10, 200) not in asked
    if tol is not None:  # (12 misses at 200 unsaturated: searched at 400, 20 asked there)
        assert asked[-1] == (10, 400) and (20, 400) in asked


def _transient_pair(asked: list, start: int = 12, saturating: bool = False):
    """A pair whose prefill pool misses TTFT at 200 requests below 16 replicas, the ramp's
    transient queue (100 requests/s of 0.1 s prefill each keep 10 busy), and at 400 below 10
    (`saturating`: a pool that runs saturated where it misses, its throughput its own)."""
    from rdu_cluster.engine.disagg import Pool

    slo = cap.SLO(1500, 25)

    def serve(dep, t, on=None):
        p, d = (q.replicas for q in dep.pools)
        n = t.n_requests(0.0)
        asked.append((p, d, n))
        ttft = 800.0 if p >= (16 if n <= 200 else 10) else 2000.0
        tpot = 20.0 if d >= 2 else 40.0
        rate = p / 0.1 if saturating and ttft > 1500 else 100.0
        bench = {"request_throughput": rate, "output_throughput": 1000.0}
        return cap.Result(dep, {"bench": bench}, ttft, tpot, slo.misses(ttft, tpot), [],
                          slo=slo)

    pair = cap.Deployment("a->b", (Pool("hgx-h200", "tp2", start), Pool("sn40l-16", "tp16", 2)),
                          8, 0.0, (8, 8), (2.0, 1.0), {"prefill_service_s": 0.1})
    return pair, serve


def test_a_pairs_transient_miss_at_the_search_count_is_searched_at_the_doubled_one():
    """search(doubled=True): a pair whose prefill pool misses TTFT at its start while its run
    leaves the pool unsaturated (the saturation count two or more below) is returned as it
    stands, and settle searches it at twice the count: 10 prefill replicas in 9 runs, where
    the search at 200 climbed to the transient's 16 first (14 runs; question 2's FP8
    hgx-h200:tp1 + sn40l-16:tp4 pair asked 17, 18, 22, 19, 20 at 2,000 requests where its
    boundary at 4,000 was 14 or 15). A pool that runs saturated where it misses is searched at
    the count it was asked at, as before, and so is any pair without `doubled`."""
    traffic = cap.Traffic(concurrency=50, rate=None, requests=200, steady_tol=0.05)
    asked: list = []
    pair, serve = _transient_pair(asked)
    res = cap.settle(pair, serve, traffic, 24)
    assert res.deployment.pools[0].replicas == 10 and res.meets_slo and res.below > 0
    assert asked == [(12, 2, 200), (12, 1, 200),  # the decode pool's search; 12 misses TTFT
                     (12, 2, 400), (12, 1, 400), (10, 2, 400), (9, 2, 400),  # searched at 400
                     (10, 2, 200), (10, 2, 800), (9, 2, 800)]  # the row's own doublings

    asked = []
    pair, serve = _transient_pair(asked, saturating=True)
    at = lambda d, stop=None: serve(d, traffic)
    res = cap.search(pair, at, 24, doubled=True)  # saturated at 12: searched up at 200
    assert res.deployment.pools[0].replicas == 16 and res.meets_slo
    asked = []
    pair, serve = _transient_pair(asked)
    res = cap.search(pair, lambda d, stop=None: serve(d, traffic), 24)  # without `doubled`
    assert res.deployment.pools[0].replicas == 16 and res.meets_slo
    res = cap.search(pair, lambda d, stop=None: serve(d, traffic), 24, doubled=True)
    assert res.deployment.pools[0].replicas == 12 and not res.meets_slo


@pytest.mark.parametrize("steady_from, requests, moved", [(800, 1600, 0.0), (None, 1600, 0.211)])
def test_a_row_one_fewer_found_at_the_doubled_count_is_doubled_on_its_own(
        steady_from, requests, moved):
    """steady.settle: the row whose doubling settled (21 prefill replicas, its p99 TTFT the
    same at 200 and 400 requests) is not the row one fewer finds at 400 (10 replicas, at its
    prefill pool's saturation, whose p99 TTFT still falls as the run lengthens: 2,350 ms at
    200 requests, 1,475 ms at 400). The row's `moved_on_doubling` and `settled` are its own,
    and it is doubled on while it moves and the doublings last: settled at 1,600 requests
    where its TTFT stops falling at 800, else not settled there (moved 21% from 800: no SLO
    given, so each figure moves against itself). Before, the row read 'settled' at 400
    requests on the other row's move."""
    from rdu_cluster.engine.disagg import Pool

    slo = cap.SLO(1500, 25)

    def serve(dep, t, on=None):
        p, n = dep.pools[0].replicas, t.n_requests(0.0)
        ttft = (800.0 if p >= 21 else 3000.0 if p < 10
                else 600.0 + 350_000.0 / min(n, steady_from or n))
        bench = {"request_throughput": 100.0, "output_throughput": 1000.0}
        return cap.Result(dep, {"bench": bench}, ttft, 20.0, slo.misses(ttft, 20.0), [],
                          slo=slo)

    # 100 requests/s of 0.1 s prefill each saturate 10 replicas; the search climbs from 12
    pair = cap.Deployment("a->b", (Pool("hgx-h200", "tp2", 12), Pool("sn40l-16", "tp16", 2)),
                          8, 0.0, (8, 8), (2.0, 1.0), {"prefill_service_s": 0.1})
    traffic = cap.Traffic(concurrency=50, rate=None, requests=200, steady_tol=0.05)
    res = cap.settle(pair, serve, traffic, 24)
    st = res.steady
    assert res.deployment.pools[0].replicas == 10 and res.meets_slo and res.below > 0
    assert st["requests"] == requests and st["settled"] == (steady_from is not None)
    assert st["moved_on_doubling"] == pytest.approx(moved, abs=1e-3)


def test_a_pairs_pools_are_searched_in_turn_each_on_the_bound_it_sets():
    """In a closed loop a faster decode pool sends prompts faster: at the first prefill pool
    more decode replicas only lengthen TTFT (Llama 3.1 70B, 500 users, H200 tp2 x 20 -> SN40L-16
    tp16pp2: p99 TTFT 549, 2,162, 3,533, 4,343, 4,579 ms at 1, 2, 4, 8, 12 decode replicas).
    Searched on the whole SLO, no decode pool met and the search went to the largest; the
    decode pool's own bound (TPOT) finds it, then the prefill pool its own (TTFT) at that
    decode pool, in turn again where the pair still misses (more prefill replicas load the
    decode pool more). Below the count it starts from a decode pool is judged on the whole
    SLO: TTFT counts the decode queue."""
    from rdu_cluster.engine.disagg import Pool

    slo = cap.SLO(1000, 20)
    served = []

    def serve(dep, stop="slo"):  # TPOT meets from 2 decode replicas; TTFT 3 prefill a decode
        served.append(dep)
        p, d = (q.replicas for q in dep.pools)
        ttft, tpot = 1000 * (3 + d) / p, 20 * 2 / d
        return cap.Result(dep, {}, ttft, tpot, slo.misses(ttft, tpot), [], slo=slo)

    pair = cap.Deployment("a->b", (Pool("dgx-h100", "tp8", 4), Pool("sn40l-8", "tp2", 1)), 8,
                          0.0, (8, 8), (2.0, 1.0))
    res = cap.search(pair, serve, 8)
    assert [p.replicas for p in res.deployment.pools] == [5, 2] and res.meets_slo
    assert res.below > 0  # 4 prefill replicas miss at 2 decode ones
    assert max(d.pools[1].replicas for d in served) <= 2  # never past the decode boundary

    def queued(dep, stop="slo"):  # under 3 decode replicas queue the users: TTFT misses
        d = dep.pools[1].replicas
        ttft, tpot = (500.0 if d >= 3 else 3000.0), 20 * 2 / d
        return cap.Result(dep, {}, ttft, tpot, slo.misses(ttft, tpot), [], slo=slo)

    pair3 = cap.Deployment("a->b", (Pool("dgx-h100", "tp8", 1), Pool("sn40l-8", "tp2", 3)), 8,
                           0.0, (8, 8), (2.0, 1.0))
    res = cap.search(pair3, queued, 8)  # below the pre-filter's 3 the whole SLO is judged
    assert [p.replicas for p in res.deployment.pools] == [1, 3] and res.meets_slo

    def busier(dep, stop="slo"):  # TTFT meets from 8 prefill replicas, loading the decode
        p, d = (q.replicas for q in dep.pools)
        ttft, tpot = 1000 * 8 / p, 20 * (p / 5) / d
        return cap.Result(dep, {}, ttft, tpot, slo.misses(ttft, tpot), [], slo=slo)

    res = cap.search(pair, busier, 8)  # (4, 1) -> prefill 8 -> its TPOT misses -> decode 2
    assert [p.replicas for p in res.deployment.pools] == [8, 2] and res.meets_slo
    assert cap.SLO(None, 20).part("tpot") is None and cap.SLO(1000, None).part("ttft") is None


def test_a_pairs_prefill_pool_is_sized_again_at_the_share_its_first_run_prefilled():
    """The analytic pass sizes a prefill pool on a prefix cache that keeps every prompt's
    cached prefix (a lower bound on its work); the first run measures the share it prefilled,
    and where that is more the pool is sized again at it before the decode pool is searched
    (the sessions question's H100 pools held 19% of the prompt tokens at 8 replicas where the
    analytic share assumed 65%). Never smaller; a run stopped early, or a hit rate at the
    analytic share or above, changes nothing."""
    from rdu_cluster.engine.disagg import Pool

    slo = cap.SLO(1500, 25)
    an = {"prefill_share": 0.35, "arrivals_per_s": 40.0, "prefill_service_s": 0.35 * 0.5,
          "prefill_s": 0.35 * 0.6, "kv_transfer_s": 0.0, "cycle_s": 12.0}
    pair = cap.Deployment("a->b", (Pool("dgx-h100", "tp2", 8), Pool("sn40l-16", "tp8", 4)), 96,
                          0.0, (8, 16), (2.0, 1.0), an)

    def search(hit: float, decided: dict | None = None) -> list[tuple[int, int]]:
        asked = []

        def serve(dep, stop=None):
            p, d = (q.replicas for q in dep.pools)
            asked.append((p, d))
            ttft, tpot = 1000.0 * 18 / p, 25.0 * 4 / d
            return cap.Result(dep, {"prefix_cache_hit_rate": hit}, ttft, tpot,
                              slo.misses(ttft, tpot), [], slo=slo,
                              decided=decided if len(asked) == 1 else None)

        cap.search(pair, serve, 24)
        return asked

    # 80% of the tokens prefilled, not 35%: 0.4 s a prompt, 40 a second: 16 replicas saturate;
    # 17 wait 188 ms on average (over 1% of the 12 s cycle), 18 wait 89 ms (p99 TTFT 0.89 s)
    assert search(0.2)[:2] == [(8, 4), (18, 4)]
    assert cap.prefill_replicas(cap.PrefillLoad(40.0, 0.4, 0.48, 0.0, 12.0), slo, 96) == 18
    assert search(0.7)[1] != (18, 4) and search(0.7)[1][0] == 8  # as assumed: as it was
    assert search(0.2, {"ttft": 3000.0})[1][0] == 8  # stopped early: no share measured
    unshared = cap.Deployment("a->b", pair.pools, 96, 0.0, (8, 16), (2.0, 1.0))
    first = cap.Result(unshared, {"prefix_cache_hit_rate": 0.0}, 1.0, 1.0, -1.0, [], slo=slo)
    assert cap.resized(unshared, first, 24) is unshared  # no analytic share: as it was


def test_prompts_past_serves_token_budget_are_served_and_verified(tmp_path):
    """Serve's 8,192-token budget refused a longer prompt unchunked: every candidate for
    16,384-token prompts read 'serves no request' (exit 1), then verification raised its budget
    to the longest prompt. The engine now prefills such a prompt alone, as the engines do
    (schedulers/continuous.py), and capacity serves at serve's own budget."""
    args = setting(setting(TINY, "--prompt-len", "16384"), "--slo", "tpot:100")
    r = run(*args, "--max-nodes", "1", "--shortlist", "1", "--requests", "4", "--json")
    assert r.exit_code == 0, r.output
    best = json.loads(r.stdout.splitlines()[0])
    assert best["meets_slo"] and "--token-budget" not in best["serve_args"]
    again = run("serve", *best["serve_args"], "--json", "--out", str(tmp_path / "out"))
    assert again.exit_code == 0, again.output
    assert json.loads(again.stdout)["p99_tpot_ms"] == pytest.approx(best["p99_tpot_ms"])


def test_a_deployment_that_refuses_requests_does_not_meet_the_slo(monkeypatch):
    """The percentiles are over the requests served: a run that refused half the trace (30 of
    the Mooncake excerpt's first 60, past the token budget) read 'meets'."""
    import importlib
    from types import SimpleNamespace

    from rdu_cluster.engine.disagg import Pool

    output = importlib.import_module("rdu_cluster.output.capacity")
    summary = {"unserved": 30, "requests": 60,
               "bench": {"completed": 30, "p99_ttft_ms": 300.0, "p99_tpot_ms": 11.0}}
    monkeypatch.setattr(verification, "Simulation", lambda *a, **k: SimpleNamespace(
        run=lambda: SimpleNamespace(summary=summary)))
    monkeypatch.setattr(verification, "serve_args", lambda *a: [])
    dep = cap.Deployment("sn40l-8", (Pool("sn40l-8", "tp2", 2),), 24, 0.0, (8,), (1.0,))
    traffic = cap.Traffic(concurrency=None, rate=4.0, requests=60)
    slo = cap.SLO.parse(["ttft:2000", "tpot:20"], 99.0)
    model = load_model("llama-3.1-8b")
    r = cap.verify(dep, model, ("llama-3.1-8b", None), traffic, slo, load_fabric("ib-ndr"),
                   lambda: None)
    assert not r.meets_slo and r.ttft_ms == 300.0
    assert output._misses(r) == "refuses 30 of 60 requests"
    summary["unserved"] = 0
    assert cap.verify(dep, model, ("llama-3.1-8b", None), traffic, slo, load_fabric("ib-ndr"),
                      lambda: None).meets_slo


def test_a_candidate_given_twice_is_tried_once():
    """--weights fp8 --weights FP8 verified the same deployment twice and listed it twice (a
    --cluster or --plan given twice was tried once)."""
    args = [*setting(TINY, "--slo", "tpot:100"), "--max-nodes", "1", "--shortlist", "1",
            "--requests", "4", "--json"]
    for extra in (["--weights", "fp8", "--weights", "FP8"], ["--plan", "tp2", "--plan", "tp2"]):
        r = run(*args, *extra)
        assert r.exit_code == 0, r.output
        assert len(r.stdout.splitlines()) == 1, r.stdout


def test_a_pair_is_verified_closed_loop_beside_its_systems(tmp_path):
    """--pair with --sessions: the mixed row is served with the sessions' closed loops over
    both pools (serve_args reproduce it), and each cluster of the pair keeps a row of its
    own; the sessions start over a ramp (stated), not all at 0."""
    r = run("capacity", "--model", "llama-3.1-8b", "--pair", "dgx-h100:sn40l-8",
            "--max-nodes", "1", "--shortlist", "1", "--slo", "ttft:2000", "--slo", "tpot:20",
            "--sessions", "6", "--turns", "2", "--think-time", "1", "--prompt-len", "128",
            "--output-len", "16", "--json")
    assert r.exit_code == 0, r.output
    rows = {row["system"]: row for row in map(json.loads, r.stdout.splitlines())}
    assert set(rows) == {"dgx-h100", "sn40l-8", "dgx-h100->sn40l-8"}
    mixed = rows["dgx-h100->sn40l-8"]
    assert mixed["verified"] == "sessions (a closed loop each)" and mixed["meets_slo"]
    assert all(row["ramp_up_s"] > 0 for row in rows.values())
    doc = reserved(mixed, tmp_path)
    assert doc["prefix_cache_hit_rate"] > 0


def test_ramp_up_zero_starts_the_clients_together():
    r = run(*SMALL, "--concurrency", "8", "--prompt-len", "256", "--output-len", "16",
            "--ramp-up", "0")
    assert r.exit_code == 0, r.output
    row = json.loads(r.stdout.splitlines()[0])
    assert row["ramp_up_s"] == 0 and "--ramp-up" not in row["serve_args"]
    bad = run(*SMALL, "--rate", "2", "--ramp-up", "3")
    assert bad.exit_code == 2 and "--ramp-up: only with --concurrency" in bad.output


def test_interval_ends_are_the_boundary_at_the_simulators_ends(monkeypatch):
    """TPOT 60 / n ms on n replicas, bound 20 ms: the row is 3 replicas; with the TPOT's band
    0.6-1.5 the optimistic end needs 2 (30 ms <= 20 / 0.6), the pessimistic 5 (12 <= 20 / 1.5);
    3 replicas (20 ms x 1.5) are not robust. $/Mtok at each end: that end's price over its
    throughput at the throughput band's other end."""
    from rdu_cluster.engine.disagg import Pool

    def serve(dep, stop="slo"):
        n = dep.pools[0].replicas
        return cap.Result(dep, {"bench": {"output_throughput": 1000.0}}, 10.0, 60.0 / n,
                          slo.misses(10.0, 60.0 / n), [])

    slo = cap.SLO(None, 20.0)
    monkeypatch.setattr(intervals, "bands", lambda dep, slo: cap.Bands(None, (0.6, 1.5), (0.5, 2.0),
                                                                  "test bands"))
    dep = cap.Deployment("sn40l-8", (Pool("sn40l-8", "tp8", 4),), 8, 0.0, (8,), (1.0,))
    res = cap.search(dep, serve, 16)
    assert res.deployment.pools[0].replicas == 3
    out = cap.with_ends(res, serve, slo, 16).interval
    assert (out["nodes_low"], out["nodes_high"], out["robust"]) == (2, 5, False)
    assert out["usd_per_million_tokens_low"] == pytest.approx(16 * 1e6 / 3600 / 2000)
    assert out["usd_per_million_tokens_high"] == pytest.approx(40 * 1e6 / 3600 / 500)
    monkeypatch.setattr(intervals, "bands", lambda dep, slo: cap.Bands(None, None, None, "none here"))
    assert cap.with_ends(res, serve, slo, 16).interval == {"basis": "none here"}


def test_a_doublings_move_is_the_p99s_against_their_bound_and_the_throughput_against_itself():
    """The steady-state check's move (steady._moved): a p99 far under its bound is measured on
    the bound's scale (279 -> 255 ms TTFT under 1,500 ms: 1.6%, not 8.6%), a p99 at or over
    its bound and the throughput on their own (a TPOT 24 -> 26 ms under 25 ms: 8%); no SLO:
    every figure on its own scale, as before."""
    run = lambda ttft, tpot, thr: cap.Result(None, {"bench": {"output_throughput": thr}},
                                             ttft, tpot, 0.0, [])
    slo = cap.SLO(1500.0, 25.0)
    far = (run(279.0, 23.29, 1000.0), run(255.0, 23.29, 1000.0))
    assert steady._moved(*far, slo) == pytest.approx(24 / 1500)
    assert steady._moved(*far) == pytest.approx(24 / 279)
    assert steady._moved(run(279.0, 24.0, 1000.0), run(279.0, 26.0, 1000.0), slo) == \
        pytest.approx(2 / 25)
    assert steady._moved(run(3000.0, 20.0, 1000.0), run(3300.0, 20.0, 1000.0), slo) == \
        pytest.approx(0.1)  # over its bound: its own value's scale
    assert steady._moved(run(279.0, 20.0, 1000.0), run(279.0, 20.0, 900.0), slo) == \
        pytest.approx(0.1)  # the throughput: $/Mtok moves with it
    assert steady._moved(run(279.0, 20.0, 1000.0), run(math.inf, 20.0, 1000.0), slo) == math.inf


def test_a_capacity_row_has_its_interval_and_robust(monkeypatch):
    monkeypatch.setattr(intervals, "bands", lambda dep, slo: cap.Bands((0.9, 1.1), (0.9, 1.1),
                                                                  (0.9, 1.1), "test bands"))
    r = run(*RANKED)
    assert r.exit_code == 0, r.output
    for row in map(json.loads, r.stdout.splitlines()):
        if not row["meets_slo"]:
            continue
        assert row["nodes_low"] <= row["nodes"] <= (row["nodes_high"] or math.inf)
        usd = row["usd_per_million_tokens"]
        assert row["usd_per_million_tokens_low"] < usd
        assert row["robust"] == (row["p99_tpot_ms"] * 1.1 <= 10 and row["p99_ttft_ms"] * 1.1
                                 <= 500)
        assert row["interval_note"] == "test bands"


@pytest.mark.slow
def test_the_row_is_served_until_doubling_its_requests_moves_it_less_than_the_tolerance(
        tmp_path):
    """Drawn output lengths: 4 requests a user to start, doubled until the p99s and the
    throughput move under 5%, three seeds with the worst deciding; the first request of each
    user is warm-up and the initial transient after them too (MSER-5: --warmup-mser), and the
    row's serve_args reproduce it."""
    r = run(*setting(SMALL, "--steady-tolerance", "0.05"), "--concurrency", "8",
            "--prompt-len", "256", "--output-len", "uniform:8:24")
    assert r.exit_code == 0, r.output
    row = json.loads(r.stdout.splitlines()[0])
    st = row["steady"]
    assert st["requests"] in (64, 128, 256) and 8 <= st["warmup_requests"] <= 8 + (
        st["requests"] - 8) // 2
    assert "--warmup-mser" in row["serve_args"]
    assert st["moved_on_doubling"] <= 0.05 or st["requests"] == 256
    assert st["settled"] == (st["moved_on_doubling"] <= 0.05)
    assert st["seeds"] == [0, 1, 2] and len(st["p99_tpot_ms_range"]) == 2
    lo, hi = st["p99_tpot_ms_range"]
    assert lo <= row["p99_tpot_ms"] <= hi <= 20
    args = row["serve_args"]
    assert args[args.index("--warmup-requests") + 1] == "8"
    assert args[args.index("--requests") + 1] == str(st["requests"])
    reserved(row, tmp_path)


def test_set_changes_every_cluster_and_serve_args_carry_it(tmp_path):
    """--set for sensitivity: half the SN40L's HBM bandwidth makes its decode slower (a
    larger p99 TPOT at the same plan and replicas), and the row's serve_args reproduce it."""
    args = [*SMALL, "--concurrency", "8", "--prompt-len", "256", "--output-len", "16",
            "--plan", "tp8"]
    base = json.loads(run(*args).stdout.splitlines()[0])
    slow = run(*args, "--set", "chip.tiers.hbm.bandwidth_bytes_per_s=0.9e12")
    assert slow.exit_code == 0, slow.output
    row = json.loads(slow.stdout.splitlines()[0])
    assert row["plan"] == base["plan"] and row["p99_tpot_ms"] > base["p99_tpot_ms"]
    assert "--set" in row["serve_args"]
    reserved(row, tmp_path)
    bad = run(*args, "--set", "sockets=4")
    assert bad.exit_code == 2 and "--set sockets: not with capacity" in bad.output


@pytest.mark.slow
def test_candidates_on_ray_tasks_or_processes_give_the_local_table(ray_session, ranked):
    """--backend ray verifies each candidate (its search, steady state and interval ends) as a
    Ray task, --jobs 2 in two processes: the same rows, in the same order, as one process."""
    local = ranked
    assert local.exit_code == 0, local.output
    for extra in (["--backend", "ray"], ["--jobs", "2"]):
        other = run(*RANKED, *extra)
        assert other.exit_code == 0, other.output
        assert other.stdout == local.stdout, extra
        # each candidate counted as its task ends (ray.wait) or its process hands it back
        assert re.search(r"^capacity: (\d+)/\1 candidates", other.stderr, re.MULTILINE), extra


@pytest.mark.slow
def test_a_rows_serve_args_with_ten_times_the_requests_keep_its_verdict_and_interval(tmp_path):
    """Issue #34: a row verified to steady state still meets the SLO when its serve_args are
    served with 10x --requests, and its $/Mtok then (the row's price per hour over the longer
    run's steady output throughput) lies in the row's interval."""
    r = run("capacity", "--model", "llama-3.1-8b", "--cluster", "dgx-h100", "--concurrency",
            "16", "--prompt-len", "512", "--output-len", "32", "--max-nodes", "2",
            "--shortlist", "1", "--slo", "ttft:500", "--slo", "tpot:10", "--json")
    assert r.exit_code == 0, r.output
    row = next(x for x in map(json.loads, r.stdout.splitlines()) if x["meets_slo"])
    lo, hi = row["usd_per_million_tokens_low"], row["usd_per_million_tokens_high"]
    assert lo is not None and hi is not None, row["interval_note"]
    args = list(row["serve_args"])
    i = args.index("--requests")
    args[i + 1] = str(10 * int(args[i + 1]))
    again = run("serve", *args, "--json", "--out", str(tmp_path))
    assert again.exit_code == 0, again.output
    doc = json.loads(again.stdout)
    assert doc["p99_ttft_ms"] <= 500 and doc["p99_tpot_ms"] <= 10
    usd = row["usd_per_hour"] * 1e6 / 3600 / doc["output_throughput"]
    assert lo <= usd <= hi, (lo, usd, hi, row["usd_per_million_tokens"])


@pytest.mark.slow
def test_a_row_still_moving_after_its_doublings_says_it_is_not_settled():
    """A tolerance no run can meet: three doublings, and the row says it has not settled
    (its figures are the longest run's, not a steady state's)."""
    args = setting(SMALL, "--steady-tolerance", "1e-12")
    r = run(*args, "--concurrency", "4", "--prompt-len", "128", "--output-len", "uniform:4:12")
    assert r.exit_code == 0, r.output
    st = json.loads(r.stdout.splitlines()[0])["steady"]
    assert st["settled"] is False and st["moved_on_doubling"] > 1e-12
    text = run(*[a for a in args if a != "--json"], "--concurrency", "4", "--prompt-len", "128",
               "--output-len", "uniform:4:12")
    assert "not settled" in text.output


def test_the_analytic_pass_in_processes_gives_one_processs_costs():
    """--jobs: each plan's replica_cost made in a forked process (`choose`, a closure, is not
    sent: it would not pickle), the costs of each ask in its order, as one process makes
    them."""
    from rdu_cluster.scenarios.capacity import candidates

    model, fab = load_model("llama-3.1-8b"), load_fabric("ib-ndr")
    choose = lambda cl, plan: None  # a closure, as the CLI's
    asks = [(model, c, (), 2, (512.0, 32.0), fab, None, choose, None, ())
            for c in ("sn40l-16", "dgx-h100")]
    one, two = candidates.analytic(asks, 1), candidates.analytic(asks, 2)
    assert [len(cs) for cs in one] == [len(cs) for cs in two] and all(map(len, one))
    for a, b in zip((c for cs in one for c in cs), (c for cs in two for c in cs)):
        assert (a.cluster, a.plan, a.prefill_s, a.prefill_each_s, a.kv_batch) == (
            b.cluster, b.plan, b.prefill_s, b.prefill_each_s, b.kv_batch)
        assert np.array_equal(a.tpot_s, b.tpot_s) and np.array_equal(a.batches, b.batches)
    assert [c.plan for c in one[0]] == [c.plan for c in candidates._costs(asks[0])]


def test_pairs_are_verified_first_and_the_rows_keep_the_candidates_order(monkeypatch):
    """The candidates are handed out pairs first (a pair's search costs 5-25x a system's:
    listed last, they set the wall time of --jobs), and the results come back in the
    candidates' order whichever ran first."""
    from rdu_cluster.engine.disagg import Pool
    from rdu_cluster.scenarios.capacity import candidates

    ran = []

    def verified(dep, *rest):
        ran.append(dep.label)
        return dep.label

    monkeypatch.setattr(candidates, "_verified", verified)
    one = lambda label: cap.Deployment(label, (Pool("sn40l-8", "tp2", 1),), 8, 0.0, (8,), (1.0,))
    pair = lambda label: cap.Deployment(label, (Pool("dgx-h100", "tp8", 1),
                                                Pool("sn40l-8", "tp2", 1)), 8, 0.0, (8, 8),
                                        (2.0, 1.0))
    deps = [one("a"), one("b"), pair("p"), one("c"), pair("q")]
    jobs = [(d, None, "m", None, None, None, None, 4) for d in deps]
    assert candidates.verify_all(jobs, "local", None, 1) == ["a", "b", "p", "c", "q"]
    assert ran == ["p", "q", "a", "b", "c"]


def _verify(dep, traffic, slo, stop=None):
    from rdu_cluster.backends import make as make_backend

    model = load_model("llama-3.1-8b")
    return cap.verify(dep, model, ("llama-3.1-8b", None), traffic, slo, load_fabric("ib-ndr"),
                      lambda: make_backend("local"), stop)


@pytest.mark.parametrize("pair", [False, True])
def test_a_run_certain_to_miss_stops_and_one_that_meets_is_the_whole_run(pair):
    """A run whose p99 TTFT certainly exceeds its bound stops there (engine/decided.py): its
    verdict is the whole run's, its p99 a lower bound of the whole run's, in fewer requests;
    a run that meets is served to its end, the same as without the stop. Aggregated and a
    disaggregated pair (its TTFT counted from the send to the prefill pool)."""
    from rdu_cluster.engine.disagg import Pool

    pools = ((Pool("dgx-h100", "tp2", 1), Pool("sn40l-8", "tp8", 1)) if pair
             else (Pool("dgx-h100", "tp2", 1),))
    dep = cap.Deployment("x", pools, 64, 0.5, (8,) * len(pools), (1.0,) * len(pools))
    traffic = cap.Traffic(64, None, "512", "16", 192, steady_tol=None)
    tight, loose = cap.SLO(20.0, None), cap.SLO(60_000.0, None)
    whole = _verify(dep, traffic, tight)
    stopped = _verify(dep, traffic, tight, stop=tight)
    assert not whole.meets_slo and not whole.decided
    assert stopped.decided and not stopped.meets_slo
    assert 20.0 < stopped.decided["ttft"] <= whole.ttft_ms
    assert stopped.summary["decided"]["completed"] < 192
    met = _verify(dep, traffic, loose, stop=loose)
    assert met.meets_slo and not met.decided
    assert met.summary == _verify(dep, traffic, loose).summary


def test_a_pairs_waiting_requests_decide_before_they_complete(monkeypatch):
    """A pair's request still waiting for its first token at t has a TTFT over t - s
    (decided.Watch.check): a prefill pool too small for its prompts stops sooner than counting
    completed requests alone would stop it, on the same verdict, its p99 still a lower bound
    of the whole run's."""
    from rdu_cluster.engine import decided
    from rdu_cluster.engine.disagg import Pool

    pools = (Pool("dgx-h100", "tp2", 1), Pool("sn40l-8", "tp8", 1))
    dep = cap.Deployment("x", pools, 64, 0.5, (8, 8), (1.0, 1.0))
    traffic = cap.Traffic(64, None, "512", "64", 192, steady_tol=None)
    tight = cap.SLO(20.0, None)
    whole = _verify(dep, traffic, tight)
    early = _verify(dep, traffic, tight, stop=tight)
    monkeypatch.setattr(decided.Watch, "check", lambda self, now: None)
    late = _verify(dep, traffic, tight, stop=tight)
    assert early.decided and late.decided and not whole.meets_slo
    assert early.summary["decided"]["completed"] < late.summary["decided"]["completed"]
    assert 20.0 < early.decided["ttft"] <= whole.ttft_ms


def test_a_run_stops_only_on_the_bound_it_is_judged_on_and_a_row_runs_to_its_end():
    """A pair's decode pool is searched on TPOT, its prefill pool on TTFT: each run may stop
    only on the bound it is first judged on (a run stopped on TTFT knows nothing of its TPOT),
    so none is served twice; the largest tried where nothing meets is a row, served again to
    its end where it stopped. A stopped run answers a judge whose bound its pP is certain to
    exceed, and no other."""
    from rdu_cluster.engine.disagg import Pool

    slo = cap.SLO(1000, 20)
    calls = []

    def serve(dep, stop=(None, None)):  # TTFT misses below 3 prefill replicas, TPOT below 2
        p, d = (q.replicas for q in dep.pools)  # decode ones; stop: (SLO, part) or None
        on = None if stop is None else stop[1] or "slo"
        calls.append((p, d, on))
        ttft, tpot = 1000 * 3 / p, 20 * 2 / d
        if on in ("slo", "ttft") and ttft > 1000:  # stopped on TTFT, where it may
            return cap.Result(dep, {}, ttft, 0.0, slo.misses(ttft, 0.0), [], slo=slo,
                              decided={"ttft": ttft})
        if on in ("slo", "tpot") and tpot > 20:
            return cap.Result(dep, {}, 0.0, tpot, slo.misses(0.0, tpot), [], slo=slo,
                              decided={"tpot": tpot})
        return cap.Result(dep, {}, ttft, tpot, slo.misses(ttft, tpot), [], slo=slo)

    pair = cap.Deployment("a->b", (Pool("dgx-h100", "tp8", 1), Pool("sn40l-8", "tp2", 1)), 8,
                          0.0, (8, 8), (2.0, 1.0))
    res = cap.search(pair, serve, 8)
    assert [p.replicas for p in res.deployment.pools] == [3, 2] and res.meets_slo
    assert not res.decided and res.below_at_least  # 2 prefill replicas: stopped on TTFT
    assert {stop for _, d, stop in calls if d != 2} == {"tpot"}  # the decode pool's search
    assert len(calls) == len({(p, d) for p, d, _ in calls})  # none served twice
    # below the count a pool's search starts from it is judged on the whole SLO, so its runs
    # stop on either bound: 3 decode replicas behind one prefill replica stop on its TTFT
    calls.clear()
    big = cap.Deployment("a->b", (Pool("dgx-h100", "tp8", 1), Pool("sn40l-8", "tp2", 4)), 8,
                         0.0, (8, 8), (2.0, 1.0))
    res = cap.search(big, serve, 8)
    assert [p.replicas for p in res.deployment.pools] == [3, 4] and res.meets_slo
    assert (1, 3, "slo") in calls and (1, 4, "tpot") in calls
    assert len(calls) == len({(p, d) for p, d, _ in calls})
    calls.clear()
    one = cap.Deployment("a", (Pool("dgx-h100", "tp8", 1),), 8, 0.0, (8,), (2.0,))
    res = cap.search(one, lambda dep, stop=(None, None): serve(
        cap.Deployment("a", (dep.pools[0], Pool("sn40l-8", "tp2", 1)), 8, 0.0, (8, 8),
                       (2.0, 1.0)), stop), 2)  # TPOT misses at every count: nothing meets
    assert not res.meets_slo and not res.decided and calls[-1] == (2, 1, None)
    # an interval end's search stops its runs on its own bounds: a run stopped on the
    # pessimistic end's tighter bound answers that bound and tighter ones, not the SLO's
    stopped = cap.Result(one, {}, 30.0, 0.0, 0.5, [], decided={"ttft": 30.0})
    assert stopped.answers(cap.SLO(20.0, None)) and stopped.answers(cap.SLO(29.9, 25.0))
    assert not stopped.answers(cap.SLO(40.0, None)) and not stopped.answers(cap.SLO(None, 25))
    assert cap.Result(one, {}, 30.0, 0.0, 0.5, []).answers(cap.SLO(40.0, None))

def test_a_pairs_row_served_with_twice_the_requests_goes_on_from_its_own_run(monkeypatch):
    """engine/checkpoint.py: settle serves the row again with twice its requests from where
    the row's own run kept its state (the requests up to the first past its count), not from
    the start: the same rows, in fewer runs' worth of windows."""
    from rdu_cluster.engine.disagg import Disaggregated

    args = ["capacity", "--model", "llama-3.1-8b", "--pair", "dgx-h100:sn40l-8",
            "--max-nodes", "1", "--shortlist", "1", "--slo", "ttft:2000", "--slo", "tpot:20",
            "--concurrency", "8", "--prompt-len", "256", "--output-len", "16", "--json"]
    went_on: list[int] = []
    real = Disaggregated.continued
    monkeypatch.setattr(Disaggregated, "continued",
                        lambda self, t, w=None: went_on.append(len(t)) or real(self, t, w))
    kept = run(*args)
    assert kept.exit_code == 0, kept.output
    row = next(r for r in map(json.loads, kept.stdout.splitlines()) if r["disaggregated"])
    assert went_on and row["steady"]["requests"] in went_on
    monkeypatch.setattr(verification, "KEPT_RUNS", 0)
    went_on.clear()
    fresh = run(*args)
    assert not went_on and fresh.stdout == kept.stdout


def test_a_pairs_run_goes_on_from_the_longest_kept_run_of_its_deployment_below_it(monkeypatch):
    """verification._pair_served: a run of n requests goes on from the kept run of the same
    deployment with the most requests below n (a one fewer at 16,000 from that deployment's
    run at 4,000, not only a doubling from its half); another deployment's, or a longer
    one's, is not taken."""
    class Run:
        def __init__(self, n: int, made: list) -> None:
            self.n, self.made, self.summary = n, made, {}

        def continues(self, trace, watch) -> bool:
            return len(trace) > self.n

        def continued(self, trace, watch):
            self.made.append((self.n, len(trace)))
            self.n = len(trace)
            return self

        def run(self):
            self.made.append((None, self.n))
            return self

        def kept(self):
            return self

    made: list = []
    monkeypatch.setattr(verification, "_kept", type(verification._kept)())
    serve = lambda key, n: verification._pair_served(
        (key,), np.zeros(n), None, lambda keep: Run(n, made), True)
    for key, n in (("a", 2000), ("a", 4000), ("b", 8000), ("a", 16000), ("a", 3000)):
        serve(key, n)
    assert made == [(None, 2000), (2000, 4000), (None, 8000), (4000, 16000), (None, 3000)]


@pytest.mark.parametrize("pool", ["sn40l-16:adp32ep32:1", "sn40l-16:tp16pp2:1",
                                  "hgx-h200:tp8pp2:1", "dgx-h100:adp16ep16:1"])
def test_a_replicas_tpot_table_is_one_estimate_a_batch_in_one_call(pool):
    """sizing._times estimates every batch in one vectorized call on any plan: the same floats
    as an estimate a batch, on expert-parallel and pipeline plans too."""
    from chip import serving_stacks
    from partitioning import evaluate
    from partitioning.estimate import estimate
    from partitioning.plan import Plan
    from partitioning.scenario import Scenario
    from rdu_cluster.engine.disagg import Pool
    from rdu_cluster.scenarios.capacity import sizing

    model = with_dtypes(load_model("deepseek-v3"), "fp8", None)
    p = Pool.parse(pool, "--pool")
    cl = replace(p, replicas=1).spec(model, load_fabric("ib-ndr"))
    plan = Plan.parse(p.plan)
    base = Scenario(model, cl, plan, 1, 1024, 256, serving_stacks.options_for(cl.chip, None))
    batches = sizing.BATCHES[sizing.BATCHES <= evaluate.kv_batch(base)][:8]
    at = lambda b: estimate(base.but(batch=b))
    tpot, prefill = sizing._times(at, batches)
    assert tpot.tolist() == [float(at(int(b)).tpot_s) for b in batches]
    assert prefill == float(at(1).ttft_s) and batches[0] == 1


@pytest.mark.slow  # seconds: end to end
def test_kv_dtype_is_every_candidates_and_its_serve_args_reproduce_the_row(tmp_path):
    """--kv-dtype fp8 (vLLM's --kv-cache-dtype fp8): every candidate's KV cache in FP8, the rows
    saying so (kv_dtype), their serve_args carrying it, and serve giving the row's run again;
    a KV dtype that is none refused in one line."""
    rows = {}
    for kv in ("fp8", None):
        r = run(*TINY, "--cluster", "dgx-h100", "--json", "--no-progress",
                *(["--kv-dtype", kv] if kv else []))
        assert r.exit_code == 0, r.output
        rows[kv] = json.loads(r.stdout.splitlines()[0])
    row = rows["fp8"]
    args = row["serve_args"]
    assert row["kv_dtype"] == "fp8" and args[args.index("--kv-dtype") + 1] == "fp8"
    assert rows[None]["kv_dtype"] is None and "--kv-dtype" not in rows[None]["serve_args"]
    again = run("serve", *args, "--json", "--no-progress", "--out", str(tmp_path / "again"))
    assert again.exit_code == 0, again.output
    assert json.loads(again.stdout)["output_throughput"] == pytest.approx(
        row["tokens_per_s_per_socket"] * row["sockets"], rel=1e-9)
    bad = run(*TINY, "--kv-dtype", "fp7")
    assert bad.exit_code == 2 and "--kv-dtype: unknown dtype 'fp7'" in bad.output, bad.output


@pytest.mark.slow  # seconds: end to end
def test_a_pair_is_a_speculative_candidate_too_and_its_serve_args_reproduce_it(tmp_path):
    """--speculative both with --pair: the pair decodes speculatively in its decode pool as a
    candidate of its own (the draft on the decode pool's sockets, as a system's), its
    serve_args carrying --draft and k, and serve giving the row's run again."""
    r = run("capacity", "--model", "llama-3.1-8b", "--cluster", "sn40l-8", "--pair",
            "dgx-h100:sn40l-8", "--concurrency", "16", "--prompt-len", "512", "--output-len",
            "32", "--slo", "tpot:10", "--max-nodes", "2", "--shortlist", "1",
            "--steady-tolerance", "off", "--draft", "llama-3.2-1b", "--speculative", "both",
            "--json", "--no-progress")
    assert r.exit_code == 0, r.output
    pairs = [row for row in map(json.loads, r.stdout.splitlines()) if row["disaggregated"]]
    spec = [row for row in pairs if row["speculative"]]
    assert spec and len(spec) < len(pairs)  # with and without the draft
    row = spec[0]
    args = row["serve_args"]
    assert args[args.index("--draft") + 1] == "llama-3.2-1b" and "--spec-k" in args
    again = run("serve", *args, "--json", "--no-progress", "--out", str(tmp_path / "again"))
    assert again.exit_code == 0, again.output
    assert json.loads(again.stdout)["output_throughput"] == pytest.approx(
        row["tokens_per_s_per_socket"] * row["sockets"], rel=1e-9)


def test_a_closed_loops_load_is_judged_at_the_batch_its_users_form():
    """sizing._load: 64 users on replicas whose TPOT is 1.8 ms at batch 1 and 12.5 ms at 64
    (a speculative decode): from batch one the first E2E (0.26 s) made the prompts arrive at 8x
    what one replica prefills, and every replica count was refused; judged at the batch the
    users form, two replicas carry it (prefill utilization 0.43)."""
    from rdu_cluster.scenarios.capacity import sizing

    cost = sizing.ReplicaCost("sn40l-16", "tp16", 16, np.array([1, 32, 64]),
                              np.array([0.0018, 0.0113, 0.0125]), 0.0344, 256, 4.9, 16)
    traffic = cap.Traffic(concurrency=64, rate=None, prompt="1024", output="128")
    assert [sizing._load(cost, cost.prefill_s, traffic, n, 128, 256)[0]
            for n in (1, 2, 3)] == [False, True, True]
    _, e2e, tpot, rho = sizing._load(cost, cost.prefill_s, traffic, 2, 128, 256)
    assert 0 < rho < 1 and e2e == pytest.approx(cost.prefill_s + 127 * tpot, rel=1e-3)


def test_a_candidate_is_verified_at_its_engines_token_budget(tmp_path):
    """As serve takes it from the row's serve_args (no --token-budget in them): the stack's
    own, vLLM's 2,048 on an A100 (8,192 on an H100), a pair's prefill pool's; the pre-filter
    fills a prefill step to the same budget."""
    from chip import serving_stacks as stacks
    from rdu_cluster.engine.disagg import Pool
    from rdu_cluster.engine.schedulers import Limits, engine_defaults

    def budget(label, pools, stack):
        dep = cap.Deployment(label, tuple(Pool.parse(p, "--pool") for p in pools), 24, 0.0,
                             (8,) * len(pools), (1.0,) * len(pools), stack=stack)
        options = None if stack is None or len(pools) > 1 else stacks.stack(stack)
        return engine_defaults(*verification._engines(dep, options))[1].token_budget

    assert budget("dgx-a100", ["dgx-a100:tp1:1"], "vllm") == 2048
    assert budget("dgx-h100", ["dgx-h100:tp1:1"], "vllm") == 8192
    assert budget("sn40l-8", ["sn40l-8:tp2:1"], None) == Limits.token_budget
    assert budget("dgx-a100->sn40l-8", ["dgx-a100:tp1:1", "sn40l-8:tp2:1"], "vllm") == 2048
    r = run("capacity", "--model", "llama-3.2-1b", "--cluster", "dgx-a100", "--stack", "vllm",
            "--slo", "tpot:50", "--prompt-len", "3000", "--output-len", "8", "--rate", "2",
            "--max-nodes", "1", "--shortlist", "1", "--requests", "12", "--json",
            "--steady-tolerance", "off")
    assert r.exit_code == 0, r.output
    row = json.loads(r.stdout.splitlines()[0])
    assert "--token-budget" not in row["serve_args"]
    again = run("serve", *row["serve_args"], "--json", "--out", str(tmp_path / "out"))
    assert again.exit_code == 0, again.output
    doc = json.loads(again.stdout)
    assert doc["token_budget"] == 2048 and doc["p99_tpot_ms"] == pytest.approx(row["p99_tpot_ms"])
