"""Structural validation of in-memory traces: each error and warning, its location and wording."""

from __future__ import annotations

import math
import re
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import examples

from agentx.errors import Finding, TraceError
from agentx.trace.findings import Findings
from agentx.trace.model import Agent, Request, Session, Trace
from agentx.trace.validation import (
    MAX_AGENT_DEPTH,
    MAX_BLOCK_SIZE,
    MAX_TOKENS_PER_REQUEST,
    check_request,
    plainly_fine,
    validate,
)

BLOCK = 64


def _request(**fields: object) -> Request:
    """A request that is clean on its own: 2 ids covering in=128 at block size 64, streamed ttft < api_time."""
    values: dict[str, object] = {
        "t": 1.0,
        "model": "m",
        "in_tokens": 2 * BLOCK,
        "out_tokens": 10,
        "hash_ids_added": (1, 2),
        "api_time": 1.0,
    }
    values.update(fields)
    return Request(**values)  # type: ignore[arg-type]


def _trace(*requests: Request, subagents: list[Agent] | None = None, **fields: object) -> Trace:
    root = Agent(requests=list(requests), subagents=subagents or [])
    values: dict[str, object] = {"sessions": [Session(session_id="s", root=root)], "block_size": BLOCK}
    values.update(fields)
    return Trace(**values)  # type: ignore[arg-type]


def _only(trace: Trace, severity: str) -> list[Finding]:
    return [f for f in validate(trace) if f.severity == severity]


def test_clean_trace_has_no_findings() -> None:
    second = _request(t=2.0, hash_ids_kept=2, hash_ids_added=(3,), in_tokens=3 * BLOCK - 5, think_time=0.0)
    assert validate(_trace(_request(), second)) == []


@pytest.mark.parametrize("name", ["t", "think_time", "api_time", "ttft"])
@pytest.mark.parametrize("value", [-0.5, math.nan, math.inf, -math.inf])
def test_bad_times_are_errors(name: str, value: float) -> None:
    errors = _only(_trace(_request(), _request(type="s", **{name: value})), "error")
    assert len(errors) == 1
    (error,) = errors
    assert (error.session, error.agent, error.request) == ("s", "", 1)
    assert error.message.startswith(f"{name} is ")
    assert ("negative" in error.message) == (value == -0.5)


def test_t_is_required_but_the_others_are_optional() -> None:
    assert _only(_trace(_request(think_time=None, api_time=None, ttft=None)), "error") == []


@pytest.mark.parametrize("name", ["in_tokens", "out_tokens"])
def test_token_counts(name: str) -> None:
    short = "in" if name == "in_tokens" else "out"
    (negative,) = _only(_trace(_request(**{name: -1})), "error")
    assert negative.message == f"{short}=-1 is negative"
    (huge,) = _only(_trace(_request(**{name: MAX_TOKENS_PER_REQUEST + 1})), "error")
    assert huge.message.startswith(f"{short}={MAX_TOKENS_PER_REQUEST + 1} is absurdly large")
    assert _only(_trace(_request(**{name: MAX_TOKENS_PER_REQUEST})), "error") == []


@pytest.mark.parametrize(
    ("value", "ok"), [(1.0, True), (3.7, True), (0.99, False), (math.nan, False), (math.inf, False)]
)
def test_acceptance_length_must_be_at_least_one(value: float, ok: bool) -> None:
    errors = _only(_trace(_request(acceptance_length=value)), "error")
    assert (errors == []) == ok
    if not ok:
        assert "acceptance_length" in errors[0].message


def test_hash_ids_kept_must_fit_the_previous_request() -> None:
    first = _request(hash_ids_added=(1, 2))
    assert _only(_trace(first, _request(hash_ids_kept=2, hash_ids_added=())), "error") == []
    (error,) = _only(_trace(first, _request(hash_ids_kept=3, hash_ids_added=())), "error")
    assert error.message == "hash_ids_kept=3 outside [0, 2]" and error.request == 1
    (error,) = _only(_trace(_request(hash_ids_kept=-1)), "error")
    assert error.message == "hash_ids_kept=-1 outside [0, 0]"


