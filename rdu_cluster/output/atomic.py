"""Crash-safe file writing, the one way every command writes a result: atomic_write (a hidden
temporary file in the destination's folder, flushed, renamed over the file), folder_swap and
TableFolder (a whole result folder built aside and swapped in), the checks of a destination
before anything is made (check_destination, check_folder), and the clean-up of what a killed
run left (recover). The result schema is output/results.py."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import IO, TYPE_CHECKING, Self

from workloads.checks import show
from workloads.errors import ConfigError

if TYPE_CHECKING:  # pyarrow loads where a table is written, not with every command
    import pyarrow as pa
    import pyarrow.parquet as pq

# Result files are for others to read (a shared folder, a colleague): 0666 less the umask, as
# open() would make them; mkstemp's 0600 would hide them.
_UMASK = os.umask(0)
os.umask(_UMASK)
FILE_MODE = 0o666 & ~_UMASK
DIR_MODE = 0o777 & ~_UMASK


def check_destination(path: str | Path, what: str = "--out",
                      create_parents: bool = False) -> Path:
    """Refuse, before any work, a file destination that cannot be written: an existing
    directory, a missing (unless `create_parents`: the writer makes it) or non-folder parent,
    a folder nothing can be written in."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{what} {path}: is a directory; expected a file name")
    _check_replaceable(path, what)
    check_name(path, what)
    parent = path.parent
    while create_parents and not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        why = "is not a folder" if parent.exists() else "does not exist"
        raise ConfigError(f"{what} {path}: folder {parent} {why}")
    _probe(parent, f"{what} {path}")
    return path


def _probe(folder: Path, where: str) -> None:
    """Create and remove an empty hidden folder in `folder`: the one test of writability that
    holds for root, read-only mounts and pseudo file systems (/proc) alike."""
    try:
        os.rmdir(tempfile.mkdtemp(prefix=_temp_prefix(_PROBE), suffix=".tmp", dir=folder))
        recover(folder / _PROBE)  # a probe a killed run left
    except OSError as e:
        raise ConfigError(f"{where}: cannot write in {folder}: {e.strerror or e}") from None


# ---- temporary names: this writer's own, and the stale ones of killed runs -------------------
# A temporary file or folder is ".NAME.rdu-HOST-PID-XXXXXXXX.STATE" beside NAME: HOST a hash of
# the machine's name, PID the writing process, STATE tmp (being written), new (a whole result
# set, ready to be renamed in) or old (the earlier set, moved aside). A killed run (SIGKILL: no
# cleanup runs) leaves them behind; the next write to NAME (and a resumed sweep) removes those
# of processes no longer alive on this machine, and finishes an interrupted folder swap. A name
# not of this form is never touched.
_HOST = hashlib.blake2s(socket.gethostname().encode(), digest_size=4).hexdigest()
_STATES = ("tmp", "new", "old")
_PROBE = "rdu-probe"  # the name _probe's empty folders are temporaries of


def within(path: str | Path, folder: str | Path) -> bool:
    """Whether `path` is `folder` or lies in it (links resolved): a file written there would
    join a result set that is replaced, or read, as a whole."""
    path, folder = Path(path).resolve(), Path(folder).resolve()
    return path == folder or folder in path.parents


def _check_replaceable(path: Path, what: str) -> None:
    """A result replaces its destination by a rename: never a device, FIFO or socket that
    happens to bear the name (as root, /dev/null or /dev/full would be replaced by a file)."""
    if path.exists() and not path.is_file():
        raise ConfigError(f"{what} {path}: exists and is not a regular file (a device, FIFO or "
                          "socket); expected a file name")


# A name's bytes the file system takes (255) less what a temporary beside it adds (_temp_prefix,
# ".tmp"/".new" and mkstemp's 8 characters: about 40).
MAX_NAME = 215


def check_name(path: Path, what: str, extra: str = "") -> None:
    """A destination whose name, with `extra` added (a sweep's ".sweep" folder beside it), leaves
    room for the temporaries written beside it: a legal name is not refused later for them."""
    size = len((path.name + extra).encode())
    if size > MAX_NAME:
        raise ConfigError(f"{what} {path.name[:40]}...: a name of {size} bytes"
                          f"{f' with {extra}' if extra else ''}; at most {MAX_NAME} accepted (a "
                          f"hidden temporary beside it adds {255 - MAX_NAME} to the system's 255)")


def _temp_prefix(name: str) -> str:
    return f".{name}.rdu-{_HOST}-{os.getpid()}-"


