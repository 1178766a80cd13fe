"""jsontext writes and reads the state files' JSON exactly as the json module does."""

import json
import math
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mps_health.hostio import jsontext

scalars = (st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True)
           | st.text())
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                      | st.dictionaries(st.text(), inner, max_size=4), max_leaves=30)


def same(a, b) -> bool:
    """Equal, NaN equal to NaN (json's text for both is the same then)."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


@settings(max_examples=400, deadline=None)
@given(values)
def test_dumps_writes_what_json_writes(value) -> None:
    assert jsontext.dumps(value) == json.dumps(value, sort_keys=True)
    assert same(jsontext.loads(jsontext.dumps(value)), value)


@settings(max_examples=600, deadline=None)
@given(st.text(alphabet=' \t\n\r{}[]":,.-+eE0123456789truefalsnNaIiy\\u\x00\xe9', max_size=30))
def test_loads_accepts_and_refuses_what_json_does(text) -> None:
    try:
        expected = json.loads(text)
    except (ValueError, RecursionError):
        with pytest.raises((ValueError, RecursionError)):
            jsontext.loads(text)
        return
    assert same(jsontext.loads(text), expected)


@pytest.mark.parametrize("text", [
    "", " ", "{", "[1,]", '{"a" 1}', "1 2", '{"a": 1} x', "nul", "\ufeff{}", "01",
    '"\\x"', '"a\nb"', "[1] ]", "NaNa", "- 1", '{"a": 1,}',
])
def test_bad_text_is_a_value_error(text) -> None:
    with pytest.raises(ValueError):
        json.loads(text)
    with pytest.raises(ValueError):
        jsontext.loads(text)


@pytest.mark.parametrize("text", [" {} ", "\n[1, 2.5e3, -0.0]\r\n", '"\\u00e9"', "NaN",
                                  "-Infinity", '{"a": {"b": [true, false, null]}}', "1E400"])
def test_good_text_reads_as_json_reads_it(text) -> None:
    assert same(jsontext.loads(text), json.loads(text))


def test_unencodable_and_circular_values_fail_as_in_json_and_leave_nothing_behind() -> None:
    loop: list = []
    loop.append(loop)
    for bad, error in (({"a": object()}, TypeError), (loop, ValueError), ({1j: 1}, TypeError)):
        with pytest.raises(error):
            json.dumps(bad, sort_keys=True)
        with pytest.raises(error):
            jsontext.dumps(bad)
    shared = [1]
    assert jsontext.dumps([shared, shared]) == "[[1], [1]]"  # no stale cycle marker
    assert math.isnan(jsontext.loads(jsontext.dumps(float("nan"))))


def test_without_the_accelerator_it_is_json() -> None:
    code = ("import sys\nsys.modules['_json'] = None\n"
            "from mps_health.hostio import jsontext\n"
            "assert jsontext._ACCEL is None\n"
            "print(jsontext.dumps({'b': [1, 2.5, None], 'a': 'é'}))\n"
            "print(jsontext.loads(' {\"x\": [1, true]} '))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ['{"a": "\\u00e9", "b": [1, 2.5, null]}',
                                     "{'x': [1, True]}"]
