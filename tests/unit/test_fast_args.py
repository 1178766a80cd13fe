"""The hand parsers of `check` and `healthcheck` (what slurmd, cron and monitoring run
every few minutes) read their arguments as argparse does, and leave anything unusual to
argparse, which stays the one definition of the interface."""

import pytest
from mps_health.cli.main import fast_args
from mps_health.cli.parser import build


def argparse_view(argv):
    ns = vars(build(argv).parse_args(argv))
    return {k: v for k, v in ns.items() if k not in ("handler", "command")}


@pytest.mark.parametrize("argv", [
    ["check"], ["check", "-v"], ["check", "--config", "/etc/x.yaml", "--format=json"],
    ["check", "--only", "control,daemon", "--skip=tmpfiles", "--root", "/tmp", "--verbose"],
    ["check", "--only=a, b,", "--format", "text"],
    ["healthcheck"], ["healthcheck", "--detached"], ["healthcheck", "--foreground", "-n"],
    ["healthcheck", "--config=/etc/mps-health/config.yaml", "--dry-run", "--root", "/"],
    ["healthcheck", "--detached", "--detached"], ["healthcheck", "--root", "/tmp"],
])
def test_plain_arguments_read_as_argparse_reads_them(argv) -> None:
    fast = fast_args(argv)
    assert fast is not None and vars(fast) == argparse_view(argv)


@pytest.mark.parametrize("argv", [
    [], ["snapshot"], ["check", "-h"], ["check", "--replay", "x.json"], ["check", "--budget", "5"],
    ["check", "--format", "xml"], ["check", "--root", "relative"], ["check", "--root", "/nonexistent"],
    ["check", "--config"], ["check", "--config", "--only"], ["check", "--config="],
    ["healthcheck", "--detached", "--foreground"], ["healthcheck", "-v"], ["healthcheck", "--only", "x"],
    ["healthcheck", "--help"], ["healthcheck", "-nv"],
])
def test_anything_else_goes_to_argparse(argv) -> None:
    assert fast_args(argv) is None
