"""daemon_up is 1 only for a daemon that can serve: a stopped one, or one that gave the
run's control query no answer, is counted down by the fleet alert."""

from mps_health.checks import daemon
from mps_health.config.load import from_mapping
from mps_health.model.facts import ControlAnswer, DirFact, Facts, Instance, ProcessFact
from mps_health.model.results import OK
from mps_health.probes.control import QUERY as Q

INST = Instance("gpu0", "per-gpu", "/tmp/mpsh-unit/pipe0", "/tmp/mpsh-unit/log0", gpu="0")
TIMED_OUT = ControlAnswer(Q, "timeout", None, "", "", 2.0, "no answer within 2.0s")


def _daemon_facts(state: str, answer: ControlAnswer) -> Facts:
    proc = ProcessFact(4242, 1, state, 0, "control", ("nvidia-cuda-mps-control", "-d"), 99,
                       INST.pipe_dir, True)
    pipe = DirFact(INST.pipe_dir, "dir", 0o777, 0, 0, pid_file="4242")
    return Facts("n1", 0.0, "/", (INST,), {"processes": (proc,), "dirs": {INST.pipe_dir: pipe},
                                           "control": {INST.name: answer}}, {}, {})


def test_a_daemon_that_gave_no_answer_is_not_up() -> None:
    cfg = from_mapping({}, None)
    (wedged,) = daemon.check(_daemon_facts("S", TIMED_OUT), cfg)
    assert wedged.state == OK and dict(wedged.values)["daemon_up"] == 0.0
    assert "did not answer this run's query" in wedged.message
    answered = ControlAnswer(Q, "ok", 0, "100.0\n", "", 0.01)
    (up,) = daemon.check(_daemon_facts("S", answered), cfg)
    assert dict(up.values)["daemon_up"] == 1.0
    (stopped,) = daemon.check(_daemon_facts("T", TIMED_OUT), cfg)
    assert stopped.code == "daemon-stopped" and dict(stopped.values)["daemon_up"] == 0.0
