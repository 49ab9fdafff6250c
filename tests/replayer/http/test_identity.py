"""Which engine serves a run: the simulator, engines known by `owned_by`, and servers that say little."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from aiohttp import web
from loopback import serve

from agentx.distribution import installed_version
from agentx.replayer.http.client import Client
from agentx.replayer.http.identity import ServerIdentity, identify_server
from agentx.sim.process import SimServer

pytestmark = pytest.mark.slow  # starts processes (tests/project/test_tiers.py)


@asynccontextmanager
async def _server(models: object, version: object | None) -> AsyncIterator[str]:
    """A server answering `/v1/models` with `models` and `/version` with `version` (None: 404)."""

    async def list_models(_: web.Request) -> web.Response:
        return web.json_response(models)

    async def get_version(_: web.Request) -> web.Response:
        return web.json_response(version) if version is not None else web.Response(status=404)

    app = web.Application()
    app.router.add_get("/v1/models", list_models)
    app.router.add_get("/version", get_version)
    async with serve(app) as url:
        yield url


async def _identify(models: object, version: object | None, model: str = "m") -> ServerIdentity:
    async with _server(models, version) as url, Client(url) as client:
        return await identify_server(client, model)


def test_the_simulator_names_itself_though_it_answers_like_vllm() -> None:
    async def identify(url: str) -> ServerIdentity:
        async with Client(url) as client:
            return await identify_server(client, sim.model)

    with SimServer(time_scale=0.01) as sim:
        found = asyncio.run(identify(sim.url))
    assert found == ServerIdentity(engine="agentx-sim", version=installed_version(), owned_by="vllm")


@pytest.mark.parametrize(
    ("owned_by", "engine"),
    [
        ("sglang", "SGLang"),
        ("llamacpp", "llama.cpp"),
        ("vllm", "vLLM"),
        ("tensorrt_llm", "TensorRT-LLM"),
        ("acme", "acme"),
    ],
)
def test_engines_are_named_from_the_served_models_owner(owned_by: str, engine: str) -> None:
    models = {"data": [{"id": "other", "owned_by": "x"}, {"id": "m", "owned_by": owned_by}]}
    found = asyncio.run(_identify(models, {"version": "1.2.3"}))
    assert found == ServerIdentity(engine=engine, version="1.2.3", owned_by=owned_by)
    assert found.label == f"{engine} 1.2.3"


def test_a_server_that_says_little_gets_a_partial_identity_not_an_error() -> None:
    assert asyncio.run(_identify({"data": [{"id": "m"}]}, None)) == ServerIdentity()
    assert ServerIdentity().label is None
    assert asyncio.run(_identify({"data": [{"id": "m", "owned_by": "vllm"}]}, ["not", "an", "object"])) == (
        ServerIdentity(engine="vLLM", owned_by="vllm")
    )
    assert asyncio.run(_identify("not a list", {"version": "9"})) == ServerIdentity(version="9")
