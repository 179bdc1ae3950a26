"""Hand-built operator graphs with Llama-like shapes, for testing execution models without the
graph builder: one decoder layer block (repeated), a prologue and an epilogue."""

from __future__ import annotations

import numpy as np

from workloads.ops import (
    Block,
    Collective,
    CollectiveKind,
    Graph,
    Op,
    OpClass,
    Shard,
    StepShape,
)

BF16 = 2.0


def toy_graph(
    batch=1.0,
    context=4096.0,
    tp: int = 1,
    layers: int = 32,
    hidden: int = 4096,
    inter: int = 14336,
    heads: int = 32,
    kv_heads: int = 8,
    head_dim: int = 128,
    vocab: int = 128256,
    new_tokens=1.0,
) -> Graph:
    b = np.asarray(batch, dtype=float)
    ctx = np.asarray(context, dtype=float)
    t = b * new_tokens  # tokens in the step
    h = hidden
    q, kv = heads * head_dim // tp, kv_heads * head_dim // tp
    act = t * h * BF16

    def mm(name, k, n, cls=OpClass.MATMUL):
        return Op(
            name,
            cls,
            flops=2 * t * k * n,
            weight_bytes=k * n * BF16,
            act_in_bytes=t * k * BF16,
            act_out_bytes=t * n * BF16,
        )

    kv_bytes = b * (ctx + new_tokens) * 2 * kv * BF16
    scores = t * heads / tp * (ctx + new_tokens) * BF16
    ops = [
        Op("attn_norm", OpClass.NORM, flops=4 * t * h, act_in_bytes=act, act_out_bytes=act),
        mm("qkv", h, q + 2 * kv),
        Op(
            "rope",
            OpClass.ELEMENTWISE,
            flops=6 * t * (q + kv),
            act_in_bytes=t * (q + 2 * kv) * BF16,
            act_out_bytes=t * (q + 2 * kv) * BF16,
        ),
        Op(
            "attn_score",
            OpClass.ATTENTION,
            flops=2 * t * q * (ctx + new_tokens),
            kv_read_bytes=kv_bytes / 2,
            kv_write_bytes=t * 2 * kv * BF16,
            act_in_bytes=t * q * BF16,
            act_out_bytes=scores,
        ),
        Op(
            "softmax",
            OpClass.ATTENTION,
            flops=5 * scores / BF16,
            act_in_bytes=scores,
            act_out_bytes=scores,
        ),
        Op(
            "attn_value",
            OpClass.ATTENTION,
            flops=2 * t * q * (ctx + new_tokens),
            kv_read_bytes=kv_bytes / 2,
            act_in_bytes=scores,
            act_out_bytes=t * q * BF16,
        ),
        mm("o_proj", q, h),
    ]
    if tp > 1:
        ops.append(
            Op(
                "attn_allreduce",
                OpClass.COLLECTIVE,
                act_in_bytes=act,
                act_out_bytes=act,
                comm=Collective(CollectiveKind.ALL_REDUCE, act, "attn_tp", tp),
            )
        )
    ops += [
        Op(
            "attn_residual",
            OpClass.ELEMENTWISE,
            flops=t * h,
            act_in_bytes=2 * act,
            act_out_bytes=act,
        ),
        Op("mlp_norm", OpClass.NORM, flops=4 * t * h, act_in_bytes=act, act_out_bytes=act),
        mm("gate_up", h, 2 * inter // tp),
        Op(
            "act_mul",
            OpClass.ELEMENTWISE,
            flops=4 * t * inter / tp,
            act_in_bytes=t * 2 * inter / tp * BF16,
            act_out_bytes=t * inter / tp * BF16,
        ),
        mm("down", inter // tp, h),
    ]
    if tp > 1:
        ops.append(
            Op(
                "mlp_allreduce",
                OpClass.COLLECTIVE,
                act_in_bytes=act,
                act_out_bytes=act,
                comm=Collective(CollectiveKind.ALL_REDUCE, act, "mlp_tp", tp),
            )
        )
    ops.append(
        Op(
            "mlp_residual",
            OpClass.ELEMENTWISE,
            flops=t * h,
            act_in_bytes=2 * act,
            act_out_bytes=act,
        )
    )
    prologue = Block(
        "prologue",
        (Op("embed", OpClass.EMBEDDING, weight_bytes=t * h * BF16, act_out_bytes=act),),
        1,
        -1,
    )
    epilogue = Block(
        "epilogue",
        (
            Op("final_norm", OpClass.NORM, flops=4 * t * h, act_in_bytes=act, act_out_bytes=act),
            mm("lm_head", h, vocab // tp, OpClass.LM_HEAD),
            Op(
                "sample",
                OpClass.SAMPLING,
                flops=t * vocab,
                act_in_bytes=t * vocab / tp * BF16,
                act_out_bytes=t * 4,
            ),
        ),
        1,
        -1,
    )
    layer = Block("decoder", tuple(ops), layers, 0)
    shape = StepShape("decode" if new_tokens == 1.0 else "prefill", b, new_tokens, ctx)
    return Graph("toy-llama", shape, Shard.tensor(tp), (prologue, layer, epilogue))


def alpha_beta(alpha: float = 1e-6, bw: float = 100e9):
    """A ring all-reduce cost: 2(p-1) steps of alpha + bytes/p/bw."""

    def time(c: Collective):
        p = c.size
        if p <= 1:
            return 0.0
        return 2 * (p - 1) * (alpha + np.asarray(c.bytes) / p / bw)

    return time
