"""vLLM's OpenAI-compatible request and response shapes: parsing, validation, rendering.

Requests are validated here into a `Plan` (or a `ClientError` with vLLM's status and message), so the
server never answers a client mistake with a 500. Streamed events are rendered from constant byte
parts (see `envelope` and `FINISH_TAILS`) because a stream's per-chunk cost is the simulator's budget.
"""

from __future__ import annotations

import os
import time
from array import array
from typing import Any, Final

import msgspec

from agentx.sim.engine.config import EngineConfig
from agentx.sim.engine.sequence import FinishReason
from agentx.sim.tokenizer import ROLE_IDS, Tokenizer

ERROR_TYPES: Final = {
    400: "BadRequestError",
    404: "NotFoundError",
    429: "RateLimitError",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
}


class ClientError(Exception):
    """A request the server refuses, with vLLM's status, message and offending parameter."""

    def __init__(self, message: str, *, status: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param


def error_body(status: int, message: str, param: str | None) -> bytes:
    """vLLM's current error JSON, `{"error": {"message", "type", "param", "code"}}`."""
    error = {"message": message, "type": ERROR_TYPES.get(status, "Error"), "param": param, "code": status}
    return msgspec.json.encode({"error": error})


# Requests.


class StreamOptions(msgspec.Struct, kw_only=True):
    include_usage: bool | None = True
    continuous_usage_stats: bool | None = False


class ContentPart(msgspec.Struct, kw_only=True):
    type: str
    text: str | None = None


class ToolFunction(msgspec.Struct, kw_only=True):
    name: str = ""
    arguments: str = ""


class ToolCall(msgspec.Struct, kw_only=True):
    function: ToolFunction = msgspec.field(default_factory=ToolFunction)


class Message(msgspec.Struct, kw_only=True):
    role: str
    content: str | list[ContentPart] | None = None
    tool_calls: list[ToolCall] | None = None


class _GenerationBody(msgspec.Struct, kw_only=True):
    model: str | None = None
    max_tokens: int | None = None
    min_tokens: int = 0
    ignore_eos: bool = False
    n: int | None = 1
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    return_token_ids: bool | None = False
    cache_salt: str | None = None


class CompletionBody(_GenerationBody, kw_only=True):
    prompt: Any = None


class ChatBody(_GenerationBody, kw_only=True):
    messages: list[Message]
    max_completion_tokens: int | None = None
    add_generation_prompt: bool = True


class TokenizeBody(msgspec.Struct, kw_only=True):
    model: str | None = None
    prompt: str | None = None
    messages: list[Message] | None = None
    add_generation_prompt: bool = True
    return_token_strs: bool | None = False


class DetokenizeBody(msgspec.Struct, kw_only=True):
    model: str | None = None
    tokens: list[int]


def _decode(body: bytes, type_: type[Any]) -> Any:
    if not body:
        raise ClientError("The request body is empty; expected a JSON object.")
    try:
        return msgspec.json.decode(body, type=type_)
    except msgspec.ValidationError as exc:
        raise ClientError(f"Invalid request: {exc}") from None
    except msgspec.DecodeError as exc:
        raise ClientError(f"Invalid JSON in the request body: {exc}") from None


def _check_model(model: str | None, config: EngineConfig) -> None:
    if model is not None and model != config.model_name:
        raise ClientError(
            f"The model `{model}` does not exist. Valid aliases: {config.model_name}.", status=404, param="model"
        )


def _message_pairs(messages: list[Message]) -> list[tuple[str, str]]:
    if not messages:
        raise ClientError("`messages` must not be empty.", param="messages")
    pairs: list[tuple[str, str]] = []
    for index, message in enumerate(messages):
        if message.role not in ROLE_IDS:
            roles = ", ".join(sorted(set(ROLE_IDS)))
            raise ClientError(f"messages[{index}]: unknown role {message.role!r} (one of {roles}).", param="messages")
        texts: list[str] = []
        if isinstance(message.content, str):
            texts.append(message.content)
        elif message.content is not None:
            for part_index, part in enumerate(message.content):
                if part.type != "text" or part.text is None:
                    raise ClientError(
                        f"messages[{index}].content[{part_index}]: only text parts are supported, got {part.type!r}.",
                        param="messages",
                    )
                texts.append(part.text)
        for call in message.tool_calls or ():
            texts += (call.function.name, call.function.arguments)
        pairs.append((message.role, "\n".join(texts)))
    return pairs


def _completion_prompt_ids(prompt: Any, tokenizer: Tokenizer) -> list[int]:
    if isinstance(prompt, list) and prompt and all(isinstance(item, str | list) for item in prompt):
        if len(prompt) > 1:
            raise ClientError(
                f"`prompt` is a batch of {len(prompt)} prompts; the simulator serves one prompt per request "
                "(send them as separate requests).",
                param="prompt",
            )
        prompt = prompt[0]
    if isinstance(prompt, str):
        return tokenizer.encode(prompt)
    if isinstance(prompt, list) and all(type(item) is int for item in prompt):
        _check_token_ids(prompt, tokenizer)
        return prompt
    raise ClientError("`prompt` must be a string, a list of token ids, or a list holding one of those.", param="prompt")


def _check_token_ids(ids: list[int], tokenizer: Tokenizer) -> None:
    if not tokenizer.is_valid(ids):
        bad = next(token for token in ids if not 0 <= token < tokenizer.vocab_size)
        raise ClientError(f"Token id {bad} is out of vocabulary (vocab_size {tokenizer.vocab_size}).")


class Plan(msgspec.Struct, kw_only=True):
    """A validated generation request: what to ask the engine and how to answer."""

    chat: bool
    request_id: str
    created: int
    prompt_ids: array[int]
    """Compact, 4 bytes a token: a list would hold a Python int object per token, ~40 bytes, and the server
    holds every prompt in flight (256 requests of 35k tokens: ~360 MB as lists, ~36 MB as arrays). Ids are
    below the vocabulary size, far below 2³¹."""
    max_tokens: int
    min_tokens: int
    ignore_eos: bool
    cache_salt: str | None
    stream: bool
    include_usage: bool
    continuous_usage: bool
    return_token_ids: bool


def plan_generation(body: bytes, *, chat: bool, config: EngineConfig, tokenizer: Tokenizer) -> Plan:
    """Validate a completions or chat request the way vLLM does (same checks, statuses and messages)."""
    request: CompletionBody | ChatBody = _decode(body, ChatBody if chat else CompletionBody)
    _check_model(request.model, config)
    if request.n not in (None, 1):
        raise ClientError(f"n={request.n} is not supported: the simulator generates one choice (n=1).", param="n")
    if request.stream_options is not None and not request.stream:
        raise ClientError("Stream options can only be defined when `stream=True`.", param="stream_options")
    if request.cache_salt is not None and not request.cache_salt:
        raise ClientError("Parameter 'cache_salt' must be a non-empty string if provided.", param="cache_salt")
    if isinstance(request, ChatBody):
        pairs = _message_pairs(request.messages)
        ids = tokenizer.chat_ids(pairs, add_generation_prompt=request.add_generation_prompt)
        requested = request.max_completion_tokens if request.max_completion_tokens is not None else request.max_tokens
    else:
        if request.prompt is None or request.prompt == "" or request.prompt == []:
            raise ClientError("Either prompt or prompt_embeds must be provided and non-empty.", param="prompt")
        ids = _completion_prompt_ids(request.prompt, tokenizer)
        requested = request.max_tokens
    prompt_ids = array("i", ids)
    text = (
        isinstance(request, ChatBody)
        or isinstance(request.prompt, str)
        or (isinstance(request.prompt, list) and bool(request.prompt) and isinstance(request.prompt[0], str))
    )
    max_tokens = _max_tokens(requested, len(prompt_ids), config.max_model_len, text=text)
    if request.min_tokens < 0:
        raise ClientError(f"min_tokens must be greater than or equal to 0, got {request.min_tokens}.")
    if request.min_tokens > max_tokens:
        # vLLM checks after clamping max_tokens to the context: a prompt near the end of it fails here.
        raise ClientError(
            f"min_tokens must be less than or equal to max_tokens={max_tokens}, got {request.min_tokens}."
        )
    options = request.stream_options
    include_usage = bool(request.stream and options is not None and options.include_usage)
    return Plan(
        chat=chat,
        request_id=f"{'chatcmpl' if chat else 'cmpl'}-{os.urandom(16).hex()}",
        created=int(time.time()),
        prompt_ids=prompt_ids,
        max_tokens=max_tokens,
        min_tokens=request.min_tokens,
        ignore_eos=request.ignore_eos,
        cache_salt=request.cache_salt,
        stream=bool(request.stream),
        include_usage=include_usage,
        continuous_usage=include_usage and bool(options and options.continuous_usage_stats),
        return_token_ids=bool(request.return_token_ids),
    )


def _max_tokens(requested: int | None, prompt_len: int, max_model_len: int, *, text: bool) -> int:
    """vLLM 0.32's output budget (`get_max_tokens`): the request's, clamped to what the context has left; a prompt
    over the context is a 400 (a text prompt is counted only up to one token past it, as vLLM's tokenizer
    truncates it there: "at least"), and one that fills it leaves a budget of 0, which is refused."""
    if prompt_len == 0:
        raise ClientError("The prompt is empty (it has no tokens).", param="prompt")
    if prompt_len > max_model_len:
        counted = max_model_len + 1 if text else prompt_len
        qualifier = "at least " if counted == max_model_len + 1 else ""
        raise ClientError(
            f"This model's maximum context length is {max_model_len} tokens. However, your prompt contains "
            f"{qualifier}{counted} input tokens, which exceeds this limit even without any output tokens. Please "
            f"reduce the length of the input prompt. (parameter=input_tokens, value={counted})",
            param="input_tokens",
        )
    budget = max_model_len - prompt_len if requested is None else min(requested, max_model_len - prompt_len)
    if budget < 1:
        value = budget if requested is None or requested >= 1 else requested
        raise ClientError(
            f"max_tokens must be at least 1, got {value}. (parameter=max_tokens, value={value})", param="max_tokens"
        )
    return budget


# Streamed events: constant parts around the per-chunk text, ids and usage.

DONE: Final = b"data: [DONE]\n\n"
FINISH_TAILS: Final[dict[bool, dict[FinishReason | None, bytes]]] = {
    False: {
        None: b'","logprobs":null,"finish_reason":null,"stop_reason":null',
        "stop": b'","logprobs":null,"finish_reason":"stop","stop_reason":null',
        "length": b'","logprobs":null,"finish_reason":"length","stop_reason":null',
    },
    True: {
        None: b'"},"logprobs":null,"finish_reason":null',
        "stop": b'"},"logprobs":null,"finish_reason":"stop","stop_reason":null',
        "length": b'"},"logprobs":null,"finish_reason":"length","stop_reason":null',
    },
}
"""After a chunk's text: completions (False) and chat (True), by finish reason."""
DELTA_HEADS: Final = {False: b'{"index":0,"text":"', True: b'{"index":0,"delta":{"content":"'}
"""Before a chunk's text."""


def envelope(plan: Plan, model_name: str) -> bytes:
    """`data: {"id", "object", "created", "model", "choices":[` of every event of the stream."""
    obj = b"chat.completion.chunk" if plan.chat else b"text_completion"
    return b'data: {"id":"%s","object":"%s","created":%d,"model":%s,"choices":[' % (
        plan.request_id.encode(),
        obj,
        plan.created,
        msgspec.json.encode(model_name),
    )


def usage_field(prompt_tokens: int, completion_tokens: int, cached_tokens: int | None = None) -> bytes:
    """`,"usage":{...}` in vLLM's field order; `prompt_tokens_details` only when `cached_tokens` is given (the final
    usage, unless the server leaves it out)."""
    total = prompt_tokens + completion_tokens
    if cached_tokens is None:
        return b',"usage":{"prompt_tokens":%d,"total_tokens":%d,"completion_tokens":%d}' % (
            prompt_tokens,
            total,
            completion_tokens,
        )
    return (
        b',"usage":{"prompt_tokens":%d,"total_tokens":%d,"completion_tokens":%d,'
        % (
            prompt_tokens,
            total,
            completion_tokens,
        )
        + b'"prompt_tokens_details":{"cached_tokens":%d}}' % cached_tokens
    )


_ROLE_CHOICE: Final = b'{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]'


def role_event(plan: Plan, envelope_bytes: bytes) -> bytes:
    """The chat stream's first event: the assistant role with empty content (and the prompt's ids)."""
    parts = [envelope_bytes, _ROLE_CHOICE]
    if plan.continuous_usage:
        parts.append(usage_field(len(plan.prompt_ids), 0))
    if plan.return_token_ids:
        parts += (b',"prompt_token_ids":', msgspec.json.encode(plan.prompt_ids.tolist()))
    parts.append(b"}\n\n")
    return b"".join(parts)


def malformed_event(envelope_bytes: bytes) -> bytes:
    """An event whose JSON is cut short: the injected malformed line."""
    return envelope_bytes + b'{"index":0,\n\n'


# Whole responses.


def _usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int | None) -> dict[str, Any]:
    usage: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
    }
    if cached_tokens is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    return usage


