"""Which content requests share and which a request yet to finish can still ask for, trace-wide
(Liveness): what decides a request's own blocks and the blocks no request can find again."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rdu_cluster.engine.requests import Request


class Liveness:
    """Which content other requests share and which a request yet to finish can still ask for,
    trace-wide (shared by the replicas' caches). A block covers chunks of content, and a request
    that finds it has those chunks too. So a request's blocks are its own (no other request can
    find them) from the first block covering a chunk no other request of the trace has, and a
    block can never be found again once every request with one of its chunks has finished.
    `content`: Trace.content (None: every request's tokens are its own, traces.Trace)."""

    def __init__(self, content: tuple | None):
        self.left: dict[int, int] | None = None  # chunk id -> requests holding it, unfinished
        self.shared: set[int] = set()  # chunk ids more than one request of the trace has
        if content is not None:
            self.left = {}
            for chunks in content:
                for cid in {c for c, _ in chunks}:
                    self.left[cid] = self.left.get(cid, 0) + 1
            self.shared = {cid for cid, n in self.left.items() if n > 1}

    def own_from(self, r: Request, block_tokens: int) -> int | None:
        """r's first block that no other request can have (None: every block may be shared)."""
        return self._first(r, block_tokens, lambda cid: cid not in self.shared)

    def dead_from(self, r: Request, block_tokens: int) -> int | None:
        """r's first block no request yet to finish can find (None: none)."""
        # _first calls `pick` only past its test that self.left is a dict (mypy does not
        # carry that narrowing into the lambda)
        return self._first(r, block_tokens,
                           lambda cid: cid not in self.left)  # type: ignore[operator]

    def _first(self, r: Request, block_tokens: int, pick) -> int | None:
        if not r.content:  # its own chunk (own_chunk): no other request has it
            return 0
        if self.left is None:
            return None
        off = 0
        for cid, n in r.content:
            if pick(cid):
                return off // block_tokens
            off += n
        return None

    def finish(self, r: Request) -> None:
        """r finished: it asks for nothing more."""
        if self.left is None or not r.content:
            return
        for cid in {c for c, _ in r.content}:
            left = self.left[cid] - 1
            if left:
                self.left[cid] = left
            else:
                del self.left[cid]
