"""Every server call through one client: https with a CA bundle, without one, with verification off; a server that
wants a bearer token on every path, /metrics included. Over loopback only, against the simulator serving https
with a certificate made for the test (trustme)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import pytest
import trustme

from agentx.replayer.http.client import Client, Exchange, ModelNotServed, ServerUnreachable
from agentx.replayer.http.probe import detect_stream_usage
from agentx.replayer.http.tls import TLSSettings, describe_tls_error, ssl_context
from agentx.sim.process import SimServer

pytestmark = pytest.mark.slow  # starts processes (tests/project/test_tiers.py)

T = TypeVar("T")
KEY = "sk-tls-test-0123456789-do-not-print"
COMPLETIONS = "/v1/completions"


class Certificates(msgspec.Struct, frozen=True):
    ca: str
    """The CA's certificate: the bundle a client trusts."""
    cert: str
    key: str


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    folder = tmp_path_factory.mktemp("tls")
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    paths = Certificates(ca=str(folder / "ca.pem"), cert=str(folder / "server.pem"), key=str(folder / "server.key"))
    ca.cert_pem.write_to_path(paths.ca)
    server.private_key_pem.write_to_path(paths.key)
    for index, blob in enumerate(server.cert_chain_pems):
        blob.write_to_path(paths.cert, append=index > 0)
    return paths


@pytest.fixture(scope="module")
def https_sim(certificates: Certificates) -> Iterator[SimServer]:
    with SimServer(time_scale=0.01, seed=5, tls_cert=certificates.cert, tls_key=certificates.key) as server:
        yield server


@pytest.fixture(scope="module")
def locked_sim() -> Iterator[SimServer]:
    """Plain http, but every path except /health wants `Authorization: Bearer KEY`; it speculates, so that its
    /metrics have acceptance counters too."""
    with SimServer(time_scale=0.01, seed=6, spec_k=2, acceptance_length=2.5, api_key=KEY) as server:
        yield server


def run(url: str, use: Callable[[Client], Awaitable[T]], **options: Any) -> T:
    async def main() -> T:
        async with Client(url, **options) as client:
            return await use(client)

    return asyncio.run(main())


