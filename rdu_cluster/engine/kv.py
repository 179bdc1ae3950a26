"""KV-cache admission against HBM capacity, in blocks (paged, as vLLM).

Capacity per socket: what the resident weights, the activation workspace and the runtime's
reservation leave (engine/build.py, from the footprint's regions and chip/runtime_memory.py),
in blocks of `block_tokens` tokens of `bytes_per_token` bytes (this socket's share of every
layer's K and V). Every socket of a tensor-parallel group holds the same share of every
sequence, so one manager speaks for the group. block_tokens = 16: vLLM's default --block-size.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from rdu_cluster.engine.requests import Request

BLOCK_TOKENS = 16


@dataclass(frozen=True)
class KVConfig:
    capacity_blocks: int
    block_tokens: int
    bytes_per_token: float  # per socket

    @property
    def block_bytes(self) -> float:
        return self.block_tokens * self.bytes_per_token


class KVManager:
    def __init__(self, config: KVConfig):
        self.config = config
        self.used = 0  # blocks held by running requests
        self.held: dict[int, int] = {}  # request id -> blocks

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.config.block_tokens)

    @property
    def free(self) -> int:
        return self.config.capacity_blocks - self.used

    def fits(self, tokens: int, extra: int = 0) -> bool:
        """Could a new sequence of `tokens` cached tokens be admitted (beside `extra` blocks
        already promised in this step)?"""
        return self.blocks_for(tokens) + extra <= self.free

    def set(self, req: Request, tokens: int) -> None:
        """Hold enough blocks for `tokens` cached tokens (never fewer than already held)."""
        new = max(self.blocks_for(tokens), self.held.get(req.id, 0))
        self.used += new - self.held.get(req.id, 0)
        self.held[req.id] = new

    def grow(self, requests: Iterable[Request]) -> None:
        """`set` each request to its cached tokens (the one call a span makes for its batch)."""
        bt, held, used = self.config.block_tokens, self.held, self.used
        for r in requests:
            have = held.get(r.id, 0)
            need = -(-r.cached // bt)
            if need > have:
                used += need - have
                held[r.id] = need
        self.used = used

    def blocks(self, req: Request) -> int:
        """The blocks `req` holds: those recorded, or, while it decodes under a lockstep policy
        (whose growth engine/lockstep.py counts in `used` alone), those of its cached tokens."""
        return max(self.held.get(req.id, 0), -(-req.cached // self.config.block_tokens))

    def record(self, req: Request) -> int:
        """Bring `req`'s entry up to the blocks it holds (already counted in `used`)."""
        blocks = self.held[req.id] = self.blocks(req)
        return blocks

    def release(self, req: Request) -> int:
        blocks = self.held.pop(req.id, 0)
        self.used -= blocks
        return blocks

    def used_bytes(self) -> float:
        return self.used * self.config.block_bytes
