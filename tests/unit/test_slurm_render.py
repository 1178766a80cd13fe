"""gres.conf and slurm.conf lines from recorded NVML facts, and --diff against installed files.

Recordings: the real H200 dump (1 GPU, tests/gpu/dump_nvml.py's format) and the 8-GPU
node recording (probe format; minors 2 and 3 swapped, GPU 5 with MIG on).
"""

import shutil
from pathlib import Path

import pytest
from clirun import mps_health
from conftest import FIXTURES, fixture_text
from mps_health.probes.nvml import read_nvml
from mps_health.slurm.gpus import GpusError, gres_gpus, load_recording, parse_choice
from mps_health.slurm.render import (
    diff_gres_conf,
    diff_slurm_conf,
    gres_lines,
    gres_value,
    render_gres_conf,
    render_slurm_conf,
)

H200 = "nvml_dump__h200-driver580.json"
EIGHT = "nvml__HANDWRITTEN_8gpu-h200-mixed.json"


def gpus_of(name: str, choice=None):
    facts = read_nvml(load_recording(fixture_text(name), name))
    return gres_gpus(facts, choice), facts.driver_version


def lines(text: str) -> list:
    return [x for x in text.splitlines() if x and not x.startswith("#")]


def test_real_h200_dump() -> None:
    gpus, driver = gpus_of(H200)
    assert driver == "580.159.04"
    text = render_gres_conf(gpus, "gpu01", driver, 100)
    assert lines(text) == ["Name=gpu File=/dev/nvidia0", "Name=mps Count=100 File=/dev/nvidia0"]
    assert "# GPU 0: NVIDIA H200 GPU-15679ef6-f0ce-236f-4585-607064cf111a" in text
    assert "NOTE" not in text


def test_eight_gpus_all_with_mps_in_device_file_order() -> None:
    gpus, driver = gpus_of(EIGHT)
    text = render_gres_conf(gpus, "gpu01", driver, 100)
    got = lines(text)
    assert got[:4] == ["Name=gpu File=/dev/nvidia0", "Name=mps Count=100 File=/dev/nvidia0",
                       "Name=gpu File=/dev/nvidia1", "Name=mps Count=100 File=/dev/nvidia1"]
    assert [x for x in got if x.startswith("Name=gpu")] == [
        f"Name=gpu File=/dev/nvidia{n}" for n in range(8)]
    # GPU 5 has MIG on: a gpu line, no mps line, and the comment says why.
    assert "Name=mps Count=100 File=/dev/nvidia5" not in got
    assert "GPU 5: NVIDIA H200 GPU-00000005-1111-2222-3333-444455550005 (MIG on" in text
    assert len([x for x in got if x.startswith("Name=mps")]) == 7
    # Minors 2 and 3 are swapped against the PCI order: the admin is told.
    assert "not in NVML (PCI bus) order" in text
    assert gres_value(gpus, 100) == "gpu:8,mps:700"


def test_mixed_node_mps_only_on_chosen_gpus() -> None:
    gpus, driver = gpus_of(EIGHT, parse_choice("0,1,2,3"))
    got = lines(render_gres_conf(gpus, "gpu01", driver, 100))
    assert len([x for x in got if x.startswith("Name=gpu")]) == 8
    # NVML GPUs 2 and 3 are /dev/nvidia3 and /dev/nvidia2.
    assert [x for x in got if x.startswith("Name=mps")] == [
        f"Name=mps Count=100 File=/dev/nvidia{n}" for n in (0, 1, 2, 3)]
    gpus, _ = gpus_of(EIGHT, parse_choice("GPU-00000003-1111-2222-3333-444455550003"))
    assert [g.minor for g in gpus if g.mps] == [2]
    assert gres_value(gpus, 100) == "gpu:8,mps:100"


def test_choices_and_their_errors() -> None:
    assert parse_choice("all") is None and parse_choice("none") == ()
    with pytest.raises(GpusError, match="--mps-gpus names 9, which this node does not have"):
        gpus_of(H200, ("9",))
    with pytest.raises(GpusError, match="takes all, none"):
        parse_choice(",")


def test_gpu_without_minor_number_is_a_clear_error() -> None:
    name = "nvml__HANDWRITTEN_8gpu-h200-gpu-lost.json"
    with pytest.raises(GpusError, match=r"GPU 3: NVML gives no minor number \(uuid: GPU_IS_LOST\)"):
        gpus_of(name)


def test_node_prefix_and_dev_dir() -> None:
    gpus, driver = gpus_of(H200)
    text = render_gres_conf(gpus, "gpu01", driver, 50, "/srv/dev/", node_prefix=True)
    assert lines(text) == ["NodeName=gpu01 Name=gpu File=/srv/dev/nvidia0",
                           "NodeName=gpu01 Name=mps Count=50 File=/srv/dev/nvidia0"]


