"""A closed-loop run of replicas that are alike, computed from one replica of each kind.

With a stateless routing policy each closed-loop client is pinned to the replica its first
request is routed to (engine/dispatch.py: round-robin sends client c to replica c mod n), so
the replicas never interact: the run is n runs side by side. Where every request is the same
(fixed lengths, no content, no sessions) and nothing is drawn per replica (no expert routing,
speculation, Composition of Experts or faults), replica k differs from replica k' only in how
many clients it holds (N // n or one more) and when they start: client c starts at c x ramp / N
(traces.ramped), so replica k's clients start at (k + j n) ramp / N, replica 0's times shifted
by k ramp / N. Serving one replica of each kind (at most two) and adding the shift to its
times gives every replica's requests: the run's statistics (engine/bench.py, over the requests
of all replicas, warm-up and the steady window as the whole run takes them) and its energy
(each replica's steps plus idle draw to the run's end: energy.summary) without simulating the
n - 2 other replicas. Sessions (--sessions) are pinned as clients are, session s to replica s
mod n (its first turn routed round-robin, its later turns following it), and are alike where
every session is the same turn by turn and holds the same content but for its own chunks
(each replica's prefix cache then the same): replica 0's sessions 0, n, 2n ... are served as
the trace's first N // n (or one more), started n ramp / N apart (_sessions_alike). They
equal the whole run's to the rounding of the shifted times (tests/test_alike.py compares
them), except where a tie at one instant decides a count that capacity does not read (a
completion and the send it causes, which a shifted time may order the other way: the steady
window's request_throughput where a request completes at the window's last send; the output
throughput counts chunk times, shifted alike, so its ties hold). Its ITL statistics and
vLLM's peak figures are None: a summary-only run takes neither (bench.Measured.lean).
`rdu-cluster serve` of the same arguments runs the whole.

Used by capacity's verification (scenarios/capacity/verification.py), where a candidate of 20 replicas
was 20 replicas simulated alike, run after run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from partitioning.cluster import ClusterSpec
from rdu_cluster.engine import bench, replica_routing, spill
from rdu_cluster.engine import plan as plans
from rdu_cluster.engine import summary as summaries
from rdu_cluster.engine.simulation import ServeConfig, Simulation
from workloads.spec import ModelSpec
from workloads.traces import Trace, per_trace


@dataclass(frozen=True)
class Kind:
    """Replicas holding `clients` clients each: their indices in the whole run."""

    clients: int
    replicas: tuple[int, ...]


def kinds(replicas: int, clients: int) -> list[Kind]:
    """Round-robin pins client c to replica c mod n: the first N mod n replicas hold one
    client more."""
    q, r = divmod(clients, replicas)
    out = [Kind(q + 1, tuple(range(r)))] if r else []
    return out + ([Kind(q, tuple(range(r, replicas)))] if q else [])


def applies(model: ModelSpec, whole: ClusterSpec, one: ClusterSpec, trace: Trace,
            config: ServeConfig, replicas: int, ramp_s: float) -> bool:
    """Whether the run of `replicas` replicas on `whole` is its replicas alike (see the module
    doc), `one` being the cluster of one replica, laid out as each replica of `whole` is."""
    if replica_routing.get(config.routing).stateful or config.speculation is not None \
            or config.coe is not None or config.faults or trace.model is not None:
        return False
    if plans.PlanSpec.parse(config.plan, whole, model).ep > 1:  # expert loads drawn per replica
        return False
    if trace.session is not None:
        if not _sessions_alike(trace, config, replicas, ramp_s):
            return False
    elif not _clients_alike(trace, config, replicas, ramp_s):
        return False
    # each replica within its own node(s), on the same node network as in the whole cluster
    # (a replica within one node uses no inter-node fabric, which the whole cluster adds; and
    # in a node whose routes cross only their own sockets' links, a full mesh or a switch,
    # they do not depend on how many sockets share it: interconnect.alone_layout costs its
    # collectives on a node of just its sockets either way)
    g, per_node = one.sockets, whole.sockets_per_node
    if g % per_node and per_node % g:
        return False  # a replica across a node boundary
    topo = whole.topology
    if g <= per_node:
        topo = replace(topo, inter_node_bandwidth_bytes_per_s=(
            one.topology.inter_node_bandwidth_bytes_per_s),
            inter_node_latency_s=one.topology.inter_node_latency_s)
    direct = topo.direct and g <= per_node
    return one.topology == topo and (direct or one.sockets_per_node == per_node)


def _clients_alike(trace: Trace, config: ServeConfig, replicas: int, ramp_s: float) -> bool:
    """--concurrency: every request the same, client i starting at i x ramp / N."""
    n, clients = len(trace), config.concurrency
    if clients is None or replicas < 2 or clients < replicas or n % clients:
        return False
    if trace.content is not None or trace.after is not None:
        return False
    same = lambda a: bool((a == a[0]).all())
    starts = np.arange(clients) * ramp_s / clients if ramp_s else np.zeros(clients)
    return (same(trace.prompt_len) and same(trace.output_len)
            and np.array_equal(trace.arrival_s[:clients], starts)
            and not trace.arrival_s[clients:].any())


def _sessions_alike(trace: Trace, config: ServeConfig, replicas: int, ramp_s: float) -> bool:
    """--sessions: a stateless policy pins session s to replica s mod n (its first turn is
    routed round-robin, the later ones follow it: engine/dispatch.py), so the replicas never
    interact. They are alike where every session is the same turn by turn (prompt, output and
    think time; rows session by session, as workloads/sessions.py lays them out), session s
    starts at s x ramp / N (traces.ramped) and its content is every other session's but for
    the chunks only it holds (the system prompt's shared): each replica's prefix cache then
    holds the same lengths, hit for hit."""
    n, session = len(trace), trace.session
    if config.concurrency is not None or trace.after is None or session is None or not n:
        return False
    sessions = int(session.max()) + 1
    if n % sessions or sessions < replicas or replicas < 2:
        return False
    turns = n // sessions
    rows = np.arange(n)
    if not (np.array_equal(session, rows // turns)
            and np.array_equal(trace.after, np.where(rows % turns == 0, -1, rows - 1))):
        return False
    grid = lambda a: np.asarray(a).reshape(sessions, turns)
    same = lambda a: bool((grid(a) == grid(a)[0]).all())
    starts = np.repeat(np.arange(sessions) * ramp_s / sessions if ramp_s
                       else np.zeros(sessions), turns)
    if not (same(trace.prompt_len) and same(trace.output_len)
            and (trace.think_s is None or same(trace.think_s))
            and np.array_equal(trace.arrival_s, starts)):
        return False
    return trace.content is None or _content_alike(trace, sessions, turns)


@per_trace()
def _content_alike(trace: Trace, sessions: int, turns: int) -> bool:
    """Whether each session's chunks are session 0's, its own ids renamed (an id in two
    sessions is shared and kept). Once a trace: capacity asks it of every run (a pass over
    each turn's chunks, ~4 ms for 2,000 turns)."""
    content = trace.content or ()
    owner: dict = {}
    for i, chunks in enumerate(content):
        for cid, _ in chunks:
            if owner.setdefault(cid, i // turns) != i // turns:
                owner[cid] = None  # shared
    first = None
    for s in range(sessions):
        names: dict = {}
        form = tuple(tuple((cid if owner[cid] is None else names.setdefault(cid, len(names)),
                            tokens) for cid, tokens in content[s * turns + t])
                     for t in range(turns))
        if first is None:
            first = form
        elif form != first:
            return False
    return True


def run(model: ModelSpec, whole: ClusterSpec, one: ClusterSpec, trace: Trace,
        config: ServeConfig, backend: Callable[[], object], replicas: int,
        ramp_s: float) -> dict:
    """The summary of the whole run (its keys capacity reads: bench, requests, served,
    unserved, makespan_s, output_tokens, energy_j, joules_per_token), from one replica of each
    kind; `applies` must hold."""
    sessions = trace.session is not None
    clients = int(trace.session.max()) + 1 if trace.session is not None else config.concurrency
    assert clients is not None  # applies: a closed loop
    per_client = len(trace) // clients
    step = ramp_s / clients  # between successive clients' starts
    parts, sims, ends = [], [], []
    counts: dict[str, int] = {}
    busy_j, idle_w = 0.0, None
    try:
        for kind in kinds(replicas, clients):
            m = kind.clients * per_client
            starts = np.arange(kind.clients) * replicas * step
            if sessions:  # the first sessions (alike), as a replica's own start over the ramp
                sub = _rows(trace, m, arrival_s=np.repeat(starts, per_client))
                sub_config = config
            else:
                arrival = np.zeros(m)
                arrival[: kind.clients] = starts
                sub = _rows(trace, m, arrival_s=arrival)
                sub_config = replace(config, concurrency=kind.clients)
            sim = Simulation(model, one, sub, sub_config, backend)
            sim.keep_measured = True  # its chunk times, read by _merge
            sim.summary_only = True
            sims.append(sim)
            s = sim.run().summary
            shifts = [k * step for k in kind.replicas]
            parts.append((summaries.measured(sim, sim.finished.summary_columns()), shifts))
            ends += [s["makespan_s"] + x for x in shifts]
            for key in ("served", "unserved", "output_tokens"):
                counts[key] = counts.get(key, 0) + s[key] * len(shifts)
            idle_w = sim.rates.idle_w
            if idle_w is not None:  # its steps' energy: its idle draw to its own end out
                busy_j += (s["energy_j"] - idle_w * one.sockets * s["makespan_s"]) * len(shifts)
        end = max(ends)
        merged = _merge(parts)
        stats = bench.summary(merged, end, config.metrics)
        merged.chunk_s.close()
    finally:
        for sim in sims:
            sim.finished.drop()
    energy = None if idle_w is None else busy_j + idle_w * one.sockets * replicas * end
    tokens = counts["output_tokens"]
    return {"requests": len(trace), **counts, "makespan_s": end, "energy_j": energy,
            "joules_per_token": energy / tokens if energy is not None and tokens else None,
            "bench": stats, "replicas_simulated": len(parts)}


def _rows(trace: Trace, m: int, **columns) -> Trace:
    """The trace's first m rows (every per-row column cut), with `columns` replaced."""
    cut = {k: v[:m] for k in ("prompt_len", "output_len", "session", "after", "think_s",
                              "content") if (v := getattr(trace, k)) is not None}
    return replace(trace, **(cut | columns))


def _merge(parts: list[tuple[bench.Measured, list[float]]]) -> bench.Measured:
    """Every replica's requests: each kind's, once per replica of that kind, its send and
    chunk times shifted by that replica's start."""
    cols: dict[str, list] = {k: [] for k in ("send", "ttft", "e2el", "out", "prompt", "n")}
    chunk_s = spill.Spill()
    for m, shifts in parts:
        for x in shifts:
            cols["send"].append(m.send_s + x)
            cols["ttft"].append(m.ttft_s)
            cols["e2el"].append(m.e2el_s)
            cols["out"].append(m.output_len)
            cols["prompt"].append(m.prompt_len)
            cols["n"].append(m.chunks)
            for c in m.chunk_s.chunks():
                chunk_s.extend(c + x)
    cat = lambda k: np.concatenate(cols[k])
    return bench.Measured(cat("send"), cat("ttft"), cat("e2el"), cat("out"), cat("prompt"),
                          None, chunk_s, cat("n"))  # summary-only runs: no ITLs


__all__ = ["Kind", "applies", "kinds", "run"]
