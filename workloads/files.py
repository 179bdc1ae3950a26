"""Reading the user's input files (JSON, TOML) with every failure a one-line ConfigError naming
the file: missing, a directory, unreadable, too large, not UTF-8 text, malformed, nested past any
real config's depth, or holding numbers past what Python converts."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

from workloads.errors import ConfigError

# The largest config, spec or case file accepted: the biggest bundled one is ~10 KB, a published
# HF config.json some KB; 16 MiB leaves three orders of magnitude and keeps a stray dataset out.
MAX_BYTES = 16 * 2**20


def check_file(p: Path, w: str) -> None:
    """Refuse a path that is not a regular file, saying what it is instead."""
    if p.is_dir():
        raise ConfigError(f"{w}: is a directory, expected a file")
    if not p.exists():
        raise ConfigError(f"{w}: no such file")
    if not p.is_file():  # a FIFO or a device: reading it may never end
        raise ConfigError(f"{w}: not a regular file; expected a file")


def read_text(path: str | Path, what: str = "") -> str:
    p = Path(path)
    w = f"{what} {p}" if what else str(p)
    try:
        check_file(p, w)
        with p.open("rb") as f:
            data = f.read(MAX_BYTES + 1)  # at most: a file may grow after its size is read
        if len(data) > MAX_BYTES:
            raise ConfigError(f"{w}: over {MAX_BYTES:,} bytes; at most {MAX_BYTES:,} accepted")
        return data.decode("utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{w}: no such file") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{w}: not UTF-8 text (byte {e.start}); expected a text "
                          "file") from None
    except OSError as e:
        raise ConfigError(f"{w}: cannot read: {e.strerror or e}") from None


def read_json(path: str | Path, what: str = "") -> Any:
    return parse_json(read_text(path, what), f"{what} {path}" if what else str(path))


def parse_json(text: str, where: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{where}: malformed JSON ({str(e).splitlines()[0]})") from None
    except RecursionError:
        raise ConfigError(f"{where}: JSON nested too deeply to be a config") from None
    except ValueError as e:  # an integer of more than 4300 digits
        raise ConfigError(f"{where}: malformed JSON ({str(e).splitlines()[0][:80]})") from None


# Parsed TOML by file text: a calibration reads the same few cluster and chip files thousands of
# times (tomllib is pure Python, ~2 ms a file; a copy of the parsed dict ~50 us). Keyed by the text
# itself, so an edited file is parsed again however quickly it was rewritten.
_PARSED: dict[str, dict[str, Any]] = {}
_PARSED_MAX = 64
_PARSED_TEXT = 2**20  # a config file is KBs: the cache holds at most 64 MiB of text


def read_toml(path: str | Path, what: str = "") -> dict[str, Any]:
    text = read_text(path, what)
    parsed = _PARSED.get(text)
    if parsed is None:
        parsed = parse_toml(text, f"{what} {Path(path).name}" if what else Path(path).name)
        if len(text) > _PARSED_TEXT:
            return parsed  # parsed for this caller alone: nothing else holds it
        if len(_PARSED) >= _PARSED_MAX:
            del _PARSED[next(iter(_PARSED))]  # the oldest: a bounded cache
        _PARSED[text] = parsed
    return _copied(parsed)  # callers may change their dict; the cached one stays


def _copied(value: Any) -> Any:
    """A parsed TOML value's copy: tables and arrays copied, the rest (str, numbers, dates) is
    immutable and shared. Several times faster than copy.deepcopy, which keeps a memo."""
    if isinstance(value, dict):
        return {k: _copied(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copied(v) for v in value]
    return value


def parse_toml(text: str, name: str) -> dict[str, Any]:
    """TOML text read already (by read_text), every failure a one-line ConfigError naming it."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{name}: malformed TOML: {e}") from None
    except RecursionError:
        raise ConfigError(f"{name}: TOML nested too deeply") from None
    except ValueError as e:
        raise ConfigError(f"{name}: malformed TOML: {str(e)[:80]}") from None
