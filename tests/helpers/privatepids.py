"""Tests marked ``private_pids`` run whole (fixtures, body, teardown) in a forked child
that is the first process of its own PID namespace, with its own /proc.

A check that judges the whole node (strays) sees every MPS process on the machine; where
other test runs go on beside this one, their fake daemons, servers and a test user's
impostors are on it too, and such a test would judge them. In its own namespace it sees
only the processes it started. The child sends its reports back to this process, which
logs them as its own (as pytest-forked does). When the namespace's first process ends,
the kernel kills every process left in it: nothing a test started outlives it.

Needs root (unshare); a marked test is skipped without it.
"""

import ctypes
import json
import os
import sys
import traceback
from typing import Any, List, Optional

import pytest

CLONE_NEWNS = 0x00020000
CLONE_NEWPID = 0x20000000
MS_NOSUID, MS_NODEV, MS_NOEXEC = 0x2, 0x4, 0x8
MS_REC, MS_PRIVATE = 0x4000, 0x40000

# True in a marked test's child: it sees only its own processes (nodesite leaves the
# node-wide strays check on there).
INSIDE = False


def _libc_call(name: str, *args: Any) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if getattr(libc, name)(*args) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{name}: {os.strerror(err)}")


def _own_proc() -> None:
    """Mounts made here stay here; /proc shows this PID namespace (called as its PID 1)."""
    _libc_call("mount", None, b"/", None, MS_REC | MS_PRIVATE, None)
    _libc_call("mount", b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None)


def _run_inside(item: pytest.Item, out: int) -> None:
    """The grandchild, PID 1 of the new namespace: run the item, write its reports."""
    global INSIDE
    from _pytest.runner import runtestprotocol

    INSIDE = True
    try:
        _own_proc()
        reports = runtestprotocol(item, log=False, nextitem=None)
        data = [item.config.hook.pytest_report_to_serializable(config=item.config, report=r)
                for r in reports]
        payload = json.dumps({"reports": data}).encode()
    except BaseException:  # reported to the parent as the test's failure, not lost
        payload = json.dumps({"error": traceback.format_exc()}).encode()
    with os.fdopen(out, "wb") as f:
        f.write(payload)


def _forked(item: pytest.Item) -> dict:
    """Fork; the child unshares and forks the namespace's first process, which runs the
    item. What it wrote back, read before waiting (a pipe holds only 64 KiB)."""
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover (the child never returns)
        code = 1
        try:
            os.close(read_end)
            _libc_call("unshare", CLONE_NEWNS | CLONE_NEWPID)
            first = os.fork()
            if first == 0:
                _run_inside(item, write_end)
                os._exit(0)
            os.close(write_end)
            code = os.waitstatus_to_exitcode(os.waitpid(first, 0)[1])
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as f:
        payload = f.read()
    status = os.waitstatus_to_exitcode(os.waitpid(child, 0)[1])
    if not payload:
        return {"error": f"the test's private PID namespace ended with status {status} "
                         "and no report (see its stderr)"}
    result: dict = json.loads(payload)
    return result


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: Optional[pytest.Item]
                            ) -> Optional[bool]:
    if item.get_closest_marker("private_pids") is None or INSIDE:
        return None
    if os.geteuid() != 0:
        item.add_marker(pytest.mark.skip(reason="needs root for a private PID namespace"))
        return None
    sys.stdout.flush()
    sys.stderr.flush()
    ihook = item.ihook
    ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    result = _forked(item)
    reports: List[Any] = [item.config.hook.pytest_report_from_serializable(
        config=item.config, data=d) for d in result.get("reports", ())]
    if "error" in result:
        from _pytest.reports import TestReport

        reports = [TestReport(item.nodeid, item.location, {}, "failed",
                              result["error"], "call", [])]
    for report in reports:
        ihook.pytest_runtest_logreport(report=report)
    # What this process set up for the items before (their module, its fixtures) is torn
    # down here as the item's own teardown would have: the next item starts clean.
    item.session._setupstate.teardown_exact(nextitem)
    ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    return True