def test_diff_ignores_comments_order_case_and_ranges() -> None:
    gpus, driver = gpus_of("nvml__HANDWRITTEN_2gpu-test-node.json")
    rendered = render_gres_conf(gpus, "gpu01", driver, 100)
    installed = """# hand written
NodeName=gpu[01-04] name=gpu File=/dev/nvidia[0-1]
NodeName=gpu[01-04] Name=mps File=/dev/nvidia[0-1] Count=200
NodeName=gpu05 Name=gpu File=/dev/nvidia7
"""
    assert diff_gres_conf(rendered, installed, "gpu01", "gres.conf") == ""
    assert gres_lines(installed, "gpu05") == ["Name=gpu File=/dev/nvidia7"]


def test_diff_shows_what_differs() -> None:
    gpus, driver = gpus_of("nvml__HANDWRITTEN_2gpu-test-node.json", ("0",))
    rendered = render_gres_conf(gpus, "gpu01", driver, 100)
    installed = "Name=gpu File=/dev/nvidia[0-1]\nName=mps Count=200 File=/dev/nvidia[0-1]\n"
    diff = diff_gres_conf(rendered, installed, "gpu01", "/etc/slurm/gres.conf")
    assert diff.splitlines()[:2] == ["--- /etc/slurm/gres.conf", "+++ from NVML"]
    assert "-Name=mps Count=100 File=/dev/nvidia1" in diff.splitlines()


def test_gres_conf_is_read_by_the_probes_reader() -> None:
    """One reader per input: the gres.conf probe's (continuations, Include, Files= and
    Count suffixes, quoted values), so --diff and the gres check read the same file alike;
    a line it cannot read is a difference, said where it is."""
    installed = ("NodeName=gpu[01-04] Name=gpu \\\n  File=/dev/nvidia[0-1] Cores=0-15\n"
                 "Include extra.conf\n"
                 "NodeName=gpu[01-02] Name=gpu Count=2 Files=/dev/nvidia[2-3]\n")
    extra = {"/etc/slurm/extra.conf": 'Name=mps Count="1K" File=/dev/nvidia[0-1]\n'}
    assert gres_lines(installed, "gpu01", "/etc/slurm/gres.conf", extra.__getitem__) == [
        "Name=gpu File=/dev/nvidia0", "Name=gpu File=/dev/nvidia1",
        "Name=mps Count=512 File=/dev/nvidia0", "Name=mps Count=512 File=/dev/nvidia1",
        "Name=gpu File=/dev/nvidia2", "Name=gpu File=/dev/nvidia3"]
    assert gres_lines("Name=gpu File=/dev/nvidia0 Bogus=1\nNodeName=gpu[x-y] Name=gpu\n",
                      "gpu01") == ["# gres.conf:1: unknown key 'Bogus'",
                                   "# gres.conf:2: bad range 'x-y' in 'gpu[x-y]' (expected "
                                   "N or N-M)"]
    gpus, driver = gpus_of(H200)
    rendered = render_gres_conf(gpus, "gpu01", driver, 100)
    diff = diff_gres_conf(rendered, "Include gres.d/a.conf\n", "gpu01", "/etc/slurm/gres.conf")
    assert "-# /etc/slurm/gres.conf:1: Include gres.d/a.conf not read" in diff.splitlines()


def test_slurm_conf_hostlists_are_the_probes() -> None:
    """NodeName= in slurm.conf is read by probes.hostlist: padding kept, brackets that
    repeat, and a malformed list names no node (never compared as written)."""
    rendered = render_slurm_conf(gpus_of(H200)[0], "gpu01", 100, "node", "/etc/slurm",
                                 "/x/hc", 300)
    want = "\n".join(lines(rendered)) + "\n"
    good = want + "NodeName=gpu[01-02]-ib[0-1],login1 Gres=gpu:1,mps:100\n"
    assert diff_slurm_conf(rendered, good, "gpu01-ib1", "slurm.conf") == ""
    bad = want + "NodeName=gpu[01-x] Gres=gpu:1,mps:100\n"
    assert "-NodeName=gpu01 (no Gres=)" in diff_slurm_conf(rendered, bad, "gpu01",
                                                           "slurm.conf").splitlines()


def test_slurm_conf_lines_for_per_job() -> None:
    gpus, _ = gpus_of(EIGHT, ("0", "1", "2", "3"))
    text = render_slurm_conf(gpus, "gpu01", 100, "per-job", "/etc/slurm",
                             "/usr/local/bin/mps-health-healthcheck", 300)
    assert lines(text) == [
        "GresTypes=gpu,mps",
        "SelectType=select/cons_tres",
        "Prolog=/etc/slurm/mps-health-prolog",
        "TaskProlog=/etc/slurm/mps-health-task-prolog",
        "Epilog=/etc/slurm/mps-health-epilog",
        "HealthCheckProgram=/usr/local/bin/mps-health-healthcheck",
        "HealthCheckInterval=300",
        "HealthCheckNodeState=ANY,CYCLE",
    ]
    assert "#   Gres=gpu:8,mps:400" in text


