"""logs: the real control.log lines, incremental reads, rotation, truncation, the window."""

import json
import subprocess
import time
from pathlib import Path

from clirun import mps_health, results
from conftest import fixture_text
from mps_health.model.facts_deep import LogPosition
from mps_health.probes import logs as probe

SEEN = "control.log__h200-cuda13.0_seen-lines.txt"


def line(text: str, at: float, role: str = "Control", pid: int = 436) -> str:
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at)) + f".{int(at * 1000) % 1000:03d}"
    return f"[{stamp} {role} {pid:5d}] {text}\n"


# --- parse, on the lines seen on the H200 -----------------------------------------------

def test_reference_lines_are_classified() -> None:
    found = probe.parse_findings(fixture_text(SEEN), "/var/log/nvidia-mps", "control.log",
                                 read_at=2e9)
    got = [(f.code, f.pid, f.uid, f.status) for f in found]
    assert got == [
        ("log-pending-client", 1201, 1000, 0),
        ("log-accept-failed", 0, -1, 0),
        ("log-server-start", 510, 0, 0),
        ("log-server-start-failed", 0, 0, 0),
        ("log-server-exit", 510, -1, 1),
        ("log-daemon-exit", 0, -1, 1),
    ]  # "exited with status 0" and the comment lines are not findings
    assert found[0].at == time.mktime((2026, 12, 2, 12, 28, 16, 0, 0, -1)) + 0.57
    assert found[3].text == "Failed to start server using uid 0, error: Operation not permitted"


def test_split_line_needs_the_real_prefix() -> None:
    assert probe.split_line("[2026-12-02 12:28:16.570 Server   510] x") == (
        "2026-12-02", "12:28:16.570", "Server", "x")
    assert probe.parse_time("2026-12-02", "12:28:16.570") == (
        time.mktime((2026, 12, 2, 12, 28, 16, 0, 0, -1)) + 0.57)
    assert probe.split_line("Unable to accept connection") is None
    assert probe.split_line("[garbage] Unable to accept connection") is None
    date, clock, _, _ = probe.split_line("[2026-13-45 99:99:99.1 Control 1] x")  # type: ignore[misc]
    assert probe.parse_time(date, clock) is None  # an impossible date is dated by reading


def test_a_forged_number_is_no_number_never_an_exception() -> None:
    # A per-job daemon's log is its user's file: what it holds is read as hostile.
    text = "".join(f"[2026-12-02 12:28:16.570 Control   436] {m}\n" for m in (
        "Exit with status " + "9" * 5000, "Exit with status \u00b2",
        "Server 1 exited with status \u0663", "Starting new server 7 for user " + "1" * 40))
    found = probe.parse_findings(text, "/var/log/nvidia-mps", "control.log", read_at=2e9)
    assert [(f.code, f.pid, f.uid, f.status) for f in found] == [
        ("log-daemon-exit", 0, -1, 999999999999999999),
        ("log-server-start", 7, 111111111111111111, 0)]


# --- incremental reads --------------------------------------------------------------------

def read(d: Path, pos, max_bytes: int = 1 << 20):
    return probe.read_file(str(d), "control.log", pos, max_bytes)


def test_reads_only_new_whole_lines(tmp_path: Path) -> None:
    log = tmp_path / "control.log"
    log.write_text("[a] one\n[b] two\n[c] thr")
    chunks, pos, note = read(tmp_path, None)
    assert chunks == [("control.log", "[a] one\n[b] two\n")] and note == ""
    assert pos.offset == len("[a] one\n[b] two\n")
    with log.open("a") as f:
        f.write("ee\n[d] four\n")
    chunks, pos2, _ = read(tmp_path, pos)
    assert chunks == [("control.log", "[c] three\n[d] four\n")]
    assert read(tmp_path, pos2)[0] == [("control.log", "")]


def test_rotation_reads_the_rest_of_the_old_file_then_the_new(tmp_path: Path) -> None:
    log = tmp_path / "control.log"
    log.write_text("old 1\n")
    _, pos, _ = read(tmp_path, None)
    with log.open("a") as f:
        f.write("old 2\n")
    log.rename(tmp_path / "control.log.1")
    log.write_text("new 1\n")
    chunks, pos2, note = read(tmp_path, pos)
    assert chunks == [("control.log.1", "old 2\n"), ("control.log", "new 1\n")]
    assert note == "rotated: read the rest of control.log.1"
    assert pos2.inode == log.stat().st_ino and pos2.offset == 6


def test_rotation_with_the_old_file_gone(tmp_path: Path) -> None:
    log = tmp_path / "control.log"
    log.write_text("old\n")
    _, pos, _ = read(tmp_path, None)
    (tmp_path / "next").write_text("new\n")  # made while the old one lives: a new inode
    log.unlink()
    (tmp_path / "next").rename(log)
    chunks, _, note = read(tmp_path, pos)
    assert chunks == [("control.log", "new\n")] and note == "rotated: the old file is gone"


