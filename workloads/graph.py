"""Operator graphs: the work of one forward step of a model on ONE socket, op by op.

Ops are at the granularity a PyTorch eager implementation launches (each norm, projection, rope,
attention, activation, residual add, collective), in execution order; a dataflow execution model
fuses a whole layer, a GPU model fuses a few. Every work quantity broadcasts over numpy arrays of
batch / new_tokens / context, so a grid of design points is one evaluation, and consecutive
identical layers are one Block with a repeat count (`first_layer` kept for pipeline cuts).

Conventions (each is a modelling choice, stated once here):
- FLOPs: 2 per multiply-accumulate. Norms ~4 FLOPs per element, softmax ~5 per score.
- Bytes per class: weight_bytes (parameters read), kv_read/kv_write (KV cache, and the recurrent
  state of linear-attention / Mamba-2 layers, which is the per-sequence cache of those layers),
  act_in/act_out (activations read and written, if nothing stays on chip).
- Attention: each of the `new_tokens` queries of a sequence attends causally to the `context`
  cached tokens plus the new ones before it: sum_{i=1..T} min(W, C + i) (query, key) pairs, W the
  sliding window or infinite. Decode (T=1): C + 1 keys; prefill (C=0): T(T+1)/2, half the square.
  KV read is the cached part only, min(C, W) tokens a sequence (the new tokens' K/V are computed
  in the step and counted as kv_write). With `shape.contexts`, sums are exact per sequence.
- MLA (DeepSeek-V3): decode runs in the absorbed form (W_UK folded into the query, attention over
  the latent cache of kv_lora_rank + rope dims, W_UV applied after), prefill in the expanded form
  (kv_b_proj up-projects the latents of all keys). The latent cache is shared by all heads, so it
  is replicated on every attn_tp socket.
- Tensor parallel: heads split by attn_tp, rounded up; KV heads are replicated when
  attn_tp > num_kv_heads (every socket holds ceil(kv_heads / attn_tp) >= 1 of them). Dense FFN
  and shared experts split by mlp_tp, each routed expert's matrices by expert_tp, routed experts
  over ep groups (ceil(E / ep) per socket), embedding and LM head by vocab_tp. Router weights are
  replicated.
- MoE weights: under uniform top-k routing of N = batch * new_tokens tokens, the expected number
  of distinct experts a layer touches is E * (1 - (1 - k/E)^N) (min(E, N*k) with
  `shape.spread`, the routing kernel collectors time; fewer through a group-limited router,
  spread_experts); a socket holding E/ep of them
  reads the weights of that many times E_local/E, times `shard.expert_load` for the busiest
  socket, capped at E_local. Expert FLOPs follow the token-expert assignments: N*k/ep, times
  expert_load.
- Expert parallel: dispatch and combine are all_to_all over "ep"; each rank contributes the
  activations of its N/ep tokens (its own tokens under attention data parallelism), k copies
  each, as DeepEP-class kernels send them (one copy per chosen expert); the busiest rank
  receives `expert_load` times the mean, so the payload is scaled by it. Dispatch carries FP8
  (one byte an element plus a float scale per 128) where the experts' GEMMs are FP8, combine the
  activations' dtype: DeepEP's "FP8 dispatching and BF16 combining".
- Attention data parallelism (shard.attn_dp > 1; SGLang --enable-dp-attention,
  docs/advanced_features/tp_dp_dp_attention_explainer.md): the step's sequences are split over
  attn_dp groups of attn_tp sockets; a socket runs the mixers, norms, residuals, router and
  (with ep > 1) the shared expert (Shard.shared_tp) on its group's sequences only, and the step
  lasts as long as the busiest group's, ceil(batch / attn_dp) sequences (with exact contexts:
  split round-robin, the group with the most cached tokens). Its KV cache holds those sequences
  alone. Dense FFN layers (DeepSeek's first three), routed experts without EP and the LM head
  run over the whole width on the gathered batch: an all_gather of the groups' tokens before,
  a reduce_scatter of the partial sums after (SGLang's dp_gather / dp_scatter with
  moe_dense_tp_size unset); the embedding is replicated (Shard.embed_tp).
- LM head: decode computes logits for every new token (speculative verification needs them all),
  prefill for the last token of each sequence only. Sampling follows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from workloads import params
from workloads.dtypes import DType
from workloads.ops import (
    Block,
    Collective,
    CollectiveKind,
    Graph,
    Op,
    OpClass,
    Shard,
    StepShape,
    Work,
)
from workloads.spec import FFN, LayerSpec, Mixer, ModelSpec, MoESpec, layer_runs, part


def _ceil(n: int, parts: int) -> int:
    return max(1, math.ceil(n / parts))


@dataclass(frozen=True)
class _Step:
    spec: ModelSpec
    shape: StepShape
    shard: Shard
    batch: np.ndarray
    new: np.ndarray
    context: np.ndarray

    @classmethod
    def of(cls, spec: ModelSpec, shape: StepShape, shard: Shard) -> _Step:
        arr = lambda x: np.asarray(x, dtype=float)
        return cls(spec, shape, shard, arr(shape.batch), arr(shape.new_tokens), arr(shape.context))

    @property
    def tokens(self) -> np.ndarray:
        return self.batch * self.new

    @property
    def w(self) -> float:
        return self.spec.precision.weights.bytes

    @property
    def a(self) -> float:
        return self.spec.precision.activations.bytes

    @property
    def flop_dtype(self) -> str:
        return self.spec.precision.activations.value

    def gemm_dtype(self, weights: DType) -> str:
        """The math of a GEMM over `weights`: FP8 weights are served W8A8 (activations quantized
        per token, the FP8 path of TensorRT-LLM and vLLM), so their GEMMs run at the chip's FP8
        rate where it has one (ChipSpec.flops falls back to BF16); other formats are up-converted
        to the activations' dtype (weight-only int4 / mxfp4)."""
        return DType.FP8.value if weights is DType.FP8 else self.flop_dtype

    def _per_sequence(self, f) -> np.ndarray:
        """Sum f(context) over the batch: exact with shape.contexts, else batch * f(mean)."""
        if self.shape.contexts is None:
            return self.batch * f(self.context)
        cs = np.asarray(self.shape.contexts, dtype=float).reshape((-1,) + (1,) * self.new.ndim)
        return np.sum(f(cs), axis=0)

    def pairs(self, window: int | None) -> np.ndarray:
        """(query, key) pairs of the step over the whole batch."""
        return self._per_sequence(lambda c: _span(c + self.new, window) - _span(c, window))

    def cached(self, window: int | None) -> np.ndarray:
        """Cached KV tokens read over the whole batch."""
        cap = np.inf if window is None else window
        return self._per_sequence(lambda c: np.minimum(c, cap))


