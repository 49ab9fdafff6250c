"""Reading a records table's columns, tolerant of absent optional ones.

A file written by an older or newer minor version lacks some columns or has more: every reader here gives
what an absent column means (NaN, a fallback column, a default) instead of failing.

`pyarrow.compute` is imported where it is used: loading it takes ~50 ms that a replay should not spend before its
first request (bench/startup.py), and only the summary at the end needs it.
"""

from __future__ import annotations

from typing import overload

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from agentx.results.summary.stats import FloatArray, IntArray


def has(table: pa.Table, name: str) -> bool:
    return name in table.schema.names


def floats(table: pa.Table, name: str) -> FloatArray:
    """The column as float64 with nulls as NaN; all NaN when absent."""
    import pyarrow.compute as pc

    if not has(table, name):
        return np.full(table.num_rows, np.nan)
    column = pc.cast(table.column(name), pa.float64())
    return np.asarray(column.to_numpy(zero_copy_only=False), dtype=np.float64)


def ints_or(table: pa.Table, name: str, fallback: str) -> IntArray:
    """Column `name`, its nulls (or the whole column, when absent) filled from column `fallback`."""
    import pyarrow.compute as pc

    base = table.column(fallback)
    column = pc.coalesce(table.column(name), base) if has(table, name) else base
    return np.asarray(column.to_numpy(zero_copy_only=False), dtype=np.int64)


def equals(table: pa.Table, name: str, value: object, *, missing: bool = False) -> npt.NDArray[np.bool_]:
    """Row mask: the column equals `value` (null → False); all `missing` when the column is absent."""
    import pyarrow.compute as pc

    if not has(table, name):
        return np.full(table.num_rows, missing, dtype=bool)
    mask = pc.fill_null(pc.equal(table.column(name), value), False)
    return np.asarray(mask.to_numpy(zero_copy_only=False), dtype=bool)


@overload
def strings(table: pa.Table, name: str, default: str = "") -> list[str]: ...
@overload
def strings(table: pa.Table, name: str, default: None) -> list[str | None]: ...
def strings(table: pa.Table, name: str, default: str | None = "") -> list[str] | list[str | None]:
    """The column as text, nulls (or the whole column, when absent) as `default`."""
    if not has(table, name):
        return [default] * table.num_rows
    return [default if value is None else str(value) for value in table.column(name).to_pylist()]


def flat(table: pa.Table, name: str) -> tuple[IntArray, IntArray]:
    """A list column flattened, and the row index of each value; both empty when the column is absent."""
    import pyarrow.compute as pc

    if not has(table, name) or table.num_rows == 0:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty
    column = table.column(name)
    values = pc.list_flatten(column).to_numpy(zero_copy_only=False)
    parents = pc.list_parent_indices(column).to_numpy(zero_copy_only=False)
    return np.asarray(values, dtype=np.int64), np.asarray(parents, dtype=np.int64)


def flat_lists(column: pa.ChunkedArray) -> tuple[IntArray, IntArray]:
    """A list column's values, flat, and the offsets of each row's list into them (a null list is empty)."""
    import pyarrow.compute as pc

    lengths = np.asarray(pc.fill_null(pc.list_value_length(column), 0).to_numpy(), dtype=np.int64)
    values = np.asarray(pc.list_flatten(column).to_numpy(), dtype=np.int64)
    offsets = np.zeros(lengths.size + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return values, offsets