def test_slurm_conf_without_hooks_for_a_node_wide_daemon() -> None:
    gpus, _ = gpus_of(H200)
    text = render_slurm_conf(gpus, "gpu01", 100, "node", "/etc/slurm", "/x/hc", 60)
    assert not any(x.startswith(("Prolog=", "Epilog=", "TaskProlog=")) for x in lines(text))
    assert "mps.layout is node" in text


def test_slurm_conf_diff() -> None:
    gpus, _ = gpus_of(H200)
    rendered = render_slurm_conf(gpus, "gpu01", 100, "per-job", "/etc/slurm", "/x/hc", 300)
    good = "\n".join(lines(rendered)) + "\nNodeName=gpu[01-02] CPUs=8 Gres=gpu:1,mps:100\n"
    assert diff_slurm_conf(rendered, good, "gpu01", "slurm.conf") == ""
    bad = good.replace("Epilog=/etc/slurm/mps-health-epilog", "Epilog=/etc/slurm/old-epilog")
    bad = bad.replace("gresTypes=", "GresTypes=").replace("Gres=gpu:1,mps:100", "Gres=gpu:1")
    diff = diff_slurm_conf(rendered, bad, "gpu01", "slurm.conf").splitlines()
    assert "-Epilog=/etc/slurm/old-epilog" in diff and "+Epilog=/etc/slurm/mps-health-epilog" in diff
    assert "-NodeName=gpu01 Gres=gpu:1" in diff and "+NodeName=gpu01 Gres=gpu:1,mps:100" in diff


@pytest.fixture
def defaults(tmp_path: Path) -> tuple:
    """``--config`` of an empty file: the defaults, never the host's /etc/mps-health."""
    (tmp_path / "empty.yaml").write_text("")
    return ("--config", str(tmp_path / "empty.yaml"))


def test_cli_gres_conf_from_a_recording(defaults: tuple) -> None:
    r = mps_health("slurm", "gres-conf", *defaults, "--nvml-record", str(FIXTURES / EIGHT),
                   "--mps-gpus", "0", "--node-name", "gpu01")
    assert r.returncode == 0, r.stderr
    assert "Name=mps Count=100 File=/dev/nvidia0\n" in r.stdout
    assert r.stdout.count("Name=mps") == 1 and r.stdout.count("Name=gpu") == 8


def test_cli_diff_exit_codes(tmp_path: Path, defaults: tuple) -> None:
    record = str(FIXTURES / H200)
    same = tmp_path / "gres.conf"
    same.write_text("Name=gpu File=/dev/nvidia0\nName=mps Count=100 File=/dev/nvidia0\n")
    r = mps_health("slurm", "gres-conf", *defaults, "--nvml-record", record, "--diff", "--gres-conf",
                   str(same), "--node-name", "n1")
    assert (r.returncode, r.stdout.strip()) == (0, f"{same} matches NVML for n1")
    other = tmp_path / "gres-old.conf"
    other.write_text("Name=gpu File=/dev/nvidia0\n")
    r = mps_health("slurm", "gres-conf", *defaults, "--nvml-record", record, "--diff", "--gres-conf",
                   str(other), "--node-name", "n1")
    assert r.returncode == 1 and "+Name=mps Count=100 File=/dev/nvidia0" in r.stdout
    assert r.stderr.strip() == (f"mps-health: {other} differs from NVML for n1 "
                                "(- installed, + expected)")
    r = mps_health("slurm", "gres-conf", *defaults, "--nvml-record", record, "--diff", "--gres-conf",
                   str(tmp_path / "missing.conf"))
    assert r.returncode == 3 and "cannot read: No such file or directory" in r.stderr


def test_cli_diff_reads_includes(tmp_path: Path, defaults: tuple) -> None:
    """--diff reads the installed file as slurmd does, its Include files too."""
    (tmp_path / "gres.d").mkdir()
    (tmp_path / "gres.d" / "mps.conf").write_text("Name=mps Count=100 File=/dev/nvidia0\n")
    conf = tmp_path / "gres.conf"
    conf.write_text("Name=gpu File=/dev/nvidia0\nInclude gres.d/mps.conf\n")
    r = mps_health("slurm", "gres-conf", *defaults, "--nvml-record", str(FIXTURES / H200),
                   "--diff", "--gres-conf", str(conf), "--node-name", "n1")
    assert (r.returncode, r.stdout.strip()) == (0, f"{conf} matches NVML for n1"), r.stderr


