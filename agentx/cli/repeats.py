"""The command line's side of `--repeat` (agentx.run.repeats), shared by `replay` and `sweep`: a used folder refused,
each repeat's header line, the set's closing line."""

from __future__ import annotations

from pathlib import Path

from agentx.cli.common import fail


def refuse_existing_repeats(out_dir: Path, *, flags: str = "--overwrite") -> None:
    """Fail (exit 2) when `out_dir` already holds what a set of repeats would mix with (an index, a run or a sweep,
    in it or in a repeat folder); `flags` are what would let the command go on."""
    from agentx.results.folders.repeat_index import existing_repeats

    held = existing_repeats(out_dir)
    if held is not None:
        fail(f"{out_dir} already holds results ({held}); choose another --out, or pass {flags}")


def repeat_header(number: int, count: int, seed: int) -> str:
    """The line a repeat starts under: `repeat 2/3 (seed 123)`."""
    return f"repeat {number}/{count} (seed {seed})"


def repeats_footer(out_dir: Path, indexed: int) -> str:
    """Where the set is, and how to compare it."""
    from agentx.records.run_folder import REPEATS_FILE

    return (
        f"repeats: {indexed} indexed in {out_dir / REPEATS_FILE}; `agentx compare {out_dir} OTHER` compares them "
        "with another configuration"
    )
