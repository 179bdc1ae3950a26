"""Numeric formats and the bytes one element occupies in memory."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from workloads.errors import ConfigError


class DType(str, Enum):
    FP32 = "fp32"
    BF16 = "bf16"
    FP16 = "fp16"
    FP8 = "fp8"
    INT8 = "int8"
    INT4 = "int4"
    MXFP4 = "mxfp4"

    @property
    def bytes(self) -> float:
        return _BYTES[self]

    @classmethod
    def parse(cls, text: str, field: str = "dtype") -> DType:
        try:
            return cls(text.lower())
        except ValueError:
            accepted = ", ".join(d.value for d in cls)
            raise ConfigError(f"{field}: unknown dtype {text!r}; accepted: {accepted}") from None


# int4: two values a byte, group scales ignored (they add <1% at group size 128 with bf16 scales).
# mxfp4: OCP Microscaling spec v1.0: 32 FP4 (E2M1) values share one 8-bit E8M0 scale, so
# (32*4 + 8) / 32 = 4.25 bits per value.
_BYTES = {
    DType.FP32: 4.0,
    DType.BF16: 2.0,
    DType.FP16: 2.0,
    DType.FP8: 1.0,
    DType.INT8: 1.0,
    DType.INT4: 0.5,
    DType.MXFP4: 4.25 / 8,
}


@dataclass(frozen=True)
class Precision:
    """A data type per tensor class. `expert_weights` overrides `weights` for routed experts
    (gpt-oss ships its experts in MXFP4 and everything else in BF16)."""

    weights: DType = DType.BF16
    kv_cache: DType = DType.BF16
    activations: DType = DType.BF16
    expert_weights: DType | None = None
    # Recurrent state of linear-attention / Mamba-2 layers; None: the kv_cache type.
    state: DType | None = None

    @property
    def state_dtype(self) -> DType:
        return self.state or self.kv_cache

    @property
    def routed_expert_weights(self) -> DType:
        return self.expert_weights or self.weights
