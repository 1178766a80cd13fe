"""mps_health.hostio.safedirs: dirs in a shared sticky parent; symlink, foreign-owner and race
attacks do not work. Through the Prolog's make_job_dir/remove_job_dir and directly.

Runs as root (chown to another user), as the prolog does. The "attacker" is the test
user; the "victim" a root-owned dir elsewhere that a followed symlink would expose.
"""

import os
import stat
from pathlib import Path

import pytest
from mps_health.hostio.safedirs import UnsafePath, ensure_dir, open_dir, owned_dir
from mps_health.slurm.lifecycle import make_job_dir as make_dir
from mps_health.slurm.lifecycle import remove_job_dir as remove_dir
from slurmcluster import ensure_user

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (chown, as the prolog)")


@pytest.fixture
def parent(tmp_path: Path) -> Path:
    p = tmp_path / "tmp"
    p.mkdir()
    p.chmod(0o1777)  # like /tmp
    return p


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    v = tmp_path / "victim"
    v.mkdir()
    v.chmod(0o700)
    (v / "secret").write_text("root's")
    return v


@pytest.fixture(scope="module")
def user():
    return ensure_user()


def make_job_dir(parent: str, name: str, uid: int, gid: int, mode: int, notes: list) -> str:
    """The Prolog's call, as "created"/"reused" and its note."""
    existed = os.path.isdir(os.path.join(parent, name)) and \
        not os.path.islink(os.path.join(parent, name))
    note = make_dir(os.path.join(parent, name), uid, gid, mode)
    if note:
        notes.append(note)
    return "reused" if existed and not note else "created"


def remove_job_dir(path: str, owners) -> object:
    return remove_dir(path, tuple(owners)) or None


def mode_owner(path: Path):
    st = os.lstat(path)
    return stat.S_IMODE(st.st_mode), st.st_uid, stat.S_IFMT(st.st_mode)


def test_creates_a_dir_owned_by_the_job_user(parent: Path, user) -> None:
    notes: list = []
    assert make_job_dir(str(parent), "nvidia-mps_job7", user.pw_uid, user.pw_gid, 0o700,
                        notes) == "created"
    assert mode_owner(parent / "nvidia-mps_job7") == (0o700, user.pw_uid, stat.S_IFDIR)
    assert notes == []
    assert owned_dir(str(parent / "nvidia-mps_job7"), user.pw_uid)
    assert not owned_dir(str(parent / "nvidia-mps_job7"), 0)


def test_planted_symlink_is_moved_aside_and_never_followed(parent: Path, victim: Path,
                                                           user) -> None:
    os.symlink(victim, parent / "nvidia-mps_job7")
    os.lchown(parent / "nvidia-mps_job7", user.pw_uid, user.pw_gid)
    notes: list = []
    make_job_dir(str(parent), "nvidia-mps_job7", user.pw_uid, user.pw_gid, 0o700, notes)
    assert mode_owner(victim) == (0o700, 0, stat.S_IFDIR)  # not chowned, not chmodded
    assert mode_owner(parent / "nvidia-mps_job7") == (0o700, user.pw_uid, stat.S_IFDIR)
    [aside] = [p for p in parent.iterdir() if p.name.startswith("nvidia-mps_job7.aside-")]
    assert aside.is_symlink() and os.readlink(aside) == str(victim)
    assert len(notes) == 1 and "was a symlink owned by uid" in notes[0] and aside.name in notes[0]


def test_another_users_dir_is_moved_aside(parent: Path, user) -> None:
    planted = parent / "nvidia-mps_job8"
    planted.mkdir(mode=0o777)
    (planted / "control").write_text("a trap")
    os.chown(planted, user.pw_uid + 1, user.pw_gid)
    notes: list = []
    assert make_job_dir(str(parent), "nvidia-mps_job8", user.pw_uid, user.pw_gid, 0o700,
                        notes) == "created"
    assert os.listdir(parent / "nvidia-mps_job8") == []  # a fresh dir, not the planted one
    assert "was a dir owned by uid" in notes[0]


def test_a_file_at_the_name_is_moved_aside(parent: Path, user) -> None:
    (parent / "nvidia-log_job9").write_text("x")
    notes: list = []
    make_job_dir(str(parent), "nvidia-log_job9", user.pw_uid, user.pw_gid, 0o700, notes)
    assert (parent / "nvidia-log_job9").is_dir() and "was a file" in notes[0]


