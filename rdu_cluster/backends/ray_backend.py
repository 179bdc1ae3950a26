"""RayBackend: one Ray actor per socket, named and placed by the cluster layout.

- Placement: one placement-group bundle per simulated node, holding that node's socket actors,
  spread over the Ray nodes (SPREAD: best effort, so a laptop and a 16-node cluster both place).
  Each actor asks for cpus_per_actor = min(1, smallest Ray node's CPUs / sockets per node,
  all CPUs / sockets): 16 actors share a 2-core machine (0.125 CPU each) and take a whole CPU
  each where there are enough. Actors are named "<run>/node<N>/socket<II>[#incarnation]".
- Protocol: every command and result is msgpack bytes (backends/messages.py). One round trip per
  window of spans, all sockets of a replica in parallel.
- Faults: every `checkpoint_every` commands the actors return a checkpoint of their state with
  their result, and the driver logs the commands since. An actor that dies (ray.kill, a lost
  node) is re-created, restored from its last checkpoint and replayed the logged commands; each
  command carries a sequence number, so nothing is applied twice and nothing is lost.
"""

from __future__ import annotations

import os
import uuid

import numpy as np

from chip.socket import Socket, Spans
from rdu_cluster.backends import SocketSetup, probe_address
from rdu_cluster.backends import messages as wire
from workloads.errors import ConfigError

CHECKPOINT_EVERY = 8


