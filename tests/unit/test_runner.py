"""hostio.runner: every command bounded (killed with its process group at the deadline and
reaped), several collected against one deadline, none outliving the thread that started
it, and a command whose pipes a child holds collected at its exit."""

import os
import signal
import threading
import time
from typing import List

import pytest
from mps_health.hostio import runner
from mps_health.hostio.runner import Pending, kill_started_since, run, wait_all


def gone(pid: int, within_s: float = 5.0) -> bool:
    """Has ``pid`` (not our child) gone (or become a zombie) within ``within_s``?"""
    end = time.monotonic() + within_s
    while time.monotonic() < end:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rpartition(")")[2].split()[0] == "Z":
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.01)
    return False


def comm(pid) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def test_output_exit_code_and_stdin() -> None:
    done = run(["sh", "-c", "read line; echo out:$line; echo err >&2; exit 3"], 10,
               stdin="hello\n")
    assert (done.rc, done.stdout, done.stderr, done.timed_out) == (3, "out:hello\n", "err\n",
                                                                    False)
    assert 0 <= done.elapsed_s < 5


def test_a_command_that_cannot_start_says_why() -> None:
    done = run(["no-such-command-mps-health"], 5)
    assert done.rc is None and done.exec_error == "no-such-command-mps-health: command not found"


def test_at_the_deadline_the_whole_group_is_killed_and_reaped(tmp_path) -> None:
    pids = tmp_path / "pids"
    t0 = time.monotonic()
    done = run(["sh", "-c", f"sleep 600 & echo $! > {pids}; echo started; wait"], 0.5)
    assert done.timed_out and done.rc is None and 0.5 <= time.monotonic() - t0 < 3
    assert done.stdout == "started\n"  # what came before the deadline is kept
    assert gone(int(pids.read_text()))  # its child, in its process group, died with it


# A shared deadline long enough for a loaded machine to run ``true`` well within it, and
# for one deadline to be told from two by more than any load adds.
SHARED_S = 2.0


def test_several_commands_cost_one_deadline_each_timed_to_its_own_end() -> None:
    t0 = time.monotonic()
    pending = [Pending(["sleep", "600"]) for _ in range(3)] + [Pending(["true"])]
    done = wait_all(pending, time.monotonic() + SHARED_S)
    assert time.monotonic() - t0 < 2 * SHARED_S  # one timeout for all three, not three
    assert [d.timed_out for d in done] == [True, True, True, False]
    assert done[3].rc == 0 and done[3].elapsed_s < SHARED_S  # its own end, not the deadline
    assert all(gone(p.pid) for p in pending[:3] if p.pid is not None)


def test_a_finished_command_whose_child_holds_its_pipes_is_collected_at_its_exit() -> None:
    """As ``nvidia-cuda-mps-control -d`` leaves its daemon with the client's stdout."""
    p = Pending(["sh", "-c", "sleep 600 & echo up"])
    try:
        t0 = time.monotonic()
        done = p.wait(time.monotonic() + 10)
        assert (done.rc, done.stdout, done.timed_out) == (0, "up\n", False)
        assert time.monotonic() - t0 < 5  # at its exit, not at the deadline (10 s)
    finally:
        assert p.pid is not None
        os.killpg(p.pid, signal.SIGKILL)  # the sleep it left behind


def test_a_command_dies_with_the_thread_that_started_it() -> None:
    if runner._SETPRIV is None:
        pytest.skip("no setpriv here: the deadline's group kill is all there is")
    started: List[Pending] = []

    def start() -> None:
        p = Pending(["sleep", "600"])
        started.append(p)
        # The thread ends once setpriv has asked for the signal and run the command (as a
        # run's thread waits for its commands); a thread gone before would take no one.
        end = time.monotonic() + 5
        while time.monotonic() < end and comm(p.pid) != "sleep":
            time.sleep(0.005)

    t = threading.Thread(target=start)
    t.start()
    t.join()
    pid = started[0].pid
    assert pid is not None
    try:
        end = time.monotonic() + 5
        while time.monotonic() < end:
            reaped, status = os.waitpid(pid, os.WNOHANG)
            if reaped:
                break
            time.sleep(0.01)
        assert reaped and os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    finally:
        started[0].kill()


def test_kill_started_since_ends_what_a_run_started() -> None:
    before = Pending(["sleep", "600"])
    since = time.monotonic()
    after = Pending(["sleep", "600"])
    try:
        kill_started_since(since)
        done = after.wait(time.monotonic() + 5)
        assert done.rc == -signal.SIGKILL and not done.timed_out
        assert not before.finished()
    finally:
        before.kill()
        before.wait(time.monotonic() + 5)


def test_waiting_is_told_once_what_still_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner, "WAITING_AFTER_S", 0.2)
    told: List[List[Pending]] = []
    quick, slow = Pending(["true"]), Pending(["sleep", "600"])
    done = wait_all([quick, slow], time.monotonic() + 1.0, told.append)
    assert told == [[slow]]
    assert done[0].rc == 0 and done[1].timed_out


def test_without_a_thread_to_be_had_each_is_collected_in_turn(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Our own limits (no thread can start) cost latency, never a traceback or a command
    left running: the deadline still holds for all of them together."""
    def no_thread(self) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", no_thread)
    t0 = time.monotonic()
    pending = [Pending(["sleep", "600"]), Pending(["sleep", "600"]), Pending(["echo", "hi"])]
    done = wait_all(pending, time.monotonic() + SHARED_S)
    assert time.monotonic() - t0 < 2 * SHARED_S  # one deadline for all, not one each
    assert [d.timed_out for d in done] == [True, True, False] and done[2].stdout == "hi\n"


def test_a_slow_setpriv_still_gets_the_command_its_stdin(monkeypatch) -> None:
    # setpriv that execs the command only after the runner's first wait gave up (a busy
    # machine): the command is fed once armed, by a thread, and answers as usual.
    from hostile import c_fake

    monkeypatch.setattr(runner, "_SETPRIV", str(c_fake("slow_setpriv")))
    monkeypatch.setenv("SLOW_SETPRIV_MS", str(int(runner.ARMED_WAIT_S * 1000) + 300))
    done = run(["/bin/cat"], 30, stdin="get_server_list\n")
    assert (done.rc, done.stdout, done.timed_out) == (0, "get_server_list\n", False)
