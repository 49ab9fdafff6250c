"""Server settings that force an inference engine to accept draft tokens at a given acceptance length (AL).

AL is the mean number of tokens a verification step emits, the bonus token included, so AL ∈ [1, K+1]
for K draft tokens. Every engine below realizes it with vLLM's minimum-variance schedule (floor(AL-1)
drafts always accepted, one more with probability frac(AL-1)) unless a note says otherwise.

Names verified against each engine's source: vLLM `--speculative-config` keys `rejection_sample_method`,
`synthetic_acceptance_length`, `synthetic_acceptance_rates`; SGLang `SGLANG_SIMULATE_ACC_LEN/_METHOD/
_TOKEN_MODE` and `--speculative-num-steps/-eagle-topk/-num-draft-tokens`; TensorRT-LLM
`TLLM_SPEC_DECODE_FORCE_NUM_ACCEPTED_TOKENS`; ATOM `--spec-decode-acceptance-length/-rate`;
llama.cpp `--spec-synth-len/-rates` and `--spec-draft-n-max`.
"""

from __future__ import annotations

import json
import math
import shlex
from typing import Final

import msgspec

from agentx.engines import ENGINES
from agentx.sim.engine.speculative import acceptance_schedule, validate_acceptance_rates

# SGLang spells algorithms in upper case and calls MTP "NEXTN" (it runs it as EAGLE).
_SGLANG_ALGORITHMS: Final = {"mtp": "NEXTN", "nextn": "NEXTN", "eagle": "EAGLE", "eagle3": "EAGLE3", "dspark": "DSPARK"}

# llama.cpp prefixes the speculative types that run a draft model with "draft-".
_LLAMACPP_TYPES: Final = {
    "mtp": "draft-mtp",
    "eagle3": "draft-eagle3",
    "dflash": "draft-dflash",
    "draft": "draft-simple",
}

_NO_RATES_FORM: Final = "{engine} has no per-position rates setting; --rates is ignored and the length is used"


class EngineSettings(msgspec.Struct, frozen=True, kw_only=True):
    """One engine's configuration for a forced acceptance length."""

    engine: str
    acceptance_length: float
    spec_k: int
    method: str | None
    schedule: tuple[float, ...]
    """Per-position conditional acceptance rates realizing the AL (vLLM's minimum-variance schedule)."""
    args: list[str]
    """Server command-line arguments, unquoted (one list item per argv word)."""
    env: dict[str, str]
    """Environment variables to export before starting the server."""
    notes: list[str]


def number_text(value: float) -> str:
    """`value` as the shortest decimal an engine parses back exactly: 2 (not 2.0), 2.78 (not 2.7800000000000002)."""
    # 12 decimals drop float noise from AL - 1 and (AL - 1) / K while keeping far more precision than sampling has.
    rounded = round(value, 12)
    return str(int(rounded)) if rounded.is_integer() else repr(rounded)


def _check(engine: str, acceptance_length: float, spec_k: int) -> None:
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}; choose one of: {', '.join(ENGINES)}")
    if spec_k < 1:
        raise ValueError(f"K (draft tokens per step) must be >= 1, got {spec_k}")
    if not (math.isfinite(acceptance_length) and 1.0 <= acceptance_length <= spec_k + 1):
        raise ValueError(
            f"acceptance length must be in [1, K+1] = [1, {spec_k + 1}] for K={spec_k}, got {acceptance_length}"
        )


def _vllm(al: float, k: int, method: str | None, schedule: tuple[float, ...], as_rates: bool) -> EngineSettings:
    config: dict[str, object] = {}
    if method:
        config["method"] = method
    config["num_speculative_tokens"] = k
    config["rejection_sample_method"] = "synthetic"
    # vLLM takes the length or the rates, never both.
    if as_rates:
        config["synthetic_acceptance_rates"] = list(validate_acceptance_rates(schedule, k))
    else:
        config["synthetic_acceptance_length"] = round(al, 12)
    notes = ["vLLM derives the same per-position schedule from the length; --rates passes it explicitly"]
    if not method:
        notes.append('add "method" (e.g. mtp, eagle3, dspark) and the draft "model" your checkpoint needs')
    return EngineSettings(
        engine="vllm",
        acceptance_length=al,
        spec_k=k,
        method=method,
        schedule=schedule,
        args=["--speculative-config", json.dumps(config, separators=(",", ":"))],
        env={},
        notes=notes,
    )


def _sglang(al: float, k: int, method: str | None, schedule: tuple[float, ...], as_rates: bool) -> EngineSettings:
    algorithm = _SGLANG_ALGORITHMS.get(method.lower(), method.upper()) if method else None
    args = ["--speculative-algorithm", algorithm] if algorithm else []
    if algorithm == "DSPARK":
        # DSpark drafts a block of K tokens and has no step/top-k knobs.
        args += ["--speculative-dspark-block-size", str(k)]
    else:
        # A chain (top-k 1) of K draft steps; SGLang counts the verified root token among the draft tokens.
        args += ["--speculative-num-steps", str(k), "--speculative-eagle-topk", "1"]
        args += ["--speculative-num-draft-tokens", str(k + 1)]
    notes = [
        "match-expected emits floor(AL) or ceil(AL) tokens per step with the mean AL (the schedule shown)",
        "SGLANG_SIMULATE_ACC_TOKEN_MODE=real-draft-token is required: without it SGLang emits a fixed token id "
        "(100), which can decode to U+FFFD and stall the text stream until the response ends",
    ]
    if not method:
        notes.append("add --speculative-algorithm (EAGLE, EAGLE3, NEXTN for MTP, DSPARK) and any draft model path")
    if as_rates:
        notes.append(_NO_RATES_FORM.format(engine="SGLang"))
    return EngineSettings(
        engine="sglang",
        acceptance_length=al,
        spec_k=k,
        method=method,
        schedule=schedule,
        args=args,
        env={
            "SGLANG_SIMULATE_ACC_LEN": number_text(al),
            "SGLANG_SIMULATE_ACC_METHOD": "match-expected",
            "SGLANG_SIMULATE_ACC_TOKEN_MODE": "real-draft-token",
        },
        notes=notes,
    )


