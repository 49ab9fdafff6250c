"""Server telemetry over a run: the server's `/metrics` scraped every `Runtime.metrics_interval_s` (1 s by default)
while the replay goes, warmup included, into `server_metrics.arrow` (agentx.replayer.telemetry.arrow_file).

Each scrape goes through a client of its own, made as the run's is (`server_client`: the same credentials, headers,
TLS settings and HTTP/1.1 pool code) with one kept-alive connection, so it never takes a connection a request would
use. It shares the replay's event loop, so it waits for a gap between due requests (`DispatchClock.until_quiet`, as
the records' flushes and the garbage collector do) before it sends and again before it reads the answer, which it
reads cheaply (agentx.replayer.telemetry.series.read_samples: the lines of the names it knows, nothing else).

What the server says decides what happens, each said once (a warning, and a notice in run.json):

- 404 (or an answer with none of the names agentx knows) at `/metrics`: `/prometheus/metrics` is tried
  (TensorRT-LLM's `trtllm-serve` serves its Prometheus text there, and JSON at `/metrics`); a 404 there too means
  the server has no telemetry: nothing is written (a `server_metrics.arrow` of a replaced run is removed).
- 401 or 403: the credentials are refused; scraping stops.
- Any other failure (a timeout, a 5xx, a dropped connection): that scrape leaves no row; the next one is tried.

With `--gpu-metrics`, the GPUs' power is scraped beside it, on the same interval, into `gpu_metrics.arrow`
(agentx.replayer.telemetry.gpu).

A `--workers` run scrapes from the parent process, on a thread of its own (`TelemetryThread`), on its own clock;
closing the file moves its times onto the merged records' clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

from agentx.engines import Engine
from agentx.errors import ServerUnreachable
from agentx.records.run_folder import SERVER_METRICS_FILE
from agentx.replayer.http.calls import METRICS_TIMEOUT_S
from agentx.replayer.http.client import Client
from agentx.replayer.http.credentials import Credentials, without_userinfo
from agentx.replayer.http.exchange import MESSAGE_MAX_CHARS, error_message
from agentx.replayer.options.gpu_url import bare_url, gpu_endpoint
from agentx.replayer.options.replay import ReplayOptions
from agentx.replayer.options.server_client import server_client
from agentx.replayer.schedule.collector import QUIET_SPAN_NS
from agentx.replayer.telemetry.arrow_file import ServerMetricsInfo, TelemetryWriter
from agentx.replayer.telemetry.gpu import GpuTelemetry, gpu_scrubber
from agentx.replayer.telemetry.gpu_file import GPU_METRICS_FILE, GpuMetricsInfo
from agentx.replayer.telemetry.series import (
    detect_engine,
    engine_names,
    read_samples,
    telemetry_sources,
    telemetry_values,
)
from agentx.replayer.telemetry.ticks import READ_PATIENCE_S, SEND_PATIENCE_S, QuietWaiter, scrape_every
from agentx.secrets import scrub

ENDPOINTS: Final = ("/metrics", "/prometheus/metrics")
"""Where a server's Prometheus text is looked for, in order (the second: TensorRT-LLM's `trtllm-serve`)."""
_log = logging.getLogger(__name__)


class Telemetry:
    """Scrapes `/metrics` through `client` every `interval_s` into `path` (see the module docstring); `run` until
    cancelled, then `close`. Times are `perf_counter_ns() − start_ns`: the records' clock when `start_ns` is the
    run's start. `notices` holds what was said."""

    def __init__(
        self,
        client: Client,
        path: Path,
        *,
        run_id: str,
        wall_epoch_ns: int,
        start_ns: int,
        interval_s: float,
        clock: QuietWaiter | None = None,
        scrub: Callable[[str], str] = scrub,
    ) -> None:
        self.client = client
        self.scrub = scrub
        """Hides credentials from what a server's error answer says before it is logged or kept."""
        self.path = path
        self.run_id = run_id
        self.wall_epoch_ns = wall_epoch_ns
        self.start_ns = start_ns
        self.interval_s = interval_s
        self.clock = clock
        self.notices: list[str] = []
        self.engine: Engine | None = None
        self.endpoint = ENDPOINTS[0]
        self.failures = 0
        self.writer: TelemetryWriter | None = None
        self._names = engine_names()
        self._missing: list[str] = []
        self._not_found = 0
        """Endpoints of `ENDPOINTS` that answered 404."""

    async def run(self) -> None:
        """Scrape every `interval_s` (a scrape that overran skips the ticks it covered) until cancelled or told to
        stop; an unexpected error ends the scraping, never the run."""
        try:
            await scrape_every(self.interval_s, self.scrape)
        except Exception as exc:  # a bug here must not cost the run: say it, keep the rows so far
            self._say(f"server telemetry stopped: {type(exc).__name__}: {exc}")

    async def scrape(self) -> bool:
        """One scrape, its row written if it found series; False when scraping should stop."""
        if self.clock is not None:
            await self.clock.until_quiet(QUIET_SPAN_NS, SEND_PATIENCE_S)
        sent_ns = time.perf_counter_ns()
        try:
            # The client's whole-answer GET with its status (it asks for JSON: Prometheus exporters answer their text
            # format to any Accept but OpenMetrics', trtllm-serve its JSON at /metrics, which is then passed over).
            status, body = await self.client.request_json("GET", self.endpoint, timeout_s=METRICS_TIMEOUT_S)
        except ServerUnreachable as exc:
            self._failed(str(exc))
            return True
        answered_ns = time.perf_counter_ns()
        if status == 404 and self.engine is None:
            self._not_found += 1
            return await self._next_endpoint("HTTP 404")
        if status in (401, 403):
            self._say(
                f"server telemetry: GET {self.endpoint}: HTTP {status}: {self._message(body)}; the server refused the "
                "credentials, so server_metrics.arrow is not written further"
            )
            return False
        if status != 200:
            self._failed(f"GET {self.endpoint}: HTTP {status}: {self._message(body)}")
            return True
        if self.clock is not None:
            await self.clock.until_quiet(QUIET_SPAN_NS, READ_PATIENCE_S)
        samples = read_samples(body.decode("utf-8", "replace"), self._names)
        if self.engine is None:
            engine = detect_engine(samples)
            if engine is None:
                return await self._next_endpoint("none of the names agentx knows")
            self.engine = engine
            self._names = engine_names(engine)
        values = telemetry_values(samples, self.engine)
        if values:
            self._write((sent_ns + answered_ns) // 2 - self.start_ns, (answered_ns - sent_ns) / 1e9, values, samples)
        return True

    @property
    def not_served(self) -> bool:
        """Whether the server has no `/metrics` at all: every endpoint of `ENDPOINTS` answered 404."""
        return self._not_found == len(ENDPOINTS)

    def close(self, *, epoch_ns: int | None = None) -> Path | None:
        """Close the file (an IPC file from then on), its times moved onto `epoch_ns` when given; its path, or None
        when no scrape found series."""
        if self.writer is None:
            return None
        self.writer.close(epoch_ns=epoch_ns)
        return self.writer.path

    async def _next_endpoint(self, why: str) -> bool:
        self._missing.append(f"{self.endpoint}: {why}")
        index = ENDPOINTS.index(self.endpoint) + 1
        if index < len(ENDPOINTS):
            self.endpoint = ENDPOINTS[index]
            return await self.scrape()
        self._say(f"server telemetry: not available ({'; '.join(self._missing)}); server_metrics.arrow is not written")
        return False

    def _write(self, time_ns: int, scrape_s: float, values: dict[str, float], samples: dict[str, list[float]]) -> None:
        assert self.engine is not None
        if self.writer is None:
            info = ServerMetricsInfo(
                run_id=self.run_id,
                wall_epoch_ns=self.wall_epoch_ns,
                engine=self.engine,
                endpoint=self.endpoint,
                interval_s=self.interval_s,
                sources=telemetry_sources(samples, self.engine),
            )
            self.writer = TelemetryWriter(self.path, info)
        elif not values.keys() <= self.writer.info.sources.keys():  # a series that appeared since (kept at close)
            self.writer.info.sources |= telemetry_sources(samples, self.engine)
        self.writer.append(time_ns, scrape_s, values)

    def _message(self, body: bytes) -> str:
        return self.scrub(error_message(body))

    def _failed(self, why: str) -> None:
        self.failures += 1
        if self.failures == 1:
            self._say(f"server telemetry: a scrape failed ({why}); each failed scrape leaves no row")

    def _say(self, message: str) -> None:
        self.notices.append(message)
        _log.warning(message)


class TelemetryTask:
    """`Telemetry` running as a task on the current event loop with a client of its own, and the GPUs' power
    (agentx.replayer.telemetry.gpu) beside it when asked for, each scraping on its own; `stop` ends both."""

    def __init__(self, telemetry: Telemetry, gpu: GpuTelemetry | None = None) -> None:
        self.telemetry = telemetry
        self.gpu = gpu
        self.task = asyncio.ensure_future(telemetry.run())
        self.gpu_task = asyncio.ensure_future(gpu.run()) if gpu is not None else None

    @property
    def notices(self) -> list[str]:
        return self.telemetry.notices + (self.gpu.notices if self.gpu is not None else [])

    @property
    def not_served(self) -> bool:
        return self.telemetry.not_served

    async def stop(self, *, epoch_ns: int | None = None) -> Path | None:
        """Stop scraping, close the files (see `Telemetry.close`) and the clients; returns server_metrics.arrow's
        path or None."""
        tasks = [task for task in (self.task, self.gpu_task) if task is not None]
        for task in tasks:
            task.cancel()  # every write happens in one step of the task: none is half done now
        path = self.telemetry.close(epoch_ns=epoch_ns)
        if self.gpu is not None:
            self.gpu.close(epoch_ns=epoch_ns)
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait(tasks)
        await self.telemetry.client.close()
        if self.gpu is not None:
            await self.gpu.client.close()
        return path


def start_telemetry(
    options: ReplayOptions,
    *,
    run_id: str,
    wall_epoch_ns: int,
    start_ns: int,
    clock: QuietWaiter | None = None,
) -> TelemetryTask | None:
    """Start scraping for the run in `options.out_dir` on the running loop (None when `metrics_interval_s` is off).
    A `server_metrics.arrow` already there, a replaced run's, is removed first: it must not pass for this run's."""
    path = Path(options.out_dir) / SERVER_METRICS_FILE
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)
        (path.parent / GPU_METRICS_FILE).unlink(missing_ok=True)
    except OSError as exc:  # the run must not fail for its telemetry
        _log.warning("server telemetry: not started (%s)", exc)
        return None
    interval_s = options.runtime.metrics_interval_s
    if interval_s is None:
        return None
    client = server_client(options.server, options.connection, limit=1)
    client.open()
    telemetry = Telemetry(
        client,
        path,
        run_id=run_id,
        wall_epoch_ns=wall_epoch_ns,
        start_ns=start_ns,
        interval_s=interval_s,
        clock=clock,
        scrub=_scrubber(options),
    )
    gpu = _gpu_telemetry(options, run_id, wall_epoch_ns, start_ns, clock)
    return TelemetryTask(telemetry, gpu)


