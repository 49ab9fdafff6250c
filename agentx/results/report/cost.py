"""Dollars per million tokens from throughput per GPU and a GPU-hour price; energy per token from a power figure.

$/1M tokens = ($/GPU/hr) / (tokens/s per GPU × 3600 / 10⁶), for total, output or input tokens alike.
J/token = W per GPU / tokens/s per GPU; tokens/s per MW = tokens/s per GPU / (MW per GPU).

Prices come from `gpu_prices.json` (package data: public figures, each with its source and date, per GPU SKU and
tier), a JSON file of the same shape merged over it, or one figure given outright.
"""

from __future__ import annotations

import math
from importlib import resources
from pathlib import Path
from typing import Final

import msgspec

from agentx.errors import PriceError

TIERS: Final = ("hyperscaler", "neocloud", "retail")
GIVEN_TIER: Final = "given"
"""The tier name of a price given outright (`--price`)."""


class Price(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One $/GPU/hr figure and where it comes from; `usd_per_gpu_hour` None: no public figure was found."""

    usd_per_gpu_hour: float | None
    source: str = ""
    """A URL, or what the figure is."""
    date: str = ""
    """When the figure was published or read (ISO date)."""
    what: str = ""
    """The offer it is (provider, instance, region)."""


class GpuPrices(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    name: str
    tiers: dict[str, Price]
    notes: str = ""


class PriceTable(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The layout of `gpu_prices.json`: SKUs keyed by lower-case id (e.g. "b300")."""

    updated: str = ""
    notes: list[str] = []
    tiers: dict[str, str] = {}
    """Tier name → what it means."""
    gpus: dict[str, GpuPrices] = {}


class Cost(msgspec.Struct, frozen=True, kw_only=True):
    """$/1M tokens at one price, per token kind; None where the throughput is unknown or 0."""

    tier: str
    usd_per_gpu_hour: float | None
    total_usd_per_m: float | None
    output_usd_per_m: float | None
    input_usd_per_m: float | None
    source: str = ""
    date: str = ""
    what: str = ""


class Energy(msgspec.Struct, frozen=True, kw_only=True):
    kw_per_gpu: float
    joules_per_token: float | None
    """Per total (input + output) token."""
    joules_per_output_token: float | None
    total_tps_per_mw: float | None
    output_tps_per_mw: float | None


def usd_per_million_tokens(usd_per_gpu_hour: float | None, tps_per_gpu: float | None) -> float | None:
    """($/GPU/hr) / (tokens/s per GPU × 3600 / 10⁶); None when either is unknown or the throughput is ≤ 0."""
    if usd_per_gpu_hour is None or tps_per_gpu is None or not (math.isfinite(tps_per_gpu) and tps_per_gpu > 0):
        return None
    return usd_per_gpu_hour / (tps_per_gpu * 3600.0 / 1e6)


def cost(
    price: Price,
    tier: str,
    total_tps_per_gpu: float | None,
    output_tps_per_gpu: float | None,
    input_tps_per_gpu: float | None,
) -> Cost:
    """$/1M total, output and input tokens at `price`."""
    usd = price.usd_per_gpu_hour
    return Cost(
        tier=tier,
        usd_per_gpu_hour=usd,
        total_usd_per_m=usd_per_million_tokens(usd, total_tps_per_gpu),
        output_usd_per_m=usd_per_million_tokens(usd, output_tps_per_gpu),
        input_usd_per_m=usd_per_million_tokens(usd, input_tps_per_gpu),
        source=price.source,
        date=price.date,
        what=price.what,
    )


def energy(kw_per_gpu: float, total_tps_per_gpu: float | None, output_tps_per_gpu: float | None) -> Energy:
    """Joules per token and tokens/s per megawatt at `kw_per_gpu` (the GPU's share of facility power)."""

    def per(tps: float | None, scale: float) -> float | None:
        return None if tps is None or tps <= 0 else scale / tps

    def per_mw(tps: float | None) -> float | None:
        return None if tps is None else tps / (kw_per_gpu / 1000.0)

    return Energy(
        kw_per_gpu=kw_per_gpu,
        joules_per_token=per(total_tps_per_gpu, kw_per_gpu * 1000.0),
        joules_per_output_token=per(output_tps_per_gpu, kw_per_gpu * 1000.0),
        total_tps_per_mw=per_mw(total_tps_per_gpu),
        output_tps_per_mw=per_mw(output_tps_per_gpu),
    )


def load_price_table(override: Path | None = None) -> PriceTable:
    """The built-in table, with `override` (a JSON file of the same shape) merged over it per SKU and tier."""
    data = resources.files("agentx.results.report").joinpath("gpu_prices.json").read_bytes()
    table = msgspec.json.decode(data, type=PriceTable)
    if override is None:
        return table
    try:
        extra = msgspec.json.decode(override.read_bytes(), type=PriceTable)
    except OSError as exc:
        raise PriceError(f"{override}: cannot read the price file ({exc.strerror or exc})") from None
    except msgspec.DecodeError as exc:
        raise PriceError(
            f"{override}: not a price table ({exc}); it takes the shape of agentx/results/report/gpu_prices.json: "
            '{"gpus": {"b300": {"name": "B300", "tiers": {"neocloud": {"usd_per_gpu_hour": 5.0}}}}}'
        ) from None
    gpus = dict(table.gpus)
    for sku, prices in extra.gpus.items():
        key = sku.lower()
        base = gpus.get(key)
        tiers = {**(base.tiers if base else {}), **prices.tiers}
        gpus[key] = GpuPrices(name=prices.name or (base.name if base else sku), tiers=tiers, notes=prices.notes)
    return PriceTable(updated=table.updated, notes=table.notes, tiers={**table.tiers, **extra.tiers}, gpus=gpus)


def prices_for(table: PriceTable, sku: str | None, usd_per_gpu_hour: float | None = None) -> list[tuple[str, Price]]:
    """(tier, price) for `sku` in the table's tier order, led by a price given outright; [] for an unknown SKU."""
    rows: list[tuple[str, Price]] = []
    if usd_per_gpu_hour is not None:
        rows.append((GIVEN_TIER, Price(usd_per_gpu_hour=usd_per_gpu_hour, source="given on the command line")))
    if sku is not None and (gpu := table.gpus.get(sku.lower())) is not None:
        order = [t for t in TIERS if t in gpu.tiers] + [t for t in gpu.tiers if t not in TIERS]
        rows.extend((tier, gpu.tiers[tier]) for tier in order)
    return rows
