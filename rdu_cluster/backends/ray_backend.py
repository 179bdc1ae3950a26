"""RayBackend: one Ray actor per socket, named and placed by the cluster layout.

- Placement: one placement-group bundle per simulated node, holding that node's socket actors,
  spread over the Ray nodes (SPREAD: best effort, so a laptop and a 16-node cluster both place).
  Each actor asks for cpus_per_actor = min(1, smallest Ray node's CPUs / sockets per node,
  all CPUs / sockets): 16 actors share a 2-core machine (0.125 CPU each) and take a whole CPU
  each where there are enough. A disaggregated run's pools each hold a backend: the sockets
  are the run's (`run_sockets`), so that the second pool's actors find CPUs left to them.
  Actors are named "<run>/node<N>/socket<II>[#incarnation]".
- Protocol: every command and result is msgpack bytes (backends/messages.py). A window's
  command goes to every socket of the replica. Sockets whose cost is provably equal (the
  symmetric sockets of a tensor-parallel group) are costed by one, the leader, which the driver
  waits for: one round trip per window. The others, followers, apply the same region ops to
  their own memory, but nothing the simulation decides depends on their replies (only their
  occupancy, for the sockets table), so their commands are queued and sent in batches
  (`run_many`, up to MAX_QUEUED at a time, and at `sync`). Every socket still applies every
  command, in order; on a 2-core machine a round trip to 16 actors costs about 13 ms and to one
  about 1.5 ms (measured with Ray 2.x, benchmarks/bench_serve.py), which is what the batching
  saves.
- Faults: once a socket has `checkpoint_every` commands since its last checkpoint, its next batch
  returns a checkpoint of its state, and the driver logs the commands since. An actor that dies
  (ray.kill, a lost node) is re-created, restored from its last checkpoint and replayed the
  logged commands, which also answers the replies it owed; each command carries a sequence
  number, so nothing is applied twice and nothing is lost. Every call that waits on an actor
  (start-up, batches and their checkpoints, faults, re-planning, counters) recovers this way,
  not only those awaiting a reply: an actor killed while idle is revived at its next call.
- Warm sockets: starting a socket actor starts a Ray worker process (about a second of CPU:
  Python, Ray, numpy), 10-18 s for 16 sockets on 2 cores, where the run itself may take one.
  Inside `with warm_sockets():` a closed backend's actors and placement group are kept, and the
  next run with the same layout (sockets per simulated node) reloads them with its own programs
  instead: a reloaded socket is built exactly as a new one is. Outside such a scope nothing is
  kept; kept actors hold their CPU share, so a run of another layout releases them first.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from chip.cost_tables import Spans
from chip.socket import Socket
from rdu_cluster.backends import SocketSetup, join_ray
from rdu_cluster.backends import messages as wire
from workloads.errors import ConfigError

CHECKPOINT_EVERY = 8
MAX_QUEUED = 32  # follower commands queued before they are sent (bounds the replay on a restart)
MAX_REVIVALS = 3  # an actor that dies this often in a row at one call is not a transient loss


class PendingOccupancy:
    """A socket's tier occupancy after a command, filled in when its reply is collected."""

    def __init__(self, values: dict | None = None):
        self.values = values

    def fill(self, values: dict) -> None:
        self.values = values

    def get(self, tier: str, default=None):
        if self.values is None:
            raise RuntimeError("occupancy read before the backend's sync()")
        return self.values.get(tier, default)


class SocketActor:
    """The actor body: a Socket behind a bytes-in, bytes-out interface."""

    def __init__(self, index: int, setup: SocketSetup):
        self.reload(index, setup)

    def reload(self, index: int, setup: SocketSetup) -> bytes:
        """Become socket `index` of a new run, as a new actor would be; its checkpoint."""
        self.socket = Socket(index, setup.chip, setup.program, setup.comm_time,
                             kv_scale=setup.kv_scale)
        self.socket.apply(setup.weights)
        self.socket.tables.warm()
        return self.checkpoint()

    def run_many(self, commands: list[bytes], checkpoint: bool) -> tuple[list[bytes], bytes | None]:
        """Apply the commands in order; a result each, and the state after the last if asked."""
        results = []
        for command in commands:
            seq, ops, spans = wire.unpack_command(command)
            rows, moves = self.socket.run(seq, ops, spans)
            results.append(wire.pack_result(rows, moves, self.socket.occupancy()))
        return results, (wire.pack(self.socket.checkpoint()) if checkpoint else None)

    def checkpoint(self) -> bytes:
        return wire.pack(self.socket.checkpoint())

    def restore(self, state: bytes) -> None:
        self.socket.restore(wire.unpack(state))

    def set_fault(self, degradation: float, comm: float, failed: bool) -> None:
        self.socket.set_degradation(degradation, comm, failed)

    def evaluations(self) -> int:
        return self.socket.tables.evaluations