def full_response(
    plan: Plan,
    text: str,
    token_ids: list[int],
    finish_reason: FinishReason,
    cached_tokens: int | None,
    model_name: str,
    *,
    prompt_tokens: int | None = None,
) -> bytes:
    """The non-streaming response body; its usage has no `prompt_tokens_details` when `cached_tokens` is None, and
    counts `prompt_tokens` (default: the prompt's)."""
    ids = token_ids if plan.return_token_ids else None
    prompt_ids = plan.prompt_ids.tolist() if plan.return_token_ids else None
    usage = _usage(len(plan.prompt_ids) if prompt_tokens is None else prompt_tokens, len(token_ids), cached_tokens)
    head = {"id": plan.request_id, "object": "", "created": plan.created, "model": model_name}
    tail = {"service_tier": None, "system_fingerprint": None, "usage": usage}
    if plan.chat:
        message = {"role": "assistant", "content": text, "refusal": None, "annotations": None, "audio": None}
        choice: dict[str, Any] = {
            "index": 0,
            "message": {**message, "function_call": None},
            "logprobs": None,
            "finish_reason": finish_reason,
            "stop_reason": None,
            "token_ids": ids,
        }
        response = {**head, "object": "chat.completion", "choices": [choice], **tail}
        response |= {"prompt_logprobs": None, "prompt_token_ids": prompt_ids, "kv_transfer_params": None}
    else:
        choice = {
            "index": 0,
            "text": text,
            "logprobs": None,
            "finish_reason": finish_reason,
            "stop_reason": None,
            "token_ids": ids,
            "prompt_logprobs": None,
            "prompt_token_ids": prompt_ids,
        }
        response = {**head, "object": "text_completion", "choices": [choice], **tail, "kv_transfer_params": None}
    return msgspec.json.encode(response)


