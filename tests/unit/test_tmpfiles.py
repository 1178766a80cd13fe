"""tmpfiles: parsing as systemd does, /etc > /run > /usr/lib, and the guard verdict."""

import os
from pathlib import Path

import pytest
from conftest import FIXTURES
from hypothesis import given, settings
from hypothesis import strategies as st
from mps_health.checks import tmpfiles as guard
from mps_health.config.load import from_mapping
from mps_health.model.facts import Facts, Instance
from mps_health.model.results import OK, WARNING
from mps_health.probes import tmpfiles
from mps_health.probes.context import Context


def rules_of(text: str):
    rules, errors = tmpfiles.parse_tmpfiles(text, "/etc/tmpfiles.d/t.conf")
    assert errors == []
    return tuple(rules)


def test_parse_real_debian_and_rhel_tmp_conf() -> None:
    debian = rules_of((FIXTURES / "tmpfiles_tmp.conf__debian-12.conf").read_text())
    assert [(r.type, r.path, r.age) for r in debian] == [("D", "/tmp", "-")]
    rhel = rules_of((FIXTURES / "tmpfiles_tmp.conf__rhel-9.conf").read_text())
    assert [(r.type, r.path, r.age) for r in rhel] == [("q", "/tmp", "10d"),
                                                       ("q", "/var/tmp", "30d")]


def test_parse_quotes_modifiers_and_errors() -> None:
    rules = rules_of('D! "/tmp/with space" 1777 root root 1d\nx /tmp/nvidia-mps*\n')
    assert rules[0].type == "D" and rules[0].path == "/tmp/with space" and rules[0].age == "1d"
    assert rules[1].age == "-"
    _, errors = tmpfiles.parse_tmpfiles('x "/tmp/open\nx\n', "f.conf")
    assert errors == ["f.conf:1: unterminated quote", "f.conf:2: a type and a path are needed"]


def test_etc_masks_usr_lib_and_order_is_by_name() -> None:
    files = tmpfiles.effective_files({
        "/usr/lib/tmpfiles.d": ["tmp.conf", "a.conf"],
        "/etc/tmpfiles.d": ["tmp.conf"],
        "/run/tmpfiles.d": ["b.conf", "a.conf"],
    })
    assert files == ["/run/tmpfiles.d/a.conf", "/run/tmpfiles.d/b.conf", "/etc/tmpfiles.d/tmp.conf"]


RHEL = "q /tmp 1777 root root 10d\n"


@pytest.mark.parametrize("guard_text,path,protected", [
    ("", "/tmp/nvidia-mps", False),
    ("x /tmp/nvidia-mps\n", "/tmp/nvidia-mps", True),
    ("x /tmp/nvidia-mps\nx /tmp/nvidia-mps/*\n", "/tmp/nvidia-mps", True),  # the guard sites write by hand
    ("X /tmp/nvidia-mps\n", "/tmp/nvidia-mps", False),  # X spares the dir, not its sockets
    ("X /tmp/nvidia-mps\nx /tmp/nvidia-mps/*\n", "/tmp/nvidia-mps", True),
    ("x /tmp/nvidia-mps_*\n", "/tmp/nvidia-mps_3", True),
    ("x /tmp/nvidia-mps_*\n", "/tmp/nvidia-mps", False),
    ("x /tmp/*/nvidia-mps\n", "/tmp/a/b/nvidia-mps", False),  # '*' never crosses '/'
    ("x /tmp/mps\n", "/tmp/mps/job1", True),  # a guarded parent guards what is inside
])
def test_guard_verdict(guard_text: str, path: str, protected: bool) -> None:
    rules = rules_of(RHEL + guard_text)
    assert guard.aging_rule(rules, path) is not None
    assert guard.guarded(rules, path) is protected


def test_debian_tmp_is_not_aged() -> None:
    rules = rules_of((FIXTURES / "tmpfiles_tmp.conf__debian-12.conf").read_text())
    assert guard.aging_rule(rules, "/tmp/nvidia-mps") is None


def _judge(root: Path, mapping: dict, instances) -> list:
    cfg = from_mapping(mapping, None)
    value = tmpfiles.gather(Context(cfg, str(root)))
    facts = Facts("n", 0.0, str(root), tuple(instances), {"tmpfiles": value}, {}, {})
    return list(guard.check(facts, cfg))


def test_check_over_a_root_tree(tmp_path: Path) -> None:
    usr = tmp_path / "usr/lib/tmpfiles.d"
    usr.mkdir(parents=True)
    (usr / "tmp.conf").write_text(RHEL)
    inst = Instance("node", "node", "/tmp/nvidia-mps", "/var/log/nvidia-mps")
    [r] = _judge(tmp_path, {}, [inst])
    assert (r.state, r.code) == (WARNING, "tmpfiles-unguarded")
    assert "/usr/lib/tmpfiles.d/tmp.conf:1 ages /tmp after 10d" in r.message
    etc = tmp_path / "etc/tmpfiles.d"
    etc.mkdir(parents=True)
    (etc / "nvidia-mps.conf").write_text("x /tmp/nvidia-mps\nx /tmp/nvidia-mps/*\n")
    [r] = _judge(tmp_path, {}, [inst])
    assert r.state == OK
    # /etc masking /usr/lib's tmp.conf with an empty file removes the aging.
    (etc / "nvidia-mps.conf").unlink()
    (etc / "tmp.conf").write_text("# masked\n")
    [r] = _judge(tmp_path, {}, [inst])
    assert r.state == OK and "not under an aged path" in r.message


