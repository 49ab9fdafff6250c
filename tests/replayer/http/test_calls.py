"""The client's whole-answer calls (model listing, JSON calls, /metrics) over the lean http1 pool, against small
loopback servers: headers, bodies in every framing, error answers, failures, timeouts and redirects."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest
from aiohttp import web
from loopback import serve

from agentx.errors import ModelsNotListed
from agentx.replayer.http.calls import MAX_REDIRECTS
from agentx.replayer.http.client import Client, ModelNotServed, ServerUnreachable

T = TypeVar("T")
KEY = "sk-calls-test-0123456789"
SSE_OK = b'data: {"choices":[{"text":"hi"}]}\n\ndata: [DONE]\n\n'


class Seen:
    """What the server was sent, per request: method, path, headers, body, and the client's port."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, dict[str, str], bytes, int]] = []

    def of(self, path: str) -> tuple[str, str, dict[str, str], bytes, int]:
        return next(request for request in self.requests if request[1] == path)


def app_for(seen: Seen) -> web.Application:
    async def record(request: web.Request) -> bytes:
        body = await request.read()
        peer = request.transport.get_extra_info("peername")[1] if request.transport is not None else 0
        seen.requests.append((request.method, request.path, dict(request.headers), body, peer))
        return body

    async def models(request: web.Request) -> web.StreamResponse:
        await record(request)
        return web.json_response({"object": "list", "data": [{"id": "m", "owned_by": "vllm"}]})

    async def tokenize(request: web.Request) -> web.StreamResponse:
        body = await record(request)
        return web.json_response({"tokens": list(range(len(json.loads(body)["prompt"])))})

    async def metrics(request: web.Request) -> web.StreamResponse:
        """Chunked: no Content-Length, the text in several writes."""
        await record(request)
        response = web.StreamResponse(headers={"Content-Type": "text/plain"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        for line in (b"# HELP x\n", b"vllm:prefix_cache_queries_total 10\n", b"vllm:prefix_cache_hits_total 4\n"):
            await response.write(line)
            await asyncio.sleep(0.005)
        await response.write_eof()
        return response

    async def failing(request: web.Request) -> web.StreamResponse:
        await record(request)
        return web.json_response({"error": {"message": "the engine is warming up", "code": 503}}, status=503)

    async def slow(request: web.Request) -> web.StreamResponse:
        await record(request)
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        await response.write(b'{"data": [')  # the head and a start, then nothing for a long while
        await asyncio.sleep(2)
        return response

    async def completions(request: web.Request) -> web.StreamResponse:
        await record(request)
        return web.Response(body=SSE_OK, content_type="text/event-stream")

    def redirect(status: int, location: str | Callable[[web.Request], str]) -> Any:
        async def handler(request: web.Request) -> web.StreamResponse:
            await record(request)
            target = location if isinstance(location, str) else location(request)
            return web.Response(status=status, headers={"Location": target})

        return handler

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/tokenize", tokenize)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/failing", failing)
    app.router.add_get("/slow", slow)
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/old/models", redirect(302, "../v1/models"))  # relative, resolved against the request
    app.router.add_get("/moved/metrics", redirect(301, lambda r: f"http://{r.host}/metrics"))  # absolute
    app.router.add_get("/prefix/metrics", redirect(307, "/prefix/metrics/"))  # Starlette's trailing slash
    app.router.add_get("/prefix/metrics/", metrics)
    app.router.add_get("/loop", redirect(302, "/loop"))
    app.router.add_get("/away", redirect(302, "http://127.0.0.2:9/metrics"))
    app.router.add_post("/old/tokenize", redirect(307, "/tokenize"))
    app.router.add_post("/see-other", redirect(303, "/tokenize"))
    return app


def run(use: Callable[[Client, Seen, str], Awaitable[T]], *, path: str = "", **options: Any) -> tuple[T, Seen]:
    seen = Seen()

    async def main() -> T:
        async with serve(app_for(seen)) as url, Client(url + path, **options) as client:
            return await use(client, seen, url)

    return asyncio.run(main()), seen


def test_a_get_sends_no_body_and_asks_for_json() -> None:
    async def use(client: Client, seen: Seen, url: str) -> list[str]:
        return await client.probe_models(require="m")

    models, seen = run(use, api_key=KEY, headers={"X-Tenant": "t-1"})
    assert models == ["m"]
    method, _, headers, body, _ = seen.of("/v1/models")
    assert (method, body) == ("GET", b"")
    assert "Content-Length" not in headers and "Content-Type" not in headers and "Transfer-Encoding" not in headers
    assert headers["Accept"] == "application/json" and headers["User-Agent"] == "agentx"
    assert headers["Authorization"] == f"Bearer {KEY}" and headers["X-Tenant"] == "t-1"


def test_a_json_post_sends_its_body_and_reads_the_whole_answer() -> None:
    async def use(client: Client, seen: Seen, url: str) -> tuple[int, bytes]:
        return await client.request_json("POST", "/tokenize", {"model": "m", "prompt": "a b c"})

    (status, body), seen = run(use, api_key=KEY)
    assert status == 200 and json.loads(body) == {"tokens": [0, 1, 2, 3, 4]}
    method, _, headers, sent, _ = seen.of("/tokenize")
    assert method == "POST" and json.loads(sent) == {"model": "m", "prompt": "a b c"}
    assert headers["Content-Type"] == "application/json" and headers["Content-Length"] == str(len(sent))
    assert headers["Accept"] == "application/json"


def test_the_callers_content_type_and_accept_do_not_double() -> None:
    async def use(client: Client, seen: Seen, url: str) -> int:
        return (await client.request_json("POST", "/tokenize", {"prompt": "a"}))[0]

    status, seen = run(use, headers={"content-type": "application/json; charset=utf-8", "Accept": "*/*"})
    assert status == 200
    _, _, headers, _, _ = seen.of("/tokenize")
    assert headers["Content-Type"] == "application/json; charset=utf-8" and headers["Accept"] == "application/json"


def test_a_chunked_plain_answer_is_read_whole() -> None:
    async def use(client: Client, seen: Seen, url: str) -> str | None:
        return await client.metrics_text()

    text, seen = run(use)
    assert text == "# HELP x\nvllm:prefix_cache_queries_total 10\nvllm:prefix_cache_hits_total 4\n"
    assert seen.of("/metrics")[2]["Accept"] == "text/plain"


def test_an_error_status_with_a_json_body_is_the_callers_to_read() -> None:
    async def use(client: Client, seen: Seen, url: str) -> tuple[int, str, bytes]:
        return await client._require_calls().call("GET", "/failing", None, timeout_s=None, accept="application/json")

    (status, reason, body), _ = run(use)
    assert (status, reason) == (503, "Service Unavailable")
    assert json.loads(body)["error"]["message"] == "the engine is warming up"


def test_the_model_listing_names_an_error_answers_message() -> None:
    async def use(client: Client, seen: Seen, url: str) -> str:
        with pytest.raises(ServerUnreachable) as raised:
            await client.probe_models()
        return str(raised.value)

    # A base URL whose /v1/models is the failing route: the message says the status and the body's message.
    async def main() -> str:
        app = web.Application()

        async def unavailable(request: web.Request) -> web.StreamResponse:
            return web.json_response({"error": {"message": "the engine is warming up"}}, status=503)

        app.router.add_get("/v1/models", unavailable)
        async with serve(app) as url, Client(url, api_key=KEY) as client:
            return await use(client, Seen(), url)

    message = asyncio.run(main())
    assert message.startswith("the server answered 503 Service Unavailable for GET http://127.0.0.1:"), message
    assert message.endswith("/v1/models: the engine is warming up"), message


def test_a_model_listing_not_found_says_the_server_answered_and_where_it_asked() -> None:
    """A base URL with a path the server does not serve: the server is there, the path is what is wrong."""

    async def main() -> tuple[str, str]:
        async with serve(app_for(Seen())) as url, Client(url + "/wrong") as client:
            with pytest.raises(ModelsNotListed) as raised:
                await client.probe_models()
            return url, str(raised.value)

    url, message = asyncio.run(main())
    assert message == (
        f"the server answered 404 Not Found for GET {url}/wrong/v1/models: is the base URL right? agentx adds /v1/... "
        "to it itself"
    )
    assert "unreachable" not in message


def test_an_answer_that_is_not_a_model_list_says_so() -> None:
    async def main() -> tuple[str, str]:
        app = web.Application()

        async def page(request: web.Request) -> web.StreamResponse:
            return web.Response(text="<html>a web UI</html>", content_type="text/html")

        app.router.add_get("/v1/models", page)
        async with serve(app) as url, Client(url) as client:
            with pytest.raises(ModelsNotListed) as raised:
                await client.probe_models()
            return url, str(raised.value)

    url, message = asyncio.run(main())
    assert message.startswith(f"the server answered GET {url}/v1/models with something that is not a model list ("), (
        message
    )
    assert message.endswith("is the base URL right? agentx adds /v1/... to it itself")


def test_an_unknown_model_is_not_served() -> None:
    async def use(client: Client, seen: Seen, url: str) -> None:
        with pytest.raises(ModelNotServed, match=r"'other' is not served by .* \(served: m\)"):
            await client.probe_models(require="other")

    run(use)


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_refused_connection_is_unreachable_naming_the_url(caplog: pytest.LogCaptureFixture) -> None:
    port = closed_port()

    async def main() -> tuple[str, str, str | None]:
        async with Client(f"http://someone:pa55-word@127.0.0.1:{port}") as client:
            with pytest.raises(ServerUnreachable) as models:
                await client.probe_models()
            with pytest.raises(ServerUnreachable) as tokenize:
                await client.request_json("POST", "/tokenize", {"prompt": "a"})
            with caplog.at_level(logging.WARNING, logger="agentx"):
                return str(models.value), str(tokenize.value), await client.metrics_text()

    models, tokenize, metrics = asyncio.run(main())
    assert models.startswith(f"GET http://127.0.0.1:{port}/v1/models: ConnectionRefusedError"), models
    assert tokenize.startswith(f"POST http://127.0.0.1:{port}/tokenize: ConnectionRefusedError"), tokenize
    assert metrics is None
    warning = next(r.getMessage() for r in caplog.records if "no server counters" in r.getMessage())
    assert f"GET http://127.0.0.1:{port}/metrics: ConnectionRefusedError" in warning
    assert all("pa55" not in text for text in (models, tokenize, warning))


def test_a_call_that_gets_no_whole_answer_in_time_times_out_and_the_pool_goes_on() -> None:
    async def use(client: Client, seen: Seen, url: str) -> tuple[str, float, list[str]]:
        started = time.perf_counter()
        with pytest.raises(ServerUnreachable) as raised:
            await client.request_json("GET", "/slow")
        took = time.perf_counter() - started
        return str(raised.value), took, await client.probe_models()

    (message, took, models), _ = run(use, probe_timeout_s=0.3, limit=1, spare_connections=0)
    assert message.endswith("/slow: no answer within 0.3 s"), message
    assert 0.3 <= took < 2.0
    assert models == ["m"]  # the stalled connection was dropped, not handed to the next call


def test_a_calls_own_timeout_wins_over_the_probe_timeout() -> None:
    async def use(client: Client, seen: Seen, url: str) -> str:
        with pytest.raises(ServerUnreachable) as raised:
            await client.request_json("GET", "/slow", timeout_s=0.2)
        return str(raised.value)

    message, _ = run(use, probe_timeout_s=30.0)
    assert message.endswith("no answer within 0.2 s")


def test_a_connection_is_kept_alive_from_a_call_to_the_streamed_requests() -> None:
    async def use(client: Client, seen: Seen, url: str) -> bool:
        await client.probe_models()
        await client.metrics_text()
        return (await client.stream("/v1/completions", b"{}")).ok

    ok, seen = run(use, limit=1, spare_connections=0)
    assert ok and [path for _, path, *_ in seen.requests] == ["/v1/models", "/metrics", "/v1/completions"]
    assert len({port for *_, port in seen.requests}) == 1


def test_404_metrics_are_none_without_a_warning_other_failures_warn(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> tuple[str | None, str | None]:
        app = web.Application()
        async with serve(app) as url, Client(url) as client:
            missing = await client.metrics_text()
        app = web.Application()

        async def refused(request: web.Request) -> web.StreamResponse:
            return web.json_response({"detail": "Not authenticated"}, status=401)

        app.router.add_get("/metrics", refused)
        async with serve(app) as url, Client(url, api_key=KEY) as client:
            return missing, await client.metrics_text()

    with caplog.at_level(logging.WARNING, logger="agentx"):
        missing, refused = asyncio.run(main())
    assert missing is None and refused is None
    warnings = [r.getMessage() for r in caplog.records if "no server counters" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].endswith("/metrics: HTTP 401: Not authenticated"), warnings


# Redirects: a GET follows them on the same server, a POST only 307/308, nothing goes to another server.


def test_a_get_follows_relative_and_absolute_redirects_on_the_same_server() -> None:
    async def use(client: Client, seen: Seen, url: str) -> tuple[int, bytes, int, bytes]:
        status, body = await client.request_json("GET", "/old/models")
        moved = await client._require_calls().call("GET", "/moved/metrics", None, timeout_s=None, accept="text/plain")
        return status, body, moved[0], moved[2]

    (status, body, moved_status, text), seen = run(use, api_key=KEY)
    assert status == 200 and json.loads(body)["data"][0]["id"] == "m"
    assert moved_status == 200 and b"prefix_cache_hits_total 4" in text
    assert [path for _, path, *_ in seen.requests] == ["/old/models", "/v1/models", "/moved/metrics", "/metrics"]
    assert all(headers.get("Authorization") == f"Bearer {KEY}" for _, _, headers, _, _ in seen.requests)


def test_a_base_urls_path_survives_a_trailing_slash_redirect() -> None:
    text, seen = run(lambda client, seen, url: client.metrics_text(), path="/prefix")
    assert text is not None and "prefix_cache_queries_total 10" in text
    assert [path for _, path, *_ in seen.requests] == ["/prefix/metrics", "/prefix/metrics/"]


def test_a_redirect_to_another_server_is_not_followed() -> None:
    async def use(client: Client, seen: Seen, url: str) -> str:
        with pytest.raises(ServerUnreachable) as raised:
            await client.request_json("GET", "/away")
        return str(raised.value)

    message, seen = run(use, api_key=KEY)
    assert "/away: redirected to another server (http://127.0.0.2:9), not followed" in message
    assert [path for _, path, *_ in seen.requests] == ["/away"]


def test_a_redirect_loop_ends() -> None:
    async def use(client: Client, seen: Seen, url: str) -> str:
        with pytest.raises(ServerUnreachable) as raised:
            await client.request_json("GET", "/loop")
        return str(raised.value)

    message, seen = run(use)
    assert message.endswith(f"/loop: more than {MAX_REDIRECTS} redirects")
    assert len(seen.requests) == MAX_REDIRECTS + 1


def test_a_post_follows_307_with_its_body_but_not_303() -> None:
    async def use(client: Client, seen: Seen, url: str) -> tuple[int, int]:
        kept = await client.request_json("POST", "/old/tokenize", {"prompt": "a b"})
        other = await client.request_json("POST", "/see-other", {"prompt": "a b"})
        return kept[0], other[0]

    statuses, seen = run(use)
    assert statuses == (200, 303)
    assert [(method, path) for method, path, *_ in seen.requests] == [
        ("POST", "/old/tokenize"),
        ("POST", "/tokenize"),
        ("POST", "/see-other"),
    ]
    assert json.loads(seen.of("/tokenize")[3]) == {"prompt": "a b"}


def test_a_plain_http_server_behind_an_https_url_is_named_as_such() -> None:
    async def main() -> str:
        async with serve(web.Application()) as url, Client(url.replace("http://", "https://")) as client:
            with pytest.raises(ServerUnreachable) as raised:
                await client.probe_models()
            return str(raised.value)

    message = asyncio.run(main())
    assert "the TLS handshake failed" in message and "is the server plain http? then give an http:// URL" in message
    assert "\n" not in message


def test_a_connect_that_does_not_complete_is_a_connect_timeout() -> None:
    """A TLS handshake that never gets an answer is part of connecting: the connect timeout ends it, long before
    the call's own."""

    async def main() -> tuple[str, float]:
        silent = await asyncio.start_server(lambda reader, writer: None, "127.0.0.1", 0)
        port = silent.sockets[0].getsockname()[1]
        async with silent, Client(f"https://127.0.0.1:{port}", connect_timeout_s=0.2, probe_timeout_s=10) as client:
            started = time.perf_counter()
            with pytest.raises(ServerUnreachable) as raised:
                await client.probe_models()
            return str(raised.value), time.perf_counter() - started

    message, took = asyncio.run(main())
    assert message.startswith("GET https://127.0.0.1:")
    assert message.endswith("/v1/models: connecting timed out after 0.2 s")
    assert took < 2.0
