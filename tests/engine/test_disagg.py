"""Disaggregated serving: prefill and decode pools of different chips, the KV cache handed
over an inter-node fabric through the interconnect model."""

from __future__ import annotations

import contextlib
import copy
import math
from dataclasses import fields, replace
from typing import ClassVar

import numpy as np
import pytest

from rdu_cluster.backends.local import LocalBackend
from rdu_cluster.config import load_fabric
from rdu_cluster.engine import bench, decided, disagg
from rdu_cluster.engine.disagg import prefill_bound
from rdu_cluster.engine.disagg.handover import DecodeSide, Handover, PrefillSide
from rdu_cluster.engine.disagg.ports import Ports
from rdu_cluster.engine.requests import Request
from rdu_cluster.engine.simulation import ServeConfig, Simulation
from workloads import graph, sessions, traces
from workloads.catalog import load_model
from workloads.errors import ConfigError

MODEL = "llama-3.1-8b"


def _run(n=24, rate=8.0, prefill="dgx-h100:tp8:1", decode="sn40l-16:tp8:2"):
    trace = traces.synthetic(n, rate, "poisson", traces.LengthDist("uniform", 64, 2048),
                             traces.LengthDist("uniform", 2, 64), seed=7)
    d = disagg.Disaggregated(load_model(MODEL), disagg.Pool.parse(prefill, "--prefill-pool"),
                             disagg.Pool.parse(decode, "--decode-pool"), load_fabric("ib-ndr"),
                             trace, ServeConfig(), LocalBackend)
    return d, d.run()


def test_transfer_time_is_the_fabric_ports_bottleneck():
    fab = load_fabric("ib-ndr")
    nbytes = np.array([0.0, 1e9])
    t = disagg.transfer_time(fab, 8, 16, nbytes)
    # 8 sending ports of 50 GB/s are the bottleneck; one NIC -> switch -> NIC traversal
    assert t == pytest.approx([fab.latency_s, fab.latency_s + 1e9 / (8 * 50e9)])
    assert disagg.transfer_time(fab, 16, 4, nbytes)[1] == pytest.approx(
        fab.latency_s + 1e9 / (4 * 50e9))


def test_disaggregated_run_hands_each_kv_over_and_counts_it_in_ttft():
    _, t = _run()
    r = t.requests.to_pydict()
    assert set(r["state"]) == {"done"} and r["generated_tokens"] == r["output_len"]
    per_token = float(graph.kv_cache_bytes(load_model(MODEL), 1, 1))
    sent = np.asarray(r["prompt_len"]) - 1
    assert np.allclose(r["kv_transfer_bytes"], sent * per_token)
    assert all(x > 0 for x in r["kv_transfer_s"])
    assert set(r["prefill_replica"]) == {0} and set(r["replica"]) == {1, 2}
    # TTFT covers the prefill on the H100s, the hand-over and the first decode step
    assert all(tt > m for tt, m in zip(r["ttft_s"], r["kv_transfer_s"]))
    s = t.steps.to_pydict()
    pre = np.asarray(s["replica"]) == 0
    # the prefill pool only prefills; the decode pool only decodes, every token included
    assert set(np.asarray(s["phase"])[pre]) == {"prefill"}
    assert set(np.asarray(s["phase"])[~pre]) == {"decode"}
    assert int(np.sum(np.asarray(s["decode_tokens"])[~pre])) == sum(r["output_len"])
    b = t.summary["bench"]
    assert b["completed"] == 24 and b["mean_tpot_ms"] > 0
    sk = t.sockets.to_pydict()
    assert max(sk["socket"]) == 8 + 16 - 1  # 8 H100s, then 16 SN40L sockets (2 x tp8)


@pytest.mark.parametrize("text", ["dgx-h100:tp8", "dgx-h100:tp8:0", "dgx-h100:tp8:x", "::1"])
def test_bad_pool_is_a_config_error(text):
    with pytest.raises(ConfigError, match="--prefill-pool"):
        disagg.Pool.parse(text, "--prefill-pool")


def _closed(trace, concurrency=None, decode="sn40l-16:tp8:2", fabric="ib-ndr"):
    d = disagg.Disaggregated(load_model(MODEL), disagg.Pool.parse("dgx-h100:tp8:1", "p"),
                             disagg.Pool.parse(decode, "d"), load_fabric(fabric), trace,
                             ServeConfig(concurrency=concurrency), LocalBackend)
    return d.run()


def test_closed_loop_sends_each_clients_next_request_as_the_decode_pool_completes_one():
    """--concurrency over the pools: request i is sent when request i - C is through the
    decode pool, never more than C in flight; served open loop at the send times the closed
    loop found, the pools give the same tables (the windows saw every arrival in time; one
    decode replica, so no tie of two completions deals the replicas in another order)."""
    c = 6
    trace = traces.synthetic(30, float("inf"), "poisson", traces.LengthDist("uniform", 64, 2048),
                             traces.LengthDist("uniform", 2, 64), seed=3)
    t = _closed(trace, concurrency=c, decode="sn40l-16:tp8:1")
    r = t.requests.to_pydict()
    arrival, finish = np.asarray(r["arrival_s"]), np.asarray(r["finish_s"])
    assert set(r["state"]) == {"done"}
    assert np.allclose(arrival[c:], finish[:-c])
    assert t.summary["bench"]["max_concurrent_requests"] == c
    again = _closed(replace(trace, arrival_s=arrival), decode="sn40l-16:tp8:1")
    again = again.requests.to_pydict()
    for k in ("ttft_s", "finish_s", "kv_transfer_s", "replica"):
        assert again[k] == pytest.approx(r[k], rel=1e-9), k


