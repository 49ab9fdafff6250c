"""Weka trace JSON for the differential suite: small synthetic traces built in code (one per edge case),
the real sample folder, and agentx's sample corpus converted to Weka.

A synthetic trace is a list of turns per agent: each turn's prompt keeps every block of the agent's
previous turn and adds a few of its own (so the hash-id chain detection sees one chain per agent), agents
draw their ids from disjoint ranges, and a subagent's entry `t` is its first inner request's `t`.
`t_star` is the reference's formula (aiperf.timing.trajectory_source), for choosing seeds.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import numpy as np

BLOCK: Final = 64
MODEL: Final = "claude-sonnet-4-5-20250929"
REAL_TRACES: Final = Path(__file__).resolve().parents[2] / "shared" / "data" / "weka-sample"
"""`../shared/data/weka-sample` next to the repository (real public traces, never copied into it)."""
SAMPLE_CORPUS: Final = Path(__file__).resolve().parent.parent / "traces" / "sample.arrow"

Json = dict[str, Any]


@dataclass
class Turn:
    t: float
    new_blocks: int = 4
    out: int = 64
    api_time: float = 0.5


@dataclass
class Sub:
    """A subagent entry placed after parent turn `after` (its anchor)."""

    agent_id: str
    after: int
    turns: list[Turn]
    duration_ms: int | None = None
    """None: the end of its last inner request."""
    subagents: list[Sub] = field(default_factory=list)
    """Nested subagents (the reference's loader rejects them)."""


class _Ids:
    def __init__(self) -> None:
        self.next = 1

    def take(self, n: int) -> list[int]:
        ids = list(range(self.next, self.next + n))
        self.next += n
        return ids


def _requests(turns: Sequence[Turn], ids: _Ids, first_blocks: int = 8) -> list[Json]:
    held: list[int] = []
    out: list[Json] = []
    for k, turn in enumerate(turns):
        held = held + ids.take(first_blocks if k == 0 else turn.new_blocks)
        out.append(
            {
                "t": turn.t,
                "type": "s",
                "model": MODEL,
                "in": len(held) * BLOCK,
                "out": turn.out,
                "hash_ids": list(held),
                "api_time": turn.api_time,
                "ttft": min(0.2, turn.api_time),
            }
        )
    return out


def _entries(requests: list[Json], subagents: Sequence[Sub], ids: _Ids) -> list[Json]:
    """`requests` with each subagent entry right after its anchor request."""
    entries: list[Json] = []
    for k, request in enumerate(requests):
        entries.append(request)
        entries.extend(_subagent(sub, ids) for sub in subagents if sub.after == k)
    return entries


def _subagent(sub: Sub, ids: _Ids) -> Json:
    entries = _entries(_requests(sub.turns, ids), sub.subagents, ids)
    end = max(t.t + t.api_time for t in sub.turns)
    duration_ms = sub.duration_ms if sub.duration_ms is not None else round((end - sub.turns[0].t) * 1000)
    return {
        "t": sub.turns[0].t,
        "type": "subagent",
        "agent_id": sub.agent_id,
        "subagent_type": "Explore",
        "status": "completed",
        "duration_ms": duration_ms,
        "models": [MODEL],
        "requests": entries,
    }


def trace(trace_id: str, turns: Sequence[Turn], subagents: Sequence[Sub] = ()) -> Json:
    """A Weka trace: the root's `turns`, each subagent entry right after its anchor turn."""
    ids = _Ids()
    entries = _entries(_requests(turns, ids), subagents, ids)
    return {
        "id": trace_id,
        "models": [MODEL],
        "block_size": BLOCK,
        "hash_id_scope": "local",
        "tool_tokens": 0,
        "system_tokens": 0,
        "requests": entries,
    }


def even_turns(start: float, count: int, every: float, **kwargs: Any) -> list[Turn]:
    return [Turn(t=round(start + i * every, 3), **kwargs) for i in range(count)]


def write_dir(directory: Path, traces: Iterable[Json]) -> Path:
    """One `<id>.json` per trace (the reference reads a folder of them, sorted by name; so does agentx)."""
    directory.mkdir(parents=True, exist_ok=True)
    for item in traces:
        (directory / f"{item['id']}.json").write_text(json.dumps(item))
    return directory


def copy_real(directory: Path, names: Iterable[str] | None = None) -> Path:
    """The real sample traces (all, or those named) into `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    for path in sorted(REAL_TRACES.glob("*.json")):
        if names is None or path.stem in names:
            (directory / path.name).write_bytes(path.read_bytes())
    return directory


def has_nested_subagents(item: Json) -> bool:
    return any(
        inner.get("type") == "subagent"
        for entry in item.get("requests", [])
        if entry.get("type") == "subagent"
        for inner in entry.get("requests", [])
    )


def convert_sample(agentx: Path, directory: Path) -> tuple[Path, list[str]]:
    """agentx's sample corpus as a folder of Weka JSON, without the sessions the reference cannot load
    (nested subagents); returns the folder and the ids left out."""
    return _weka_folder(agentx, SAMPLE_CORPUS, directory)


def synthesize(agentx: Path, directory: Path, sessions: int, seed: int) -> tuple[Path, list[str]]:
    """Fresh sessions of agentx's `agentic-coding` model (`agentx synth generate`) as a folder of Weka JSON, without
    nested subagents; returns the folder and the ids left out."""
    arrow = directory.with_suffix(".arrow")
    arrow.parent.mkdir(parents=True, exist_ok=True)
    generate = ["synth", "generate", "--preset", "agentic-coding", "--sessions", str(sessions), "--seed", str(seed)]
    _agentx(agentx, *generate, "--out", str(arrow), "--overwrite")  # a rerun's folder holds it
    return _weka_folder(agentx, arrow, directory)


def _agentx(agentx: Path, *args: str) -> None:
    subprocess.run([str(agentx), *args], check=True, capture_output=True, text=True)


def _weka_folder(agentx: Path, source: Path, directory: Path) -> tuple[Path, list[str]]:
    jsonl = directory.with_suffix(".jsonl")
    jsonl.parent.mkdir(parents=True, exist_ok=True)  # the first case of a fresh run may be this one
    _agentx(agentx, "convert", str(source), str(jsonl), "--to", "weka", "--overwrite")  # a rerun's folder holds it
    kept: list[Json] = []
    dropped: list[Json] = []
    for line in jsonl.read_text().splitlines():
        item = json.loads(line)
        (dropped if has_nested_subagents(item) else kept).append(item)
    return write_dir(directory, kept), [item["id"] for item in dropped]


def request_starts(item: Json) -> list[float]:
    """Every request start of the trace (root and subagent inner requests): the span t* is drawn in."""
    starts: list[float] = []

    def walk(entries: Iterable[Json]) -> None:
        for entry in entries:
            if entry.get("type") == "subagent":
                walk(entry.get("requests", []))
            else:
                starts.append(float(entry["t"]))

    walk(item.get("requests", []))
    return starts


def t_star(
    seed: int, trace_id: str, lane: int, starts: Sequence[float], window: tuple[float, float] = (0.25, 0.75)
) -> float:
    """The reference's t* of `lane` for this trace (seconds on the trace clock)."""
    first, span = min(starts), max(starts) - min(starts)
    digest = hashlib.sha256(f"{seed}:{trace_id}:{lane}".encode()).digest()
    rng = np.random.default_rng(int.from_bytes(digest[:8], "big"))
    low, high = first + window[0] * span, first + window[1] * span
    return float(low if high <= low else rng.uniform(low, high))


def seed_with_t_star_in(item: Json, lane: int, low: float, high: float, seeds: Iterable[int] = range(10_000)) -> int:
    """The first seed whose t* for `lane` falls in [low, high)."""
    starts = request_starts(item)
    for seed in seeds:
        if low <= t_star(seed, item["id"], lane, starts) < high:
            return seed
    raise ValueError(f"no seed puts {item['id']}'s t* in [{low}, {high})")


_VALIDATE_SCRIPT: Final = """
import json, sys
from pydantic import ValidationError
from aiperf.dataset.loader.weka_trace_models import WekaTrace
try:
    WekaTrace.model_validate(json.load(open(sys.argv[1])))
except ValidationError as exc:
    print(str(exc).splitlines()[0] + " | " + " ".join(str(exc).split())[:600])
"""


def reference_rejects(python: Path, path: Path) -> str | None:
    """Why the reference's Weka schema rejects the trace file at `path` (None: it accepts it)."""
    result = subprocess.run(
        [str(python), "-c", _VALIDATE_SCRIPT, str(path)], capture_output=True, text=True, check=False, timeout=120
    )
    if result.returncode != 0:
        return f"validator failed: {result.stderr[-500:]}"
    return result.stdout.strip() or None
