"""A logging stand-in for an OpenAI-compatible inference server (aiohttp), for the differential suite.

    python reference_tests/standin.py --port P --log FILE [--max-model-len N] [--tokenizer DIR]

Endpoints: `GET /v1/models`, `POST /v1/chat/completions` and `/v1/completions` (streamed SSE or not),
`POST /tokenize` and `/detokenize` (vLLM style), `GET /metrics` (Prometheus text), `/version`, `/health`.

A generation emits exactly the asked `max_completion_tokens` (else `max_tokens`, else 16) words, one token
each, `--chunk-tokens` per chunk, the first chunk after `--ttft-ms` and each next one after
`--tpot-ms` per token; the final chunk carries `usage` (prompt tokens counted by the word tokenizer of
`wordtok.py`, the chat template's tags included, completion tokens, `prompt_tokens_details.cached_tokens`
0). With `--max-model-len N`, a prompt above N tokens gets HTTP 400 with vLLM's "maximum context length"
message.

**The log** (JSON lines, appended and flushed as things happen): one `"event": "arrive"` line per
generation request as it arrives (wall `time.time_ns()` and `time.monotonic_ns()`, every header except
Authorization, the body's model, message roles, max tokens asked and under which field, prompt tokens,
the cache-bust marker found at the start of the first user message, and a few first words), then one
`"event": "end"` line with the same `seq` when its response ends (times, HTTP status, tokens sent).
`read_log` merges them into one dict per request.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any, Final

import wordtok  # the script's own folder is first on sys.path (and pytest's rootdir-relative import)
from aiohttp import web

RID_MARKER: Final = re.compile(r"\[rid:([0-9A-Za-z]+)\]")
"""The reference's cache-bust marker, `[rid:<12 hex>]` (aiperf.timing.strategies.cache_bust)."""
AGENTX_HEAD: Final = "ok"
"""agentx's chat messages open with this head word; its marker is the next `AGENTX_MARKER_WORDS` words."""
AGENTX_MARKER_WORDS: Final = 4
OUTPUT_WORDS: Final = ("tok", "the", "of", "and", "to", "in")
DEFAULT_MAX_TOKENS: Final = 16
HEADERS_SKIPPED: Final = frozenset({"authorization"})


def find_marker(messages: Sequence[Mapping[str, Any]]) -> tuple[str | None, str | None, str]:
    """(kind, marker, first words) of the first user message: kind "rid" for the reference's
    `[rid:…]` at its start, "agentx" for agentx's head followed by its marker words, else None."""
    for message in messages:
        if message.get("role") != "user":
            continue
        text = wordtok.message_text(message.get("content"))
        head = text[:200]
        first_words = " ".join(head.split()[:8])
        match = RID_MARKER.search(head)
        if match is not None and match.start() <= 2:
            return "rid", match.group(1), first_words
        words = text[:400].split()
        if len(words) > AGENTX_MARKER_WORDS and words[0] == AGENTX_HEAD:
            return "agentx", " ".join(words[1 : 1 + AGENTX_MARKER_WORDS]), first_words
        return None, None, first_words
    return None, None, ""


