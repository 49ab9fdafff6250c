"""Key-by-key comparison of agentx's AIPerf exports with a reference's (AIPerf 0.13.0, or agentx-harness 1.0.12's
fork of it).

Two commands:

    python scripts/aiperf_export_keys.py fixture REF_DIR [REF_DIR ...] --out tests/fixtures/aiperf_export_keys.json
        --produced-by "how the reference runs were made" [--reference "agentx-harness 1.0.12"]

reads each reference artifact directory (`profile_export.jsonl`, `profile_export_aiperf.json`) and writes the
key sets it found — key names and units only, no values — as a JSON fixture (`tests/results/test_export.py` checks
agentx covers them);

    python scripts/aiperf_export_keys.py diff (--fixture FILE | --ref REF_DIR [--ref REF_DIR ...]) RUN_DIR

exports agentx run RUN_DIR to a temporary directory (`agentx export --format aiperf-jsonl|aiperf-summary`) and
prints, per part of the two files, the keys the reference writes that agentx does not, the keys only agentx
writes, and units that differ. Exit status 1 when a reference key is missing from agentx's files and is not
listed in `agentx.results.export.export_run.NOT_EXPORTED`;

    python scripts/aiperf_export_keys.py values REF_DIR

checks the definitions, not just the keys: it turns the reference's `profile_export.jsonl` back into an agentx
records table (times, chunk gaps, token counts, errors), computes agentx's `profile_export_aiperf.json` from it
over the reference's phase window, and prints, per metric the two share, the largest relative difference of
its statistics. A run with `--use-server-token-count` (InferenceX's setting) is the one to check: agentx's
ISL/OSL are the server's counts.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import msgspec

JSONL_FILE = "profile_export.jsonl"
SUMMARY_FILE = "profile_export_aiperf.json"

KeySets = dict[str, Any]


def jsonl_keys(lines: Iterable[bytes]) -> KeySets:
    """The keys of a `profile_export.jsonl`: top level, metadata, metric tags with their units, error."""
    top: set[str] = set()
    metadata: set[str] = set()
    error: set[str] = set()
    metrics: dict[str, str] = {}
    for line in lines:
        if not line.strip():
            continue
        document = msgspec.json.decode(line)
        top |= {key for key, value in document.items() if value is not None}
        metadata |= set(document.get("metadata") or {})
        error |= set(document.get("error") or {})
        for tag, metric in (document.get("metrics") or {}).items():
            metrics.setdefault(tag, str(metric.get("unit")))
    return {
        "top": sorted(top),
        "metadata": sorted(metadata),
        "metrics": dict(sorted(metrics.items())),
        "error": sorted(error),
    }


def _is_metric(value: Any) -> bool:
    return isinstance(value, Mapping) and "unit" in value


def _metric_blocks(document: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        tag: {"unit": str(block["unit"]), "stats": sorted(set(block) - {"unit"})}
        for tag, block in sorted(document.items())
        if _is_metric(block)
    }


def summary_keys(document: Mapping[str, Any]) -> KeySets:
    """The keys of a `profile_export_aiperf.json`: top level, metric blocks (unit and statistics), metadata, ..."""
    error_summary: set[str] = set()
    error_details: set[str] = set()
    for entry in document.get("error_summary") or []:
        error_summary |= set(entry)
        error_details |= set(entry.get("error_details") or {})
    return {
        "top": sorted(key for key, value in document.items() if not _is_metric(value)),
        "metrics": _metric_blocks(document),
        "metadata": sorted(document.get("metadata") or {}),
        "warmup_metrics": _metric_blocks(document.get("warmup_metrics") or {}),
        "error_summary": sorted(error_summary),
        "error_details": sorted(error_details),
        "run_info": sorted(document.get("run_info") or {}),
    }


def directory_keys(directory: Path) -> dict[str, KeySets]:
    with open(directory / JSONL_FILE, "rb") as lines:
        jsonl = jsonl_keys(lines)
    summary = summary_keys(msgspec.json.decode((directory / SUMMARY_FILE).read_bytes()))
    return {"jsonl": jsonl, "summary": summary}


def merge(runs: Iterable[Mapping[str, KeySets]]) -> dict[str, KeySets]:
    """The union of several runs' key sets (a metric's statistics: the union too)."""
    merged: dict[str, KeySets] = {}
    for run in runs:
        for file, parts in run.items():
            into = merged.setdefault(file, {})
            for part, keys in parts.items():
                if isinstance(keys, list):
                    into[part] = sorted(set(into.get(part, [])) | set(keys))
                    continue
                target: dict[str, Any] = into.setdefault(part, {})
                for tag, value in keys.items():
                    if isinstance(value, dict):
                        entry = target.setdefault(tag, {"unit": value["unit"], "stats": []})
                        entry["stats"] = sorted(set(entry["stats"]) | set(value["stats"]))
                    else:
                        target.setdefault(tag, value)
                into[part] = dict(sorted(target.items()))
    return merged


def diff(reference: Mapping[str, KeySets], ours: Mapping[str, KeySets]) -> list[tuple[str, str, str]]:
    """(where, key, what) for every key the two sides do not share and every unit or statistic that differs.

    `what` is "missing" (the reference has it, agentx not), "extra" (agentx only), "unit A != B" or
    "stats missing: ...".
    """
    rows: list[tuple[str, str, str]] = []
    for file in ("jsonl", "summary"):
        ref_parts, our_parts = reference.get(file, {}), ours.get(file, {})
        for part in sorted(set(ref_parts) | set(our_parts)):
            ref, our = ref_parts.get(part, []), our_parts.get(part, [])
            where = f"{file}.{part}"
            for key in sorted(set(ref) - set(our)):
                rows.append((where, key, "missing"))
            for key in sorted(set(our) - set(ref)):
                rows.append((where, key, "extra"))
            if isinstance(ref, dict) and isinstance(our, dict):
                for key in sorted(set(ref) & set(our)):
                    ref_unit = ref[key]["unit"] if isinstance(ref[key], dict) else ref[key]
                    our_unit = our[key]["unit"] if isinstance(our[key], dict) else our[key]
                    if ref_unit != our_unit:
                        rows.append((where, key, f"unit {our_unit} != {ref_unit}"))
                    if isinstance(ref[key], dict) and isinstance(our[key], dict):
                        lacking = sorted(set(ref[key]["stats"]) - set(our[key]["stats"]))
                        if lacking:
                            rows.append((where, key, f"stats missing: {', '.join(lacking)}"))
    return rows


def agentx_keys(run_dir: Path) -> dict[str, KeySets]:
    """Export an agentx run to a temporary directory and read its key sets."""
    from agentx.results.export.export_run import export_run

    with tempfile.TemporaryDirectory() as scratch:
        export_run(run_dir, "aiperf-jsonl", Path(scratch))
        export_run(run_dir, "aiperf-summary", Path(scratch))
        return directory_keys(Path(scratch))


def records_from_reference(directory: Path) -> tuple[Any, dict[str, Any], dict[str, tuple[float, float]]]:
    """(records table, run file, phase windows in ns after the table's epoch) rebuilt from a reference run."""
    import datetime

    import pyarrow as pa

    from agentx.records.record import (
        FORMAT_NAME,
        FORMAT_VERSION,
        META_EPOCH,
        META_FORMAT,
        META_RUN,
        META_RUN_ID,
        META_VERSION,
        SCHEMA,
        RequestRecord,
    )

    with open(directory / JSONL_FILE, "rb") as lines:
        documents = [msgspec.json.decode(line) for line in lines if line.strip()]
    summary = msgspec.json.decode((directory / SUMMARY_FILE).read_bytes())
    epoch: int = min(d["metadata"]["credit_issued_ns"] for d in documents) - 1_000_000_000
    records = []
    for row, document in enumerate(documents):
        meta, metrics = document["metadata"], document["metrics"]

        def value(tag: str, metrics: dict[str, Any] = metrics) -> Any:
            return metrics[tag]["value"] if tag in metrics else None

        def ms(tag: str) -> int | None:
            found = value(tag)
            return None if found is None else round(found * 1e6)

        sent = meta["request_start_ns"] - epoch
        ttft, latency = ms("time_to_first_token"), ms("request_latency")
        first = None if ttft is None else sent + ttft
        chunks: list[int] = []
        if first is not None:
            chunks = [first]
            for gap in value("inter_chunk_latency") or []:
                chunks.append(chunks[-1] + round(gap * 1e6))
        osl = value("output_sequence_length")
        requested = None
        if value("osl_mismatch_diff_pct") is not None and osl is not None:
            requested = round(osl / (1 + value("osl_mismatch_diff_pct") / 100))
        overhead = ms("http_req_connection_overhead")
        error = document.get("error")
        conversation = meta["conversation_id"]
        agent = conversation.split("::sa:", 1)[1] if "::sa:" in conversation else ""
        ack = meta.get("request_ack_ns")
        records.append(
            RequestRecord(
                run_id="reference",
                phase=meta["benchmark_phase"],
                lane=0,
                play=row,
                session_id=meta.get("source_trace_id") or conversation,
                agent_id=agent,
                depth=meta.get("agent_depth", 0),
                turn=meta.get("turn_index") or 0,
                model="m",
                scheduled_ns=meta["credit_issued_ns"] - epoch,
                queued_ns=None if overhead is None else sent - overhead,
                sent_ns=sent,
                response_ns=None if ack is None else ack - epoch,
                first_token_ns=first,
                last_token_ns=None if latency is None else sent + latency,
                end_ns=meta["request_end_ns"] - epoch,
                chunk_times_ns=chunks,
                chunk_tokens=[1] * len(chunks),
                isl_recorded_tokens=0,
                isl_sent_tokens=value("input_sequence_length") or value("error_isl") or 0,
                isl_server_tokens=value("usage_prompt_tokens"),
                osl_recorded_tokens=requested if requested is not None else (osl or 0),
                osl_server_tokens=value("usage_completion_tokens"),
                osl_streamed_tokens=osl or 0,
                cached_tokens=value("usage_prompt_cache_read_tokens"),
                status="error" if error else "ok",
                error_kind=("cancelled" if meta.get("was_cancelled") else "http") if error else None,
                error_message=(error or {}).get("message"),
                http_status=(error or {}).get("code"),
            )
        )
    metadata = {
        META_FORMAT: FORMAT_NAME.encode(),
        META_VERSION: FORMAT_VERSION.encode(),
        META_RUN_ID: b"reference",
        META_EPOCH: str(epoch).encode(),
        META_RUN: b"{}",
    }
    table = pa.Table.from_pylist([msgspec.structs.asdict(r) for r in records], schema=SCHEMA.with_metadata(metadata))
    run_file = {"options": {"mode": "agentx", "warmup_max_tokens": None}, "run": {"interrupted": False}}

    def offset(text: str) -> float:
        return float(datetime.datetime.fromisoformat(text).timestamp() * 1e9 - epoch)

    windows = {"profiling": (offset(summary["start_time"]), offset(summary["end_time"]))}
    return table, run_file, windows


def _values(args: argparse.Namespace) -> int:
    import numpy as np

    from agentx.results.export.aiperf_metrics import record_metrics, run_context
    from agentx.results.export.aiperf_summary import phase_metrics
    from agentx.results.summary.columns import equals

    directory = Path(args.ref_dir)
    reference = msgspec.json.decode((directory / SUMMARY_FILE).read_bytes())
    table, run_file, windows = records_from_reference(directory)
    ctx = run_context(table, run_file)
    profiling = ~equals(table, "phase", "warmup")
    ours = phase_metrics(table, record_metrics(table, ctx), profiling, windows["profiling"], 0)
    worst = 0.0
    for tag, block in reference.items():
        if not _is_metric(block) or tag not in ours:
            continue
        diffs = []
        for stat, expected in block.items():
            got = ours[tag].get(stat)
            if stat == "unit" or not isinstance(expected, int | float) or not isinstance(got, int | float):
                continue
            diffs.append(abs(got - expected) / max(abs(expected), abs(got), 1e-9))  # at most 1
        largest = max(diffs, default=0.0)
        worst = max(worst, largest)
        print(f"{tag:<40} {len(diffs):>2} stats  max rel. diff {largest:.2e}")
    shared = sum(1 for tag, block in reference.items() if _is_metric(block) and tag in ours)
    print(f"\n{shared} metrics compared, worst relative difference {worst:.2e}")
    print("not computed here:", ", ".join(sorted(t for t, b in reference.items() if _is_metric(b) and t not in ours)))
    return 0 if bool(np.isfinite(worst)) else 1


def _compact(keys: Mapping[str, KeySets]) -> dict[str, Any]:
    """Key sets with each metric's statistics as one space-separated string (a smaller fixture)."""
    result: dict[str, Any] = {}
    for file, parts in keys.items():
        result[file] = {
            part: {
                tag: {"unit": value["unit"], "stats": " ".join(value["stats"])} if isinstance(value, dict) else value
                for tag, value in entries.items()
            }
            if isinstance(entries, dict)
            else entries
            for part, entries in parts.items()
        }
    return result


def load_fixture(path: Path) -> dict[str, KeySets]:
    """The merged key sets of a fixture, statistics as lists again."""
    keys: dict[str, KeySets] = msgspec.json.decode(path.read_bytes())["keys"]
    for parts in keys.values():
        for entries in parts.values():
            if isinstance(entries, dict):
                for value in entries.values():
                    if isinstance(value, dict):
                        value["stats"] = value["stats"].split()
    return keys


def _fixture(args: argparse.Namespace) -> int:
    directories = [Path(directory) for directory in args.ref]
    document = {
        "produced_by": args.produced_by,
        "reference": args.reference,
        "runs": [directory.name for directory in directories],
        "note": "key names and units only, no values: the union over the runs (a metric's statistics too); "
        "regenerate with scripts/aiperf_export_keys.py fixture",
        "keys": _compact(merge(directory_keys(directory) for directory in directories)),
    }
    Path(args.out).write_bytes(msgspec.json.format(msgspec.json.encode(document), indent=1) + b"\n")
    print(f"wrote {args.out}")
    return 0


def _diff(args: argparse.Namespace) -> int:
    if args.fixture:
        reference = load_fixture(Path(args.fixture))
    else:
        reference = merge(directory_keys(Path(directory)) for directory in args.ref)
    rows = diff(reference, agentx_keys(Path(args.run_dir)))
    from agentx.results.export import export_run as export

    not_exported: dict[str, str] = getattr(export, "NOT_EXPORTED", {})
    width = max((len(where) for where, _, _ in rows), default=0)
    failed = False
    for where, key, what in rows:
        reason = not_exported.get(f"{where}.{key}") if what == "missing" else None
        failed = failed or (what == "missing" and reason is None)
        suffix = f"  (not exported: {reason})" if reason else ""
        print(f"{where:<{width}}  {key:<40} {what}{suffix}")
    missing = sum(1 for _, _, what in rows if what == "missing")
    print(f"\n{missing} reference keys missing from agentx, {sum(1 for r in rows if r[2] == 'extra')} agentx-only")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    commands = parser.add_subparsers(dest="command", required=True)
    fixture = commands.add_parser("fixture", help="write the reference's key sets as a JSON fixture")
    fixture.add_argument("ref", nargs="+", help="reference artifact directories")
    fixture.add_argument("--out", required=True)
    fixture.add_argument("--produced-by", required=True, help="how the reference runs were made")
    fixture.add_argument(
        "--reference", default="AIPerf 0.13.0", help="which reference wrote them (e.g. agentx-harness 1.0.12)"
    )
    compare = commands.add_parser("diff", help="diff an agentx run's exports against the reference's keys")
    source = compare.add_mutually_exclusive_group(required=True)
    source.add_argument("--fixture", help="a fixture written by the fixture command")
    source.add_argument("--ref", action="append", help="a reference artifact directory (repeatable)")
    compare.add_argument("run_dir", help="an agentx run directory (records.arrow, run.json)")
    values = commands.add_parser("values", help="recompute a reference run's summary with agentx's definitions")
    values.add_argument("ref_dir", help="a reference artifact directory")
    args = parser.parse_args(argv)
    commands_by_name = {"fixture": _fixture, "diff": _diff, "values": _values}
    return commands_by_name[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
