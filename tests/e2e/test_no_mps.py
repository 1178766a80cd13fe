"""A node without MPS: the cause first, in one line; a reset refuses and changes nothing.
Where the binaries are found: ``commands``, else ``mps.binary_dirs``, never PATH, so the
check and the reset it advises always agree. One cause is one problem: MPS gone after a
daemon ran, and a dead daemon too."""

import shutil
import subprocess
from pathlib import Path

from clirun import check_mps, mps_health, problem_codes, report
from nodesite import Site
from paths import FAKE_BIN
from remhelp import kill_and_wait, killed_daemon, remediating

# strays judges the whole node, where other tests' daemons run; tmpfiles the host's rules.
SKIP = ("--skip", "tmpfiles,strays")


def no_mps_config(site: Site) -> str:
    return site.config(remediating(site),
                       commands={"nvidia-cuda-mps-control": f"{site.root}/none"})


def test_check_leads_with_the_missing_binary(site) -> None:
    cfg = no_mps_config(site)
    r = mps_health("check", "--config", cfg, "--only", "daemon,control")
    assert r.returncode == 2, r.stdout + r.stderr
    first = r.stdout.splitlines()[0]
    assert first.startswith("MPS CRITICAL - 1 problem: mps-not-installed node"), first
    assert "daemon-absent" not in r.stdout and "remediate reset" not in r.stdout
    assert f"MPS is not installed on this node ({site.root}/none: command not found)" in r.stdout


def test_a_node_without_the_binaries_has_one_problem_and_no_reset_advice(site) -> None:
    cfg = no_mps_config(site)
    r = mps_health("check", "--config", cfg, *SKIP)
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("MPS CRITICAL - 1 problem: mps-not-installed node"), r.stdout
    assert len(lines) == 2 and "reset" not in lines[1].replace("a reset cannot help", ""), \
        r.stdout
    verbose = mps_health("check", "--config", cfg, "-v", *SKIP)
    assert verbose.returncode == 2
    assert "FOLDED control[node] control-client-missing: " in verbose.stdout, verbose.stdout
    assert "FOLDED directories[node] pipe-dir-missing: " in verbose.stdout, verbose.stdout
    assert "remediate reset" not in verbose.stdout

    j = mps_health("check", "--config", cfg, "--format", "json", *SKIP)
    assert j.returncode == 2 and problem_codes(j) == ["mps-not-installed"], j.stdout
    folded = {x["code"]: x for c in report(j)["checks"] for x in c["results"] if "cause" in x}
    assert {"control-client-missing", "pipe-dir-missing", "log-dir-missing"} <= set(folded)
    assert all(x["cause"] == "mps-not-installed" and not x["action"]
               for x in folded.values())

    n = check_mps("--config", cfg, *SKIP)
    assert n.returncode == 2, n.stdout
    assert n.stdout.startswith("MPS CRITICAL - mps-not-installed node: "), n.stdout
    assert "; also " not in n.stdout.splitlines()[0], n.stdout


def test_the_health_check_in_slurmd_s_environment_names_the_one_cause(site) -> None:
    cfg = site.config(remediating(site), commands={"nvidia-cuda-mps-control": f"{site.root}/none"},
                      checks={"disable": ["tmpfiles", "strays"]})
    r = mps_health("healthcheck", "--foreground", "--dry-run", "--config", cfg,
                   env={}, inherit=False)  # slurmd gives no PATH
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stdout.startswith("MPS CRITICAL - 1 problem: mps-not-installed node\n"), r.stdout
    assert "remediate reset" not in r.stdout


def test_a_name_not_in_the_binary_dirs_is_not_installed_whatever_the_path(site) -> None:
    # The fakes are on this PATH (the site fixture), but not where binaries are looked for.
    cfg = site.config(remediating(site), commands={"nvidia-cuda-mps-control": None},
                      mps={"binary_dirs": [str(site.root / "empty")]})
    r = mps_health("check", "--config", cfg, "--format", "json", *SKIP)
    assert r.returncode == 2 and problem_codes(r) == ["mps-not-installed"], r.stdout
    assert f"nvidia-cuda-mps-control: command not found in {site.root}/empty" in r.stdout
    z = mps_health("remediate", "reset", "--config", cfg, "--dry-run")
    assert z.returncode == 3 and "is not installed" in z.stderr, z.stdout + z.stderr


