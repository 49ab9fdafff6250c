"""vLLM's synthetic speculative acceptance on its CPU build (test infrastructure of agentx's vLLM suite, not part of
agentx).

vLLM 0.32.0 forces an acceptance schedule with `--speculative-config '{"rejection_sample_method": "synthetic",
...}'`: its two rejection-sampler kernels (`vllm/v1/sample/rejection_sampler.py`, `rejection_greedy_sample_kernel`,
`rejection_random_sample_kernel`) accept draft position i while a uniform draw is below the schedule's conditional
rate for i, else take the target's token there and stop; when every draft is accepted they append the bonus token.
On a machine without Triton-CPU, vLLM replaces those kernels with C++ fallbacks (`vllm/utils/cpu_triton_utils.py`,
registered by `CpuPlatform.register_triton_kernel_overrides`) that assert the synthetic mode is off, so a server
started with it dies in its warm-up.

This `vllm.general_plugins` entry point, loaded by every vLLM process before the platform registers its fallbacks,
wraps the two fallbacks: in synthetic mode it runs the kernels' semantics above in plain PyTorch, one request at a
time; otherwise it calls vLLM's own fallback unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def _draft_span(cu_num_draft_tokens: torch.Tensor, request: int) -> tuple[int, int]:
    start = 0 if request == 0 else int(cu_num_draft_tokens[request - 1])
    return start, int(cu_num_draft_tokens[request])


def _accept(
    output_token_ids: torch.Tensor,
    request: int,
    start: int,
    end: int,
    draft_token_ids: torch.Tensor,
    uniform_probs: torch.Tensor,
    rates: torch.Tensor,
    rejected_token_ids: torch.Tensor,
    bonus_token_ids: torch.Tensor,
) -> None:
    """One request's row: drafts accepted while `uniform < rate[pos]` (a padded draft, -1, never is); the first
    rejected position takes `rejected_token_ids` there and ends the row; all accepted appends the bonus token."""
    for pos in range(end - start):
        draft = int(draft_token_ids[start + pos])
        accepted = draft >= 0 and float(uniform_probs[start + pos]) < float(rates[pos])
        output_token_ids[request, pos] = draft if accepted else int(rejected_token_ids[start + pos])
        if not accepted:
            return
    output_token_ids[request, end - start] = int(bonus_token_ids[request])


def synthetic_greedy(original: Callable[..., Any]) -> Callable[..., Any]:
    """`_rejection_greedy_sample_kernel_impl` with the synthetic mode (a rejected position takes the target's
    argmax)."""

    def kernel(
        output_token_ids: torch.Tensor,
        cu_num_draft_tokens: torch.Tensor,
        draft_token_ids: torch.Tensor,
        target_argmax: torch.Tensor,
        bonus_token_ids: torch.Tensor,
        is_greedy: torch.Tensor | None,
        max_spec_len: int,
        uniform_probs: torch.Tensor | None = None,
        synthetic_conditional_rates: torch.Tensor | None = None,
        SYNTHETIC_MODE: bool = False,  # noqa: N803 (the kernel's own keyword)
    ) -> None:
        if not SYNTHETIC_MODE:
            original(
                output_token_ids,
                cu_num_draft_tokens,
                draft_token_ids,
                target_argmax,
                bonus_token_ids,
                is_greedy,
                max_spec_len,
                uniform_probs,
                synthetic_conditional_rates,
                SYNTHETIC_MODE,
            )
            return
        assert uniform_probs is not None and synthetic_conditional_rates is not None
        for request in range(output_token_ids.shape[0]):
            if is_greedy is not None and not bool(is_greedy[request]):
                continue
            start, end = _draft_span(cu_num_draft_tokens, request)
            _accept(
                output_token_ids,
                request,
                start,
                end,
                draft_token_ids,
                uniform_probs,
                synthetic_conditional_rates,
                target_argmax,
                bonus_token_ids,
            )

    return kernel


def synthetic_random(original: Callable[..., Any]) -> Callable[..., Any]:
    """`_rejection_random_sample_kernel_impl` with the synthetic mode (a rejected position takes the recovered
    token)."""

    def kernel(
        output_token_ids: torch.Tensor,
        cu_num_draft_tokens: torch.Tensor,
        draft_token_ids: torch.Tensor,
        draft_probs: torch.Tensor | None,
        target_probs: torch.Tensor,
        bonus_token_ids: torch.Tensor,
        recovered_token_ids: torch.Tensor,
        uniform_probs: torch.Tensor,
        is_greedy: torch.Tensor,
        max_spec_len: int,
        vocab_size: int,
        synthetic_conditional_rates: torch.Tensor | None = None,
        NO_DRAFT_PROBS: bool = False,  # noqa: N803
        SYNTHETIC_MODE: bool = False,  # noqa: N803
    ) -> None:
        if not SYNTHETIC_MODE:
            original(
                output_token_ids,
                cu_num_draft_tokens,
                draft_token_ids,
                draft_probs,
                target_probs,
                bonus_token_ids,
                recovered_token_ids,
                uniform_probs,
                is_greedy,
                max_spec_len,
                vocab_size,
                synthetic_conditional_rates,
                NO_DRAFT_PROBS,
                SYNTHETIC_MODE,
            )
            return
        assert synthetic_conditional_rates is not None
        for request in range(output_token_ids.shape[0]):
            if bool(is_greedy[request]):
                continue
            start, end = _draft_span(cu_num_draft_tokens, request)
            _accept(
                output_token_ids,
                request,
                start,
                end,
                draft_token_ids,
                uniform_probs,
                synthetic_conditional_rates,
                recovered_token_ids,
                bonus_token_ids,
            )

    return kernel


def register() -> None:
    """Wrap vLLM's CPU fallbacks of the two rejection-sampler kernels (idempotent: vLLM may load plugins again)."""
    from vllm.utils import cpu_triton_utils

    for name, wrap in (
        ("_rejection_greedy_sample_kernel_impl", synthetic_greedy),
        ("_rejection_random_sample_kernel_impl", synthetic_random),
    ):
        current = getattr(cpu_triton_utils, name)
        if getattr(current, "_agentx_synthetic", False):
            continue
        wrapped = wrap(current)
        wrapped._agentx_synthetic = True  # type: ignore[attr-defined]
        setattr(cpu_triton_utils, name, wrapped)
