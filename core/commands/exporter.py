"""``mps-health exporter``: Prometheus metrics over HTTP, or once into a textfile.

Served: ``mps-health exporter [--listen :10102]`` runs the checks every ``--interval``
seconds in a background thread and answers scrapes from the last run's results.
Textfile: ``mps-health exporter --textfile DIR`` runs once and writes DIR/mps_health.prom
atomically, for node_exporter's textfile collector and a systemd timer; it exits 0 once
the file is written (the node's health is in the metrics), 3 when it cannot be.

Port 10102: the Prometheus wiki's default-port list has no room left in 9100-9999, and
new exporters register above 10000; see docs/monitoring.md.
"""

import os
import signal
import threading
from typing import TYPE_CHECKING, Any, Callable, Tuple

from ..config import Config
from ..schema import Invalid, Record, Section, custom, number, shown, text
from .common import fail, load_config, names

if TYPE_CHECKING:  # argparse only when the command runs: the config loader imports this
    import argparse

DEFAULT_PORT = 10102
DEFAULT_LISTEN = f":{DEFAULT_PORT}"
DEFAULT_INTERVAL_S = 30.0


def parse_listen(text: str) -> Tuple[str, int]:
    """'HOST:PORT', ':PORT' (every IPv4 address) or '[V6]:PORT' -> (host, port)."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"listen address {shown(text)} is not HOST:PORT (e.g. :10102, "
                         "127.0.0.1:10102, [::]:10102)")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(f"listen address {shown(text)}: put an IPv6 address in brackets")
    return host or "0.0.0.0", int(port)


def _listen(value: Any) -> str:
    listen = text(DEFAULT_LISTEN).parse(value)
    try:
        parse_listen(listen)
    except ValueError as e:
        raise Invalid(str(e)) from None
    return str(listen)


class ExporterConfig(Record):
    listen: str = custom(DEFAULT_LISTEN, _listen)
    interval_s: float = number(DEFAULT_INTERVAL_S, low=1.0, high=3600.0)


SECTION = Section("exporter", ExporterConfig)
SECTIONS = (SECTION,)


def exporter_config(config: Config) -> ExporterConfig:
    return config.get(SECTION)


def register(p: "argparse.ArgumentParser") -> Callable[["argparse.Namespace"], int]:
    p.add_argument("--config", metavar="FILE",
                   help="config file (default /etc/mps-health/config.yaml if it exists)")
    p.add_argument("--root", metavar="DIR", default="/",
                   help="read every system path under DIR (fixture trees, containers)")
    p.add_argument("--listen", metavar="HOST:PORT",
                   help=f"address to serve /metrics on (default: the config's exporter.listen, "
                        f"{DEFAULT_LISTEN}; port 0 picks a free one)")
    p.add_argument("--interval", type=float, metavar="SECONDS",
                   help=f"seconds between runs (default: exporter.interval_s, "
                        f"{DEFAULT_INTERVAL_S:g})")
    p.add_argument("--textfile", metavar="DIR",
                   help="run once and write DIR/mps_health.prom for node_exporter's "
                        "textfile collector, instead of serving")
    p.add_argument("--only", type=names, default=[], metavar="A,B", help="run only these checks")
    p.add_argument("--skip", type=names, default=[], metavar="A,B", help="do not run these checks")
    p.add_argument("--budget", type=float, metavar="SECONDS",
                   help="time allowed for gathering facts (default: the config's budget_s, "
                        "and below the interval)")
    return run


def run(args: "argparse.Namespace") -> int:
    from .. import engine

    config = load_config(args)
    if config is None:
        return 3
    settings = exporter_config(config)
    try:
        engine.select_checks(config, args.only, args.skip)
    except engine.SelectionError as e:
        return fail(str(e))
    if args.budget is not None and not 0.1 <= args.budget <= 300:
        return fail("--budget must be between 0.1 and 300 seconds")
    textfile = args.textfile or None
    if textfile is not None:
        return write_once(config, args, textfile)
    interval = args.interval if args.interval is not None else settings.interval_s
    if not 1.0 <= interval <= 3600.0:
        return fail("--interval must be between 1 and 3600 seconds")
    return serve(config, args, args.listen or settings.listen, interval)


def write_once(config: Config, args: "argparse.Namespace", directory: str) -> int:
    from ..exporters import prometheus
    from ..metrics_server import Refresher

    if not os.path.isdir(directory):
        return fail(f"{directory}: no such directory (create it, or point --textfile at "
                    "node_exporter's --collector.textfile.directory)")
    budget = args.budget if args.budget is not None else config.budget_s
    refresher = Refresher(config, args.root, args.only, args.skip, 0.0, budget)
    # A failed run keeps the last success the previous file recorded.
    refresher.record = prometheus.RunRecord(None, 0.0, False,
                                            prometheus.read_last_success(directory))
    record = refresher.run_once()
    try:
        prometheus.write_textfile(directory, record)
    except OSError as e:
        return fail(f"{directory}: cannot write {prometheus.TEXTFILE_NAME}: {e.strerror}")
    return 0 if record.report is not None else 3


def serve(config: Config, args: "argparse.Namespace", listen: str, interval: float) -> int:
    import sys

    from ..metrics_server import Refresher
    from ..metrics_server import serve as serve_forever

    try:
        address = parse_listen(listen)
    except ValueError as e:
        return fail(str(e))
    budget = args.budget if args.budget is not None else min(
        config.budget_s, max(1.0, interval * 0.8))
    refresher = Refresher(config, args.root, args.only, args.skip, interval, budget)
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    def announce(line: str) -> None:
        print(f"mps-health exporter: {line}", file=sys.stderr, flush=True)

    try:
        serve_forever(refresher, address, announce, stop)
    except OSError as e:  # asyncio words it at length; the errno says it in the usual words
        return fail(f"cannot listen on {listen}: {os.strerror(e.errno) if e.errno else e}")
    return 0
