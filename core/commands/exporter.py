"""``mps-health exporter``: Prometheus metrics over HTTP, or once into a textfile.

Served: ``mps-health exporter [--listen :10102]`` runs the checks every ``--interval``
seconds in a background thread and answers scrapes from the last run's results.
Textfile: ``mps-health exporter --textfile DIR`` runs once and writes DIR/mps_health.prom
atomically, for node_exporter's textfile collector and a systemd timer; it exits 0 once
the file is written (the node's health is in the metrics), 3 when it cannot be.

Port 10102: the Prometheus wiki's default-port list has no room left in 9100-9999, and
new exporters register above 10000; see docs/monitoring.md.
"""

import argparse
import os
import signal
import threading
from typing import Callable, NamedTuple

from ..config import Config, ConfigError
from .common import fail, load_config, names

DEFAULT_PORT = 10102
DEFAULT_LISTEN = f":{DEFAULT_PORT}"
DEFAULT_INTERVAL_S = 30.0


class ExporterConfig(NamedTuple):
    listen: str = DEFAULT_LISTEN
    interval_s: float = DEFAULT_INTERVAL_S


def exporter_config(config: Config) -> ExporterConfig:
    """The config's ``exporter`` section, checked key by key (ConfigError on a bad one)."""
    from ..config import _Validator
    from ..metrics_server import parse_listen

    section = config.section("exporter")
    v = _Validator(config.path or "<defaults>")
    v.known(section, {"listen", "interval_s"}, "exporter")
    listen = v.string(section, "listen", DEFAULT_LISTEN, "exporter")
    try:
        parse_listen(str(listen))
    except ValueError as e:
        v.fail("exporter.listen", str(e))
    interval = v.number(section, "interval_s", DEFAULT_INTERVAL_S, "exporter", low=1.0,
                        high=3600.0)
    return ExporterConfig(str(listen), interval)


def register(p: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
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


def run(args: argparse.Namespace) -> int:
    from .. import engine

    config = load_config(args)
    if config is None:
        return 3
    try:
        settings = exporter_config(config)
    except ConfigError as e:
        return fail(str(e))
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


def write_once(config: Config, args: argparse.Namespace, directory: str) -> int:
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


def serve(config: Config, args: argparse.Namespace, listen: str, interval: float) -> int:
    import sys

    from ..metrics_server import Refresher, parse_listen
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
