"""The GPUs' power over a run: a DCGM exporter's Prometheus text (or another source's, by metric names) scraped every
`Runtime.metrics_interval_s` beside the server's `/metrics`, into `gpu_metrics.arrow`
(agentx.replayer.telemetry.gpu_file).

Per GPU (one series per label set: DCGM labels each `gpu="0"`, `UUID`, `Hostname`) it reads the power gauge
(`DCGM_FI_DEV_POWER_USAGE`, W) and the energy counter (`DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION`, mJ since boot; J when
the name ends in `_joules` or `_joules_total`, the Prometheus convention). It scrapes as the server's telemetry does
(agentx.replayer.telemetry.scrape): a client of its own with one kept-alive connection, never a request's; a gap
between due requests waited for before it sends and before it reads. Each kind of failure is said once (a warning
and a notice in run.json) and the run goes on: a failed scrape leaves no row, 401/403/404 stop the scraping. The
URL's `user:password@` is sent as basic auth and hidden from every message and from the file.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

from agentx.errors import ServerUnreachable
from agentx.replayer.http.calls import METRICS_TIMEOUT_S
from agentx.replayer.http.client import Client
from agentx.replayer.http.credentials import Credentials, without_userinfo
from agentx.replayer.http.exchange import MESSAGE_MAX_CHARS, error_message
from agentx.replayer.schedule.collector import QUIET_SPAN_NS
from agentx.replayer.telemetry.gpu_file import GpuMetricsInfo, GpuMetricsWriter, GpuSample
from agentx.replayer.telemetry.ticks import READ_PATIENCE_S, SEND_PATIENCE_S, QuietWaiter, scrape_every
from agentx.secrets import scrub

_KEY_LABELS: Final = ("Hostname", "gpu")
"""The labels that name one GPU of a DCGM exporter (several hosts' exporters may sit behind one endpoint)."""
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"')
_log = logging.getLogger(__name__)


def energy_scale_j(metric: str) -> float:
    """Joules per unit of an energy counter named `metric`: 1 for `*_joules`/`*_joules_total`, else 1e-3 (mJ)."""
    return 1.0 if metric.endswith(("_joules", "_joules_total")) else 1e-3


def gpu_key(labels: dict[str, str]) -> str:
    """The GPU a series is of: `Hostname:gpu` (or the one present), else its UUID, else all its labels."""
    named = [labels[name] for name in _KEY_LABELS if name in labels]
    if named:
        return ":".join(named)
    if "UUID" in labels:
        return labels["UUID"]
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def read_gpu_samples(text: str, power_metric: str, energy_metric: str | None) -> list[GpuSample]:
    """The GPUs' power (W) and energy (J) in a Prometheus exposition, in the order the GPUs first appear; only the
    lines of the two names are parsed. Values that are not finite numbers are left out."""
    power: dict[str, float] = {}
    energy: dict[str, float] = {}
    order: dict[str, None] = {}
    scale = energy_scale_j(energy_metric) if energy_metric is not None else 1.0
    for line in text.splitlines():
        if line.startswith(power_metric):
            target, name, factor = power, power_metric, 1.0
        elif energy_metric is not None and line.startswith(energy_metric):
            target, name, factor = energy, energy_metric, scale
        else:
            continue
        parsed = _sample(line, name)
        if parsed is None:
            continue
        key, value = parsed
        order[key] = None
        target[key] = value * factor
    return [GpuSample(key, power.get(key), energy.get(key)) for key in order]


def _sample(line: str, name: str) -> tuple[str, float] | None:
    """(GPU key, value) of one exposition line of metric `name`, None for another name that shares its start."""
    rest = line[len(name) :]
    labels: dict[str, str] = {}
    if rest.startswith("{"):
        close = rest.rfind("}")
        if close < 0:
            return None
        labels = dict(_LABEL.findall(rest[1:close]))
        rest = rest[close + 1 :]
    elif rest[:1] not in (" ", "\t"):
        return None
    fields = rest.split()
    if not fields:
        return None
    try:
        value = float(fields[0])
    except ValueError:
        return None
    if value != value or value in (float("inf"), float("-inf")):
        return None
    return gpu_key(labels), value


class GpuTelemetry:
    """Scrapes the GPU endpoint through `client` every `interval_s` into `path`; `run` until cancelled, then `close`.
    Times are `perf_counter_ns() − start_ns` (the records' clock). `notices` holds what was said."""

    def __init__(
        self,
        client: Client,
        path: Path,
        info: GpuMetricsInfo,
        *,
        request_path: str,
        start_ns: int,
        clock: QuietWaiter | None = None,
        scrub: Callable[[str], str] = scrub,
    ) -> None:
        self.client = client
        self.path = path
        self.info = info
        self.request_path = request_path
        self.start_ns = start_ns
        self.clock = clock
        self.scrub = scrub
        self.notices: list[str] = []
        self.failures = 0
        self.scrapes = 0
        """Scrapes that wrote rows."""
        self.writer: GpuMetricsWriter | None = None

    async def run(self) -> None:
        """Scrape every `interval_s` (ticks a slow scrape covered are skipped) until cancelled or told to stop; an
        unexpected error ends the scraping, never the run."""
        try:
            await scrape_every(self.info.interval_s, self.scrape)
        except Exception as exc:  # a bug or a full disk here must not cost the run: say it, keep the rows so far
            self._say(f"GPU metrics stopped: {type(exc).__name__}: {self.scrub(str(exc))}")

    async def scrape(self) -> bool:
        """One scrape, its rows written if it found the GPUs; False when scraping should stop."""
        if self.clock is not None:
            await self.clock.until_quiet(QUIET_SPAN_NS, SEND_PATIENCE_S)
        sent_ns = time.perf_counter_ns()
        try:
            status, body = await self.client.request_json("GET", self.request_path, timeout_s=METRICS_TIMEOUT_S)
        except ServerUnreachable as exc:
            self._failed(str(exc))
            return True
        answered_ns = time.perf_counter_ns()
        where = f"GET {self.info.url}"
        if status in (401, 403, 404):
            why = "the credentials were refused" if status != 404 else "nothing is served there"
            self._say(f"GPU metrics: {where}: HTTP {status}: {self._message(body)}; {why}, so no more scrapes")
            return False
        if status != 200:
            self._failed(f"{where}: HTTP {status}: {self._message(body)}")
            return True
        if self.clock is not None:
            await self.clock.until_quiet(QUIET_SPAN_NS, READ_PATIENCE_S)
        samples = read_gpu_samples(body.decode("utf-8", "replace"), self.info.power_metric, self.info.energy_metric)
        if not samples:
            names = " or ".join(n for n in (self.info.power_metric, self.info.energy_metric) if n)
            self._failed(f"{where}: no {names} in the answer")
            return True
        if self.writer is None:
            self.writer = GpuMetricsWriter(self.path, self.info)
        self.writer.append((sent_ns + answered_ns) // 2 - self.start_ns, (answered_ns - sent_ns) / 1e9, samples)
        self.scrapes += 1
        return True

    def close(self, *, epoch_ns: int | None = None) -> Path | None:
        """Close the file (an IPC file from then on), its times moved onto `epoch_ns` when given; its path, or None
        when no scrape found the GPUs."""
        if self.writer is None:
            return None
        self.writer.close(epoch_ns=epoch_ns)
        return self.writer.path

    def _message(self, body: bytes) -> str:
        return self.scrub(error_message(body))

    def _failed(self, why: str) -> None:
        self.failures += 1
        if self.failures == 1:
            self._say(f"GPU metrics: a scrape failed ({self.scrub(why)}); each failed scrape leaves no row")

    def _say(self, message: str) -> None:
        self.notices.append(message)
        _log.warning(message)


def gpu_scrubber(url: str) -> Callable[[str], str]:
    """What messages about the GPU endpoint hide: its URL's password, and what looks like a credential."""
    bare, user, password = without_userinfo(url)
    credentials = Credentials(bare, user=user, password=password)
    return lambda text: credentials.scrub(scrub(text), MESSAGE_MAX_CHARS)
