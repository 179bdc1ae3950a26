"""Importers of the dense decoder families: one attention kind or a local/global pattern, a
dense FFN in every layer (`_dense_family`, `_gemma`): llama, mistral, qwen2, qwen3, gemma2,
gemma3, phi3, starcoder2; and mistral3, a multimodal config whose text model is a mistral or
llama one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from workloads.hf_config.common import (
    IMPORTERS,
    Cfg,
    base,
    gqa,
    layer_pattern,
    register,
    sliding_window,
    uniform,
)
from workloads.spec import FFN, LayerSpec, Mixer, ModelSpec


def _dense_family(c: Cfg, name: str, **attn: Any) -> ModelSpec:
    window = sliding_window(c)
    mixer = Mixer.SLIDING_ATTENTION if window else Mixer.FULL_ATTENTION
    return base(
        c,
        name,
        uniform(c, mixer, FFN.DENSE),
        attention=gqa(c, sliding_window=window, **attn),
        intermediate_size=c.size("intermediate_size"),
    )


# --- importers, one per model_type ------------------------------------------------------------


@register("llama", context=2048)  # LlamaConfig
def _llama(c: Cfg, name: str) -> ModelSpec:
    return _dense_family(
        c,
        name,
        qkv_bias=c.flag("attention_bias", False),
        o_bias=c.flag("attention_bias", False),
    )


@register("mistral", context=4096 * 32)  # MistralConfig
def _mistral(c: Cfg, name: str) -> ModelSpec:
    return _dense_family(c, name)


@register("qwen2", context=32768)  # Qwen2Config
def _qwen2(c: Cfg, name: str) -> ModelSpec:
    # Qwen2 has biases on q/k/v (not o) by construction; no config key says so.
    return _dense_family(c, name, qkv_bias=True)


@register("qwen3", context=32768)  # Qwen3Config
def _qwen3(c: Cfg, name: str) -> ModelSpec:
    return _dense_family(c, name, qk_norm=True, qkv_bias=c.flag("attention_bias", False))


# --- 2025 families: local/global attention, nested text configs -------------------------------


def _gemma(c: Cfg, name: str, default: Callable[[int], str], **attn: Any) -> ModelSpec:
    """Gemma 2 / 3: sliding (local) and full (global) attention layers, GeGLU MLP, tied
    embeddings by default, a post-norm after attention and after the MLP besides the pre-norms.
    Logit soft-capping and query_pre_attn_scalar change no shape and are not costed."""
    n = c.size("num_hidden_layers")
    layers = tuple(LayerSpec(m, FFN.DENSE) for m in layer_pattern(c, n, default))
    window = c.size("sliding_window") if Mixer.SLIDING_ATTENTION in {la.mixer for la in layers} \
        else None
    return base(
        c, name, layers, attention=gqa(c, sliding_window=window, **attn),
        intermediate_size=c.size("intermediate_size"), sandwich_norms=True,
        tie_embeddings=c.flag("tie_word_embeddings", True),
    )


@register("gemma2", context=8192)  # Gemma2Config
def _gemma2(c: Cfg, name: str) -> ModelSpec:
    """Gemma 2: even layers sliding, odd layers global (Gemma2DecoderLayer)."""
    return _gemma(c, name, lambda i: "sliding_attention" if i % 2 == 0 else "full_attention")


# gemma3_text: Gemma 3 1B and text-only exports. The context default is Gemma3TextConfig's
# (the text model of Gemma3Config)
@register("gemma3", "gemma3_text", context=131072)
def _gemma3(c: Cfg, name: str) -> ModelSpec:
    """Gemma 3: every `sliding_window_pattern`-th layer global, the rest sliding; q/k RMSNorm.
    The multimodal checkpoints nest the text model under `text_config` and leave out the keys at
    Gemma3TextConfig's defaults; the ones that matter here are supplied as that class does:
    vocab_size 262208, sliding_window_pattern 6 (max_position_embeddings: its `register`'s
    context)."""
    t = c.nested("text_config", "gemma3_text")
    t = Cfg({"vocab_size": 262208} | dict(t.data), t.source, t.model_type)
    every = t.size("sliding_window_pattern", 6)
    rule = lambda i: "full_attention" if (i + 1) % every == 0 else "sliding_attention"
    return _gemma(t, name, rule, qk_norm=True)


@register("phi3", context=4096)  # Phi3Config
def _phi3(c: Cfg, name: str) -> ModelSpec:
    """Phi-3 / Phi-4 (model_type phi3): Llama's shapes with fused qkv and gate_up projections
    (the same parameter count); `sliding_window` applies to every layer; partial rope
    (`partial_rotary_factor`, Phi-4-mini) where given."""
    head_dim = c.size("head_dim", c.size("hidden_size") // c.size("num_attention_heads"))
    rotary = round(head_dim * c.fraction("partial_rotary_factor", 1.0))
    return _dense_family(c, name, rotary_dim=rotary if rotary != head_dim else None)


@register("starcoder2", context=4096)  # Starcoder2Config
def _starcoder2(c: Cfg, name: str) -> ModelSpec:
    """StarCoder2 (Starcoder2Config, modeling_starcoder2): GQA with `sliding_window` on every
    layer, biases on every linear layer when `use_bias` (q/k/v/o and the MLP's c_fc / c_proj),
    LayerNorm with a bias (nn.LayerNorm whatever `norm_type` says), a plain two-matrix GELU MLP,
    and embeddings tied unless the config says otherwise (the class default is True)."""
    bias = c.flag("use_bias", True)
    spec = _dense_family(c, name, qkv_bias=bias, o_bias=bias)
    return replace(spec, ffn_matrices=2, ffn_bias=bias, norm_bias=True,
                   tie_embeddings=c.flag("tie_word_embeddings", True))


@register("mistral3")  # no context default: its text model's (`_context`)
def _mistral3(c: Cfg, name: str) -> ModelSpec:
    """Mistral 3 (Mistral-Small-3.1/3.2, Magistral): a Pixtral vision encoder and a Mistral
    language model under `text_config`, imported by the importer of its own model_type."""
    t = c.nested("text_config", "mistral")
    text_type = t.data["model_type"]
    if t is c or text_type not in _TEXT_OF_MISTRAL3:
        raise c.fail(f"field 'text_config.model_type': {text_type!r} unsupported; accepted: "
                     + ", ".join(_TEXT_OF_MISTRAL3))
    return IMPORTERS[text_type](t, name)


_TEXT_OF_MISTRAL3 = ("mistral", "llama")