def body(model: str, max_tokens: int = 8) -> bytes:
    return msgspec.json.encode(
        {
            "model": model,
            "prompt": list(range(1000, 1040)),
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    )


class Calls(msgspec.Struct):
    models: list[str] | str
    """The served models, or the probe's error."""
    usage: str
    exchange: Exchange
    metrics: str | None


def every_call(model: str) -> Callable[[Client], Awaitable[Calls]]:
    """A model listing, the stream-usage probe, a streamed request and a /metrics scrape, in that order."""

    async def use(client: Client) -> Calls:
        try:
            models: list[str] | str = await client.probe_models(require=model)
        except (ServerUnreachable, ModelNotServed) as exc:
            models = str(exc)
        probe = await detect_stream_usage(
            client, COMPLETIONS, {"model": model, "prompt": [1000, 1001], "max_tokens": 2}
        )
        exchange = await client.stream(COMPLETIONS, body(model))
        return Calls(models=models, usage=probe.usage, exchange=exchange, metrics=await client.metrics_text())

    return use


def test_the_simulator_serves_https(https_sim: SimServer) -> None:
    assert https_sim.url.startswith("https://127.0.0.1:")


def test_every_call_succeeds_over_https_with_the_ca_bundle(https_sim: SimServer, certificates: Certificates) -> None:
    calls = run(https_sim.url, every_call(https_sim.model), tls=TLSSettings(ca_bundle=certificates.ca))
    assert calls.models == [https_sim.model]
    assert calls.usage == "continuous"  # the probe's streamed answers came back over TLS
    assert calls.exchange.ok, calls.exchange.error_message
    assert calls.exchange.completion_tokens == 8 and sum(calls.exchange.chunk_tokens) == 8
    assert calls.metrics is not None and "vllm:prefix_cache_queries" in calls.metrics


def test_with_verification_and_no_bundle_every_call_fails_with_a_certificate_error(
    https_sim: SimServer, caplog: pytest.LogCaptureFixture
) -> None:
    """The system's CAs do not know the test's CA: each kind of call says so, on one line."""
    with caplog.at_level(logging.WARNING, logger="agentx"):
        calls = run(https_sim.url, every_call(https_sim.model))
    assert isinstance(calls.models, str)
    messages = {
        "models": calls.models,
        "stream": calls.exchange.error_message or "",
        "metrics": next(r.getMessage() for r in caplog.records if "no server counters" in r.getMessage()),
    }
    for what, message in messages.items():
        assert "the server's TLS certificate was not accepted: " in message, (what, message)
        assert "\n" not in message and "Traceback" not in message, (what, message)
    assert calls.exchange.error_kind == "connection"
    assert calls.metrics is None
    assert calls.usage == "final"  # the probe could not tell, and assumed


def test_with_verification_off_every_call_succeeds(https_sim: SimServer) -> None:
    calls = run(https_sim.url, every_call(https_sim.model), tls=TLSSettings(verify=False))
    assert calls.models == [https_sim.model]
    assert calls.exchange.ok and calls.metrics is not None


def test_a_bundle_of_another_ca_trusts_only_that_ca(https_sim: SimServer, certificates: Certificates) -> None:
    """The bundle replaces the system's CAs; a CA that signed nothing of the server's does not make it trusted."""
    other = trustme.CA()
    bundle = Path(certificates.ca).with_name("other-ca.pem")
    other.cert_pem.write_to_path(str(bundle))
    calls = run(https_sim.url, every_call(https_sim.model), tls=TLSSettings(ca_bundle=str(bundle)))
    assert isinstance(calls.models, str) and "certificate" in calls.models


def test_the_cli_says_in_one_line_that_the_certificate_was_refused(https_sim: SimServer, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from agentx.cli import main

    trace = tmp_path / "trace.jsonl"
    request = {"t": 0.0, "type": "n", "model": "m", "in": 200, "out": 4, "hash_ids": [0, 1, 2], "api_time": 1.0}
    trace.write_text(
        msgspec.json.encode(
            {"id": "a", "models": ["m"], "block_size": 64, "hash_id_scope": "local", "requests": [request]}
        ).decode()
    )
    args = ["replay", str(trace), "--url", https_sim.url, "--model", https_sim.model, "--out", str(tmp_path / "run")]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert "TLS certificate was not accepted" in result.output
    assert "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1, result.output


def _one_request_trace(path: Path) -> Path:
    request = {"t": 0.0, "type": "n", "model": "m", "in": 200, "out": 4, "hash_ids": [0, 1, 2], "api_time": 1.0}
    path.write_text(
        msgspec.json.encode(
            {"id": "a", "models": ["m"], "block_size": 64, "hash_id_scope": "local", "requests": [request]}
        ).decode()
    )
    return path


@pytest.mark.parametrize("trust", ["--ca-bundle", "--no-tls-verify"])
def test_the_cli_replays_and_decodes_over_https_with_a_ca_bundle_or_no_verification(
    https_sim: SimServer, certificates: Certificates, tmp_path: Path, trust: str
) -> None:
    """Without --model too: the server's one model is asked for over the same TLS settings."""
    from click.testing import CliRunner

    from agentx.cli import main

    tls = [trust, certificates.ca] if trust == "--ca-bundle" else [trust]
    trace = _one_request_trace(tmp_path / "trace.jsonl")
    out = tmp_path / "run"
    args = ["replay", str(trace), "--url", https_sim.url, "--sessions", "1", "--out", str(out), *tls]
    replayed = CliRunner().invoke(main, args)
    assert replayed.exit_code == 0, replayed.output
    options = msgspec.json.decode((out / "run.json").read_bytes())["options"]
    assert options["tls_verify"] is (trust == "--ca-bundle")
    decoded = CliRunner().invoke(main, ["decode", "--url", https_sim.url, "--osl", "200", "--repetitions", "1", *tls])
    assert decoded.exit_code == 0, decoded.output


def test_the_cli_refuses_a_ca_bundle_with_verification_off(https_sim: SimServer, certificates: Certificates) -> None:
    from click.testing import CliRunner

    from agentx.cli import main

    args = ["decode", "--url", https_sim.url, "--ca-bundle", certificates.ca, "--no-tls-verify"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2 and "only used when certificates are verified" in result.output, result.output


def test_the_cli_asks_for_the_model_with_its_key(
    locked_sim: SimServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from click.testing import CliRunner

    from agentx.cli import main

    monkeypatch.setenv("AGENTX_TEST_KEY", KEY)
    trace = _one_request_trace(tmp_path / "trace.jsonl")
    args = ["replay", str(trace), "--url", locked_sim.url, "--out", str(tmp_path / "run"), "--mode", "closed"]
    result = CliRunner().invoke(main, [*args, "--api-key-env", "AGENTX_TEST_KEY"])
    assert result.exit_code == 0, result.output
    assert KEY not in result.output


def test_tls_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="only used when certificates are verified"):
        TLSSettings(verify=False, ca_bundle="ca.pem")
    with pytest.raises(ValueError, match="no such file"):
        Client("https://127.0.0.1:1", tls=TLSSettings(ca_bundle="/nonexistent/ca.pem"))
    assert describe_tls_error(ValueError("x")) is None
    assert ssl_context(TLSSettings(verify=False)).check_hostname is False


def test_the_tls_settings_do_not_matter_for_http(locked_sim: SimServer) -> None:
    models = run(locked_sim.url, lambda client: client.probe_models(), api_key=KEY, tls=TLSSettings(verify=False))
    assert models == [locked_sim.model]


# ---------------------------------------------------------------------------------------------
# behind authentication


def test_every_call_carries_the_api_key(locked_sim: SimServer, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="agentx"):
        calls = run(locked_sim.url, every_call(locked_sim.model), api_key=KEY)
    assert calls.models == [locked_sim.model]
    assert calls.usage == "continuous"
    assert calls.exchange.ok, calls.exchange.error_message
    assert calls.metrics is not None and "vllm:prefix_cache_queries" in calls.metrics
    assert not [r for r in caplog.records if "no server counters" in r.getMessage()]


def test_an_explicit_authorization_header_is_carried_everywhere_too(locked_sim: SimServer) -> None:
    calls = run(locked_sim.url, every_call(locked_sim.model), headers={"Authorization": f"Bearer {KEY}"})
    assert calls.models == [locked_sim.model] and calls.exchange.ok and calls.metrics is not None


def test_without_the_key_the_scrape_says_why_the_counters_are_missing(
    locked_sim: SimServer, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="agentx"):
        calls = run(locked_sim.url, every_call(locked_sim.model), api_key="sk-wrong-key-0123456789")
    assert isinstance(calls.models, str) and "the server answered 401 Unauthorized" in calls.models
    assert calls.exchange.status == 401 and calls.exchange.error_kind == "http"
    assert calls.metrics is None
    warning = next(r.getMessage() for r in caplog.records if "no server counters" in r.getMessage())
    assert "/metrics: HTTP 401" in warning
    assert "sk-wrong-key" not in warning and "sk-wrong-key" not in calls.models


def test_no_secret_shows_in_reprs_messages_or_logs(locked_sim: SimServer, caplog: pytest.LogCaptureFixture) -> None:
    host = locked_sim.url.removeprefix("http://")
    with caplog.at_level(logging.DEBUG, logger="agentx"):
        keyed = Client(locked_sim.url, api_key=KEY, headers={"X-Tenant-Token": "tenant-secret-value"})
        for client in (keyed, Client(f"http://user:pa55-Do-Not-Print@{host}")):
            assert KEY not in repr(client) and "pa55" not in repr(client) and "tenant-secret" not in repr(client)
            assert "credentials=<redacted>" in repr(client)
    # A server that echoes what it was sent: the client's messages hide the key and the header value.
    scrubbed = keyed._scrub(f"echo: Bearer {KEY}, X-Tenant-Token: tenant-secret-value")
    assert KEY not in scrubbed and "tenant-secret-value" not in scrubbed
    assert all(KEY not in r.getMessage() for r in caplog.records)


def test_a_urls_user_and_password_authenticate_every_call(tmp_path: Path) -> None:
    """Basic authentication from the URL is sent on the streamed requests too (it was only on aiohttp's calls)."""
    import base64

    from aiohttp import web
    from loopback import serve

    seen: list[str | None] = []

    async def anything(request: web.Request) -> web.StreamResponse:
        seen.append(request.headers.get("Authorization"))
        if request.path == "/v1/models":
            return web.json_response({"data": [{"id": "m"}]})
        if request.path == "/metrics":
            return web.Response(text="vllm:prefix_cache_queries_total 1\n")
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'data: {"choices":[{"text":"hi"}]}\n\ndata: [DONE]\n\n')
        return response

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", anything)

    async def main() -> tuple[list[str], Exchange, str | None]:
        async with serve(app) as url:
            with_password = url.replace("http://", "http://someone:s3cret%40pw@")
            async with Client(with_password) as client:
                assert "s3cret" not in repr(client) and "someone" not in client.base_url
                models = await client.probe_models()
                exchange = await client.stream(COMPLETIONS, body("m"))
                return models, exchange, await client.metrics_text()

    models, exchange, metrics = asyncio.run(main())
    assert models == ["m"] and exchange.ok and metrics is not None
    expected = "Basic " + base64.b64encode(b"someone:s3cret@pw").decode()
    assert seen == [expected, expected, expected]


def _session_trace(path: Path) -> Path:
    """One session of three turns, each extending the previous one's prefix (so the prefix cache hits)."""
    turns = [
        {"t": 0.0, "type": "n", "model": "m", "in": 200, "out": 8, "hash_ids": [0, 1, 2], "api_time": 0.5},
        {"t": 1.0, "type": "n", "model": "m", "in": 400, "out": 8, "hash_ids": [0, 1, 2, 3, 4, 5], "api_time": 0.5},
        {"t": 2.0, "type": "n", "model": "m", "in": 600, "out": 8, "hash_ids": list(range(9)), "api_time": 0.5},
    ]
    path.write_text(
        msgspec.json.encode(
            {"id": "a", "models": ["m"], "block_size": 64, "hash_id_scope": "local", "requests": turns}
        ).decode()
    )
    return path


def test_a_replay_behind_authentication_scrapes_the_counters_with_its_key(
    locked_sim: SimServer, tmp_path: Path
) -> None:
    """The /metrics scrapes around a run carry the run's credentials: the server-side cache hit rate and the
    counters' acceptance reach the summary (they silently dropped out before)."""
    from agentx.replayer.options.replay import ClosedLoad, ReplayOptions, Scenario, Server
    from agentx.run.replay import replay
    from agentx.trace.io import load_trace

    trace = load_trace(_session_trace(tmp_path / "trace.jsonl"))
    server = Server(url=locked_sim.url, model=locked_sim.model, api_key=KEY)
    options = ReplayOptions(
        server=server, out_dir=tmp_path / "run", load=ClosedLoad(), scenario=Scenario(delay_scale=0.01)
    )
    result = asyncio.run(replay(trace, options))
    assert result.run.errors == 0 and result.run.requests == 3
    assert result.summary.cache.server_hit_rate is not None and result.summary.cache.server_hit_rate > 0
    assert result.summary.acceptance is not None and result.summary.acceptance.counters is not None
    assert KEY not in (tmp_path / "run" / "run.json").read_text()


def test_decode_behind_authentication_scrapes_the_counters_with_its_key(locked_sim: SimServer) -> None:
    from agentx.replayer.options.replay import DecodeOptions, Server
    from agentx.run.decode import decode

    server = Server(url=locked_sim.url, model=locked_sim.model, api_key=KEY)
    result = asyncio.run(decode(DecodeOptions(server=server, isl_tokens=8, osl_tokens=32, repetitions=1)))
    assert result.failed == 0
    assert result.acceptance.counters is not None and result.acceptance.realized_source == "counters"