def test_a_new_file_that_reused_the_inode_is_read_from_the_start(tmp_path: Path) -> None:
    log = tmp_path / "control.log"
    log.write_text("first daemon\n")
    _, pos, _ = read(tmp_path, None)
    with log.open("w") as f:  # truncated and refilled past the old offset between runs
        f.write("second daemon, a longer line\n")
    chunks, _, note = read(tmp_path, pos)
    assert chunks == [("control.log", "second daemon, a longer line\n")]
    assert note == "replaced or truncated and rewritten"


def test_truncation_reads_from_the_start(tmp_path: Path) -> None:
    log = tmp_path / "control.log"
    log.write_text("a long first line\nanother\n")
    _, pos, _ = read(tmp_path, None)
    with log.open("w") as f:  # copytruncate, then a new line
        f.write("fresh\n")
    chunks, _, note = read(tmp_path, pos)
    assert chunks == [("control.log", "fresh\n")]
    assert note == "truncated (was 26 bytes, now 6)"


def test_a_huge_backlog_costs_a_bounded_read(tmp_path: Path) -> None:
    log = tmp_path / "control.log"
    log.write_text("x" * 95 + "\n" + "".join(f"line {i:04d}\n" for i in range(100)))
    chunks, pos, note = read(tmp_path, LogPosition(*_ident(log), 0), max_bytes=50)
    assert chunks == [("control.log", "line 0096\nline 0097\nline 0098\nline 0099\n")]
    assert note == "skipped 1046 bytes (more than 50 new)"
    assert pos.offset == log.stat().st_size
    first = read(tmp_path, None, max_bytes=50)  # first run: the end only
    assert first[0] == chunks and first[2] == "first read; skipped 1046 bytes (more than 50 new)"


def _ident(path: Path) -> tuple:
    st = path.stat()
    return st.st_dev, st.st_ino


