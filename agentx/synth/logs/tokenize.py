"""Tokenizers for from-logs: a built-in deterministic approximation, or a `tokenizer.json` file.

A tokenizer turns text into a list of token strings; prompts are cut into blocks of those and the
blocks hashed, so only equality of tokens matters, never their ids.

The built-in approximation splits text into pieces the way BPE vocabularies for English and code
roughly do: letters in runs of at most 4 (with one leading space), digits in runs of at most 3,
punctuation in pairs, whitespace in runs of at most 8. That is about 4 characters per token on
prose; every character lands in exactly one piece, so `"".join(encode(text)) == text` and any edit
changes some piece.
"""

from __future__ import annotations

import os
import re
from typing import Protocol

_PIECE = re.compile(r" ?[^\W\d_]{1,4}| ?\d{1,3}| ?[^\w\s]{1,2}| ?_{1,2}|\s{1,8}")

BUILTIN_NAME = "agentx-approx-v1"


class Tokenizer(Protocol):
    """Text → token strings; `exact` says whether counts match a real model's tokenizer."""

    name: str
    exact: bool

    def encode(self, text: str) -> list[str]: ...


class ApproxTokenizer:
    """The built-in deterministic approximation (no dependency, millions of tokens per second)."""

    name = BUILTIN_NAME
    exact = False

    def encode(self, text: str) -> list[str]:
        return _PIECE.findall(text)


class FileTokenizer:
    """A Hugging Face `tokenizer.json` through the optional `tokenizers` package (agentx-replay[tokenizer])."""

    exact = True

    def __init__(self, path: str | os.PathLike[str]) -> None:
        try:
            from tokenizers import Tokenizer as HfTokenizer
        except ImportError as exc:  # the extra is optional: say how to get it
            raise ValueError(
                "--tokenizer needs the optional tokenizers package: pip install 'agentx-replay[tokenizer]'"
            ) from exc
        try:
            self._tokenizer = HfTokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises a bare Exception on a bad file
            raise ValueError(f"{path}: not a usable tokenizer.json ({exc})") from exc
        self.name = "tokenizer.json"  # the file name may be private: never recorded

    def encode(self, text: str) -> list[str]:
        tokens: list[str] = self._tokenizer.encode(text, add_special_tokens=False).tokens
        return tokens


def load_tokenizer(path: str | os.PathLike[str] | None) -> Tokenizer:
    """The tokenizer in `path`, or the built-in approximation when None."""
    return ApproxTokenizer() if path is None else FileTokenizer(path)