def rank_shape(shape: StepShape, groups: int) -> StepShape:
    """The share of a step's sequences the busiest of `groups` attention data-parallel groups
    runs: ceil(batch / groups) sequences, or, with exact contexts, the round-robin share with
    the most cached tokens."""
    if groups <= 1:
        return shape
    if shape.contexts is not None:
        share = max((shape.contexts[i::groups] for i in range(groups)),
                    key=lambda c: (sum(c), len(c)))
        return replace(shape, batch=float(len(share)), context=float(np.mean(share)),
                       contexts=tuple(share))
    batch = np.ceil(np.asarray(shape.batch, dtype=float) / groups)
    return replace(shape, batch=float(batch) if batch.ndim == 0 else batch)


def _span(n: np.ndarray, window: int | None) -> np.ndarray:
    """sum_{j=1..n} min(W, j)."""
    full = n * (n + 1) / 2
    if window is None:
        return full
    return np.where(n <= window, full, window * (window + 1) / 2 + (n - window) * window)


# --- op constructors ---------------------------------------------------------------------------


def _matmul(s: _Step, name: str, rows: Work, k: int, n: int, bias: int = 0,
            cls: OpClass = OpClass.MATMUL) -> Op:
    return Op(
        name, cls,
        flops=2.0 * rows * k * n,
        weight_bytes=(k * n + bias) * s.w,
        act_in_bytes=rows * k * s.a,
        act_out_bytes=rows * n * s.a,
        flop_dtype=s.gemm_dtype(s.spec.precision.weights),
        column_bytes=k * s.w,
    )


def _norm(s: _Step, name: str, rows: Work, width: int, weights: int | None = None) -> Op:
    return Op(
        name, OpClass.NORM,
        flops=4.0 * rows * width,
        weight_bytes=(width if weights is None else weights) * s.w,
        act_in_bytes=rows * width * s.a,
        act_out_bytes=rows * width * s.a,
        flop_dtype=s.flop_dtype,
    )


