"""Regenerate schemas/ from the code (CI checks they match: tests/project/test_schemas.py)."""

from __future__ import annotations

from pathlib import Path

import msgspec

from agentx.records import record
from agentx.replayer.telemetry import arrow_file
from agentx.trace.formats import arrow, weka

SCHEMAS = Path(__file__).resolve().parents[1] / "schemas"


def generated() -> dict[str, str]:
    """File name → content of every generated schema file."""
    return {
        "weka-trace.schema.json": msgspec.json.format(msgspec.json.encode(weka.json_schema()), indent=2).decode()
        + "\n",
        "trace.arrow.md": arrow.describe_layout(),
        "records.arrow.md": record.describe_layout(),
        "server_metrics.arrow.md": arrow_file.describe_layout(),
    }


def main() -> None:
    SCHEMAS.mkdir(exist_ok=True)
    for name, content in generated().items():
        (SCHEMAS / name).write_text(content, encoding="utf-8")
        print(f"wrote {SCHEMAS / name}")


if __name__ == "__main__":
    main()
