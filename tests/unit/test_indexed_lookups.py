"""Checks look instances up in indexes built once per run: the same answers as scanning
every process per instance, which was quadratic with many instances."""

import itertools
from typing import List, Optional, Tuple

from mps_health.checks.common import live_daemons
from mps_health.model.facts import DirFact, Instance, ProcessFact
from mps_health.probes.instances import pipe_paths
from mps_health.probes.process_identity import is_daemon


def scanned(inst: Instance, procs: Tuple[ProcessFact, ...], pipe: Optional[DirFact],
            root: str) -> List[ProcessFact]:
    """The rule, written as the plain scan."""
    paths = pipe_paths(inst, root)
    controls = [p for p in procs if is_daemon(p)]
    found = [p for p in controls if p.pipe_dir in paths]
    if not found and pipe is not None and pipe.pid_file and pipe.pid_file.isdigit():
        found = [p for p in controls if p.pid == int(pipe.pid_file) and not p.environ_readable]
    return found


def test_live_daemons_finds_what_a_scan_finds() -> None:
    dirs = ["/tmp/a", "/tmp/b", "/r/tmp/a", None]
    procs = tuple(
        ProcessFact(pid, 1, state, 0, role, (), 1, pipe_dir, readable)
        for pid, (state, role, pipe_dir, readable) in enumerate(itertools.product(
            "SZ", ("control", "server"), dirs, (True, False)), start=100))
    procs += (procs[0]._replace(pid=100),)  # a pid seen twice (two roots, a race)
    for root, name, pid_file in itertools.product(("/", "/r"), ("/tmp/a", "/tmp/c"),
                                                  (None, "100", "103", "x")):
        inst = Instance("i", "node", name, "/var/log/x")
        pipe = DirFact(name, "dir", pid_file=pid_file)
        for facts in (procs, procs[::-1], procs[:5]):  # a new tuple is indexed anew
            assert live_daemons(inst, facts, pipe, root) == scanned(inst, facts, pipe, root)