class RayBackend:
    name = "ray"

    def __init__(self, address: str | None = None, checkpoint_every: int = CHECKPOINT_EVERY,
                 run_name: str | None = None, reuse: bool = True):
        import ray

        self.ray = ray
        self._owns_ray = False
        if not ray.is_initialized():
            # No address: an embedded instance ("local"), not whatever cluster Ray would
            # auto-detect on this machine, unless RAY_ADDRESS says which (ray job submit sets it).
            if address is None and not os.environ.get("RAY_ADDRESS"):
                address = "local"
            join_ray(address or os.environ.get("RAY_ADDRESS"), from_env=address is None,
                     include_dashboard=False,
                     log_to_driver=False, configure_logging=False)
            self._owns_ray = True
        self.run_name = run_name or f"rdu-{uuid.uuid4().hex[:8]}"
        self.reuse = reuse and not self._owns_ray  # kept actors die with our own Ray instance
        self.checkpoint_every = checkpoint_every
        self.actors: dict[int, Any] = {}  # Ray actor handles (ray has no types for them)
        self.pg: Any = None  # the run's placement group, made at start (or a kept rig's)
        self.setups: dict[int, SocketSetup] = {}
        self.incarnation: dict[int, int] = {}
        self.checkpoints: dict[int, bytes] = {}
        self.log: dict[int, list[tuple[int, bytes]]] = {}  # commands since the checkpoint
        self.restarts = 0
        self.replayed = 0  # commands replayed by restarted actors
        # the sockets of the whole run, where other backends hold some (a disaggregated run:
        # a backend a pool): the CPUs are shared out over all of them (_cpus_per_actor)
        self.run_sockets: int | None = None
        self.faults: dict[int, tuple] = {}
        self.queued: dict[int, list[tuple]] = {}  # socket -> [(seq, command, PendingOccupancy)]
        self.inflight: dict[int, list[tuple]] = {}  # socket -> [(queued batch, ref)]

    @property
    def workers(self) -> int:
        return len(self.ray.nodes())

    def start(self, setups: dict[int, SocketSetup]) -> None:
        self.setups = dict(setups)
        self.layout = tuple(sorted((i, s.node) for i, s in setups.items()))
        rig = _WARM.take(self.layout) if self.reuse and _WARM is not None else None
        for index in setups:
            self.log[index], self.queued[index], self.inflight[index] = [], [], []
        if rig is None:
            if _WARM is not None:
                _WARM.release()  # their CPU share, for this run's placement group
            self._place()
            for index in setups:
                self._create(index)
            refs = {index: actor.checkpoint.remote() for index, actor in self.actors.items()}
        else:
            self.pg, self.bundle_of, self.cpus, self.actors = rig
            refs = {i: a.reload.remote(i, setups[i]) for i, a in self.actors.items()}
        # every actor starts at once; one that dies while starting is created afresh
        for index, ref in refs.items():
            self.checkpoints[index] = self._call(index, "checkpoint", ref=ref)

    def _place(self) -> None:
        from ray.util.placement_group import placement_group

        nodes = sorted({s.node for s in self.setups.values()})
        per_node = max(sum(1 for s in self.setups.values() if s.node == n) for n in nodes)
        self.cpus = _cpus_per_actor(self.ray, max(len(self.setups), self.run_sockets or 0),
                                    per_node)
        bundles = [{"CPU": self.cpus * per_node} for _ in nodes]
        self.pg = placement_group(bundles, strategy="SPREAD")
        ready = self.ray.wait([self.pg.ready()], timeout=60)[0]
        if not ready:
            raise ConfigError(f"ray: cannot place {len(self.setups)} socket actors "
                              f"({bundles[0]} each)")
        self.bundle_of = {n: i for i, n in enumerate(nodes)}

    def _create(self, index: int) -> None:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        setup = self.setups[index]
        n = self.incarnation.get(index, 0)
        name = f"{self.run_name}/node{setup.node}/socket{index:02d}" + (f"#{n}" if n else "")
        cls = self.ray.remote(SocketActor)
        strategy = PlacementGroupSchedulingStrategy(
            self.pg, placement_group_bundle_index=self.bundle_of[setup.node]
        )
        self.actors[index] = cls.options(
            name=name, num_cpus=self.cpus, scheduling_strategy=strategy, max_concurrency=1
        ).remote(index, setup)

    def actor(self, index: int):
        return self.actors[index]

    def run(self, seq: int, ops: list, spans: Spans, loads: dict | None, sockets) -> dict:
        """One window: the leaders' replies now, the followers' commands queued (module doc)."""
        commands, leader = self._commands(seq, ops, spans, loads, sockets)
        occupancy = {i: PendingOccupancy() for i in sockets}
        for i in sockets:
            self.queued[i].append((seq, commands[i], occupancy[i]))
            self.log[i].append((seq, commands[i]))
        got = {i: self._resolve(i)[seq] for i in sorted(set(leader.values()))}
        for i in sockets:
            if len(self.queued[i]) >= MAX_QUEUED:
                self._collect(i)  # the previous batch: long done, so no wait in practice
                self._send(i)
        return {i: (*got[leader[i]][:2], occupancy[i]) for i in sockets}

    def _commands(self, seq, ops, spans, loads, sockets) -> tuple[dict, dict]:
        commands, leader, packed = {}, {}, {}
        seen: dict[tuple, int] = {}
        for i in sockets:
            load = loads.get(i) if loads else None
            lk = None if load is None else load.tobytes()
            key = (self.setups[i].program.key(), self.faults.get(i), lk)
            leader[i] = seen.setdefault(key, i)
            wire_key = lk if leader[i] == i else "ops-only"
            if wire_key not in packed:
                s = _EMPTY if leader[i] != i else (spans if load is None
                                                   else _with_load(spans, load))
                packed[wire_key] = wire.pack_command(seq, ops, s)
            commands[i] = packed[wire_key]
        return commands, leader

    def _send(self, index: int) -> None:
        """Send socket `index` its queued commands in one call (no wait)."""
        batch, self.queued[index] = self.queued[index], []
        if batch:
            checkpoint = len(self.log[index]) >= self.checkpoint_every
            ref = self.actors[index].run_many.remote([c for _, c, _ in batch], checkpoint)
            self.inflight[index].append((batch, ref))

    def _resolve(self, index: int) -> dict[int, tuple]:
        """Everything socket `index` owes, in order: {seq: (rows, moves, occupancy)}."""
        self._send(index)
        return self._collect(index)

    def _collect(self, index: int) -> dict[int, tuple]:
        """The replies to the batches sent to socket `index`. A dead actor is re-created and
        replayed, which answers the lost replies too."""
        inflight, self.inflight[index] = self.inflight[index], []
        if not inflight:
            return {}
        try:
            replies = self.ray.get([ref for _, ref in inflight])
        except self._dead:
            replies = self._recover(index, [[seq for seq, _, _ in b] for b, _ in inflight])
        out = {}
        for (batch, _), (results, state) in zip(inflight, replies, strict=True):
            for (seq, _, occ), result in zip(batch, results, strict=True):
                out[seq] = wire.unpack_result(result)
                occ.fill(out[seq][2])
            if state is not None:
                last = batch[-1][0]
                self.checkpoints[index] = state
                self.log[index] = [(s, c) for s, c in self.log[index] if s > last]
        return out

    def sync(self) -> None:
        # every socket's queue goes out before any reply is awaited, so the actors work on
        # their batches side by side rather than one round trip after another
        for index in self.actors:
            self._send(index)
        for index in self.actors:
            self._collect(index)

    @property
    def _dead(self) -> tuple[type[BaseException], ...]:
        return (self.ray.exceptions.RayActorError, self.ray.exceptions.ActorDiedError)

    def _call(self, index: int, method: str, *args, ref=None):
        """ray.get of one call to socket `index` (or of `ref`, a call already made). Every call
        that waits on an actor goes through here or through _collect: a dead actor (killed
        while idle, its node lost) is revived and the call made again -- at start-up, at a
        fault, at a checkpoint, at a re-plan."""
        for _ in range(MAX_REVIVALS):
            try:
                if ref is None:
                    ref = getattr(self.actors[index], method).remote(*args)
                return self.ray.get(ref)
            except self._dead:
                self._revive(index)
                ref = None
        raise ConfigError(f"ray: socket actor {index} died {MAX_REVIVALS} times in a row")

    def _recover(self, index: int, owed: list[list[int]]) -> list[tuple]:
        """Replies to the `owed` batches of sequence numbers of a dead actor, from the replay
        of its revival."""
        by_seq = self._revive(index)
        return [([by_seq[seq] for seq in batch], None) for batch in owed]

    def _revive(self, index: int) -> dict[int, bytes]:
        """Re-create a dead actor, restore its last checkpoint and replay the logged commands
        it was sent (those still queued go later, as new); {seq: result} of the replay, which
        ends with a checkpoint. Before its first checkpoint (start-up) it is just created."""
        self.restarts += 1
        self.incarnation[index] = self.incarnation.get(index, 0) + 1
        self._create(index)
        if index not in self.checkpoints:
            return {}
        queued = {seq for seq, _, _ in self.queued.get(index, ())}
        replay = [(seq, c) for seq, c in self.log[index] if seq not in queued]
        try:
            self.ray.get(self.actors[index].restore.remote(self.checkpoints[index]))
            results, state = self.ray.get(
                self.actors[index].run_many.remote([c for _, c in replay], True))
            if index in self.faults:  # a fault set after the checkpoint (it died in set_fault)
                self.ray.get(self.actors[index].set_fault.remote(*self.faults[index]))
        except self._dead:
            return self._revive(index)  # died again while reviving: once more
        self.replayed += len(replay)
        self.checkpoints[index] = state
        self.log[index] = [(seq, c) for seq, c in self.log[index] if seq in queued]
        return {seq: r for (seq, _), r in zip(replay, results, strict=True)}

    def reprogram(self, index: int, setup: SocketSetup) -> None:
        """A re-plan's new program for socket `index`: the actor reloads (as a new actor would
        be built, without starting a process), keeping only its command sequence number."""
        self._resolve(index)
        seq = wire.unpack(self._call(index, "checkpoint"))["seq"]
        self.setups[index] = setup
        self.checkpoints.pop(index, None)  # a new program: nothing of the old state to restore
        fresh = wire.unpack(self._call(index, "reload", index, setup))
        fresh["seq"] = seq
        self.checkpoints[index], self.log[index] = wire.pack(fresh), []
        self._call(index, "restore", self.checkpoints[index])

    def set_fault(self, index: int, degradation: float, comm: float, failed: bool) -> None:
        self._resolve(index)
        self.faults[index] = (degradation, comm, failed)
        self._call(index, "set_fault", degradation, comm, failed)
        self.checkpoints[index] = self._call(index, "checkpoint")
        self.log[index] = []

    def evaluations(self) -> int:
        return sum(self._call(index, "evaluations") for index in self.actors)

    def close(self) -> None:
        self.queued.clear()
        self.inflight.clear()
        if self.actors and self.reuse and _WARM is not None:
            _WARM.keep(self.layout, (self.pg, self.bundle_of, self.cpus, dict(self.actors)))
        elif self.actors or self.pg is not None:
            _release(self.ray, self.pg, self.actors)
        self.actors.clear()
        self.pg = None
        if self._owns_ray:
            self.ray.shutdown()