def _gpu_telemetry(
    options: ReplayOptions, run_id: str, wall_epoch_ns: int, start_ns: int, clock: QuietWaiter | None
) -> GpuTelemetry | None:
    """The GPUs' scraper (`Runtime.gpu_metrics_url`), through a client of its own; None when not asked for."""
    runtime = options.runtime
    if runtime.gpu_metrics_url is None or runtime.metrics_interval_s is None:
        return None
    origin, request_path = gpu_endpoint(runtime.gpu_metrics_url)
    connection = options.connection
    client = Client(
        origin,
        tls=connection.tls,
        limit=1,
        connect_timeout_s=connection.connect_timeout_s,
        idle_timeout_s=connection.idle_timeout_s,
        proxy=connection.proxy,
    )
    client.open()
    info = GpuMetricsInfo(
        run_id=run_id,
        wall_epoch_ns=wall_epoch_ns,
        url=bare_url(runtime.gpu_metrics_url),
        power_metric=runtime.gpu_power_metric,
        energy_metric=runtime.gpu_energy_metric or None,
        interval_s=runtime.metrics_interval_s,
    )
    return GpuTelemetry(
        client,
        Path(options.out_dir) / GPU_METRICS_FILE,
        info,
        request_path=request_path,
        start_ns=start_ns,
        clock=clock,
        scrub=gpu_scrubber(runtime.gpu_metrics_url),
    )