def _eltwise(s: _Step, name: str, rows: Work, width: int, flops: float = 1.0,
             inputs: int = 1) -> Op:
    return Op(
        name, OpClass.ELEMENTWISE,
        flops=flops * rows * width,
        act_in_bytes=inputs * rows * width * s.a,
        act_out_bytes=rows * width * s.a,
        flop_dtype=s.flop_dtype,
    )


def _collective(name: str, kind: CollectiveKind, nbytes: Work, group: str, size: int) -> list[Op]:
    if size <= 1:
        return []
    return [Op(name, OpClass.COLLECTIVE, comm=Collective(kind, nbytes, group, size))]


def _all_reduce(s: _Step, name: str, group: str, size: int) -> list[Op]:
    return _collective(name, CollectiveKind.ALL_REDUCE, s.tokens * s.spec.hidden_size * s.a,
                       group, size)


def _residual(s: _Step, name: str) -> Op:
    return _eltwise(s, name, s.tokens, s.spec.hidden_size, inputs=2)


# --- mixers ------------------------------------------------------------------------------------


def _attention_ops(s: _Step, window: int | None) -> list[Op]:
    a, h, tp, t = part(s.spec.attention, "attention"), s.spec.hidden_size, s.shard.attn_tp, s.tokens
    if a.mla:
        return _mla_ops(s)
    hq, hkv = _ceil(a.num_heads, tp), _ceil(a.num_kv_heads, tp)
    q_out = hq * a.head_dim * (2 if a.output_gate else 1)
    bias = a.qkv_bias
    ops = [
        _norm(s, "input_norm", t, h),
        _matmul(s, "q_proj", t, h, q_out, q_out * bias),
        _matmul(s, "k_proj", t, h, hkv * a.head_dim, hkv * a.head_dim * bias),
        _matmul(s, "v_proj", t, h, hkv * a.v_head_dim, hkv * a.v_head_dim * bias),
    ]
    if a.qk_norm:
        ops += [_norm(s, "q_norm", t, hq * a.head_dim, a.head_dim),
                _norm(s, "k_norm", t, hkv * a.head_dim, a.head_dim)]
    rot = a.rotary_dim or a.head_dim
    ops.append(_eltwise(s, "rope", t, (hq + hkv) * rot, flops=3.0))
    kv_token = hkv * (a.head_dim + a.v_head_dim) * s.spec.precision.kv_cache.bytes
    pairs = s.pairs(window)
    ops.append(Op(
        "attention", OpClass.ATTENTION,
        flops=pairs * hq * (2.0 * a.head_dim + 2.0 * a.v_head_dim + 5.0),
        weight_bytes=hq * s.w if a.sinks else 0.0,
        kv_read_bytes=s.cached(window) * kv_token,
        kv_write_bytes=t * kv_token,
        act_in_bytes=t * hq * a.head_dim * s.a,
        act_out_bytes=t * hq * a.v_head_dim * s.a,
        flop_dtype=s.flop_dtype,
        streams=s.batch * hkv,
        query_group=hq / hkv,
    ))
    if a.output_gate:
        ops.append(_eltwise(s, "output_gate", t, hq * a.v_head_dim, flops=5.0, inputs=2))
    ops.append(_matmul(s, "o_proj", t, hq * a.v_head_dim, h, h if a.o_bias else 0))
    return ops