def model_list(config: EngineConfig, created: int) -> bytes:
    """`GET /v1/models`: the one served model, as vLLM lists it."""
    permission = {
        "id": f"modelperm-{os.urandom(16).hex()}",
        "object": "model_permission",
        "created": created,
        "allow_create_engine": False,
        "allow_sampling": True,
        "allow_logprobs": True,
        "allow_search_indices": False,
        "allow_view": True,
        "allow_fine_tuning": False,
        "organization": "*",
        "group": None,
        "is_blocking": False,
    }
    card = {
        "id": config.model_name,
        "object": "model",
        "created": created,
        "owned_by": "vllm",
        "root": config.model_name,
        "parent": None,
        "max_model_len": config.max_model_len,
        "permission": [permission],
    }
    return msgspec.json.encode({"object": "list", "data": [card]})


def tokenize(body: bytes, *, config: EngineConfig, tokenizer: Tokenizer) -> bytes:
    """`POST /tokenize`: `{"prompt"}` or `{"messages"}` → `{"count", "max_model_len", "tokens", "token_strs"}`."""
    request: TokenizeBody = _decode(body, TokenizeBody)
    _check_model(request.model, config)
    if (request.prompt is None) == (request.messages is None):
        raise ClientError("Give exactly one of `prompt` (text) and `messages` (chat).")
    if request.messages is not None:
        pairs = _message_pairs(request.messages)
        ids = tokenizer.chat_ids(pairs, add_generation_prompt=request.add_generation_prompt)
    else:
        ids = tokenizer.encode(request.prompt or "")
    strs = [tokenizer.words[token] for token in ids] if request.return_token_strs else None
    return msgspec.json.encode(
        {"count": len(ids), "max_model_len": config.max_model_len, "tokens": ids, "token_strs": strs}
    )


def detokenize(body: bytes, *, config: EngineConfig, tokenizer: Tokenizer) -> bytes:
    """`POST /detokenize`: `{"tokens": [...]}` → `{"prompt": "..."}`."""
    request: DetokenizeBody = _decode(body, DetokenizeBody)
    _check_model(request.model, config)
    _check_token_ids(request.tokens, tokenizer)
    return msgspec.json.encode({"prompt": tokenizer.decode(request.tokens)})
