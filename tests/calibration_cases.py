"""A small set of calibrate rows for the tests of the calibrate command."""

from __future__ import annotations

# A few SN40L rows of figures the uncertainty model covers: five calibrate rows, each refitted
# without itself, and a check row (the command's whole path at a seventh of the SN40L refits).
SN40L_ROWS = ("sn40l16-llama8b-tokens", "argonne-sn40l8-llama-3.1-8b-1024",
              "argonne-sn40l8-llama-3.1-8b-2048", "argonne-sn40l8-mistral-7b-1024",
              "argonne-sn40l8-llama-3.1-70b-1024")
SN40L_CHECK_ROW = "argonne-sn40l8-llama-2-7b-512"


def sn40l_cases(folder):
    """A --cases file of SN40L_ROWS and the check row, from the bundled rows."""
    import re

    from rdu_cluster.validation import published as v

    text = v.resources.files("rdu_cluster").joinpath("validation/measurements.toml").read_text()
    head, *blocks = text.split("\n[[row]]")
    keep = [b for b in blocks if re.search(r'^id = "(.*)"', b, re.MULTILINE).group(1)
            in (*SN40L_ROWS, SN40L_CHECK_ROW)]
    cases = folder / "rows.toml"
    cases.write_text(head + "".join("\n[[row]]" + b for b in keep))
    return cases
