"""Reader fuzzing: whatever the bytes, `load_trace` either raises TraceError or returns a trace that
validates without errors. Any other exception (or a crash of the interpreter) is a bug."""

from __future__ import annotations

import copy
import gzip
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, currently_in_test_context, event, given, settings
from hypothesis import strategies as st
from strategies import WEKA_SUBAGENT, WEKA_TRACE, examples, traces

from agentx.errors import TraceError
from agentx.trace.formats import arrow, weka_reader, weka_writer
from agentx.trace.io import Format, load_trace
from agentx.trace.model import Trace
from agentx.trace.validation import validate


def fuzz(count: int) -> settings:
    """Settings for a fuzz test: `count` cases (scaled by the profile), no per-case deadline (first reads import
    pyarrow parts)."""
    return settings(
        max_examples=examples(count),
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


@pytest.fixture(scope="module")
def fuzz_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One directory per module: every example overwrites the same file (no per-example fixture)."""
    return tmp_path_factory.mktemp("fuzz")


def _event(outcome: str) -> None:
    """Count outcomes in hypothesis statistics (`--hypothesis-show-statistics`) when inside a test."""
    if currently_in_test_context():
        event(outcome)


def _load_or_refuse(path: Path, fmt: Format) -> Trace | None:
    """The read trace, checked to validate cleanly, or None when the reader refused it properly."""
    try:
        trace = load_trace(path, format=fmt)
    except TraceError as exc:
        message = str(exc)
        assert message and "\n" not in message
        _event("refused")
        return None
    _event("loaded")
    errors = [str(f) for f in validate(trace) if f.severity == "error"]
    assert errors == [], f"the {fmt} reader accepted a trace that does not validate"
    return trace


# ---------------------------------------------------------------------------------------------
# Weka: raw bytes


@fuzz(750)
@given(st.binary(max_size=600))
def test_weka_reader_on_arbitrary_bytes(fuzz_dir: Path, data: bytes) -> None:
    path = fuzz_dir / "bytes.json"
    path.write_bytes(data)
    _load_or_refuse(path, "weka")


JSONISH = st.text(alphabet='{}[]":,0123456789.-+eE \n\tnulltruefalse"idtypesubagentrequests', max_size=300)


@fuzz(500)
@given(JSONISH | JSONISH.map(lambda text: '{"id":"x","models":[],"block_size":64,"hash_id_scope":"local",' + text))
def test_weka_reader_on_json_like_text(fuzz_dir: Path, text: str) -> None:
    path = fuzz_dir / "text.jsonl"
    path.write_text(text, encoding="utf-8")
    _load_or_refuse(path, "weka")


# ---------------------------------------------------------------------------------------------
# Weka: valid documents, mutated


WEIRD_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(max_value=-1),
    st.integers(min_value=-(1 << 70), max_value=1 << 70),
    st.sampled_from([0, 10**9, 10**30, 1 << 63, 1 << 64, -(1 << 63) - 1]),
    st.floats(),  # NaN and infinities included: json.dumps writes NaN / Infinity, which JSON lacks
    st.sampled_from([1e300, -1e300, 5e-324, -0.0]),
    st.text(max_size=4),
    st.sampled_from(["n", "s", "subagent", "local", "global", "session", "12", "-1"]),
    st.lists(st.integers(-3, 3) | st.text(max_size=2), max_size=3),
    st.builds(dict),
    st.builds(copy.deepcopy, st.just(WEKA_SUBAGENT)),  # a fresh copy each time: documents get mutated
)
KEYS = st.sampled_from(
    sorted(
        set(WEKA_TRACE)
        | set(WEKA_TRACE["requests"][1])
        | set(WEKA_SUBAGENT)
        | {"input_length", "output_length", "totals", "tool_tokens", "stop", "unknown_key"}
    )
)


def _containers(obj: Any) -> Iterator[dict[str, Any] | list[Any]]:
    if isinstance(obj, dict):
        yield obj
        for value in obj.values():
            yield from _containers(value)
    elif isinstance(obj, list):
        yield obj
        for value in obj:
            yield from _containers(value)


def _base_documents() -> list[list[dict[str, Any]]]:
    """Hand-made valid starting points covering each Weka feature (cheap to draw, unlike `traces()`)."""
    plain = copy.deepcopy(WEKA_TRACE)
    with_subagent = copy.deepcopy(WEKA_TRACE)
    with_subagent["requests"].insert(1, copy.deepcopy(WEKA_SUBAGENT))
    nested = copy.deepcopy(with_subagent)
    inner = copy.deepcopy(WEKA_SUBAGENT)
    inner.update(agent_id="a2", t=2.5)
    nested["requests"][1]["requests"].append(inner)
    legacy = copy.deepcopy(with_subagent)  # inner times relative to the spawn
    legacy["requests"][1]["requests"][0]["t"] = 0.0
    aliased = copy.deepcopy(plain)
    for call in aliased["requests"]:
        call["input_length"], call["output_length"] = call.pop("in"), call.pop("out")
    extras = dict(
        copy.deepcopy(with_subagent), tool_tokens=64, system_tokens=64, totals={"n": 1}, hash_id_scope="global"
    )
    return [[plain], [with_subagent], [nested], [legacy], [aliased], [extras], [plain, dict(nested, id="s2")]]


def _generated_documents(trace: Trace) -> list[dict[str, Any]]:
    return [
        msgspec.json.decode(msgspec.json.encode(weka_writer.weka_object(session, trace))) for session in trace.sessions
    ]


@st.composite
def mutated_documents(draw: st.DrawFn, bases: st.SearchStrategy[list[dict[str, Any]]]) -> bytes:
    """Weka JSON or JSONL of `bases`, with keys deleted, replaced or added, list items dropped,
    replaced or duplicated, then possibly truncated, salted with garbage or gzipped."""
    documents: list[Any] = copy.deepcopy(draw(bases))
    for _ in range(draw(st.integers(0, 4))):
        node = draw(st.sampled_from(list(_containers(documents))))
        action = draw(st.sampled_from(["delete", "replace", "add"]))
        if isinstance(node, dict):
            if node and action != "add":
                key = draw(st.sampled_from(sorted(node)))
                if action == "delete":
                    del node[key]
                else:
                    node[key] = draw(WEIRD_VALUES)
            else:
                node[draw(KEYS)] = draw(WEIRD_VALUES)
        elif node:
            index = draw(st.integers(0, len(node) - 1))
            if action == "delete":
                del node[index]
            elif action == "replace":
                node[index] = draw(WEIRD_VALUES)
            else:
                node.insert(index, copy.deepcopy(node[index]))  # duplicates: same session/subagent ids
    if len(documents) == 1 and draw(st.booleans()):
        data = json.dumps(documents[0], indent=draw(st.sampled_from([None, 1]))).encode()
    else:
        data = b"".join(json.dumps(document).encode() + b"\n" for document in documents)
    damage = draw(st.sampled_from(["none", "none", "truncate", "garbage"]))
    if damage == "truncate" and data:
        data = data[: draw(st.integers(0, len(data) - 1))]
    elif damage == "garbage":
        at = draw(st.integers(0, len(data)))
        data = data[:at] + draw(st.binary(min_size=1, max_size=8)) + data[at:]
    if draw(st.integers(0, 9)) == 0:
        data = gzip.compress(data)
        if draw(st.booleans()):
            data = data[: draw(st.integers(0, len(data)))]
    return data


@fuzz(1000)
@given(mutated_documents(st.sampled_from(_base_documents())))
def test_weka_reader_on_mutated_documents(fuzz_dir: Path, data: bytes) -> None:
    path = fuzz_dir / "mutated.jsonl"
    path.write_bytes(data)
    _load_or_refuse(path, "weka")


@fuzz(125)  # each example generates a trace first: ~80 ms; `--hypothesis-profile=thorough` runs 2,500
@given(mutated_documents(traces(max_sessions=2).map(_generated_documents)))
def test_weka_reader_on_mutated_generated_traces(fuzz_dir: Path, data: bytes) -> None:
    path = fuzz_dir / "mutated-generated.jsonl"
    path.write_bytes(data)
    _load_or_refuse(path, "weka")


@pytest.mark.parametrize("documents", _base_documents())
def test_unmutated_base_documents_load(fuzz_dir: Path, documents: list[dict[str, Any]]) -> None:
    """The mutation fuzzer starts from documents the reader accepts (so its mutations are what fails)."""
    path = fuzz_dir / "clean.jsonl"
    path.write_text("".join(json.dumps(document) + "\n" for document in documents), encoding="utf-8")
    trace = _load_or_refuse(path, "weka")
    assert trace is not None and [s.session_id for s in trace.sessions] == [d["id"] for d in documents]


# ---------------------------------------------------------------------------------------------
# Arrow and Parquet: valid files, corrupted


@pytest.fixture(scope="module")
def fixed_trace(fuzz_dir: Path) -> Trace:
    """A small trace with a subagent, read from Weka JSONL (so it carries provenance too)."""
    documents = [copy.deepcopy(WEKA_TRACE), copy.deepcopy(WEKA_TRACE)]
    documents[0]["requests"].append(copy.deepcopy(WEKA_SUBAGENT))
    documents[1]["id"] = "s2"
    path = fuzz_dir / "fixed.jsonl"
    path.write_text("".join(json.dumps(document) + "\n" for document in documents), encoding="utf-8")
    return weka_reader.read_weka(path)


@pytest.fixture(scope="module")
def native_files(fuzz_dir: Path, fixed_trace: Trace) -> dict[str, bytes]:
    """The fixed trace as valid native files, to corrupt (a hypothesis draw per example would be slow)."""
    files: dict[str, bytes] = {}
    for name, write in (("arrow", arrow.write_arrow), ("parquet", arrow.write_parquet)):
        path = fuzz_dir / f"valid.{name}"
        write(fixed_trace, path)
        files[name] = path.read_bytes()
    return files


@st.composite
def corruptions(draw: st.DrawFn, size: int) -> list[tuple[str, int, bytes]]:
    """Edits to a file of `size` bytes: truncation, byte flips, zeroed runs, inserted bytes."""
    edits: list[tuple[str, int, bytes]] = []
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "flip", "flip", "truncate", "zero", "insert"]))
        at = draw(st.integers(0, size - 1))
        edits.append((kind, at, draw(st.binary(min_size=1, max_size=4))))
    return edits


def _apply(data: bytes, edits: list[tuple[str, int, bytes]]) -> bytes:
    out = bytearray(data)
    for kind, at, payload in edits:
        at = min(at, max(len(out) - 1, 0))
        if kind == "truncate":
            del out[at:]
        elif kind == "flip" and out:
            out[at] ^= payload[0] or 0xFF
        elif kind == "zero":
            out[at : at + 8 * len(payload)] = bytes(len(out[at : at + 8 * len(payload)]))
        elif kind == "insert":
            out[at:at] = payload
    return bytes(out)


@pytest.mark.parametrize(("name", "count"), [("arrow", 1000), ("parquet", 600)])
def test_native_reader_on_corrupted_files(
    fuzz_dir: Path, native_files: dict[str, bytes], name: str, count: int
) -> None:
    valid = native_files[name]

    @fuzz(count)
    @given(corruptions(len(valid)))
    def check(edits: list[tuple[str, int, bytes]]) -> None:
        path = fuzz_dir / f"corrupt.{name}"
        path.write_bytes(_apply(valid, edits))
        _load_or_refuse(path, "arrow")

    check()


def test_native_files_are_valid_before_corruption(
    fuzz_dir: Path, native_files: dict[str, bytes], fixed_trace: Trace
) -> None:
    assert fixed_trace.request_count == 2 * len(WEKA_TRACE["requests"]) + len(WEKA_SUBAGENT["requests"])
    for name, data in native_files.items():
        path = fuzz_dir / f"intact.{name}"
        path.write_bytes(data)
        assert _load_or_refuse(path, "arrow") == fixed_trace


@fuzz(500)
@given(st.binary(max_size=400), st.sampled_from([b"", b"ARROW1", b"PAR1", b"\xff\xff\xff\xff"]))
def test_native_reader_on_arbitrary_bytes(fuzz_dir: Path, data: bytes, magic: bytes) -> None:
    path = fuzz_dir / "bytes.arrow"
    path.write_bytes(magic + data)
    _load_or_refuse(path, "arrow")
