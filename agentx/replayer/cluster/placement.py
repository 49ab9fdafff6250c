"""Reaching a Ray cluster, and placing a run's shards on it (docs/distributed.md, "Starting a cluster").

Ray is an optional extra (`agentx-replay[ray]`): only a `--ray` run imports it, here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import threading
from collections.abc import Iterator
from typing import Any, Final

from agentx.errors import ClusterError, ConfigError

LOCAL: Final = "local"
"""`--ray local`: a private Ray instance on this host, for trying the path out (a cluster is `auto` or an address)."""


def import_ray() -> Any:
    """The `ray` module; a ConfigError saying how to install it when it is missing."""
    try:
        import ray
    except ImportError:
        raise ConfigError(
            "--ray needs Ray, an optional extra of agentx-replay: pip install 'agentx-replay[ray]' (on the driver and "
            "every node)"
        ) from None
    return ray


@contextlib.contextmanager
def ray_session(address: str) -> Iterator[Any]:
    """Ray connected to the cluster at `address` (or `auto`, or `LOCAL`) for the block; a connection the caller made
    already (`ray.is_initialized()`) is used as it is and left open."""
    ray = import_ray()
    if ray.is_initialized():
        yield ray
        return
    # The shards report through their polls; their own output stays in the nodes' Ray logs, off the driver's stdout
    # (which may carry --json).
    settings: dict[str, Any] = {"logging_level": logging.WARNING, "log_to_driver": False}
    settings["address"] = address  # Ray's own "local" always starts a new instance (not the one `ray start` made)
    if address == LOCAL:
        settings.update(include_dashboard=False, num_cpus=os.cpu_count())
    # ray.init makes SIGTERM exit the process at once; the caller's handler (the CLI's drain) is put back.
    in_main = threading.current_thread() is threading.main_thread()
    on_sigterm = signal.getsignal(signal.SIGTERM) if in_main else None
    try:
        ray.init(**settings)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        hint = " (start one with `ray start --head`, or pass its address)" if address == "auto" else ""
        raise ClusterError(f"cannot reach the Ray cluster at {address}{hint}: {' '.join(str(exc).split())}") from None
    finally:
        if on_sigterm is not None:
            signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield ray
    finally:
        ray.shutdown()


async def place_shards(ray: Any, count: int, timeout_s: float) -> Any:
    """A placement group of `count` one-CPU bundles spread over the nodes, ready; a ClusterError in one line when
    the cluster cannot place them within `timeout_s`."""
    from ray.util.placement_group import placement_group, remove_placement_group

    group = placement_group([{"CPU": 1}] * count, strategy="SPREAD", name="")
    try:
        await asyncio.wait_for(asyncio.wrap_future(group.ready().future()), timeout_s)
    except TimeoutError:
        remove_placement_group(group)
        resources = ray.cluster_resources()
        nodes = sum(1 for node in ray.nodes() if node.get("Alive"))
        raise ClusterError(
            f"the Ray cluster cannot place {count} shards of 1 CPU each within {timeout_s:g} s: it has "
            f"{resources.get('CPU', 0):g} CPUs on {nodes} nodes, some perhaps taken; add nodes or lower --workers"
        ) from None
    return group


def remove_group(group: Any) -> None:
    """Give the placement group's CPUs back."""
    from ray.util.placement_group import remove_placement_group

    with contextlib.suppress(Exception):  # the cluster is going away with the run: nothing left to give back
        remove_placement_group(group)
