"""Whatever blocks, a run ends, with the command's own line and exit code.

A FIFO planted where a probe reads (tmpfiles.d, /proc, the log dir, the pid file) never
blocks: every read is non-blocking and takes regular files only. What still hangs (a
site's source reading a FIFO stands in for a hung file system) is abandoned at the
run's limit (``engine.bounded``): ``mps-health check`` says so on stderr (exit 3),
``check_mps`` prints its documented timeout line at ``-t`` (exit 3), the health check
reports healthcheck-timeout, and every command the run started is killed.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

import pytest
from clirun import argv, check_mps, mps_health
from nodesite import Site
from paths import FAKE_CONTROL
from roottree import add_dir, add_pipe_dir, add_process

SITE_HANG = '''
"""A site source that hangs, as a read from a hung file system does."""

import os

from mps_health.engine import registry
from mps_health.hostio.runner import Pending


def gather(ctx, instances):
    child = Pending(["sleep", "600"])
    with open(os.environ["SITE_CHILD"], "w") as f:
        f.write(str(child.pid))
    with open(os.environ["SITE_FIFO"]) as f:  # no writer: never returns
        return f.read()


def check(facts, config):
    return iter(())


registry.source("site-fifo", lambda: registry.Probe(gather, str))
registry.check("site-hang", "site_hang:check", ("site-fifo",))
'''


def _fifos_everywhere(tree: Path) -> None:
    """A --root tree whose files the probes read are FIFOs wherever one can be planted."""
    add_process(tree, 4242, pipe_dir="/tmp/nvidia-mps")
    pipe = add_pipe_dir(tree, "/tmp/nvidia-mps", 4242)
    (pipe / "nvidia-cuda-mps-control.pid").unlink()
    os.mkfifo(pipe / "nvidia-cuda-mps-control.pid")
    add_process(tree, 4343, pipe_dir="/tmp/nvidia-mps", role="server")
    for name in ("cmdline", "environ"):  # its comm matches: these are read next
        (tree / "proc" / "4343" / name).unlink()
        os.mkfifo(tree / "proc" / "4343" / name)
    d = tree / "proc" / "4444"
    d.mkdir()
    for name in ("comm", "stat", "status", "cmdline", "environ"):
        os.mkfifo(d / name)
    tmpfiles = tree / "etc" / "tmpfiles.d"
    tmpfiles.mkdir(parents=True)
    os.mkfifo(tmpfiles / "planted.conf")
    logs = add_dir(tree, "/var/log/nvidia-mps")
    for name in ("control.log", "server.log"):
        os.mkfifo(logs / name)


def test_fifos_where_the_probes_read_never_block_a_run(tmp_path: Path, site: Site) -> None:
    tree = tmp_path / "tree"
    _fifos_everywhere(tree)
    cfg = site.config(mps=None)  # the default pipe dir, in the tree
    # Before, the tmpfiles read alone never returned (the run was killed by hand).
    r = mps_health("check", "--root", str(tree), "--config", cfg, "--budget", "3",
                   "--format", "json", timeout=60)
    report = json.loads(r.stdout)
    by_code = {p["code"]: p for p in report["problems"]}
    assert "facts-unavailable" not in by_code, report["problems"]
    # FIFOs as the daemon's logs are no logs of its own: judged by lstat, never opened.
    bad = [p for p in report["problems"] if p["code"] == "log-file-bad"]
    assert sorted(p["message"].split(" is ")[1] for p in bad) == [
        "a fifo owned by uid 0, not the daemon's own log: not read"] * 2, bad
    daemon = [x for c in report["checks"] if c["name"] == "daemon" for x in c["results"]]
    assert [x["state"] for x in daemon] == ["OK"], daemon  # 4242 found, FIFOs skipped
    tmpfiles = [x for c in report["checks"] if c["name"] == "tmpfiles" for x in c["results"]]
    assert [x["message"] for x in tmpfiles] == [
        "/tmp/nvidia-mps is not under an aged path, as far as could be read: "
        "/etc/tmpfiles.d/planted.conf: cannot read: not a regular file"]
    r = check_mps("--root", str(tree), "--config", cfg, "-t", "5", timeout=60)
    assert "timed out" not in r.stdout and "facts-unavailable" not in r.stdout, r.stdout


def test_tmpfiles_read_follows_root_links_and_masks(tmp_path: Path) -> None:
    """Non-blocking reads keep systemd's rules: a link to /dev/null masks a file, a link
    elsewhere is read (in the tree, under --root)."""
    from mps_health.config.load import from_mapping
    from mps_health.probes import tmpfiles
    from mps_health.probes.context import Context

    tree = tmp_path / "tree"
    etc, lib = tree / "etc" / "tmpfiles.d", tree / "usr" / "lib" / "tmpfiles.d"
    etc.mkdir(parents=True)
    lib.mkdir(parents=True)
    (lib / "masked.conf").write_text("d /tmp/masked 0755 root root 10d\n")
    (etc / "masked.conf").symlink_to("/dev/null")
    (lib / "real.conf").write_text("d /tmp/real 0755 root root 10d\n")
    (etc / "linked.conf").symlink_to("/usr/lib/tmpfiles.d/real.conf")  # absolute: in the tree
    os.mkfifo(etc / "fifo.conf")
    facts = tmpfiles.gather(Context(from_mapping({}, "test"), str(tree)))
    assert sorted(r.path for r in facts.rules) == ["/tmp/real", "/tmp/real"]
    assert facts.errors == ("/etc/tmpfiles.d/fifo.conf: cannot read: not a regular file",)


def test_gres_conf_that_is_a_fifo_is_an_error_not_a_hang(tmp_path: Path) -> None:
    from mps_health.config.load import from_mapping
    from mps_health.probes.context import Context
    from mps_health.probes.gres_conf import read_gres_conf

    os.mkfifo(tmp_path / "gres.conf")
    conf = read_gres_conf(Context(from_mapping({}, "test")), str(tmp_path / "gres.conf"), "n1")
    assert conf.errors == (f"{tmp_path}/gres.conf: cannot read: not a regular file",)


def _site(tmp_path: Path, site: Site, extra: str = "") -> Dict[str, str]:
    """A config running only the hanging site check; the environment that finds it."""
    modules = tmp_path / "site"
    modules.mkdir()
    (modules / "site_hang.py").write_text(SITE_HANG)
    os.mkfifo(tmp_path / "fifo")
    site.config(extra, checks={"modules": ["site_hang"], "only": ["site-hang"]})
    return {"PYTHONPATH": os.pathsep.join(p for p in (str(modules),
                                                      os.environ.get("PYTHONPATH")) if p),
            "SITE_FIFO": str(tmp_path / "fifo"), "SITE_CHILD": str(tmp_path / "child")}


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


def test_a_hung_source_ends_check_at_its_limit_and_kills_its_commands(tmp_path: Path, site: Site) -> None:
    env = _site(tmp_path, site)
    started = time.monotonic()
    r = mps_health("check", "--config", str(site.root / "config.yaml"), "--budget", "1", env=env,
                   timeout=60)
    # The abandoned thread, still blocked, holds up neither the exit code nor the exit.
    assert time.monotonic() - started < 8
    assert (r.returncode, r.stdout) == (3, ""), r.stderr
    assert r.stderr == ("mps-health: the checks did not finish within 3s (still busy with: "
                        "site-fifo): something below mps-health hung (a hung file system, a "
                        "process stuck in the kernel); abandoned, the commands it started "
                        "killed (runbook: run-overrun)\n")
    assert _gone(int((tmp_path / "child").read_text()))


def test_a_hung_source_gives_check_mps_its_documented_timeout_line(tmp_path: Path, site: Site) -> None:
    env = _site(tmp_path, site)
    # Before, the plugin's SIGALRM was caught as the source's own failure: facts-unavailable.
    started = time.monotonic()
    r = check_mps("--config", str(site.root / "config.yaml"), "-t", "2", env=env, timeout=60)
    assert time.monotonic() - started < 7
    assert r.returncode == 3
    assert r.stdout == ("MPS UNKNOWN - check_mps timed out after 2s before the checks "
                        "finished (raise -t, or look for a hung process on the node; still "
                        "busy with: site-fifo)\n")
    assert _gone(int((tmp_path / "child").read_text()))


def test_a_hung_source_is_a_healthcheck_timeout(tmp_path: Path, site: Site) -> None:
    env = _site(tmp_path, site, "budget_s: 1\n")
    r = mps_health("healthcheck", "--foreground", "--dry-run", "--config",
                   str(site.root / "config.yaml"), env=env, timeout=60)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stdout.startswith("MPS CRITICAL - healthcheck-timeout: the checks did not finish "
                               "within 3s"), r.stdout
    assert r.stdout.splitlines()[0].endswith("(runbook: mps-health explain healthcheck-timeout)")


def test_an_abandoned_run_kills_what_it_started(tmp_path: Path) -> None:
    """In one process (the exporter's case): the run's commands die at the limit, not at
    the process's exit."""
    from mps_health.engine import run as engine
    from mps_health.hostio.runner import Pending

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    started: List[Pending] = []

    def work(in_flight: set) -> None:
        in_flight.add("stuck")
        started.append(Pending(["sleep", "600"]))
        with open(fifo):
            pass

    try:
        with pytest.raises(engine.Overrun) as e:
            engine.bounded(1.0, work)
        assert e.value.waiting_on == ("stuck",)
        _, status = os.waitpid(started[0].pid, 0)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    finally:  # let the abandoned thread go
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


# --- our own fd limit: never a fact about MPS -------------------------------------------

EMFILE_RUN = '''
import os, resource, sys
from mps_health.cli import main as cli

args = ["check", "--config", sys.argv[1], "--only", "daemon,control", "--format", "json"]
cli.main(args)  # imports all the run needs: an import needs a free fd too
print("=====", flush=True)
resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
held = []
try:
    while True:
        held.append(os.open("/dev/null", os.O_RDONLY))
except OSError:
    pass
os.close(held.pop())  # one free: a file can be read, no pipe pair for the client made
sys.stdout.flush()
os._exit(cli.main(args))
'''


def test_out_of_fds_is_unknown_never_client_missing_or_critical(site) -> None:
    site.start_daemon()
    cfg = site.config()
    r = subprocess.run([sys.executable, "-c", EMFILE_RUN, cfg], capture_output=True,
                       text=True, timeout=120)
    first, _, second = r.stdout.partition("=====\n")
    assert json.loads(first)["state"] in ("OK", "WARNING"), first
    assert r.returncode == 3, r.stdout + r.stderr
    report = json.loads(second)
    codes = {p["code"] for p in report["problems"]}
    assert codes == {"facts-unavailable"}, report["problems"]
    assert all(p["state"] == "UNKNOWN" for p in report["problems"])
    control = next(p for p in report["problems"] if p["check"] == "control")
    # The client is named by the path it was found at (mps.binary_dirs: the fakes' dir).
    assert f"cannot start {FAKE_CONTROL}: Too many open files (this mps-health " \
           "process's own limit, not the node's MPS: it may open 64 files" in control["message"]


# --- output no one reads: the exit code stands ------------------------------------------

def _critical_config(site: Site) -> str:
    return site.config(pipe=f"{site.root}/no-pipe", log=f"{site.root}/no-log")


@pytest.mark.parametrize("command", ["mps-health", "check_mps"])
def test_closed_or_broken_stdout_keeps_the_exit_code(site: Site, command: str) -> None:
    cfg = _critical_config(site)
    args = ["check"] if command == "mps-health" else []
    cmd = argv(command, *args, "--config", cfg, "--only", "daemon")
    closed = subprocess.run(cmd, preexec_fn=lambda: os.close(1), stderr=subprocess.PIPE,
                            text=True, timeout=60)  # `>&-`: was AttributeError, exit 1
    assert (closed.returncode, closed.stderr) == (2, "")
    read_end, write_end = os.pipe()
    os.close(read_end)  # `| head -c1` after head has gone
    try:
        broken = subprocess.run(cmd, stdout=write_end, stderr=subprocess.PIPE, text=True,
                                timeout=60)
    finally:
        os.close(write_end)
    assert (broken.returncode, broken.stderr) == (2, "")
    with open("/dev/full", "w") as full:
        r = subprocess.run(cmd, stdout=full, stderr=subprocess.PIPE, text=True, timeout=60)
    assert r.returncode == 2
    assert r.stderr == "mps-health: cannot write the output: No space left on device\n"


def test_an_error_with_stderr_closed_never_lands_on_stdout(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")  # a config that cannot be read
    r = subprocess.run(argv("mps-health", "check", "--config", str(tmp_path / "fifo")),
                       preexec_fn=lambda: os.close(2), stdout=subprocess.PIPE, text=True,
                       timeout=60)
    assert (r.returncode, r.stdout) == (3, "")


# --- a full state dir: one line naming the file, the verdict stands ----------------------

def test_a_full_state_dir_is_one_line_and_the_verdict_still_comes(site) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root for a private mount namespace")
    site.start_daemon()
    state = site.state_dir
    state.mkdir()
    cfg = site.config()
    # A 64 KiB tmpfs on the state dir, filled, in a mount namespace of this command only.
    fill = ('mount -t tmpfs -o size=64k tmpfs "$0" && '
            '(head -c 1000000 /dev/zero > "$0/fill" 2>/dev/null; exec "$@")')
    prefix = ["unshare", "--mount", "--propagation", "private", "sh", "-c", fill, str(state)]
    for command, args in (("mps-health", ["check"]), ("check_mps", [])):
        r = subprocess.run(prefix + argv(command, *args, "--config", cfg, "--only",
                                         "control,logs,servers"),
                           capture_output=True, text=True, timeout=120)
        assert r.returncode in (0, 1), r.stdout + r.stderr  # the verdict, not UNKNOWN
        assert r.stdout.startswith(("MPS OK", "MPS WARNING")), r.stdout
        if command == "mps-health":
            lines = r.stderr.splitlines()
            assert lines == [
                f"mps-health: warning: cannot save {state}/{name}.json: No space left on "
                f"device (the {name} check's history is not kept until it can be saved; the "
                "verdict is not affected)" for name in ("logs", "servers")], r.stderr
        else:
            assert r.stderr == ""
    assert not (state / "fill").exists()  # the tmpfs was the command's own

    # The health check's lock in a full run dir: it judges and counts, never "cannot take
    # the health check lock" (that was one run in two skipped: no drain ever).
    cfg = site.config({"run_dir": str(state)}, file="hc.yaml")
    r = subprocess.run(prefix + argv("mps-health", "healthcheck", "--foreground", "--dry-run",
                                     "--config", cfg),
                       capture_output=True, text=True, timeout=120)
    assert r.stdout.startswith(("MPS OK", "MPS WARNING", "MPS CRITICAL")), r.stdout + r.stderr
    assert "cannot take the health check lock" not in r.stdout


def test_an_os_error_no_one_expected_is_one_line_naming_the_path() -> None:
    """The system failing us where no code expected it (a full disk): the path and the
    reason, exit 3, never "internal error ... report it"."""
    import errno

    from mps_health.cli.common import edge

    def full() -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/var/lib/mps-health/x")

    said: List[str] = []
    assert edge(full, said.append, "mps-health: ") == 3
    assert said == ["mps-health: /var/lib/mps-health/x: No space left on device"]
