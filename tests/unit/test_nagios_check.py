"""check_mps as a nagiosplugin Check, on made Reports: mps-health's state order, a status
line of codes, perfdata as nagiosplugin writes it (plain decimals), the 8 KiB cut, and
one line, never a traceback, for anything that goes wrong."""

import subprocess
import sys

import nagiosplugin
import pytest
from mps_health.cli import check_mps
from mps_health.exporters import nagios
from mps_health.model.results import CRITICAL, OK, UNKNOWN, WARNING, CheckRun, Report, Result
from plugin_output import parse


def report(*results: Result) -> Report:
    runs = {}
    for r in results:
        runs.setdefault(r.check, []).append(r)
    return Report("n1", 0.0, 0.1, tuple(CheckRun(c, tuple(rs), 0.001) for c, rs in runs.items()),
                  {"control": 0.002}, "0")


def render(rep: Report, w: str = "0.5", c: str = "1", verbose: int = 0):
    warning, critical = nagios.thresholds(w, c, 0.5)
    return nagios.render(nagios.Probe(lambda: rep), warning, critical, verbose)


DEAD = Result("daemon", CRITICAL, "daemon-absent", "gpu0", "no daemon serves gpu0",
              "run 'mps-health unit start gpu0'", (("daemon_up", 0.0),))
UNREADABLE = Result("logs", UNKNOWN, "facts-unavailable", "gpu0", "the logs could not be read",
                    "look at the node")
FINE = Result("control", OK, "ok", "gpu1", "answered in 10 ms", "", (("latency_s", 0.01),))


def test_critical_outranks_unknown_as_everywhere_in_mps_health() -> None:
    """nagiosplugin's own Check would say UNKNOWN here (it ranks UNKNOWN above CRITICAL)."""
    rep = report(UNREADABLE, DEAD, FINE)
    text, code = render(rep)
    out = parse(text, code)
    assert (code, out.state) == (2, "CRITICAL")
    assert out.text == ("daemon-absent gpu0: no daemon serves gpu0 -> run 'mps-health unit "
                        "start gpu0'; also facts-unavailable gpu0 ")
    plain = nagiosplugin.Check(nagios.Probe(lambda: rep), nagios.Reported("judged"),
                               nagios.Reported("measured"), nagiosplugin.ScalarContext("latency"))
    plain()
    assert plain.exitcode == 3  # what the subclass is for


def test_summary_names_codes_never_perfdata_labels() -> None:
    slow = Result("control", OK, "ok", "node", "answered in 900 ms", "", (("latency_s", 0.9),))
    text, code = render(report(slow, DEAD))
    out = parse(text, code)
    assert code == 2
    assert out.text.startswith("daemon-absent gpu0: no daemon serves gpu0 -> run 'mps-health "
                               "unit start gpu0'; also control-slow node"), out.text
    text, code = render(report(slow), w="0.8")
    out = parse(text, code)
    assert (code, out.text) == (1, "control-slow node: latency 0.9s outside range 0:0.8 ")
    assert "node_latency" not in out.text and out.perf("node_latency")[1:5] == \
        ("0.9", "s", "0.8", "1")
    text, code = render(report(slow), w="0.2", c="@0.5:60")
    assert (code, parse(text, code).text) == \
        (2, "control-slow node: latency 0.9s outside range @0.5:60 ")


def test_perfdata_is_nagiosplugins_with_plain_numbers() -> None:
    tiny = Result("control", OK, "ok", "node", "fast", "", (("latency_s", 0.00001),))
    odd = Result("canary", OK, "ok", "a.b", "m", "", (("first_context_s", 2.0),
                                                     ("offset_percent", -3.0)))
    warning, critical = nagios.thresholds(None, None, 0.00001)
    text, code = nagios.render(nagios.Probe(lambda: report(tiny, odd)), warning, critical)
    assert code == 0
    perf = text.split(" | ", 1)[1].split()
    assert "node_latency=0.00001s;0.00001;0.00002;0" in perf  # never 1e-05
    assert "'a.b_canary_first_context'=2s;;;0" in perf  # quoted as nagiosplugin quotes
    assert "'a.b_canary_offset_percent'=-3%;;;;100" in perf  # signed: no minimum
    assert perf == sorted(perf)
    assert [str(r) for r in nagios.thresholds(None, None, float("inf"))] == ["", ""]
    assert [str(r) for r in nagios.thresholds("10:", None, 0.5)] == ["10:", ""]


@pytest.mark.parametrize("text", ["1.0e400", "@1.0e400:", "9" * 400, "nan", "1:2:3", "5:1"])
def test_ranges_beyond_a_float_or_malformed_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        nagios.Range(text)


def test_verbose_output_has_actions_and_the_perfdata_last() -> None:
    text, code = render(report(DEAD, FINE), verbose=2)
    out = parse(text, code)
    lines = text.splitlines()
    assert lines[1] == ("CRITICAL daemon-absent gpu0: no daemon serves gpu0 -> run "
                        "'mps-health unit start gpu0'")
    assert "OK control[gpu1]: answered in 10 ms" in lines
    assert lines[-2].startswith("gathered: control 2.0ms")
    assert lines[-1].startswith("| ") and out.perf("gpu0_daemon_up").value == "0"


