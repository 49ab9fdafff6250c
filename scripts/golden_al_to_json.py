"""Regenerate agentx/spec/golden_al.json from the published golden AL YAML files (tests/spec/test_spec_golden.py
checks it).

Each YAML file holds one model's golden acceptance lengths per thinking mode and K, with its provenance in
the header comments. The package reads only the JSON, so it needs no YAML dependency; this script parses
the files' one fixed shape itself, so it needs none either:

    # Source GitHub Actions run: <url>
    # ...
    <model>:
      thinking_on:
        1: 1.84

A model published by several files (a plain recipe and qualified ones such as `_gqa` or
`_probabilistic_..._block_...`) keeps one entry per file, told apart by `variant` (the file's stem).
The default variant is the plain recipe: the shortest stem of that model, since the others only append a
qualifier to it.

Usage: python -m scripts.golden_al_to_json [SOURCE_DIR] [OUT_FILE]
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import msgspec

ROOT = Path(__file__).resolve().parents[1]
SOURCE_DIR = ROOT.parent / "shared" / "data" / "golden_al"
"""`../shared/data/golden_al` next to the repository: the published YAML files, not part of it."""
OUT_FILE = ROOT / "agentx" / "spec" / "golden_al.json"
THINKING_MODES = ("thinking_on", "thinking_off")

_SOURCE_URL = re.compile(r"^Source .*?:\s*(https?://\S+)")
_MEASURED = re.compile(r"^Measured on .*?\((?P<inside>[^)]*)\)")
_LEVEL = re.compile(r"^key = num_speculative_tokens \((?P<method>.+?) level\)")


class SourceCurves(msgspec.Struct, kw_only=True):
    """What one YAML file says: header comment lines, the model key and its curves (mode → K → AL)."""

    comments: list[str]
    model: str
    curves: dict[str, dict[int, float]]


def parse_golden_yaml(text: str, name: str = "<yaml>") -> SourceCurves:
    """The golden AL file `text` (the shape in the module docstring), or ValueError naming `name` and the line."""
    comments: list[str] = []
    model: str | None = None
    curves: dict[str, dict[int, float]] = {}
    mode: str | None = None
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.rstrip()
        stripped = line.strip()
        if not stripped:
            continue
        if stripped.startswith("#"):
            if model is None:
                comments.append(stripped[1:].strip())
            continue
        indent = len(line) - len(line.lstrip(" "))
        key, colon, value = stripped.partition(":")
        if not colon:
            raise ValueError(f"{name}:{number}: expected 'key: value', got {stripped!r}")
        value = value.strip()
        if indent == 0 and not value:
            if model is not None:
                raise ValueError(f"{name}:{number}: a second model {key!r}; one file holds one model")
            model = key.strip()
        elif indent > 0 and not value and model is not None:
            mode = key.strip()
            if mode not in THINKING_MODES:
                raise ValueError(f"{name}:{number}: unknown mode {mode!r}, expected one of {', '.join(THINKING_MODES)}")
            curves[mode] = {}
        elif mode is not None and value:
            try:
                curves[mode][int(key)] = float(value)
            except ValueError:
                raise ValueError(f"{name}:{number}: expected 'K: AL' numbers, got {stripped!r}") from None
        else:
            raise ValueError(f"{name}:{number}: unexpected line {stripped!r}")
    if model is None or not any(curves.values()):
        raise ValueError(f"{name}: no '<model>: thinking_on/thinking_off: K: AL' block found")
    return SourceCurves(comments=comments, model=model, curves=curves)


def _provenance(comments: list[str]) -> dict[str, str]:
    """Source URL, hardware, method, dataset, measured-on and speculative-config lines from the header."""
    found = {"source_url": "", "hardware": "", "method": "", "dataset": "", "measured": "", "speculative_config": ""}
    for comment in comments:
        if match := _SOURCE_URL.match(comment):
            found["source_url"] = match.group(1)
        elif match := _MEASURED.match(comment):
            found["measured"] = comment
            found["hardware"] = match.group("inside").split(",")[0].strip()
        elif match := _LEVEL.match(comment):
            found["method"] = match.group("method")
        elif comment.startswith("dataset:"):
            found["dataset"] = comment
        elif comment.startswith("speculative-config:"):
            found["speculative_config"] = comment.partition(":")[2].strip()
    return found


def convert(source_dir: Path) -> str:
    """The golden_al.json text for every *.yaml file in `source_dir` (sorted, so the output is reproducible)."""
    files = sorted(source_dir.glob("*.yaml"))
    if not files:
        raise ValueError(f"{source_dir}: no *.yaml golden AL files")
    parsed = {path.stem: parse_golden_yaml(path.read_text(encoding="utf-8"), path.name) for path in files}
    defaults: dict[str, str] = {}
    for stem, source in parsed.items():
        current = defaults.get(source.model)
        if current is None or (len(stem), stem) < (len(current), current):
            defaults[source.model] = stem
    curves = []
    for stem, source in parsed.items():
        curves.append(
            {
                "model": source.model,
                "variant": stem,
                "default": defaults[source.model] == stem,
                "source_file": f"{stem}.yaml",
                **_provenance(source.comments),
                "header": source.comments,
                **{mode: dict(sorted(source.curves.get(mode, {}).items())) for mode in THINKING_MODES},
            }
        )
    document = {
        "generated_by": "scripts/golden_al_to_json.py from the golden_al/*.yaml files; do not edit by hand",
        "curves": curves,
    }
    return msgspec.json.format(msgspec.json.encode(document), indent=2).decode() + "\n"


def main(argv: list[str]) -> None:
    source_dir = Path(argv[0]) if argv else SOURCE_DIR
    out_file = Path(argv[1]) if len(argv) > 1 else OUT_FILE
    out_file.write_text(convert(source_dir), encoding="utf-8")
    print(f"wrote {out_file}")


if __name__ == "__main__":
    main(sys.argv[1:])
