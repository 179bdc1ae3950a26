"""Multi-turn sessions (chat and agents): a closed loop per session.

Every session opens with the same system prompt; turn t sends the session's whole history (the
system prompt, every earlier user message and answer) plus a new user message, and is released
when turn t-1 has finished and the user has thought for `think` seconds. Session starts follow
an arrival process (traces.arrivals). Token content (traces.Trace.content): chunk 0 is the
system prompt, shared by every session; each user message and each answer is a chunk of its own,
so turn t's prompt repeats turn t-1's prompt and answer token for token.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from workloads import checks
from workloads.errors import ConfigError
from workloads.traces import LengthDist, Trace, arrivals

SYSTEM_CHUNK = 0
TURN_TOKENS = LengthDist("fixed", 256)  # default user message and answer
SYSTEM_TOKENS = 1024  # default system prompt every session shares
THINK_TIME = "5"  # default seconds between a turn's end and the next (ThinkTime.parse)
THINK = ("fixed", "exponential", "uniform")


@dataclass(frozen=True)
class ThinkTime:
    """Seconds between a turn's end and the next turn: S, fixed:S, exponential:MEAN or
    uniform:LO:HI."""

    kind: str = "fixed"
    a: float = 0.0
    b: float = 0.0

    @classmethod
    def parse(cls, text: str, where: str = "--think-time") -> ThinkTime:
        parts = str(text).split(":")
        if len(parts) == 1:
            parts = ["fixed", parts[0]]
        want = {"fixed": 1, "exponential": 1, "uniform": 2}
        if parts[0] not in want or len(parts) - 1 != want[parts[0]]:
            raise ConfigError(f"{where}: {text!r}: expected S, fixed:S, exponential:MEAN or "
                              "uniform:LO:HI (seconds)")
        try:
            vals = [float(x) for x in parts[1:]]
        except ValueError:
            raise ConfigError(f"{where}: {text!r}: not a number; expected S, fixed:S, "
                              "exponential:MEAN or uniform:LO:HI (seconds)") from None
        if not all(0 <= v <= checks.MAX_SECONDS for v in vals) or (len(vals) == 2
                                                                   and vals[1] < vals[0]):
            raise ConfigError(f"{where}: {text!r}: seconds must be >= 0 and at most "
                              f"{checks.MAX_SECONDS:g} (194 days), and HI >= LO")
        return cls(parts[0], vals[0], vals[1] if len(vals) > 1 else 0.0)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if self.kind == "fixed":
            return np.full(n, self.a)
        if self.kind == "exponential":
            return rng.exponential(self.a, size=n) if self.a > 0 else np.zeros(n)
        return rng.uniform(self.a, self.b, size=n)


@dataclass(frozen=True)
class SessionSpec:
    sessions: int
    turns: int
    system_tokens: int = SYSTEM_TOKENS
    user: LengthDist = TURN_TOKENS
    output: LengthDist = TURN_TOKENS
    think: ThinkTime = ThinkTime("fixed", float(THINK_TIME))
    rate: float = math.inf  # session starts per second
    arrival: str = "poisson"

    def check(self) -> None:
        if self.sessions < 1:
            raise ConfigError(f"--sessions: must be positive, got {self.sessions}")
        if self.turns < 1:
            raise ConfigError(f"--turns: must be positive, got {self.turns}")
        if self.system_tokens < 0:
            raise ConfigError(f"--system-prompt: must be >= 0 tokens, got {self.system_tokens}")
        self.user.check("--prompt-len")
        self.output.check("--output-len")


def sessions(spec: SessionSpec, seed: int = 0) -> Trace:
    """The trace of `spec`: rows session by session, turn by turn (row = session x turns +
    turn). Four independent streams (starts, user messages, answers, think times) from the
    seed."""
    spec.check()
    n, turns = spec.sessions, spec.turns
    r_arr, r_user, r_out, r_think = (np.random.default_rng(s)
                                     for s in np.random.SeedSequence(seed).spawn(4))
    starts = arrivals(spec.arrival, n, spec.rate, r_arr)
    user = spec.user.sample(r_user, n * turns).reshape(n, turns)
    out = spec.output.sample(r_out, n * turns).reshape(n, turns)
    think = spec.think.sample(r_think, n * turns).reshape(n, turns)
    think[:, 0] = 0.0
    history = spec.system_tokens + np.cumsum(user + out, axis=1) - out  # prompt of each turn
    content = []
    for s in range(n):
        chunks = [(SYSTEM_CHUNK, spec.system_tokens)] if spec.system_tokens else []
        for t in range(turns):
            base = 1 + 2 * (s * turns + t)
            chunks += [(base, int(user[s, t])), (base + 1, int(out[s, t]))]
            content.append(tuple(chunks))
    rows = np.arange(n * turns)
    return Trace(
        arrival_s=np.repeat(starts, turns), prompt_len=history.reshape(-1),
        output_len=out.reshape(-1), content=tuple(content),
        session=rows // turns, after=np.where(rows % turns == 0, -1, rows - 1),
        think_s=think.reshape(-1),
        source=(f"sessions(n={n}, turns={turns}, system={spec.system_tokens}, "
                f"rate={spec.rate}, seed={seed})"),
    )
