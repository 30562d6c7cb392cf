"""The sandbox-side programs' text for a run on this machine: their records directory (the
sandbox user's and root's alike, so the tests pass as root too) moved to a test's own."""

from __future__ import annotations

from pathlib import Path

from e2b_provider.protocol.command_records import RECORDS, ROOT_RECORDS
from e2b_provider.sandbox_side import source


def local_program(name: str, records: Path) -> str:
    """The text of the sandbox-side program ``name`` (``"supervisor"``, ``"supervisor.sh"``
    or ``"records.sh"``) keeping its records in ``records``."""
    text = original = source(name)
    for where in (RECORDS, ROOT_RECORDS):
        if name.endswith(".sh"):
            line = "records=" if where == RECORDS else "root_records="
            text = text.replace(f"{line}{where}\n", f"{line}{records}\n")
        else:
            line = "RECORDS" if where == RECORDS else "ROOT_RECORDS"
            text = text.replace(f'\n{line} = "{where}"\n', f"\n{line} = {str(records)!r}\n")
    assert text.count(str(records)) == 2 and text != original, name
    return text
