"""What the importers of workloads.hf_config share: `Cfg`, a config dict that names itself in
errors and checks each field it hands out by the field's kind (the kind tables and size bounds
below); the pieces a ModelSpec is built from (`gqa`, `base`, `uniform`, `sliding_window`,
`layer_pattern`, `dense_width`, `top_k_of`, `qwen_moe_ffn`); and the registry, `IMPORTERS`,
that each family module fills with `@register`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from workloads import checks
from workloads.errors import ConfigError
from workloads.spec import FFN, AttentionSpec, LayerSpec, Mixer, ModelSpec

_MISSING = object()
# Top-level keys a nested text_config inherits when it does not set them itself.
_INHERITED = ("quantization_config", "tie_word_embeddings", "_name_or_path", "_rdu")

# The kind of every HF field the importers read other than through `size` (a positive integer),
# `count`, `fraction` or `flag` (which check their own kind): a field listed here is checked
# whichever importer reads it, and in every config.json whether read or not. A family added later
# reads its fields through those accessors; it lists a field here only to have it checked in
# configs of other families too. Names and meanings follow the transformers configuration classes.
_FLAGS = frozenset({
    "tie_word_embeddings", "attention_bias", "use_sliding_window", "use_qk_norm",
    "use_routing_bias", "use_mtp", "norm_topk_prob", "mlp_bias",
})
_COUNTS = frozenset({  # non-negative integers (0 is meaningful: no dense layer, no MTP module)
    "first_k_dense_replace", "n_shared_experts", "num_nextn_predict_layers", "num_mtp_modules",
    "shared_intermediate_size", "shared_expert_intermediate_size",
})
_INT_LISTS = frozenset({"attn_type_list"})  # mlp_only_layers: Cfg.layer_indices
_STR_LISTS = frozenset({"layer_types"})
_TABLES = frozenset({"quantization_config", "rope_scaling", "text_config", "_rdu"})
_TEXTS = frozenset({"topk_method", "mlp_hidden_act", "hidden_act", "hybrid_override_pattern",
                    "_name_or_path", "quant_method", "name"})
_FRACTIONS = frozenset({"partial_rotary_factor"})  # in (0, 1]

# Upper bounds of sizes, far above every published model (405B: 126 layers, hidden 16384; the
# largest MoE 512 experts; vocabularies ~262k; contexts 10M), below what would exhaust memory
# building per-layer tables. A value past one is a typo or hostile input.
MAX_LAYERS = 4096
_LIMITS = {
    "num_hidden_layers": MAX_LAYERS,
    "max_position_embeddings": 2**30,
    "sliding_window": 2**30,
    "vocab_size": 2**24,
    "num_local_experts": 2**16,
    "num_experts": 2**16,
    "n_routed_experts": 2**16,
}
MAX_WIDTH = 2**20  # any other size: hidden, intermediate, heads, head and LoRA dimensions


class Cfg:
    """A config dict that names itself in errors and checks each field it hands out."""

    def __init__(self, data: Mapping[str, Any], source: str, model_type: str):
        self.data, self.source, self.model_type = data, source, model_type

    def fail(self, what: str) -> ConfigError:
        return ConfigError(f"{self.source}: {what} (model_type {self.model_type})")

    def req(self, key: str) -> Any:
        value = self.data.get(key, _MISSING)
        if value is _MISSING or value is None:
            raise self.fail(f"missing field {key!r}")
        return self.get(key)

    def size(self, key: str, default: Any = _MISSING) -> int:
        """A positive integer field, at most its stated bound; `default` makes it optional."""
        value = self.data.get(key)
        if value is None:
            if default is _MISSING:
                raise self.fail(f"missing field {key!r}")
            return default
        hi = _LIMITS.get(key, MAX_WIDTH)
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= hi:
            raise self.fail(f"field {key!r} must be a positive integer (at most "
                            f"{checks.show_number(hi)}), got {checks.show(value)}")
        return value

    def get(self, key: str, default: Any = None) -> Any:
        """A field of a known kind (the tables above) checked for it; others as given."""
        value = self.data.get(key)
        if value is None:
            return default
        return self.checked(key, lambda w: kind_check(key, value, w))

    def checked(self, key: str, check: Callable[[str], Any]) -> Any:
        try:
            return check(f"field {key!r}")
        except ConfigError as e:
            raise self.fail(str(e)) from None

    def count(self, key: str, default: int = 0, most: int | None = None) -> int:
        """A non-negative integer field (a number of layers or experts), at most `most`."""
        value = self.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise self.fail(f"field {key!r} must be a non-negative integer, got {value!r}")
        if most is not None and value > most:
            raise self.fail(f"field {key!r} is {value}, more than {most}")
        return value

    def flag(self, key: str, default: bool) -> bool:
        """A true / false field (attention_bias, use_qk_norm, ...): checked whether or not it
        is listed in _FLAGS, so a family added later reads its own flags with this."""
        value = self.data.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self.fail(f"field {key!r} must be true or false, got {checks.show(value)}")
        return value

    def fraction(self, key: str, default: float) -> float:
        """A share in (0, 1] (partial_rotary_factor)."""
        value = self.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
            raise self.fail(f"field {key!r} must be a number in (0, 1], got {value!r}")
        return float(value)

    def per_layer(self, key: str, n: int, accepted: tuple = (0, 1)) -> list:
        """A list with one entry per layer, each one of `accepted`."""
        value = self.data.get(key)
        if not isinstance(value, list) or len(value) != n:
            got = f"{len(value)} entries" if isinstance(value, list) else repr(value)
            raise self.fail(f"field {key!r} must list one entry per layer ({n}), got {got}")
        bad = [v for v in value if v not in accepted]
        if bad:
            listed = ", ".join(map(repr, accepted))
            raise self.fail(f"field {key!r}: entry {bad[0]!r}; accepted: {listed}")
        return value

    def layer_indices(self, key: str, n: int) -> set[int]:
        """A list of layer indices, each in [0, n)."""
        value = self.data.get(key)
        if not (isinstance(value, list) and all(
                isinstance(i, int) and not isinstance(i, bool) and 0 <= i < n for i in value)):
            raise self.fail(f"field {key!r} must list layer indices in 0..{n - 1}, got {value!r}")
        return set(value)

    def nested(self, key: str, default_type: str) -> Cfg:
        """The `text_config` of a multimodal config, inheriting the top-level keys it lacks
        (quantization_config, tie_word_embeddings, _name_or_path); the config itself when it has
        none (text-only exports of the same family are flat)."""
        inner = self.data.get(key)
        if inner is None:
            return self
        if not isinstance(inner, Mapping):
            raise self.fail(f"field {key!r} must be a JSON object, got {type(inner).__name__}")
        merged = {"model_type": default_type} | {
            k: v for k, v in self.data.items() if k in _INHERITED} | dict(inner)
        return Cfg(merged, f"{self.source}: {key}", self.model_type)


def kind_check(key: str, value: Any, where: str) -> Any:
    """`value` of the known field `key` checked for its kind; `where` is "field 'key'"."""
    def want(ok: bool, what: str) -> None:
        if not ok:
            raise ConfigError(f"{where} must be {what}, got {checks.show(value)}")

    is_int = isinstance(value, int) and not isinstance(value, bool)
    if key in _FLAGS:
        want(isinstance(value, bool), "true or false")
    elif key in _COUNTS:
        want(is_int and 0 <= value <= MAX_WIDTH, "a non-negative integer (at most 2^20)")
    elif key in _INT_LISTS:
        want(isinstance(value, list) and len(value) <= MAX_LAYERS and all(
            isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_LAYERS
            for v in value), "a list of integers")
    elif key in _STR_LISTS:
        want(isinstance(value, list) and len(value) <= MAX_LAYERS
             and all(isinstance(v, str) for v in value), "a list of strings")
    elif key in _TABLES:
        want(isinstance(value, Mapping), "a JSON object")
    elif key in _TEXTS:
        want(isinstance(value, str), "a string")
    elif key in _FRACTIONS:
        want(isinstance(value, (int, float)) and not isinstance(value, bool)
             and 0 < value <= 1, "a number in (0, 1]")
    return value


# --- shared pieces -----------------------------------------------------------------------------


def gqa(c: Cfg, **extra: Any) -> AttentionSpec:
    heads = c.size("num_attention_heads")
    hidden = c.size("hidden_size")
    head_dim = c.size("head_dim", hidden // heads)
    return AttentionSpec(
        num_heads=heads,
        num_kv_heads=c.size("num_key_value_heads", heads),
        head_dim=head_dim,
        v_head_dim=head_dim,
        **extra,
    )


def base(c: Cfg, name: str, layers: tuple[LayerSpec, ...], **fields: Any) -> ModelSpec:
    fields.setdefault("tie_embeddings", c.flag("tie_word_embeddings", False))
    return ModelSpec(
        name=name,
        family=c.model_type,
        hidden_size=c.size("hidden_size"),
        vocab_size=c.size("vocab_size"),
        layers=layers,
        max_context=_context(c, layers),
        source=c.source,
        **fields,
    )


# transformers' default max_position_embeddings of each model_type, which its config class sets
# when a config.json leaves the key out: the `context` its importer is registered with (`register`).
_CONTEXT_DEFAULTS: dict[str, int] = {}
_ATTENTION = (Mixer.FULL_ATTENTION, Mixer.SLIDING_ATTENTION)


def _context(c: Cfg, layers: tuple[LayerSpec, ...]) -> int:
    """The context bound: `max_position_embeddings`, else the default transformers gives it for
    the model_type (a nested text model's own type first: mistral3 nests a mistral or llama
    one); 0, no bound, for a model without attention layers (a state-space stack has none)."""
    if c.data.get("max_position_embeddings") is not None:
        return c.size("max_position_embeddings")
    if not any(la.mixer in _ATTENTION for la in layers):
        return 0
    own = c.data.get("model_type")
    default = _CONTEXT_DEFAULTS.get(own if isinstance(own, str) else c.model_type,
                                    _CONTEXT_DEFAULTS.get(c.model_type))
    if default is None:
        raise c.fail("missing field 'max_position_embeddings' (no transformers default known "
                     "for this model_type)")
    return default


def dense_width(c: Cfg, layers: tuple[LayerSpec, ...], key: str = "intermediate_size") -> int:
    """The dense FFN width, required only when some layer has a dense FFN."""
    return c.size(key) if any(la.ffn is FFN.DENSE for la in layers) else 0


def uniform(c: Cfg, mixer: Mixer, ffn: FFN) -> tuple[LayerSpec, ...]:
    return (LayerSpec(mixer, ffn),) * c.size("num_hidden_layers")


def sliding_window(c: Cfg) -> int | None:
    """Mistral-style configs: a non-null `sliding_window` applies to every layer unless
    `use_sliding_window` is explicitly false (Qwen2/Qwen3 keep the key but switch it off)."""
    if not c.flag("use_sliding_window", True):
        return None
    window = c.get("sliding_window")
    return c.size("sliding_window") if window is not None else None


def layer_pattern(c: Cfg, n: int, default: Callable[[int], str],
                  accepted: tuple[str, ...] = ("full_attention", "sliding_attention")
                  ) -> tuple[Mixer, ...]:
    """Per-layer attention kinds: `layer_types` when the config lists them (newer transformers
    write them out), one of the family's `accepted` kinds a layer, else its rule `default(i)`."""
    if c.get("layer_types") is None:
        return tuple(_layer_type(c, default(i)) for i in range(n))
    kinds = c.per_layer("layer_types", n, accepted)
    return tuple(_layer_type(c, k) for k in kinds)


