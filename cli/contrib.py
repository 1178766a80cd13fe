"""``mps-health contrib``: the files the package carries for the node's other programs.

The systemd units, the Nagios and Icinga 2 definitions, the Prometheus alert rules and
the example config travel in the wheel (package data), so a node installed from wheels
alone has them. No name: each file, where the package holds it and where it goes.
``mps-health contrib NAME``: that file's text, to redirect into place; ``--path``: where
it is instead.
"""

import argparse
import importlib.resources
from typing import Callable, NamedTuple, Tuple

from mps_health.cli.common import emit, written
from mps_health.model.exitcodes import ExitCode, Failure
from mps_health.model.printable import escape
from mps_health.model.runbook import read_data


class Carried(NamedTuple):
    name: str  # under the package, as `mps-health contrib NAME` takes it
    goes: str  # where it is put on the node (README, "Install on a node")


# Every file here is package data (pyproject.toml); tests/fleet checks the wheel holds it.
CARRIED: Tuple[Carried, ...] = (
    Carried("contrib/config.example.yaml", "/etc/mps-health/config.yaml"),
    Carried("contrib/systemd/nvidia-mps.service", "/etc/systemd/system/"),
    Carried("contrib/systemd/nvidia-mps@.service", "/etc/systemd/system/"),
    Carried("contrib/systemd/mps-health-textfile.service", "/etc/systemd/system/"),
    Carried("contrib/systemd/mps-health-textfile.timer", "/etc/systemd/system/"),
    Carried("contrib/systemd/mps-health-exporter.service", "/etc/systemd/system/"),
    # By hand, 'mps-health remediate tmpfiles-guard' writes the guard for the paths
    # configured; this one, for every layout's defaults, is the packages'.
    Carried("contrib/systemd/tmpfiles.d/mps-health.conf", "/usr/lib/tmpfiles.d/ (packages)"),
    Carried("contrib/nagios/mps-health.cfg", "the Nagios server's object dir"),
    Carried("contrib/icinga2/mps-health.conf", "the Icinga 2 server's conf.d"),
    Carried("contrib/prometheus/mps-health-alerts.yml", "the Prometheus server's rule_files"),
    # The units' Documentation= (file:/opt/mps-health/README.md) names this one.
    Carried("README.md", "a link at /opt/mps-health/README.md"),
)


def register(p: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
    p.add_argument("name", nargs="?", metavar="NAME",
                   help="a file as listed, e.g. contrib/systemd/nvidia-mps.service (the "
                        "'contrib/' may be left out); none: list them")
    p.add_argument("--path", action="store_true",
                   help="print where the package holds the file, not its text")
    return run


def where(name: str) -> str:
    """The file's path in the installed package (the package is a folder: pip installs
    wheels unpacked)."""
    return str(importlib.resources.files("mps_health").joinpath(name))


def chosen(name: str) -> Carried:
    """The carried file ``name`` names: its listed name, without 'contrib/', or its
    file name alone where only one has it."""
    for c in CARRIED:
        if name in (c.name, c.name.removeprefix("contrib/")):
            return c
    by_file = [c for c in CARRIED if c.name.rsplit("/", 1)[-1] == name]
    if len(by_file) == 1:
        return by_file[0]
    raise Failure(f"the package carries no file '{escape(name, 80)}': 'mps-health contrib' "
                  "lists them", ExitCode.UNKNOWN)


def run(args: argparse.Namespace) -> int:
    if args.name is None:
        width = max(len(c.name) for c in CARRIED)
        emit("\n".join(f"{c.name:<{width}}  {where(c.name)}  (-> {c.goes})" for c in CARRIED))
        return ExitCode.OK
    found = chosen(args.name)
    if args.path:
        emit(where(found.name))
        return ExitCode.OK
    text = read_data(found.name)
    written(lambda out: out.write(text))
    return ExitCode.OK
