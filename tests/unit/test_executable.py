"""hostio.executable: a file that is there but cannot run is told from one that runs, and
a program that never started (its library missing) from its own failure."""

import shutil
from pathlib import Path

from mps_health.hostio.executable import start_failure, why_not_runnable
from mps_health.hostio.runner import run


def test_programs_that_run_are_not_questioned() -> None:
    assert why_not_runnable("/bin/true") is None
    assert why_not_runnable(shutil.which("python3") or "/usr/bin/python3") is None


def test_files_that_cannot_run(tmp_path: Path) -> None:
    text = tmp_path / "text"
    text.write_text("echo this would run under /bin/sh\n")
    assert why_not_runnable(str(text))[1].startswith("not a program for this machine")
    script = tmp_path / "script"
    script.write_text("#! /no/such/sh -e\n")
    assert why_not_runnable(str(script))[1] == "its interpreter /no/such/sh is missing"


def test_the_runner_never_runs_a_non_program_through_the_shell(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    text = tmp_path / "text"
    text.write_text(f"touch {marker}\n")
    text.chmod(0o755)
    done = run([str(text)], 5.0)
    assert done.exec_error == (f"{text}: cannot run: not a program for this machine "
                               "(neither ELF nor a #! script)")
    assert not marker.exists()


def test_a_start_failure_is_told_from_the_program_s_own() -> None:
    loader = ("/usr/bin/nvidia-cuda-mps-control: error while loading shared libraries: "
              "libcuda.so.1: cannot open shared object file: No such file or directory\n")
    assert start_failure(127, loader) == ("error while loading shared libraries: libcuda.so.1: "
                                          "cannot open shared object file: No such file or "
                                          "directory")
    assert start_failure(127, "setpriv: failed to execute /x: No such file or directory") \
        == "exec failed: No such file or directory"
    assert start_failure(1, loader) is None  # its own exit status: not ours to read
    assert start_failure(127, "command said something else") is None