def test_binaries_only_in_a_binary_dir_check_and_reset_agree(site) -> None:
    # As on a node whose driver put them in /usr/local/nvidia/bin, off the caller's PATH
    # and off slurmd's (none): the fakes' dir stands for that fixed location.
    cfg = site.config(remediating(site), commands={"nvidia-cuda-mps-control": None},
                      mps={"binary_dirs": ["/usr/bin", str(FAKE_BIN)]})
    bare = {"PATH": "/usr/bin:/bin"}
    r = mps_health("check", "--config", cfg, "--format", "json", *SKIP, env=bare)
    assert r.returncode == 2 and "daemon-absent" in problem_codes(r), r.stdout + r.stderr
    assert "mps-not-installed" not in r.stdout
    fix = mps_health("remediate", "reset", "--config", cfg, env=bare)
    assert fix.returncode == 0, fix.stdout + fix.stderr
    slurmd = mps_health("check", "--config", cfg, *SKIP, env={}, inherit=False)
    assert slurmd.returncode == 0, slurmd.stdout + slurmd.stderr


def test_reset_refuses_up_front_and_makes_nothing(site) -> None:
    cfg = no_mps_config(site)
    for extra in ((), ("--dry-run",)):
        r = mps_health("remediate", "reset", "--config", cfg, *extra)
        assert r.returncode == 3, r.stdout + r.stderr
        assert r.stderr.count("\n") == 1 and "is not installed" in r.stderr, r.stderr
    assert not site.pipe.exists() and not site.log.exists()


def test_a_daemon_that_fails_to_start_is_quoted_and_had_a_fixed_path(site) -> None:
    fake = site.root / "bad-control"
    fake.write_text("#!/bin/sh\necho \"[x] PATH=$PATH; cannot open /dev/nvidiactl\" >> "
                    "\"$CUDA_MPS_LOG_DIRECTORY/control.log\"\necho 'driver not loaded' >&2\n"
                    "exit 1\n")
    fake.chmod(0o755)
    cfg = no_mps_config(site)
    Path(cfg).write_text(Path(cfg).read_text().replace(f"{site.root}/none", str(fake)))
    r = mps_health("remediate", "reset", "--config", cfg,
                   env={"PATH": f"{site.root}/evil:/usr/bin:/bin"})
    assert r.returncode == 2, r.stdout + r.stderr
    assert "(the launcher exited 1: 'driver not loaded')" in r.stdout, r.stdout
    assert "control.log ends: [x] PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:" \
        "/sbin:/bin; cannot open /dev/nvidiactl" in r.stdout, r.stdout


def broken_binaries(site: Site) -> dict:
    """Control binaries that are there, executable, and cannot run: reason -> path."""
    made = {}
    garbage = site.root / "garbage-control"
    garbage.write_bytes(b"\x00\x01not a program (\n" * 64)  # /bin/sh would choke on it
    made["not a program for this machine"] = garbage
    script = site.root / "script-control"
    script.write_text("#!/nonexistent/interpreter\nexit 0\n")
    made["its interpreter /nonexistent/interpreter is missing"] = script
    elf = Path("/bin/true").read_bytes()
    loader = next((name for name in (b"/lib64/ld-linux-x86-64.so.2", b"/lib/ld-linux-aarch64.so.1")
                   if name in elf), None)
    if loader is not None:  # the same ELF, its loader's name changed to one that is not there
        moved = loader[:-4] + b"gone"
        noloader = site.root / "noloader-control"
        noloader.write_bytes(elf.replace(loader, moved))
        made[f"its loader {moved.decode()} is missing"] = noloader
        foreign = bytearray(elf)
        foreign[18:20] = b"\x15\x00" if foreign[18:20] != b"\x15\x00" else b"\x3e\x00"  # PPC64 or x86-64
        wrong = site.root / "foreign-control"
        wrong.write_bytes(bytes(foreign))
        made["built for another architecture"] = wrong
    cc = shutil.which("cc")
    if cc is not None:  # a program whose library is gone (built against it, then removed)
        (site.root / "lib.c").write_text("int gone(void) { return 0; }\n")
        (site.root / "main.c").write_text("int gone(void);\nint main(void) { return gone(); }\n")
        lib = site.root / "libmpsgone.so"
        nolib = site.root / "nolib-control"
        for argv in ([cc, "-shared", "-fPIC", "-o", str(lib), str(site.root / "lib.c")],
                     [cc, "-o", str(nolib), str(site.root / "main.c"), f"-L{site.root}",
                      "-lmpsgone"]):
            subprocess.run(argv, check=True, capture_output=True, timeout=60)
        lib.unlink()
        made["error while loading shared libraries: libmpsgone.so"] = nolib
    for path in made.values():
        path.chmod(0o755)
    return made


