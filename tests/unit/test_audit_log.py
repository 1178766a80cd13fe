"""The audit log is written only to a regular file: a fifo, a link or a directory in its
place is reported once on stderr and the action goes on (it never hangs or follows)."""

import os
from pathlib import Path

import pytest
from mps_health.remediation.audit import Audit


def test_lines_are_appended_to_a_regular_file(tmp_path: Path) -> None:
    path = tmp_path / "audit.log"
    a = Audit(str(path), False, "n1", "reset", actor="root")
    a.record("start")
    a.record("end", "ok")
    lines = path.read_text().splitlines()
    assert len(lines) == 2 and "event=end" in lines[1] and "result=ok" in lines[1]
    assert path.stat().st_mode & 0o777 == 0o640


@pytest.mark.parametrize("kind", ["fifo", "link", "dir"])
def test_anything_else_in_its_place_is_left_alone(tmp_path: Path, kind: str,
                                                  capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "audit.log"
    target = tmp_path / "target"
    target.write_text("kept\n")
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "link":
        path.symlink_to(target)
    else:
        path.mkdir()
    a = Audit(str(path), False, "n1", "reset", actor="root")
    a.record("start")  # returns at once: no reader on the fifo is waited for
    a.record("end")
    assert target.read_text() == "kept\n"
    err = capsys.readouterr().err
    assert err.count("cannot write the audit log") == 1, err
    assert a.lines and "event=end" in a.lines[-1]
