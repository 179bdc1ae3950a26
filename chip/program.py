"""Program: what one socket runs, its shard of the model and its pipeline stage's layers, and
the step graphs it builds (the target's, the draft's).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from workloads import graph as graphs
from workloads.ops import Block, Graph, Shard, StepShape, Work
from workloads.spec import ModelSpec


@dataclass(frozen=True)
class Program:
    """What one socket runs: its shard of the model and, with pipeline stages, its layers
    [first, last) (None: all). `group` lists the sockets it synchronizes with each step."""

    model: ModelSpec
    shard: Shard
    stage: int = 0
    stages: int = 1
    layers: tuple[int, int] | None = None
    group: tuple[int, ...] = ()
    execution_model: str | None = None
    options: Any = None
    draft: ModelSpec | None = None  # speculative decoding: the draft, on this socket's tp
    spec_k: int = 0  # draft depth of a speculative step (0: plain decoding)
    spec_tree: tuple[int, ...] | None = None  # tree speculation: candidates kept per depth
    # What a speculative decode step runs here: "both" (draft and target share the socket),
    # "draft" (a separate draft socket: `model` is the draft) or "verify" (the target only).
    spec_part: str = "both"
    router: ModelSpec | None = None  # Composition of Experts: routes the prompts it prefills

    def key(self) -> tuple:
        """Identity of the cost function: sockets with equal keys cost equal steps equally."""
        shard = replace(self.shard, expert_load=1.0)
        draft = self.draft.name if self.draft is not None else None
        router = self.router.name if self.router is not None else None
        return (self.model.name, shard, self.layers, self.execution_model, repr(self.options),
                draft, self.spec_k, self.spec_tree, self.spec_part, router)

    def draft_graph(self, shape: StepShape) -> Graph:
        """The draft's step, tensor-parallel over this socket's group: the draft beside the
        target (shared placement), or this socket's own model on a separate draft socket."""
        model = self.draft if self.spec_part == "both" else self.model
        assert model is not None
        return graphs.step_graph(model, shape, Shard.tensor(self.shard.attn_tp))

    def graph(self, shape: StepShape, expert_load: Work = 1.0) -> Graph:
        shard = (
            self.shard
            if np.ndim(expert_load) == 0 and expert_load == 1.0
            else replace(self.shard, expert_load=expert_load)
        )
        g = graphs.step_graph(self.model, shape, shard)
        return g if self.layers is None else _stage_blocks(g, *self.layers)


def _stage_blocks(g: Graph, first: int, last: int) -> Graph:
    """The blocks of layers [first, last), the prologue with the first stage and the epilogue
    with the last (blocks with first_layer -1: before any layer block or after all of them)."""
    out: list[Block] = []
    seen_layer = False
    n_layers = max((b.first_layer + b.repeat for b in g.blocks if b.first_layer >= 0), default=0)
    for b in g.blocks:
        if b.first_layer < 0:
            if (not seen_layer and first == 0) or (seen_layer and last >= n_layers):
                out.append(b)
            continue
        seen_layer = True
        lo, hi = max(first, b.first_layer), min(last, b.first_layer + b.repeat)
        if hi > lo:
            out.append(replace(b, repeat=hi - lo, first_layer=lo))
    return g.with_blocks(tuple(out))
