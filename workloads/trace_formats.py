"""Trace formats beside the columnar files of traces.py.

Mooncake (kvcache-ai/Mooncake, FAST25-release/README.md): JSON lines, one request a line:
`timestamp` (ms from the start), `input_length`, `output_length`, `hash_ids` (remapped hashes of
the prompt's 512-token blocks: equal ids are a reusable prefix). The hashes become the request's
content chunks (traces.Trace.content): block k is chunk (hash_ids[k], its tokens), the last
block holding what is left of the prompt; the output is a chunk of the request's own.

The Azure LLM inference trace (TIMESTAMP, ContextTokens, GeneratedTokens) is a CSV that
traces.read_trace reads through its column aliases (date-times become seconds after the first).

BurstGPT (HPMLL/BurstGPT, the trace vLLM's benchmarks read as `--dataset-name burstgpt`): a CSV
`Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type` (BurstGPT_3 adds
`Session ID,Elapsed time`), Timestamp in seconds, replayed from the first request's (as the
Azure trace's date-times). Its `Model` is the service that answered (ChatGPT, GPT-4), not a
model to serve: not read, every row is served on the run's model (filter a file first for one
service's rows). A failed request has 0 response tokens (the authors'
`BurstGPT_without_fails_*.csv` leave those rows out): left out here too, their count in the
trace's source.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from workloads.checks import MAX_SECONDS, show
from workloads.errors import ConfigError
from workloads.files import parse_json
from workloads.traces import FILE_ROW, MAX_LENGTH, Trace

MOONCAKE_BLOCK_TOKENS = 512  # FAST25-release/README.md: "The block size is 512 tokens."
# BurstGPT's columns read (its README and header), as traces.read_trace's keys
BURSTGPT = {"arrival_s": "timestamp", "prompt_len": "request tokens",
            "output_len": "response tokens"}
MOONCAKE_KEYS = ("timestamp", "input_length", "output_length", "hash_ids")


def own_chunk(row: int) -> int:
    """A content id no other request shares: trace ids are >= 0, and -1 is skipped because
    Python hashes -1 as -2 (block hashes are tuple hashes of ints)."""
    return -(row + 2)


def read_mooncake(path: str | Path) -> Trace:
    path = Path(path)
    rows = []
    with open(path, encoding="utf-8-sig") as f:  # a BOM, as the CSV reader accepts one
        for n, line in enumerate(f, 1):
            if line.strip():
                rows.append(_row(line, f"--trace {path}:{n}"))
    if not rows:
        raise ConfigError(f"--trace {path}: no requests")
    order = np.argsort([r[0] for r in rows], kind="stable")
    rows = [rows[i] for i in order]
    content = tuple(_chunks(ids, prompt, out, i) for i, (_, prompt, out, ids) in enumerate(rows))
    return Trace(
        arrival_s=np.array([r[0] for r in rows], dtype=float) / 1e3,
        prompt_len=np.array([r[1] for r in rows], dtype=np.int64),
        output_len=np.array([r[2] for r in rows], dtype=np.int64),
        source=str(path), content=content,
    )


def _row(line: str, where: str) -> tuple[float, int, int, list[int]]:
    obj = parse_json(line, where)
    if not isinstance(obj, dict):
        raise ConfigError(f"{where}: expected an object with {', '.join(MOONCAKE_KEYS)}")
    missing = [k for k in MOONCAKE_KEYS if k not in obj]
    if missing:
        raise ConfigError(f"{where}: missing {', '.join(missing)} (a Mooncake trace has "
                          f"{', '.join(MOONCAKE_KEYS)})")
    t, prompt, out, ids = (obj[k] for k in MOONCAKE_KEYS)
    if (not isinstance(t, int | float) or isinstance(t, bool) or not t >= 0
            or not t <= 1e3 * MAX_SECONDS):
        raise ConfigError(f"{where}: timestamp {t!r}: expected milliseconds in [0, "
                          f"{1e3 * MAX_SECONDS:g}]")
    for name, v in (("input_length", prompt), ("output_length", out)):
        if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= MAX_LENGTH:
            raise ConfigError(f"{where}: {name} {show(v)}: expected a whole number in [1, "
                              f"{MAX_LENGTH:,}] (tokens)")
    blocks = -(-prompt // MOONCAKE_BLOCK_TOKENS)
    if (not isinstance(ids, list) or len(ids) != blocks
            or not all(isinstance(h, int) and not isinstance(h, bool) and h >= 0 for h in ids)):
        raise ConfigError(f"{where}: hash_ids: expected {blocks} whole numbers >= 0 (one per "
                          f"{MOONCAKE_BLOCK_TOKENS}-token block of input_length {prompt})")
    return float(t), prompt, out, ids


def _chunks(ids: list[int], prompt: int, out: int, row: int) -> tuple[tuple[int, int], ...]:
    b = MOONCAKE_BLOCK_TOKENS
    chunks = [(h, min(b, prompt - k * b)) for k, h in enumerate(ids)]
    return (*chunks, (own_chunk(row), out))


def burstgpt(table: Any) -> tuple[Any, dict[str, str | None], str] | None:
    """A BurstGPT CSV's rows (traces.read_trace's table) without its failed requests, the
    columns read under traces.read_trace's keys, and what was left out ("" where nothing);
    None where the table is not in that format (its three columns, case-insensitive)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    cols = {c.lower(): c for c in table.column_names}
    if not all(name in cols for name in BURSTGPT.values()):
        return None
    found = {key: cols[name] for key, name in BURSTGPT.items()} | {"model": None}
    out = table.column(found["output_len"])
    if not (pa.types.is_integer(out.type) or pa.types.is_floating(out.type)):
        return table, found, ""  # refused by the reader as any such column
    failed = pc.fill_null(pc.equal(out, 0), False)
    n = pc.sum(failed).as_py() or 0
    if not n:
        return table, found, ""
    rows = pa.array(np.arange(table.num_rows))
    return (table.append_column(FILE_ROW, rows).filter(pc.invert(failed)), found,
            f" (BurstGPT: {n:,} failed requests, 0 response tokens, left out)")
