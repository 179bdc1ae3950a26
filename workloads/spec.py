"""ModelSpec: the shapes of a transformer-family model, as far as cost is concerned.

A model is a sequence of layers; each layer has a token mixer (attention of some kind, or a
linear-attention / state-space block, or none) and a feed-forward part (dense, MoE, or none).
Dense, MoE and hybrid models are the same structure with different per-layer choices.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import Enum
from typing import TypeVar

from workloads.dtypes import DType, Precision
from workloads.errors import ConfigError

T = TypeVar("T")


def part(value: T | None, what: str) -> T:
    """A part of a model (its attention, MoE, ...) where the caller only comes when the model
    has it (a layer of that kind, checked by check_model): its absence there is a bug."""
    if value is None:
        raise ValueError(f"the model has no {what}")
    return value


class Mixer(str, Enum):
    FULL_ATTENTION = "full_attention"
    SLIDING_ATTENTION = "sliding_attention"
    LINEAR_ATTENTION = "linear_attention"  # gated DeltaNet and kin: a fixed-size state per head
    MAMBA2 = "mamba2"
    NONE = "none"


class FFN(str, Enum):
    DENSE = "dense"
    MOE = "moe"
    NONE = "none"


@dataclass(frozen=True)
class LayerSpec:
    mixer: Mixer
    ffn: FFN


@dataclass(frozen=True)
class AttentionSpec:
    """Softmax attention. kind is derived from the head counts except for MLA.

    For MLA (DeepSeek-V2/V3): q is projected through a LoRA of rank q_lora_rank (or directly when
    None), k/v through a shared latent of rank kv_lora_rank plus a decoupled rope key of
    qk_rope_head_dim; head_dim = qk_nope_head_dim + qk_rope_head_dim. The KV cache holds the latent
    and the rope key: kv_lora_rank + qk_rope_head_dim values per token per layer.
    """

    num_heads: int
    num_kv_heads: int
    head_dim: int
    v_head_dim: int
    mla: bool = False
    q_lora_rank: int | None = None
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    qk_nope_head_dim: int | None = None
    sliding_window: int | None = None  # window of the SLIDING_ATTENTION layers
    sinks: bool = False  # learned per-head sink logits (gpt-oss)
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = False
    output_gate: bool = False  # q_proj also emits a sigmoid gate on the output (Qwen3-Next)
    rotary_dim: int | None = None  # partial rope (MiniMax-M2: 64 of 128); None: all of head_dim

    @property
    def mla_dims(self) -> tuple[int, int, int]:
        """MLA's (qk_nope_head_dim, qk_rope_head_dim, kv_lora_rank): set on every MLA model
        (check_model)."""
        return (part(self.qk_nope_head_dim, "MLA qk_nope_head_dim"),
                part(self.qk_rope_head_dim, "MLA qk_rope_head_dim"),
                part(self.kv_lora_rank, "MLA kv_lora_rank"))

    @property
    def kind(self) -> str:
        if self.mla:
            return "mla"
        if self.num_kv_heads == self.num_heads:
            return "mha"
        if self.num_kv_heads == 1:
            return "mqa"
        return "gqa"


@dataclass(frozen=True)
class MoESpec:
    num_experts: int  # routed experts per MoE layer
    top_k: int
    expert_intermediate: int
    num_shared_experts: int = 0
    shared_intermediate: int = 0  # total intermediate width of the shared expert(s)
    router_bias: bool = False
    expert_bias: bool = False
    expert_matrices: int = 3  # gated (SwiGLU) experts: gate, up, down
    shared_expert_gate: bool = False  # a sigmoid gate (hidden -> 1) on the shared expert (Qwen)
    # group-limited routing (DeepSeek n_group, topk_group): the routed experts fall in
    # expert_groups groups and a token picks its top_k within topk_groups of them
    expert_groups: int = 1
    topk_groups: int = 1


@dataclass(frozen=True)
class LinearAttentionSpec:
    """Gated DeltaNet style linear attention (Qwen3-Next): a (key_dim x value_dim) state per head."""

    num_key_heads: int
    num_value_heads: int
    key_head_dim: int
    value_head_dim: int
    conv_kernel: int = 4


@dataclass(frozen=True)
class Mamba2Spec:
    """Mamba-2 block (Nemotron-H). d_inner = num_heads * head_dim (= expand * hidden)."""

    num_heads: int
    head_dim: int
    state_size: int
    n_groups: int
    conv_kernel: int = 4
    expand: int = 2


@dataclass(frozen=True)
class ModelSpec:
    name: str
    family: str  # the HuggingFace model_type it came from
    hidden_size: int
    vocab_size: int
    layers: tuple[LayerSpec, ...]
    attention: AttentionSpec | None
    intermediate_size: int = 0  # dense FFN width
    ffn_matrices: int = 3  # 3 for gated (SwiGLU) MLPs, 2 for plain up/down
    ffn_bias: bool = False  # biases on the dense MLP's projections (StarCoder2's c_fc / c_proj)
    norm_bias: bool = False  # LayerNorms (a scale and a bias) where other families have RMSNorm
    moe: MoESpec | None = None
    linear_attention: LinearAttentionSpec | None = None
    mamba: Mamba2Spec | None = None
    tie_embeddings: bool = False
    # Gemma 2/3: RMSNorms after attention and after the MLP besides the two pre-norms.
    sandwich_norms: bool = False
    mtp_layers: int = 0  # multi-token-prediction modules (DeepSeek-V3), usable as self-speculation
    max_context: int = 0
    precision: Precision = field(default_factory=Precision)
    # Where the weight dtype came from, e.g. "fp8 (quantization_config fbgemm_fp8)"; "" when the
    # precision is the default or was chosen by the caller.
    quantization: str = ""
    source: str = ""

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def with_precision(self, precision: Precision) -> ModelSpec:
        """The same model at `precision`; the checkpoint's label goes when the weights change."""
        same = (precision.weights, precision.expert_weights) == (
            self.precision.weights, self.precision.expert_weights)
        return replace(self, precision=precision, quantization=self.quantization if same else "")

    @property
    def is_moe(self) -> bool:
        return any(layer.ffn is FFN.MOE for layer in self.layers)


