"""The replay's options (agentx/replayer/options/replay.py): parts that round-trip through JSON, constraints checked
once, and the flat layout run.json keeps."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentx.errors import ConfigError
from agentx.replayer.options.replay import (
    AgentxLoad,
    ClosedLoad,
    Connection,
    RateLoad,
    ReplayOptions,
    Scenario,
    Server,
    Speculative,
    TraceLoad,
    checked,
    flat_options,
)

BASE = ReplayOptions(server=Server(url="http://127.0.0.1:9", model="m"), out_dir=Path("run"))
finite = st.floats(min_value=0.001, max_value=1e4, allow_nan=False)
loads = st.one_of(
    st.builds(AgentxLoad, concurrency=st.integers(1, 512), ramp_s=finite, warmup=st.sampled_from(["spread", "burst"])),
    st.builds(ClosedLoad, concurrency=st.integers(1, 512), ramp_s=finite),
    st.builds(TraceLoad, speedup=finite),
    st.builds(RateLoad, rate=finite, burstiness=finite),
)
options = st.builds(
    ReplayOptions,
    server=st.builds(Server, url=st.just("http://127.0.0.1:8000"), model=st.text(min_size=1, max_size=8)),
    out_dir=st.just(Path("run")),
    load=loads,
    scenario=st.builds(
        Scenario, seed=st.integers(0, 2**31), delay_scale=finite, sessions=st.none() | st.integers(1, 99)
    ),
    connection=st.builds(Connection, idle_timeout_s=st.none() | finite),
    speculative=st.builds(Speculative, k=st.none() | st.integers(1, 8)),
)


@given(options)
def test_options_round_trip_through_json_and_stay_valid(made: ReplayOptions) -> None:
    """A harness can keep options as JSON: the load's type travels as its `mode` tag."""
    again = msgspec.json.decode(
        msgspec.json.encode(made, enc_hook=str), type=ReplayOptions, dec_hook=lambda kind, value: Path(value)
    )
    assert again == made == checked(made)
    assert type(again.load) is type(made.load)


@given(options)
def test_run_json_keeps_the_options_flat(made: ReplayOptions) -> None:
    flat = flat_options(made)
    assert flat["mode"] == made.load.mode
    assert flat["seed"] == made.scenario.seed and flat["spec_k"] == made.speculative.k
    assert flat["url"] == made.server.url and "api_key" not in flat
    assert not any(isinstance(value, dict) and key in ("server", "load", "scenario") for key, value in flat.items())


@pytest.mark.parametrize(
    ("bad", "where"),
    [
        ({"load": ClosedLoad(concurrency=0)}, "$.load.concurrency"),
        ({"load": RateLoad(rate=-1.0)}, "$.load.rate"),
        ({"scenario": Scenario(delay_scale=float("nan"))}, "$.scenario.delay_scale"),
        ({"connection": Connection(idle_timeout_s=0.0)}, "$.connection.idle_timeout_s"),
        ({"scenario": Scenario(failed_request_threshold=1.5)}, "$.scenario.failed_request_threshold"),
    ],
)
def test_a_struct_built_in_python_is_checked_once_at_the_start(bad: dict[str, Any], where: str) -> None:
    made = msgspec.structs.replace(BASE, **bad)  # made in Python: the field ranges are not checked yet
    with pytest.raises(ConfigError, match=where.replace("$", r"\$").replace(".", r"\.")):
        checked(made)


def test_rules_between_fields_hold_as_a_part_is_made() -> None:
    with pytest.raises(ValueError, match=r"\[1, K\+1\] = \[1, 3\] for K=2"):
        Speculative(al=3.5, k=2)
    with pytest.raises(ValueError, match="0 <= low <= high <= 1"):
        AgentxLoad(tstar_window=(0.8, 0.2))
    with pytest.raises(ValueError, match="only used when certificates are verified"):
        Connection(tls_verify=False, ca_bundle="ca.pem")
    with pytest.raises(ValueError, match="token_low < token_high"):
        Scenario(token_low=10, token_high=10)
