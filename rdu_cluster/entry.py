"""The `rdu-cluster` console script. Loading the CLI takes about a second (numpy, pyarrow,
every command): a Ctrl-C or SIGTERM in that second ends the run as one later does ("aborted",
exit 130), not with an import's traceback or a bare kill. Nothing has been written then."""

from __future__ import annotations

import os
import signal
import sys

# numpy's OpenBLAS starts a thread per core at import, ~0.1 s of CPU a command (a default
# simulate: 0.55 -> 0.45 s). The simulator's numpy work is elementwise on small arrays, where
# BLAS threads do nothing; parallel work is processes (sweeps, capacity --jobs, Ray). A value
# the user set wins.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def run() -> None:
    def interrupt(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)  # SIGINT raises KeyboardInterrupt already
    try:
        from rdu_cluster.cli import main
    except BaseException as e:
        if not interrupted(e):
            raise
        sys.stderr.write("aborted\n")
        sys.exit(130)
    try:
        main()
    finally:
        # The command is over, its output written and its exit code set: a signal now would
        # only cut the interpreter's teardown short (which restores the default handlers
        # first), killing it with no "aborted" line and no exit code of its own.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)


def interrupted(e: BaseException | None) -> bool:
    """Whether `e` is a Ctrl-C or SIGTERM (KeyboardInterrupt), or an error it caused: raised
    in a class body's __set_name__ (numpy's, while it imports) it comes out as a RuntimeError
    with the interrupt as its cause, which is an interruption all the same, not a failure."""
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, KeyboardInterrupt):
            return True
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return False
