"""`agentx report --html`: one self-contained page, checked as text and in a real headless browser (Chromium, driven
by Playwright): it loads with no console errors and every plot has a size."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from small_sweep import run_small_sweep

from agentx.cli import main
from agentx.results.report.html import PLOT_TITLES

pytestmark = pytest.mark.slow  # starts processes (tests/project/test_tiers.py)

BROWSER_NAMES = ("chromium", "chromium-browser", "google-chrome")
REQUIRE_BROWSER = os.environ.get("AGENTX_REQUIRE_BROWSER") == "1"
"""CI sets it (.ci/run installs Debian's chromium): there a missing browser fails the test instead of skipping it."""


def _browser() -> str | None:
    return next((found for name in BROWSER_NAMES if (found := shutil.which(name))), None)


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("html")
    run_small_sweep(out / "sweep")
    path = out / "report.html"
    result = CliRunner().invoke(main, ["report", str(out / "sweep"), "--gpu-sku", "h200", "--html", str(path)])
    assert result.exit_code == 0, result.output
    return path


def test_the_page_holds_identity_validity_tables_notes_and_plots(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>") and text.rstrip().endswith("</html>")
    for expected in (
        "valid AgentX submission",
        "agentx-sim",  # the engine
        "throughput at every interactivity target",
        "levels of sweep",
        "no hyperscaler price for H200",  # a note, with what to pass instead
    ):
        assert expected in text
    assert [f"plot-{name}" in text for name in ("frontier", "latency", "swimlanes")] == [True] * 3
    # Self-contained: nothing fetched, nothing run.
    assert "<script" not in text and not re.search(r"""(src|href)=["']?(https?:)?//""", text)


def test_an_existing_page_is_refused_without_overwrite(page: Path) -> None:
    sweep = page.parent / "sweep"
    refused = CliRunner().invoke(main, ["report", str(sweep), "--html", str(page)])
    assert refused.exit_code == 2 and "--overwrite" in refused.output
    replaced = CliRunner().invoke(main, ["report", str(sweep), "--html", str(page), "--overwrite"])
    assert replaced.exit_code == 0, replaced.output


def test_the_page_loads_in_headless_chromium_with_no_errors_and_sized_plots(page: Path, tmp_path: Path) -> None:
    executable = _browser()
    if executable is None:
        if REQUIRE_BROWSER:
            pytest.fail("AGENTX_REQUIRE_BROWSER=1 but no Chromium on PATH (apt-get install chromium)")
        pytest.skip("no Chromium on PATH (apt-get install chromium); CI installs it")
    from playwright.sync_api import sync_playwright

    errors: list[str] = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        try:
            tab = browser.new_page(viewport={"width": 1280, "height": 900})
            tab.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
            tab.on("pageerror", lambda error: errors.append(str(error)))
            tab.on("requestfailed", lambda request: errors.append(f"failed: {request.url}"))
            tab.goto(page.as_uri(), wait_until="load")
            figures = tab.locator("figure svg")
            sizes = [figures.nth(i).bounding_box() for i in range(figures.count())]
            tables = tab.locator("table").count()
            tab.screenshot(path=str(tmp_path / "report.png"), full_page=True)
        finally:
            browser.close()
    assert errors == []
    assert len(sizes) >= 4 and len(sizes) <= len(PLOT_TITLES)
    assert all(box is not None and box["width"] > 100 and box["height"] > 100 for box in sizes), sizes
    assert tables >= 5
