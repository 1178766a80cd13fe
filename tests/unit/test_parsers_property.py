"""Property tests: any text given to a parser is parsed or refused with one clear line."""


from hypothesis import given, settings
from hypothesis import strategies as st
from mps_health.probes.gres_conf import parse_gres_conf
from mps_health.probes.hostlist import ParseError, expand
from mps_health.probes.nvml import RecordedApi, read_nvml
from mps_health.probes.slurm import (
    parse_gres,
    parse_node_line,
    parse_squeue,
)

# Text that looks like Slurm's as often as not: its punctuation and words, mixed with noise.
WORDS = st.sampled_from(["NodeName=", "State=", "Gres=", "GresUsed=", "Reason=", "gpu", "mps",
                         ":", ",", "(", ")", "[", "]", "IDX:", "N/A", "(null)", "0", "1-3",
                         "/", "=", " ", "\n", "|", "-", "Name=", "File=", "Count=", "#", "\\",
                         "Include ", "NodeName=n[1-2] ", "/dev/nvidia[0-1]", "4G", "AutoDetect="])
SLURMISH = st.one_of(st.text(), st.lists(WORDS, max_size=30).map("".join))


def one_line(e: Exception) -> None:
    assert str(e) and "\n" not in str(e)


@settings(max_examples=300)
@given(SLURMISH)
def test_node_line(text: str) -> None:
    try:
        parse_node_line(text)
    except ParseError as e:
        one_line(e)


@settings(max_examples=300)
@given(SLURMISH)
def test_gres(text: str) -> None:
    try:
        parse_gres(text)
    except ParseError as e:
        one_line(e)


@settings(max_examples=200)
@given(SLURMISH)
def test_squeue(text: str) -> None:
    try:
        parse_squeue(text)
    except ParseError as e:
        one_line(e)


@settings(max_examples=300)
@given(SLURMISH)
def test_gres_conf_never_raises(text: str) -> None:
    conf = parse_gres_conf(text, "n1", "/etc/slurm/gres.conf", lambda p: text)
    assert all("\n" not in e for e in conf.errors)


@settings(max_examples=300)
@given(SLURMISH)
def test_hostlist(text: str) -> None:
    try:
        expand(text)
    except ParseError as e:
        one_line(e)


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.sampled_from(["nodes", "name", "state", "gres",
                                                       "gres_used", "reason", "errors",
                                                       "state_flags", "x"]), inner, max_size=5),
                    max_leaves=20)


DEVICE = st.dictionaries(st.sampled_from(["uuid", "minor", "name", "compute_mode", "mig_mode",
                                          "persistence_mode", "compute_processes",
                                          "mps_processes"]),
                         JSON | st.fixed_dictionaries({"error": st.text(max_size=12)}),
                         max_size=8)


@settings(max_examples=300)
@given(st.lists(DEVICE, max_size=3), JSON)
def test_nvml_recording_never_crashes(devices, count) -> None:
    data = {"format": "mps-health-nvml-record", "format_version": 1, "init_error": None,
            "devices": devices, "device_count": count if count is not None else len(devices)}
    nvml = read_nvml(RecordedApi(data))
    assert nvml.available or (nvml.error and "\n" not in nvml.error)