def _mla_ops(s: _Step) -> list[Op]:
    a, h, t = part(s.spec.attention, "attention"), s.spec.hidden_size, s.tokens
    hq = _ceil(a.num_heads, s.shard.attn_tp)
    (nope, rope, lat), vd = a.mla_dims, a.v_head_dim
    ops = [_norm(s, "input_norm", t, h)]
    # q_a_proj and kv_a_proj read the same input: serving stacks run them as one GEMM
    # (SGLang fused_qkv_a_proj_with_mqa, vLLM fused_qkv_a_proj, TensorRT-LLM's fused_a), so
    # they are siblings here, before the norms that follow each
    if a.q_lora_rank:
        ops += [_matmul(s, "q_a_proj", t, h, a.q_lora_rank),
                _matmul(s, "kv_a_proj", t, h, lat + rope),
                _norm(s, "q_a_norm", t, a.q_lora_rank),
                _matmul(s, "q_b_proj", t, a.q_lora_rank, hq * (nope + rope))]
    else:
        ops += [_matmul(s, "q_proj", t, h, hq * (nope + rope)),
                _matmul(s, "kv_a_proj", t, h, lat + rope)]
    ops += [_norm(s, "kv_a_norm", t, lat),
            _eltwise(s, "rope", t, (hq + 1) * rope, flops=3.0)]
    kv_token = (lat + rope) * s.spec.precision.kv_cache.bytes
    pairs, cached = s.pairs(None), s.cached(None)
    absorbed = s.shape.phase == "decode"
    if absorbed:
        ops.append(_matmul(s, "q_absorb", t * hq, nope, lat))
        per_pair, q_width, o_width = 2.0 * (lat + rope) + 2.0 * lat, lat + rope, lat
    else:
        ops.append(_matmul(s, "kv_b_proj", t + cached, lat, hq * (nope + vd)))
        per_pair, q_width, o_width = 2.0 * (nope + rope) + 2.0 * vd, nope + rope, vd
    ops.append(Op(
        "attention", OpClass.ATTENTION,
        flops=pairs * hq * (per_pair + 5.0),
        kv_read_bytes=cached * kv_token,
        kv_write_bytes=t * kv_token,
        act_in_bytes=t * hq * q_width * s.a,
        act_out_bytes=t * hq * o_width * s.a,
        flop_dtype=s.flop_dtype,
        streams=s.batch,  # one latent KV head
        family="mla",
    ))
    if absorbed:
        ops.append(_matmul(s, "v_up_proj", t * hq, lat, vd))
    ops.append(_matmul(s, "o_proj", t, hq * vd, h))
    return ops


def _state_op(s: _Step, name: str, state: int, flops_per: float, act_in: int, act_out: int,
              weights: int) -> Op:
    """A recurrent update: the state is read and written once per sequence per step."""
    sb = state * s.spec.precision.state_dtype.bytes
    return Op(
        name, OpClass.LINEAR_ATTENTION,
        flops=flops_per * s.tokens * state,
        weight_bytes=weights * s.w,
        kv_read_bytes=s.batch * sb,
        kv_write_bytes=s.batch * sb,
        act_in_bytes=s.tokens * act_in * s.a,
        act_out_bytes=s.tokens * act_out * s.a,
        flop_dtype=s.flop_dtype,
    )


def _conv_op(s: _Step, channels: int, kernel: int, bias: bool) -> Op:
    """Causal depthwise conv1d; its last kernel-1 inputs are per-sequence state."""
    sb = channels * (kernel - 1) * s.spec.precision.state_dtype.bytes
    return Op(
        "conv1d", OpClass.ELEMENTWISE,
        flops=2.0 * kernel * s.tokens * channels,
        weight_bytes=channels * (kernel + bias) * s.w,
        kv_read_bytes=s.batch * sb,
        kv_write_bytes=s.batch * sb,
        act_in_bytes=s.tokens * channels * s.a,
        act_out_bytes=s.tokens * channels * s.a,
        flop_dtype=s.flop_dtype,
    )


def _linear_attention_ops(s: _Step) -> list[Op]:
    """Gated DeltaNet (Qwen3-Next). Per value head and token the delta rule costs ~7 FLOPs per
    state element: decay (1), retrieval k^T S (2), rank-1 update (2), readout q^T S (2)."""
    la, h, t, tp = part(s.spec.linear_attention, "linear attention"), s.spec.hidden_size, s.tokens, s.shard.attn_tp
    nk, nv = _ceil(la.num_key_heads, tp), _ceil(la.num_value_heads, tp)
    kd, vd = nk * la.key_head_dim, nv * la.value_head_dim
    state = nv * la.key_head_dim * la.value_head_dim
    return [
        _norm(s, "input_norm", t, h),
        _matmul(s, "in_proj_qkvz", t, h, 2 * kd + 2 * vd),
        _matmul(s, "in_proj_ba", t, h, 2 * nv),
        _conv_op(s, 2 * kd + vd, la.conv_kernel, bias=False),
        _eltwise(s, "qk_l2norm_gates", t, 2 * kd + 2 * nv, flops=4.0),
        _state_op(s, "delta_rule", state, 7.0, 2 * kd + vd + 2 * nv, vd, 2 * nv),
        _norm(s, "gated_norm", t, vd, la.value_head_dim),
        _matmul(s, "out_proj", t, vd, h),
    ]


