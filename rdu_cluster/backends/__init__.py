"""Backends hold the sockets: `local` as plain objects, `ray` as one Ray actor per socket.

Both answer the same calls with the same values, bit for bit:
- start(setups): create the sockets ({index: SocketSetup});
- run(seq, ops, spans, loads, sockets): one command to each socket of a replica; `loads` maps a
  socket to its per-step expert loads (None: all 1). Returns {socket: (rows, moves, occupancy)};
  `occupancy` is a mapping tier -> bytes that may be filled in only by the next `sync()`;
- sync(): wait for every reply still owed (the run's time includes it);
- reprogram(index, setup): a socket gets a new program (a plan routed around a failure);
- set_fault(index, degradation, comm_degradation, failed); close().
"""

from __future__ import annotations

from dataclasses import dataclass

from chip.socket import CommTime, Program
from chip.spec import ChipSpec
from workloads.errors import ConfigError

BACKENDS = ("local", "ray")


@dataclass(frozen=True)
class SocketSetup:
    chip: ChipSpec
    program: Program
    comm_time: CommTime
    node: int = 0
    weights: tuple = ()  # region ops that load the weights at start: ["alloc", ...]
    kv_scale: float = 1.0  # the socket's KV bytes per byte of the replica's KV ops (Socket)


def probe_address(address: str | None, timeout_s: float = 2.0) -> None:
    """Fail fast on an explicit `host:port` (or `ray://host:port`) address that nothing listens
    on: ray.init would wait for its connect timeout (over a minute) first. 'auto', 'local' and
    None are left to Ray. One TCP connect, closed at once."""
    import socket

    if not address or address in ("auto", "local"):
        return
    hostport = address.split("://", 1)[-1].rstrip("/")
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit() or not host:
        return  # not host:port: Ray reports what it makes of it
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as e:
        reason = e.strerror or type(e).__name__
        raise ConfigError(f"--address {address}: no Ray cluster reachable there ({reason})") from None


def make(name: str, **kwargs):
    if name == "local":
        from rdu_cluster.backends.local import LocalBackend

        return LocalBackend()
    if name == "ray":
        from rdu_cluster.backends.ray_backend import RayBackend

        return RayBackend(**kwargs)
    raise ConfigError(f"--backend: unknown {name!r}; accepted: {', '.join(BACKENDS)}")
