"""The `rdu-cluster` console script. Loading the CLI takes about a second (numpy, pyarrow,
every command): a Ctrl-C or SIGTERM in that second ends the run as one later does ("aborted",
exit 130), not with an import's traceback or a bare kill. Nothing has been written then."""

from __future__ import annotations

import signal
import sys


def run() -> None:
    def interrupt(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)  # SIGINT raises KeyboardInterrupt already
    try:
        from rdu_cluster.cli import main
    except KeyboardInterrupt:
        sys.stderr.write("aborted\n")
        sys.exit(130)
    main()
