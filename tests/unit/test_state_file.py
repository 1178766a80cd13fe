"""The deep checks' memory (state.StateFile through codec) keeps its text: json sorted by
key, records as objects, tuples as lists; and reads back into the same records."""

import json
import math
from pathlib import Path
from typing import Dict

from mps_health.hostio.state import StateFile
from mps_health.model import codec, facts_deep

MEMORY = Dict[str, facts_deep.ServerMemory]
VALUE = {"node": facts_deep.ServerMemory(
    taken_at=1.5, daemon_pid=7, daemon_start=9,
    servers=(facts_deep.RememberedServer(41, 99, "ACTIVE", 2.25, "alice", ((50, 51),), True),),
    events=(facts_deep.ServerEvent(3.0, "server-churn", "two servers \u00e9 \n"),))}
# What the format was before the records were typing's and the text json's own: a state
# file written by an older mps-health must read back, and one written now must read in it.
TEXT = ('{"node": {"daemon_pid": 7, "daemon_start": 9, "events": [{"at": 3.0, "code": '
        '"server-churn", "message": "two servers \\u00e9 \\n"}], "servers": [{"clients": '
        '[[50, 51]], "daemon_child": true, "pid": 41, "start_ticks": 99, "status": "ACTIVE", '
        '"status_since": 2.25, "user": "alice"}], "taken_at": 1.5}}')


def saved(tmp_path: Path, value) -> str:
    state = StateFile(str(tmp_path), "servers")
    assert state.lock(float("inf")), state.error
    try:
        assert state.save(value) == ""
    finally:
        state.unlock()
    return (tmp_path / "servers.json").read_text()


def test_the_text_is_unchanged_and_reads_back(tmp_path: Path) -> None:
    assert saved(tmp_path, VALUE) == TEXT
    assert json.dumps(codec.encode(VALUE), sort_keys=True) == TEXT
    back, why = StateFile(str(tmp_path), "servers").load(MEMORY, {})
    assert why == "" and back == VALUE
    assert type(back["node"].servers[0]) is facts_deep.RememberedServer


def test_a_file_without_the_newer_fields_reads_with_their_defaults(tmp_path: Path) -> None:
    old = json.loads(TEXT)
    del old["node"]["events"], old["node"]["servers"][0]["daemon_child"]
    (tmp_path / "servers.json").write_text(json.dumps(old))
    back, why = StateFile(str(tmp_path), "servers").load(MEMORY, {})
    assert why == ""
    assert back["node"].events == () and back["node"].servers[0].daemon_child is False


def test_nan_and_damage(tmp_path: Path) -> None:
    """NaN is written as json writes it and read back; text that is not JSON, or JSON
    that does not fit the records, starts afresh with one line."""
    text = saved(tmp_path, {"node": VALUE["node"]._replace(taken_at=math.nan)})
    assert '"taken_at": NaN' in text
    back, why = StateFile(str(tmp_path), "servers").load(MEMORY, {})
    assert why == "" and math.isnan(back["node"].taken_at)
    for bad in ('{"node": ', '{"node": {"taken_at": "x"}}', '{"node": 1} trailing'):
        (tmp_path / "servers.json").write_text(bad)
        back, why = StateFile(str(tmp_path), "servers").load(MEMORY, {})
        assert back == {} and "is damaged" in why and "starting afresh" in why, why