class _Counted(LocalBackend):
    """LocalBackend, counting the steps its windows were costed for (all pools')."""

    costed: ClassVar[list[int]] = []

    def run(self, seq, ops, spans, loads, sockets) -> dict:
        self.costed.append(int(spans.steps.sum()))
        return super().run(seq, ops, spans, loads, sockets)


class _Whole(_Counted):
    """Each window costed in one command, to its planned end."""

    costed: ClassVar[list[int]] = []
    reruns = False


def test_a_decode_span_cut_at_a_hand_over_is_costed_in_rounds_as_the_run_costed_whole(
        monkeypatch):
    """engine/windows.py WindowExecutor._costed: where a decode replica's windows are not
    timed as they are planned (its expert loads drawn step by step, or a request may be
    refused: DecodeSide.known_until; here turned off), its span is planned to its next
    completion (hundreds of steps, into the decode tables of later context chunks) and cut at
    the next hand-over a step or two on; costed first to the cut at its last step time and
    then in rounds, it runs the same, costing a fraction of the steps."""
    monkeypatch.setattr(Simulation, "can_time", lambda self: False)
    trace = traces.synthetic(60, float("inf"), "poisson", traces.LengthDist("fixed", 512),
                             traces.LengthDist("uniform", 64, 400), seed=3)

    def run(backend):
        d = disagg.Disaggregated(load_model(MODEL), disagg.Pool.parse("dgx-h100:tp8:2", "p"),
                                 disagg.Pool.parse("sn40l-16:tp8:1", "d"),
                                 load_fabric("ib-ndr"), trace, ServeConfig(concurrency=16),
                                 backend)
        return d.run()

    rounds, whole = run(_Counted), run(_Whole)
    for name in ("requests", "steps"):
        assert getattr(rounds, name).equals(getattr(whole, name)), name
    assert rounds.summary == whole.summary
    # 1,411 steps costed against 2,589 (many of this small pool's spans end at a completion)
    assert sum(_Counted.costed) < 0.6 * sum(_Whole.costed)


@pytest.mark.parametrize("loop", ["clients", "sessions"])
def test_a_pairs_windows_run_through_the_arrivals_known_by_then(loop):
    """_Held.known_until: each pool's window is timed as it is planned (engine/lookahead.py),
    taking each arrival as it reaches the replica, up to when what is not known yet could
    (a decode replica: the frontier; a prefill replica of a closed loop: Handover.returns),
    and to the least time after each of its own completions that a request it causes comes
    back (Handover.back; a prefill completion's, a hand-over and a think time). Clients over
    one decode replica, and sessions with a think time, run as without it (each window cut
    at the next arrival or completion) in fewer windows of each pool. Planned past either
    bound, a request not known as a window was planned arrives within it: the run stops."""
    if loop == "clients":
        trace = traces.synthetic(80, float("inf"), "poisson", traces.LengthDist("fixed", 2048),
                                 traces.LengthDist("uniform", 16, 96), seed=5)
        config, pools = ServeConfig(concurrency=4), ("dgx-h100:tp2:3", "sn40l-16:tp4:1")
        side = DecodeSide
        wrong = (lambda self, rep: (self.hand.frontier(rep, decode=True), math.inf),
                 lambda self, rep: (math.inf, self.hand.back(rep, decode=True)))
    else:
        spec = sessions.SessionSpec(12, 3, 256, user=traces.LengthDist("fixed", 1024),
                                    output=traces.LengthDist("uniform", 16, 64),
                                    think=sessions.ThinkTime("uniform", 0.05, 0.5))
        trace, config = traces.ramped(sessions.sessions(spec, 0), 0.3), ServeConfig()
        pools, side = ("dgx-h100:tp2:1", "sn40l-16:tp4:2"), PrefillSide
        wrong = (lambda self, rep: (self.hand.returns(rep), math.inf),)

    def run():
        d = disagg.Disaggregated(load_model(MODEL), disagg.Pool.parse(pools[0], "p"),
                                 disagg.Pool.parse(pools[1], "d"),
                                 load_fabric("ib-ndr"), trace, config, LocalBackend)
        return d.run(), [sim.windows for sim in d.sims]

    timed, few = run()
    with pytest.MonkeyPatch.context() as m:
        m.setattr(Simulation, "can_time", lambda self: False)
        cut, many = run()
    _same_but_windows(timed, cut)
    # clients: decode 107 against 156; sessions: prefill 12 against 36, decode 43 against 123
    assert few[1] < 0.7 * many[1] and (loop == "clients" or few[0] < 0.7 * many[0])
    for bounds in wrong:
        with pytest.MonkeyPatch.context() as m:
            m.setattr(side, "_bounds", bounds)
            with pytest.raises(RuntimeError, match="not known as its replica's window"):
                run()