def _temp_pattern(name: str | None) -> re.Pattern:
    who = re.escape(name) if name is not None else ".+"
    return re.compile(rf"\.(?P<name>{who})\.rdu-(?P<host>[0-9a-f]{{8}})-(?P<pid>\d+)-"
                      rf"(?P<run>[a-z0-9_]{{8}})\.(?P<state>{'|'.join(_STATES)})")


def is_temporary(path: Path) -> bool:
    """Whether `path` is named as this module's temporary files and folders are."""
    return _temp_pattern(None).fullmatch(path.name) is not None


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True  # another user's process, or a number no process can have: leave it be
    return True


def stale_temporaries(folder: Path, name: str | None = None) -> list[tuple[Path, re.Match]]:
    """The temporary files and folders in `folder` (of `name`, or of any name) left by
    processes of this machine that are no longer alive."""
    pattern = _temp_pattern(name)
    out: list[tuple[Path, re.Match]] = []
    try:
        entries = sorted(Path(folder).iterdir())
    except OSError:
        return out
    for path in entries:
        m = pattern.fullmatch(path.name)
        if m and m["host"] == _HOST and not _alive(int(m["pid"])):
            out.append((path, m))
    return out


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def recover(dest: str | Path) -> int:
    """Clean up after runs killed while writing `dest`: if `dest` is missing while one run left
    both its whole new set (.new) and the earlier one moved aside (.old), it was killed between
    the two renames of folder_swap: the new set is renamed in, as that run would have done.
    Every other stale temporary of `dest` is removed. Returns how many entries were removed."""
    dest = Path(dest)
    stale = stale_temporaries(dest.parent, dest.name)
    if not dest.exists():
        runs: dict[str, dict[str, Path]] = {}
        for path, m in stale:
            runs.setdefault(m["run"], {})[m["state"]] = path
        swapped = [r for r in runs.values() if {"new", "old"} <= set(r)]
        if swapped:
            latest = max(swapped, key=lambda r: r["new"].stat().st_mtime_ns)
            os.rename(latest["new"], dest)
            stale = [(p, m) for p, m in stale if p != latest["new"]]
    for path, _ in stale:
        _remove(path)
    return len(stale)


