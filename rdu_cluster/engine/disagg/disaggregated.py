"""A disaggregated run: a prefill pool and a decode pool (pools.py) served in one event loop
(loop.run_coupled) through their hand-over (handover.py), into one set of tables (tables.py);
with `keep`, a closed loop's checkpoint to serve more requests from (`continued`), and with a
watch, stopped once its verdict is certain (engine/decided.py)."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, cast

import numpy as np

from rdu_cluster.backends import Backend
from rdu_cluster.config import FabricSpec
from rdu_cluster.engine import checkpoint, decided, loop, replica_routing
from rdu_cluster.engine.checkpoint import Checkpoint
from rdu_cluster.engine.disagg.handover import DecodeSide, Handover, PrefillSide
from rdu_cluster.engine.disagg.pools import Pool, kv_flows
from rdu_cluster.engine.disagg.tables import combine
from rdu_cluster.engine.simulation import ServeConfig, Simulation, Tables
from rdu_cluster.scenarios.speculative import resolve_draft
from workloads import graph
from workloads.errors import ConfigError
from workloads.spec import ModelSpec
from workloads.traces import Trace


@dataclass
class Disaggregated:
    model: ModelSpec
    prefill: Pool
    decode: Pool
    fabric: FabricSpec
    trace: Trace
    config: ServeConfig
    backend: Callable[[], object]  # a new backend for each pool
    progress: Callable[[int, int], None] | None = None
    summary_only: bool = False  # Simulation.summary_only, in both pools
    watch: decided.Watch | None = None  # stop once the verdict is certain (engine/decided.py)
    keep: bool = False  # keep a checkpoint to serve more requests from (continued)
    # each pool's execution options (prefill, decode: a GPU pool's serving stack beside an RDU
    # pool's own, serving_stacks.pool_options); None: config.options in both
    options: tuple[Any, Any] | None = None
    # each pool's Simulation.observers (a timeline: output/timeline.py); one with `pool(sim,
    # name, index)` is told which pool each is, one with `handover(...)` each KV hand-over
    observers: list = field(default_factory=list)

    def __post_init__(self) -> None:
        c = self.config
        if c.faults or c.coe is not None:
            raise ConfigError("--prefill-pool/--decode-pool: not with --fault or --coe-experts")
        if c.speculation is not None and c.draft_placement != "shared":
            raise ConfigError(f"--draft-placement {c.draft_placement}: not with --prefill-pool/"
                              "--decode-pool (the draft shares each pool's sockets)")
        if replica_routing.get(self.config.routing).stateful:
            raise ConfigError(f"--routing {self.config.routing}: not with --prefill-pool/"
                              "--decode-pool (each pool deals its requests round-robin: a "
                              "request's decode replica is chosen as its prefill ends)")
        self.clusters = (self.prefill.spec(self.model, self.fabric),
                         self.decode.spec(self.model, self.fabric))
        # a token's KV handed over: the target's, and with a draft its own (the prefill pool
        # prefills the prompt in both, as SGLang's and vLLM's disaggregated speculative
        # decoding do; the decode pool drafts and verifies)
        draft = (resolve_draft(cast(str, c.draft), self.model) if c.speculation is not None
                 else None)
        self.kv_per_token = float(graph.kv_cache_bytes(self.model, 1, 1)) + (
            0.0 if draft is None else float(graph.kv_cache_bytes(draft, 1, 1)))
        self.checkpoint: Checkpoint | None = None
        self._resume: tuple[list, int] | None = None  # a kept run's event queue and count

    @property
    def pool_options(self) -> tuple[Any, Any]:
        """The execution options each pool runs with, prefill first."""
        return self.options or (self.config.options, self.config.options)

    def _pool_backend(self) -> Backend:
        """A pool's backend: a machine it shares out is the run's, both pools' sockets."""
        b = cast(Backend, self.backend())
        b.run_sockets = sum(c.sockets for c in self.clusters)
        return b

    def run(self) -> Tables:
        """Both pools in one event loop (loop.run_coupled): the prefill pool sends each
        request on as its prefill ends (Handover), the decode pool's completions send a closed
        loop's next request to the prefill pool. With `keep`, a closed loop of clients keeps
        the checkpoint (`checkpoint`) from which `continued` serves more requests."""
        t, c = self.trace, self.config
        pre = Simulation(self.model, self.clusters[0], replace(
            t, output_len=np.ones(len(t), dtype=np.int64)), replace(
                c, plan=self.prefill.plan, options=self.pool_options[0]),
            self._pool_backend())
        dec = Simulation(self.model, self.clusters[1], Trace(
            np.zeros(len(t)), t.prompt_len, t.output_len, source=t.source),
            replace(c, plan=self.decode.plan, concurrency=None, options=self.pool_options[1]),
            self._pool_backend(), self.progress)
        pre.summary_only = dec.summary_only = self.summary_only
        sent = np.maximum(t.prompt_len - 1, 0)  # the decode side recomputes the last
        dec.received = sent
        hand = Handover(pre, dec, self._flows(pre, dec), sent * self.kv_per_token)
        pre.dispatch = PrefillSide(c.routing, c.concurrency, hand)
        dec.dispatch = DecodeSide(c.routing, None, hand)
        self.sims, self.hand = (pre, dec), hand
        for i, (sim, name) in enumerate(((pre, "prefill"), (dec, "decode"))):
            sim.observers += self.observers
            for obs in self.observers:
                if hasattr(obs, "pool"):
                    obs.pool(sim, name, i)
        hand.observers = [o for o in self.observers if hasattr(o, "handover")]
        hand.shift = {} if self.watch is not None else None
        self._watch(self.watch)
        started = time.perf_counter()
        try:
            for sim in self.sims:
                sim.start()
            hand.start()
            # each pool's arrivals are known up to its frontier (known_until); a request
            # refused as it arrives would send the next one at the window's start
            dec.lookahead = False
            for sim in self.sims:
                if hand.direct is None and sim.can_time():
                    sim.look_ahead()
        except BaseException:
            self._close()
            raise
        return self._loop([(0, e) for e in pre.initial_events()], None, started)

    def kept(self) -> Disaggregated | None:
        """The run as its checkpoint kept it (with `keep`, a closed loop of clients: None
        where none was taken, engine/checkpoint.py), to go on with more requests
        (`continued`)."""
        cp = self.checkpoint
        if cp is None or cp.state is None:
            return None
        paused, heap, order = cp.state
        paused._resume = (heap, order)
        return paused

    def _watch(self, watch: decided.Watch | None) -> None:
        """The run stops once `watch` is certain of its verdict (None: served to its end): it
        watches the sends to the prefill pool and the first tokens and completions of the
        decode pool; with `keep`, it raises at the end of its event (Watch.defer), where the
        run can be kept."""
        pre, dec = self.sims
        hand = self.hand
        self.watch = pre.dispatch.watch = hand.watch = watch
        dec.finished.watch = None
        if watch is not None:
            watch.waits = True  # told of each first token: TTFTs certain as they wait
            watch.defer = self.keep
            dec.finished.watch = decided.completions(watch, hand.shift)

    def _pending(self) -> decided.Decided | None:
        return None if self.watch is None else self.watch.pending

    def continues(self, trace: Trace, watch: decided.Watch | None = None) -> bool:
        """Whether `continued` serves `trace` from this kept run: `trace` its requests and
        more, none shorter or longer than they are (what the frontier and the hand-over
        assume: prefill_bound.least_prefill, Handover.least_move); with `watch`, a run
        stopped once its verdict is certain, where this run was watched and `watch` takes it
        up as it would have watched from the start (Watch.goes_on)."""
        t, n = self.trace, len(self.trace)
        if watch is not None and (self.watch is None or not watch.goes_on(self.watch)):
            return False
        return (self._resume is not None and len(trace) > n and trace.after is None
                and trace.content is None and trace.model is None and t.model is None
                and all(np.array_equal(getattr(trace, k)[:n], getattr(t, k))
                        for k in ("arrival_s", "prompt_len", "output_len"))
                and all(f(getattr(trace, k)) == f(getattr(t, k)) for f in (np.min, np.max)
                        for k in ("prompt_len", "output_len")))

    def continued(self, trace: Trace, watch: decided.Watch | None = None) -> Tables:
        """The run of `trace` (continues) from this kept run: the tables a run of it from the
        start gives (engine/checkpoint.py), or with `watch` its verdict where it stops once
        certain (Decided, as from the start); it keeps a checkpoint of its own where this one
        did (kept). Once: the run goes on from here."""
        if not self.continues(trace, watch):
            raise ValueError("continued: this run does not continue to that trace")
        resume, self._resume = self._resume, None
        old = self.watch
        self._extend(trace)
        if watch is not None and old is not None:  # (continues: a watched run has one)
            watch.take_up(old)
        else:
            self.hand.shift = None
        self._watch(watch)
        return self._loop([], resume, time.perf_counter())

    def _extend(self, t: Trace) -> None:
        """This (copied) run's trace continued to `t`: the per-request arrays and the closed
        loop's requests to send."""
        pre, dec = self.sims
        hand, n = self.hand, len(t)
        self.trace = t
        pre.trace = pre.build.trace = replace(t, output_len=np.ones(n, dtype=np.int64))
        dec.trace = dec.build.trace = Trace(np.zeros(n), t.prompt_len, t.output_len,
                                            source=t.source)
        sent = np.maximum(t.prompt_len - 1, 0)
        dec.received, hand.bytes_of = sent, sent * self.kv_per_token
        grown = np.zeros(n - len(hand.move))
        hand.move, hand.nbytes = (np.concatenate([a, grown]) for a in (hand.move, hand.nbytes))
        experts, ready = dec._routing()
        hand.make = functools.partial(dec._request, experts=experts, ready=ready)
        experts, ready = pre._routing()
        pre.dispatch.extend(functools.partial(pre._request, experts=experts, ready=ready), n)

    def _loop(self, events: list, resume: tuple | None, started: float) -> Tables:
        """Run the loop (from `resume`: an event queue and its count) and build the tables."""
        pre, dec = self.sims
        t, c = self.trace, self.config
        cp = None
        if (self.keep and c.concurrency is not None and t.after is None
                and all(getattr(s.backend, "name", "") == "local" for s in self.sims)):
            cp = pre.dispatch.checkpoint = Checkpoint(len(t) - c.concurrency,
                                                      pre.dispatch.plans_hold)
        try:
            ran = time.perf_counter()
            try:
                end = loop.run_coupled(self.sims, events, self.hand.take, cp, self,
                                       self._shared, resume,
                                       self._pending if self.watch and self.watch.defer
                                       else None)
            finally:  # a run stopped as certain (Decided) keeps the copy it took
                self.checkpoint = cp
            for sim in self.sims:  # each pool is made with its backend (run)
                cast(Backend, sim.backend).sync()
            built = time.perf_counter()
            p_tables, d_tables = pre.tables(end), dec.tables(end)
            out = combine(self, p_tables, d_tables, np.arange(len(t)), self.hand.move,
                          self.hand.nbytes)
            done = time.perf_counter()
        finally:
            closing = time.perf_counter()
            self._close()
        self.wall = {"start_s": ran - started, "run_s": built - ran, "tables_s": done - built,
                     "close_s": time.perf_counter() - closing}
        return out

    def _close(self) -> None:
        # the decode pool's backend first: the prefill pool's, made first, may own the Ray
        # instance both pools' actors live in (RayBackend: the one that started it stops it)
        for sim in reversed(self.sims):
            sim.finished.drop()
            cast(Backend, sim.backend).close()

    def _shared(self) -> list:
        """What a checkpoint's copy shares with the run: the cost tables, the model and the
        trace (none of which a run changes)."""
        return [*checkpoint.shared_tables([s.backend for s in self.sims]), self.model,
                self.trace, *self.clusters, self.config, self.fabric]

    def _flows(self, pre: Simulation, dec: Simulation) -> tuple[int, int, float, float]:
        """(senders, receivers, latency, slowest flow's rate) of a replica-to-replica
        hand-over (transfer_time)."""
        ps, ds = pre.plan, dec.plan
        senders, receivers = ps.tp * ps.pp, ds.tp * ds.pp
        return (senders, receivers, *kv_flows(self.fabric, senders, receivers))