def _mamba_ops(s: _Step) -> list[Op]:
    """Mamba-2 (SSD). Per token ~6 FLOPs per state element: decay, B x outer product, C readout,
    each a multiply-add, plus the D skip and gate (small)."""
    m, h, t, tp = part(s.spec.mamba, "Mamba-2 mixer"), s.spec.hidden_size, s.tokens, s.shard.attn_tp
    heads, groups = _ceil(m.num_heads, tp), _ceil(m.n_groups, tp)
    d_inner, bc = heads * m.head_dim, 2 * groups * m.state_size
    state = heads * m.head_dim * m.state_size
    return [
        _norm(s, "input_norm", t, h),
        _matmul(s, "in_proj", t, h, 2 * d_inner + bc + heads),
        _conv_op(s, d_inner + bc, m.conv_kernel, bias=True),
        _eltwise(s, "silu", t, d_inner + bc, flops=4.0),
        _state_op(s, "ssm_scan", state, 6.0, d_inner + bc + heads, d_inner, 3 * heads),
        _norm(s, "gated_norm", t, d_inner),
        _matmul(s, "out_proj", t, d_inner, h),
    ]


def _mixer_ops(s: _Step, mixer: Mixer) -> list[Op]:
    if mixer is Mixer.FULL_ATTENTION:
        ops = _attention_ops(s, None)
    elif mixer is Mixer.SLIDING_ATTENTION:
        ops = _attention_ops(s, part(s.spec.attention, "attention").sliding_window)
    elif mixer is Mixer.LINEAR_ATTENTION:
        ops = _linear_attention_ops(s)
    elif mixer is Mixer.MAMBA2:
        ops = _mamba_ops(s)
    else:
        return []
    return ops + _all_reduce(s, "attn_all_reduce", "attn_tp", s.shard.attn_tp) + [
        _residual(s, "attn_residual")
    ]


# --- feed-forward ------------------------------------------------------------------------------


def _mlp_ops(s: _Step, prefix: str, rows: Work, width: int, matrices: int,
             cls: OpClass = OpClass.MATMUL) -> list[Op]:
    h = s.spec.hidden_size
    ops = [_matmul(s, f"{prefix}gate_proj", rows, h, width, cls=cls)] if matrices == 3 else []
    ops += [
        _matmul(s, f"{prefix}up_proj", rows, h, width, cls=cls),
        _eltwise(s, f"{prefix}act", rows, width, flops=4.0, inputs=matrices - 1),
        _matmul(s, f"{prefix}down_proj", rows, width, h, cls=cls),
    ]
    return ops


def _dense_ops(s: _Step) -> list[Op]:
    width = _ceil(s.spec.intermediate_size, s.shard.mlp_tp)
    return _mlp_ops(s, "", s.tokens, width, s.spec.ffn_matrices) + _all_reduce(
        s, "mlp_all_reduce", "mlp_tp", s.shard.mlp_tp
    )


def _gathered(s: _Step, r: _Step, name: str, group: str, size: int, body: list[Op]) -> list[Op]:
    """`body` over the whole stage on the gathered batch, under attention data parallelism:
    each socket contributes its group's tokens (a 1/attn_tp slice of them) to an all_gather,
    and the partial sums go back by a reduce_scatter (SGLang dp_gather / dp_scatter)."""
    h, a = s.spec.hidden_size, s.a
    return (_collective(f"{name}_gather", CollectiveKind.ALL_GATHER,
                        r.tokens / r.shard.attn_tp * h * a, group, size)
            + [op for op in body if op.cls is not OpClass.COLLECTIVE]
            + _collective(f"{name}_scatter", CollectiveKind.REDUCE_SCATTER, s.tokens * h * a,
                          group, size))


def distinct_experts(num_experts: int, top_k: int, tokens: Work) -> Work:
    """Expected distinct experts touched by `tokens` tokens, each choosing top_k of num_experts
    uniformly: E * (1 - (1 - k/E)^tokens)."""
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** np.asarray(tokens, dtype=float))


def spread_experts(moe: MoESpec, tokens: Work, grouped: bool = False) -> Work:
    """Distinct experts `tokens` tokens touch under a kernel collector's "balanced" routing
    (StepShape.spread): min(E, N k), each token's experts unlike any other's. `grouped`: those
    logits go through the model's group-limited router (AIConfigurator's SGLang 0.5.14 collector
    runs DeepSeek-V3 through SGLang's TopK with n_group 8, topk_group 4). A token's balanced
    experts then lie one per group (stride E / top_k = the group size), so every group scores the
    same; the router keeps topk_groups of the expert_groups groups, the same ones for every token
    (ties broken by index: sgl-kernel moe_fused_gate), hence that share of its own experts, and
    fills the rest of its top_k with tied experts, again the same for every token:
    min(E g, N k g + k (1 - g)) experts with g = topk_groups / expert_groups."""
    kept = moe.topk_groups / moe.expert_groups if grouped else 1.0
    return np.minimum(moe.num_experts * kept,
                      np.asarray(tokens, dtype=float) * moe.top_k * kept + moe.top_k * (1.0 - kept))


