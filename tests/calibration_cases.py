"""Small sets of calibrate rows for the tests of the calibrate command."""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

# A few SN40L rows of figures the uncertainty model covers: five calibrate rows, each refitted
# without itself, and a check row (the command's whole path at a seventh of the SN40L refits).
SN40L_ROWS = ("sn40l16-llama8b-tokens", "argonne-sn40l8-llama-3.1-8b-1024",
              "argonne-sn40l8-llama-3.1-8b-2048", "argonne-sn40l8-mistral-7b-1024",
              "argonne-sn40l8-llama-3.1-70b-1024")
SN40L_CHECK_ROW = "argonne-sn40l8-llama-2-7b-512"


def sn40l_cases(folder, ids: Collection[str] = (*SN40L_ROWS, SN40L_CHECK_ROW)):
    """A --cases file of SN40L_ROWS and the check row (or the rows `ids`), from the bundled
    rows."""
    return cases_file(folder, lambda row: row["id"] in ids)


def cases_file(folder, keep: Callable[[dict[str, Any]], bool]):
    """A --cases file (folder/rows.toml) of the bundled rows `keep` takes, as they are written
    there (with the file's version)."""
    import tomllib

    from rdu_cluster.validation import published as v

    text = v.resources.files("rdu_cluster").joinpath("validation/measurements.toml").read_text()
    head, *blocks = text.split("\n[[row]]")
    kept = [b for b in blocks if keep(tomllib.loads("[[row]]" + b)["row"][0])]
    cases = folder / "rows.toml"
    cases.write_text(head + "".join("\n[[row]]" + b for b in kept))
    return cases