@pytest.mark.parametrize("args, message", [
    (["--nvml-record", "/nonexistent.json"], "/nonexistent.json: cannot read"),
    (["--nvml-record", str(FIXTURES / "nvml__cpu-vm_no-driver.json")],
     "NVML: libnvidia-ml.so.1 not found: no NVIDIA driver is installed on this node"),
    (["--nvml-record", str(FIXTURES / H200), "--mps-gpus", "3"], "--mps-gpus names 3"),
    (["--nvml-record", str(FIXTURES / H200), "--count", "0"], "mps Count must be"),
])
def test_cli_errors_are_one_line_exit_3(args: list, message: str, defaults: tuple) -> None:
    r = mps_health("slurm", "gres-conf", *defaults, *args)
    assert r.returncode == 3 and r.stdout == ""
    assert len(r.stderr.splitlines()) == 1 and message in r.stderr, r.stderr


def test_cli_gres_conf_default_mps_gpus_from_the_config(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("gpu:\n  mps_gpus: [1]\nslurm:\n  mps_per_gpu: 50\n")
    r = mps_health("slurm", "gres-conf", "--config", str(config), "--nvml-record",
                   str(FIXTURES / EIGHT))
    assert r.returncode == 0, r.stderr
    assert [x for x in lines(r.stdout) if "mps" in x] == ["Name=mps Count=50 File=/dev/nvidia1"]


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine has a driver")
def test_cli_without_a_driver_says_so_in_one_line(defaults: tuple) -> None:
    r = mps_health("slurm", "gres-conf", *defaults)
    assert r.returncode == 3 and r.stdout == "" and len(r.stderr.splitlines()) == 1
    assert r.stderr.startswith("mps-health: NVML: ")


def test_cli_conf_without_nvml_writes_every_line_but_the_gres(defaults: tuple) -> None:
    """slurm.conf's lines need no GPU but the node's Gres=: the controller, a login node
    or a node without the driver still gets them, and the missing line is named."""
    r = mps_health("slurm", "conf", *defaults, "--node-name", "n1", "--nvml-record",
                   str(FIXTURES / "nvml__cpu-vm_no-driver.json"))
    assert r.returncode == 0, r.stderr
    assert "GresTypes=gpu,mps" in r.stdout and "HealthCheckProgram=" in r.stdout
    assert "Gres=gpu" not in r.stdout
    assert "# The NodeName=n1 line's Gres= is not written: NVML: libnvidia-ml.so.1 not found" \
        in r.stdout
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("mps-health: note: NVML: ")
    # a recording that cannot be read is still an error
    bad = mps_health("slurm", "conf", *defaults, "--nvml-record", "/nonexistent.json")
    assert bad.returncode == 3 and "cannot read" in bad.stderr


def test_health_check_program_is_the_readmes_where_the_readme_linked_it(tmp_path: Path) -> None:
    """`slurm conf` names the health check where the README's install links it; the README
    and the runbooks name that one path."""
    import os
    import re
    import sysconfig

    from conftest import REPO
    from mps_health.cli.slurm import HEALTH_CHECK, LINK_DIRS, health_check_default
    from nodeinstall import readme_block

    # The README links it into LINK_DIRS[0]; every HealthCheckProgram= in the docs is there.
    linked = readme_block("node-install")
    assert re.search(rf"ln -sf [^\n]*/{HEALTH_CHECK} [^\n]*{LINK_DIRS[0]}/\n", linked), linked
    said = {m for f in (REPO / "README.md", *sorted((REPO / "docs").glob("*.md")))
            for m in re.findall(r"HealthCheckProgram=(/\S+?)[`\s]", f.read_text())}
    assert said == {f"{LINK_DIRS[0]}/{HEALTH_CHECK}"}
    # Linked so: `slurm conf` says that path, with no note.
    own = os.path.join(sysconfig.get_path("scripts"), HEALTH_CHECK)
    local, sbin = tmp_path / "local-sbin", tmp_path / "sbin"
    local.mkdir()
    sbin.mkdir()
    (sbin / HEALTH_CHECK).symlink_to(own)
    (local / HEALTH_CHECK).symlink_to(own)
    assert health_check_default((str(local), str(sbin))) == (f"{local}/{HEALTH_CHECK}", "")
    (local / HEALTH_CHECK).unlink()
    (local / HEALTH_CHECK).symlink_to("/bin/true")  # someone else's: not ours to name
    assert health_check_default((str(local), str(sbin))) == (f"{sbin}/{HEALTH_CHECK}", "")
    program, note = health_check_default((str(local),))
    assert program == own and note.startswith(f"{HEALTH_CHECK} of this installation is not "
                                              f"linked into {local}")
    rendered = render_slurm_conf((), "n1", 100, "node", "/etc/slurm", program, 300,
                                 "no NVML", note)
    assert f"# {note}\nHealthCheckProgram={own}\n" in rendered
    assert "Prolog=" not in rendered.replace("# No Prolog/", "")
