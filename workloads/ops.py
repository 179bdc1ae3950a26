"""The operator IR: what a step of a model asks of the hardware, never how long it takes.

Every quantity is a float or a numpy array; arrays broadcast over a grid of design points, so one
graph describes a whole (batch x context) sweep and costing it is one numpy evaluation.
Identical layers appear once in a Block with a repeat count.

Only execution models (chip/) and the interconnect turn this work into seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import Enum

import numpy as np

Work = float | np.ndarray


class OpClass(str, Enum):
    EMBEDDING = "embedding"
    NORM = "norm"
    MATMUL = "matmul"  # projections with weights: qkv, o, dense MLP, shared experts
    ATTENTION = "attention"  # score, softmax, value product: reads the KV cache
    LINEAR_ATTENTION = "linear_attention"  # recurrent state update / scan (DeltaNet, Mamba-2)
    ROUTER = "router"
    EXPERT = "expert"  # routed-expert matmuls
    ELEMENTWISE = "elementwise"  # activation, rope, residual add
    LM_HEAD = "lm_head"
    SAMPLING = "sampling"
    COLLECTIVE = "collective"


class CollectiveKind(str, Enum):
    ALL_REDUCE = "all_reduce"
    ALL_GATHER = "all_gather"
    REDUCE_SCATTER = "reduce_scatter"
    ALL_TO_ALL = "all_to_all"
    SEND_RECV = "send_recv"


@dataclass(frozen=True)
class Collective:
    """A communication point. `bytes` is the payload each participant contributes (for an
    all-reduce: the full tensor each rank holds); `group` names the parallel dimension
    ("attn_tp", "mlp_tp", "expert_tp", "ep", "pp") and `size` its degree."""

    kind: CollectiveKind
    bytes: Work
    group: str
    size: int


@dataclass(frozen=True)
class Op:
    name: str
    cls: OpClass
    flops: Work = 0.0
    weight_bytes: Work = 0.0
    kv_read_bytes: Work = 0.0
    kv_write_bytes: Work = 0.0
    act_in_bytes: Work = 0.0
    act_out_bytes: Work = 0.0
    flop_dtype: str = "bf16"  # which peak FLOP rate applies
    comm: Collective | None = None
    # Attention: the independent KV streams of the step (sequences x KV heads), and the query
    # heads that read each (GQA's group). A decode kernel reads a stream with one thread block,
    # or one a query head where it does not pack a group's heads into one block.
    streams: Work = 0.0
    query_group: float = 1.0
    # A GEMM's weight bytes per output column (K x bytes a weight): a thread block that owns a
    # band of columns streams that many bytes a column (chip/kernel_efficiency.py).
    column_bytes: Work = 0.0
    # The kernel family a serving stack runs the op with where its class does not say it:
    # "mla" for MLA's latent-cache attention (chip/kernel_efficiency.py KERNEL_CLASSES).
    family: str = ""
    # A grouped GEMM's expert groups on this socket (the routed experts it holds), each of which
    # the kernel visits whether or not a token routes to it.
    experts: float = 0.0

    @property
    def collective(self) -> Collective:
        """The collective a COLLECTIVE op carries (every one does: graph._collective)."""
        if self.comm is None:
            raise ValueError(f"op {self.name} ({self.cls.value}) carries no collective")
        return self.comm

    @property
    def memory_bytes(self) -> Work:
        """Bytes this op moves if nothing stays on chip between ops."""
        return (
            self.weight_bytes
            + self.kv_read_bytes
            + self.kv_write_bytes
            + self.act_in_bytes
            + self.act_out_bytes
        )


@dataclass(frozen=True)
class Block:
    """A run of identical layers (or the prologue / epilogue): its ops, repeated `repeat` times.
    `first_layer` is the index of the first layer it covers (-1 for prologue/epilogue)."""

    name: str
    ops: tuple[Op, ...]
    repeat: int = 1
    first_layer: int = -1

    def total(self, attr: str) -> Work:
        return self.repeat * sum((getattr(op, attr) for op in self.ops), 0.0)


@dataclass(frozen=True)
class StepShape:
    """One forward pass. `batch` sequences each bring `new_tokens` tokens (1 for a decode step,
    the prompt for prefill, k+1 for a speculative verification) on top of `context` tokens already
    in their KV cache. `contexts`, when given, lists exact per-sequence context lengths (then
    `batch` is its length and `context` its mean); builders use it where the mean is not exact
    (sliding windows). `identical`: every sequence is the same (one prompt replicated and decoded
    greedily, as benchmark scripts do), so an MoE routes the batch as it routes one sequence.
    `spread`: each token's experts differ from every other token's until all are used (the
    "balanced" routing AIConfigurator's kernel collectors time), so N tokens touch
    min(E, N x top_k) experts, the most any routing can. `spread_grouped`: those spread logits
    go through the model's group-limited router (graph.spread_experts)."""

    phase: str  # "decode" | "prefill"
    batch: Work = 1.0
    new_tokens: Work = 1.0
    context: Work = 0.0
    contexts: tuple[int, ...] | None = None
    identical: bool = False
    spread: bool = False
    spread_grouped: bool = False

    @classmethod
    def decode(cls, batch: Work, context: Work) -> StepShape:
        return cls("decode", batch, 1.0, context)

    @classmethod
    def prefill(cls, batch: Work, prompt_len: Work) -> StepShape:
        return cls("prefill", batch, prompt_len, 0.0)

    @classmethod
    def decode_contexts(cls, contexts: tuple[int, ...]) -> StepShape:
        return cls("decode", float(len(contexts)), 1.0, float(np.mean(contexts)), tuple(contexts))

    @property
    def tokens(self) -> Work:
        return self.batch * self.new_tokens


@dataclass(frozen=True)
class Shard:
    """How the socket whose work a graph describes is one of several: each degree splits that
    part's weights and work. Degrees of 1 describe the whole model on one socket."""

    attn_tp: int = 1  # attention / linear-attention heads
    mlp_tp: int = 1  # dense FFN and shared experts
    expert_tp: int = 1  # each routed expert's matrices
    ep: int = 1  # routed experts spread over this many groups
    vocab_tp: int = 1  # embedding and LM head
    expert_load: Work = 1.0  # tokens on the busiest expert group / mean (routing imbalance, >= 1)
    # Attention data parallelism: the step's sequences are split over attn_dp groups of attn_tp
    # sockets each, which run the mixers of their own sequences (workloads/graph.py).
    attn_dp: int = 1

    @classmethod
    def tensor(cls, tp: int) -> Shard:
        return cls(attn_tp=tp, mlp_tp=tp, expert_tp=tp, ep=1, vocab_tp=tp)

    @property
    def shared_tp(self) -> int:
        """The degree a shared expert is split over: under attention data parallelism with
        experts spread (ep > 1), each socket runs the whole shared expert on its own tokens, as
        SGLang does with DeepEP (deepseek_v2.py: shared_experts with tp_size=1); else it is
        split like a dense FFN."""
        return 1 if self.attn_dp > 1 and self.ep > 1 else self.mlp_tp

    @property
    def sockets(self) -> int:
        """Sockets that run one step together (each a part of every layer)."""
        return max(self.attn_tp, self.mlp_tp, self.expert_tp * self.ep, self.vocab_tp)

    @property
    def embed_tp(self) -> int:
        """The embedding table's split: replicated under attention data parallelism, each
        socket embedding its own tokens (SGLang: VocabParallelEmbedding(enable_tp=not
        is_dp_attention_enabled())); else vocab-parallel like the LM head."""
        return 1 if self.attn_dp > 1 else self.vocab_tp

    @property
    def scheduler_sockets(self) -> int:
        """Sockets one scheduler drives: an attention data-parallel group has its own."""
        return self.sockets // self.attn_dp


@dataclass(frozen=True)
class Graph:
    model: str
    shape: StepShape
    shard: Shard
    blocks: tuple[Block, ...] = field(default_factory=tuple)

    def total(self, attr: str) -> Work:
        return sum((b.total(attr) for b in self.blocks), 0.0)

    def ops(self):
        """(block, op) pairs in execution order, each block once (use block.repeat)."""
        for block in self.blocks:
            for op in block.ops:
                yield block, op

    def with_blocks(self, blocks: tuple[Block, ...]) -> Graph:
        return replace(self, blocks=blocks)