def test_a_control_binary_that_cannot_run_says_why_and_advises_no_reset(site) -> None:
    for why, path in broken_binaries(site).items():
        cfg = site.config(remediating(site), commands={"nvidia-cuda-mps-control": str(path)})
        r = mps_health("check", "--config", cfg, "--only", "control", "--format", "json")
        assert r.returncode == 2, r.stdout + r.stderr
        (res,) = [x for c in report(r)["checks"] for x in c["results"]]
        assert res["code"] == "control-client-broken", res
        assert f"{path}: cannot run: {why}" in res["message"], res
        assert res["action"].startswith(f"reinstall the NVIDIA driver's MPS binaries ({path}: "
                                        f"cannot run: {why}"), res
        assert "remediate reset" not in res["action"]
        assert "answered with an error" not in r.stdout
    # The whole check: one cause, one problem (no daemon can run), and a reset refuses up
    # front, changing nothing.
    why, path = next(iter(broken_binaries(site).items()))
    cfg = site.config(remediating(site), commands={"nvidia-cuda-mps-control": str(path)},
                      checks={"disable": ["strays"]})
    r = mps_health("check", "--config", cfg, "--format", "json")
    assert [p["code"] for p in report(r)["problems"]] == ["control-client-broken"], r.stdout
    reset = mps_health("remediate", "reset", "--config", cfg)
    assert reset.returncode == 3 and f"cannot run: {why}" in reset.stderr, reset.stderr
    assert not site.pipe.exists()


def test_binaries_gone_after_a_daemon_restarted_are_one_problem(site) -> None:
    """A driver upgrade restarted the daemon, then took the binaries: the restart the
    servers check remembers is folded under mps-not-installed, not a second alert."""
    own = site.root / "bin"
    own.mkdir()
    for name in ("nvidia-cuda-mps-control", "nvidia-cuda-mps-server"):
        shutil.copy2(FAKE_BIN / name, own / name)
    site.control = str(own / "nvidia-cuda-mps-control")
    cfg = site.config(remediating(site), commands={"nvidia-cuda-mps-control": site.control})

    def restart(pid: int) -> int:
        kill_and_wait(pid)
        return site.start_daemon().pid if own.exists() else 0

    first = site.start_daemon().pid
    assert problem_codes(mps_health("check", "--config", cfg, "--format", "json", *SKIP)) == []
    second = restart(first)
    seen = mps_health("check", "--config", cfg, "--format", "json", *SKIP)
    assert problem_codes(seen) == ["daemon-restarted"], seen.stdout
    shutil.rmtree(own)
    restart(second)
    r = mps_health("check", "--config", cfg, "--format", "json", *SKIP)
    assert r.returncode == 2 and problem_codes(r) == ["mps-not-installed"], r.stdout
    folded = {x["code"]: x["cause"] for c in report(r)["checks"] for x in c["results"]
              if "cause" in x}
    assert folded["daemon-restarted"] == "mps-not-installed", folded
    text = mps_health("check", "--config", cfg, *SKIP)
    assert text.stdout.startswith("MPS CRITICAL - 1 problem: mps-not-installed node\n")


def test_a_dead_daemon_is_one_critical(site) -> None:
    """Killed, its dirs left: daemon-stale alone; control-absent and servers-not-asked
    follow from it. Its dirs gone too: daemon-absent alone (the missing dirs folded)."""
    cfg = killed_daemon(site)
    r = mps_health("check", "--config", cfg, "--format", "json", *SKIP)
    assert r.returncode == 2 and problem_codes(r) == ["daemon-stale"], r.stdout
    folded = {x["code"]: x["cause"] for c in report(r)["checks"] for x in c["results"]
              if "cause" in x}
    assert folded == {"control-absent": "daemon-stale", "servers-not-asked": "daemon-stale"}
    shutil.rmtree(site.pipe)
    shutil.rmtree(site.log)
    r = mps_health("check", "--config", cfg, "--format", "json", *SKIP)
    assert r.returncode == 2 and problem_codes(r) == ["daemon-absent"], r.stdout
    n = check_mps("--config", cfg, *SKIP)
    assert n.stdout.startswith("MPS CRITICAL - daemon-absent node: "), n.stdout
    assert "; also " not in n.stdout.splitlines()[0]
