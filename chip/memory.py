"""Memory tiers of one socket: an allocator of named regions per tier, and tier-to-tier moves.

A region is a named allocation ("weights/llama-3.1-70b/layers/0-79", "kv/17", "reserved/expert")
of a number of bytes in one tier. Allocation is first-fit against capacity only (no
fragmentation model: the KV cache is paged and weights are placed once, so capacity is the
constraint that binds). Moving a region between tiers costs bytes / min(bandwidth of the two
tiers): the copy streams out of one and into the other, and the slower side sets the pace
(DESIGN.md, "Memory tiers"). Everything here is plain data so that a socket can checkpoint it.
"""

from __future__ import annotations

from typing import NamedTuple

from chip.spec import ChipSpec, TierSpec


class TierError(RuntimeError):
    """A region does not fit its tier, or names a tier or region that does not exist."""


class Region(NamedTuple):
    """An immutable value (a tuple: a paged KV region is re-made at every resize, so it is
    made cheaply)."""

    name: str
    tier: str
    nbytes: float
    kind: str = ""  # "weights" | "kv" | "reserved" | ...: what the occupancy report groups by


class MemoryTiers:
    """The tiers of one socket and what is resident in each."""

    def __init__(self, tiers: tuple[TierSpec, ...]):
        self.tiers = {t.name: t for t in tiers}
        self.regions: dict[str, Region] = {}
        self.used = {t.name: 0.0 for t in tiers}

    @classmethod
    def of(cls, chip: ChipSpec) -> MemoryTiers:
        return cls(chip.tiers)

    def free_bytes(self, tier: str) -> float:
        return self._tier(tier).capacity_bytes - self.used[tier]

    def fits(self, tier: str, nbytes: float) -> bool:
        return nbytes <= self.free_bytes(tier) + 1e-6

    def allocate(self, name: str, tier: str, nbytes: float, kind: str = "") -> Region:
        if name in self.regions:
            raise TierError(f"region {name!r} already allocated in {self.regions[name].tier}")
        if not self.fits(tier, nbytes):
            raise TierError(
                f"region {name!r}: {nbytes / 1e9:.2f} GB does not fit {tier} "
                f"({self.free_bytes(tier) / 1e9:.2f} GB free)"
            )
        region = Region(name, tier, float(nbytes), kind)
        self.regions[name] = region
        self.used[tier] += region.nbytes
        return region

    def resize(self, name: str, nbytes: float, kv_scale: float = 1.0) -> None:
        """Grow or shrink a region in place (a paged KV cache growing by blocks); a KV region's
        bytes are scaled by `kv_scale` (the socket's KV bytes per replica KV byte). The most
        frequent region op (every growing sequence, every window): kept to plain lookups."""
        old = self.regions.get(name)
        if old is None:
            raise TierError(f"no region {name!r}")
        if old.kind == "kv":
            nbytes = nbytes * kv_scale
        grow = nbytes - old.nbytes
        if grow > 0 and grow > self.tiers[old.tier].capacity_bytes - self.used[old.tier] + 1e-6:
            raise TierError(f"region {name!r}: cannot grow to {nbytes / 1e9:.2f} GB")
        self.used[old.tier] += grow
        self.regions[name] = Region(name, old.tier, float(nbytes), old.kind)

    def free(self, name: str) -> Region:
        region = self.regions.pop(name, None)
        if region is None:
            raise TierError(f"no region {name!r}")
        self.used[region.tier] -= region.nbytes
        return region

    def move(self, name: str, tier: str) -> float:
        """Move a region to `tier`; returns the copy time in seconds."""
        region = self._region(name)
        if region.tier == tier:
            return 0.0
        seconds = self.copy_time(region.nbytes, region.tier, tier)
        self.free(name)
        self.allocate(name, tier, region.nbytes, region.kind)
        return seconds

    def copy(self, name: str, tier: str, new_name: str) -> float:
        """Copy a region to `tier` as `new_name`, the source staying where it is (an expert's
        weights brought from its backing store into HBM); returns the copy time in seconds."""
        region = self._region(name)
        self.allocate(new_name, tier, region.nbytes, region.kind)
        return self.copy_time(region.nbytes, region.tier, tier)

    def copy_time(self, nbytes: float, src: str, dst: str) -> float:
        bw = min(self._tier(src).bandwidth_bytes_per_s, self._tier(dst).bandwidth_bytes_per_s)
        return nbytes / bw

    def clone(self) -> MemoryTiers:
        """An equal, independent copy (regions are immutable values; the tiers are shared)."""
        out = MemoryTiers.__new__(MemoryTiers)
        out.tiers, out.regions, out.used = self.tiers, dict(self.regions), dict(self.used)
        return out

    def occupancy(self) -> dict[str, float]:
        """Used bytes per tier."""
        return dict(self.used)

    def by_kind(self, tier: str) -> dict[str, float]:
        out: dict[str, float] = {}
        for r in self.regions.values():
            if r.tier == tier:
                out[r.kind] = out.get(r.kind, 0.0) + r.nbytes
        return out

    def state(self) -> list[list]:
        """Plain data for a checkpoint, in allocation order."""
        return [[r.name, r.tier, r.nbytes, r.kind] for r in self.regions.values()]

    def restore(self, state: list[list]) -> None:
        self.regions.clear()
        self.used = {t: 0.0 for t in self.tiers}
        for name, tier, nbytes, kind in state:
            self.allocate(name, tier, nbytes, kind)

    def _tier(self, name: str) -> TierSpec:
        try:
            return self.tiers[name]
        except KeyError:
            raise TierError(f"no tier {name!r}; tiers: {', '.join(self.tiers)}") from None

    def _region(self, name: str) -> Region:
        try:
            return self.regions[name]
        except KeyError:
            raise TierError(f"no region {name!r}") from None
