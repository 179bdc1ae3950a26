"""ClusterSpec: sockets of one chip kind joined by one topology."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from chip.spec import ChipSpec
from interconnect.topology import TopologySpec


@dataclass(frozen=True)
class ClusterSpec:
    name: str
    chip: ChipSpec
    sockets: int
    sockets_per_node: int
    topology: TopologySpec
    description: str = ""
    source: str = ""
    cost: Mapping[str, Any] = field(default_factory=dict)  # [cost] table: rdu_cluster/scenarios/economics.py

    @property
    def nodes(self) -> int:
        return -(-self.sockets // self.sockets_per_node)

    def node_of(self, socket: int) -> int:
        return socket // self.sockets_per_node
