"""probes/control: the client's answers told apart, and queries bounded."""

import signal
import time

import pytest
from mps_health.config import load as config_mod
from mps_health.hostio.runner import Completed
from mps_health.model.facts import Instance
from mps_health.probes import control
from mps_health.probes.context import Context
from nodesite import Site

Q = control.QUERY


def done(rc, out="", err="", timed_out=False, exec_error=None, elapsed=0.01) -> Completed:
    return Completed(["nvidia-cuda-mps-control"], rc, out, err, elapsed, timed_out, exec_error)


# Outputs as the real client printed them on the H200 (CUDA 13.0).
@pytest.mark.parametrize("completed,status", [
    (done(0, "100.0\n"), "ok"),
    (done(0, "50.0\n"), "ok"),
    (done(1, "Cannot find MPS control daemon process\n"), "absent"),
    (done(0, 'Unknown command "get_default_active_thread_percentage"\n'), "error"),
    (done(0, ""), "error"),
    (done(1, "An instance of this daemon is already running\n"), "error"),
    (done(None, "", timed_out=True, elapsed=2.0), "timeout"),
    (done(None, exec_error="nvidia-cuda-mps-control: command not found"), "exec-failed"),
])
def test_classify(completed: Completed, status: str) -> None:
    assert control.classify(Q, completed).status == status


def test_error_detail_is_first_line() -> None:
    a = control.classify(Q, done(0, 'Unknown command "x"\nmore\n'))
    assert a.detail == 'Unknown command "x"'


def _ctx(site: Site, timeout: float = 1.0) -> Context:
    cfg = config_mod.load(site.config(control={"timeout_s": timeout}), table=None)
    return Context(cfg, "/", time.monotonic() + 30)


# Long enough for a loaded machine's healthy answer, and for two timeouts in a row to be
# told from one by more than any load adds (bench/wedged_instances.py measures the cost).
WEDGED_TIMEOUT_S = 3.0


def test_wedged_instances_cost_one_timeout(site) -> None:
    daemons = [site.start_daemon(f"i{n}") for n in range(3)]
    for d in daemons[:2]:
        d.signal(signal.SIGSTOP)
    cfg = config_mod.load(site.config(control={"timeout_s": WEDGED_TIMEOUT_S},
                                      pipe=daemons[0].pipe_dir, log=daemons[0].log_dir),
                          table=None)
    ctx = Context(cfg, "/", time.monotonic() + 30)
    insts = tuple(Instance(f"i{n}", "node", str(d.pipe_dir), str(d.log_dir))
                  for n, d in enumerate(daemons))
    t0 = time.monotonic()
    answers = control.ask_all(ctx, insts)
    elapsed = time.monotonic() - t0
    for d in daemons[:2]:
        d.signal(signal.SIGCONT)
    assert [answers[f"i{n}"].status for n in range(3)] == ["timeout", "timeout", "ok"]
    # The healthy one is timed to its own answer, not to the wedged ones' deadline.
    assert answers["i2"].latency_s < answers["i0"].latency_s
    assert elapsed < 2 * WEDGED_TIMEOUT_S  # concurrent: one timeout, not two or three


def test_lock_serialises_queries_to_one_pipe_dir(site) -> None:
    import fcntl
    import os

    d = site.start_daemon()
    ctx = _ctx(site, timeout=WEDGED_TIMEOUT_S)  # the wait for the lock, then the answer
    lock = control._Lock(ctx, str(d.pipe_dir))
    os.makedirs(os.path.dirname(lock.path), exist_ok=True)
    fd = os.open(lock.path, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)  # someone else is querying this dir
    try:
        inst = Instance("node", "node", str(d.pipe_dir), str(d.log_dir))
        answer = control.ask_all(ctx, (inst,))["node"]
    finally:
        os.close(fd)
    assert answer.status == "skipped"
    assert control.ask_all(ctx, (inst,))["node"].status == "ok"
    assert not os.path.exists(lock.path)  # pipe dirs come and go: their locks do not stay