def test_the_users_own_dir_is_reused_and_fixed(parent: Path, user) -> None:
    mine = parent / "nvidia-mps_job10"
    mine.mkdir(mode=0o755)
    os.chown(mine, user.pw_uid, user.pw_gid)
    notes: list = []
    assert make_job_dir(str(parent), "nvidia-mps_job10", user.pw_uid, user.pw_gid, 0o700,
                        notes) == "reused"
    assert mode_owner(mine) == (0o700, user.pw_uid, stat.S_IFDIR) and notes == []


def test_a_users_symlinked_parent_is_refused(tmp_path: Path, parent: Path, user) -> None:
    link = tmp_path / "link-to-tmp"
    link.symlink_to(parent)
    os.lchown(link, user.pw_uid, user.pw_gid)
    with pytest.raises(UnsafePath, match=r"a symlink owned by uid .*refusing to follow it"):
        make_job_dir(str(link), "nvidia-mps_job11", user.pw_uid, user.pw_gid, 0o700, [])
    assert os.listdir(parent) == []


def test_parent_writable_by_all_without_sticky_bit_is_refused(parent: Path, user) -> None:
    parent.chmod(0o777)
    with pytest.raises(UnsafePath, match="writable by others without the sticky bit"):
        make_job_dir(str(parent), "nvidia-mps_job12", user.pw_uid, user.pw_gid, 0o700, [])


def test_parent_owned_by_another_user_is_refused(parent: Path, user) -> None:
    os.chown(parent, user.pw_uid, user.pw_gid)
    with pytest.raises(UnsafePath, match=f"is owned by uid {user.pw_uid}"):
        open_dir(str(parent))


def test_names_that_leave_the_parent_are_refused(parent: Path, user) -> None:
    for bad in ("../escape", ".."):
        with pytest.raises(UnsafePath):
            make_job_dir(str(parent), bad, user.pw_uid, user.pw_gid, 0o700, [])
    fd = open_dir(str(parent))
    try:
        for bad in ("../escape", "", "..", "a/b"):
            with pytest.raises(UnsafePath):
                ensure_dir(fd, bad, 0o700, user.pw_uid, user.pw_gid, lambda e: True)
    finally:
        os.close(fd)


def test_remove_follows_no_symlink_inside(parent: Path, victim: Path, user) -> None:
    job = parent / "nvidia-mps_job13"
    make_job_dir(str(parent), job.name, user.pw_uid, user.pw_gid, 0o700, [])
    (job / "link").symlink_to(victim)
    (job / "sub").mkdir()
    (job / "sub" / "deeper-link").symlink_to(victim / "secret")
    (job / "control_lock").write_text("")
    assert remove_job_dir(str(job), (user.pw_uid, 0)) is None
    assert not job.exists()
    assert (victim / "secret").read_text() == "root's"


def test_remove_of_a_swapped_in_symlink_unlinks_only_the_link(parent: Path, victim: Path,
                                                               user) -> None:
    job = parent / "nvidia-mps_job14"
    job.symlink_to(victim)  # the user swapped the dir for a link during the job
    os.lchown(job, user.pw_uid, user.pw_gid)
    assert remove_job_dir(str(job), (user.pw_uid, 0)) is None
    assert not os.path.lexists(job) and (victim / "secret").exists()


def test_remove_leaves_another_users_dir_alone(parent: Path, user) -> None:
    other = parent / "nvidia-mps_job15"
    other.mkdir()
    os.chown(other, user.pw_uid + 1, user.pw_gid)
    problem = remove_job_dir(str(other), (user.pw_uid, 0))
    assert problem is not None and f"is owned by uid {user.pw_uid + 1}" in problem
    assert "left alone" in problem
    assert other.is_dir()


def test_remove_of_nothing_is_fine(parent: Path, user) -> None:
    assert remove_job_dir(str(parent / "nvidia-mps_job16"), (user.pw_uid, 0)) is None


# --- races and planted aside names (the attacker runs as the unprivileged test user) ------
# The racer's python, run as the attacker: the system's, as the test's own may live where
# that user cannot read it (a pyenv under /root), and the racer needs only the stdlib.
RACER_PYTHON = "/usr/bin/python3"
RACER = """
import os, sys, time
parent, name, victim, seconds = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
path = os.path.join(parent, name)
end = time.monotonic() + seconds
print("racing", flush=True)
while time.monotonic() < end:
    for act in (lambda: os.mkdir(path), lambda: os.rmdir(path),
                lambda: os.symlink(victim, path), lambda: os.unlink(path)):
        try:
            act()
        except OSError:
            pass
"""