def _layer_type(c: Cfg, text: str) -> Mixer:
    kinds = {
        "full_attention": Mixer.FULL_ATTENTION,
        "sliding_attention": Mixer.SLIDING_ATTENTION,
        "linear_attention": Mixer.LINEAR_ATTENTION,
    }
    if text not in kinds:
        raise c.fail(f"field 'layer_types': unknown {text!r}; accepted: {', '.join(kinds)}")
    return kinds[text]


def top_k_of(c: Cfg, experts_key: str) -> int:
    top_k = c.size("num_experts_per_tok")
    if top_k > c.size(experts_key):
        raise c.fail(f"field 'num_experts_per_tok' ({top_k}) exceeds {experts_key} "
                     f"({c.size(experts_key)})")
    return top_k


def qwen_moe_ffn(c: Cfg, layer: int) -> FFN:
    """Qwen2/3-MoE rule (modeling_qwen3_moe): layer i is sparse when it is not listed in
    `mlp_only_layers`, num_experts > 0 and (i + 1) % decoder_sparse_step == 0."""
    n = c.size("num_hidden_layers")
    dense = c.layer_indices("mlp_only_layers", n) if c.get("mlp_only_layers") else set()
    sparse = layer not in dense and (layer + 1) % c.size("decoder_sparse_step", 1) == 0
    return FFN.MOE if sparse else FFN.DENSE


# --- the registry: model_type -> importer ------------------------------------------------------

Importer = Callable[[Cfg, str], ModelSpec]
# Filled by `register` as the family modules (dense, moe, mla, hybrid) are imported; the package
# imports every one of its modules.
IMPORTERS: dict[str, Importer] = {}


def register(*model_types: str, context: int | None = None) -> Callable[[Importer], Importer]:
    """Registers an importer as the one of each of `model_types` (a family's name and its
    aliases: text-only exports, the names ports register). `context`: transformers' default
    max_position_embeddings of those model_types, which its config class sets when a config.json
    leaves the key out; the class, in transformers main (2025-26), in a comment after each."""
    def add(importer: Importer) -> Importer:
        for model_type in model_types:
            if model_type in IMPORTERS:
                raise ValueError(f"model_type {model_type!r}: two importers")
            IMPORTERS[model_type] = importer
            if context is not None:
                _CONTEXT_DEFAULTS[model_type] = context
        return importer
    return add


def supported_model_types() -> list[str]:
    return sorted(IMPORTERS)