@pytest.mark.parametrize(("value", "ok"), [((1 << 63) - 1, True), (-(1 << 63), True), (1 << 63, False)])
def test_hash_ids_must_fit_64_bits(value: int, ok: bool) -> None:
    errors = _only(_trace(_request(hash_ids_added=(1, value))), "error")
    assert (errors == []) == ok


@pytest.mark.parametrize(("in_tokens", "ids"), [(900, 3), (64, 0), (1000, 14), (127, 0)])
def test_missing_hash_ids_warning(in_tokens: int, ids: int) -> None:
    needed = in_tokens // BLOCK
    findings = validate(_trace(_request(in_tokens=in_tokens, hash_ids_added=tuple(range(ids)))))
    (warning,) = findings
    assert warning.severity == "warning"
    assert re.search(rf"^in={in_tokens} needs {needed} hash ids at block_size {BLOCK}, has {ids} ", warning.message)


def test_brief_example_in_900_with_3_ids() -> None:
    (warning,) = validate(_trace(_request(in_tokens=900, hash_ids_added=(1, 2, 3))))
    assert re.search(r"in=900 needs 14 hash ids at block_size 64, has 3", warning.message)


@pytest.mark.parametrize(
    ("in_tokens", "ids", "surplus"), [(128, 2, False), (129, 3, False), (129, 4, True), (0, 1, True)]
)
def test_surplus_hash_ids_warning(in_tokens: int, ids: int, surplus: bool) -> None:
    findings = validate(_trace(_request(in_tokens=in_tokens, hash_ids_added=tuple(range(ids)))))
    covers = -(-in_tokens // BLOCK)
    expected = (
        f"in={in_tokens} covers {covers} blocks at block_size {BLOCK}, has {ids} hash ids (the surplus is ignored)"
    )
    assert [f.message for f in findings] == ([expected] if surplus else [])


def test_ttft_warnings() -> None:
    (on_plain,) = validate(_trace(_request(type="n", ttft=0.1)))
    assert on_plain.severity == "warning" and 'ttft on a non-streamed ("n") request' in on_plain.message
    assert validate(_trace(_request(type="s", ttft=0.1))) == []
    (too_late,) = validate(_trace(_request(type="s", ttft=2.0, api_time=1.0)))
    assert too_late.message == "ttft=2.0 exceeds api_time=1.0"


def test_zero_output_warning() -> None:
    (warning,) = validate(_trace(_request(out_tokens=0)))
    assert warning.severity == "warning" and warning.message.startswith("out=0")


def test_time_going_backwards_within_an_agent_is_a_warning() -> None:
    (warning,) = validate(_trace(_request(t=5.0), _request(t=4.0, hash_ids_kept=2, hash_ids_added=())))
    assert warning.severity == "warning" and warning.request == 1
    assert warning.message == "t=4.0 is earlier than the previous request's t=5.0"


def _sub(agent_id: str, spawn_after: int = 0, **fields: object) -> Agent:
    values: dict[str, object] = {"agent_id": agent_id, "spawn_after": spawn_after, "t": 1.0, "requests": [_request()]}
    values.update(fields)
    return Agent(**values)  # type: ignore[arg-type]


def test_subagent_rules() -> None:
    ok = _trace(_request(), subagents=[_sub("a", 1, subagents=[_sub("b")])])
    assert validate(ok) == []

    (dup,) = _only(_trace(_request(), subagents=[_sub("a"), _sub("b", subagents=[_sub("a")])]), "error")
    assert (dup.agent, dup.message) == ("a", 'agent_id "a" appears twice in this session')

    (empty,) = _only(_trace(_request(), subagents=[_sub("")]), "error")
    assert empty.message == "subagent has an empty agent_id"

    (spawn,) = _only(_trace(_request(), subagents=[_sub("a", 2)]), "error")
    assert spawn.message == "spawn_after=2 outside [0, 1]"

    for name, value in (("t", -1.0), ("t", math.nan), ("duration_ms", -5)):
        fields: dict[str, object] = {name: value}
        (error,) = _only(_trace(_request(), subagents=[_sub("a", 0, **fields)]), "error")
        assert error.message.startswith(f"subagent {name} is") and error.agent == "a"

    (idle,) = validate(_trace(_request(), subagents=[_sub("a", requests=[], status="async_launched")]))
    assert idle.severity == "warning" and 'status "async_launched"' in idle.message


def _chain(depth: int) -> Agent:
    """A root whose subagents nest `depth` levels deep, one per level."""
    agent = _sub(f"a{depth}")
    for level in range(depth - 1, 0, -1):
        agent = _sub(f"a{level}", subagents=[agent])
    return Agent(requests=[_request()], subagents=[agent])


def test_absurd_nesting_is_an_error() -> None:
    at_limit = Trace(sessions=[Session(session_id="s", root=_chain(MAX_AGENT_DEPTH))], block_size=BLOCK)
    assert validate(at_limit) == []
    deeper = Trace(sessions=[Session(session_id="s", root=_chain(MAX_AGENT_DEPTH + 5))], block_size=BLOCK)
    (error,) = _only(deeper, "error")  # reported once per branch, where it crosses the limit
    assert error.agent == f"a{MAX_AGENT_DEPTH + 1}"
    assert error.message == f"subagents nest deeper than {MAX_AGENT_DEPTH} levels"


def test_subagent_request_findings_name_the_agent() -> None:
    (error,) = _only(_trace(_request(), subagents=[_sub("a", requests=[_request(), _request(t=-1.0)])]), "error")
    assert (error.session, error.agent, error.request) == ("s", "a", 1)
    assert str(error) == 'session "s" subagent "a" request 1: t is negative (-1.0)'


def test_session_and_trace_rules() -> None:
    root = Agent(requests=[_request()])
    (error,) = _only(Trace(sessions=[Session(session_id="", root=root)], block_size=BLOCK), "error")
    assert error.message == "session id is empty"
    for start in (-1.0, math.nan, math.inf):
        (error,) = _only(Trace(sessions=[Session(session_id="s", root=root, start_s=start)], block_size=BLOCK), "error")
        assert error.message.startswith(f"start_s={start}")
    twice = Trace(sessions=[Session(session_id="s", root=root), Session(session_id="s", root=root)], block_size=BLOCK)
    (error,) = _only(twice, "error")
    assert error.message == 'session id "s" appears twice'
    for size in (0, -1, MAX_BLOCK_SIZE + 1):
        messages = [f.message for f in _only(_trace(_request(), block_size=size), "error")]
        assert messages == [f"block_size={size} must be in [1, {MAX_BLOCK_SIZE}]"]
    scope = _trace(_request(), hash_id_scope="local")
    assert [f.message for f in _only(scope, "error")] == ['hash_id_scope "local" must be "session" or "global"']


def test_errors_come_before_warnings_and_carry_the_file() -> None:
    trace = _trace(_request(out_tokens=0), _request(t=-1.0, hash_ids_kept=2, hash_ids_added=()))
    findings = validate(trace, file="x.arrow")
    assert [f.severity for f in findings] == sorted((f.severity for f in findings), key=["error", "warning"].index)
    assert findings[0].severity == "error" and findings[-1].severity == "warning"
    assert all(f.file == "x.arrow" for f in findings)
    assert str(findings[0]).startswith('x.arrow session "s" request 1: ')


def test_finding_text() -> None:
    assert str(Finding(severity="error", message="bad")) == "bad"
    assert str(Finding(severity="error", message="bad", line=3)) == "line 3: bad"
    full = Finding(severity="warning", message="bad", file="f.jsonl", line=3, session="s", agent="a", request=2)
    assert str(full) == 'f.jsonl:3 session "s" subagent "a" request 2: bad'
    assert str(msgspec.structs.replace(full, agent="")) == 'f.jsonl:3 session "s" request 2: bad'


def test_trace_error_is_one_paragraph_about_the_first_error() -> None:
    findings = Findings("f.json")
    findings.warning("only a warning", line=1)
    findings.error("first", line=2, session="s")
    findings.error("second", line=3)
    findings.error("third", line=4)
    with pytest.raises(TraceError) as caught:
        findings.raise_if_errors()
    assert str(caught.value) == 'f.json:2 session "s": first (and 2 more errors)'
    assert [f.message for f in caught.value.findings] == ["first", "second", "third"]
    single = TraceError.at("lonely", file="g.json", request=0)
    assert str(single) == "g.json request 0: lonely"
    Findings().raise_if_errors()  # no errors: nothing raised
    warned = Findings()
    warned.warning("w")
    warned.raise_if_errors()


_TIMES = st.none() | st.sampled_from([0.0, 0.5, 1.0, 1.0 + 5e-7, 2.0, -0.0, -1e-9, -1.0, math.inf, -math.inf, math.nan])
_COUNTS = st.sampled_from(
    [-1, 0, 1, 63, 64, 65, 127, 128, 129, 192, MAX_TOKENS_PER_REQUEST, MAX_TOKENS_PER_REQUEST + 1]
)
_IDS = st.integers(-(1 << 63), (1 << 63) - 1) | st.sampled_from([-(1 << 63) - 1, 1 << 63])


def _mostly(clean: object, odd: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """The clean value three times in four, else one of `odd`: most examples differ from a clean request in a
    field or two, where a shortcut's mistake would show."""
    return st.sampled_from([True, True, True, False]).flatmap(lambda keep: st.just(clean) if keep else odd)


@settings(max_examples=examples(1000), deadline=None)
@given(
    t=_mostly(1.0, _TIMES.filter(lambda value: value is not None)),
    think_time=_mostly(None, _TIMES),
    api_time=_mostly(1.0, _TIMES),
    ttft=_mostly(None, _TIMES),
    in_tokens=_mostly(2 * BLOCK, _COUNTS),
    out_tokens=_mostly(10, _COUNTS),
    kept=_mostly(0, st.integers(-1, 4)),
    added=_mostly((1, 2), st.lists(_IDS, max_size=4).map(tuple)),
    acceptance=_mostly(None, st.sampled_from([0.5, 1.0, 2.5, math.inf, math.nan])),
    kind=st.sampled_from(["n", "s"]),
    previous_len=st.integers(0, 3),
    block_size=_mostly(BLOCK, st.sampled_from([0, 1, 64])),
)
def test_the_fast_path_passes_exactly_the_requests_with_nothing_to_report(
    t: float,
    think_time: float | None,
    api_time: float | None,
    ttft: float | None,
    in_tokens: int,
    out_tokens: int,
    kept: int,
    added: tuple[int, ...],
    acceptance: float | None,
    kind: str,
    previous_len: int,
    block_size: int,
) -> None:
    """The loaders check a large trace's requests with plain comparisons first and build a reporter only for a
    request with something to say: that shortcut must agree with the full check."""
    request = _request(
        t=t,
        think_time=think_time,
        api_time=api_time,
        ttft=ttft,
        in_tokens=in_tokens,
        out_tokens=out_tokens,
        hash_ids_kept=kept,
        hash_ids_added=added,
        acceptance_length=acceptance,
        type=kind,
    )
    reported: list[tuple[str, str]] = []
    check_request(request, previous_len, block_size, lambda severity, message: reported.append((severity, message)))
    fine = plainly_fine(request, previous_len, block_size)
    if fine:  # what it lets through has nothing to report
        assert not reported
    elif block_size > 0:  # and it lets through every such request (a trace's block size is never 0)
        assert reported
