"""``mps-health exporter``: Prometheus metrics over HTTP, or once into a textfile.

Served (``--listen``, by default ``:10102``: every IPv4 address): the checks run every
``--interval`` seconds in a background thread; scrapes get the last run's results.
``--textfile DIR``: one run writes DIR/mps_health.prom atomically (node_exporter's
textfile collector, a systemd timer); exit 0 once it is written (the node's health is
in the metrics), 3 when it cannot be.
The config section and listen address parsing are in mps_health.config.exporter.
"""

import argparse
import os
import signal
import sys
import threading
import time
from typing import Callable, Optional

from mps_health.cli.common import add_common, boot_grace, load_config, one_line
from mps_health.config.exporter import (
    DEFAULT_INTERVAL_S,
    DEFAULT_LISTEN,
    exporter_config,
    parse_listen,
)
from mps_health.config.load import Config
from mps_health.engine import run as engine
from mps_health.exporters import prometheus
from mps_health.exporters.fdbudget import RESERVE_FDS, connection_budget
from mps_health.exporters.http import serve as serve_http
from mps_health.healthcheck import state as hcstate
from mps_health.model.exitcodes import Failure
from mps_health.probes.context import Context


def register(p: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
    add_common(p, "time allowed for gathering facts (default: the config's budget_s, and "
               "below the interval)")
    p.add_argument("--listen", metavar="HOST:PORT",
                   help=f"address to serve /metrics on (default: the config's exporter.listen, "
                        f"else {DEFAULT_LISTEN}: port {DEFAULT_LISTEN.lstrip(':')} on every IPv4 "
                        "address of the node; 127.0.0.1:PORT for this node only, [::]:PORT "
                        "for IPv6; port 0 picks a free one)")
    p.add_argument("--interval", type=float, metavar="SECONDS",
                   help=f"seconds between runs (default: exporter.interval_s, "
                        f"{DEFAULT_INTERVAL_S:g})")
    p.add_argument("--textfile", metavar="DIR",
                   help="run once and write DIR/mps_health.prom for node_exporter's "
                        "textfile collector, instead of serving")
    return run


def run(args: argparse.Namespace) -> int:
    config = load_config(args)
    settings = exporter_config(config)
    engine.select_checks(config, args.only, args.skip)
    if args.textfile:
        return write_once(config, args, args.textfile)
    interval = args.interval if args.interval is not None else settings.interval_s
    if not 1.0 <= interval <= 3600.0:
        raise Failure("--interval must be between 1 and 3600 seconds")
    return serve(config, args, args.listen or settings.listen, interval)


class Refresher:
    """Runs the checks every ``interval_s`` and keeps the rendered exposition: a scrape
    only reads ``page``. When runs stop finishing, ``mps_health_last_run_timestamp_seconds``
    stops moving: that is what the alert watches."""

    def __init__(self, config: Config, args: argparse.Namespace, interval_s: float,
                 budget_s: float) -> None:
        self.config, self.root, self.only, self.skip = config, args.root, args.only, args.skip
        self.interval_s, self.budget_s = interval_s, budget_s
        self.record: Optional[prometheus.RunRecord] = None
        self.page: bytes = prometheus.exposition(None)  # build info until the first run

    def run_once(self) -> prometheus.RunRecord:
        previous = self.record.last_success_at if self.record is not None else None
        try:
            _, report = engine.run(self.config, self.root, self.only, self.skip, self.budget_s,
                                   boot_grace_s=boot_grace(self.config))
        except Exception as e:  # the engine never raises for a bad node; say so and go on
            print(f"mps-health exporter: run failed: {one_line(e)}", file=sys.stderr)
            record = prometheus.RunRecord(None, time.time(), False, previous, error=one_line(e))
        else:
            now = time.time()
            ok = prometheus.run_success(report)
            record = prometheus.RunRecord(report, now, ok, now if ok else previous)
        record = record._replace(healthcheck_s=healthcheck_duration(self.config, self.root))
        # One reference each, set once the page is rendered: a scrape sees either.
        self.record, self.page = record, prometheus.exposition(record)
        return record

    def loop(self, stop: threading.Event) -> None:
        while not stop.is_set():
            started = time.monotonic()
            self.run_once()
            stop.wait(max(0.0, self.interval_s - (time.monotonic() - started)))


def healthcheck_duration(config: Config, root: str) -> Optional[float]:
    """The last health check run's duration from its state file; None where none ran. (A
    run that lost the memory of our drain, ``known=no``, still ran and took its time.)"""
    state = hcstate.load(os.path.join(Context(config, root).path(config.state_dir),
                                      hcstate.STATE_FILE))
    return state.duration_s if state.duration_s > 0 else None


def write_once(config: Config, args: argparse.Namespace, directory: str) -> int:
    if not os.path.isdir(directory):
        raise Failure(f"{directory}: no such directory (create it, or point --textfile at "
                      "node_exporter's --collector.textfile.directory)")
    budget = args.budget if args.budget is not None else config.budget_s
    refresher = Refresher(config, args, 0.0, budget)
    # A failed run keeps the last success the previous file recorded.
    refresher.record = prometheus.RunRecord(None, 0.0, False,
                                            prometheus.read_last_success(directory))
    record = refresher.run_once()
    try:
        prometheus.write_textfile(directory, record)
    except OSError as e:
        raise Failure(f"{directory}: cannot write {prometheus.TEXTFILE_NAME}: "
                      f"{e.strerror}") from None
    return 0 if record.report is not None else 3


def serve(config: Config, args: argparse.Namespace, listen: str, interval: float) -> int:
    try:
        address = parse_listen(listen)
    except ValueError as e:
        raise Failure(str(e)) from None
    # The connection cap the open-file limit allows, and a note for the start line when
    # that is below exporter.max_connections.
    settings = exporter_config(config)
    fds = connection_budget(settings.max_connections)
    if fds.cap < 1:
        raise Failure(f"the open-file limit ({fds.limit}) leaves no room for connections "
                      f"after {RESERVE_FDS} kept for the checks: raise it (LimitNOFILE= in "
                      "the unit, ulimit -n)")
    note = ""
    if fds.cap < settings.max_connections:
        note = (f"; at most {fds.cap} connections, not exporter.max_connections "
                f"{settings.max_connections}: the open-file limit {fds.limit} keeps "
                f"{RESERVE_FDS} for the checks (raise LimitNOFILE=)")
    budget = args.budget if args.budget is not None else \
        engine.budget_within(interval, config.budget_s)
    refresher = Refresher(config, args, interval, budget)
    stop = threading.Event()
    checks = threading.Thread(target=refresher.loop, args=(stop,), name="checks", daemon=True)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda _signum, _frame: stop.set())

    def listening(url: str) -> None:
        print(f"mps-health exporter: serving {url}, checks every {interval:g}s "
              f"(budget {budget:g}s){note}", file=sys.stderr, flush=True)
        checks.start()

    try:
        serve_http(lambda: refresher.page, address, listening, stop,
                   settings._replace(max_connections=fds.cap))
    except OSError as e:  # the errno says it in the usual words
        raise Failure(f"cannot listen on {listen}: "
                      f"{os.strerror(e.errno) if e.errno else e}") from None
    finally:
        # Let a run in flight end, so its bounded commands are killed by their deadline.
        if checks.is_alive():
            checks.join(budget + 2.0)
    return 0