def _expert_ops(s: _Step) -> list[Op]:
    moe, h, sh = part(s.spec.moe, "MoE"), s.spec.hidden_size, s.shard
    e_local = _ceil(moe.num_experts, sh.ep)
    inter = _ceil(moe.expert_intermediate, sh.expert_tp)
    # identical sequences choose the same experts: the batch touches what one sequence does
    routed = s.new if s.shape.identical else s.tokens
    distinct = (spread_experts(moe, routed, s.shape.spread_grouped) if s.shape.spread
                else distinct_experts(moe.num_experts, moe.top_k, routed))
    touched = distinct * e_local / moe.num_experts
    touched = np.minimum(touched * sh.expert_load, e_local)
    rows = s.tokens * moe.top_k / sh.ep * sh.expert_load
    we = s.spec.precision.routed_expert_weights.bytes

    def matmul(name: str, k: int, n: int) -> Op:
        bias = n if moe.expert_bias else 0  # gpt-oss: a bias on every expert projection
        return Op(name, OpClass.EXPERT, flops=2.0 * rows * k * n,
                  weight_bytes=touched * (k * n + bias) * we,
                  act_in_bytes=rows * k * s.a, act_out_bytes=rows * n * s.a,
                  flop_dtype=s.gemm_dtype(s.spec.precision.routed_expert_weights),
                  column_bytes=k * we, experts=float(e_local))

    gated = moe.expert_matrices == 3
    ops = [matmul("expert_gate_proj", h, inter)] if gated else []
    return ops + [
        matmul("expert_up_proj", h, inter),
        _eltwise(s, "expert_act", rows, inter, flops=4.0, inputs=2 if gated else 1),
        matmul("expert_down_proj", inter, h),
    ]


# DeepEP's FP8 dispatch: one byte an element plus a float32 scale per 128 (its README: "FP8
# dispatching"; the per-128-channel scales of DeepSeek-V3's FP8 recipe).
FP8_DISPATCH_BYTES = 1.0 + 4.0 / 128


def _a2a_ops(s: _Step, r: _Step, name: str, element_bytes: float) -> list[Op]:
    """A dispatch or combine over "ep": each rank's tokens, one copy per chosen expert, with the
    busiest rank's load (module docstring)."""
    moe, sh = part(s.spec.moe, "MoE"), s.shard
    own = r.tokens / r.shard.attn_tp if sh.attn_dp > 1 else s.tokens / sh.ep
    nbytes = own * moe.top_k * s.spec.hidden_size * element_bytes * sh.expert_load
    return _collective(name, CollectiveKind.ALL_TO_ALL, nbytes, "ep", sh.ep)


def _shared_ops(s: _Step) -> list[Op]:
    moe = part(s.spec.moe, "MoE")
    if not moe.shared_intermediate:
        return []
    ops = _mlp_ops(s, "shared_", s.tokens, _ceil(moe.shared_intermediate, s.shard.shared_tp), 3)
    if moe.shared_expert_gate:
        ops.append(_matmul(s, "shared_expert_gate", s.tokens, s.spec.hidden_size, 1))
    return ops


def _moe_ops(s: _Step, r: _Step) -> list[Op]:
    """`r`: the step of this socket's own sequences (`s` itself without attention DP)."""
    moe, h, t, sh = part(s.spec.moe, "MoE"), s.spec.hidden_size, r.tokens, s.shard
    router_bias = moe.num_experts if moe.router_bias else 0
    ops = [
        _matmul(r, "router", t, h, moe.num_experts, router_bias, cls=OpClass.ROUTER),
        Op("router_topk", OpClass.ROUTER, flops=5.0 * t * moe.num_experts,
           act_in_bytes=t * moe.num_experts * s.a, act_out_bytes=t * moe.top_k * 8.0,
           flop_dtype=s.flop_dtype),
    ]
    if sh.attn_dp > 1 and sh.ep == 1:  # experts split over the width, on the gathered batch
        body = _expert_ops(s) + _shared_ops(s)
        return ops + _gathered(s, r, "expert", "expert_tp", sh.expert_tp, body) + [
            _eltwise(r, "expert_combine", t, h, flops=2.0 * moe.top_k, inputs=moe.top_k)]
    fp8 = s.gemm_dtype(s.spec.precision.routed_expert_weights) == DType.FP8.value
    ops += _a2a_ops(s, r, "ep_dispatch", FP8_DISPATCH_BYTES if fp8 else s.a)
    ops += _expert_ops(s)
    ops += _a2a_ops(s, r, "ep_combine", s.a)
    ops.append(_eltwise(r, "expert_combine", t, h, flops=2.0 * moe.top_k, inputs=moe.top_k))
    ops += _shared_ops(r)
    ops += _all_reduce(s, "expert_all_reduce", "expert_tp", sh.expert_tp)
    if moe.shared_intermediate and sh.shared_tp not in (1, sh.expert_tp):
        ops += _all_reduce(s, "shared_all_reduce", "mlp_tp", sh.mlp_tp)
    return ops


