"""How many requests the server got wrong, by kind: the records' `server_notices` (agentx.replayer.schedule.sanity)
counted."""

from __future__ import annotations

import numpy as np
import pyarrow as pa


def server_notice_counts(records: pa.Table, rows: np.ndarray) -> dict[str, int]:
    """Per kind, how many of the `rows` (a boolean mask over `records`) carry it, kinds in name order; {} for records
    written before the column existed (format 1.13)."""
    import pyarrow.compute as pc  # not on a replay's path to its first request (bench/startup.py)

    if "server_notices" not in records.column_names or not records.num_rows:
        return {}
    kinds = pc.list_flatten(records.column("server_notices").filter(pa.array(rows)))
    if len(kinds) == 0:
        return {}
    counted = pc.value_counts(kinds)
    names, counts = counted.field("values").to_pylist(), counted.field("counts").to_pylist()
    return dict(sorted(zip(names, counts, strict=True)))