class StandIn:
    def __init__(
        self,
        log: IO[str],
        *,
        model: str,
        ttft_s: float,
        tpot_s: float,
        chunk_tokens: int,
        max_model_len: int | None,
        vocab: list[str],
    ) -> None:
        self.log = log
        self.model = model
        self.ttft_s = ttft_s
        self.tpot_s = tpot_s
        self.chunk_tokens = max(1, chunk_tokens)
        self.max_model_len = max_model_len
        self.vocab = vocab
        self.ids = {word: i for i, word in enumerate(vocab)}
        self.seq = 0
        self.running = 0
        self.counters = {"requests": 0, "prompt_tokens": 0, "generation_tokens": 0, "errors": 0}

    # -- log

    def write(self, entry: Mapping[str, Any]) -> None:
        self.log.write(json.dumps(entry, separators=(",", ":")) + "\n")
        self.log.flush()

    # -- tokens

    def encode(self, text: str) -> list[int]:
        unk = self.ids[wordtok.UNK]
        return [self.ids.get(piece, unk) for piece in wordtok.pieces(text)]

    def encode_messages(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool) -> list[int]:
        unk = self.ids[wordtok.UNK]
        ids: list[int] = []
        for message in messages:
            role = str(message.get("role", "user"))
            ids.append(self.ids.get(wordtok.ROLE_TAGS.get(role, ""), unk))
            ids.extend(self.encode(wordtok.message_text(message.get("content"))))
        if add_generation_prompt:
            ids.append(self.ids[wordtok.ROLE_TAGS["assistant"]])
        return ids

    # -- handlers

    async def models(self, request: web.Request) -> web.Response:
        card = {"id": self.model, "object": "model", "owned_by": "standin", "max_model_len": self.max_model_len}
        return web.json_response({"object": "list", "data": [card]})

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": "standin 1.0"})

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def metrics(self, request: web.Request) -> web.Response:
        c = self.counters
        text = (
            "# TYPE vllm:num_requests_running gauge\n"
            f'vllm:num_requests_running{{model_name="{self.model}"}} {self.running}\n'
            "# TYPE vllm:request_success_total counter\n"
            f'vllm:request_success_total{{model_name="{self.model}"}} {c["requests"]}\n'
            "# TYPE vllm:prompt_tokens_total counter\n"
            f'vllm:prompt_tokens_total{{model_name="{self.model}"}} {c["prompt_tokens"]}\n'
            "# TYPE vllm:generation_tokens_total counter\n"
            f'vllm:generation_tokens_total{{model_name="{self.model}"}} {c["generation_tokens"]}\n'
        )
        return web.Response(text=text, content_type="text/plain")

    async def tokenize(self, request: web.Request) -> web.Response:
        body = await request.json()
        if "messages" in body:
            ids = self.encode_messages(body["messages"], bool(body.get("add_generation_prompt", True)))
        else:
            prompt = body.get("prompt", body.get("content", ""))
            ids = list(prompt) if isinstance(prompt, list) else self.encode(str(prompt))
        return web.json_response({"tokens": ids, "count": len(ids), "max_model_len": self.max_model_len or 1 << 20})

    async def detokenize(self, request: web.Request) -> web.Response:
        body = await request.json()
        ids = body.get("tokens", [])
        if any(not isinstance(i, int) or i < 0 or i >= len(self.vocab) for i in ids):
            return web.json_response({"error": {"message": "token id out of range"}}, status=400)
        return web.json_response({"prompt": " ".join(self.vocab[i] for i in ids)})

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self.generate(request, chat=True)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self.generate(request, chat=False)

    async def generate(self, request: web.Request, *, chat: bool) -> web.StreamResponse:
        wall, mono = time.time_ns(), time.monotonic_ns()
        self.seq += 1
        seq = self.seq
        try:
            body = await request.json()
        except ValueError:
            body = {}
        if chat:
            messages = body.get("messages") or []
            prompt_tokens = wordtok.chat_prompt_tokens(messages)
            roles = [str(m.get("role")) for m in messages]
            marker_kind, marker, first_words = find_marker(messages)
            unknown = sum(wordtok.message_text(m.get("content")).count(wordtok.UNK) for m in messages)
        else:
            prompt = body.get("prompt", "")
            prompt_tokens = len(prompt) if isinstance(prompt, list) else wordtok.count_tokens(str(prompt))
            roles, marker_kind, marker = [], None, None
            first_words = "" if isinstance(prompt, list) else " ".join(str(prompt)[:200].split()[:8])
            unknown = 0 if isinstance(prompt, list) else str(prompt).count(wordtok.UNK)
        if body.get("max_completion_tokens") is not None:
            max_field, asked = "max_completion_tokens", body["max_completion_tokens"]
        elif body.get("max_tokens") is not None:
            max_field, asked = "max_tokens", body["max_tokens"]
        else:
            max_field, asked = None, None
        n_out = DEFAULT_MAX_TOKENS if asked is None else max(0, int(asked))
        stream = bool(body.get("stream"))
        stream_options = body.get("stream_options") or {}
        self.write(
            {
                "event": "arrive",
                "seq": seq,
                "path": request.path,
                "arrive_wall_ns": wall,
                "arrive_mono_ns": mono,
                "headers": {k: v for k, v in request.headers.items() if k.lower() not in HEADERS_SKIPPED},
                "model": body.get("model"),
                "roles": roles,
                "max_tokens": asked,
                "max_tokens_field": max_field,
                "both_max_fields": {
                    "max_tokens": body.get("max_tokens"),
                    "max_completion_tokens": body.get("max_completion_tokens"),
                },
                "prompt_tokens": prompt_tokens,
                "marker_kind": marker_kind,
                "marker": marker,
                "first_words": first_words,
                "unknown_words": unknown,
                "stream": stream,
                "include_usage": bool(stream_options.get("include_usage")),
                "ignore_eos": body.get("ignore_eos"),
                "extra_keys": sorted(set(body) - {"model", "messages", "prompt", "stream", "stream_options"}),
            }
        )
        self.running += 1
        status, sent = 200, 0
        try:
            if self.max_model_len is not None and prompt_tokens > self.max_model_len:
                status = 400
                message = (
                    f"This model's maximum context length is {self.max_model_len} tokens. However, your request "
                    f"has {prompt_tokens} input tokens. Please reduce the length of the input messages."
                )
                error = {"object": "error", "message": message, "type": "BadRequestError", "param": None, "code": 400}
                self.counters["errors"] += 1
                return web.json_response({"error": error, **error}, status=400)
            response, sent = await self.answer(request, chat, stream, n_out, prompt_tokens, stream_options)
            self.counters["requests"] += 1
            self.counters["prompt_tokens"] += prompt_tokens
            self.counters["generation_tokens"] += sent
            return response
        except (ConnectionResetError, asyncio.CancelledError):
            status = 499
            raise
        finally:
            self.running -= 1
            self.write(
                {
                    "event": "end",
                    "seq": seq,
                    "end_wall_ns": time.time_ns(),
                    "end_mono_ns": time.monotonic_ns(),
                    "status": status,
                    "completion_tokens": sent,
                }
            )

    def usage(self, prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
        return {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": 0},
        }

    async def answer(
        self,
        request: web.Request,
        chat: bool,
        stream: bool,
        n_out: int,
        prompt_tokens: int,
        stream_options: Mapping[str, Any],
    ) -> tuple[web.StreamResponse, int]:
        rid = f"standin-{self.seq}"
        created = int(time.time())
        words = [OUTPUT_WORDS[i % len(OUTPUT_WORDS)] for i in range(n_out)]
        if not stream:
            await asyncio.sleep(self.ttft_s + self.tpot_s * n_out)
            text = "".join(" " + w for w in words)
            choice: dict[str, Any] = (
                {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}
                if chat
                else {"index": 0, "text": text, "finish_reason": "length"}
            )
            payload = {
                "id": rid,
                "object": "chat.completion" if chat else "text_completion",
                "created": created,
                "model": self.model,
                "choices": [choice],
                "usage": self.usage(prompt_tokens, n_out),
            }
            return web.json_response(payload), n_out
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        kind = "chat.completion.chunk" if chat else "text_completion"
        continuous = bool(stream_options.get("continuous_usage_stats"))

        def chunk(text: str | None, finish: str | None, sent: int, first: bool) -> bytes:
            if chat:
                delta: dict[str, Any] = {"role": "assistant", "content": text or ""} if first else {"content": text}
                choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            else:
                choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
            data: dict[str, Any] = {"id": rid, "object": kind, "created": created, "model": self.model}
            data["choices"] = [choice]
            if continuous:
                data["usage"] = self.usage(prompt_tokens, sent)
            return b"data: " + json.dumps(data).encode() + b"\n\n"

        await asyncio.sleep(self.ttft_s)
        sent = 0
        first = True
        while sent < n_out or first:
            take = min(self.chunk_tokens, n_out - sent)
            if not first and take > 0:
                await asyncio.sleep(self.tpot_s * take)
            text = "".join(" " + w for w in words[sent : sent + take])
            sent += take
            await response.write(chunk(text, "length" if sent >= n_out else None, sent, first))
            first = False
        if stream_options.get("include_usage"):
            final = {"id": rid, "object": kind, "created": created, "model": self.model, "choices": []}
            final["usage"] = self.usage(prompt_tokens, sent)
            await response.write(b"data: " + json.dumps(final).encode() + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response, sent


def make_app(server: StandIn) -> web.Application:
    app = web.Application(client_max_size=1 << 30)
    app.router.add_get("/v1/models", server.models)
    app.router.add_get("/version", server.version)
    app.router.add_get("/health", server.health)
    app.router.add_get("/metrics", server.metrics)
    app.router.add_post("/tokenize", server.tokenize)
    app.router.add_post("/detokenize", server.detokenize)
    app.router.add_post("/v1/chat/completions", server.chat)
    app.router.add_post("/v1/completions", server.completions)
    return app


def load_vocab(directory: Path | None) -> list[str]:
    """The vocabulary of `DIR/tokenizer.json` (ids in order), else the built-in words."""
    if directory is None:
        return wordtok.vocabulary([])
    data = json.loads((directory / "tokenizer.json").read_text())
    vocab: dict[str, int] = data["model"]["vocab"]
    return [word for word, _ in sorted(vocab.items(), key=lambda item: item[1])]


def read_log(path: Path) -> list[dict[str, Any]]:
    """The log's requests, one dict each (arrive fields, then end fields; `end_*` absent if it never ended)."""
    requests: dict[int, dict[str, Any]] = {}
    if not path.exists():
        return []
    with path.open() as f:
        for line in f:
            try:
                entry = json.loads(line)
            except ValueError:
                continue  # a torn last line
            seq = entry.get("seq")
            if not isinstance(seq, int):
                continue
            merged = requests.setdefault(seq, {})
            merged.update({k: v for k, v in entry.items() if k != "event"})
    return [requests[seq] for seq in sorted(requests)]


async def serve(server: StandIn, host: str, port: int) -> None:
    """Serve until killed; print the bound URL first (`--port 0` picks a free port)."""
    runner = web.AppRunner(make_app(server), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = runner.addresses[0][1]
    print(f"listening on http://{host}:{bound} pid {os.getpid()}", flush=True)
    await asyncio.Event().wait()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="A logging stand-in for an OpenAI-compatible server.")
    parser.add_argument("--port", type=int, required=True, help="0: a free port (printed)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--log", type=Path, required=True)
    parser.add_argument("--model", default="standin-model")
    parser.add_argument("--ttft-ms", type=float, default=20.0)
    parser.add_argument("--tpot-ms", type=float, default=1.0)
    parser.add_argument("--chunk-tokens", type=int, default=4)
    parser.add_argument("--max-model-len", type=int, default=None)
    parser.add_argument("--tokenizer", type=Path, default=None, help="a wordtok tokenizer directory (its vocab)")
    args = parser.parse_args(argv)
    with args.log.open("a", buffering=1) as log:
        server = StandIn(
            log,
            model=args.model,
            ttft_s=args.ttft_ms / 1000,
            tpot_s=args.tpot_ms / 1000,
            chunk_tokens=args.chunk_tokens,
            max_model_len=args.max_model_len,
            vocab=load_vocab(args.tokenizer),
        )
        asyncio.run(serve(server, args.host, args.port))


if __name__ == "__main__":
    main()
