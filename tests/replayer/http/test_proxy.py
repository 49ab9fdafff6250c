"""Proxies as curl takes them: which proxy a server URL goes through (`--proxy`, the environment's variables,
`no_proxy`, loopback never from the environment), and every call through a forward proxy of the test's own on
loopback: plain http in absolute form, https through a CONNECT tunnel, the proxy's credentials, a proxy that
refuses; a replay's records say the route."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
import trustme
from forward_proxy import ForwardProxy
from paths import SAMPLE_TRACE

import agentx
from agentx.errors import ConfigError
from agentx.replayer.http.client import Client, ServerUnreachable
from agentx.replayer.http.proxy import DIRECT, Proxy, proxy_for
from agentx.replayer.http.tls import TLSSettings
from agentx.sim.process import SimServer

pytestmark = pytest.mark.slow  # starts processes (tests/project/test_tiers.py)

PROXY_PASSWORD = "pr0xy-secret-do-not-print"


@pytest.mark.parametrize(
    ("url", "environ", "expected"),
    [
        ("http://gpu-node:8000", {"http_proxy": "http://p:3128"}, "proxy http://p:3128"),
        ("http://gpu-node:8000", {"HTTP_PROXY": "p:3128"}, "proxy http://p:3128"),
        ("http://gpu-node:8000", {"http_proxy": "http://low:1", "HTTP_PROXY": "http://up:2"}, "proxy http://low:1"),
        ("http://gpu-node:8000", {"https_proxy": "http://p:3128"}, DIRECT),
        ("https://api.example.com", {"https_proxy": "http://p:3128"}, "proxy http://p:3128"),
        ("https://api.example.com", {"ALL_PROXY": "http://all:8080"}, "proxy http://all:8080"),
        ("http://gpu-node:8000", {"all_proxy": "http://all:1", "http_proxy": "http://h:2"}, "proxy http://h:2"),
        ("http://127.0.0.1:8000", {"http_proxy": "http://p:3128"}, DIRECT),
        ("http://localhost:8000", {"http_proxy": "http://p:3128"}, DIRECT),
        ("http://[::1]:8000", {"http_proxy": "http://p:3128"}, DIRECT),
        ("http://gpu-node:8000", {"http_proxy": "http://p:3128", "no_proxy": "*"}, DIRECT),
        ("http://gpu-node:8000", {"http_proxy": "http://p:3128", "NO_PROXY": "other, gpu-node"}, DIRECT),
        ("http://a.lab.internal:80", {"http_proxy": "http://p:3128", "no_proxy": ".lab.internal"}, DIRECT),
        ("http://a.lab.internal:80", {"http_proxy": "http://p:3128", "no_proxy": "lab.internal"}, DIRECT),
        ("http://xlab.internal:80", {"http_proxy": "http://p:3128", "no_proxy": "lab.internal"}, "proxy http://p:3128"),
        ("http://10.1.2.3:8000", {"http_proxy": "http://p:3128", "no_proxy": "10.0.0.0/8"}, DIRECT),
        ("http://11.1.2.3:8000", {"http_proxy": "http://p:3128", "no_proxy": "10.0.0.0/8"}, "proxy http://p:3128"),
        ("http://gpu-node:8000", {"http_proxy": "http://p:3128", "no_proxy": "gpu-node:9000"}, "proxy http://p:3128"),
        ("http://gpu-node:8000", {"http_proxy": "http://p:3128", "no_proxy": "gpu-node:8000"}, DIRECT),
        ("http://gpu-node:8000", {}, DIRECT),
    ],
)
def test_the_environment_names_the_proxy_as_curl_reads_it(url: str, environ: dict[str, str], expected: str) -> None:
    proxy = proxy_for(url, environ=environ)
    assert (DIRECT if proxy is None else proxy.route) == expected


def test_an_explicit_proxy_wins_and_the_empty_one_goes_direct() -> None:
    environ = {"http_proxy": "http://env:1", "no_proxy": "*"}
    explicit = proxy_for("http://127.0.0.1:8000", proxy="http://mine:3128", environ=environ)
    assert explicit is not None and explicit.route == "proxy http://mine:3128"  # loopback too: the user asked
    assert proxy_for("http://gpu-node:8000", proxy="", environ={"http_proxy": "http://env:1"}) is None


def test_a_proxy_that_is_not_http_is_refused_naming_where_it_came_from() -> None:
    with pytest.raises(ConfigError, match=r"ALL_PROXY: socks5:// proxies are not supported.*--no-proxy"):
        proxy_for("http://gpu-node:8000", environ={"ALL_PROXY": "socks5://p:1080"})
    with pytest.raises(ConfigError, match="--proxy: https:// proxies"):
        Proxy("https://p:443")


def test_a_proxy_password_never_shows() -> None:
    proxy = Proxy(f"http://me:{PROXY_PASSWORD}@p:3128")
    assert PROXY_PASSWORD not in repr(proxy) and PROXY_PASSWORD not in proxy.route
    client = Client("http://gpu-node:8000", proxy=f"http://me:{PROXY_PASSWORD}@p:3128")
    assert PROXY_PASSWORD not in repr(client)
    options = agentx.Connection(proxy=f"http://me:{PROXY_PASSWORD}@p:3128")
    assert PROXY_PASSWORD not in repr(options)


@pytest.fixture(scope="module")
def sim() -> Iterator[SimServer]:
    with SimServer(time_scale=0.01, seed=3) as server:
        yield server


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str, str]:
    folder = tmp_path_factory.mktemp("proxy-tls")
    ca = trustme.CA()
    issued = ca.issue_cert("localhost", "api.upstream.test")
    paths = (str(folder / "ca.pem"), str(folder / "server.pem"), str(folder / "server.key"))
    ca.cert_pem.write_to_path(paths[0])
    for index, blob in enumerate(issued.cert_chain_pems):
        blob.write_to_path(paths[1], append=index > 0)
    issued.private_key_pem.write_to_path(paths[2])
    return paths


@pytest.fixture(scope="module")
def https_sim(tls_files: tuple[str, str, str]) -> Iterator[SimServer]:
    with SimServer(time_scale=0.01, seed=4, tls_cert=tls_files[1], tls_key=tls_files[2]) as server:
        yield server


def _stream_body(model: str) -> bytes:
    return msgspec.json.encode(
        {"model": model, "prompt": list(range(1000, 1030)), "max_tokens": 6, "ignore_eos": True, "stream": True}
    )


def _calls(url: str, **options: object) -> tuple[list[str], int, int]:
    """The model list, and a streamed request's status and output tokens, through a client made with `options`."""

    async def main() -> tuple[list[str], int, int]:
        async with Client(url, **options) as client:  # type: ignore[arg-type]
            models = await client.probe_models()
            exchange = await client.stream("/v1/completions", _stream_body(models[0]))
            return models, exchange.status, sum(exchange.chunk_tokens)

    return asyncio.run(main())