def test_a_symlinked_log_is_not_followed(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").write_text("[x] secret\n")
    (tmp_path / "control.log").symlink_to(tmp_path / "elsewhere")
    try:
        read(tmp_path, None)
    except OSError as e:
        assert e.errno is not None
    else:
        raise AssertionError("a symlink was followed")


# --- the check, end to end ------------------------------------------------------------------

def test_findings_are_reported_within_the_window_and_never_twice(site) -> None:
    _, log = site.dirs()
    cfg = site.config("logs:\n  window_s: 3\n")
    now = time.time()
    (log / "control.log").write_text(
        line("Server 510 exited with status 1", now)
        + line("Failed to start server using uid 0, error: Operation not permitted", now))
    (log / "server.log").write_text(line("Unable to accept connection", now, "Server", 510))
    r = mps_health("check", "--config", cfg, "--only", "logs")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "WARNING logs[node] log-server-exit: 1 in the last 0.05 min: MPS server(s) exited " \
           "with a non-zero status; last at" in r.stdout
    assert "in control.log: Server 510 exited with status 1" in r.stdout
    assert "log-accept-failed: 1 in the last" in r.stdout and "in server.log" in r.stdout
    with (log / "control.log").open("a") as f:
        f.write(line("Server 511 exited with status 1", time.time()))
    again = mps_health("check", "--config", cfg, "--only", "logs", "--format", "json")
    exits = [x for x in results(again, "logs") if x["code"] == "log-server-exit"]
    assert exits[0]["message"].startswith("2 in the last")  # the old one once, plus the new
    assert exits[0]["values"]["log_server_exit"] == 2
    time.sleep(3.2)
    cleared = mps_health("check", "--config", cfg, "--only", "logs")
    assert cleared.returncode == 0, cleared.stdout


def test_ordinary_lines_move_the_saved_offsets_on_in_steps(site) -> None:
    """The daemon logs every query, so logs.json is not written anew for a few ordinary
    lines: the next run reads them again, and they hold no finding then either."""
    _, log = site.dirs()
    cfg = site.config()
    control = log / "control.log"
    control.write_text(line("Server 510 exited with status 1", time.time()))
    assert mps_health("check", "--config", cfg, "--only", "logs").returncode == 1
    state = site.state_dir / "logs.json"
    saved = state.read_bytes()

    def offset() -> int:
        return json.loads(state.read_text())["positions"][str(control)]["offset"]

    def exits() -> str:
        r = mps_health("check", "--config", cfg, "--only", "logs", "--format", "json")
        return next(x for x in results(r, "logs") if x["code"] == "log-server-exit")["message"]

    ordinary = "".join(line(t, time.time()) for t in (
        "Accepting connection...", "NEW UI", "Cmd:get_default_active_thread_percentage",
        "100.0", "UI closed"))
    for _ in range(3):
        with control.open("a") as f:
            f.write(ordinary)
        assert exits().startswith("1 in the last")
    assert state.read_bytes() == saved  # only the offsets moved, and not far: not written
    with control.open("a") as f:
        f.write(ordinary * (probe.SAVE_AFTER_BYTES // len(ordinary) + 1))
    assert exits().startswith("1 in the last")
    assert offset() == control.stat().st_size  # far enough: written
    with control.open("a") as f:
        f.write(ordinary + line("Server 511 exited with status 1", time.time()))
    assert exits().startswith("2 in the last")
    assert offset() == control.stat().st_size  # a finding: written at once
    assert exits().startswith("2 in the last")


def test_worth_saving() -> None:
    pos = {"/l/control.log": LogPosition(1, 2, 100, "[2026")}
    memory = probe.LogMemory(pos, ())
    assert not probe.worth_saving(memory, pos, ())
    assert not probe.worth_saving(memory, {"/l/control.log": pos["/l/control.log"]._replace(
        offset=100 + probe.SAVE_AFTER_BYTES)}, ())
    for moved in ({"offset": 101 + probe.SAVE_AFTER_BYTES}, {"offset": 99}, {"inode": 3},
                  {"head": "[2027"}):
        assert probe.worth_saving(memory, {"/l/control.log": pos["/l/control.log"]._replace(
            **moved)}, ()), moved
    assert probe.worth_saving(memory, {}, ())
    assert probe.worth_saving(memory, pos, (object(),))  # type: ignore[arg-type]


def test_pending_client_is_reported_until_it_exits(site) -> None:
    _, log = site.dirs()
    cfg = site.config("logs:\n  pending_warn_s: 1\n")
    client = subprocess.Popen(["sleep", "60"])
    try:
        (log / "control.log").write_text(line(
            f"NEW CLIENT {client.pid} from user 1000: Server is not ready, push client to "
            "pending list", time.time() - 5))
        r = mps_health("check", "--config", cfg, "--only", "logs")
        assert r.returncode == 1
        assert f"client-pending: client {client.pid} of uid 1000 was pushed to the pending " \
               "list at" in r.stdout
        assert "another user's server holds the GPU" in r.stdout
    finally:
        client.kill()
        client.wait()
    assert mps_health("check", "--config", cfg, "--only", "logs").returncode == 0


def test_pending_client_is_resolved_by_a_server_for_its_user(site) -> None:
    _, log = site.dirs()
    cfg = site.config("logs:\n  pending_warn_s: 1\n")
    client = subprocess.Popen(["sleep", "60"])
    try:
        (log / "control.log").write_text(
            line(f"NEW CLIENT {client.pid} from user 1000: Server is not ready, push client "
                 "to pending list", time.time() - 5)
            + line("Starting new server 777 for user 1000", time.time() - 2))
        r = mps_health("check", "--config", cfg, "--only", "logs")
        assert r.returncode == 0, r.stdout
    finally:
        client.kill()
        client.wait()


def test_fake_daemon_log_lines_are_read(site) -> None:
    d = site.start_daemon()
    cfg = site.config()
    server = d.query("fake_server_start").stdout.strip()
    d.query(f"fake_server_stop {server} 139")
    r = mps_health("check", "--config", cfg, "--only", "logs")
    assert r.returncode == 1
    assert f"Server {server} exited with status 139" in r.stdout


def test_a_symlinked_log_dir_is_not_read(tmp_path: Path, site) -> None:
    pipe, log = site.dirs()
    (log / "control.log").write_text(line("Unable to accept connection", time.time()))
    link = tmp_path / "linked-log"
    link.symlink_to(log)
    cfg = site.config(pipe=pipe, log=link)
    r = mps_health("check", "--config", cfg, "--only", "logs")
    assert r.returncode == 3
    assert f"UNKNOWN logs[node] logs-unreadable: {link}/control.log: cannot read: the log dir " \
           "is a symlink" in r.stdout


def test_findings_dated_in_the_future_are_dropped(site) -> None:
    """A damaged logs.json (at: 1e308, NaN) or a clock stepped back leaves findings "in
    the future": they are dropped on load, never reported for ever nor UNKNOWN."""
    _, log = site.dirs()
    cfg = site.config()
    (log / "control.log").write_text(line("Server 510 exited with status 1", time.time()))
    assert mps_health("check", "--config", cfg, "--only", "logs").returncode == 1
    state = site.state_dir / "logs.json"
    data = json.loads(state.read_text())
    (finding,) = data["findings"]
    data["findings"] = [dict(finding, at=1e308), dict(finding, at=time.time() + 3600),
                        dict(finding, at=float("nan"))]
    state.write_text(json.dumps(data))
    r = mps_health("check", "--config", cfg, "--only", "logs")
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(state.read_text())["findings"] == []