def test_per_job_template_is_judged_too(tmp_path: Path) -> None:
    usr = tmp_path / "usr/lib/tmpfiles.d"
    usr.mkdir(parents=True)
    (usr / "tmp.conf").write_text(RHEL)
    results = _judge(tmp_path, {"mps": {"layout": "per-job"}}, [])
    assert [(r.instance, r.code) for r in results] == [("per-job", "tmpfiles-unguarded")]


def test_no_systemd_is_not_a_failure(tmp_path: Path) -> None:
    inst = Instance("node", "node", "/tmp/nvidia-mps", "/var/log/nvidia-mps")
    [r] = _judge(tmp_path, {}, [inst])
    assert r.state == OK and "does not clean" in r.message


PATTERN_PARTS = ["tmp", "nvidia-mps", "nvidia-*", "*", "?mp", "[a-n]vidia-mps", "[!a]*",
                 "systemd-private-*", "n*s", "[", "x[y", "control", ""]
PATH_PARTS = ["tmp", "nvidia-mps", "nvidia-mps-0", "control", "tap", "x[y", "systemd-private-a"]


@pytest.mark.parametrize("pattern", ["/" + "/".join(p) for p in
                                     [(a,) for a in PATTERN_PARTS]
                                     + [(a, b) for a in PATTERN_PARTS[:7] for b in PATTERN_PARTS]])
def test_glob_shortcut_matches_as_fnmatch_does(pattern: str) -> None:
    """The literal-prefix shortcut never changes a verdict of plain fnmatch per component."""
    from fnmatch import fnmatchcase

    for path in ["/" + a for a in PATH_PARTS] + ["/" + a + "/" + b for a in PATH_PARTS
                                                 for b in PATH_PARTS]:
        pat_parts, path_parts = pattern.rstrip("/").split("/"), path.split("/")
        want = len(pat_parts) == len(path_parts) and all(
            fnmatchcase(n, p) for n, p in zip(path_parts, pat_parts))
        if not any(c in pattern for c in "*?["):
            want = pattern.rstrip("/") == path
        assert guard._matcher((path,))(pattern) == want, (pattern, path)



@settings(max_examples=500, deadline=None)
@given(st.text(alphabet=st.sampled_from(list(" \t\x0b\x0c\x1c\x85\xa0\u2003ab/-%*\\!~0é")),
               max_size=40))
def test_a_line_without_quotes_splits_as_the_quote_aware_splitter_does(line) -> None:
    """Lines without quotes take str.split: the same fields, for any whitespace."""
    assert tmpfiles.split_line(line) == line.split() == tmpfiles._split_quoted(line)


@pytest.mark.parametrize("paths", [("/",), ("/tmp",), ("/tmp", "/tmp/nvidia-mps"),
                                   ("/tmp/nvidia-mps/control",), ("/x[y", "/tmp/")])
def test_matching_against_a_set_of_paths_is_matching_each(paths) -> None:
    patterns = ["/"] + ["/" + "/".join(p) + tail for tail in ("", "/")
                        for p in [(a,) for a in PATTERN_PARTS]
                        + [(a, b) for a in PATTERN_PARTS[:7] for b in PATTERN_PARTS]]
    many = guard._matcher(paths)
    for pattern in patterns:
        assert many(pattern) == any(guard._matcher((p,))(pattern) for p in paths), \
            (pattern, paths)


def test_every_run_reads_the_rules_on_disk_and_writes_nothing(tmp_path: Path,
                                                              monkeypatch) -> None:
    """No parsed form is kept between runs: a file edited in place (same size) or added
    is what the next run judges, and the run dir stays empty."""
    etc, usr, run = tmp_path / "etc.d", tmp_path / "usr.d", tmp_path / "run"
    for d in (etc, usr, run):
        d.mkdir()
    (usr / "tmp.conf").write_text(RHEL)
    monkeypatch.setattr(tmpfiles, "SEARCH_DIRS", (str(etc), str(tmp_path / "none.d"), str(usr)))
    ctx = Context(from_mapping({"run_dir": str(run)}, None))
    first = tmpfiles.gather(ctx)
    assert first.rules
    (usr / "tmp.conf").write_text(RHEL.replace("10d", "11d"))
    edited = tmpfiles.gather(ctx)
    assert edited != first and "11d" in [r.age for r in edited.rules]
    (etc / "nvidia-mps.conf").write_text("x /tmp/nvidia-mps\n")
    assert "/tmp/nvidia-mps" in [r.path for r in tmpfiles.gather(ctx).rules]
    assert os.listdir(run) == []
