"""Plan: how a model is spread over sockets: (tp, pp, ep, dp) plus per-block choices.

Layout. A pipeline stage is `width = tp * ep` sockets. Inside a stage:
- attention, linear-attention / state-space mixers, dense FFNs, shared experts, embedding and
  LM head are sharded over all `width` sockets (tensor parallel by heads / columns), unless a
  per-block choice gives a mixer kind a smaller degree d: then each group of d sockets holds a
  shard of that mixer and the width/d groups compute it redundantly (weights and state
  replicated), which keeps heads whole where they do not divide (e.g. 8 KV heads on 16 sockets);
- routed experts are spread over `ep` groups (num_experts / ep experts each), and each expert's
  matrices are split over the `tp` sockets of its group (expert_tp = tp).
Stages are `pp`, cut at layer boundaries; the whole pipeline is replicated `dp` times.

Attention data parallelism (`adp`, SGLang's --enable-dp-attention, TensorRT-LLM's
enable_attention_dp, vLLM's DP+EP): the stage's sequences are split over `adp` groups of
width / adp sockets; each group runs the mixers of its own sequences only (heads split over its
width / adp sockets, KV cache held for its sequences alone), while routed experts stay spread
over the whole stage as above (`adp8ep8` on 8 sockets: attention on one GPU each, one expert
group per GPU; `adp16ep16` across two nodes). Dense FFN layers, the embedding and the LM head
run over the whole width on the gathered batch; shared experts on each socket's own tokens
where experts are spread (ep > 1), else with the routed experts (workloads/graph.py).
Sockets used: tp * ep * pp * dp. Socket id = ((dp_i * pp + pp_i) * ep + ep_i) * tp + tp_i:
tensor-parallel partners are neighbours (same node, fastest links), replicas farthest apart.

Plan names: "tp8", "tp4pp2", "ep16", "tp8ep2", "tp2pp2dp4", "adp8ep8", "adp8tp8", with per-block
degrees after "@": "tp16@mamba2=8,linear_attention=4". Degrees left out are 1.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property

from workloads.checks import show
from workloads.errors import ConfigError
from workloads.ops import Shard
from workloads.spec import FFN, Mixer, ModelSpec, MoESpec, part

# ASCII digits only (re.ASCII: \d would take any script's digits); 9: past MAX_DEGREE, never
# past int()
_PART = re.compile(r"(adp|tp|pp|ep|dp)(\d{1,9})", re.ASCII)
_BLOCK = re.compile(r"\s*([a-z0-9_]+)\s*=\s*(\d{1,9})\s*", re.ASCII)


@dataclass(frozen=True)
class Plan:
    tp: int = 1
    pp: int = 1
    ep: int = 1
    dp: int = 1
    mixer_tp: tuple[tuple[Mixer, int], ...] = ()  # per-block: degree of a mixer kind (< width)
    micro_batches: int = 0  # pipeline micro-batches; 0: min(batch, pp)
    adp: int = 1  # attention data-parallel groups per stage (divides the width)

    @property
    def width(self) -> int:
        """Sockets per pipeline stage."""
        return self.tp * self.ep

    @property
    def sockets(self) -> int:
        return self.width * self.pp * self.dp

    @property
    def model_sockets(self) -> int:
        """Sockets holding one copy of the model."""
        return self.width * self.pp

    @property
    def attn_width(self) -> int:
        """Sockets of one attention data-parallel group (the whole stage without adp)."""
        return self.width // self.adp if self.width % self.adp == 0 else 0

    @cached_property
    def shard(self) -> Shard:
        """The degrees of a stage's main blocks (per-block mixer degrees aside)."""
        return Shard(attn_tp=self.attn_width, mlp_tp=self.width, expert_tp=self.tp, ep=self.ep,
                     vocab_tp=self.width, attn_dp=self.adp)

    def mixer_degree(self, mixer: Mixer) -> int:
        return dict(self.mixer_tp).get(mixer, self.attn_width)

    @cached_property
    def name(self) -> str:  # (computed once: a plan search ranks and reports by it)
        parts = [f"adp{self.adp}"] if self.adp > 1 else []
        parts += [f"tp{self.tp}"] if self.tp > 1 or self.ep == 1 else []
        parts += [f"{k}{v}" for k, v in (("pp", self.pp), ("ep", self.ep), ("dp", self.dp)) if v > 1]
        text = "".join(parts)
        if self.mixer_tp:
            text += "@" + ",".join(f"{m.value}={d}" for m, d in self.mixer_tp)
        return text

    def __str__(self) -> str:
        return self.name

    @classmethod
    def parse(cls, text: str) -> Plan:
        """"tp4pp2", "ep16", "tp8ep2", "adp8ep8", "tp16@mamba2=8"; raises ConfigError naming
        the part."""
        base, at, blocks = text.strip().lower().partition("@")
        degrees: dict[str, int] = {}
        pos = 0
        for m in _PART.finditer(base):
            if m.start() != pos or m.group(1) in degrees:
                break
            degrees[m.group(1)] = int(m.group(2))
            pos = m.end()
        if pos != len(base) or not degrees or not all(1 <= d <= MAX_DEGREE for d in degrees.values()):
            raise ConfigError(
                f"--plan: {show(text)} is not a plan; expected degrees like tp8, tp4pp2, ep16, "
                f"tp8ep2, tp2pp2dp4, adp8ep8 (each 1 to {MAX_DEGREE}), optionally "
                "@mixer=degree,..."
            )
        if at and not blocks.strip():
            raise ConfigError(f"--plan: {show(text)}: nothing after '@'; expected "
                              "mixer=degree,... (or no '@')")
        return cls(**degrees, mixer_tp=_parse_blocks(blocks, text))