def _release(ray, pg, actors: dict) -> None:
    from ray.util.placement_group import remove_placement_group

    for actor in actors.values():
        ray.kill(actor)
    if pg is not None:
        remove_placement_group(pg)


@dataclass
class _Warm:
    """The actors and placement groups of closed runs, by layout, until a run takes them."""

    rigs: dict

    def take(self, layout: tuple):
        return self.rigs.pop(layout, None)

    def keep(self, layout: tuple, rig: tuple) -> None:
        if layout in self.rigs:
            self.release(layout)  # two runs of one layout closed in turn: keep the later's
        self.rigs[layout] = rig

    def release(self, layout: tuple | None = None) -> None:
        import ray

        for key in [layout] if layout is not None else list(self.rigs):
            pg, _, _, actors = self.rigs.pop(key)
            _release(ray, pg, actors)


_WARM: _Warm | None = None


@contextlib.contextmanager
def warm_sockets() -> Iterator[None]:
    """Keep socket actors between the RayBackend runs inside (module doc: Warm sockets); on
    leaving, every kept actor is killed and its placement group removed. A scope inside
    another takes over the outer one's kept actors (a run inside reloads them, where it would
    otherwise start a process a socket) and kills them on leaving like its own."""
    global _WARM
    outer = _WARM
    _WARM = _Warm(outer.rigs if outer is not None else {})
    if outer is not None:
        outer.rigs = {}
    try:
        yield
    finally:
        warm, _WARM = _WARM, outer
        warm.release()


def _cpus_per_actor(ray, sockets: int, per_node: int) -> float:
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    cpus = [n.get("Resources", {}).get("CPU", 0.0) for n in nodes]
    total, smallest = sum(cpus), min((c for c in cpus if c > 0), default=0.0)
    if total <= 0:
        raise ConfigError("ray: the cluster has no CPUs to place socket actors on")
    share = min(1.0, smallest / per_node, total / sockets)
    return float(np.floor(share * 1000) / 1000)


_Z = np.zeros(0, dtype=np.int64)
_EMPTY = Spans(_Z, _Z, _Z, _Z, _Z, _Z, _Z)


def _with_load(spans: Spans, load: np.ndarray) -> Spans:
    from dataclasses import replace

    return replace(spans, expert_load=load)
