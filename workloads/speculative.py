"""Speculative decoding: acceptance models and their closed forms. Pure: no hardware, no time.

One speculative step drafts k tokens (a chain) or a tree of candidates, then the target verifies
them in one forward pass and keeps the longest accepted prefix plus one token of its own (the
correction, or the bonus token when everything was accepted). So a step always emits at least one
token, and at most depth + 1.

Acceptance is described by the conditional rate a_i: the probability that the draft token at depth
i is accepted given that depths 1..i-1 were. Then

    E[tokens per step] = 1 + sum_{i=1..k} prod_{j<=i} a_j

which for a constant rate a is the closed form of Leviathan et al. 2023 (arXiv 2211.17192, eq. 1):
(1 - a^(k+1)) / (1 - a), and k + 1 when a = 1.

Three acceptance models:
- ConstantAcceptance(rate): a_i = rate at every depth.
- PositionalAcceptance(rates): a vector of conditional rates a_1..a_k (a measured per-position
  curve; where a tool reports cumulative rates p_i = prod a_j, convert with `from_cumulative`).
- SampledAcceptance(mean, concentration, seed): acceptance is context-dependent (EAGLE-2, arXiv
  2406.16858, finds it varies with the context, not only the position); each step's rate is drawn
  from Beta(mean * c, (1 - mean) * c), and the accepted count of the step is drawn from that rate.
  Expectations are Monte-Carlo over `samples` steps of a seeded numpy Generator: the same seed
  gives bit-identical results.

Tree speculation (SpecInfer arXiv 2305.09781, Sequoia arXiv 2402.12374): `branching` (b_1..b_D)
keeps b_d candidates under each node of depth d-1. Approximation (stated, optimistic): siblings
are accepted independently, so depth d is reached with probability 1 - (1 - a_d)^(b_d) given
depth d-1 was. The target verifies every node of the tree in one pass (tree attention mask):
sum_d prod_{j<=d} b_j draft tokens plus the root.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from workloads.errors import ConfigError

DEFAULT_SAMPLES = 4096


def closed_form_tokens_per_step(rate: float, k: int) -> float:
    """Leviathan et al. 2023 eq. 1: expected tokens a step emits with k drafts at a constant
    conditional acceptance `rate`."""
    _check_rate(rate, "acceptance")
    _check_k(k)
    if rate == 1.0:
        return float(k + 1)
    return (1.0 - rate ** (k + 1)) / (1.0 - rate)


@dataclass(frozen=True)
class ConstantAcceptance:
    rate: float
    source: str = ""

    def __post_init__(self) -> None:
        _check_rate(self.rate, "acceptance")

    def rates(self, k: int) -> np.ndarray:
        _check_k(k)
        return np.full(k, self.rate)

    def describe(self) -> str:
        return f"constant {self.rate:g}"


@dataclass(frozen=True)
class PositionalAcceptance:
    """Conditional acceptance per draft position, a_1 first. k may not exceed its length."""

    values: tuple[float, ...]
    source: str = ""
    name: str = ""  # a named profile's (PROFILES)

    def __post_init__(self) -> None:
        if not self.values:
            raise ConfigError("acceptance: a per-position vector needs at least one rate")
        for i, r in enumerate(self.values):
            _check_rate(r, f"acceptance[{i}]")

    @classmethod
    def from_cumulative(
        cls, cumulative: tuple[float, ...], source: str = ""
    ) -> PositionalAcceptance:
        """From cumulative rates p_i = P(depths 1..i all accepted), as llama.cpp and vLLM print."""
        conditional, prev = [], 1.0
        for i, p in enumerate(cumulative):
            _check_rate(p, f"acceptance[{i}]")
            if p > prev:
                raise ConfigError(f"acceptance[{i}]: cumulative rates must not increase")
            conditional.append(p / prev if prev > 0 else 0.0)
            prev = p
        return cls(tuple(conditional), source)

    def rates(self, k: int) -> np.ndarray:
        _check_k(k)
        if k > len(self.values):
            raise ConfigError(
                f"spec-k: {k} exceeds the {len(self.values)} positions of the acceptance vector"
            )
        return np.asarray(self.values[:k], dtype=float)

    def describe(self) -> str:
        rates = "per-position " + ",".join(f"{r:.3g}" for r in self.values)
        return f"{self.name} ({rates})" if self.name else rates


@dataclass(frozen=True)
class SampledAcceptance:
    """Per-step rate ~ Beta(mean * concentration, (1 - mean) * concentration), seeded."""

    mean: float
    concentration: float = 10.0
    seed: int = 0
    samples: int = DEFAULT_SAMPLES
    source: str = ""

    def __post_init__(self) -> None:
        if not 0.0 < self.mean < 1.0:
            raise ConfigError(f"acceptance: beta mean must be in (0, 1), got {self.mean!r}")
        if not self.concentration > 0:
            raise ConfigError(
                f"acceptance: concentration must be positive, got {self.concentration!r}"
            )
        if self.samples < 1:
            raise ConfigError(f"acceptance: samples must be positive, got {self.samples!r}")

    def step_rates(self, rng: np.random.Generator, n: int) -> np.ndarray:
        a, b = self.mean * self.concentration, (1.0 - self.mean) * self.concentration
        return rng.beta(a, b, size=n)

    def rates(self, k: int) -> np.ndarray:
        """The mean conditional rate per depth implied by the Beta mixture: E[r^i] / E[r^(i-1)]."""
        _check_k(k)
        r = self.step_rates(np.random.default_rng(self.seed), self.samples)
        moments = np.array([np.mean(r**i) for i in range(k + 1)])
        return moments[1:] / moments[:-1]

    def describe(self) -> str:
        return f"beta mean {self.mean:g} concentration {self.concentration:g} seed {self.seed}"


Acceptance = ConstantAcceptance | PositionalAcceptance | SampledAcceptance


def decaying(first: float, tokens_per_step: float, k: int, source: str = "") -> PositionalAcceptance:
    """Conditional rates a_i = first x d^(i-1), d the decay that makes k drafts emit
    `tokens_per_step` tokens a step (1 + sum of the cumulative products): a per-position curve
    from two published figures, the first position's rate and the mean accepted length at k,
    under one stated shape (each further position keeps the same share of the last one's rate)."""
    _check_rate(first, "acceptance")
    most = Speculation(k, ConstantAcceptance(first)).tokens_per_step()
    if not 1.0 + first <= tokens_per_step <= most:
        raise ConfigError(f"acceptance profile: {tokens_per_step} tokens a step at k={k} needs "
                          f"a rate of {first} first and a decay in [0, 1] (from {1 + first:.3f} "
                          f"to {most:.3f})")
    lo, hi = 0.0, 1.0
    for _ in range(60):  # bisection: tokens a step grows with the decay
        mid = (lo + hi) / 2.0
        rates = first * mid ** np.arange(k)
        lo, hi = (mid, hi) if 1.0 + np.sum(np.cumprod(rates)) < tokens_per_step else (lo, mid)
    return PositionalAcceptance(tuple(float(r) for r in first * lo ** np.arange(k)), source)


def _named(name: str, acc: PositionalAcceptance) -> PositionalAcceptance:
    return PositionalAcceptance(acc.values, acc.source, name)




@dataclass(frozen=True)
class Speculation:
    """What a speculative step drafts: a chain of k tokens, or a tree with `branching` per depth
    (then k is the tree depth)."""

    k: int
    acceptance: Acceptance
    branching: tuple[int, ...] | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        _check_k(self.k)
        if self.branching is not None:
            if len(self.branching) != self.k:
                n = len(self.branching)
                raise ConfigError(f"tree: {n} branching factors make a tree of depth {n}, but k "
                                  f"(--spec-k) is {self.k}; give k = {n} or leave it out")
            if any(int(b) != b or b < 1 for b in self.branching):
                raise ConfigError(f"tree: branching factors must be positive integers, got "
                                  f"{self.branching}")
            if verify_tokens(self.k, self.branching) > MAX_TREE_NODES + 1:
                raise ConfigError(f"tree: {self.branching} drafts more than {MAX_TREE_NODES} "
                                  "nodes a step")

    @property
    def is_tree(self) -> bool:
        return self.branching is not None and any(b > 1 for b in self.branching)

    def depth_rates(self) -> np.ndarray:
        """Probability of reaching depth d given depth d-1 was reached."""
        a = self.acceptance.rates(self.k)
        if self.branching is None:
            return a
        return 1.0 - (1.0 - a) ** np.asarray(self.branching, dtype=float)

    def tokens_per_step(self) -> float:
        """Expected tokens a step emits (accepted drafts plus the target's own token)."""
        return float(1.0 + np.sum(np.cumprod(self.depth_rates())))

    def accepted_per_step(self) -> float:
        return self.tokens_per_step() - 1.0

    def tokens_per_step_over(self, tokens: float) -> float:
        """Expected tokens a step emits over a request that decodes `tokens` tokens: `tokens`
        over the expected number of steps, the last of which emits no more than the output has
        left (as the serving engine caps it). tokens_per_step() is its limit for long outputs;
        an output shorter than k + 1 tokens takes one step whatever k drafts (it emitted k + 1
        a step, more than the request has)."""
        g = max(round(float(tokens)), 1)
        reach = np.concatenate([[1.0], np.cumprod(self.depth_rates())])  # P(emits >= j)
        p = reach - np.append(reach[1:], 0.0)  # P(a step emits j tokens), j = 1..k+1
        n = len(p)
        # E[steps(r)] = 1 + sum_j p_j E[steps(r - j)], E[steps(r <= 0)] = 0: a linear recurrence
        # of order k + 1, advanced g times as a matrix power over (E[r], ..., E[r - k], 1).
        m = np.zeros((n + 1, n + 1))
        m[0, :n], m[0, n] = p, 1.0
        m[1:n, :n - 1] = np.eye(n - 1)
        m[n, n] = 1.0
        steps = np.linalg.matrix_power(m, g)[0, n]
        return float(g / steps)

    def frontier(self) -> tuple[int, ...]:
        return frontier(self.k, self.branching)

    def verify_tokens(self) -> int:
        return verify_tokens(self.k, self.branching)

    def sample_tokens(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """Tokens emitted by each of n steps, drawn from the acceptance model (engine use)."""
        if isinstance(self.acceptance, SampledAcceptance):
            r = self.acceptance.step_rates(rng, n)[:, None] * np.ones(self.k)
        else:
            r = np.broadcast_to(self.acceptance.rates(self.k), (n, self.k))
        if self.branching is not None:
            r = 1.0 - (1.0 - r) ** np.asarray(self.branching, dtype=float)
        ok = rng.random((n, self.k)) < r
        return 1 + np.argmin(np.column_stack([ok, np.zeros(n, bool)]), axis=1)

    def expected_sampled(self) -> float:
        """tokens_per_step for a SampledAcceptance by direct simulation of its seeded steps (the
        same expectation as tokens_per_step up to Monte-Carlo error; used by the tests)."""
        seed = getattr(self.acceptance, "seed", 0)
        n = getattr(self.acceptance, "samples", DEFAULT_SAMPLES)
        return float(np.mean(self.sample_tokens(np.random.default_rng(seed), n)))


def frontier(k: int, branching: tuple[int, ...] | None = None) -> tuple[int, ...]:
    """Tokens the draft processes at each of its k steps: 1 for a chain; for a tree, the nodes
    of depth d-1 whose children it proposes (prod_{j<d} b_j)."""
    if branching is None:
        return (1,) * k
    out, width = [], 1
    for b in branching:
        out.append(width)
        width *= int(b)
    return tuple(out)


def verify_tokens(k: int, branching: tuple[int, ...] | None = None) -> int:
    """New tokens a sequence brings to the target's verification: the root plus every drafted
    node (k + 1 for a chain)."""
    if branching is None:
        return k + 1
    return 1 + sum(math.prod(branching[: d + 1]) for d in range(k))




def parse_acceptance(text: str, source: str = "") -> Acceptance:
    """CLI form: "0.8" (constant: the same rate at every position), "0.9,0.8,0.7" (per
    position, conditional), a profile name (PROFILES) or "beta:MEAN[:CONCENTRATION[:SEED]]"
    (sampled)."""
    t = text.strip()
    if t in PROFILES:
        return PROFILES[t]
    try:
        if t.startswith("beta:"):
            parts = [float(x) for x in t[5:].split(":")]
            if not 1 <= len(parts) <= 3:
                raise ValueError
            mean = parts[0]
            conc = parts[1] if len(parts) > 1 else 10.0
            seed = parts[2] if len(parts) > 2 else 0
            if not (0 <= seed < 2**63 and float(seed).is_integer()) or not conc < 1e12:
                raise ValueError
            seed = int(seed)
            return SampledAcceptance(mean, conc, seed, source=source)
        values = tuple(float(x) for x in t.split(","))
    except ValueError:
        raise ConfigError(
            f"acceptance: {text!r} not understood; give a rate (0.8), a per-position list "
            f"(0.9,0.8,0.7), a profile ({', '.join(PROFILES)}) or "
            "beta:MEAN[:CONCENTRATION[:SEED]]"
        ) from None
    if len(values) == 1:
        return ConstantAcceptance(values[0], source)
    return PositionalAcceptance(values, source)


def parse_tree(text: str | None) -> tuple[int, ...] | None:
    """"4,2,1" -> (4, 2, 1): candidates kept under each node, depth by depth (None: none given;
    an empty text is refused: it gives no tree)."""
    if text is None:
        return None
    try:
        out = tuple(int(x) for x in text.split(","))
        if len(out) > MAX_SPEC_K or any(not 1 <= b <= MAX_TREE_NODES for b in out):
            raise ValueError
        return out
    except ValueError:
        raise ConfigError(
            f"tree: {text!r} not understood; give branching factors like 4,2,1 (at most "
            f"{MAX_SPEC_K} depths, each 1 to {MAX_TREE_NODES})"
        ) from None


def _check_rate(rate: float, name: str) -> None:
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0.0 <= rate <= 1.0:
        raise ConfigError(f"{name}: expected a rate in [0, 1], got {rate!r}")


# Bounds of a speculation: published chains draft up to ~8-10 tokens and EAGLE-2 trees ~60
# nodes; a verification step costs its nodes' tokens, so past these nothing is gained and the
# per-depth tables would only grow.
MAX_SPEC_K = 64
MAX_TREE_NODES = 4096


def _check_k(k: int) -> None:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= MAX_SPEC_K:
        raise ConfigError(f"spec-k: expected an integer in [1, {MAX_SPEC_K}], got {k!r}")


# Named, measured per-position profiles (`--acceptance NAME`), each with its basis. Rates are
# conditional: a_i given positions 1..i-1 were accepted.
PROFILES: dict[str, PositionalAcceptance] = {
    # DeepSeek-V3's one MTP module, reused autoregressively past the first position (SGLang,
    # vLLM and TensorRT-LLM's "MTP Eagle" path do): the first position at 0.85 (DeepSeek-V3
    # report, arXiv 2412.19437 5.4.3: "the acceptance rate of the second token prediction ranges
    # between 85% and 90%"; lower end), and 3.20 tokens a step at k = 7 for the original
    # DeepSeek-V3-0324 MTP module (temperature 0, MT-bench / HumanEval / GSM8K mean; Nebius'
    # MTP-DeepSeek-V3-0324 model card, 'Original MTP' row). Cross-check: SGLang PR #3582 reports
    # ~1.9 tokens a step with one draft token for DeepSeek-V3 (this profile: 1.85).
    "deepseek-mtp": _named("deepseek-mtp", decaying(
        0.85, 3.20, 7,
        "DeepSeek-V3 report 5.4.3 (first position 0.85) and the DeepSeek-V3-0324 MTP module's "
        "3.20 tokens a step at k=7 (Nebius MTP-DeepSeek-V3-0324 model card), geometric decay")),
    # A Llama-family EAGLE-3 head as llama.cpp measured it (ggml-org/llama.cpp PR #24536:
    # cumulative per-position acceptance 0.805, 0.632, 0.483).
    "eagle3": _named("eagle3", PositionalAcceptance.from_cumulative(
        (0.805, 0.632, 0.483),
        "ggml-org/llama.cpp PR #24536: Llama-family EAGLE-3, cumulative 0.805, 0.632, 0.483")),
}