def test_sessions_over_the_pools_hit_the_prefill_pools_prefix_cache():
    spec = sessions.SessionSpec(4, 3, 512, user=traces.LengthDist("fixed", 128),
                                output=traces.LengthDist("fixed", 16),
                                think=sessions.ThinkTime("fixed", 0.5))
    t = _closed(sessions.sessions(spec, 0))
    r = t.requests.to_pydict()
    assert set(r["state"]) == {"done"}
    after = np.asarray(sessions.sessions(spec, 0).after)
    later = after >= 0  # a turn is sent its think time after the one before completes
    assert np.allclose(np.asarray(r["arrival_s"])[later],
                       np.asarray(r["finish_s"])[after[later]] + 0.5)
    assert t.summary["prefix_cache_hit_rate"] > 0.5


def test_a_decode_replica_waits_for_the_others_only_a_think_time_later(monkeypatch):
    """Handover.frontier: what another decode replica does reaches a replica only through a
    completion's follow-up, sent its think time later; a turn sent to a busy prefill replica
    reaches a decode replica but the first no earlier than that replica's window ends.
    Sessions over four decode replicas run the same, in fewer windows than with each replica
    cut at the others' window ends and at every turn sent."""
    spec = sessions.SessionSpec(16, 3, 256, user=traces.LengthDist("fixed", 2048),
                                output=traces.LengthDist("fixed", 48),
                                think=sessions.ThinkTime("fixed", 0.2))
    trace = traces.ramped(sessions.sessions(spec, 0), 0.6)

    def run():  # one prefill replica, busy as turns are sent
        d = disagg.Disaggregated(load_model(MODEL), disagg.Pool.parse("dgx-h100:tp2:1", "p"),
                                 disagg.Pool.parse("sn40l-16:tp4:4", "d"),
                                 load_fabric("ib-ndr"), trace, ServeConfig(), LocalBackend)
        t = d.run()
        return t, d.sims[1].windows

    lagged, few = run()
    everything = lambda self: min(p.first for p in self.pre.dispatch.pending.values())
    monkeypatch.setattr(Handover, "_prefills_due", everything)  # every turn sent
    _, some = run()
    monkeypatch.setattr(Handover, "_lag", lambda self: 0.0)  # the others' ends, as before
    _without_least_move(monkeypatch)
    plain, many = run()
    _same_but_windows(lagged, plain)
    assert few < some < many / 5  # 138 and 174 against 2,019


@contextlib.contextmanager
def _kv_of(blocks: int):
    """Every replica's KV cache held to `blocks` blocks (engine/build.py Build._kv_blocks)."""
    from rdu_cluster.engine import build

    with pytest.MonkeyPatch.context() as m:
        m.setattr(build.Build, "_kv_blocks", lambda self, prog, bt, activations: blocks)
        yield