def with_dtypes(spec: ModelSpec, weights: str | None, kv: str | None,
                where: str = "--weights", kv_where: str = "--kv-dtype") -> ModelSpec:
    """The model with every weight in `weights` (routed experts included) and its KV cache in
    `kv`; None keeps the model's own. `where` and `kv_where` name the fields in an error."""
    p = spec.precision
    if weights:
        p = replace(p, weights=DType.parse(weights, where), expert_weights=None)
    if kv:
        p = replace(p, kv_cache=DType.parse(kv, kv_where))
    return spec.with_precision(p)


def layer_runs(layers: tuple[LayerSpec, ...]) -> tuple[tuple[int, int, LayerSpec], ...]:
    """Consecutive identical layers as (first_layer, count, layer): the Blocks of a graph.
    Worked out once per layers tuple (the entry keeps it alive): every step's graph asks, and
    comparing 80 layers took a tenth of building a decode graph."""
    hit = _RUNS.get(id(layers))
    if hit is not None and hit[0] is layers:
        return hit[1]
    if len(_RUNS) > 4096:
        _RUNS.clear()
    runs = _layer_runs(layers)
    _RUNS[id(layers)] = (layers, runs)
    return runs


_RUNS: dict[int, tuple[tuple, tuple]] = {}


def _layer_runs(layers: tuple[LayerSpec, ...]) -> tuple[tuple[int, int, LayerSpec], ...]:
    runs: list[tuple[int, int, LayerSpec]] = []
    for i, layer in enumerate(layers):
        if runs and runs[-1][2] == layer:
            first, count, _ = runs[-1]
            runs[-1] = (first, count + 1, layer)
        else:
            runs.append((i, 1, layer))
    return tuple(runs)


def check_model(spec: ModelSpec, where: str) -> None:
    """Refuse shapes no model can have, whatever family or importer they came from: a model
    simulated with them would give numbers that mean nothing (a ConfigError naming the field)."""
    def need(ok: bool, what: str) -> None:
        if not ok:
            raise ConfigError(f"{where}: {what} (model_type {spec.family})")

    need(spec.num_layers >= 1, "no layers")
    a = spec.attention
    if a is not None and any(la.mixer in _ATTENTION for la in spec.layers):
        need(a.head_dim >= 1, f"head dimension {a.head_dim} (hidden_size {spec.hidden_size} / "
             f"num_attention_heads {a.num_heads}); heads must not outnumber the hidden size")
        need(a.v_head_dim >= 1, f"v_head_dim {a.v_head_dim}: expected a positive integer")
        if not a.mla:
            need(a.num_kv_heads <= a.num_heads and a.num_heads % a.num_kv_heads == 0,
                 f"num_key_value_heads {a.num_kv_heads} must divide num_attention_heads "
                 f"{a.num_heads}")
        need(a.rotary_dim is None or a.rotary_dim <= a.head_dim,
             f"rotary_dim {a.rotary_dim} exceeds the head dimension {a.head_dim}")
    m = spec.moe
    if m is not None and spec.is_moe:
        need(m.top_k <= m.num_experts,
             f"num_experts_per_tok {m.top_k} exceeds the {m.num_experts} routed experts")
    la = spec.linear_attention
    if la is not None:
        need(la.num_value_heads % la.num_key_heads == 0,
             f"linear_num_value_heads {la.num_value_heads} must be a multiple of "
             f"linear_num_key_heads {la.num_key_heads}")
    mb = spec.mamba
    if mb is not None:
        need(mb.num_heads % mb.n_groups == 0,
             f"mamba_num_heads {mb.num_heads} must be a multiple of n_groups {mb.n_groups}")


_ATTENTION = (Mixer.FULL_ATTENTION, Mixer.SLIDING_ATTENTION)


def check_context(spec: ModelSpec, prompt_len: int, gen_len: int, where: str = "--prompt-len") -> None:
    """Refuse a request longer than the model's context window (0: the model states none)."""
    if spec.max_context and prompt_len + gen_len > spec.max_context:
        raise ConfigError(
            f"{where}: prompt {prompt_len:,} + output {gen_len:,} tokens exceed the "
            f"{spec.max_context:,}-token context of {spec.name} (max_position_embeddings)")
