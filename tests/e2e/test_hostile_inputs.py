"""Hostile input files, config and snapshot: one line and exit 3, bounded work and memory.

Each command runs in a subprocess whose address space is capped (RLIMIT_AS), so a
regression fails the test with MemoryError instead of eating the machine; deep nesting
would crash libyaml's composer (SIGSEGV), which only a subprocess survives.
"""

import json
import os
import resource
from pathlib import Path
from typing import Any, Callable, Dict

import pytest
from clirun import mps_health
from conftest import REPO

MiB = 1 << 20
BROKEN = REPO / "examples" / "broken-node.json"


def memory_cap(limit: int) -> Callable[[], None]:
    """preexec_fn: the child may map at most ``limit`` bytes."""
    return lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def one_line(r: Any, code: int = 3) -> str:
    """The single stderr line of a run that had to exit ``code`` with nothing on stdout."""
    lines = r.stderr.splitlines()
    assert r.returncode == code and len(lines) == 1 and not r.stdout, \
        (r.returncode, r.stdout[:300], r.stderr[:300])
    assert "internal error" not in lines[0] and "Traceback" not in lines[0]
    assert len(lines[0]) < 400, len(lines[0])
    return lines[0]


def alias_bomb(levels: int) -> str:
    """A config whose mps.gpus stands for 9**levels strings, in a few hundred bytes."""
    anchors = ["&a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for i in range(1, levels):
        anchors.append(f"&a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]")
    return "mps:\n  gpus: [" + ", ".join(anchors) + "]\n"


def check_config(path: Path, cap: int = 512 * MiB) -> Any:
    return mps_health("check", "--config", str(path), preexec_fn=memory_cap(cap), timeout=60)


def test_an_alias_bomb_is_refused_in_one_short_line(tmp_path: Path) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(alias_bomb(9))  # 9**9 = 387 million values
    assert path.stat().st_size < 500
    line = one_line(check_config(path))
    assert line.startswith(f"mps-health: {path}: ") and "more than 100000 values" in line


def test_a_small_alias_expansion_is_fine_and_quoted_short(tmp_path: Path) -> None:
    # Aliases are YAML: an admin may use them. Under the bound they load, and a bad
    # value quoted back stays short however much it stands for.
    path = tmp_path / "c.yaml"
    path.write_text(alias_bomb(4))  # 6561 values: under the bound, but no GPU list
    line = one_line(check_config(path))
    assert "key 'mps.gpus': must be a list of GPU indices" in line


def test_an_alias_that_contains_itself_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("mps:\n  gpus: &a [0, *a]\n")
    line = one_line(check_config(path))
    assert line.startswith(f"mps-health: {path}: ")


@pytest.mark.parametrize("body", [
    "mps: " + "[" * 100000 + "]" * 100000 + "\n",  # flow sequences
    "mps: " + "{a: " * 100000 + "1" + "}" * 100000 + "\n",  # flow mappings
    "- " * 100000 + "x\n",  # block sequences on one line
    "mps:\n" + "".join(" " * (i + 1) + f"k{i}:\n" for i in range(1200)),  # block mappings
], ids=["flow-sequences", "flow-mappings", "block-sequences", "block-mappings"])
def test_deep_nesting_is_one_line_not_a_crash(tmp_path: Path, body: str) -> None:
    path = tmp_path / "deep.yaml"
    path.write_text(body)
    line = one_line(check_config(path))
    assert "nested more than 64 levels deep" in line, line


# Short enough for no event pass; 1020 levels is past libyaml 0.2.6's own limit (PyYAML
# 6.0.4's wheels), which refuses it in the load: the same line either way.
@pytest.mark.parametrize("levels", [900, 1020])
def test_deep_nesting_under_the_yaml_shortcut_is_caught_after_loading(
        tmp_path: Path, levels: int) -> None:
    path = tmp_path / "deep.yaml"
    path.write_text("mps: " + "[" * levels + "]" * levels + "\n")
    assert path.stat().st_size <= 2048
    assert "nested more than 64 levels deep" in one_line(check_config(path))


@pytest.mark.parametrize("data,message", [
    (b"mps:\n  layout: node\n  # caf\xe9\n", "not UTF-8 text (byte 0xe9 on line 3)"),
    (b"budget_s: " + b"9" * 5000 + b"\n", "not valid YAML"),
    (b"a: !" + b"x" * 100000 + b" 1\n", "not valid YAML: could not determine a constructor"),
    (b"#" * (2 * MiB), "larger than 1 MiB"),
], ids=["non-utf8", "huge-integer", "huge-tag", "too-big"])
def test_bad_config_files_name_the_file(tmp_path: Path, data: bytes, message: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_bytes(data)
    line = one_line(check_config(path))
    assert line.startswith(f"mps-health: {path}: ") and message in line, line


def test_a_config_that_is_no_regular_file_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    assert "not a regular file" in one_line(check_config(fifo))
    assert "not a regular file" in one_line(check_config(tmp_path))


def test_a_symlinked_config_is_followed(tmp_path: Path) -> None:
    # The config path is the admin's choice (the default file, --config, the lines
    # slurm.conf runs): a link there is theirs, e.g. to a config management checkout.
    real = tmp_path / "real.yaml"
    real.write_text("budget_s: 0\n")
    link = tmp_path / "link.yaml"
    link.symlink_to(real)
    assert "key 'budget_s': must be a number" in one_line(check_config(link))


# --- snapshots ----------------------------------------------------------------------------

def many_instances(n: int, max_instances: int) -> Dict[str, Any]:
    """The shipped broken node's snapshot with ``n`` per-job instances, none running."""
    data = json.loads(BROKEN.read_text())
    data["config"] = {"mps": {"layout": "per-job", "max_instances": max_instances}}
    data["instances"] = [
        {"name": f"job{i}", "layout": "per-job", "job_id": str(i), "gpu": None,
         "pipe_dir": f"/tmp/nvidia-mps_job{i}", "log_dir": f"/tmp/nvidia-log_job{i}"}
        for i in range(n)]
    data["sources"]["control"] = {}
    data["sources"]["dirs"] = {}
    return data


def replay(path: Path, *args: str, cap: int = 512 * MiB) -> Any:
    return mps_health("check", "--replay", str(path), *args, preexec_fn=memory_cap(cap),
                      timeout=300)


def test_replay_judges_at_most_max_instances_and_says_so(tmp_path: Path) -> None:
    path = tmp_path / "snap.json"
    path.write_text(json.dumps(many_instances(2000, 100)))
    r = replay(path)
    assert r.returncode == 1, r.stderr
    judged = [line for line in r.stdout.splitlines() if "daemon-absent" in line]
    assert len(judged) == 100 + 1  # the summary line names them too
    assert "1900 more per-job instances than mps.max_instances (100) were not judged" \
        in r.stdout


def test_clients_replay_lists_at_most_max_instances(tmp_path: Path) -> None:
    path = tmp_path / "snap.json"
    path.write_text(json.dumps(many_instances(2000, 100)))
    r = mps_health("clients", "--replay", str(path), preexec_fn=memory_cap(512 * MiB),
                   timeout=300)
    listed = [line for line in r.stdout.splitlines() if line.startswith("instance job")]
    assert len(listed) == 100, r.stdout[-500:] + r.stderr[-500:]


@pytest.mark.parametrize("fmt", ["json", "text"])
def test_many_instances_stream_out_in_bounded_memory(tmp_path: Path, fmt: str) -> None:
    # 20000 judged instances, 80000 results (40000 problems: each instance's missing
    # dirs are folded under its absent daemon): building the JSON document and its text
    # in memory took over 400 MB; written as it is made it fits in far less.
    path = tmp_path / "snap.json"
    path.write_text(json.dumps(many_instances(20000, 100000)))
    # --budget: judging 20000 instances may take longer than the default run limit
    # (budget_s + 2 s) on a loaded machine; that limit is not what is tested here.
    r = replay(path, "--format", fmt, "--budget", "300", cap=384 * MiB)
    assert r.returncode == 1, r.stderr[-500:]
    if fmt == "json":
        report = json.loads(r.stdout)
        assert len(report["problems"]) == 40000
        assert r.stdout == json.dumps(report, indent=2) + "\n"  # the layout it always had
    else:
        assert r.stdout.startswith("MPS WARNING - 40000 problems: daemon-absent job0, ")
        assert len(r.stdout.splitlines()) == 40001


def test_a_snapshot_is_never_read_through_a_link_or_from_a_fifo(tmp_path: Path) -> None:
    link = tmp_path / "link.json"
    link.symlink_to(BROKEN)
    assert "is a symbolic link, which is not followed" in one_line(replay(link))
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    assert "not a regular file" in one_line(replay(fifo))
    assert "not a regular file" in one_line(replay(tmp_path))


def test_an_oversized_snapshot_is_refused_unread(tmp_path: Path) -> None:
    path = tmp_path / "big.json"
    with open(path, "wb") as f:
        f.truncate(300 * MiB)  # sparse: costs no disk
    assert "larger than 256 MiB" in one_line(replay(path, cap=256 * MiB))


@pytest.mark.parametrize("content,message", [
    (b'{"format": "mps-health-snapshot", "x": "caf\xe9"}', "not UTF-8 text (byte 0xe9 on line 1)"),
    (b"[" * 100000 + b"]" * 100000, "nested too deeply"),
    (b'{"format": "mps-health-snapshot", "format_version": [' + b'"v", ' * 100000 + b'"v"]}',
     "is not supported"),
    (b'{"format": "mps-health-snapshot", "format_version": 1, "node": "n", "taken_at": 1,'
     b' "sources": {"dirs": {"' + b"x" * 100000 + b'": 5}}}', "sources.dirs."),
    (b'{"format": "mps-health-snapshot", "format_version": 1, "node": "n", "taken_at": 1,'
     b' "config": {"mps": ' + b"[" * 500 + b"]" * 500 + b"}}", "its config nested more than"),
], ids=["non-utf8", "deep", "huge-version", "huge-key", "deep-config"])
def test_bad_snapshots_are_one_short_line(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    line = one_line(replay(path))
    assert line.startswith(f"mps-health: {path}: ") and message in line, line