def test_plain_http_goes_through_the_proxy_in_absolute_form(sim: SimServer) -> None:
    port = sim.url.rpartition(":")[2]
    with ForwardProxy() as proxy:
        # A host no resolver knows, reached only because the proxy (which maps every host to loopback) resolves it.
        url = f"http://upstream.test:{port}"
        models, status, tokens = _calls(url, proxy=proxy.url)
    assert models == [sim.model] and status == 200 and tokens == 6
    targets = [(asked.method, asked.target) for asked in proxy.asked]
    assert ("GET", f"{url}/v1/models") in targets and ("POST", f"{url}/v1/completions") in targets


def test_https_goes_through_a_connect_tunnel_with_the_servers_certificate_checked(
    https_sim: SimServer, tls_files: tuple[str, str, str]
) -> None:
    port = https_sim.url.rpartition(":")[2]
    url = f"https://api.upstream.test:{port}"
    with ForwardProxy(credentials=f"me:{PROXY_PASSWORD}") as proxy:
        models, status, tokens = _calls(
            url, proxy=f"http://me:{PROXY_PASSWORD}@{proxy.url.removeprefix('http://')}",
            tls=TLSSettings(ca_bundle=tls_files[0]),
        )  # fmt: skip
    assert models == [https_sim.model] and status == 200 and tokens == 6
    # Only tunnels: the proxy never saw a request, and the credentials went in the CONNECT only.
    assert {asked.method for asked in proxy.asked} == {"CONNECT"}
    assert {asked.target for asked in proxy.asked} == {f"api.upstream.test:{port}"}
    assert all(asked.authorization is not None for asked in proxy.asked)


