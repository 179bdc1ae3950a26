"""A window's step times from its sockets' replies: at each step the slowest socket of a
stage holds the others back, stages run one after another with their activations sent
between them (a separate draft: drafts out, verdict back), and region copies (KV swaps, CoE
switches) and the prefix cache's exposed copies run before the step.

One combination for the sockets' real replies (engine/windows.py) and for the times a window
is planned with (its lookahead clock): the two must agree to the bit.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import cast

import numpy as np

from chip.cost import CAUSES
from chip.cost_tables import COMM_ROW, PREFILL
from rdu_cluster.backends.messages import Message, Router
from rdu_cluster.engine import plan as plans
from rdu_cluster.engine import prefix_cache
from rdu_cluster.engine.replica import Window
from workloads.spec import ModelSpec
from workloads.speculative import Speculation

TOKEN_ID_BYTES = 4  # a token id on the wire: int32 (every catalog vocabulary is < 2^31)
N_CAUSES = len(CAUSES)


class StepTimes:
    """Combines a replica's per-socket replies into its per-step times (`combine`)."""

    def __init__(self, model: ModelSpec, plan: plans.PlanSpec, router: Router,
                 speculation: Speculation | None) -> None:
        self.model, self.plan, self.router, self.speculation = model, plan, router, speculation

    def combine(self, lay: plans.ReplicaLayout, window: Window, res: dict,
                sockets: list[int]) -> dict:
        """Per-step times of the replica: at each step the slowest socket of each stage holds
        the others back (they synchronize at its collectives), stages run one after another
        with the activations sent between them, and KV moves (swaps) run before the step."""
        stages = lay.stages
        if len(stages) == 1 and not lay.draft_stage:
            alone = self._one_reply(window, res, stages[0], sockets)
            if alone is not None:
                return alone
        n = window.steps
        ar = np.arange(n)
        time, causes = np.zeros(n), np.zeros((N_CAUSES, n))
        straggler, straggler_s = np.zeros(n, dtype=np.int64), np.zeros(n)
        per_stage = []
        for k, stage in enumerate(stages):
            first = res[stage[0]][0]
            if all(res[s][0] is first for s in stage):  # one reply for a symmetric group
                tmax, j = first[0], np.zeros(n, dtype=np.int64)  # argmax's first of equals
                per_stage.append((tmax, first[1 : 1 + N_CAUSES]))
            else:
                R = np.stack([res[s][0] for s in stage])  # (sockets, ROWS, steps)
                j = np.argmax(R[:, 0, :], axis=0)
                tmax = R[j, 0, ar]
                per_stage.append((tmax, R[j, 1 : 1 + N_CAUSES, ar].T))
                straggler_s += tmax - R[:, 0, :].min(axis=0)
            time += tmax
            causes += per_stage[-1][1]
            if k == (1 if lay.draft_stage else 0):  # the target's first stage
                straggler = np.asarray(stage)[j]
        hops = np.zeros((n, 0))
        if lay.draft_stage:
            hops = self._draft_then_verify(window, stages, per_stage, time, causes)
        elif len(stages) > 1:
            hops = self._add_transfers(window, stages, time, causes)
        swap, switch = self._moves_per_step(window, res, sockets)
        copy = window.per_step(lambda sp: sp.prefix_copy_s, float)
        exposed = prefix_cache.exposed(copy, time, self.model.num_layers // self.plan.pp)
        # stage_s / hop_s (steps first, so a cut window keeps its rows): each stage's slowest
        # socket and each message between stages, for timelines (output/timeline.py)
        return {"time_s": time + swap + switch + exposed, "causes": causes.T,
                "straggler_socket": straggler, "straggler_s": straggler_s, "kv_swap_s": swap,
                "switch_s": switch, "stage_s": np.stack([t for t, _ in per_stage], axis=1),
                "hop_s": hops, "prefix_copy_s": copy, "prefix_exposed_s": exposed}

    def _one_reply(self, window: Window, res: dict, stage: Sequence[int],
                   sockets: list[int]) -> dict | None:
        """combine's value for one stage whose sockets sent one reply (a symmetric group)
        and moved and copied nothing (most windows): that reply's rows, with the zeros the
        general case adds (0.0 + x, as it sums into zeros: the same bits, a -0.0 made 0.0
        alike), made without its ~40 small arrays (question 2's pair run, its 3,508 windows
        replayed: 9 us a window against 19 us). None otherwise."""
        first, moves = res[stage[0]][0], res[sockets[0]][1]
        if any(res[s][0] is not first for s in stage) or moves.any() or any(
                res[s][1] is not moves for s in sockets) or any(
                sp.prefix_copy_s for sp in window.spans):
            return None
        n = window.steps
        zeros = np.zeros((5, n))  # a row each, none a view of another's column
        return {"time_s": first[0] + 0.0, "causes": first[1 : 1 + N_CAUSES].T + 0.0,
                "straggler_socket": np.full(n, stage[0], dtype=np.int64),
                "straggler_s": zeros[0], "kv_swap_s": zeros[1], "switch_s": zeros[2],
                "stage_s": first[0].reshape(n, 1).copy(), "hop_s": np.zeros((n, 0)),
                "prefix_copy_s": zeros[3], "prefix_exposed_s": zeros[4]}

    def _add_transfers(self, window: Window, stages, time, causes) -> np.ndarray:
        """The activations sent from each stage to the next (time and causes in place); returns
        each transfer's seconds, (steps, stages - 1)."""
        act = self.model.precision.activations.bytes * self.model.hidden_size
        tokens = window.per_step(lambda sp: len(sp.decode) + sp.pre_tokens,
                                 float)
        hops = []
        for a, b in itertools.pairwise(stages):
            msg = Message(a[0], b[0], "activations", tokens * act)
            t = np.broadcast_to(self.router.route(msg.encode()), time.shape)
            time += t
            causes[COMM_ROW - 1] += t
            hops.append(t)
        return np.stack(hops, axis=1)

    def _draft_then_verify(self, window: Window, stages, per_stage, time, causes) -> np.ndarray:
        """A separate draft: in a decode step the drafts go to the target (token ids, the
        tree's too) and the verdict (accepted count and the target's token) comes back, each
        one routed message; a prefill step runs the draft's and the target's prefill side by
        side, so it lasts the slower of the two (time and causes in place)."""
        kind = window.per_step(lambda sp: sp.kind)
        seqs = window.per_step(lambda sp: len(sp.decode), float)
        side = kind == PREFILL
        (t0, c0), (t1, c1) = per_stage
        time[side] = np.maximum(t0, t1)[side]
        causes[:, side] = np.where((t0 >= t1)[None, :], c0, c1)[:, side]
        spec = cast(Speculation, self.speculation)  # a draft stage exists only with it
        out = Message(stages[0][0], stages[1][0], "drafts",
                      seqs * spec.verify_tokens() * TOKEN_ID_BYTES)
        back = Message(stages[1][0], stages[0][0], "verdict", seqs * 2 * TOKEN_ID_BYTES)
        hops = np.stack([np.where(seqs > 0, self.router.route(m.encode()), 0.0)
                         for m in (out, back)], axis=1)  # (steps, 2): drafts out, verdict back
        time += hops.sum(axis=1)
        causes[COMM_ROW - 1] += hops.sum(axis=1)
        return hops

    def _moves_per_step(self, window: Window, res: dict, sockets: list[int]) -> tuple:
        """Region copies before each span's first step: (KV swaps, CoE expert switches). A span
        that switches has no swap (the coe policy switches only with nothing running)."""
        first = res[sockets[0]][1]
        moves = (first if all(res[s][1] is first for s in sockets)
                 else np.max(np.stack([res[s][1] for s in sockets]), axis=0))
        out = np.zeros((2, window.steps))
        if not moves.any():  # most windows move nothing
            return out[0], out[1]
        switch = np.fromiter((sp.switch for sp in window.spans), bool, len(window.spans))
        firsts = np.concatenate([[0], np.cumsum([sp.steps for sp in window.spans])[:-1]])
        out[0, firsts.astype(np.int64)] = np.where(switch, 0.0, moves)
        out[1, firsts.astype(np.int64)] = np.where(switch, moves, 0.0)
        return out[0], out[1]

