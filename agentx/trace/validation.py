"""Structural checks of a trace, run by every reader and by `agentx validate`. What only a file states (Bailian's
parent links, the Arrow rows' identity columns) its reader checks first, over `agentx.trace.links`.

Errors make a trace unusable (negative times, duplicate ids, absurd sizes); warnings are
tolerated at replay the way the reference tolerates them (e.g. fewer hash ids than `in` needs:
the missing blocks become filler, docs/agentx.md §1d).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from agentx.errors import Finding
from agentx.trace.findings import Findings
from agentx.trace.model import Agent, Request, Session, Trace

MAX_TOKENS_PER_REQUEST = 100_000_000
"""Larger `in`/`out` values are taken as corrupt data, not as a real request."""
MAX_BLOCK_SIZE = 1 << 20
MAX_AGENT_DEPTH = 100
"""Deeper subagent nesting is taken as corrupt data (the tree code recurses once per level)."""
HASH_ID_MIN, HASH_ID_MAX = -(1 << 63), (1 << 63) - 1

ReportFinding = Callable[[str, str], None]
"""Receives (severity, message) for one problem."""
LineOf = Callable[[Agent, int], int | None]
"""Maps (agent, request index) to the 1-based line or row a request came from, if known."""


def _bad_time(value: float | None, *, optional: bool) -> str | None:
    if value is None:
        return None if optional else "is missing"
    if not math.isfinite(value):
        return f"is {value}"
    if value < 0:
        return f"is negative ({value})"
    return None


def check_request(request: Request, previous_len: int, block_size: int, report: ReportFinding) -> None:
    """Check one request; `report(severity, message)` receives each problem."""
    for name, value, optional in (
        ("t", request.t, False),
        ("think_time", request.think_time, True),
        ("api_time", request.api_time, True),
        ("ttft", request.ttft, True),
    ):
        problem = _bad_time(value, optional=optional)
        if problem:
            report("error", f"{name} {problem}")
    for name, count in (("in", request.in_tokens), ("out", request.out_tokens)):
        if count < 0:
            report("error", f"{name}={count} is negative")
        elif count > MAX_TOKENS_PER_REQUEST:
            report("error", f"{name}={count} is absurdly large (limit {MAX_TOKENS_PER_REQUEST:,})")
    if request.acceptance_length is not None and not (
        math.isfinite(request.acceptance_length) and request.acceptance_length >= 1
    ):
        report("error", f"acceptance_length={request.acceptance_length} must be a number >= 1")
    if not 0 <= request.hash_ids_kept <= previous_len:
        report("error", f"hash_ids_kept={request.hash_ids_kept} outside [0, {previous_len}]")
    for hash_id in request.hash_ids_added:
        if not HASH_ID_MIN <= hash_id <= HASH_ID_MAX:
            report("error", f"hash id {hash_id} does not fit in 64 bits")
            break
    if request.in_tokens < 0 or block_size <= 0:
        return
    have, needed = request.hash_ids_len, request.in_tokens // block_size
    if have < needed:
        report(
            "warning",
            f"in={request.in_tokens} needs {needed} hash ids at block_size {block_size}, has {have} "
            "(missing blocks are replayed as unshared filler)",
        )
    elif have > -(-request.in_tokens // block_size):
        report(
            "warning",
            f"in={request.in_tokens} covers {-(-request.in_tokens // block_size)} blocks at block_size "
            f"{block_size}, has {have} hash ids (the surplus is ignored)",
        )
    if request.ttft is not None and request.type == "n":
        report("warning", 'ttft on a non-streamed ("n") request; the reference rejects this')
    if request.ttft is not None and request.api_time is not None and request.ttft > request.api_time + 1e-6:
        report("warning", f"ttft={request.ttft} exceeds api_time={request.api_time}")
    if request.out_tokens == 0:
        report("warning", "out=0: a replay cannot force an empty output and will ask for 1 token")


def plainly_fine(request: Request, previous_len: int, block_size: int) -> bool:
    """True when `check_request` would find nothing: the same rules as plain comparisons, so the common request of
    a large trace costs no reporter and no loops (NaN fails every comparison, so it falls through to the checks)."""
    inf = math.inf
    ttft, api_time, added = request.ttft, request.api_time, request.hash_ids_added
    acceptance = request.acceptance_length
    if not (
        0 <= request.t < inf
        and (request.think_time is None or 0 <= request.think_time < inf)
        and (api_time is None or 0 <= api_time < inf)
        and (
            ttft is None or (0 <= ttft < inf and request.type != "n" and (api_time is None or ttft <= api_time + 1e-6))
        )
        and 0 <= request.in_tokens <= MAX_TOKENS_PER_REQUEST
        and 1 <= request.out_tokens <= MAX_TOKENS_PER_REQUEST
        and (acceptance is None or 1 <= acceptance < inf)
        and 0 <= request.hash_ids_kept <= previous_len
        and (not added or (min(added) >= HASH_ID_MIN and max(added) <= HASH_ID_MAX))
        and block_size > 0
    ):
        return False
    have = request.hash_ids_kept + len(added)
    return request.in_tokens // block_size <= have <= -(-request.in_tokens // block_size)


def _reporter(findings: Findings, **where: object) -> ReportFinding:
    def report(severity: str, message: str) -> None:
        add = findings.error if severity == "error" else findings.warning
        add(message, **where)

    return report


def check_session(session: Session, block_size: int, findings: Findings, line_of: LineOf | None = None) -> None:
    """Check a session and every agent and request in it, adding findings."""
    if not session.session_id:
        findings.error("session id is empty", session=session.session_id)
    if not math.isfinite(session.start_s) or session.start_s < 0:
        findings.error(f"start_s={session.start_s} must be finite and >= 0", session=session.session_id)
    seen_agents: set[str] = set()
    root_where = {"session": session.session_id, "agent": session.root.agent_id}
    for agent, parent, depth in session.agents():
        where = {"session": session.session_id, "agent": agent.agent_id} if parent is not None else root_where
        if depth == MAX_AGENT_DEPTH + 1:
            findings.error(f"subagents nest deeper than {MAX_AGENT_DEPTH} levels", **where)
        if parent is not None:
            if not agent.agent_id:
                findings.error("subagent has an empty agent_id", **where)
            elif agent.agent_id in seen_agents:
                findings.error(f'agent_id "{agent.agent_id}" appears twice in this session', **where)
            if not 0 <= agent.spawn_after <= len(parent.requests):
                findings.error(f"spawn_after={agent.spawn_after} outside [0, {len(parent.requests)}]", **where)
            for name, value in (("t", agent.t), ("duration_ms", agent.duration_ms)):
                problem = _bad_time(value, optional=True)
                if problem:
                    findings.error(f"subagent {name} {problem}", **where)
            if not agent.requests:
                findings.warning(f'subagent has no requests (status "{agent.status}"); it replays as nothing', **where)
        seen_agents.add(agent.agent_id)
        previous_len = 0
        previous_t = -math.inf
        for index, request in enumerate(agent.requests):
            if not plainly_fine(request, previous_len, block_size) or request.t < previous_t - 1e-9:
                line = line_of(agent, index) if line_of else None
                report = _reporter(findings, line=line, request=index, **where)
                check_request(request, previous_len, block_size, report)
                if request.t < previous_t - 1e-9:
                    report("warning", f"t={request.t} is earlier than the previous request's t={previous_t}")
            previous_t = max(previous_t, request.t)
            previous_len = request.hash_ids_len


def check_trace_header(trace: Trace, findings: Findings) -> None:
    """Check trace-level fields and cross-session rules (unique session ids)."""
    if not 0 < trace.block_size <= MAX_BLOCK_SIZE:
        findings.error(f"block_size={trace.block_size} must be in [1, {MAX_BLOCK_SIZE}]")
    if trace.hash_id_scope not in ("session", "global"):
        findings.error(f'hash_id_scope "{trace.hash_id_scope}" must be "session" or "global"')
    seen: set[str] = set()
    for session in trace.sessions:
        if session.session_id in seen:
            findings.error(f'session id "{session.session_id}" appears twice', session=session.session_id)
        seen.add(session.session_id)


def validate(trace: Trace, file: str = "") -> list[Finding]:
    """Every problem in an in-memory trace, errors first."""
    findings = Findings(file)
    check_trace_header(trace, findings)
    for session in trace.sessions:
        check_session(session, trace.block_size, findings)
    return findings.errors + findings.warnings
