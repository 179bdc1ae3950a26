"""The prefix cache's configuration (serve --prefix-cache, --prefix-block, --prefix-eviction):
PrefixConfig, the modes (MODES), HBM's tier name and the finest block (MIN_BLOCK_TOKENS)."""

from __future__ import annotations

from dataclasses import dataclass

from rdu_cluster.engine import evictions
from workloads.errors import ConfigError

MODES = ("off", "hbm", "tiered")
HBM = "hbm"


# The finest prefix-cache block. The cache's work is per block: a block of 1 token (SGLang's
# radix tree at page size 1) made a 100-session, 10-turn run 4x slower than blocks of 16 (31 s
# against 8 s) and 200 sessions x 30 turns 13x, for hits that differ by under a block a request
# (at most 15 tokens of a prompt of thousands). 16 is vLLM's KV block, the default.
MIN_BLOCK_TOKENS = 16


@dataclass(frozen=True)
class PrefixConfig:
    # None: tiered where the runtime spills its prefix cache to a lower tier by default (an
    # RDU's DDR), else hbm (serving_stacks.spills_prefix_cache)
    mode: str | None = None
    block_tokens: int | None = None  # None: the KV cache's block (vLLM hashes KV blocks)
    eviction: str = evictions.DEFAULT

    def check(self) -> None:
        if self.mode is not None and self.mode not in MODES:
            raise ConfigError(f"--prefix-cache: unknown {self.mode!r}; accepted: "
                              f"{', '.join(MODES)}")
        if self.block_tokens is not None and self.block_tokens < MIN_BLOCK_TOKENS:
            raise ConfigError(f"--prefix-block: at least {MIN_BLOCK_TOKENS} tokens (the KV "
                              f"block vLLM hashes), got {self.block_tokens}")
        if self.mode == "off" and self.block_tokens is not None:
            raise ConfigError("--prefix-block: not with --prefix-cache off (there is no prefix "
                              "cache to size)")
        evictions.get(self.eviction)

    def resolved(self, lower: str | None, spills: bool) -> str:
        """The mode on a chip whose lower tier is `lower` (None: it has none), whose runtime
        spills its prefix cache there by default where `spills`."""
        if self.mode is None:
            return "tiered" if lower and spills else HBM
        if self.mode == "tiered" and not lower:
            raise ConfigError("--prefix-cache tiered: the chip has no tier below HBM")
        return self.mode