def test_a_proxy_that_refuses_is_named_and_its_password_hidden(sim: SimServer, https_sim: SimServer) -> None:
    with ForwardProxy(credentials="me:right-password") as proxy:
        wrong = f"http://me:{PROXY_PASSWORD}@{proxy.url.removeprefix('http://')}"
        with pytest.raises(ServerUnreachable) as tunnel_refused:
            _calls(f"https://api.upstream.test:{https_sim.url.rpartition(':')[2]}", proxy=wrong)
        with pytest.raises(ServerUnreachable) as request_refused:
            _calls(f"http://upstream.test:{sim.url.rpartition(':')[2]}", proxy=wrong)
    assert "refused to open a tunnel" in str(tunnel_refused.value) and "407" in str(tunnel_refused.value)
    assert "407" in str(request_refused.value)
    for message in (str(tunnel_refused.value), str(request_refused.value)):
        assert PROXY_PASSWORD not in message


def test_a_proxy_that_is_not_there_says_so(sim: SimServer) -> None:
    with ForwardProxy() as proxy:
        gone = proxy.url
    with pytest.raises(ServerUnreachable, match=rf"the proxy {gone} cannot be reached"):
        _calls(sim.url, proxy=gone, connect_timeout_s=2.0)


def test_a_replay_through_the_environments_proxy_records_its_route(sim: SimServer, tmp_path: Path) -> None:
    port = sim.url.rpartition(":")[2]
    with ForwardProxy() as proxy:
        environ = {**os.environ, "http_proxy": proxy.url, "NO_PROXY": "", "no_proxy": ""}
        command = [
            sys.executable, "-m", "agentx.cli", "replay", str(SAMPLE_TRACE), "--model", sim.model, "--mode", "closed",
            "--sessions", "2", "--concurrency", "2", "--delay-scale", "0", "--metrics-interval", "off",
        ]  # fmt: skip
        via = subprocess.run(
            [*command, "--url", f"http://upstream.test:{port}", "--out", str(tmp_path / "via")],
            env=environ, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert via.returncode == 0, via.stderr
        assert f"requests go through the proxy {proxy.url} (the environment's HTTP_PROXY); --no-proxy" in via.stderr
        sent = sum(asked.method == "POST" for asked in proxy.asked)
        direct = subprocess.run(
            [*command, "--url", sim.url, "--no-proxy", "--out", str(tmp_path / "direct")],
            env=environ, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert direct.returncode == 0, direct.stderr
        assert "proxy" not in direct.stderr
        both = subprocess.run(
            [*command, "--url", sim.url, "--no-proxy", "--proxy", proxy.url, "--out", str(tmp_path / "both")],
            env=environ, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    records = agentx.read_records(tmp_path / "via" / "records.arrow")
    assert set(records.column("route").to_pylist()) == {f"proxy {proxy.url}"}
    assert sent >= records.num_rows > 0
    assert set(agentx.read_records(tmp_path / "direct" / "records.arrow").column("route").to_pylist()) == {DIRECT}
    run = json.loads((tmp_path / "direct" / "run.json").read_text())
    assert run["options"]["proxy"] == ""
    assert both.returncode == 2 and "--proxy and --no-proxy" in both.stderr and "Traceback" not in both.stderr
