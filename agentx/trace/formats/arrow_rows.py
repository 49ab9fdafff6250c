"""The Arrow trace's identity columns (`session_id`, `agent_id`, `parent_agent_id`, `agent_depth`, `request_index`)
checked against the rows the `agentx.sessions` metadata describes.

The reader gives the rows to agents by position, as the metadata counts them, so a row out of place becomes a request
of the wrong agent. A few vectorized passes compare the columns with the metadata; only a file that disagrees pays
for the explanation. It checks the rows the way the text readers check theirs (ids once per session, a session's
rows together and in order, every parent present, no loops, depths along the parent chain), then against the
metadata, and words the first cause found in each session.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, Final, NamedTuple

import msgspec
import numpy as np
import pyarrow as pa

from agentx.trace.findings import Findings
from agentx.trace.links import ABSENT, NO_PARENT, follow

_ORDER: Final = (
    "sort them back into the order agentx writes: session, then agent (the root, then its subagents depth first, as "
    "the agentx.sessions metadata lists them), then request_index"
)
"""How to mend rows out of order (the format's row order, schemas/trace.arrow.md)."""


class Layout:
    """The rows the metadata describes: one entry per agent, in row order (each session's root, then its subagents
    depth first), with its session (an index into `session_ids`), parent, depth and how many rows it owns."""

    def __init__(self) -> None:
        self.session_ids: list[str] = []
        self.session: list[int] = []
        self.agent_ids: list[str] = []
        self.parent_ids: list[str | None] = []
        self.depths: list[int] = []
        self.counts: list[int] = []

    @property
    def rows(self) -> int:
        return sum(self.counts)


class _Agent(NamedTuple):
    agent_id: str
    parent_id: str | None
    depth: int
    rows: int


class _Rows(NamedTuple):
    """The identity columns as lists: a column the file lacks reads as the metadata says."""

    session: list[str]
    agent: list[str]
    parent: list[str | None]
    depth: list[int]
    request: list[int]

    def key(self, row: int) -> tuple[str, str, str | None, int, int]:
        return self.session[row], self.agent[row], self.parent[row], self.depth[row], self.request[row]

    def identity(self, row: int) -> str:
        return (
            f"session {_quoted(self.session[row])}, request {self.request[row]} of {_agent(self.agent[row])}, parent "
            f"{_parent(self.parent[row])}, depth {self.depth[row]}"
        )


_Report = Callable[..., None]
"""Adds one error: the message, then where (`row` 0-based, `session`, `agent`, `request`)."""


def check_rows(table: pa.Table, layout: Layout, sink: Findings) -> None:
    """Add an error to `sink` for each session whose rows' identity columns disagree with `layout` (a column the table
    lacks is not checked). `layout` must account for every row."""
    if _agrees(table, layout):
        return

    def report(message: str, *, row: int | None, session: str, agent: str, request: int | None = None) -> None:
        sink.error(message, line=None if row is None else row + 1, session=session, agent=agent, request=request)

    expected = _expected_rows(layout)
    rows = _Rows(
        session=_column(table, "session_id", expected.session),
        agent=_column(table, "agent_id", expected.agent),
        parent=_column(table, "parent_agent_id", expected.parent),
        depth=_column(table, "agent_depth", expected.depth),
        request=_column(table, "request_index", expected.request),
    )
    metadata = _metadata_sessions(layout)
    if not _rows_unsound(rows, metadata, report) and not _metadata_disagrees(rows, metadata, report):
        # Nothing above named a cause: point at the first row that differs.
        row = next(r for r in range(len(rows.session)) if rows.key(r) != expected.key(r))
        report(
            f"row {row + 1} ({rows.identity(row)}) disagrees with the agentx.sessions metadata, which puts "
            f"{expected.identity(row)} there",
            row=row,
            session=rows.session[row],
            agent=rows.agent[row],
            request=rows.request[row],
        )


# ---------------------------------------------------------------------------------------------
# the vectorized comparison


def _agrees(table: pa.Table, layout: Layout) -> bool:
    """Whether each identity column the table has holds, row for row, what the metadata says. Strings are compared as
    decoded, not looked up: a Mooncake-size trace has as many distinct session ids as rows, too many to hash twice."""
    present = set(table.column_names)
    counts = np.asarray(layout.counts, dtype=np.int64)
    agent_of_row = np.repeat(np.arange(len(counts)), counts)
    session_of_row = np.asarray(layout.session, dtype=np.int64)[agent_of_row]
    for name, values, codes in (
        ("session_id", layout.session_ids, session_of_row),
        ("agent_id", layout.agent_ids, agent_of_row),
        ("parent_agent_id", layout.parent_ids, agent_of_row),
    ):
        if name in present and not _same_strings(table.column(name), pa.array(values, pa.string()), codes):
            return False
    if "agent_depth" in present:
        depths = np.asarray(layout.depths, dtype=np.int64)[agent_of_row]
        if not np.array_equal(table.column("agent_depth").to_numpy(), depths):
            return False
    if "request_index" in present:
        first_row = np.cumsum(counts) - counts
        indices = np.arange(len(agent_of_row)) - first_row[agent_of_row]
        if not np.array_equal(table.column("request_index").to_numpy(), indices):
            return False
    return True


def _same_strings(column: pa.ChunkedArray, values: pa.Array, codes: Any) -> bool:
    """Whether row i of `column` (dictionary-encoded, as the reader conforms it) is `values[codes[i]]`, nulls alike."""
    start = 0
    for chunk in column.chunks:
        expected = values.take(pa.array(codes[start : start + len(chunk)]))
        if not chunk.dictionary_decode().equals(expected):
            return False
        start += len(chunk)
    return True


# ---------------------------------------------------------------------------------------------
# the explanation (a file that disagrees)


def _expected_rows(layout: Layout) -> _Rows:
    """The identity columns as the metadata describes them, one value per row."""

    def per_row(values: Sequence[Any]) -> list[Any]:
        return [value for value, count in zip(values, layout.counts, strict=True) for _ in range(count)]

    return _Rows(
        session=per_row([layout.session_ids[session] for session in layout.session]),
        agent=per_row(layout.agent_ids),
        parent=per_row(layout.parent_ids),
        depth=per_row(layout.depths),
        request=[index for count in layout.counts for index in range(count)],
    )


def _column(table: pa.Table, name: str, expected: list[Any]) -> list[Any]:
    """The column's values; those the metadata gives where the table lacks it."""
    return table.column(name).to_pylist() if name in table.column_names else expected


def _metadata_sessions(layout: Layout) -> list[tuple[str, list[_Agent]]]:
    """Each session of the metadata with its agents, in row order."""
    sessions: list[tuple[str, list[_Agent]]] = [(session_id, []) for session_id in layout.session_ids]
    for session, agent_id, parent_id, depth, count in zip(
        layout.session, layout.agent_ids, layout.parent_ids, layout.depths, layout.counts, strict=True
    ):
        sessions[session][1].append(_Agent(agent_id, parent_id, depth, count))
    return sessions


def _rows_unsound(rows: _Rows, metadata: list[tuple[str, list[_Agent]]], report: _Report) -> bool:
    """Check each session's rows among themselves (the metadata only ranks its agents and knows those without rows);
    True when something was reported."""
    known: dict[str, list[_Agent]] = {}
    for session_id, agents in metadata:
        known.setdefault(session_id, agents)
    by_session: dict[str, list[int]] = {}
    for row, session in enumerate(rows.session):
        by_session.setdefault(session, []).append(row)
    found = False
    for session, members in by_session.items():
        if _duplicates(rows, session, members, report):
            found = True
            continue  # order and parents would only repeat the clash
        unordered = _out_of_order(rows, session, members, known.get(session, []), report)
        unsound = _tree_unsound(rows, session, members, known.get(session, []), report)
        found = found or unordered or unsound
    return found


def _duplicates(rows: _Rows, session: str, members: list[int], report: _Report) -> bool:
    first_row: dict[tuple[str, int], int] = {}
    for row in members:
        key = (rows.agent[row], rows.request[row])
        if key in first_row:
            report(
                f"request {key[1]} of {_agent(key[0])} appears twice in session {_quoted(session)} (rows "
                f"{first_row[key] + 1} and {row + 1}): two sessions, or two agents of one session, share an id",
                row=row,
                session=session,
                agent=key[0],
                request=key[1],
            )
            return True
        first_row[key] = row
    return False


def _out_of_order(rows: _Rows, session: str, members: list[int], known: list[_Agent], report: _Report) -> bool:
    """A session's rows must come together, its agents in the metadata's order, each agent's in request_index order."""
    rank: dict[str, int] = {}
    for listed in known:
        rank.setdefault(listed.agent_id, len(rank))
    for before, row in itertools.pairwise(members):
        agent = rows.agent[row]
        previous = (rank.setdefault(rows.agent[before], len(rank)), rows.request[before])
        if (rank.setdefault(agent, len(rank)), rows.request[row]) < previous:
            report(
                f"rows of session {_quoted(session)} are not in the trace's order (row {row + 1}, request "
                f"{rows.request[row]} of {_agent(agent)}, comes after row {before + 1}, request "
                f"{rows.request[before]} of {_agent(rows.agent[before])}): {_ORDER}",
                row=row,
                session=session,
                agent=agent,
                request=rows.request[row],
            )
            return True
    for before, row in itertools.pairwise(members):
        if row != before + 1:
            report(
                f"rows of session {_quoted(session)} are not in the trace's order (row {row + 1}, request "
                f"{rows.request[row]} of {_agent(rows.agent[row])}, follows row {row} of session "
                f"{_quoted(rows.session[row - 1])} instead of the session's row {before + 1}): {_ORDER}",
                row=row,
                session=session,
                agent=rows.agent[row],
                request=rows.request[row],
            )
            return True
    return False


def _tree_unsound(rows: _Rows, session: str, members: list[int], known: list[_Agent], report: _Report) -> bool:
    """Every parent_agent_id names an agent of the session, the links end at the root without a loop, and each
    agent_depth is the number of links to the root."""
    nodes: dict[str, int] = {}
    parent_of: list[str | None] = []
    depth_of: list[int] = []
    opened: list[int] = []  # the first row of each agent with rows
    found = False
    differing: set[int] = set()
    for row in members:
        agent = rows.agent[row]
        node = nodes.setdefault(agent, len(nodes))
        if node == len(parent_of):
            parent_of.append(rows.parent[row])
            depth_of.append(rows.depth[row])
            opened.append(row)
            continue
        said = (parent_of[node], depth_of[node])
        if (rows.parent[row], rows.depth[row]) != said and node not in differing:
            differing.add(node)
            name, was, now = (
                ("parent_agent_id", _parent(said[0]), _parent(rows.parent[row]))
                if rows.parent[row] != said[0]
                else ("agent_depth", str(said[1]), str(rows.depth[row]))
            )
            report(
                f"the rows of {_agent(agent)} disagree on its {name} ({was} at row {opened[node] + 1}, {now} at row "
                f"{row + 1})",
                row=row,
                session=session,
                agent=agent,
            )
            found = True
    # Agents with no rows (a subagent that never ran) are still parents: the metadata knows them.
    first_row: list[int | None] = [*opened]
    for agent_id, parent_id, depth, _ in [*known, _Agent("", None, 0, 0)]:
        if agent_id not in nodes:
            nodes[agent_id] = len(nodes)
            parent_of.append(parent_id)
            depth_of.append(depth)
            first_row.append(None)
    names = list(nodes)

    def at(node: int) -> dict[str, Any]:
        return {"row": first_row[node], "session": session, "agent": names[node]}

    parents: list[int] = []
    for node, agent_id in enumerate(names):
        parent = parent_of[node]
        if agent_id == "" and parent is not None:
            report(f'the root agent (agent_id "") names parent_agent_id {_quoted(parent)}; a root has none', **at(node))
            found = True
        elif agent_id != "" and parent is None:
            report('the subagent has no parent_agent_id; only the root (agent_id "") has none', **at(node))
            found = True
        parents.append(NO_PARENT if agent_id == "" or parent is None else nodes.get(parent, ABSENT))
    links = follow(parents)
    for node in links.orphans:
        report(f"parent_agent_id {_parent(parent_of[node])} names no agent of session {_quoted(session)}", **at(node))
        found = True
    for cycle in links.cycles:
        chain = " -> ".join(_quoted(names[node]) + _row_note(first_row[node]) for node in cycle)
        report(f"parent_agent_id links of session {_quoted(session)} form a cycle: {chain}", **at(cycle[0]))
        found = True
    root = nodes[""]
    for node, agent_id in enumerate(names):
        if first_row[node] is None or links.roots[node] != root or depth_of[node] == links.depths[node]:
            continue
        if agent_id == "":
            report(f"the root agent has agent_depth={depth_of[node]}; a root is at depth 0", **at(node))
        else:
            chain = " -> ".join(_quoted(names[n]) for n in _chain(node, parents))
            report(
                f"agent_depth={depth_of[node]} does not match its parent_agent_id chain {chain}, which puts it at "
                f"depth {links.depths[node]}",
                **at(node),
            )
        found = True
    return found


def _metadata_disagrees(rows: _Rows, metadata: list[tuple[str, list[_Agent]]], report: _Report) -> bool:
    """Rows sound among themselves, compared with the metadata session by session; True when something was reported.
    Only agents with rows count: a subagent that never ran has none."""
    listed = [(session_id, [agent for agent in agents if agent.rows]) for session_id, agents in metadata]
    listed = [(session_id, agents) for session_id, agents in listed if agents]
    shapes: dict[str, list[_Agent]] = {}
    for session_id, agents in listed:
        shapes.setdefault(session_id, agents)
    found = False
    for position, (session, first, agents) in enumerate(_row_sessions(rows)):
        if position >= len(listed):
            break
        listed_id, listed_agents = listed[position]
        if (session, agents) == (listed_id, listed_agents):
            continue
        last = first + sum(agent.rows for agent in agents) - 1
        where = {"row": first, "session": session, "agent": agents[0].agent_id}
        if session != listed_id and shapes.get(session) == agents:
            report(
                f"the sessions' rows are not in the trace's order (session {_quoted(session)} starts at row "
                f"{first + 1}, where the agentx.sessions metadata has session {_quoted(listed_id)}): {_ORDER}",
                **where,
            )
            return True  # the sessions after it are the same shuffle
        if session != listed_id:
            report(
                f"rows {first + 1}–{last + 1} carry session_id {_quoted(session)}, but the agentx.sessions metadata, "
                f"which gives each session its rows by position, has session {_quoted(listed_id)} "
                f"({sum(agent.rows for agent in listed_agents)} requests) there: the ids in the rows and in the "
                "metadata disagree",
                **where,
            )
        else:
            index = next(
                (i for i, pair in enumerate(zip(agents, listed_agents, strict=False)) if pair[0] != pair[1]),
                min(len(agents), len(listed_agents)),
            )
            row = first + sum(agent.rows for agent in agents[:index])
            ours = agents[min(index, len(agents) - 1)]
            theirs = _described(listed_agents[index]) if index < len(listed_agents) else "no more agents"
            if Counter(agents) == Counter(listed_agents):
                message = (
                    f"rows of session {_quoted(session)} are not in the trace's order ({_agent(ours.agent_id)} at row "
                    f"{row + 1} comes where the agentx.sessions metadata lists {theirs}): {_ORDER}"
                )
            else:
                message = (
                    f"rows of session {_quoted(session)} hold {_described(ours)} at row {row + 1}, where the "
                    f"agentx.sessions metadata has {theirs}: the rows and the metadata disagree"
                )
            report(message, row=row, session=session, agent=ours.agent_id)
        found = True
    return found


def _row_sessions(rows: _Rows) -> list[tuple[str, int, list[_Agent]]]:
    """(session, first row, its agents) for each run of rows of one session: rows already known to be in order."""
    runs: list[tuple[str, int, list[_Agent]]] = []
    identities = zip(rows.session, rows.agent, rows.parent, rows.depth, strict=True)
    for row, (session, agent, parent, depth) in enumerate(identities):
        if not runs or runs[-1][0] != session:
            runs.append((session, row, []))
        agents = runs[-1][2]
        if agents and agents[-1].agent_id == agent:
            agents[-1] = agents[-1]._replace(rows=agents[-1].rows + 1)
        else:
            agents.append(_Agent(agent, parent, depth, 1))
    return runs


def _chain(node: int, parents: list[int]) -> list[int]:
    chain = [node]
    while parents[chain[-1]] >= 0:
        chain.append(parents[chain[-1]])
    return chain


def _described(agent: _Agent) -> str:
    return (
        f"{agent.rows} request(s) of {_agent(agent.agent_id)} (parent {_parent(agent.parent_id)}, depth {agent.depth})"
    )


def _agent(agent_id: str) -> str:
    return "the root agent" if agent_id == "" else f"agent {_quoted(agent_id)}"


def _parent(parent_id: str | None) -> str:
    return "none" if parent_id is None else _quoted(parent_id)


def _row_note(row: int | None) -> str:
    return "" if row is None else f" (row {row + 1})"


def _quoted(value: str) -> str:
    # The value is the file's: JSON-quoted, a stray newline or quote cannot break the one-line message.
    return msgspec.json.encode(value).decode()
