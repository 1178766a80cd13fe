"""`mps-health contrib`: the files the package carries for the node's other programs,
listed with where they are and where they go; one printed, or its path."""

from clirun import mps_health
from conftest import REPO
from mps_health.cli.contrib import CARRIED


def test_every_listed_file_is_in_the_tree_and_listed_with_its_path() -> None:
    r = mps_health("contrib")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == len(CARRIED)
    for c, line in zip(CARRIED, lines):
        assert (REPO / c.name).is_file(), c.name
        name, path, _rest = line.split(None, 2)
        assert name == c.name and path.endswith(f"/{c.name}"), line
        assert f"(-> {c.goes})" in line


def test_one_file_by_its_name_or_its_short_names() -> None:
    want = (REPO / "contrib/systemd/nvidia-mps@.service").read_text()
    for name in ("contrib/systemd/nvidia-mps@.service", "systemd/nvidia-mps@.service",
                 "nvidia-mps@.service"):
        r = mps_health("contrib", name)
        assert r.returncode == 0 and r.stdout == want, (name, r.stderr)
    p = mps_health("contrib", "--path", "mps-health-alerts.yml")
    assert p.returncode == 0
    assert p.stdout.strip().endswith("/contrib/prometheus/mps-health-alerts.yml")
    assert (REPO / "contrib/prometheus/mps-health-alerts.yml").samefile(p.stdout.strip())


def test_a_name_the_package_does_not_carry_is_one_line_and_exit_3() -> None:
    for name in ("nope.service", "mps-health.conf", "../pyproject.toml"):
        r = mps_health("contrib", name)
        assert r.returncode == 3 and r.stdout == "", r
        assert r.stderr.splitlines() == [f"mps-health: the package carries no file '{name}': "
                                         "'mps-health contrib' lists them"], r.stderr
