"""Simulated hardware faults: a socket or a link marked failed or degraded at a time.

Syntax (--fault, repeatable): socket:3@2.5 (fails at 2.5 s), socket:3@2.5:degraded:0.5 (runs at
half speed from 2.5 s), link:3-4@1.0 (fails), link:3-4@1.0:degraded:0.25 (a quarter of its
bandwidth). Effects, at the first step boundary at or after the time:
- degraded socket: its compute and memory time x 1/fraction: the group waits for it (straggler);
- degraded link: the communication time of the groups whose ring uses it x 1/fraction;
- failed link: its traffic detours through a third socket: two hops, so x 2 (assumption: the
  detour's links are otherwise idle; a topology-level reroute replaces this when interconnect/
  provides routes);
- failed socket: its group's KV cache is lost (every cached sequence is recomputed); the group is
  re-planned at the largest tensor-parallel degree that fits the remaining sockets, after
  reloading its weights from DDR (host memory on a GPU) at that tier's bandwidth; if none fits,
  its unfinished requests are reported unserved.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from interconnect.topology import build_topology
from partitioning.cluster import ClusterSpec
from workloads import checks
from workloads.errors import ConfigError

# A degraded target keeps at least a millionth of its speed: a step 10^6 times longer is a
# failed socket or link in all but name (and past it a run's times leave floating point).
MIN_FRACTION = 1e-6

_PATTERN = re.compile(
    r"^(socket):(\d+)@([0-9.eE+-]+)(?::(failed|degraded)(?::([0-9.eE+-]+))?)?$"
    r"|^(link):(\d+)-(\d+)@([0-9.eE+-]+)(?::(failed|degraded)(?::([0-9.eE+-]+))?)?$"
)
LINK_DETOUR_FACTOR = 2.0


@dataclass(frozen=True)
class Fault:
    time_s: float
    target: str  # "socket" | "link"
    a: int
    b: int = -1
    kind: str = "failed"
    fraction: float = 0.0  # remaining speed / bandwidth of a degraded target

    @classmethod
    def parse(cls, text: str, cluster: ClusterSpec) -> Fault:
        """A fault on `cluster`: its sockets in range, a link fault's two sockets linked."""
        m = _PATTERN.match(text.strip())
        if not m:
            raise ConfigError(
                f"--fault {text!r}: expected socket:N@T[:degraded:F] or link:A-B@T[:degraded:F]"
            )
        g = m.groups()
        try:
            if g[0]:
                f = cls(float(g[2]), "socket", int(g[1]), -1, g[3] or "failed", float(g[4] or 0))
            else:
                f = cls(float(g[8]), "link", int(g[6]), int(g[7]), g[9] or "failed",
                        float(g[10] or 0))
        except ValueError:  # the pattern admits '1..2' or '1e+': not a number after all
            raise ConfigError(f"--fault {text!r}: time and fraction must be numbers, as in "
                              "socket:3@2.5:degraded:0.5") from None
        f.check(text, cluster.sockets)
        if f.target == "link":
            f.check_link(text, cluster)
        return f

    def check(self, text: str, sockets: int) -> None:
        if not 0 <= self.time_s <= checks.MAX_SECONDS:
            raise ConfigError(f"--fault {text!r}: time must be >= 0 and at most "
                              f"{checks.MAX_SECONDS:g} s (194 days)")
        if self.target == "link" and self.a == self.b:
            raise ConfigError(f"--fault {text!r}: a link joins two different sockets")
        if not all(0 <= s < sockets for s in (self.a, self.b) if s >= 0):
            raise ConfigError(f"--fault {text!r}: socket out of range 0..{sockets - 1}")
        if self.kind == "degraded" and not MIN_FRACTION <= self.fraction <= 1:
            raise ConfigError(f"--fault {text!r}: a degraded fraction must be in "
                              f"[{MIN_FRACTION:g}, 1] (slower than that, mark it failed)")

    def check_link(self, text: str, cluster: ClusterSpec) -> None:
        """A link joins two sockets of one node that its network wires together (a pair of
        nodes meets only through the fabric switch)."""
        spn, kind = cluster.sockets_per_node, cluster.topology.kind
        (na, a), (nb, b) = divmod(self.a, spn), divmod(self.b, spn)
        if na == nb and kind in ("full_mesh", "switch"):
            return
        wired = {(link.src, link.dst) for link in build_topology(
            cluster.topology, spn, spn).node_links}
        if na != nb or (a, b) not in wired:
            raise ConfigError(f"--fault {text!r}: no link {self.a}-{self.b} in {cluster.name}'s "
                              f"{kind} network; a link joins {_LINKED[kind]}")


_LINKED = {"full_mesh": "two sockets of one node", "switch": "two sockets of one node",
           "ring": "neighbours on a node's ring (i and i+1)",
           "torus2d": "neighbours on a node's torus"}
