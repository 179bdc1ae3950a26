"""Wire records, msgpack-encoded: driver <-> socket commands and results, and messages between
sockets (pipeline activations, all-to-all dispatch, KV transfers) with their delivery times.

numpy arrays travel as a msgpack extension (type 1: dtype, shape, raw little-endian bytes), so a
window of thousands of steps is a few array copies, not a list of floats. Both backends go
through the same encoding, so a result is bit-identical however it travelled.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import msgpack
import numpy as np

from chip.cost_tables import Spans
from interconnect.routes import route, route_latency
from partitioning.cluster import ClusterSpec
from partitioning.evaluate import topology_of

ND = 1


def _default(obj: Any):
    if isinstance(obj, np.ndarray):
        arr = np.ascontiguousarray(obj)
        head = msgpack.packb([arr.dtype.str, list(arr.shape)])
        return msgpack.ExtType(ND, head + arr.tobytes())
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"cannot encode {type(obj).__name__}")


def _ext_hook(code: int, data: bytes):
    if code != ND:
        return msgpack.ExtType(code, data)
    unpacker = msgpack.Unpacker()
    unpacker.feed(data)
    dtype, shape = next(unpacker)
    offset = unpacker.tell()
    return np.frombuffer(data, dtype=np.dtype(dtype), offset=offset).reshape(shape).copy()


def pack(obj: Any) -> bytes:
    return msgpack.packb(obj, default=_default, use_bin_type=True)


def unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, ext_hook=_ext_hook, raw=False, strict_map_key=False)


def pack_command(seq: int, ops: list, spans: Spans) -> bytes:
    cols = {f.name: getattr(spans, f.name) for f in fields(Spans)}
    return pack({"kind": "run", "seq": seq, "ops": ops, "spans": cols})


def unpack_command(data: bytes) -> tuple[int, list, Spans]:
    msg = unpack(data)
    return msg["seq"], msg["ops"], Spans(**msg["spans"])


def pack_result(rows: np.ndarray, moves: np.ndarray, occupancy: dict) -> bytes:
    return pack({"rows": rows, "moves": moves, "occupancy": occupancy})


def unpack_result(data: bytes) -> tuple[np.ndarray, np.ndarray, dict]:
    msg = unpack(data)
    return msg["rows"], msg["moves"], msg["occupancy"]


@dataclass(frozen=True)
class Message:
    """A transfer between sockets. `nbytes` may be a per-step array (one message a step)."""

    src: int
    dst: int
    kind: str  # "activations" | "dispatch" | "kv" | "drafts" | "verdict"
    nbytes: Any
    sent_s: Any = 0.0

    def encode(self) -> bytes:
        return pack([self.src, self.dst, self.kind, self.nbytes, self.sent_s])

    @classmethod
    def decode(cls, data: bytes) -> Message:
        return cls(*unpack(data))


class Router:
    """Delivery times over the interconnect's topology: the message takes the route the network
    model picks (shortest by latency), pays each hop's latency and streams at the route's
    narrowest link. Point-to-point stage messages do not share links with each other here (one
    activation tensor per stage boundary per step); collectives' sharing is costed by the
    interconnect inside each step."""

    def __init__(self, cluster: ClusterSpec):
        self.cluster = cluster
        self.topology = topology_of(cluster)

    def delivery_s(self, msg: Message) -> Any:
        r = route(self.topology, msg.src, msg.dst)
        if not r:
            return msg.sent_s + np.zeros(np.shape(msg.nbytes))
        bw = min(self.topology.links[i].bandwidth_bytes_per_s for i in r)
        latency = route_latency(self.topology, r)
        return msg.sent_s + latency + np.asarray(msg.nbytes, dtype=float) / bw

    def route(self, data: bytes) -> Any:
        """Deliver an encoded message: its arrival time(s)."""
        return self.delivery_s(Message.decode(data))
