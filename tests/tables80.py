"""Checks that terminal tables fit a width and never cut a number: used by the table tests."""

from __future__ import annotations

import io
import re
from collections.abc import Iterable

from rich.console import Console

from agentx.cli.display.layout import FittedTable

BOX = re.compile(r"[│┃]")
WIDTHS = (80, 120)


def rendered(items: Iterable[object], width: int) -> str:
    """What a terminal `width` columns wide shows of `items` (the CLI's console settings)."""
    console = Console(width=width, record=True, file=io.StringIO(), highlight=False, soft_wrap=True)
    for item in items:
        console.print(item)
    return console.export_text()


def words(text: str) -> set[str]:
    """Every word printed in a table cell."""
    return {word for line in text.splitlines() if BOX.search(line) for cell in BOX.split(line) for word in cell.split()}


def assert_fits(tables: Iterable[FittedTable], width: int) -> str:
    """Print `tables` at `width`: no line is wider, nothing is cut with an ellipsis, and every number (every word)
    of every column that may not be dropped is printed whole, never cut or split across lines. Returns the text."""
    tables = list(tables)
    text = rendered(tables, width)
    too_wide = [line for line in text.splitlines() if len(line) > width]
    assert not too_wide, f"lines wider than {width}: {too_wide}"
    assert "…" not in text, text
    printed = words(text)
    for table in tables:
        for index, column in enumerate(table.columns):
            if not column.numeric or column.drop:
                continue
            for row in table.rows:
                value = re.sub(r"\[/?[a-z ]*\]", "", row[index])  # rich markup is not printed
                missing = [word for word in value.split() if word not in printed]
                assert not missing, f"{table.title}: {missing} of {value!r} not whole at width {width}\n{text}"
    return text