def atomic_write(path: str | Path, data: bytes | Callable[[str], None],
                 what: str = "--out", clean: bool = True, parents: bool = False) -> Path:
    """THE writer of every result file: a hidden temporary file in the same folder (mode 0644
    under the usual umask), flushed to disk, then renamed over `path`, so a reader or a resumed
    run sees the whole file or none of it; on any failure or interruption (Ctrl-C, SIGTERM) the
    temporary file is removed, and those a killed run left are removed by the next write
    (recover; `clean=False` skips that look through the folder, for a writer of many files that
    cleans up once, as a resumed sweep does). `data` is the bytes, or a function writing the
    file at the path it is given; `parents`: its folder is made if missing (a new partition's).
    An unwritable destination is one ConfigError line naming it."""
    path = Path(path)
    if parents:
        path.parent.mkdir(parents=True, exist_ok=True)
    # named before it is created, inside the try whose finally removes it: a Ctrl-C or SIGTERM
    # inside mkstemp, or between it and the try, left the file behind (seen in a sweep's
    # manifest folder); folder_swap's folder likewise
    tmp = str(path.parent / f"{_temp_prefix(path.name)}{secrets.token_hex(4)}.tmp")
    try:
        try:
            if clean:
                recover(path)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        except OSError as e:
            raise ConfigError(f"{what} {path}: cannot write: {e.strerror or e}") from None
        os.fchmod(fd, FILE_MODE)
        with os.fdopen(fd, "wb") as f:
            if isinstance(data, (bytes, bytearray, memoryview)):
                f.write(data)
            else:
                data(tmp)
            f.flush()
            os.fsync(f.fileno())
        if path.is_dir():
            raise ConfigError(f"{what} {path}: is a directory; expected a file name")
        _check_replaceable(path, what)
        os.replace(tmp, path)
    except OSError as e:
        raise ConfigError(f"{what} {path}: cannot write: {e.strerror or e}") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def write_table(tbl: pa.Table, path: str | Path) -> Path:
    """Write `.parquet` or `.arrow` (IPC file) atomically (atomic_write)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = check_table_path(path)
    if path.suffix == ".parquet":
        return atomic_write(path, lambda tmp: pq.write_table(tbl, tmp))

    def ipc(tmp: str) -> None:
        with pa.OSFile(tmp, "wb") as sink, pa.ipc.new_file(sink, tbl.schema) as writer:
            writer.write_table(tbl)

    return atomic_write(path, ipc)


def check_table_path(path: str | Path, what: str = "--out") -> Path:
    if str(path).endswith("/"):  # Path() would drop the slash that makes it a folder
        raise ConfigError(f"{what} {path}: names a folder; expected a .parquet or .arrow file "
                          "name")
    path = Path(path)
    if path.suffix not in (".parquet", ".arrow"):
        raise ConfigError(f"{what} {path}: expected a .parquet or .arrow file name")
    return check_destination(path, what)


@contextlib.contextmanager
def folder_swap(out: str | Path, owned: Iterable[str], what: str = "--out") -> Iterator[Path]:
    """Write a result set as a whole: yield an empty hidden folder (.tmp) beside `out` to fill.
    On success: the filled folder is renamed .new (whole: the mark that it may go in), then
    swapped with `out` (_swap: in one step where the system can, else `out` renamed .old and
    .new renamed `out`), and the earlier set deleted; so `out` never holds files of two runs. A
    kill (SIGKILL) at any step leaves the earlier set or the new one, whole: the one moment of
    the two-step swap when `out` is missing leaves both .new and .old, and the next write to
    `out` (recover) renames the new set in. On an error or interruption (Ctrl-C, SIGTERM) the
    hidden folders are removed and the earlier set stays. `out` may exist only if it holds
    nothing but names in `owned` (an earlier result set): a folder of other files is refused,
    never replaced."""
    out = check_folder(out, owned, what)
    tmp = out.parent / f"{_temp_prefix(out.name)}{secrets.token_hex(4)}.tmp"  # as atomic_write's
    new, old = tmp.with_suffix(".new"), tmp.with_suffix(".old")
    try:
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            recover(out)
            os.mkdir(tmp, 0o700)
            os.chmod(tmp, DIR_MODE)
        except OSError as e:
            raise ConfigError(f"{what} {out}: cannot write: {e.strerror or e}") from None
        yield tmp
        os.rename(tmp, new)
        # a symlinked `out` swapped out leaves the link here: unlinked, not its folder deleted
        _remove(_swap(out, new, old))
    except OSError as e:
        raise ConfigError(f"{what} {out}: cannot write: {e.strerror or e}") from None
    finally:
        if old.exists() and not out.exists():  # interrupted between the renames after all
            os.rename(old, out)
        for leftover in (tmp, new, old):
            _remove(leftover)


class StreamedFile:
    """atomic_write in pieces: text written as it is made into the same hidden temporary file
    beside `path` (so a long output is never held whole), flushed to disk and renamed over
    `path` by commit(); until then `path` is as it was. An error or interruption in the `with`
    block, or discard(), removes the temporary (recover removes what a killed run left)."""

    def __init__(self, path: str | Path, what: str = "--out") -> None:
        self.path, self.what = Path(path), what
        self.tmp = str(self.path.parent / f"{_temp_prefix(self.path.name)}"
                       f"{secrets.token_hex(4)}.tmp")
        self._file: IO[str] | None = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        if exc[0] is not None:
            self.discard()

    def write(self, text: str) -> None:
        try:
            if self._file is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                recover(self.path)
                fd = os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC,
                             0o600)
                os.fchmod(fd, FILE_MODE)
                self._file = os.fdopen(fd, "w", encoding="utf-8", buffering=1 << 20)
            self._file.write(text)
        except OSError as e:
            self.discard()
            raise ConfigError(f"{self.what} {self.path}: cannot write: {e.strerror or e}"
                              ) from None

    def commit(self) -> Path:
        """The whole file at `path` (an empty one if nothing was written)."""
        try:
            if self._file is None:
                self.write("")
            assert self._file is not None  # write opened it
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            if self.path.is_dir():
                raise ConfigError(f"{self.what} {self.path}: is a directory; expected a file "
                                  "name")
            _check_replaceable(self.path, self.what)
            os.replace(self.tmp, self.path)
        except OSError as e:
            raise ConfigError(f"{self.what} {self.path}: cannot write: {e.strerror or e}"
                              ) from None
        finally:
            self.discard()
        return self.path

    def discard(self) -> None:
        """Remove the temporary file (nothing at `path` changes)."""
        f, self._file = self._file, None
        if f is not None and not f.closed:
            with contextlib.suppress(OSError):
                f.close()
        if os.path.exists(self.tmp):
            os.unlink(self.tmp)


class TableFolder:
    """A result set written as a whole (folder_swap) whose tables may come in chunks: each
    name's chunks go to one Parquet file (a row group each) as they arrive, so a long run's
    rows need not be held until the end. The hidden folder is made at the first write (a run
    refused before it writes leaves nothing behind) and swapped in by `commit`; as a context
    manager, an error or interruption before then removes it and leaves `out` as it was."""

    def __init__(self, out: str | Path, owned: Iterable[str], what: str = "--out"):
        self.out, self.owned, self.what = check_folder(out, owned, what), tuple(owned), what
        self._stack = contextlib.ExitStack()
        self._tmp: Path | None = None
        self._writers: dict[str, pq.ParquetWriter] = {}

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> bool:
        try:
            self._close_writers()
        except ConfigError as e:  # a full disk: the hidden folder goes all the same
            self._stack.__exit__(type(e), e, e.__traceback__)
            if exc[0] is None:
                raise
        return bool(self._stack.__exit__(*exc))

    def _folder(self) -> Path:
        if self._tmp is None:
            self._tmp = self._stack.enter_context(folder_swap(self.out, self.owned, self.what))
        return self._tmp

    def write(self, name: str, tbl: pa.Table) -> None:
        """One more chunk of table `name` (the first one's schema is the file's)."""
        import pyarrow.parquet as pq

        writer = self._writers.get(name)
        if writer is None:
            writer = self._writers[name] = pq.ParquetWriter(self._folder() / f"{name}.parquet",
                                                            tbl.schema)
        writer.write_table(tbl)

    def commit(self, tables: Mapping[str, pa.Table | None], summary: dict | None = None,
               summary_name: str = "") -> None:
        """The last chunks (None: a table streamed whole already) and summary.json, then the
        folder replaces `out`."""
        for name, tbl in tables.items():
            if tbl is not None:
                self.write(name, tbl)
        self._close_writers()
        if summary is not None:
            write_json(summary, self._folder() / summary_name)
        self._folder()
        self._stack.close()

    def _close_writers(self) -> None:
        try:  # a file's last row group and footer are written here: a full disk shows now
            for writer in self._writers.values():
                writer.close()
        except OSError as e:
            raise ConfigError(f"{self.what} {self.out}: cannot write: {e.strerror or e}") from None
        finally:
            self._writers.clear()


def _swap(out: Path, new: Path, old: Path) -> Path:
    """`new` replaces `out`; returns where the earlier set now lies (to delete). In one step
    where the system can (Linux: the two names exchanged, so `out` is never missing; the
    earlier set is then at `new`), else in two renames (`out` to `old`, `new` to `out`).
    Ctrl-C and SIGTERM are deferred until it is done (raised as KeyboardInterrupt right after),
    so an interruption never leaves `out` missing; if the second rename fails, the earlier
    folder goes back. (Masking the signal would not do: Python runs its handler as soon as any
    thread, tqdm's monitor for one, takes the signal.)"""
    pending: list[int] = []
    saved = {}
    try:
        for sig in (signal.SIGINT, signal.SIGTERM):
            saved[sig] = signal.signal(sig, lambda signum, frame: pending.append(signum))
    except ValueError:  # not the main thread: no handler of ours runs here anyway
        pass
    try:
        moved = out.exists()
        if moved and _exchange(new, out):
            old = new
        else:
            if moved:
                os.rename(out, old)
            try:
                os.rename(new, out)
            except OSError:
                if moved:
                    os.rename(old, out)
                raise
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
    if pending:
        raise KeyboardInterrupt
    return old


def _renameat2():
    """libc's renameat2 (Linux 3.15+, glibc 2.28+), or None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_RENAMEAT2 = _renameat2()
_AT_FDCWD, _RENAME_EXCHANGE = -100, 2  # <fcntl.h>, <linux/fs.h>


def _exchange(a: Path, b: Path) -> bool:
    """Swap the two names in one step; False where the system or file system cannot (the
    caller then renames in two steps)."""
    if _RENAMEAT2 is None:
        return False
    if _RENAMEAT2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def check_folder(out: str | Path, owned: Iterable[str], what: str = "--out") -> Path:
    """The checks folder_swap makes, for use before any work starts."""
    if Path(out).name in ("", ".", ".."):  # "", ".", "/", "a/..": a folder cannot replace itself
        raise ConfigError(f"{what} {show(str(out))}: names no folder of its own (the current "
                          "folder, a parent or the root); give a folder name such as run/")
    out = Path(out)
    check_name(out, what)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{what} {out}: exists and is not a folder")
    if out.is_dir():
        foreign = sorted(p.name for p in out.iterdir() if p.name not in set(owned))
        if foreign:
            raise ConfigError(f"{what} {out}: holds {foreign[0]!r}, not written by this "
                              "command; choose an empty or new folder")
    parent = out.parent  # missing folders are created on writing, under the nearest existing one
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise ConfigError(f"{what} {out}: {parent} is not a folder")
    _probe(parent, f"{what} {out}")
    return out


def write_json(obj: Mapping, path: str | Path) -> Path:
    """Write one JSON object through atomic_write."""
    text = json.dumps(obj, indent=2, allow_nan=False) + "\n"
    return atomic_write(path, text.encode())
