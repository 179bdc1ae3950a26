"""Replica routing policies, by registry: which replica a request goes to when it arrives.

A policy is one module in this package that defines a class with a `name` and registers it
with `@register`; adding one is that module (the registry finds it) plus its test. The
interface:

    class MyPolicy:
        name = "my-policy"
        stateful = True   # False: the choice depends on the request alone (see below)

        def choose(self, request: Request, replicas: Sequence[ReplicaView]) -> int:
            ...           # the index into `replicas` (= ReplicaView.index)

`choose` is called once per request, at its arrival time, in event order (arrivals at equal
times in request-id order), and must be deterministic: a function of the request, the views
and the policy's own state (no clocks, no unseeded randomness; break ties by the lowest index).
It must not change the request or the views. A policy is built once per run: `get(name)`.

`ReplicaView` is a read-only snapshot of one replica at that instant:
- `outstanding`: the requests routed to it that have arrived and not yet finished (completed
  or refused), in routing order; a prefix-aware policy can read their prompts;
- `kv_used_blocks` / `kv_capacity_blocks` (block_tokens each): the KV cache in use during the
  step running at that instant (or after its last step when it is idle);
- `replica`: the engine's Replica, for policies that need more (its KV manager, its scheduler
  queues). Read it, never change it.

`stateful = False` (round-robin) lets the engine route the whole trace up front, so replicas
advance independently in long windows. A stateful policy couples replicas in time: the engine
then cuts every replica's unsaturated window at the next arrival anywhere, so each replica's
state at an arrival is what a step-by-step loop would show (engine/dispatch.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from rdu_cluster.engine.registry import Registry
from rdu_cluster.engine.requests import Request

DEFAULT = "round-robin"


@dataclass(frozen=True)
class ReplicaView:
    index: int
    outstanding: tuple[Request, ...]
    kv_used_blocks: int
    kv_capacity_blocks: int
    replica: Any = None

    @property
    def kv_used_fraction(self) -> float:
        return self.kv_used_blocks / self.kv_capacity_blocks if self.kv_capacity_blocks else 1.0


class RoutingPolicy(Protocol):
    name: str
    stateful: bool

    def choose(self, request: Request, replicas: Sequence[ReplicaView]) -> int: ...


REGISTRY = Registry("--routing", __name__)
register = REGISTRY.register
names = REGISTRY.names


def get(name: str) -> RoutingPolicy:
    return REGISTRY.cls(name)()


def least(replicas: Sequence[ReplicaView], key) -> int:
    """The replica with the smallest key; ties to the lowest index (deterministic)."""
    return min(replicas, key=lambda v: (key(v), v.index)).index