def _ffn_ops(s: _Step, r: _Step, layer: LayerSpec) -> list[Op]:
    if layer.ffn is FFN.NONE:
        return []
    norm = "post_attention_norm" if layer.mixer is not Mixer.NONE else "input_norm"
    if layer.ffn is FFN.MOE:
        body = _moe_ops(s, r)
    elif s.shard.attn_dp > 1:
        body = _gathered(s, r, "mlp", "mlp_tp", s.shard.mlp_tp, _dense_ops(s))
    else:
        body = _dense_ops(s)
    return [_norm(r, norm, r.tokens, s.spec.hidden_size)] + body + [_residual(r, "mlp_residual")]


def _steps(spec: ModelSpec, shape: StepShape, shard: Shard) -> tuple[_Step, _Step]:
    """The whole step and this socket's own share of its sequences (the same without attention
    data parallelism)."""
    s = _Step.of(spec, shape, shard)
    if shard.attn_dp <= 1:
        return s, s
    return s, _Step.of(spec, rank_shape(shape, shard.attn_dp), shard)


def layer_ops(spec: ModelSpec, layer: LayerSpec, shape: StepShape, shard: Shard) -> list[Op]:
    """The ops of one decoder layer, in execution order."""
    s, r = _steps(spec, shape, shard)
    return _mixer_ops(r, layer.mixer) + _ffn_ops(s, r, layer)


# --- prologue, epilogue, graph -----------------------------------------------------------------


def _prologue(r: _Step) -> Block:
    """The embedding of this socket's tokens (`r`: its own share under attention DP)."""
    h, etp = r.spec.hidden_size, r.shard.embed_tp
    embed = Op("embedding", OpClass.EMBEDDING,
               weight_bytes=r.tokens * h * r.w / etp,  # the rows gathered that this socket holds
               act_in_bytes=r.tokens * 4.0,  # int32 token ids
               act_out_bytes=r.tokens * h * r.a)
    return Block("embedding", (embed, *_all_reduce(r, "embedding_all_reduce", "vocab_tp", etp)))


def _epilogue(s: _Step, r: _Step) -> Block:
    h, v, vtp = s.spec.hidden_size, s.spec.vocab_size, s.shard.vocab_tp
    rows = s.tokens if s.shape.phase != "prefill" else s.batch
    own = r.tokens if r.shape.phase != "prefill" else r.batch
    v_local = _ceil(v, vtp)
    head = [_matmul(s, "lm_head", rows, h, v_local, cls=OpClass.LM_HEAD),
            *_collective("logits_all_gather", CollectiveKind.ALL_GATHER, rows * v_local * s.a,
                         "vocab_tp", vtp)]
    if s.shard.attn_dp > 1:  # the LM head over the whole width on the gathered rows
        head = _collective("lm_head_gather", CollectiveKind.ALL_GATHER,
                           own / r.shard.attn_tp * h * s.a, "vocab_tp", vtp) + head
    ops = [
        _norm(r, "final_norm", r.tokens, h),
        *head,
        Op("sampling", OpClass.SAMPLING, flops=5.0 * own * v, act_in_bytes=own * v * s.a,
           act_out_bytes=own * 4.0, flop_dtype=s.flop_dtype),
    ]
    return Block("lm_head", tuple(ops))