def test_a_racing_user_never_makes_the_prolog_give_up(parent: Path, victim: Path,
                                                      user) -> None:
    import subprocess

    job_uid = user.pw_uid + 1  # the job's user; the attacker is another user
    racer = subprocess.Popen(
        ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups",
         RACER_PYTHON, "-c", RACER, str(parent), "nvidia-mps_job20", str(victim), "20"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert racer.stdout is not None and racer.stdout.readline() == "racing\n"
        for _ in range(200):
            notes: list = []
            make_job_dir(str(parent), "nvidia-mps_job20", job_uid, job_uid, 0o700, notes)
            # In the sticky parent the racer cannot touch the dir once it is in place.
            assert mode_owner(parent / "nvidia-mps_job20") == (0o700, job_uid, stat.S_IFDIR)
            assert remove_job_dir(str(parent / "nvidia-mps_job20"), (job_uid, 0)) is None
    finally:
        racer.kill()
        racer.wait()
    assert mode_owner(victim) == (0o700, 0, stat.S_IFDIR)
    assert (victim / "secret").read_text() == "root's"


def test_what_is_in_the_way_is_swapped_out_whole(parent: Path, user) -> None:
    planted = parent / "nvidia-mps_job21"
    planted.mkdir()
    (planted / "control").write_text("a trap")
    os.chown(planted, user.pw_uid, user.pw_gid)
    notes: list = []
    make_job_dir(str(parent), planted.name, 0, 0, 0o700, notes)
    [aside] = [p for p in parent.iterdir() if p.name.startswith("nvidia-mps_job21.aside-")]
    assert (aside / "control").read_text() == "a trap" and os.listdir(planted) == []
    assert not [p for p in parent.iterdir() if ".new-" in p.name]  # no temp name left


def test_an_aside_name_taken_in_advance_is_neither_followed_nor_replaced(
        parent: Path, victim: Path, user, monkeypatch) -> None:
    from mps_health.hostio import safedirs

    names = iter(["nvidia-mps_job22.aside-taken"])
    real = safedirs.random_name
    monkeypatch.setattr(safedirs, "random_name",
                        lambda name, what: next(names, None) or real(name, what)
                        if what == "aside" else real(name, what))
    (parent / "nvidia-mps_job22.aside-taken").symlink_to(victim)
    (parent / "nvidia-mps_job22").write_text("in the way")
    notes: list = []
    make_job_dir(str(parent), "nvidia-mps_job22", user.pw_uid, user.pw_gid, 0o700, notes)
    assert os.readlink(parent / "nvidia-mps_job22.aside-taken") == str(victim)
    assert mode_owner(victim) == (0o700, 0, stat.S_IFDIR)
    [aside] = [p for p in parent.iterdir() if p.name.startswith("nvidia-mps_job22.aside-2")]
    assert aside.read_text() == "in the way"


def test_aside_names_cannot_be_guessed(parent: Path) -> None:
    from mps_health.hostio.safedirs import random_name

    a, b = random_name("x", "aside"), random_name("x", "aside")
    assert a != b and len(a.rsplit("-", 1)[1]) == 16


def test_without_renameat2_the_same_rules_hold(parent: Path, victim: Path, user,
                                               monkeypatch) -> None:
    from mps_health.hostio import safedirs

    def unsupported(*args) -> None:
        raise NotImplementedError("EINVAL")

    monkeypatch.setattr(safedirs, "rename2", unsupported)
    os.symlink(victim, parent / "nvidia-mps_job23")
    notes: list = []
    assert make_job_dir(str(parent), "nvidia-mps_job23", user.pw_uid, user.pw_gid, 0o700,
                        notes) == "created"
    assert mode_owner(parent / "nvidia-mps_job23") == (0o700, user.pw_uid, stat.S_IFDIR)
    assert mode_owner(victim) == (0o700, 0, stat.S_IFDIR) and "was a symlink" in notes[0]


# --- removing whatever is inside (remove_tree: Epilog and remediate orphans) -------------
def nest(top: Path, depth: int, uid: int) -> Path:
    """``depth`` dirs one inside the other under ``top``, all the user's; the deepest."""
    p = top
    for i in range(depth):
        p = p / f"d{i}"
    p.mkdir(parents=True)
    for q in [top, *[top.joinpath(*[f"d{j}" for j in range(i + 1)]) for i in range(depth)]]:
        os.chown(q, uid, uid)
    return p


def test_remove_takes_nested_dirs_of_the_user(parent: Path, user) -> None:
    job = parent / "nvidia-mps_job30"
    make_job_dir(str(parent), job.name, user.pw_uid, user.pw_gid, 0o700, [])
    deep = nest(job, 5, user.pw_uid)
    (deep / "file").write_text("x")
    (job / "d0" / "ro").mkdir(mode=0o500)  # a dir its user made unwritable
    (job / "d0" / "ro2").mkdir()
    (job / "d0" / "ro2" / "f").write_text("y")
    (job / "d0" / "ro2").chmod(0)
    assert remove_job_dir(str(job), (user.pw_uid, 0)) is None
    assert not os.path.lexists(job)


def test_remove_never_follows_links_inside_nested_dirs(parent: Path, victim: Path,
                                                       user) -> None:
    job = parent / "nvidia-mps_job31"
    make_job_dir(str(parent), job.name, user.pw_uid, user.pw_gid, 0o700, [])
    deep = nest(job, 4, user.pw_uid)
    (deep / "to-dir").symlink_to(victim)  # a link to a dir outside: unlinked, not entered
    (deep / "to-file").symlink_to(victim / "secret")
    (job / "top-link").symlink_to(victim)
    (job / "hard").mkdir()
    os.link(victim / "secret", job / "hard" / "secret-again")  # one more name, same file
    assert remove_job_dir(str(job), (user.pw_uid, 0)) is None
    assert not os.path.lexists(job)
    assert (victim / "secret").read_text() == "root's"
    assert mode_owner(victim) == (0o700, 0, stat.S_IFDIR)
    assert os.stat(victim / "secret").st_nlink == 1


def test_remove_takes_fifos_and_sockets(parent: Path, user) -> None:
    import socket

    job = parent / "nvidia-mps_job32"
    make_job_dir(str(parent), job.name, user.pw_uid, user.pw_gid, 0o700, [])
    (job / "sub").mkdir()
    os.mkfifo(job / "sub" / "fifo")  # opening it would block: it is only unlinked
    os.mkfifo(job / "control")
    s = socket.socket(socket.AF_UNIX)
    try:
        s.bind(str(job / "sub" / "control"))
        assert remove_job_dir(str(job), (user.pw_uid, 0)) is None
    finally:
        s.close()
    assert not os.path.lexists(job)


def test_too_deep_is_one_line_with_a_command_that_works(parent: Path, user) -> None:
    import subprocess

    from mps_health.hostio.safedirs import MAX_DEPTH

    job = parent / "nvidia-mps_job33"
    make_job_dir(str(parent), job.name, user.pw_uid, user.pw_gid, 0o700, [])
    nest(job, MAX_DEPTH + 5, user.pw_uid)
    problem = remove_job_dir(str(job), (user.pw_uid, 0))
    assert isinstance(problem, str) and "\n" not in problem and problem.count("cannot") == 1
    assert f"nested more than {MAX_DEPTH} deep" in problem
    command = f"rm -rf --one-file-system -- {job}"
    assert f"'{command}'" in problem
    # Left root's 0700: its user can add nothing more while it waits for the admin.
    assert mode_owner(job) == (0o700, 0, stat.S_IFDIR)
    subprocess.run(command.split(), check=True, timeout=60)
    assert not os.path.lexists(job)


def test_within_the_depth_bound_everything_goes(parent: Path, user) -> None:
    from mps_health.hostio.safedirs import MAX_DEPTH

    job = parent / "nvidia-mps_job34"
    make_job_dir(str(parent), job.name, user.pw_uid, user.pw_gid, 0o700, [])
    nest(job, MAX_DEPTH - 1, user.pw_uid)  # the top and 31 below: 32 open dirs at most
    assert remove_job_dir(str(job), (user.pw_uid, 0)) is None


def test_too_many_entries_is_one_line(parent: Path, user, monkeypatch) -> None:
    from mps_health.hostio import safedirs

    monkeypatch.setattr(safedirs, "MAX_ENTRIES", 50)
    job = parent / "nvidia-mps_job35"
    make_job_dir(str(parent), job.name, user.pw_uid, user.pw_gid, 0o700, [])
    (job / "many").mkdir()
    for i in range(60):
        (job / "many" / f"f{i}").write_text("")
    problem = remove_job_dir(str(job), (user.pw_uid, 0))
    assert isinstance(problem, str) and "more than 50 entries" in problem
    assert problem.count("rm -rf") == 1
    assert len(os.listdir(job / "many")) == 60 - 49  # the budget was spent, not exceeded
    monkeypatch.setattr(safedirs, "MAX_ENTRIES", 100000)
    assert remove_job_dir(str(job), (user.pw_uid, 0)) is None


def test_names_inside_are_escaped_in_the_line(parent: Path, user) -> None:
    from mps_health.hostio.safedirs import MAX_DEPTH

    job = parent / "nvidia-mps_job36"
    make_job_dir(str(parent), job.name, user.pw_uid, user.pw_gid, 0o700, [])
    deep = nest(job, MAX_DEPTH - 1, user.pw_uid)
    (deep / "x\nOK all good\x1b[2J").mkdir()
    problem = remove_job_dir(str(job), (user.pw_uid, 0))
    assert isinstance(problem, str) and "\n" not in problem and "\x1b" not in problem
# --- keep_files: a daemon's logs are its own ---------------------------------------------

LOGS = ("control.log", "server.log")


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    d = tmp_path / "log"
    d.mkdir()
    d.chmod(0o755)
    return d


def test_keep_files_leaves_the_daemons_own_logs_and_missing_ones(log_dir: Path) -> None:
    from mps_health.hostio.safedirs import keep_files

    (log_dir / "control.log").write_text("[x] ours\n")
    assert keep_files(str(log_dir), (0,), LOGS) == []
    assert (log_dir / "control.log").read_text() == "[x] ours\n"
    assert sorted(p.name for p in log_dir.iterdir()) == ["control.log"]


def test_keep_files_unlinks_a_link_and_never_touches_its_target(log_dir: Path,
                                                                victim: Path, user) -> None:
    from mps_health.hostio.safedirs import keep_files

    (log_dir / "control.log").symlink_to(victim / "secret")
    os.lchown(log_dir / "control.log", user.pw_uid, user.pw_gid)
    (log_dir / "server.log").symlink_to(victim)  # a link owned by root is no log either
    done = keep_files(str(log_dir), (0,), LOGS)
    assert done == [f"{log_dir}/control.log was a symlink owned by uid {user.pw_uid}, not the "
                    "daemon's log: removed the link (its target untouched)",
                    f"{log_dir}/server.log was a symlink owned by uid 0, not the daemon's "
                    "log: removed the link (its target untouched)"]
    assert list(log_dir.iterdir()) == []
    assert (victim / "secret").read_text() == "root's" and victim.is_dir()


@pytest.mark.parametrize("kind", ["fifo", "dir", "foreign file", "hard link"])
def test_keep_files_moves_anything_else_aside_unopened(log_dir: Path, victim: Path, user,
                                                       kind: str) -> None:
    from mps_health.hostio.safedirs import keep_files

    path = log_dir / "control.log"
    if kind == "fifo":
        os.mkfifo(path)  # opening it would block the daemon (and us)
    elif kind == "dir":
        path.mkdir()
        (path / "inside").write_text("kept")
    elif kind == "foreign file":
        path.write_text("[x] fatal: forged\n")
        os.chown(path, user.pw_uid, user.pw_gid)
    else:
        os.link(victim / "secret", path)  # root's file: the daemon would append to it
    before = os.lstat(path)
    done = keep_files(str(log_dir), (0,), LOGS)
    assert len(done) == 1 and done[0].startswith(f"{log_dir}/control.log was a ")
    assert "moved aside to" in done[0]
    assert not path.exists()
    (aside,) = log_dir.iterdir()
    assert aside.name.startswith(".control.log.foreign-") and done[0].endswith(str(aside))
    st = os.lstat(aside)
    assert (st.st_ino, st.st_uid, stat.S_IFMT(st.st_mode)) == (
        before.st_ino, before.st_uid, stat.S_IFMT(before.st_mode))
    assert (victim / "secret").read_text() == "root's"


def test_keep_files_never_follows_a_linked_log_dir(tmp_path: Path, victim: Path) -> None:
    from mps_health.hostio.safedirs import keep_files

    (victim / "control.log").symlink_to(victim / "secret")
    (tmp_path / "log").symlink_to(victim)
    with pytest.raises(OSError):
        keep_files(str(tmp_path / "log"), (0,), LOGS)
    assert (victim / "control.log").is_symlink()
