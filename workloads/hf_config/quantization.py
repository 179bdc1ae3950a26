"""A checkpoint's `quantization_config` as the weight dtype (`checkpoint_precision`): the
quant_methods of `QUANT_METHODS`, each read by its own settings.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from workloads import checks
from workloads.dtypes import DType, Precision
from workloads.hf_config.common import MAX_WIDTH, Cfg

# quant_method -> how its settings give the weight dtype. Sources: the transformers quantizer
# configs (FbgemmFp8Config, FineGrainedFP8Config "fp8", AwqConfig, GPTQConfig, BitsAndBytesConfig,
# Mxfp4Config) and compressed-tensors' QuantizationArgs (num_bits, type "float" | "int").
QUANT_METHODS = ("awq", "bitsandbytes", "compressed-tensors", "fbgemm_fp8", "fp8", "gptq",
                 "mxfp4")
_INT_BITS = {4: DType.INT4, 8: DType.INT8}


def checkpoint_precision(c: Cfg, moe: bool) -> tuple[Precision, str]:
    """The weight dtype a checkpoint's `quantization_config` gives, and a label saying so.

    BF16 without one. The dtype applies to every weight matrix; checkpoints keep a few tensors
    (embeddings, lm_head, norms, routers) in BF16, which this ignores (under 2% of the weights of
    the catalog's quantized models). MXFP4 checkpoints (gpt-oss) quantize only the routed
    experts."""
    q = c.data.get("quantization_config")
    if q is None:
        return Precision(), ""
    if not isinstance(q, Mapping):
        raise c.fail(f"field 'quantization_config' must be a JSON object, got {q!r}")
    method = q.get("quant_method")
    if method not in QUANT_METHODS:
        raise c.fail(f"field 'quantization_config.quant_method': {method!r} unsupported; "
                     f"accepted: {', '.join(QUANT_METHODS)}")
    if method == "mxfp4":
        # transformers' Mxfp4 quantizer replaces the routed experts' modules only (gpt-oss);
        # on a dense model it quantizes nothing, so its weights are not MXFP4
        if not moe:
            raise c.fail("field 'quantization_config.quant_method': mxfp4 quantizes a MoE "
                         "model's routed experts (gpt-oss); this model has none")
        return Precision(expert_weights=DType.MXFP4), "experts mxfp4 (quantization_config mxfp4)"
    _check_blocks(c, q)
    dtype = _quant_dtype(c, method, q)
    return Precision(weights=dtype), f"{dtype.value} (quantization_config {method})"


def _check_blocks(c: Cfg, q: Mapping[str, Any]) -> None:
    """FP8's `weight_block_size` (FineGrainedFP8Config): the [rows, columns] of a weight block
    sharing one scale, each a positive integer (DeepSeek-V3: [128, 128])."""
    blocks = q.get("weight_block_size")
    if blocks is None:
        return
    if (not isinstance(blocks, list) or len(blocks) != 2
            or not all(isinstance(b, int) and not isinstance(b, bool) and 0 < b <= MAX_WIDTH
                       for b in blocks)):
        raise c.fail("field 'quantization_config.weight_block_size' must be two positive "
                     f"integers (rows and columns a scale covers, e.g. [128, 128]), got "
                     f"{checks.show(blocks)}")


def _quant_dtype(c: Cfg, method: str, q: Mapping[str, Any]) -> DType:
    if method in ("fp8", "fbgemm_fp8"):
        return DType.FP8
    if method == "bitsandbytes":
        return _bnb_dtype(c, q)
    if method in ("awq", "gptq"):
        return _bits(c, "quantization_config.bits", q.get("bits"), "int")
    groups = q.get("config_groups")
    if not isinstance(groups, Mapping) or not groups:
        raise c.fail("field 'quantization_config.config_groups' must be a non-empty object")
    found = set()
    for key, group in groups.items():
        w = group.get("weights") if isinstance(group, Mapping) else None
        if not isinstance(w, Mapping):
            raise c.fail(f"field 'quantization_config.config_groups.{key}.weights' missing")
        where = f"quantization_config.config_groups.{key}.weights"
        found.add(_bits(c, f"{where}.num_bits", w.get("num_bits"), w.get("type", "int")))
    if len(found) > 1:
        raise c.fail("field 'quantization_config.config_groups': groups of different weight "
                     f"dtypes ({', '.join(sorted(d.value for d in found))}) are not supported")
    return found.pop()


def _bnb_dtype(c: Cfg, q: Mapping[str, Any]) -> DType:
    """BitsAndBytesConfig's flags: each a boolean (absent: false), at most one true, as its
    own checks require (a TypeError for a non-boolean, a ValueError for both)."""
    flags = {}
    for key in ("load_in_4bit", "load_in_8bit"):
        flags[key] = q.get(key, False)
        if not isinstance(flags[key], bool):
            raise c.fail(f"field 'quantization_config.{key}' must be true or false, got "
                         f"{checks.show(flags[key])}")
    if all(flags.values()):
        raise c.fail("field 'quantization_config': load_in_4bit and load_in_8bit are both true; "
                     "bitsandbytes takes one of them")
    if not any(flags.values()):
        raise c.fail("field 'quantization_config': bitsandbytes needs load_in_4bit or load_in_8bit")
    return DType.INT4 if flags["load_in_4bit"] else DType.INT8


def _bits(c: Cfg, where: str, bits: Any, kind: Any) -> DType:
    if kind == "float" and bits == 8:
        return DType.FP8
    if kind == "int" and bits in _INT_BITS:
        return _INT_BITS[bits]
    raise c.fail(f"field {where!r}: {kind} {bits!r}-bit weights unsupported; "
                 "accepted: int 4, int 8, float 8")
