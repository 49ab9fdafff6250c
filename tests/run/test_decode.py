"""`agentx decode` over HTTP against the simulator: decode-only speed recovers the configured step time."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from click.testing import CliRunner

from agentx.cli import main
from agentx.replayer.http.client import ServerUnreachable
from agentx.replayer.options.replay import Connection, DecodeOptions, Server, Speculative
from agentx.run.decode import decode_sync
from agentx.sim.process import SimServer

pytestmark = pytest.mark.slow  # starts processes (tests/project/test_tiers.py)

# A step of 4 ms + 1 ms a token, so a second user's tokens cost a step 50 % more, at a quarter of real time: a stream
# of ~300 steps lasts ~0.6 s, so a loaded machine's 20 ms stall of the client or the simulator at its first or last
# token moves the measured speed under the 3 % the assertions allow.
TIME_SCALE = 0.25
OVERHEAD_S = 0.004
DECODE_S_PER_TOKEN = 1e-3
REL = 0.03


def _expected_tps(al: float, k: int, batch: int = 1) -> float:
    """The simulator's decode speed per user in wall time: AL tokens per step of a + c·(1+K)·batch seconds
    (attention cost set to 0, so the step does not grow with the context)."""
    return al / ((OVERHEAD_S + DECODE_S_PER_TOKEN * (1 + k) * batch) * TIME_SCALE)


def _sim(al: float, k: int) -> SimServer:
    return SimServer(
        time_scale=TIME_SCALE,
        spec_k=k,
        acceptance_length=al,
        step_overhead_s=OVERHEAD_S,
        decode_s_per_token=DECODE_S_PER_TOKEN,
        attention_s_per_kv_token=0.0,
    )


@pytest.fixture(scope="module")
def sim() -> Iterator[SimServer]:
    with _sim(3.0, 3) as server:
        yield server


def test_decode_recovers_the_configured_speed_and_al(sim: SimServer) -> None:
    result = decode_sync(
        DecodeOptions(
            server=Server(url=sim.url, model=sim.model),
            isl_tokens=1,
            osl_tokens=1000,
            repetitions=5,
            speculative=Speculative(al=3.0, k=3),
        )
    )
    assert result.failed == 0 and len(result.samples) == 5
    assert result.decode_tps is not None and result.decode_tps.count == 5
    assert result.decode_tps.p50 == pytest.approx(_expected_tps(3.0, 3), rel=REL)
    assert result.decode_tps.p90 == pytest.approx(_expected_tps(3.0, 3), rel=REL)
    for sample in result.samples:
        assert sample.output_tokens == 1000 and sample.decode_tokens == 999
    found = result.acceptance
    assert found.realized_source == "counters" and found.realized_al == pytest.approx(3.0, abs=0.05)
    assert found.stream is not None and found.stream.tokens_per_step == pytest.approx(3.0, abs=0.05)
    assert not found.mismatch
    assert result.stream_usage == "continuous"


def test_prefill_is_excluded(sim: SimServer) -> None:
    """A long prompt adds a long prefill (TTFT) but leaves the decode speed where it was."""
    result = decode_sync(
        DecodeOptions(server=Server(url=sim.url, model=sim.model), isl_tokens=20_000, osl_tokens=600, repetitions=2)
    )
    assert result.decode_tps is not None
    assert result.decode_tps.p50 == pytest.approx(_expected_tps(3.0, 3), rel=REL)
    ttft = [s.ttft_s for s in result.samples if s.ttft_s is not None]
    assert min(ttft) > 20_000 * 40e-6 * TIME_SCALE * 0.9  # the prefill took its time, and did not count


def test_concurrent_users_share_the_step(sim: SimServer) -> None:
    result = decode_sync(
        DecodeOptions(server=Server(url=sim.url, model=sim.model), osl_tokens=600, concurrency=2, repetitions=2)
    )
    assert result.decode_tps is not None and result.decode_tps.count == 4
    assert result.decode_tps.p50 == pytest.approx(_expected_tps(3.0, 3, batch=2), rel=REL)


def test_the_request_timeout_applies_to_decode(sim: SimServer) -> None:
    options = DecodeOptions(
        server=Server(url=sim.url, model=sim.model),
        osl_tokens=3000,
        repetitions=1,
        connection=Connection(request_timeout_s=0.05),
    )
    result = decode_sync(options)
    assert result.failed == len(result.samples) == 1
    assert "request timeout" in (result.samples[0].error or "")


def test_decode_at_al_6() -> None:
    with _sim(6.0, 7) as server:
        result = decode_sync(
            DecodeOptions(server=Server(url=server.url, model=server.model), osl_tokens=1201, repetitions=2)
        )
    assert result.decode_tps is not None
    assert result.decode_tps.p50 == pytest.approx(_expected_tps(6.0, 7), rel=REL)
    assert result.acceptance.realized_al == pytest.approx(6.0, abs=0.05)


def test_cli_decode_against_the_simulator_prints_json() -> None:
    args = [
        "decode",
        "--sim-time-scale",
        "0.25",
        "--osl",
        "600",
        "--repetitions",
        "2",
        "--spec-al",
        "3",
        "--spec-k",
        "3",
    ]
    result = CliRunner().invoke(main, [*args, "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.output[result.output.index("{") :])
    # The built-in simulator runs its default step model (attention included): about AL / 8.2 ms.
    assert document["decode_tps"]["p50"] == pytest.approx(3.0 / (0.00824 * 0.25), rel=REL)
    assert document["acceptance"]["realized_al"] == pytest.approx(3.0, abs=0.05)
    assert document["options"]["spec_al"] == 3.0 and "api_key" not in document["options"]


def test_cli_decode_prints_tables_and_flags_a_mismatch(sim: SimServer) -> None:
    args = ["decode", "--url", sim.url, "--osl", "300", "--repetitions", "1", "--spec-al", "2", "--spec-k", "3"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 3, result.output  # the measurement does not stand
    assert "decode tokens/s per user p50 · p90" in result.output
    assert "MISMATCH" in result.output
    assert "error: the realized speculative acceptance disagrees with the forced one" in result.output


def test_cli_decode_errors_are_one_clear_paragraph() -> None:
    unreachable = CliRunner().invoke(main, ["decode", "--url", "http://127.0.0.1:9", "--model", "m"])
    assert unreachable.exit_code == 2 and "unreachable" in unreachable.output
    assert "Traceback" not in unreachable.output
    too_high = CliRunner().invoke(main, ["decode", "--url", "http://127.0.0.1:9", "--spec-al", "9", "--spec-k", "7"])
    assert too_high.exit_code == 2 and "[1, K+1] = [1, 8] for K=7" in too_high.output
    short = CliRunner().invoke(main, ["decode", "--url", "http://127.0.0.1:9", "--osl", "1"])
    assert short.exit_code == 2 and "Traceback" not in short.output


def test_api_errors_before_any_request() -> None:
    with pytest.raises(ValueError, match=r">= 2 - at `\$\.osl_tokens`"):
        decode_sync(DecodeOptions(server=Server(url="http://127.0.0.1:9", model="m"), osl_tokens=1))
    with pytest.raises(ServerUnreachable):
        decode_sync(DecodeOptions(server=Server(url="http://127.0.0.1:9", model="m")))