def test_the_8k_cut_keeps_the_status_line_and_every_perfdata_item() -> None:
    results = [Result("daemon", CRITICAL, "daemon-absent", f"gpu{n}", "x" * 60, "y" * 40,
                      (("daemon_up", 0.0),)) for n in range(400)]
    for verbose in (0, 1):
        text, code = render(report(*results), verbose=verbose)
        out = parse(text, code)  # under 8 KiB, every perfdata item whole
        assert code == 2 and out.text.startswith("daemon-absent gpu0: ")
        assert out.text.rstrip().endswith("also daemon-absent gpu1, daemon-absent gpu2, "
                                          "daemon-absent gpu3, daemon-absent gpu4, "
                                          "daemon-absent gpu5, +394 more")
        items = out.perfdata + out.more_perfdata
        assert 100 < len(items) < 400
        if verbose:
            assert text.splitlines()[-1].startswith("| ")
            assert text.splitlines()[-2].startswith("... ") and "more lines cut" in text


def test_no_results_is_unknown_and_nothing_on_stderr(capfd: pytest.CaptureFixture) -> None:
    text, code = render(report())
    assert code == 3 and text.startswith("MPS UNKNOWN - no check results\n")
    assert capfd.readouterr().err == ""  # nagiosplugin's log line is in the output


def test_two_renders_in_one_process_do_not_pile_up() -> None:
    first, second = render(report(DEAD)), render(report(FINE))
    assert first[0].count("|") == second[0].count("|") == 1
    assert "gpu0_daemon_up" not in second[0]


def test_an_error_with_v_is_one_line_never_a_traceback(monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture,
                                                       tmp_path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("{}\n")

    def broken(self):
        raise RuntimeError("boom\nsecond line")

    monkeypatch.setattr(nagios.Probe, "probe", broken)
    code = check_mps.main(["--config", str(cfg), "-vv", "--only", "control"])
    out = capsys.readouterr()
    assert code == 3 and out.err == ""
    assert out.out.startswith("MPS UNKNOWN - internal error: RuntimeError: boom")
    assert out.out.count("\n") == 1 and "Traceback" not in out.out


def test_without_nagiosplugin_it_is_one_line_saying_what_to_install(tmp_path) -> None:
    code = ("import sys; sys.modules['nagiosplugin'] = None\n"
            "from mps_health.cli.check_mps import main\n"
            f"sys.exit(main(['--config', {str(tmp_path / 'c.yaml')!r}]))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stderr) == (3, "")
    assert r.stdout.startswith("MPS UNKNOWN - check_mps needs the nagiosplugin library (")
    assert r.stdout.endswith("pip install nagiosplugin into mps-health's virtualenv\n")
    assert r.stdout.count("\n") == 1


def test_states_map_to_nagiosplugins() -> None:
    assert {k: int(v) for k, v in nagios.STATES.items()} == \
        {OK: 0, WARNING: 1, CRITICAL: 2, UNKNOWN: 3}


# nagiosplugin's public API: the names its package exports, as its docs describe them.
PUBLIC = {"Check", "Context", "ScalarContext", "CheckError", "Timeout", "Metric",
          "Performance", "Range", "Resource", "Result", "Results", "Runtime", "guarded",
          "Summary", "Ok", "Warn", "Critical", "Unknown"}


def test_only_nagiosplugins_public_api_is_used() -> None:
    """What lets pyproject.toml take any nagiosplugin from 1.4.0: no submodule, no
    underscore name, no attribute of its package outside the exported classes."""
    import ast
    from pathlib import Path

    source = Path(nagios.__file__).read_text()
    tree = ast.parse(source)
    used = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)
            and isinstance(n.value, ast.Name) and n.value.id == "nagiosplugin"}
    assert used and used <= PUBLIC and used <= set(dir(nagiosplugin)), used - PUBLIC
    imports = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    for node in imports:
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
        assert not any(str(n).startswith("nagiosplugin.") for n in names), ast.dump(node)
    assert "._" not in "".join(line for line in source.splitlines() if "nagiosplugin" in line)


def test_what_users_control_is_screened_in_every_line() -> None:
    """A message that did not come through the engine (which escapes it) still cannot forge
    a line, start perfdata or send a terminal code."""
    forged = Result("daemon", CRITICAL, "daemon-absent", "gpu0",
                    "gone\nOK daemon[gpu0]: fine | x=1\x1b[31m\u202e", "act\r\nnow")
    for verbose in (0, 1):
        text, code = render(report(forged, FINE), verbose=verbose)
        out = parse(text, code)
        assert code == 2 and "\x1b" not in text and "\u202e" not in text and "\r" not in text
        assert not any(line.startswith("OK daemon[gpu0]") for line in text.splitlines())
        assert text.count("|") == 1 and "\\x1b[31m\\u202e" in out.text


def test_the_default_ranges_come_from_the_default_latency_warning() -> None:
    """Without -w/-c: 0.5 s (control.warn_latency_s's default) and twice that."""
    from mps_health.config.load import ControlConfig

    default = ControlConfig().warn_latency_s
    assert [str(r) for r in nagios.thresholds(None, None, default)] == ["0.5", "1"]