def _trtllm(al: float, k: int, method: str | None, schedule: tuple[float, ...], as_rates: bool) -> EngineSettings:
    if al == 1.0:
        # TensorRT-LLM reads 0 as "not set" and falls back to real acceptance.
        raise ValueError(
            "TensorRT-LLM cannot force AL 1: TLLM_SPEC_DECODE_FORCE_NUM_ACCEPTED_TOKENS=0 (AL-1) means 'off' "
            "and runs real acceptance; use an AL above 1 or disable speculative decoding"
        )
    notes = [
        "the variable counts accepted draft tokens only (no bonus token), hence AL-1",
        f"set the draft length to K={k} in the speculative_config of --extra_llm_api_options "
        "(max_draft_len, or num_nextn_predict_layers for MTP)",
    ]
    if not float(al - 1).is_integer():
        # Emitted unrounded: current releases accept a fraction with the same meaning as the schedule;
        # rounding would move every engine but this one off the published AL.
        notes.append(
            "a fractional value needs a TensorRT-LLM release with fractional forcing (integer part always, "
            "fraction = probability of one more draft); older releases parse it with int(), reject it and "
            "silently run real acceptance"
        )
    if as_rates:
        notes.append(_NO_RATES_FORM.format(engine="TensorRT-LLM"))
    return EngineSettings(
        engine="trtllm",
        acceptance_length=al,
        spec_k=k,
        method=method,
        schedule=schedule,
        args=[],
        env={"TLLM_SPEC_DECODE_FORCE_NUM_ACCEPTED_TOKENS": number_text(al - 1)},
        notes=notes,
    )


def _atom(al: float, k: int, method: str | None, schedule: tuple[float, ...], as_rates: bool) -> EngineSettings:
    args = ["--method", method] if method else []
    args += ["--num-speculative-tokens", str(k)]
    # The two ATOM flags are exclusive; the rate is the mean over all K positions, (AL-1)/K.
    if as_rates:
        args += ["--spec-decode-acceptance-rate", number_text((al - 1) / k)]
    else:
        args += ["--spec-decode-acceptance-length", number_text(al)]
    notes = [] if method else ["add --method (e.g. mtp, eagle3, dspark) and --draft-model if your checkpoint needs one"]
    return EngineSettings(
        engine="atom", acceptance_length=al, spec_k=k, method=method, schedule=schedule, args=args, env={}, notes=notes
    )


def _llamacpp(al: float, k: int, method: str | None, schedule: tuple[float, ...], as_rates: bool) -> EngineSettings:
    spec_type = _LLAMACPP_TYPES.get(method.lower(), method) if method else None
    args = ["--spec-type", spec_type] if spec_type else []
    args += ["--spec-draft-n-max", str(k)]
    notes = ["llama.cpp never accepts a drafted end-of-generation token, so the measured AL can fall slightly short"]
    if as_rates:
        # Unconditional P(position i accepted); for this schedule they equal the conditional rates.
        args += ["--spec-synth-rates", ",".join(number_text(rate) for rate in schedule)]
    else:
        args += ["--spec-synth-len", number_text(al)]
        notes.append(
            "--spec-synth-len spreads the AL geometrically (one conditional rate p with p + ... + p^K = AL-1), "
            "not as the schedule shown; pass --rates for the same per-position schedule as the other engines"
        )
    if not method:
        notes.append("add --spec-type (draft-mtp, draft-eagle3, draft-simple, ...) and -md with the draft model")
    notes.append("older builds name the draft length --draft-max")
    return EngineSettings(
        engine="llamacpp",
        acceptance_length=al,
        spec_k=k,
        method=method,
        schedule=schedule,
        args=args,
        env={},
        notes=notes,
    )


_BUILDERS: Final = {"vllm": _vllm, "sglang": _sglang, "trtllm": _trtllm, "atom": _atom, "llamacpp": _llamacpp}


def engine_settings(
    engine: str, acceptance_length: float, spec_k: int, method: str | None = None, *, as_rates: bool = False
) -> EngineSettings:
    """The server settings forcing AL = `acceptance_length` with K = `spec_k` draft tokens on `engine`.

    `method` (mtp, eagle3, dspark, ...) is passed to the engine's method setting when given; `as_rates` asks
    for the per-position rates form where the engine has one (vLLM, llama.cpp; ATOM: the mean rate).
    Raises ValueError for an unknown engine, K < 1 or AL outside [1, K+1].
    """
    _check(engine, acceptance_length, spec_k)
    schedule = acceptance_schedule(acceptance_length, spec_k)
    return _BUILDERS[engine](float(acceptance_length), spec_k, method or None, schedule, as_rates)


def shell_lines(settings: EngineSettings) -> list[str]:
    """`settings` as paste-ready shell: `export` lines, the server arguments quoted on one line, `#` comments."""
    schedule = " ".join(number_text(rate) for rate in settings.schedule)
    lines = [
        f"# {settings.engine}: AL {number_text(settings.acceptance_length)} with K={settings.spec_k} draft tokens",
        f"# per-position acceptance schedule: {schedule}",
    ]
    lines += [f"export {name}={shlex.quote(value)}" for name, value in settings.env.items()]
    if settings.args:
        lines.append(shlex.join(settings.args))
    lines += [f"# note: {note}" for note in settings.notes]
    return lines