def step_graph(spec: ModelSpec, shape: StepShape, shard: Shard | None = None) -> Graph:
    """The work of one forward step on one socket: embedding, one Block per run of identical
    layers, then final norm, LM head and sampling."""
    shard = shard or Shard()
    s, r = _steps(spec, shape, shard)
    blocks = [_prologue(r)]
    kinds: dict[LayerSpec, tuple[Op, ...]] = {}  # a hybrid alternates a few layer kinds
    for first, count, layer in layer_runs(spec.layers):
        if layer not in kinds:
            kinds[layer] = tuple(_mixer_ops(r, layer.mixer) + _ffn_ops(s, r, layer))
        ops = kinds[layer]
        name = f"layers_{first}-{first + count - 1}_{layer.mixer.value}_{layer.ffn.value}"
        blocks.append(Block(name, ops, repeat=count, first_layer=first))
    blocks.append(_epilogue(s, r))
    return Graph(spec.name, shape, shard, tuple(blocks))


def decode_graph(spec: ModelSpec, batch: Work, context: Work, shard: Shard | None = None) -> Graph:
    """One decode step: `batch` sequences, one new token each, `context` tokens cached."""
    return step_graph(spec, StepShape.decode(batch, context), shard)


def prefill_graph(spec: ModelSpec, batch: Work, prompt_len: Work,
                  shard: Shard | None = None) -> Graph:
    """The prompt's forward pass: `batch` prompts of `prompt_len` tokens, nothing cached."""
    return step_graph(spec, StepShape.prefill(batch, prompt_len), shard)


# --- memory helpers ----------------------------------------------------------------------------


def _attention_kv_per_token(spec: ModelSpec) -> float:
    """KV bytes one token adds to one attention layer (whole model, no sharding)."""
    a = part(spec.attention, "attention")
    values = sum(a.mla_dims[1:]) if a.mla else a.num_kv_heads * (a.head_dim + a.v_head_dim)
    return values * spec.precision.kv_cache.bytes


def state_bytes_per_sequence(spec: ModelSpec, mixer: Mixer) -> float:
    """Fixed per-sequence cache of a linear-attention or Mamba-2 layer: recurrent state plus the
    conv1d's last kernel-1 inputs."""
    sb = spec.precision.state_dtype.bytes
    if mixer is Mixer.LINEAR_ATTENTION:
        la = part(spec.linear_attention, "linear attention")
        conv = 2 * la.num_key_heads * la.key_head_dim + la.num_value_heads * la.value_head_dim
        state = la.num_value_heads * la.key_head_dim * la.value_head_dim
        return (state + conv * (la.conv_kernel - 1)) * sb
    if mixer is Mixer.MAMBA2:
        m = part(spec.mamba, "Mamba-2 mixer")
        conv = m.num_heads * m.head_dim + 2 * m.n_groups * m.state_size
        return (m.num_heads * m.head_dim * m.state_size + conv * (m.conv_kernel - 1)) * sb
    return 0.0


def kv_bytes_per_token(spec: ModelSpec) -> float:
    """KV bytes one token of context adds over all attention layers (sliding layers included,
    before their window caps them; linear / Mamba layers hold a fixed state instead)."""
    n = sum(la.mixer in (Mixer.FULL_ATTENTION, Mixer.SLIDING_ATTENTION) for la in spec.layers)
    return n * _attention_kv_per_token(spec) if n else 0.0


def kv_cache_bytes(spec: ModelSpec, batch: Work, context: Work) -> Work:
    """The whole model's cache for `batch` sequences of `context` tokens: full-attention layers
    grow with context, sliding layers up to their window, linear / Mamba layers fixed."""
    b, c = np.asarray(batch, dtype=float), np.asarray(context, dtype=float)
    total: Work = 0.0
    for layer in spec.layers:
        if layer.mixer is Mixer.FULL_ATTENTION:
            total = total + b * c * _attention_kv_per_token(spec)
        elif layer.mixer is Mixer.SLIDING_ATTENTION:
            window = part(spec.attention, "attention").sliding_window or np.inf
            total = total + b * np.minimum(c, window) * _attention_kv_per_token(spec)
        else:
            total = total + b * state_bytes_per_sequence(spec, layer.mixer)
    return total


def weight_bytes(spec: ModelSpec, include_mtp: bool = False) -> float:
    """Bytes of all weights at the spec's precision (routed experts at their own type), as
    counted by workloads.params."""
    parts = params.param_breakdown(spec)
    experts = parts.pop("routed_experts")
    mtp = parts.pop("mtp")
    p = spec.precision
    total = sum(parts.values()) * p.weights.bytes + experts * p.routed_expert_weights.bytes
    return float(total + (mtp * p.weights.bytes if include_mtp else 0.0))
