"""Dollars per million tokens, energy per token, and the price table (built in, overridden, given)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentx.errors import PriceError
from agentx.results.report.cost import (
    GIVEN_TIER,
    TIERS,
    Price,
    cost,
    energy,
    load_price_table,
    prices_for,
    usd_per_million_tokens,
)

SKUS = ("b300", "b200", "gb200", "gb300", "mi355x", "h200", "h100")


@pytest.mark.parametrize(
    ("usd_per_gpu_hour", "tps_per_gpu", "usd_per_m"),
    [(2.26, 6083.0, 0.103), (1.50, 5542.0, 0.075), (3.00, 6083.0, 0.137)],
)
def test_the_seed_pages_arithmetic_reproduces(usd_per_gpu_hour: float, tps_per_gpu: float, usd_per_m: float) -> None:
    found = usd_per_million_tokens(usd_per_gpu_hour, tps_per_gpu)
    assert found is not None and round(found, 3) == usd_per_m


@given(st.floats(min_value=0.01, max_value=100.0), st.floats(min_value=1.0, max_value=1e6))
def test_cost_is_price_over_tokens_per_hour(usd_per_gpu_hour: float, tps_per_gpu: float) -> None:
    found = usd_per_million_tokens(usd_per_gpu_hour, tps_per_gpu)
    assert found is not None
    # One GPU-hour makes tps × 3600 tokens; paying that hour for 10⁶ of them.
    assert found * tps_per_gpu * 3600 / 1e6 == pytest.approx(usd_per_gpu_hour)
    doubled = usd_per_million_tokens(usd_per_gpu_hour, 2 * tps_per_gpu)
    assert doubled == pytest.approx(found / 2)


def test_no_cost_without_throughput_or_price() -> None:
    assert usd_per_million_tokens(2.0, 0.0) is None
    assert usd_per_million_tokens(2.0, None) is None
    assert usd_per_million_tokens(None, 100.0) is None
    found = cost(Price(usd_per_gpu_hour=3.6), "x", 1000.0, 100.0, None)
    assert found.total_usd_per_m == pytest.approx(1.0) and found.output_usd_per_m == pytest.approx(10.0)
    assert found.input_usd_per_m is None


def test_energy_per_token_and_per_megawatt() -> None:
    found = energy(1.4, 7000.0, 700.0)
    assert found.joules_per_token == pytest.approx(0.2)
    assert found.joules_per_output_token == pytest.approx(2.0)
    assert found.total_tps_per_mw == pytest.approx(7000.0 / 0.0014)
    assert energy(1.0, None, 0.0).joules_per_output_token is None


def test_the_built_in_table_covers_every_sku_and_tier_with_sourced_or_missing_figures() -> None:
    table = load_price_table()
    assert set(SKUS) <= set(table.gpus)
    for sku in SKUS:
        tiers = table.gpus[sku].tiers
        assert set(TIERS) <= set(tiers), sku
        for tier, price in tiers.items():
            if price.usd_per_gpu_hour is None:
                continue  # no public figure found: said so, not invented
            assert price.usd_per_gpu_hour > 0 and price.source.startswith("https://"), (sku, tier)
            assert price.date, (sku, tier)
    assert [tier for tier, _ in prices_for(table, "H100")] == list(TIERS)
    assert prices_for(table, "nonesuch") == []


def test_a_price_file_overrides_per_sku_and_tier_and_a_given_price_leads(tmp_path: Path) -> None:
    path = tmp_path / "prices.json"
    path.write_text(
        json.dumps({"gpus": {"B300": {"name": "B300", "tiers": {"hyperscaler": {"usd_per_gpu_hour": 2.26}}}}})
    )
    table = load_price_table(path)
    tiers = dict(prices_for(table, "b300"))
    assert tiers["hyperscaler"].usd_per_gpu_hour == 2.26
    assert tiers["neocloud"] == load_price_table().gpus["b300"].tiers["neocloud"]
    rows = prices_for(table, "b300", 1.5)
    assert rows[0] == (GIVEN_TIER, Price(usd_per_gpu_hour=1.5, source="given on the command line"))


@pytest.mark.parametrize("content", ["{not json", '{"gpus": {"b300": {"tiers": 3}}}', '{"gpus": [], "x": 1}'])
def test_a_bad_price_file_is_one_clear_error(tmp_path: Path, content: str) -> None:
    path = tmp_path / "prices.json"
    path.write_text(content)
    with pytest.raises(PriceError, match="not a price table"):
        load_price_table(path)
    with pytest.raises(PriceError, match="cannot read"):
        load_price_table(tmp_path / "missing.json")
