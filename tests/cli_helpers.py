"""What the CLI tests share: run the command line in this process, and read a store with plain SQL
(read-only), so that tests check the command's output against the rows themselves."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from tilepilot.cli import main


def run(capsys: pytest.CaptureFixture[str], *argv: object) -> tuple[int, str, str]:
    """`tilepilot ARGV...` in this process: exit code, stdout, stderr."""
    capsys.readouterr()
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def sql(db: Path, query: str, params: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
    """Rows of a query on the store, opened read-only."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    con.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in con.execute(query, params)]
    finally:
        con.close()
