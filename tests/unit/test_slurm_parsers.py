"""Slurm parsers on real captured 22.05 and 24.11 output and the hand-written 23.02/23.11 forms."""

import json

import pytest
from conftest import fixture_text
from mps_health.hostio.runner import Completed
from mps_health.probes.hostlist import ParseError
from mps_health.probes.jobs import gres_count
from mps_health.probes.slurm import (
    GresItem,
    classify_failure,
    parse_elapsed,
    parse_gres,
    parse_node_line,
    parse_squeue,
)

V22 = "scontrol_show_node_-d_-o__slurm-22.05_{}.txt"


def test_idle_node_22_05() -> None:
    node = parse_node_line(fixture_text(V22.format("idle")))
    assert node.name == "mpsnode"
    assert node.state == "IDLE" and node.flags == ("IDLE",)
    assert node.reason == ""
    assert node.gres == (GresItem("gpu", None, 2), GresItem("mps", None, 200))
    assert node.gres_used == (GresItem("gpu", None, 0), GresItem("mps", None, 0, ()))
    assert node.slurmd_version == "22.05.8"


def test_mps_job_22_05_counts_gpus_not_percent() -> None:
    # Seen on 22.05: one --gres=mps:50 job reads mps:(null):1(IDX:0): 1 is the number of
    # GPUs holding mps, IDX their indices.
    node = parse_node_line(fixture_text(V22.format("mps-job")))
    assert node.state == "MIXED"
    mps = [g for g in node.gres_used or () if g.name == "mps"]
    assert mps == [GresItem("mps", None, 1, (0,))]


def test_mps_and_gpu_jobs_22_05() -> None:
    node = parse_node_line(fixture_text(V22.format("mps-and-gpu-jobs")))
    assert node.gres_used == (GresItem("gpu", None, 1), GresItem("mps", None, 1, (0,)))


def test_drained_by_us_reads_the_reason_without_slurms_stamp() -> None:
    node = parse_node_line(fixture_text(V22.format("drained-by-mps-health")))
    assert node.flags == ("IDLE", "DRAIN")
    assert node.reason == "MPS-HC: daemon-dead node: control daemon is not running"


def test_down_by_admin() -> None:
    node = parse_node_line(fixture_text(V22.format("down-by-admin")))
    assert node.flags == ("DOWN", "NOT_RESPONDING")
    assert node.reason == "fan failure"


def test_state_suffixes_are_flags_not_parts_of_words() -> None:
    node = parse_node_line("NodeName=n State=IDLE*+DRAIN Reason=x [root@2026-01-01T00:00:00]")
    assert node.flags == ("IDLE", "NOT_RESPONDING", "DRAIN") and node.reason == "x"


def test_a_reason_that_only_looks_stamped_is_kept() -> None:
    assert parse_node_line("NodeName=n State=IDLE Reason=see [ticket 7]").reason == \
        "see [ticket 7]"


def test_os_value_with_spaces_does_not_break_fields() -> None:
    node = parse_node_line(fixture_text(V22.format("gpu2-job")))
    assert node.gres_used is not None and node.gres_used[0] == GresItem("gpu", None, 2)


def test_23_02_handwritten_types_sockets_and_idx() -> None:
    node = parse_node_line(fixture_text(
        "scontrol_show_node_-d_-o__slurm-23.02_HANDWRITTEN_mps-jobs.txt"))
    assert node.gres == (GresItem("gpu", "h200", 8), GresItem("mps", "h200", 400))
    assert node.gres_used == (GresItem("gpu", "h200", 2, (4, 5)),
                              GresItem("mps", "h200", 80, (0, 1)))
    assert node.flags == ("MIXED", "DRAIN")
    assert node.reason.startswith("MPS-HC: mps-gpu-no-daemon gpu1")


def test_23_11_handwritten_per_device_usage() -> None:
    node = parse_node_line(fixture_text(
        "scontrol_show_node_-d_-o__slurm-23.11_HANDWRITTEN_mps-jobs.txt"))
    mps = node.gres_used[1] if node.gres_used else None
    assert mps == GresItem("mps", "h200", 80, (0, 1), ((50, 100), (30, 100), (0, 100), (0, 100)))