class SocketActor:
    """The actor body: a Socket behind a bytes-in, bytes-out interface."""

    def __init__(self, index: int, setup: SocketSetup):
        self.socket = Socket(index, setup.chip, setup.program, setup.comm_time)
        self.socket.apply(setup.weights)
        self.socket.tables.warm()

    def run(self, command: bytes, checkpoint: bool) -> tuple[bytes, bytes | None]:
        seq, ops, spans = wire.unpack_command(command)
        rows, moves = self.socket.run(seq, ops, spans)
        result = wire.pack_result(rows, moves, self.socket.occupancy())
        return result, (wire.pack(self.socket.checkpoint()) if checkpoint else None)

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
                 run_name: str | None = None):
        import ray

        self.ray = ray
        self._owns_ray = False
        if not ray.is_initialized():
            # No address: an embedded instance ("local"), not whatever cluster Ray would
            # auto-detect on this machine, unless RAY_ADDRESS says which (ray job submit sets it).
            if address is None and not os.environ.get("RAY_ADDRESS"):
                address = "local"
            probe_address(address or os.environ.get("RAY_ADDRESS"))
            try:
                ray.init(address=address, include_dashboard=False, log_to_driver=False,
                         configure_logging=False)
            except (ConnectionError, ValueError, RuntimeError) as e:
                reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                raise ConfigError(f"--address {address}: cannot join Ray ({reason})") from None
            self._owns_ray = True
        self.run_name = run_name or f"rdu-{uuid.uuid4().hex[:8]}"
        self.checkpoint_every = checkpoint_every
        self.actors: dict[int, object] = {}
        self.setups: dict[int, SocketSetup] = {}
        self.incarnation: dict[int, int] = {}
        self.checkpoints: dict[int, bytes] = {}
        self.log: dict[int, list[bytes]] = {}
        self.restarts = 0
        self._calls = 0
        self.faults: dict[int, tuple] = {}

    @property
    def workers(self) -> int:
        return len(self.ray.nodes())

    def start(self, setups: dict[int, SocketSetup]) -> None:
        from ray.util.placement_group import placement_group

        self.setups = dict(setups)
        nodes = sorted({s.node for s in setups.values()})
        per_node = max(sum(1 for s in setups.values() if s.node == n) for n in nodes)
        self.cpus = _cpus_per_actor(self.ray, len(setups), per_node)
        bundles = [{"CPU": self.cpus * per_node} for _ in nodes]
        self.pg = placement_group(bundles, strategy="SPREAD")
        ready = self.ray.wait([self.pg.ready()], timeout=60)[0]
        if not ready:
            raise ConfigError(f"ray: cannot place {len(setups)} socket actors ({bundles[0]} each)")
        self.bundle_of = {n: i for i, n in enumerate(nodes)}
        for index in setups:
            self._create(index)
        self.ray.get([a.checkpoint.remote() for a in self.actors.values()])  # all up
        for index, actor in self.actors.items():
            self.checkpoints[index] = self.ray.get(actor.checkpoint.remote())
            self.log[index] = []

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
        """One round trip. Sockets whose cost is provably equal (same program key, same
        degradation, same expert loads: the symmetric sockets of a tensor-parallel group) are
        costed by one of them; the others get the region ops only, so each keeps its own state.
        Asymmetric sockets (MoE loads, a degraded socket) each cost their own steps."""
        self._calls += 1
        checkpoint = self._calls % self.checkpoint_every == 0
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
        futures = {i: self.actors[i].run.remote(commands[i], checkpoint) for i in sockets}
        try:
            got = dict(zip(futures, self.ray.get(list(futures.values())), strict=True))
        except (self.ray.exceptions.RayActorError, self.ray.exceptions.ActorDiedError):
            got = {i: self._get(i, f, commands[i], checkpoint) for i, f in futures.items()}
        raw = {}
        for i in sockets:
            result, state = got[i]
            if state is not None:
                self.checkpoints[i], self.log[i] = state, []
            else:
                self.log[i].append(commands[i])
            raw[i] = wire.unpack_result(result)
        return {i: (raw[leader[i]][0], raw[leader[i]][1], raw[i][2]) for i in sockets}

    def _get(self, index: int, future, command: bytes, checkpoint: bool):
        try:
            return self.ray.get(future)
        except (self.ray.exceptions.RayActorError, self.ray.exceptions.ActorDiedError):
            self._recover(index)
            return self.ray.get(self.actors[index].run.remote(command, checkpoint))

    def _recover(self, index: int) -> None:
        """Re-create a dead actor from its last checkpoint and replay the commands since."""
        self.restarts += 1
        self.incarnation[index] = self.incarnation.get(index, 0) + 1
        self._create(index)
        actor = self.actors[index]
        self.ray.get(actor.restore.remote(self.checkpoints[index]))
        for command in self.log[index]:
            self.ray.get(actor.run.remote(command, False))

    def reprogram(self, index: int, setup: SocketSetup) -> None:
        state = self.ray.get(self.actors[index].checkpoint.remote())
        self.ray.kill(self.actors[index])
        self.setups[index] = setup
        self.incarnation[index] = self.incarnation.get(index, 0) + 1
        self._create(index)
        seq = wire.unpack(state)["seq"]
        fresh = wire.unpack(self.ray.get(self.actors[index].checkpoint.remote()))
        fresh["seq"] = seq
        self.ray.get(self.actors[index].restore.remote(wire.pack(fresh)))
        self.checkpoints[index], self.log[index] = wire.pack(fresh), []

    def set_fault(self, index: int, degradation: float, comm: float, failed: bool) -> None:
        self.faults[index] = (degradation, comm, failed)
        self.ray.get(self.actors[index].set_fault.remote(degradation, comm, failed))
        self.checkpoints[index] = self.ray.get(self.actors[index].checkpoint.remote())
        self.log[index] = []

    def sync(self) -> None:
        pass

    def evaluations(self) -> int:
        return sum(self.ray.get([a.evaluations.remote() for a in self.actors.values()]))

    def close(self) -> None:
        from ray.util.placement_group import remove_placement_group

        for actor in self.actors.values():
            self.ray.kill(actor)
        self.actors.clear()
        if getattr(self, "pg", None) is not None:
            remove_placement_group(self.pg)
        if self._owns_ray:
            self.ray.shutdown()


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
