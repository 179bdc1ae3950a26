"""Progress of long commands (serve, sweep, capacity, calibrate): done / total, rate and ETA,
through tqdm. On a terminal the bar is redrawn in place; anywhere else (a log file, a CI job,
`ray job submit`) it is a plain line every LOG_EVERY_S seconds and a last one at the end, so a
log shows progress without carriage returns.

    with Progress(total, "points", "sweep") as bar:
        bar.update(n)            # n more done
    Simulation(..., progress=bar.set_done)   # or: an absolute count (done, total)
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Self, TextIO

LOG_EVERY_S = 5.0  # seconds between lines when the stream is not a terminal
TTY_FORMAT = ("{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} {unit} "
              "[elapsed {elapsed}, ETA {remaining}, {rate_fmt}]")
LOG_FORMAT = ("{desc}: {n_fmt}/{total_fmt} {unit} ({percentage:.0f}%)  {rate_fmt}  "
              "elapsed {elapsed}  ETA {remaining}")


class _Lines:
    """A stream for tqdm that writes each status as its own line (tqdm redraws with '\\r')."""

    def __init__(self, stream: TextIO):
        self.stream, self.last = stream, ""

    def write(self, text: str) -> None:
        line = text.replace("\r", "").strip()
        if line and line != self.last:
            self.stream.write(line + "\n")
            self.last = line

    def flush(self) -> None:
        self.stream.flush()


class Progress:
    """A progress bar of `total` `unit`s on `stream` (stderr); `enabled=False`: silent. Nothing
    is drawn before the first update or `start()`, so a command that fails while setting up
    prints its one-line error alone; rate and elapsed time count from construction."""

    def __init__(self, total: int, unit: str, desc: str, stream: TextIO | None = None,
                 enabled: bool = True):
        self.total, self.unit, self.desc, self.enabled = total, unit, desc, enabled
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.done = 0
        self.bar: Any = None  # a tqdm (untyped), made at start()
        self.t0 = time.time()

    def start(self) -> None:
        """Draw the bar now (at 0) rather than at the first update."""
        if self.bar is not None:
            return
        from tqdm import tqdm

        out = self.stream
        sized = self.tty and _columns(out) > 0  # a pty may report 0 columns: tqdm draws nothing
        self.bar = tqdm(
            total=self.total, unit=self.unit, desc=self.desc, disable=not self.enabled,
            leave=True, file=out if self.tty else _Lines(out), dynamic_ncols=sized,
            ncols=None if sized or not self.tty else 100, nrows=None if sized else 24,
            ascii=not self.tty, bar_format=TTY_FORMAT if self.tty else LOG_FORMAT,
            mininterval=0.1 if self.tty else LOG_EVERY_S, maxinterval=LOG_EVERY_S * 2,
        )
        self.bar.start_t = self.bar.last_print_t = self.t0  # tqdm's clock is time.time

    def update(self, n: int = 1) -> None:
        self.start()
        self.done += n
        self.bar.update(n)

    def set_done(self, done: int, total: int | None = None) -> None:
        """Absolute progress (the Simulation's callback: requests finished, of total)."""
        if total is not None and total != self.total:
            self.total = total
            if self.bar is not None:
                self.bar.total = total
        if done > self.done:
            self.update(done - self.done)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _columns(stream: TextIO) -> int:
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (OSError, ValueError, AttributeError):
        return 0
