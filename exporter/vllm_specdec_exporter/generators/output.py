"""Writing generated files, or checking them for drift (`--check`): one way for every generator."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path


def write_or_check(files: dict[str, str], out: Path, check: bool) -> list[str]:
    """Write each file under ``out``; with ``check``, write nothing and return the stale paths."""
    stale = []
    for filename, text in files.items():
        path = out / filename
        if check:
            if not path.exists() or path.read_text() != text:
                stale.append(str(path))
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    return stale


def update_or_check(path: Path, change: Callable[[str], str], check: bool) -> list[str]:
    """Apply ``change`` to a file in place (a generated block inside a hand-written file)."""
    text = path.read_text()
    new = change(text)
    if new == text:
        return []
    if check:
        return [str(path)]
    path.write_text(new)
    return []


def exit_status(stale: list[str]) -> int:
    if stale:
        print(f"out of date (run make generate): {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0
