"""`agentx sim`: the built-in simulated server."""

from __future__ import annotations

import os
import sys
from typing import Any

import click
import msgspec

from agentx.cli.common import fail, stderr
from agentx.cli.shared_flags import json_flag
from agentx.sim.options import click_options, options_from_flags


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--port", default=8000, show_default=True, type=click.IntRange(0, 65535), help="TCP port (0: a free one)."
)
@json_flag("the ready line", " {url, model, pid}")
@click.option("--access-log", is_flag=True, help="Log every request to stderr.")
@click.option("--tls-cert", type=click.Path(dir_okay=False), help="Serve https with this PEM certificate (chain).")
@click.option("--tls-key", type=click.Path(dir_okay=False), help="The PEM private key of --tls-cert.")
@click.option(
    "--api-key",
    envvar="AGENTX_SIM_API_KEY",
    show_envvar=True,
    help="Answer 401 to every request but /health without 'Authorization: Bearer KEY' (/metrics included).",
)
@click_options
def sim(
    host: str,
    port: int,
    as_json: bool,
    access_log: bool,
    tls_cert: str | None,
    tls_key: str | None,
    api_key: str | None,
    **flags: Any,
) -> None:
    """Serve a simulated vLLM-like OpenAI-compatible server until Ctrl-C (docs/sim.md)."""
    try:
        options = options_from_flags(
            flags, host=host, port=port, access_log=access_log, tls_cert=tls_cert, tls_key=tls_key, api_key=api_key
        )
    except ValueError as exc:
        fail(str(exc))
    from agentx.sim.server import serve  # aiohttp and uvloop load only for this command

    def ready(url: str, model: str) -> None:
        if as_json:
            line = msgspec.json.encode({"url": url, "model": model, "pid": os.getpid()}).decode()
        else:
            line = f"agentx sim: serving model {model} at {url} (Ctrl-C to stop)"
        sys.stdout.write(line + "\n")
        sys.stdout.flush()  # a harness reads this line through a pipe, where stdout is block-buffered

    try:
        serve(options, ready)
    except ValueError as exc:
        fail(f"invalid simulator configuration: {exc}")
    except OSError as exc:
        fail(f"cannot listen on {host}:{port}: {exc.strerror or exc}")
    except RuntimeError as exc:
        fail(str(exc))
    stderr.print("agentx sim: stopped", markup=False)