def test_squeue_three_jobs() -> None:
    jobs = parse_squeue(fixture_text("squeue_-h_-w_-o__slurm-22.05_three-jobs.txt"))
    assert [(j.job_id, j.user, j.uid, j.state, gres_count(j, "mps") is not None) for j in jobs] == [
        ("1", "root", 0, "RUNNING", True), ("2", "mpshtest", 1002, "RUNNING", True),
        ("3", "root", 0, "RUNNING", False)]
    assert all(j.elapsed_s is not None and j.elapsed_s >= 0 for j in jobs)


def test_garbled_squeue_is_an_error_not_an_empty_list() -> None:
    with pytest.raises(ParseError, match=r"squeue line 1 is not 'JOBID\|USER\|UID\|STATE"):
        parse_squeue("slurm_load_jobs error: Unable to contact slurm controller\n")


@pytest.mark.parametrize("text,seconds", [("0:01", 1), ("12:34", 754), ("1:02:03", 3723),
                                          ("2-01:00:00", 176400), ("3-00:00:07", 259207),
                                          ("x-01:00:00", None), ("1-2", None),
                                          ("INVALID", None)])
def test_elapsed(text: str, seconds) -> None:
    assert parse_elapsed(text) == seconds





def _failed(stdout: str = "", stderr: str = "", timed_out: bool = False) -> Completed:
    return Completed(["scontrol"], None if timed_out else 1, stdout, stderr, 2.0, timed_out)


def test_failures_are_classified_from_real_output() -> None:
    down = _failed(stderr=fixture_text(
        "scontrol_show_node_-d_-o__slurm-22.05_controller-down.stderr.txt"))
    assert classify_failure(down, "scontrol show node", 5)[0] == "unreachable"
    missing = _failed(stdout=fixture_text(
        "scontrol_show_node_-d_-o__slurm-22.05_not-found.stdout.txt"))
    assert classify_failure(missing, "scontrol show node", 5) == (
        "node-unknown", "scontrol show node: Node nosuchnode not found")
    sq = _failed(stderr=fixture_text("squeue_-h_-w_-o__slurm-22.05_not-found.stderr.txt"))
    # squeue names itself in its errors: the line says "squeue:" once.
    assert classify_failure(sq, "squeue", 5) == (
        "node-unknown", "squeue: error: Invalid node name nosuchnode")
    other = _failed(stderr="scontrol: error: Invalid user id\n")
    assert classify_failure(other, "scontrol show node n1", 5) == (
        "error", "scontrol show node n1: error: Invalid user id")
    code, line = classify_failure(_failed(timed_out=True), "scontrol show node", 2.5)
    assert code == "timeout" and "within 2.5s" in line


@pytest.mark.parametrize("bad", ["gpu:x:y", "gpu:a:b:c:d", "gpu(IDX:0", "gpu:1(IDX:2-1)",
                                 "gpu:1(what)", ":1", "mps:1(1/x)"])
def test_bad_gres_is_a_clear_error(bad: str) -> None:
    with pytest.raises(ParseError):
        parse_gres(bad)


def test_node_line_errors() -> None:
    with pytest.raises(ParseError, match="one node line"):
        parse_node_line("")
    with pytest.raises(ParseError, match="NodeName"):
        parse_node_line("Foo=bar")


# --- Slurm 24.11, captured from the Debian 13 root (tests/helpers/capture_slurm_fixtures.py
# --slurm24): the text and the JSON form of each state, and what the tag rules make of it.

V24 = "scontrol_show_node_-d_-o__slurm-24.11_{}.txt"
V24_JSON = "scontrol_--json_show_node__slurm-24.11_{}.json"
V24_PLAIN = "scontrol_show_node_-o__slurm-24.11_{}.txt"
STATES_24 = ["idle", "mps-job", "mps-and-gpu-jobs", "gpu2-job", "drained-by-mps-health",
             "resumed", "down-by-admin"]


@pytest.mark.parametrize("label", STATES_24)
def test_24_11_text_holds_every_fact_the_json_form_gives(label: str) -> None:
    """Why one reader serves every version: on each captured state, the text answer has
    what ``scontrol --json`` says of the node (state and flags, reason, GRES, in use)."""
    from_text = parse_node_line(fixture_text(V24.format(label)))
    node = json.loads(fixture_text(V24_JSON.format(label)))["nodes"][0]
    assert [f.upper() for f in node["state"]] == list(from_text.flags)
    assert from_text.reason == node["reason"]
    assert (parse_gres(node["gres"]), parse_gres(node["gres_used"])) == (
        from_text.gres, from_text.gres_used)
    assert from_text.slurmd_version == node["version"] == "24.11.5"


