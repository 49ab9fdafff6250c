"""Which engine serves the run, as the server says itself: recorded with every run so that a report can name it.

`GET /v1/models` carries `owned_by` ("vllm", "sglang", "llamacpp", "tensorrt_llm", ...) and `GET /version`,
where the engine has it, its version. Either may be missing or say something else (a gateway in front, an
older release): the identity is then partial, never an error, and `agentx report --engine` overrides it.
"""

from __future__ import annotations

from typing import Final, TypeVar

import msgspec

from agentx.replayer.http.client import Client, ServerUnreachable

ENGINE_NAMES: Final = {
    "vllm": "vLLM",
    "sglang": "SGLang",
    "llamacpp": "llama.cpp",
    "llama.cpp": "llama.cpp",
    "tensorrt_llm": "TensorRT-LLM",
    "trtllm": "TensorRT-LLM",
    "atom": "ATOM",
}
"""`owned_by` values → the engine's usual name (other values are kept as given)."""
SIMULATOR: Final = "agentx-sim"
"""The built-in simulator: it answers like vLLM, but its `/version` starts with this."""


class ServerIdentity(msgspec.Struct, frozen=True, kw_only=True):
    engine: str | None = None
    """The engine's name ("vLLM", "SGLang", "llama.cpp", "TensorRT-LLM", "agentx-sim", or `owned_by` as given)."""
    version: str | None = None
    owned_by: str | None = None
    """What `/v1/models` said owns the model, verbatim."""

    @property
    def label(self) -> str | None:
        """The engine with its version, e.g. "vLLM 0.11.0" (None: the server did not say)."""
        return " ".join(part for part in (self.engine, self.version) if part) or None


class _Card(msgspec.Struct):
    id: str
    owned_by: str | None = None


class _Cards(msgspec.Struct):
    data: list[_Card]


class _Version(msgspec.Struct):
    version: str | None = None


T = TypeVar("T")

_cards: Final = msgspec.json.Decoder(_Cards)
_version: Final = msgspec.json.Decoder(_Version)


async def identify_server(client: Client, model: str) -> ServerIdentity:
    """The identity of the server behind `client`, from its answers for `model` (module docstring)."""
    owned_by = version = None
    models = await _get(client, "/v1/models", _cards)
    if models is not None:
        owned_by = next((card.owned_by for card in models.data if card.id == model), None)
    answer = await _get(client, "/version", _version)
    if answer is not None:
        version = answer.version
    if version is not None and version.startswith(SIMULATOR):
        engine: str | None = SIMULATOR
        version = version.removeprefix(SIMULATOR).strip() or None
    else:
        engine = ENGINE_NAMES.get(owned_by.lower(), owned_by) if owned_by else None
    return ServerIdentity(engine=engine, version=version, owned_by=owned_by)


async def _get(client: Client, path: str, decoder: msgspec.json.Decoder[T]) -> T | None:
    """`GET path` decoded, or None when the server does not answer it that way."""
    try:
        status, body = await client.request_json("GET", path)
        return decoder.decode(body) if status == 200 else None
    except (ServerUnreachable, msgspec.DecodeError):
        return None