def test_a_turn_the_prefill_pool_refuses_is_a_row_without_a_queue():
    """A session whose second turn's prompt and answer are past the prefill replica's KV
    cache (6,000 tokens; the first turn's 4,360 fit): that turn is refused there (and the next
    with it), and its row has no queue time (it raised a TypeError combining the pools' rows)."""
    spec = sessions.SessionSpec(2, 3, 256, user=traces.LengthDist("fixed", 4096),
                                output=traces.LengthDist("fixed", 8),
                                think=sessions.ThinkTime("fixed", 0.2))
    with _kv_of(6000 // 16):
        r = _closed(sessions.sessions(spec, 0)).requests.to_pydict()
    assert r["state"] == ["done", "unserved", "unserved"] * 2
    assert r["queue_s"][1] is None and r["queue_s"][0] is not None
    assert "KV cache" in r["reason"][1]


def test_hand_overs_contend_for_the_ports():
    """Prefills that end in one step hand their KV over one after another through their
    prefill replica's ports, each waiting for the one before (not all at once over the same
    ports, each at the full rate)."""
    trace = traces.synthetic(4, float("inf"), "poisson", traces.LengthDist("fixed", 1024),
                             traces.LengthDist("fixed", 4))
    slow = _closed(trace, decode="sn40l-16:tp8:4", fabric="ib-ndr").requests.to_pydict()
    moves = sorted(slow["kv_transfer_s"])
    hold = moves[0] - load_fabric("ib-ndr").latency_s
    assert hold > 0 and moves == pytest.approx([moves[0] + k * hold for k in range(4)])


def test_ports_book_the_first_free_interval():
    ports = Ports()
    assert ports.book(("a", "x"), 0.0, 1.0, 0.0) == 0.0
    assert ports.book(("a", "y"), 0.5, 1.0, 0.0) == 1.0  # waits for a
    assert ports.book(("b", "x"), 0.2, 1.0, 0.0) == 1.0  # waits for x
    assert ports.book(("b", "z"), 2.5, 1.0, 0.0) == 2.5
    assert ports.book(("c", "z"), 1.0, 0.5, 0.0) == 1.0  # before z's booking: a gap fits


def test_summary_only_leaves_the_summary_as_it_is():
    """summary_only (capacity's verification): the sockets and links tables are left empty,
    the requests' energy and cost null, no steps table is built (only the columns the
    summary reads are kept) and neither ITLs nor peak figures are taken (None); the summary
    and every other figure are the same."""
    _, full = _run(n=12)
    trace = traces.synthetic(12, 8.0, "poisson", traces.LengthDist("uniform", 64, 2048),
                             traces.LengthDist("uniform", 2, 64), seed=7)
    lean = disagg.Disaggregated(load_model(MODEL), disagg.Pool.parse("dgx-h100:tp8:1", "p"),
                                disagg.Pool.parse("sn40l-16:tp8:2", "d"), load_fabric("ib-ndr"),
                                trace, ServeConfig(), LocalBackend, summary_only=True).run()
    assert full.sockets.num_rows > 0 and full.links.num_rows > 0
    assert lean.sockets.num_rows == lean.links.num_rows == 0
    energy = ("energy_j", "cost_usd")
    assert set(lean.requests.column("energy_j").to_pylist()) == {None}
    assert lean.requests.drop_columns(energy).equals(full.requests.drop_columns(energy))
    assert lean.steps is None and full.steps.num_rows > 0
    itl = {k for k in full.summary["bench"] if "_itl_" in k} | set(bench.PEAKS)
    assert len(itl) == 8 and all(lean.summary["bench"][k] is None for k in itl)  # ITL: p50 too
    assert all(full.summary["bench"][k] > 0 for k in itl)
    same = lambda s: {**s, "bench": {k: v for k, v in s["bench"].items() if k not in itl}}
    assert same(lean.summary) == same(full.summary)


def _small_pair(trace, prefill: str = "dgx-h100:tp2:3", config=None) -> disagg.Disaggregated:
    """Three prefill replicas of `prefill` over two decode replicas of sn40l-16:tp4, 24
    clients (or `config`)."""
    return disagg.Disaggregated(load_model(MODEL), disagg.Pool.parse(prefill, "p"),
                                disagg.Pool.parse("sn40l-16:tp4:2", "d"), load_fabric("ib-ndr"),
                                trace, config or ServeConfig(concurrency=24), LocalBackend)


def test_a_hand_over_reaches_a_decode_replica_no_earlier_than_its_least_transfer():
    """Handover.frontier: what the prefill pool does reaches a decode replica but the first
    (which takes the refusals at once) no earlier than the route's latency and the smallest
    KV's hold of the ports after a prefill ends. A closed loop over two decode replicas runs
    the same as with that lead taken as none, in fewer decode windows."""
    trace = traces.synthetic(80, float("inf"), "poisson", traces.LengthDist("fixed", 2048),
                             traces.LengthDist("fixed", 48), seed=5)

    def run():
        d = _small_pair(trace)
        return d.run(), d.sims[1].windows, d.sims[1].dispatch.hand.least_move

    led, few, move = run()
    per = float(graph.kv_cache_bytes(load_model(MODEL), 1, 1)) * 2047
    fab = load_fabric("ib-ndr")
    assert move == pytest.approx(disagg.transfer_time(fab, 2, 4, np.array([per]))[0])
    with pytest.MonkeyPatch.context() as m:
        _without_least_move(m)
        plain, many = run()[:2]
    _same_but_windows(led, plain)
    assert few < many  # 148 against 460



def test_a_single_decode_replica_refusals_never_reach_leads_like_the_others():
    """Handover.direct: where no request can be refused in either pool (Simulation.refusal's
    checks), no arrival reaches the first decode replica at once either, so it too waits only
    for its prefill replicas' window ends and a hand-over's least time. An expert-parallel
    decode replica (its loads drawn step by step: engine/expert_loads.py) runs the same in
    fewer windows; a prompt past a replica's KV cache brings the first replica's cut back."""
    trace = traces.synthetic(40, float("inf"), "poisson", traces.LengthDist("fixed", 1024),
                             traces.LengthDist("fixed", 32), seed=2)

    def run(t=trace):
        d = disagg.Disaggregated(load_model("mixtral-8x7b"),
                                 disagg.Pool.parse("dgx-h100:tp2:2", "p"),
                                 disagg.Pool.parse("sn40l-16:tp2ep8:1", "d"),
                                 load_fabric("ib-ndr"), t, ServeConfig(concurrency=12),
                                 LocalBackend)
        tables = d.run()
        assert d.sims[1].sampler is not None  # the decode replica's loads are drawn
        return tables, d.sims[1].windows, d.sims[0].dispatch.hand.direct

    led, few, direct = run()
    assert direct is None and len(led.requests) == 40
    with pytest.MonkeyPatch.context() as m:
        _without_least_move(m)
        m.setattr(Simulation, "may_refuse", lambda self: True)
        plain, many, direct = run()
    assert direct == 0
    _same_but_windows(led, plain)
    assert few < many  # 33 against 37
    longer = replace(trace, prompt_len=trace.prompt_len.copy())
    longer.prompt_len[-1] = 9000  # past a KV cache of 8,192 tokens: refused
    with _kv_of(8192 // 16):
        assert run(longer)[2] == 0


def test_hand_overs_are_dealt_in_the_order_their_prefills_end_however_windows_fall():
    """Handover.deal: a prefill's end is known as its window starts, but its decode replica
    (dealt round-robin) and its hold of the ports are decided in the order of the ends, then
    of ids, once no prefill unknown yet can end before it. Dealt in the order the prefill
    windows started, a two-stage prefill pool's windows, which the decode pool's frontier
    moves, dealt request 24 to decode replica 3 in one run and 4 in another: the tables
    differed (a TPOT by 0.03%). A prefill known after a later one was dealt stops the run."""
    trace = traces.synthetic(60, float("inf"), "poisson", traces.LengthDist("fixed", 2048),
                             traces.LengthDist("fixed", 48), seed=5)

    def run():
        d = _small_pair(trace, "dgx-h100:tp2pp2:3")
        return d.run(), d.sims[1].windows

    with pytest.MonkeyPatch.context() as m:
        m.setattr(prefill_bound, "least_prefill", lambda sim: 0.0)  # the hand-over's lead alone
        led, few = run()
        _without_least_move(m)
        plain, many = run()
    assert few < many
    _same_but_windows(led, plain)
    with pytest.MonkeyPatch.context() as m:  # each dealt as its window starts, as before
        m.setattr(Handover, "_first_unknown_end", lambda self: float("inf"))
        with pytest.raises(RuntimeError, match="known after one"):
            run()


@pytest.mark.parametrize("prefill", ["dgx-h100:tp2:3", "dgx-h100:tp2pp2:3"])
@pytest.mark.parametrize("prompts", ["fixed", "uniform"])
def test_a_decode_replica_waits_a_prefill_step_after_a_prefill_replicas_window_ends(
        prefill, prompts):
    """Handover.least_prefill: a prefill replica's next completion is at least a prefill step
    after its next window starts; without a prefix cache over the prompts' content or chunked
    prefill, no step completes a request faster than half the least step of its shortest
    prompt (over pipeline stages, which a step runs one after another, the sum of each
    stage's), and where every prompt has one length, than the least of the steps of k of them
    (the only ones that can: EXACT_PREFILL_SHARE of it). The run is the same in fewer decode
    windows; a floor past a step's time stops the run (check_least) rather than plan past an
    arrival; where a step may prefill less than a prompt there is none."""
    length = (traces.LengthDist("fixed", 2048) if prompts == "fixed"
              else traces.LengthDist("uniform", 1024, 3072))
    trace = traces.synthetic(60, float("inf"), "poisson", length,
                             traces.LengthDist("fixed", 48), seed=5)

    def run(t=trace, config=None):
        d = _small_pair(t, prefill, config)
        return d.run(), d.sims[1].windows, d.sims[0].dispatch.hand.least_prefill

    led, few, least = run()
    steps = led.steps.to_pydict()
    pre = np.asarray(steps["replica"]) < 3
    shortest = min(np.asarray(steps["time_s"])[pre])
    share = (prefill_bound.EXACT_PREFILL_SHARE if prompts == "fixed"
             else prefill_bound.LEAST_PREFILL_SHARE)
    assert 0 < least <= share * shortest + 1e-12
    if prompts == "fixed" and "pp" not in prefill:  # the least step the run took is one of
        assert least == pytest.approx(shortest, rel=2e-6)  # the steps it knew of (a pipeline's
        # step adds the hand-off between its stages)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(prefill_bound, "least_prefill", lambda sim: 0.0)
        plain, many = run()[:2]
    _same_but_windows(led, plain)
    assert few < many  # tp2 22 against 112 (fixed), 76 against 216; tp2pp2 22, 155; 77, 273
    with pytest.MonkeyPatch.context() as m:
        m.setattr(prefill_bound, "LEAST_PREFILL_SHARE", 3.0)
        m.setattr(prefill_bound, "EXACT_PREFILL_SHARE", 3.0)
        with pytest.raises(RuntimeError, match="under the least"):
            run()
    chunked = ServeConfig(concurrency=24, limits=replace(ServeConfig().limits,
                                                         chunked_prefill=True))
    assert run(config=chunked)[2] == 0.0


def test_a_turn_leaves_at_least_its_new_message_uncached():
    """prefill_bound._least_uncached: a session's turn finds its history cached at best (its
    earlier turns held it, prompt and answer) and the shared system prompt, never its new
    message; a later turn of its own session, sent after it completes, cannot have cached it.
    Over the pools, sessions run the same with the prefill step of that message in the decode
    replicas' wait, in fewer windows."""
    spec = sessions.SessionSpec(8, 3, 512, user=traces.LengthDist("fixed", 1024),
                                output=traces.LengthDist("fixed", 24),
                                think=sessions.ThinkTime("fixed", 0.2))
    trace = traces.ramped(sessions.sessions(spec, 0), 0.4)
    assert prefill_bound._least_uncached(trace) == 1024
    no_system = sessions.sessions(replace(spec, system_tokens=0), 0)
    assert prefill_bound._least_uncached(no_system) == 1024
    # a chunk of the same id and another length shares the shorter one's tokens (the cache
    # hashes a chunk's tokens by offset): 200 of request 1's prompt may be cached, 100 not
    parted = traces.Trace(np.zeros(2), np.array([300, 300]), np.array([1, 1]),
                          content=(((7, 300),), ((7, 200), (8, 100))))
    assert prefill_bound._least_uncached(parted) == 100
    # once a trace: the same answer again, and another content is another trace
    again = traces.Trace(np.zeros(2), np.array([300, 300]), np.array([1, 1]),
                         content=(((7, 300),), ((7, 200), (8, 100))))
    other = replace(again, content=(((7, 300),), ((9, 200), (8, 100))))
    assert (prefill_bound._least_uncached(again) == 100
            and prefill_bound._least_uncached(other) == 300)

    def run():
        d = disagg.Disaggregated(load_model(MODEL), disagg.Pool.parse("dgx-h100:tp2:2", "p"),
                                 disagg.Pool.parse("sn40l-16:tp4:2", "d"),
                                 load_fabric("ib-ndr"), trace, ServeConfig(), LocalBackend)
        return d.run(), d.sims[1].windows, d.sims[0].dispatch.hand.least_prefill

    led, few, least = run()
    assert least > 0 and led.summary["prefix_cache_hit_rate"] > 0.3
    with pytest.MonkeyPatch.context() as m:
        m.setattr(prefill_bound, "least_prefill", lambda sim: 0.0)
        plain, many = run()[:2]
    _same_but_windows(led, plain)
    assert few < many  # 70 against 85

def _without_least_move(m: pytest.MonkeyPatch) -> None:
    """Handover.frontier as before the hand-over's least time (and a prefill step's) was
    counted."""
    init = Handover.__init__

    def no_lead(self, *args):
        init(self, *args)
        self.least_move = 0.0

    m.setattr(Handover, "__init__", no_lead)
    m.setattr(prefill_bound, "least_prefill", lambda sim: 0.0)


def _same_but_windows(x, y) -> None:
    """Two runs the same at every time, cut into other windows: a window's energy is split
    over its requests and summed window by window, so the joules (and their cost) differ in
    the last bits."""
    order = [("replica", "ascending"), ("step", "ascending")]  # rows append window by window
    for name, key in (("requests", [("request_id", "ascending")]), ("steps", order)):
        a, b = (getattr(t, name).sort_by(key).to_pydict() for t in (x, y))
        assert a.keys() == b.keys()
        for k in a.keys() - {"window"}:
            if k.startswith(("energy", "cost", "dynamic")) or k.endswith("_j"):
                assert a[k] == pytest.approx(b[k], rel=1e-12), (name, k)
            else:
                assert a[k] == b[k], (name, k)
    assert x.summary["bench"] == y.summary["bench"]


def _clients(n: int, keep: bool = False, lengths=(512, 512),
             watch: decided.Watch | None = None) -> disagg.Disaggregated:
    """A closed loop of 24 clients over a pair, ramped over 2 s: n requests."""
    prompt = np.full(n, lengths[0], dtype=np.int64)
    prompt[-1] = lengths[1]
    t = traces.Trace(np.zeros(n), prompt, np.full(n, 48, dtype=np.int64))
    return disagg.Disaggregated(
        load_model(MODEL), disagg.Pool.parse("dgx-h100:tp8:1", "p"),
        disagg.Pool.parse("sn40l-16:tp8:2", "d"), load_fabric("ib-ndr"),
        traces.ramped(t, 2.0, 24), ServeConfig(concurrency=24), LocalBackend, keep=keep,
        watch=watch)


def _watch(n: int, ttft_ms: float, mser: bool = True) -> decided.Watch:
    """capacity's watch of an n-request run of _clients (24 clients' first left out)."""
    return decided.Watch({"ttft": ttft_ms, "tpot": 30.0}, 99.0, n, 24, mser=mser)


def _stopped(run: disagg.Disaggregated, trace=None, watch=None) -> tuple:
    with pytest.raises(decided.Decided) as got:
        run.run() if trace is None else run.continued(trace, watch)
    return got.value.metric, got.value.at_least_ms, got.value.completed


def test_a_watched_pair_that_meets_runs_to_its_end_told_of_each_first_token():
    """Watch.through: the decode window that admits a hand-over tells its first token, so a
    request decoding past the TTFT bound is not counted as still waiting for it. Under a
    bound between the run's longest TTFT and its shortest E2E latency the watched run meets,
    and runs to the tables of the unwatched one."""
    plain = _clients(96).run()
    req = plain.requests.to_pydict()
    longest, shortest = max(req["ttft_s"]), min(req["e2e_s"])
    assert longest < shortest / 4  # every request decodes past the bound
    bound_ms = 2e3 * longest
    watched = _clients(96, watch=decided.Watch({"ttft": bound_ms, "tpot": 1e3}, 99.0, 96, 24,
                                               mser=True)).run()
    for name in ("requests", "steps", "sockets", "links"):
        assert getattr(watched, name).equals(getattr(plain, name)), name


def test_a_run_stopped_as_certain_goes_on_to_more_requests_as_their_stopped_run_does():
    """A kept run stopped once its watch is certain (a TTFT bound of 1 ms: two counted
    requests waiting) keeps its checkpoint; a run of twice the requests goes on from it, its
    own watch taking up the sends, completions and waits, and stops where, and as, it stops
    from the start. A watch that would have counted those sends (no MSER cut: only the
    clients' first requests left out) does not go on from it."""
    first = _clients(96, keep=True, watch=_watch(96, 1.0))
    assert _stopped(first) == _stopped(_clients(96, watch=_watch(96, 1.0)))
    kept = first.kept()
    assert kept is not None and first.checkpoint.taken
    longer = _clients(192).trace
    assert not kept.continues(longer, _watch(192, 1.0, mser=False))
    got = _stopped(kept, longer, _watch(192, 1.0))
    assert got == _stopped(_clients(192, watch=_watch(192, 1.0)))


def test_a_stopped_kept_run_goes_on_to_four_times_its_requests_as_from_the_start():
    """The checkpoint is every longer run's state, not only its doubling's (capacity's one
    fewer at a row's steady count goes on from that deployment's run at a shorter count):
    from a run of 96 stopped as certain, a run of 384 stops where, and as, it does from the
    start."""
    first = _clients(96, keep=True, watch=_watch(96, 1.0))
    _stopped(first)
    longer = _clients(384).trace
    assert _stopped(first.kept(), longer, _watch(384, 1.0)) == _stopped(
        _clients(384, watch=_watch(384, 1.0)))


def test_a_watched_run_that_meets_goes_on_watched_as_from_the_start():
    """A kept run that met its (loose) bounds goes on to twice the requests under the longer
    run's watch with the tables of that run watched from the start."""
    first = _clients(96, keep=True, watch=_watch(96, 60e3))
    first.run()
    kept = first.kept()
    longer = _clients(192).trace
    w = _watch(192, 60e3)
    assert kept.continues(longer, w)
    got, fresh = kept.continued(longer, w), _clients(192, watch=_watch(192, 60e3)).run()
    for name in ("requests", "steps", "sockets", "links"):
        assert getattr(got, name).equals(getattr(fresh, name)), name
    assert got.summary == fresh.summary


def test_a_kept_run_goes_on_to_more_requests_as_their_run_from_the_start_does():
    """engine/checkpoint.py: a closed loop of 96 requests keeps its state at the end of the
    event that sends request 72 (96 less its 24 clients), where it is the run of 192's too;
    going on from there with 192 requests gives the tables of 192 from the start, bit for
    bit, and again from its own checkpoint to 384."""
    first = _clients(96, keep=True)
    first.run()
    kept = first.kept()
    assert kept is not None and first.checkpoint.at == 72
    for n in (192, 384):
        longer = _clients(n).trace
        assert kept.continues(longer)
        got, fresh = kept.continued(longer), _clients(n).run()
        for name in ("requests", "steps", "sockets", "links"):
            assert getattr(got, name).equals(getattr(fresh, name)), (n, name)
        assert got.summary == fresh.summary
        assert not kept.continues(_clients(2 * n).trace)  # once: it went on
        kept = kept.kept()
    plain = _clients(96)
    plain.run()
    assert plain.kept() is None  # not kept unless asked


def test_a_requests_copy_has_its_own_lists_and_its_probe_on_the_copied_cache():
    """Request.__deepcopy__ (a kept run's copy, field by field): a request referenced twice
    is one copy; its emits and prefix tokens are its own; its probe is bound to the copy of
    the prefix cache it was bound to; every other field equal."""
    class Cache:
        def peek(self, r: Request) -> int:
            return 7

    cache = Cache()
    r = Request(1, 0.5, 10, 4, probe=cache.peek)
    r.emits.append((0, 1, 2))
    r.prefix_tokens["hbm"] = 3
    copied_cache, a, b = copy.deepcopy((cache, r, r))
    assert a is b and a is not r
    assert a.emits == r.emits and a.emits is not r.emits
    assert a.prefix_tokens == r.prefix_tokens and a.prefix_tokens is not r.prefix_tokens
    assert a.probe.__self__ is copied_cache and a.probe(a) == 7
    assert all(getattr(a, f.name) == getattr(r, f.name) for f in fields(Request)
               if f.name != "probe")


def test_a_finished_tables_copy_shares_its_rows_and_owns_the_rest():
    """Finished.__deepcopy__ (a kept run's copy): the rows handed on, tuples of numbers and
    strings, are the original's objects in a list of its own; what it records next (its
    requests in flight) is copied as before."""
    from rdu_cluster.engine.finished import Finished
    from rdu_cluster.engine.metrics import Recorder

    done = Finished(Recorder())
    done.rows += [(0, 1.5, "done"), (1, 2.5, "done")]
    r = Request(2, 0.5, 10, 4)
    done.arrived(r, 0)
    a = copy.deepcopy(done)
    assert a.rows == done.rows and a.rows is not done.rows
    assert all(x is y for x, y in zip(a.rows, done.rows))
    a.rows.append((2, 3.5, "done"))
    assert len(done.rows) == 2
    assert a.live[2][0] is not r and a.live[2][0].id == 2 and a.rec is not done.rec


def test_a_kept_run_goes_on_only_to_its_own_requests_and_more():
    """What the frontier assumes of the trace (its shortest prompt, its largest KV) must hold
    for the longer one, whose first rows are this run's: else it is served from the start."""
    first = _clients(96, keep=True)
    first.run()
    kept = first.kept()
    assert kept.continues(_clients(192).trace)
    assert not kept.continues(_clients(96).trace)  # no more requests
    assert not kept.continues(_clients(192, lengths=(512, 256)).trace)  # a shorter prompt
    other = _clients(192).trace
    other.prompt_len[0] = 511  # not its first rows
    assert not kept.continues(other)
    with pytest.raises(ValueError, match="does not continue"):
        kept.continued(other)


def test_each_pools_backend_knows_the_runs_sockets_and_the_first_closes_last():
    """A backend a pool: one that shares out a machine (Ray's CPUs) shares it over both pools'
    sockets (run_sockets), and the prefill pool's backend, made first (the one that may have
    started the Ray instance both pools' actors live in), is closed last."""
    made, closed = [], []

    class Recorded(LocalBackend):
        def __init__(self) -> None:
            super().__init__()
            made.append(self)

        def close(self) -> None:
            closed.append(made.index(self))
            super().close()

    trace = traces.synthetic(4, 8.0, "poisson", traces.LengthDist("fixed", 128, 128),
                             traces.LengthDist("fixed", 8, 8), seed=7)
    d = disagg.Disaggregated(load_model(MODEL), disagg.Pool.parse("dgx-h100:tp1:1", "p"),
                             disagg.Pool.parse("sn40l-8:tp4:1", "d"), load_fabric("ib-ndr"),
                             trace, ServeConfig(), Recorded)
    d.run()
    assert [b.run_sockets for b in made] == [5, 5] and closed == [1, 0]


@pytest.mark.slow  # seconds: Ray actors
def test_a_pair_on_ray_gives_the_local_tables(ray_session):
    """Both pools' actors placed on a 2-CPU Ray instance (1 + 4 sockets: a CPU share each over
    the five; each pool alone would take 1 and then ask 2 of the one left)."""
    from rdu_cluster.backends.ray_backend import RayBackend

    trace = traces.synthetic(12, 8.0, "poisson", traces.LengthDist("uniform", 64, 512),
                             traces.LengthDist("uniform", 2, 32), seed=7)
    tables = {}
    for name, backend in (("local", LocalBackend), ("ray", RayBackend)):
        d = disagg.Disaggregated(load_model("llama-3.2-1b"),
                                 disagg.Pool.parse("dgx-h100:tp1:1", "p"),
                                 disagg.Pool.parse("sn40l-8:tp4:1", "d"), load_fabric("ib-ndr"),
                                 trace, ServeConfig(), backend)
        tables[name] = d.run()
    for part in ("requests", "steps"):
        assert getattr(tables["ray"], part).equals(getattr(tables["local"], part)), part


def test_a_pair_decodes_speculatively_with_the_drafts_kv_handed_over_too():
    """--draft with pools (shared placement): the prefill pool prefills the prompt in the target
    and the draft, each request's hand-over carries both KV caches, and the decode pool drafts
    and verifies (its TPOT that of speculative steps); a separate draft is refused."""
    from workloads.speculative import Speculation, parse_acceptance

    trace = traces.synthetic(16, 4.0, "poisson", traces.LengthDist("fixed", 512, 512),
                             traces.LengthDist("fixed", 64, 64), seed=7)
    spec = Speculation(4, parse_acceptance("0.8"))
    runs = {}
    for name, config in (("plain", ServeConfig()),
                         ("draft", ServeConfig(speculation=spec, draft="llama-3.2-1b"))):
        d = disagg.Disaggregated(load_model(MODEL), disagg.Pool.parse("dgx-h100:tp1:1", "p"),
                                 disagg.Pool.parse("sn40l-8:tp4:1", "d"), load_fabric("ib-ndr"),
                                 trace, config, LocalBackend)
        runs[name] = d.run()
    per_token = {m: float(graph.kv_cache_bytes(load_model(m), 1, 1))
                 for m in (MODEL, "llama-3.2-1b")}
    sent = 511  # the prompt less its last token (the decode side recomputes it)
    plain, draft = (np.asarray(runs[n].requests.column("kv_transfer_bytes")) for n in runs)
    assert (plain == sent * per_token[MODEL]).all()
    assert (draft == sent * (per_token[MODEL] + per_token["llama-3.2-1b"])).all()
    tpot = {n: runs[n].summary["bench"]["mean_tpot_ms"] for n in runs}
    assert tpot["draft"] < tpot["plain"] / 1.5  # k = 4 at 0.8: ~2.7 tokens a verify step
    with pytest.raises(ConfigError, match="--draft-placement separate: not with --prefill-pool"):
        disagg.Disaggregated(load_model(MODEL), disagg.Pool.parse("dgx-h100:tp1:1", "p"),
                             disagg.Pool.parse("sn40l-8:tp4:2", "d"), load_fabric("ib-ndr"),
                             trace, ServeConfig(speculation=spec, draft="llama-3.2-1b",
                                                draft_placement="separate", draft_sockets=4),
                             LocalBackend)
