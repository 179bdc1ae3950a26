"""Light load: a window is timed as it is planned (engine/lookahead.py), so it runs through
arrivals instead of ending at the first. The tables are what one window per plan gives (the
conservative advance): the same requests and links, the same steps (only their window numbers
and the order in which replicas' windows were recorded differ), the same socket time in fewer
rows."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from rdu_cluster.backends.local import LocalBackend
from rdu_cluster.config import load_cluster
from rdu_cluster.engine import replica
from rdu_cluster.engine.dispatch import Dispatcher
from rdu_cluster.engine.kv import KVConfig, KVManager
from rdu_cluster.engine.requests import RUNNING, Request
from rdu_cluster.engine.schedulers import Limits, View
from rdu_cluster.engine.schedulers.continuous import Continuous
from rdu_cluster.engine.simulation import ServeConfig, Simulation
from rdu_cluster.engine.windows import WindowExecutor
from workloads import sessions, traces
from workloads.catalog import load_model


class Spy:
    """The most prefill steps (arrivals admitted) one window held."""

    def __init__(self) -> None:
        self.most = 0

    def window(self, sim, rep, window, res, step, t0, m) -> None:
        self.most = max(self.most, sum(1 for sp in window.spans if sp.prefill))


def _by_step(tbl):
    return tbl.drop_columns(["window"]).sort_by([("replica", "ascending"),
                                                 ("step", "ascending")])


LIGHT = {"cluster": "sn40l-16", "plan": "tp4", "n": 120, "rate": 60.0, "seed": 7,
         "prompt": traces.LengthDist("uniform", 256, 4096),
         "output": traces.LengthDist("uniform", 8, 200)}


def test_timed_windows_give_the_tables_of_one_window_per_plan(serve, monkeypatch):
    spy = Spy()

    def watch(sim, _windows):  # a hook runs after each window: from then on the spy watches
        if spy not in sim.observers:
            sim.observers.append(spy)

    sim, ahead = serve(**LIGHT, hooks=[watch])
    assert sim.lookahead and spy.most > 10  # one window ran through many arrivals
    monkeypatch.setattr(Simulation, "_can_look_ahead", lambda self: False)
    sim_one, one = serve(**LIGHT)
    assert sim_one.windows > 10 * sim.windows
    assert ahead.requests.equals(one.requests) and ahead.links.equals(one.links)
    assert _by_step(ahead.steps).equals(_by_step(one.steps))
    assert ahead.sockets.num_rows < one.sockets.num_rows
    for col in ("busy_s", "sent_bytes"):
        assert np.isclose(pc.sum(ahead.sockets[col]).as_py(), pc.sum(one.sockets[col]).as_py(),
                          rtol=1e-12)
    _same_summary(ahead.summary, one.summary)


@pytest.mark.slow  # seconds: end to end
def test_a_standing_plan_gives_the_tables_of_asking_the_scheduler(serve, monkeypatch):
    """After a decode span that ran to its end, a plan that stands (StepPlan.stands) is
    followed without asking the scheduler: the same tables as asking it at every span, on a
    light run, on one whose KV cache is short enough to preempt (there the replica must ask:
    a decode's next step may not fit) and on one whose full batch makes its plans saturated
    (timed only later: the replica must ask, since it cannot tell whether a request arrived)."""
    follows = []
    real = replica.Replica._follow

    def count(self, plan, rest, clock):
        out = real(self, plan, rest, clock)
        follows.append(out is not None)
        return out

    # 16 long requests on one replica, all admitted, whose decodes outgrow the KV cache
    # (1,144 blocks) with nothing waiting
    pressed = {"cluster": "sn40l-8", "n": 16, "rate": 200.0,
               "prompt": traces.LengthDist("fixed", 1024),
               "output": traces.LengthDist("uniform", 200, 1500), "kv_memory_fraction": 0.0045}
    # a batch of 4 is often full with nothing waiting: a saturated plan stands, untimed
    full = {**LIGHT, "limits": Limits(max_batch=4)}
    for kw in (LIGHT, pressed, full):
        follows.clear()
        monkeypatch.setattr(replica.Replica, "_follow", count)
        _, followed = serve(**kw)
        assert sum(follows) > 5
        monkeypatch.setattr(replica.Replica, "_follow", lambda self, plan, rest, clock: None)
        _, asked = serve(**kw)
        for name in ("requests", "steps", "sockets", "links"):
            assert getattr(followed, name).equals(getattr(asked, name)), name
        assert followed.summary == asked.summary
        if kw is pressed:  # some spans end where the plan does not stand, and it preempts
            assert not all(follows)
            assert pc.sum(followed.requests["preemptions"]).as_py() > 0


def test_the_continuous_plan_stands_only_with_nothing_waiting_or_swapped():
    kv = KVManager(KVConfig(10_000, 16, 1.0))
    running = [Request(i, 0.0, 100, 50, state=RUNNING, cached=100, target=100)
               for i in range(3)]
    for r in running:
        kv.set(r, r.cached)
    policy = Continuous(Limits(max_batch=4))
    late = Request(9, 1.0, 20_000_000, 5)  # too long to admit: the plan is a decode
    swapped = Request(8, 0.0, 100, 50, state="swapped", cached=100, target=100)
    assert policy.step(View(running, [], [], kv, True)).stands
    assert not policy.step(View(running, [late], [], kv, True)).stands
    plan = policy.step(View(running, [], [swapped], kv, True))
    assert plan.swap_in and not plan.stands
    prefilling = [*running, Request(5, 0.0, 100, 50, state=RUNNING, cached=10, target=100)]
    kv.set(prefilling[-1], 100)
    assert not policy.step(View(prefilling, [], [], kv, True)).stands


def test_a_window_the_sockets_time_otherwise_is_an_internal_error(serve, monkeypatch):
    """The engine checks the sockets' times against those it planned with: a prediction off
    by one part in 10^9 is caught, not recorded."""
    make = WindowExecutor.clock

    def off(self, rep, t0):
        clock = make(self, rep, t0)
        time_of, step_times = clock.time_of, clock.step_times
        clock.time_of = lambda spans: time_of(spans) * (1 + 1e-9)
        clock.step_times = lambda span: [t * (1 + 1e-9) for t in step_times(span)]
        return clock

    monkeypatch.setattr(WindowExecutor, "clock", off)
    with pytest.raises(RuntimeError, match="internal error: step 0 of a window ended at"):
        serve(**LIGHT)


def test_no_lookahead_with_faults(serve):
    sim, _ = serve(cluster="sn40l-16", plan="tp4", n=20, rate=20.0, faults=["socket:5@0.3"])
    assert not sim.lookahead


def test_no_lookahead_where_a_span_draws_random_numbers(serve):
    sim, _ = serve(model="mixtral-8x7b", plan="tp2ep8", n=6, rate=50.0)
    assert sim.sampler is not None and not sim.lookahead


def _streamed(serve, chunk_rows: int, **kw):
    chunks: dict[str, list] = {}
    _sim, tables = serve(**kw, sink=lambda name, tbl: chunks.setdefault(name, []).append(tbl),
                         chunk_rows=chunk_rows)
    return tables, {name: pa.concat_tables(parts) for name, parts in chunks.items()}, chunks


def test_streamed_rows_are_the_tables_whatever_the_chunk(serve, monkeypatch):
    """Requests, steps and sockets rows handed on in chunks as they are recorded (a request's
    once it is through, in id order although requests finish out of order) make the same
    tables (rows, order, schema and metadata) as a run that keeps them, and the same
    summary. Windows of at most 4 spans, so that there are many (a window's rows go on
    together)."""
    monkeypatch.setattr(replica, "MAX_SPANS", 4)
    kw = {"cluster": "sn40l-16", "plan": "tp4", "n": 60, "rate": 40.0, "seed": 3}
    _, whole = serve(**kw)
    finish = whole.requests.column("finish_s").to_numpy()
    assert np.any(np.diff(finish) < 0)  # requests finish out of order: rows wait their turn
    small, small_tables, parts = _streamed(serve, 7, **kw)
    big, big_tables, big_parts = _streamed(serve, 10**9, **kw)
    assert len(parts["steps"]) > 10 and len(parts["sockets"]) > 10
    assert len(parts["requests"]) > 4  # a chunk once 7 rows are through in id order
    assert len(big_parts["steps"]) == len(big_parts["sockets"]) == len(big_parts["requests"]) == 1
    for name in ("requests", "steps", "sockets"):
        assert small_tables[name].equals(whole.__dict__[name], check_metadata=True)
        assert big_tables[name].equals(whole.__dict__[name], check_metadata=True)
        assert getattr(small, name) is None
    assert small.links.equals(whole.links)
    assert small.summary == big.summary == whole.summary


def test_a_light_run_holds_the_requests_in_flight_not_the_trace(serve, monkeypatch):
    """Open loop: a Request is made when its arrival is next and let go once its row is
    recorded; the rows that wait for an earlier request, those a window completed (at most
    MAX_COMPLETED a window, here 8) and each replica's list of arrived requests stay near the
    requests in flight."""
    monkeypatch.setattr(replica, "MAX_COMPLETED", 8)
    held = []

    def watch(sim, _windows):
        f = sim.finished
        held.append((len(f.live) + len(f.held), max(len(r.requests) for r in sim.replicas)))

    n = 400
    sim, t = serve(cluster="sn40l-16", plan="tp4", n=n, rate=20.0, seed=5, hooks=[watch],
                   output=traces.LengthDist("uniform", 4, 40))
    assert t.requests.num_rows == n
    assert t.requests.column("request_id").to_pylist() == list(range(n))
    live, listed = np.max(held, axis=0)
    assert live < n // 10 and listed <= 2 * max(live, 32) + 1
    assert not sim.finished.live and not sim.finished.held


def test_pipelined_replicas_are_timed_through_the_engines_combine(serve, monkeypatch):
    """Stages add their activations' transfers (StepTimes.combine): a pipelined replica's
    spans are timed from the predicted replies of every socket, and still give the tables of
    one window per plan."""
    from rdu_cluster.engine import lookahead

    calls = []
    replies = lookahead.Predictor.replies
    monkeypatch.setattr(lookahead.Predictor, "replies",
                        lambda self, socks, spans: calls.append(1) or replies(self, socks, spans))
    kw = {**LIGHT, "plan": "tp4pp2", "n": 40}
    sim, ahead = serve(**kw)
    assert sim.lookahead and len(calls) > 40 and sim.windows < 10
    monkeypatch.setattr(Simulation, "_can_look_ahead", lambda self: False)
    _, one = serve(**kw)
    assert ahead.requests.equals(one.requests)
    assert _by_step(ahead.steps).equals(_by_step(one.steps))


def test_an_idle_replica_waits_for_the_next_arrival_within_the_window(serve, monkeypatch):
    """At 2 requests/s the replica is idle between requests: a timed window waits for the
    next arrival instead of ending (Window.resumes), and the steps after it start at the
    arrival, as the next window would have started them."""
    from rdu_cluster.engine import lookahead

    resumed = []
    idle = lookahead.Clock.idle

    def counted(self) -> bool:
        waited = idle(self)
        resumed.extend([1] if waited else [])
        return waited

    monkeypatch.setattr(lookahead.Clock, "idle", counted)
    kw = {"cluster": "sn40l-16", "plan": "tp16", "n": 30, "rate": 2.0, "seed": 11,
          "output": traces.LengthDist("uniform", 8, 64)}
    sim, ahead = serve(**kw)
    assert sim.windows <= 2 and len(resumed) > 20
    monkeypatch.setattr(Simulation, "_can_look_ahead", lambda self: False)
    sim_one, one = serve(**kw)
    assert sim_one.windows > 30
    assert ahead.requests.equals(one.requests)
    assert _by_step(ahead.steps).equals(_by_step(one.steps))
    _same_summary(ahead.summary, one.summary)


def test_step_ends_restart_from_each_resume():
    """ends: one sequential sum per stretch of steps, each from its own start; starts: the
    previous end, or the resume time."""
    from rdu_cluster.engine import lookahead

    d = np.random.default_rng(0).random(50) * 1e-3
    whole = np.cumsum(np.concatenate([[2.0], d]))[1:]
    assert np.array_equal(lookahead.ends(2.0, d), whole)
    e = lookahead.ends(2.0, d, [(20, 7.0), (35, 9.5)])
    assert np.array_equal(e[:20], whole[:20])
    assert np.array_equal(e[20:35], np.cumsum(np.concatenate([[7.0], d[20:35]]))[1:])
    assert np.array_equal(e[35:], np.cumsum(np.concatenate([[9.5], d[35:]]))[1:])
    s = lookahead.starts(2.0, e, [(20, 7.0), (35, 9.5)])
    assert s[0] == 2.0 and s[20] == 7.0 and s[35] == 9.5 and np.array_equal(s[21:35], e[20:34])


def test_prefix_copies_from_ddr_are_timed_as_the_sockets_time_them(monkeypatch):
    """Mooncake's shared blocks with a KV cache too small to keep them in HBM: admissions copy
    blocks up from DDR, whose exposed seconds the timed window adds through _combine."""
    from pathlib import Path

    import pyarrow.compute as pc

    from rdu_cluster.backends.local import LocalBackend
    from rdu_cluster.config import load_cluster
    from rdu_cluster.engine.prefix_cache import PrefixConfig
    from rdu_cluster.engine.schedulers import Limits
    from rdu_cluster.engine.simulation import ServeConfig
    from workloads.catalog import load_model

    trace = traces.read_trace(Path(__file__).resolve().parents[1] / "data" / "traces"
                              / "mooncake_conversation_200.jsonl")

    def run():
        config = ServeConfig(prefix=PrefixConfig("tiered"), kv_memory_fraction=0.002,
                             limits=Limits(max_batch=8, chunked_prefill=True))
        sim = Simulation(load_model("llama-3.1-70b"), load_cluster("sn40l-16"), trace, config,
                         LocalBackend())
        return sim, sim.run()

    sim, ahead = run()
    assert sim.lookahead and pc.sum(ahead.steps["prefix_copy_s"]).as_py() > 0
    monkeypatch.setattr(Simulation, "_can_look_ahead", lambda self: False)
    sim_one, one = run()
    assert sim_one.windows > sim.windows
    assert ahead.requests.equals(one.requests)
    assert _by_step(ahead.steps).equals(_by_step(one.steps))


def test_a_closed_loop_makes_each_request_when_it_is_sent(serve, monkeypatch):
    """--concurrency: request i is made once request i - N is through, not up front (the
    chains' first requests are made twice under a stateless policy: once to be routed)."""
    made = []
    request = Simulation._request

    def counting(self, i, **kw):
        made.append(i)
        return request(self, i, **kw)

    at_first_window = []
    monkeypatch.setattr(Simulation, "_request", counting)
    n, clients = 200, 4
    _, t = serve(cluster="sn40l-16", plan="tp4", n=n, rate=float("inf"), concurrency=clients,
                 hooks=[lambda sim, w: at_first_window.append(len(made)) if w == 1 else None],
                 output=traces.LengthDist("uniform", 4, 40))
    assert t.requests.num_rows == n and t.summary["served"] == n
    assert at_first_window[0] < n // 4
    assert sorted(set(made)) == list(range(n)) and len(made) == n + clients


def test_a_request_streams_in_every_decode_step_it_ran_and_its_prefill(serve, monkeypatch):
    """Request.emits counts decode runs in the replica's steps with decodes, so the prefill
    steps of later arrivals do not break them: a request never preempted holds its prefill's
    step and one decode run, and its chunk times are the ends of exactly those steps, read
    from the steps table (every step from its first token to its last with decodes in it:
    under prefill-first, a running sequence decodes in every decode step)."""
    from rdu_cluster.engine.finished import Finished

    seen = {}
    chunks = Finished._chunks

    def spy(self, r):
        seen[r.id] = (list(r.emits), r.first_token_step, r.done_step, r.preemptions,
                      chunks(self, r))
        return seen[r.id][-1]

    monkeypatch.setattr(Finished, "_chunks", spy)
    _, tables = serve(**{**LIGHT, "n": 60})
    steps = tables.steps.to_pydict()
    by_step = {(rep, s): (end, dec) for rep, s, end, dec in zip(
        steps["replica"], steps["step"],
        np.add(steps["start_s"], steps["time_s"]), steps["decode_tokens"])}
    requests = tables.requests.to_pydict()
    replica_of = dict(zip(requests["request_id"], requests["replica"]))
    broken = 0  # requests whose decodes other requests' prefill steps interrupted
    for rid, (emits, first, done, preemptions, got) in seen.items():
        if preemptions:
            continue
        rep = replica_of[rid]
        assert [(q, a < 0) for q, a, _ in emits] == [(rep, True), (rep, False)][:len(emits)]
        want = [by_step[(rep, first)][0]] + [
            by_step[(rep, s)][0] for s in range(first + 1, done + 1) if by_step[(rep, s)][1]]
        assert np.array_equal(got, want)
        broken += any(not by_step[(rep, s)][1] for s in range(first + 1, done + 1))
    assert broken > 10  # the runs did span other requests' prefill steps


def test_a_lockstep_policy_that_leaves_a_decode_out_is_caught(serve, monkeypatch):
    """Under a lockstep policy a sequence's chunks are one run while it decodes; a policy that
    declares lockstep and yet leaves a decoding sequence out of a step would give it chunks
    it never streamed, so the engine checks the count at every decode span."""
    from rdu_cluster.engine.schedulers.continuous import Continuous

    real = Continuous.step

    def step(self, view):
        plan = real(self, view)
        if len(plan.decode) > 1:  # the oldest sequence sits this step out
            plan.decode, plan.stands = plan.decode[1:], False
        return plan

    monkeypatch.setattr(Continuous, "step", step)
    with pytest.raises(RuntimeError, match="a lockstep policy decodes"):
        serve(**{**LIGHT, "n": 30})


def _same_summary(ahead: dict, one: dict) -> None:
    """Energy sums the sockets' windows (fewer, longer rows when timed): equal up to the order
    of that sum, as busy_s; every other figure bit for bit (the window count aside)."""
    assert ahead.keys() == one.keys()
    for k, v in one.items():
        if k == "windows":
            continue
        if any(w in k for w in ("energy", "power", "joules")) and isinstance(v, float):
            assert np.isclose(ahead[k], v, rtol=1e-12), k
        else:
            assert ahead[k] == v, k


@pytest.mark.parametrize("loop", ["clients", "sessions"])
def test_a_closed_loops_window_runs_through_its_arrivals_to_a_completions_return(loop):
    """Dispatcher.known_until: a closed loop routed up front keeps each chain (a client's
    requests, a session's turns) on its first one's replica, so what reaches a replica and is
    not known yet follows one of its own completions, by the least think time still to come:
    its window is timed as it is planned through the arrivals known (lookahead.Clock.back).
    The run is the same as without (each window ending at its first completion) in fewer
    windows; planned past a completion's return, a request not known as the window was
    planned arrives within it, and the run stops."""
    if loop == "sessions":
        spec = sessions.SessionSpec(16, 3, 256, user=traces.LengthDist("fixed", 1024),
                                    output=traces.LengthDist("uniform", 16, 96),
                                    think=sessions.ThinkTime("uniform", 0.05, 0.5))
        trace, config = traces.ramped(sessions.sessions(spec, 0), 0.3), ServeConfig(plan="tp4")
    else:
        trace = traces.synthetic(80, float("inf"), "poisson", traces.LengthDist("fixed", 1024),
                                 traces.LengthDist("uniform", 16, 96), seed=5)
        config = ServeConfig(plan="tp4", concurrency=6)

    def run():
        sim = Simulation(load_model("llama-3.1-8b"), load_cluster("sn40l-16"), trace, config,
                         LocalBackend())
        return sim.run(), sim.windows

    (timed, few), mp = run(), pytest.MonkeyPatch()
    with mp.context() as m:
        m.setattr(Simulation, "can_time", lambda self: False)
        cut, many = run()
    assert timed.requests.drop_columns(["energy_j", "cost_usd"]).equals(
        cut.requests.drop_columns(["energy_j", "cost_usd"]))
    assert _by_step(timed.steps).equals(_by_step(cut.steps))
    assert few < 0.6 * many  # clients 80 against 154, sessions 26 against 119
    with mp.context() as m:
        m.setattr(Dispatcher, "_bounds", lambda self, rep: (math.inf, math.inf))
        with pytest.raises(RuntimeError, match="not known as its replica's window"):
            run()
