"""Tables laid out for the width they are printed at: a number is never cut.

`FittedTable` is a rich renderable that builds its table when printed, for the console's width. No column is
ever narrower than its longest word, and a number is one word, so it is never cut or split; a cell of several
figures ("1,234 · 5,678") wraps between them only once the text columns have wrapped as far as they can. When the
table does not fit, the optional columns go first (highest `drop` first); when it still does not fit, each row is
shown as a small table of its own (header: value), so even a 40-column terminal shows every figure whole. Tests
print every table at 40 to 200 columns (tests/cli/test_layout.py).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import msgspec
from rich.table import Table

if TYPE_CHECKING:
    from rich.console import Console, ConsoleOptions, RenderResult

_BORDER_PER_COLUMN = 3
"""A column's padding (1 + 1) and its left border; the table adds one more border on the right."""


class Column(msgspec.Struct, frozen=True):
    """One column: its header, whether its cells are numbers (never cut), and when it may be dropped.

    `drop` 0: always shown; otherwise dropped to fit, the highest first."""

    header: str
    numeric: bool = True
    drop: int = 0


def text_column(header: str) -> Column:
    """A column of words, wrapped to fit."""
    return Column(header, numeric=False)


class FittedTable:
    """A table of text cells laid out when printed (module docstring)."""

    def __init__(
        self,
        title: str,
        columns: Sequence[Column],
        rows: Sequence[Sequence[str]],
        *,
        show_header: bool = True,
        caption: str | None = None,
    ) -> None:
        if any(len(row) != len(columns) for row in rows):
            raise ValueError(f"table {title!r}: every row needs {len(columns)} cells")
        self.title = title
        self.columns = list(columns)
        self.rows = [list(row) for row in rows]
        self.show_header = show_header
        self.caption = caption

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        # Titles and wrapped words fold to the width even on a console that prints soft-wrapped lines (the CLI's,
        # so that a path is never broken).
        wrapping = options.update(no_wrap=False, overflow="fold")
        for table in self.renderables(options.max_width):
            yield from console.render(table, wrapping)

    def renderables(self, width: int) -> Iterator[Table]:
        """The table for `width` columns: whole, with optional columns dropped, or one table per row."""
        kept = list(range(len(self.columns)))
        droppable = sorted((c.drop, i) for i, c in enumerate(self.columns) if c.drop > 0)
        while self._min_width(kept) > width and droppable:
            kept.remove(droppable.pop()[1])
        if self._min_width(kept) <= width:
            yield self._table(kept, width)
            return
        yield from self._per_row()

    def _cells(self, index: int) -> list[str]:
        return [row[index] for row in self.rows]

    def _column_min(self, index: int) -> int:
        """The narrowest the column may be: its longest word, header included (a number is one word)."""
        words = [word for text in [self.columns[index].header, *self._cells(index)] for word in text.split()]
        return max((len(word) for word in words), default=1)

    def _column_natural(self, index: int) -> int:
        """The column's width with nothing wrapped."""
        return max(len(text) for text in [self.columns[index].header, *self._cells(index)])

    def _min_width(self, kept: list[int]) -> int:
        return sum(self._column_min(i) + _BORDER_PER_COLUMN for i in kept) + 1

    def _widths(self, kept: list[int], width: int) -> dict[int, int]:
        """Each kept column's width: natural when the table fits, else the widest shrunk first (text columns
        before number columns), never below its longest word."""
        widths = {i: self._column_natural(i) for i in kept}
        floors = {i: self._column_min(i) for i in kept}
        room = width - _BORDER_PER_COLUMN * len(kept) - 1
        for numeric in (False, True):
            while sum(widths.values()) > room:
                shrinkable = [i for i in kept if self.columns[i].numeric == numeric and widths[i] > floors[i]]
                if not shrinkable:
                    break
                widest = max(shrinkable, key=lambda i: widths[i])
                widths[widest] -= 1
        return widths

    def _table(self, kept: list[int], width: int) -> Table:
        table = Table(title=self.title, title_justify="left", show_header=self.show_header, caption=self.caption)
        widths = self._widths(kept, width)
        for i in kept:
            column = self.columns[i]
            # A fixed width: rich would otherwise shrink any wrapable column, numbers included, to fit.
            table.add_column(
                column.header, justify="right" if column.numeric else "left", width=widths[i], overflow="fold"
            )
        for row in self.rows:
            table.add_row(*(row[i] for i in kept))
        return table

    def _per_row(self) -> Iterator[Table]:
        name, *rest = range(len(self.columns))
        for row in self.rows:
            table = Table(title=f"{self.title}: {row[name]}", title_justify="left", show_header=False)
            table.add_column("what", overflow="fold")
            table.add_column("value", justify="right", no_wrap=True, overflow="fold")
            for i in rest:
                table.add_row(self.columns[i].header, row[i])
            yield table


def markdown_table(title: str, header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """A table as Markdown lines under a `###` heading, pipes in cells escaped, then a blank line."""
    lines = [f"### {title}", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return [*lines, ""]
