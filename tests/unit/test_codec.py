"""model/codec.py decodes from real types: every record a snapshot or a state file holds
has field annotations that resolve at run time, and the forms facts use read back."""

from typing import Any, Dict, List, Optional, Tuple

import pytest
from mps_health.engine import registry
from mps_health.hostio import jobrecords, unblocks
from mps_health.model import codec, facts_deep
from mps_health.model.facts import Facts, Instance

STATE_TYPES = (jobrecords.VALUE_TYPE, unblocks.VALUE_TYPE, Tuple[facts_deep.Ack, ...],
               Tuple[facts_deep.PlannedRestart, ...], Dict[str, facts_deep.ServerMemory],
               facts_deep.LogMemory)


def source_types() -> List[Any]:
    return [src.probe().value_type for src in registry.SOURCES.values()]


def records_in(node: codec.Node, seen: set) -> None:
    """Every record class under the plan ``node``, its field types resolved on the way
    (a name imported only under TYPE_CHECKING fails here, not on a node)."""
    kind = node[0]
    if kind == "record" and node[1] not in seen:
        seen.add(node[1])
        for _field, sub in codec._fields_of(node[1]):
            records_in(sub, seen)
    elif kind in ("varlen", "dict"):
        records_in(node[1], seen)
    elif kind in ("tuple", "union"):
        for sub in node[1]:
            records_in(sub, seen)


def test_every_record_saved_resolves_its_field_types() -> None:
    seen: set = set()
    for tp in (Facts, *source_types(), *STATE_TYPES):
        records_in(codec.parse(tp), seen)
    assert {Facts, Instance, facts_deep.ServerMemory, jobrecords.JobRecord} <= seen


def test_the_forms_read_back() -> None:
    inst = Instance("gpu0", "per-gpu", "/p", "/l", gpu="0")
    assert codec.decode(Tuple[Instance, ...], codec.encode((inst,))) == (inst,)
    assert codec.decode(Optional[int], None) is None
    assert codec.decode(Tuple[str, int], ["a", 1]) == ("a", 1)
    assert codec.decode(Dict[str, float], {"a": 1}) == {"a": 1.0}
    assert codec.decode(List[Any], [1, "x"]) == (1, "x")
    assert codec.decode(Tuple, [1]) == (1,) and codec.decode(object, {"a": 1}) == {"a": 1}


@pytest.mark.parametrize("tp, data, message", [
    (int, True, "$: expected int"),
    (float, "1", "$: expected a number"),
    (Tuple[int, ...], {}, "$: expected a list"),
    (Dict[str, int], {"a": "x"}, "$.a: expected int"),
    (Instance, {"name": "n"}, "$: Instance lacks 'layout'"),
])
def test_what_does_not_fit_is_named(tp: Any, data: Any, message: str) -> None:
    with pytest.raises(codec.DecodeError, match=message.replace("$", r"\$")):
        codec.decode(tp, data)