def _scrubber(options: ReplayOptions) -> Callable[[str], str]:
    """What the run's client hides from messages (its key, header values, a URL's password), and what looks like a
    credential."""
    server = options.server
    url, user, password = without_userinfo(server.url)
    if server.api_key or any(name.lower() == "authorization" for name, _ in server.headers):
        user = password = None  # unused, as the client says (once) itself
    credentials = Credentials(url, api_key=server.api_key, headers=dict(server.headers), user=user, password=password)
    return lambda text: credentials.scrub(scrub(text), MESSAGE_MAX_CHARS)


class TelemetryThread:
    """Scraping from a thread with an event loop of its own, on its own clock: a `--workers` run's parent, idle while
    its workers replay. `start`, then `stop(epoch_ns)` with the merged records' epoch."""

    def __init__(self, options: ReplayOptions, run_id: str) -> None:
        self.options = options
        self.run_id = run_id
        self.notices: list[str] = []
        self.not_served = False
        """Whether the server turned out to have no `/metrics` (`Telemetry.not_served`), once stopped."""
        self.path: Path | None = None
        self._started = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._epoch_ns: int | None = None
        self._thread = threading.Thread(target=self._main, name="agentx-telemetry", daemon=True)

    def start(self) -> None:
        self._thread.start()
        self._started.wait()

    def stop(self, epoch_ns: int | None) -> Path | None:
        """Stop scraping and close the file, its times moved onto `epoch_ns` (the records'); its path or None."""
        self._epoch_ns = epoch_ns
        if self._loop is not None and self._stopping is not None:
            self._loop.call_soon_threadsafe(self._stopping.set)
        self._thread.join()
        return self.path

    def _main(self) -> None:
        try:
            asyncio.run(self._serve())
        finally:
            self._started.set()  # a failed start must not leave `start` waiting

    async def _serve(self) -> None:
        # Both clocks back to back, as a run's start takes them: wall time = epoch + offset.
        start_ns, wall_epoch_ns = time.perf_counter_ns(), time.time_ns()
        task = start_telemetry(self.options, run_id=self.run_id, wall_epoch_ns=wall_epoch_ns, start_ns=start_ns)
        self._loop, self._stopping = asyncio.get_running_loop(), asyncio.Event()
        self._started.set()
        await self._stopping.wait()
        if task is not None:
            self.path = await task.stop(epoch_ns=self._epoch_ns)
            self.notices += task.notices
            self.not_served = task.not_served


def records_epoch_ns(records_path: Path) -> int | None:
    """The wall-clock epoch of a records file's clock (its `agentx.wall_epoch_ns`), None when it cannot be read."""
    from agentx.errors import RecordsError
    from agentx.records.record import META_EPOCH, RecordsReader

    try:
        with RecordsReader(records_path) as reader:
            return int((reader.schema.metadata or {})[META_EPOCH])
    except (RecordsError, KeyError, ValueError):
        return None
