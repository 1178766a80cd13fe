"""One timeout per wedged daemon: a run's control queries, shared by the probes that ask
the daemons, ask a daemon that gave no answer nothing more."""

import threading
import time
from pathlib import Path
from typing import Any

from mps_health.config import load as config_mod
from mps_health.model.facts import ControlAnswer, Instance
from mps_health.probes import control
from mps_health.probes.context import Context
from mps_health.probes.queries import Queries

Q = control.QUERY
INST = Instance("gpu0", "per-gpu", "/tmp/mpsh-unit/pipe0", "/tmp/mpsh-unit/log0", gpu="0")
TIMED_OUT = ControlAnswer(Q, "timeout", None, "", "", 2.0, "no answer within 2.0s")


def _ctx(tmp_path: Path, queries: object) -> Context:
    # A client that cannot start: a query that is made says exec-failed, one that is
    # not made says skipped.
    cfg = config_mod.from_mapping({"run_dir": str(tmp_path / "run"), "commands": {
        "nvidia-cuda-mps-control": str(tmp_path / "no-such-client")}}, None)
    return Context(cfg, "/", time.monotonic() + 30, queries=queries)


def test_a_daemon_that_gave_no_answer_is_not_asked_again(tmp_path: Path) -> None:
    queries = Queries()
    queries.record(INST.pipe_dir, TIMED_OUT)
    answer = control.ask(_ctx(tmp_path, queries), INST, "get_server_list", time.monotonic() + 5)
    assert (answer.status, answer.latency_s) == ("skipped", 0.0)
    assert answer.detail == ("not asked: the control daemon gave no answer to "
                             f"{Q} this run (no answer within 2.0s)")


def test_an_answered_daemon_is_asked(tmp_path: Path) -> None:
    queries = Queries()
    queries.record(INST.pipe_dir, ControlAnswer(Q, "ok", 0, "100.0\n", "", 0.01))
    answer = control.ask(_ctx(tmp_path, queries), INST, "get_server_list", time.monotonic() + 5)
    assert answer.status == "exec-failed"  # asked: the client was started (and missing)


def test_a_query_waits_for_the_runs_query_of_that_daemon(tmp_path: Path) -> None:
    """The servers probe asks only once the run's control query of the instance is in."""
    queries = Queries()
    queries.expect(INST.pipe_dir)
    got = []
    t = threading.Thread(target=lambda: got.append(
        queries.unanswered(INST.pipe_dir, time.monotonic() + 30)))
    t.start()
    t.join(0.3)
    assert t.is_alive() and got == []  # still waiting for the answer
    queries.record(INST.pipe_dir, TIMED_OUT)
    t.join(5)
    assert got == [f"the control daemon gave no answer to {Q} this run "
                   "(no answer within 2.0s)"]


def test_a_failed_query_lets_its_waiters_go(tmp_path: Path) -> None:
    queries = Queries()
    queries.expect(INST.pipe_dir)
    queries.settle([INST.pipe_dir])
    assert queries.unanswered(INST.pipe_dir, time.monotonic() + 30) == ""


def test_the_servers_probe_does_not_ask_a_daemon_that_gave_no_answer(tmp_path: Path) -> None:
    from mps_health.probes import server_queries

    queries = Queries()
    queries.expect(INST.pipe_dir)
    threading.Timer(0.2, queries.record, (INST.pipe_dir, TIMED_OUT)).start()
    found = server_queries.read_instance(_ctx(tmp_path, queries), INST, (4242, 7))
    assert found.query == "skipped"
    assert found.detail.startswith("not asked: the control daemon gave no answer to " + Q)


def test_a_run_without_a_deadline_waits_for_its_canaries(monkeypatch: Any) -> None:
    # Context's default deadline is infinite; threading's waits refuse an infinite
    # timeout, so the canary's wait for its threads once raised OverflowError.
    from mps_health.model.facts_deep import CanaryFact
    from mps_health.probes import canary

    served = CanaryFact("served", "", 1)
    monkeypatch.setattr(canary, "run_one", lambda ctx, inst, cfg: served)
    ctx = Context(config_mod.from_mapping({"canary": {"when": "always"}}, None))
    assert canary.gather(ctx, (INST,)) == {INST.name: served}