# No parallel degree exceeds the largest cluster accepted (rdu_cluster/config.py MAX_SOCKETS).
MAX_DEGREE = 16384


def _parse_blocks(text: str, whole: str) -> tuple[tuple[Mixer, int], ...]:
    if not text:
        return ()
    out: dict[Mixer, int] = {}
    for item in text.split(","):
        m = _BLOCK.fullmatch(item)
        try:
            mixer = Mixer(m.group(1)) if m else None
        except ValueError:
            mixer = None
        if m is None or mixer is None or mixer is Mixer.NONE:
            kinds = ", ".join(k.value for k in Mixer if k is not Mixer.NONE)
            raise ConfigError(f"--plan: {show(whole)}: block choice {show(item)}; expected "
                              f"mixer=degree with a mixer among {kinds}")
        if mixer in out:
            raise ConfigError(f"--plan: {show(whole)}: {mixer.value} is given twice")
        out[mixer] = int(m.group(2))
        if not 1 <= out[mixer] <= MAX_DEGREE:
            raise ConfigError(f"--plan: {show(whole)}: block degree {show(m.group(2))}; "
                              f"expected 1 to {MAX_DEGREE}")
    return tuple(sorted(out.items(), key=lambda md: md[0].value))


def validate(plan: Plan, spec: ModelSpec, sockets: int) -> None:
    """Raise ConfigError if `plan` cannot run `spec` on a cluster of `sockets` sockets."""
    where = f"plan {plan.name}"
    if plan.sockets > sockets:
        raise ConfigError(f"{where}: needs {plan.sockets} sockets, the cluster has {sockets}")
    if sockets % plan.sockets:
        raise ConfigError(
            f"{where}: uses {plan.sockets} sockets, which does not divide the {sockets} of the "
            "cluster"
        )
    if plan.pp > spec.num_layers:
        raise ConfigError(f"{where}: pp={plan.pp} exceeds the {spec.num_layers} layers")
    if plan.adp > 1:
        _check_attention_dp(plan, where)
    if plan.ep > 1:
        if spec.moe is None:
            raise ConfigError(f"{where}: ep={plan.ep} but {spec.name} has no routed experts")
        if spec.moe.num_experts % plan.ep:
            raise ConfigError(
                f"{where}: ep={plan.ep} does not divide the {spec.moe.num_experts} experts"
            )
    mixers, dense = _layer_traits(spec)
    # In a fixed order: `mixers` is a frozenset, whose order moves with the hash seed, so a plan
    # that fails two mixers' checks named either one from run to run.
    for mixer in sorted(mixers, key=lambda m: m.value):
        d = plan.mixer_degree(mixer)
        if plan.width % d:
            raise ConfigError(f"{where}: {mixer.value} degree {d} does not divide width "
                              f"{plan.width}")
        heads = mixer_heads(spec, mixer)
        if heads % d:
            raise ConfigError(
                f"{where}: {mixer.value} degree {d} does not divide its {heads} heads"
            )
    for mixer, _ in plan.mixer_tp:
        if mixer not in mixers:
            raise ConfigError(f"{where}: {spec.name} has no {mixer.value} layers")
    if dense and spec.intermediate_size % plan.width:
        raise ConfigError(
            f"{where}: width {plan.width} does not divide the FFN width {spec.intermediate_size}"
        )
    if spec.moe is not None:
        _check_expert_widths(plan, spec.moe, where)


def _check_attention_dp(plan: Plan, where: str) -> None:
    """Attention data-parallel groups split the stage's sockets evenly; per-block mixer degrees
    are a different use of the same sockets (redundant groups), not combined with it."""
    if plan.width % plan.adp:
        raise ConfigError(f"{where}: adp={plan.adp} does not divide the stage width "
                          f"{plan.width} (tp x ep); expected a divisor of it")
    if plan.mixer_tp:
        raise ConfigError(f"{where}: adp does not combine with per-block degrees (@...); "
                          "expected one of them")


def _check_expert_widths(plan: Plan, moe: MoESpec, where: str) -> None:
    """Each routed expert's matrices are split over tp, a shared expert over the whole width
    (module docstring), so either must divide its FFN width as a dense FFN's does."""
    if moe.expert_intermediate % plan.tp:
        raise ConfigError(f"{where}: tp {plan.tp} does not divide the expert FFN width "
                          f"{moe.expert_intermediate} (each expert is split over tp)")
    shared = plan.shard.shared_tp
    if moe.shared_intermediate % shared:
        raise ConfigError(f"{where}: width {shared} does not divide the shared-expert FFN "
                          f"width {moe.shared_intermediate}")


_TRAITS: dict[int, tuple] = {}


def _layer_traits(spec: ModelSpec) -> tuple[frozenset, bool]:
    """The model's mixer kinds and whether it has a dense FFN layer: once per model (a plan
    search validates every plan twice; a hybrid has a hundred layers)."""
    hit = _TRAITS.get(id(spec))
    if hit is not None and hit[0] is spec:
        return hit[1]
    traits = (frozenset({layer.mixer for layer in spec.layers} - {Mixer.NONE}),
              any(layer.ffn is FFN.DENSE for layer in spec.layers))
    if len(_TRAITS) > 256:
        _TRAITS.clear()
    _TRAITS[id(spec)] = (spec, traits)
    return traits


def mixer_heads(spec: ModelSpec, mixer: Mixer) -> int:
    if mixer in (Mixer.FULL_ATTENTION, Mixer.SLIDING_ATTENTION):
        return part(spec.attention, "attention").num_heads
    if mixer is Mixer.LINEAR_ATTENTION:
        return part(spec.linear_attention, "linear attention").num_value_heads
    return part(spec.mamba, "Mamba-2 mixer").num_heads