def test_24_11_idle_prints_null_types_and_per_gpu_slots() -> None:
    # GresUsed=gpu:(null):0(IDX:N/A),mps:(null):0(0/100,0/100)
    node = parse_node_line(fixture_text(V24.format("idle")))
    assert node.flags == ("IDLE",) and node.reason == ""
    assert node.gres == (GresItem("gpu", None, 2), GresItem("mps", None, 200))
    assert node.gres_used == (GresItem("gpu", None, 0, ()),
                              GresItem("mps", None, 0, (), ((0, 100), (0, 100))))


def test_24_11_mps_jobs_count_shares_per_gpu() -> None:
    # Unlike 22.05 (mps:1(IDX:0): GPUs), 24.11 counts shares: two jobs of 50 and 30 on
    # GPU 0 read mps:(null):80(80/100,0/100); the whole-GPU job holds GPU 1.
    one = parse_node_line(fixture_text(V24.format("mps-job")))
    assert [g for g in one.gres_used or () if g.name == "mps"] == [
        GresItem("mps", None, 50, (0,), ((50, 100), (0, 100)))]
    both = parse_node_line(fixture_text(V24.format("mps-and-gpu-jobs")))
    assert both.state == "MIXED"
    assert both.gres_used == (GresItem("gpu", None, 1, (1,)),
                              GresItem("mps", None, 80, (0,), ((80, 100), (0, 100))))
    whole = parse_node_line(fixture_text(V24.format("gpu2-job")))
    assert whole.gres_used is not None and whole.gres_used[0] == GresItem("gpu", None, 2, (0, 1))


def test_24_11_keeps_the_reason_after_resume() -> None:
    from mps_health.healthcheck import slurmnode

    resumed = parse_node_line(fixture_text(V24_PLAIN.format("resumed")))
    assert resumed.flags == ("IDLE", "NOT_RESPONDING")
    assert resumed.reason == "MPS-HC: daemon-dead node: control daemon is not running"
    assert slurmnode.may_resume(resumed, "MPS-HC:")[0] is False  # not drained: nothing to do
    # Another's old reason on a node in service is history: a failing check still drains.
    human = resumed._replace(reason="swapping a GPU")
    assert slurmnode.may_drain(human, "MPS-HC:") == (
        True, "node is IDLE+NOT_RESPONDING (its reason 'swapping a GPU' is left from an "
              "earlier drain)")


@pytest.mark.parametrize("label, drain, resume", [
    ("idle", True, False),
    ("drained-by-mps-health", False, True),
    ("resumed", True, False),
    ("down-by-admin", False, False),
])
def test_24_11_tag_rules_on_real_states(label: str, drain: bool, resume: bool) -> None:
    from mps_health.healthcheck import slurmnode

    node = parse_node_line(fixture_text(V24_PLAIN.format(label)))
    assert slurmnode.may_drain(node, "MPS-HC:")[0] is drain
    assert slurmnode.may_resume(node, "MPS-HC:")[0] is resume


def test_24_11_squeue_writes_gres_with_a_slash() -> None:
    jobs = parse_squeue(fixture_text("squeue_-h_-w_-o__slurm-24.11_three-jobs.txt"))
    assert [(j.job_id, j.user, j.uid, j.gres, gres_count(j, "mps") is not None) for j in jobs] == [
        ("1", "root", 0, "gres/mps:50", True), ("2", "mpshtest", 1002, "gres/mps:30", True),
        ("3", "root", 0, "gres/gpu:1", False)]


def test_24_11_failures() -> None:
    down = _failed(stderr=fixture_text(
        "scontrol_show_node_-d_-o__slurm-24.11_controller-down.stderr.txt"))
    assert classify_failure(down, "scontrol show node", 5)[0] == "unreachable"
    missing = _failed(stdout=fixture_text(
        "scontrol_show_node_-d_-o__slurm-24.11_not-found.stdout.txt"))
    assert classify_failure(missing, "scontrol show node", 5)[0] == "node-unknown"
    sq = _failed(stderr=fixture_text("squeue_-h_-w_-o__slurm-24.11_not-found.stderr.txt"))
    # squeue names itself in its errors: the line says "squeue:" once.
    assert classify_failure(sq, "squeue", 5) == (
        "node-unknown", "squeue: error: Invalid node name nosuchnode")
