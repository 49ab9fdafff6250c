"""Checks that terminal tables fit a width and never cut a number (issue 18, item 1): used by the table tests."""

from __future__ import annotations

import io
import re
from collections.abc import Iterable

from rich.console import Console

from agentx.cli.layout import FittedTable

BOX = re.compile(r"[│┃]")
WIDTHS = (80, 120)


def rendered(items: Iterable[object], width: int) -> str:
    """What a terminal `width` columns wide shows of `items` (the CLI's console settings)."""
    console = Console(width=width, record=True, file=io.StringIO(), highlight=False, soft_wrap=True)
    for item in items:
        console.print(item)
    return console.export_text()


def cells(text: str) -> set[str]:
    """Every table cell's text as printed (stripped)."""
    return {cell.strip() for line in text.splitlines() if BOX.search(line) for cell in BOX.split(line)}


def assert_fits(tables: Iterable[FittedTable], width: int) -> str:
    """Print `tables` at `width`: no line is wider, nothing is cut with an ellipsis, and every number of every
    column that may not be dropped is printed whole in a cell of its own. Returns the text."""
    tables = list(tables)
    text = rendered(tables, width)
    too_wide = [line for line in text.splitlines() if len(line) > width]
    assert not too_wide, f"lines wider than {width}: {too_wide}"
    assert "…" not in text, text
    printed = cells(text)
    for table in tables:
        for index, column in enumerate(table.columns):
            if not column.numeric or column.drop:
                continue
            for row in table.rows:
                value = re.sub(r"\[/?[a-z ]*\]", "", row[index])  # rich markup is not printed
                assert value in printed, f"{table.title}: {value!r} not whole at width {width}\n{text}"
    return text
