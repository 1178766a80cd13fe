"""gres.conf as slurmd reads it: node lines, ranges, continuations, Include, AutoDetect."""

import os
from pathlib import Path

import pytest
from conftest import FIXTURES, fixture_text
from mps_health.config.load import from_mapping
from mps_health.probes.context import Context
from mps_health.probes.gres_conf import GresLine, parse_count, parse_gres_conf, read_gres_conf
from mps_health.probes.hostlist import ParseError, expand

MAIN = "gres.conf__HANDWRITTEN_mixed-cluster.conf"


def parse_for(node: str):
    def read(path: str) -> str:
        return (FIXTURES / os.path.basename(path)).read_text()

    return parse_gres_conf(fixture_text(MAIN), node, f"{FIXTURES}/{MAIN}", read)


def test_h200_node_gets_its_ranges() -> None:
    conf = parse_for("gpu02")
    assert conf.autodetect == "off"
    gpu, mps, bandwidth = conf.lines
    assert gpu.name == "gpu" and gpu.type == "h200"
    assert gpu.files == tuple(f"/dev/nvidia{i}" for i in range(8)) and gpu.quantity == 8
    assert mps.files == tuple(f"/dev/nvidia{i}" for i in range(4)) and mps.quantity == 400
    assert (bandwidth.name, bandwidth.quantity) == ("bandwidth", 4 * 1024**3)  # from Include
    assert conf.errors == ()


def test_old_node_continuation_lowercase_keys_and_include() -> None:
    conf = parse_for("old10")
    assert conf.autodetect == "nvml"
    gpu = conf.lines[0]
    assert gpu == GresLine(gpu.where, "gpu", "a100", ("/dev/nvidia0", "/dev/nvidia1"), 2)
    assert gpu.where.endswith(f"{MAIN}:8")  # the continued line is reported by its first line
    mps = conf.lines[1]
    assert (mps.name, mps.quantity, mps.files) == ("mps", 200, ("/dev/nvidia0", "/dev/nvidia1"))
    assert mps.where.endswith("gres.conf.d__HANDWRITTEN_extra.conf:2")


def test_other_node_gets_only_global_lines() -> None:
    conf = parse_for("login1")
    assert [ln.name for ln in conf.lines] == ["bandwidth"]


def test_bad_lines_are_reported_one_each_and_the_rest_kept() -> None:
    text = ("Name=gpu File=/dev/nvidia[0-1]\nName=gpu File=/dev/nvidia[3-1]\nFoo=bar\n"
            "Name=mps Count=lots\nName=gpu Name=mps\nInclude\nCount=3\n")
    conf = parse_gres_conf(text, "n1", "/etc/slurm/gres.conf")
    assert len(conf.lines) == 1
    assert [e.split(": ", 1)[0] for e in conf.errors] == [
        f"/etc/slurm/gres.conf:{n}" for n in (2, 3, 4, 5, 6, 7)]
    assert "runs backwards" in conf.errors[0]
    assert "unknown key 'Foo'" in conf.errors[1]


def test_missing_include_is_an_error_line() -> None:
    def read(path: str) -> str:
        raise FileNotFoundError(2, "No such file or directory")

    conf = parse_gres_conf("Include extra.conf\n", "n1", "/etc/slurm/gres.conf", read)
    assert conf.errors == ("/etc/slurm/gres.conf:1: Include /etc/slurm/extra.conf: "
                           "No such file or directory",)


def test_include_loop_is_bounded() -> None:
    conf = parse_gres_conf("Include self.conf\n", "n1", "/x/self.conf",
                           lambda p: "Include self.conf\n")
    assert any("nested more than" in e for e in conf.errors)


@pytest.mark.parametrize("expr,names", [
    ("n1", ["n1"]), ("gpu[01-03]", ["gpu01", "gpu02", "gpu03"]),
    ("a[1,3-4],b", ["a1", "a3", "a4", "b"]), ("r[1-2]c[1-2]", ["r1c1", "r1c2", "r2c1", "r2c2"]),
    ("n[08-10]", ["n08", "n09", "n10"])])
def test_hostlist(expr: str, names) -> None:
    assert expand(expr) == names


@pytest.mark.parametrize("bad", ["n[1-", "n]", "n[a-b]", "n[[1]]", "n[0-99999999]"])
def test_bad_hostlist(bad: str) -> None:
    with pytest.raises(ParseError):
        expand(bad)


def test_count_suffixes() -> None:
    assert parse_count("100") == 100 and parse_count("4G") == 4 * 1024**3
    assert parse_count("2k") == 2048 and parse_count("1P") == 1024**5
    for bad in ("4X", "", "G", "\u00b2", "9" * 5000):  # a superscript, a digit run int() refuses
        with pytest.raises(ParseError):
            parse_count(bad)


def test_read_stats_devices_under_root(tmp_path: Path) -> None:
    etc = tmp_path / "etc" / "slurm"
    dev = tmp_path / "dev"
    etc.mkdir(parents=True)
    dev.mkdir()
    (dev / "nvidia0").write_text("")  # a plain file: what Slurm rejects
    (etc / "gres.conf").write_text("Name=gpu File=/dev/nvidia[0-1]\n")
    ctx = Context(from_mapping({"node_name": "n1"}, None), root=str(tmp_path))
    conf = read_gres_conf(ctx, "/etc/slurm/gres.conf", "n1")
    assert conf.found
    assert [(d.path, d.kind) for d in conf.devices] == [("/dev/nvidia0", "file"),
                                                        ("/dev/nvidia1", "missing")]
    assert not read_gres_conf(ctx, "/etc/slurm/none.conf", "n1").found


def test_real_device_node_gives_its_minor() -> None:
    # /dev/null is a character device on every Linux (1, 3): the same stat path as /dev/nvidiaN.
    ctx = Context(from_mapping({}, None))
    from mps_health.probes.gres_conf import device_kind

    dev = device_kind("/dev/null")
    assert (dev.kind, dev.minor) == ("char", 3)
    assert ctx.path("/dev/null") == "/dev/null"
