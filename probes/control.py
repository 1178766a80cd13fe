"""Ask each instance's control daemon one question through the real client.

``echo get_default_active_thread_percentage | nvidia-cuda-mps-control`` with the
instance's CUDA_MPS_PIPE_DIRECTORY. The client exits 1 only when it cannot reach a
daemon; other errors exit 0 and are read from stdout. A stopped daemon makes the client
hang forever, so every query has a deadline and is killed with its process group; a lock
file makes our queries to one pipe dir take turns across processes. Within a run,
``Queries`` (``ctx.queries``) asks a daemon that gave one query no answer nothing more,
so a wedged daemon costs one timeout, whatever the command.
"""

from __future__ import annotations

import os
import time
from typing import Callable, Dict, List, Sequence, Tuple

from mps_health.hostio.runner import Completed, Pending, child_env, wait_all
from mps_health.model.facts import ControlAnswer, Instance
from mps_health.probes.context import Context
from mps_health.probes.process_identity import locate, not_found
from mps_health.probes.queries import QUERY

NO_DAEMON = "Cannot find MPS control daemon process"
# Queries whose empty answer means "none" (no server, no client, no pinned memory limit).
EMPTY_OK = ("get_server_list", "get_client_list", "get_device_client_list",
            "get_default_device_pinned_mem_limit", "get_device_pinned_mem_limit")


def _unasked(command: str, status: str, detail: str) -> ControlAnswer:
    """An answer no client gave: "skipped" (not asked) or "exec-failed" (none to ask)."""
    return ControlAnswer(command, status, None, "", "", 0.0, detail)


def classify(command: str, done: Completed) -> ControlAnswer:
    """Turn one finished client run into an answer (pure: tested on captured output)."""
    out, err = done.stdout.strip(), done.stderr.strip()
    if done.exec_error is not None:
        return _unasked(command, "exec-failed", done.exec_error)
    if done.timed_out:
        return ControlAnswer(command, "timeout", None, out, err, done.elapsed_s,
                             f"no answer within {done.elapsed_s:.1f}s")
    if done.rc == 1 and NO_DAEMON in out + err:
        return ControlAnswer(command, "absent", 1, out, err, done.elapsed_s, NO_DAEMON)
    if done.rc == 0 and (out or command.split()[0] in EMPTY_OK) and _is_answer(command, out):
        return ControlAnswer(command, "ok", 0, out, err, done.elapsed_s)
    # stripped, so a first line is never empty
    detail = (out or err).splitlines()[0] if out or err else f"no output (exit status {done.rc})"
    return ControlAnswer(command, "error", done.rc, out, err, done.elapsed_s, detail)


def _is_answer(command: str, out: str) -> bool:
    if command.startswith("get_default_active_thread_percentage"):
        try:
            float(out.splitlines()[0])
        except ValueError:
            return False
        return True
    return not out.startswith(("Unknown command", NO_DAEMON))


class _Lock:
    """The lock our queries to one pipe dir take turns on; skipped where it cannot be made
    (not root) and under --root. Pipe dirs come and go with jobs: the file is removed."""

    def __init__(self, ctx: Context, pipe_dir: str) -> None:
        from mps_health.hostio.filelock import FileLock

        self.read_only = ctx.read_only
        self.lock = FileLock(os.path.join(ctx.path(ctx.config.run_dir),
                                          "control" + pipe_dir.replace("/", "_") + ".lock"),
                             transient=True)
        self.path = self.lock.path

    def acquire(self, deadline: float) -> bool:
        if self.read_only:
            return True
        try:
            return self.lock.wait(deadline)
        except OSError:
            return True  # no lock possible here (not root): go on without one

    def release(self) -> None:
        self.lock.release()


def ask_all(ctx: Context, instances: Tuple[Instance, ...],
            command: str = QUERY) -> Dict[str, ControlAnswer]:
    """Ask every instance ``command``, at most ``control.max_clients`` clients at once
    (many instances must not mean as many processes); one deadline bounds them all."""
    return start(ctx, instances, command)()


gather = ask_all


def start(ctx: Context, instances: Tuple[Instance, ...], command: str = QUERY
          ) -> Callable[[], Dict[str, ControlAnswer]]:
    """Start the first batch of clients now (the engine collects it after the other
    sources) and return the function that collects every answer, asking later batches.
    Until then the first batch holds its pipe dirs' locks."""
    cfg = ctx.config
    deadline = min(time.monotonic() + cfg.control.timeout_s, ctx.deadline)
    step = cfg.control.max_clients
    if ctx.queries is not None:
        for inst in instances:
            ctx.queries.expect(inst.pipe_dir)
    try:
        first = _Batch(ctx, instances[:step], command, deadline)
    except BaseException:
        if ctx.queries is not None:
            ctx.queries.settle([inst.pipe_dir for inst in instances])
        raise

    def collect() -> Dict[str, ControlAnswer]:
        try:
            answers = first.collect()
            for at in range(step, len(instances), step):
                batch = instances[at:at + step]
                if time.monotonic() >= deadline:  # a wedged daemon in an earlier batch
                    skipped = {inst.name: _unasked(
                        command, "skipped", f"not asked: at most {step} control clients run "
                        "at once (control.max_clients) and the run's time was up")
                        for inst in batch}
                    answers.update(skipped)
                    _record(ctx, batch, skipped)
                    continue
                answers.update(_Batch(ctx, batch, command, deadline).collect())
            return answers
        finally:
            if ctx.queries is not None:
                ctx.queries.settle([inst.pipe_dir for inst in instances])

    return collect


class _Batch:
    """Clients started at once; one whose pipe dir's lock another query of ours holds is
    started at collection, once that lock is free (or never, at the deadline)."""

    def __init__(self, ctx: Context, instances: Tuple[Instance, ...], command: str,
                 deadline: float) -> None:
        self.ctx, self.command, self.deadline = ctx, command, deadline
        self.started: List[Tuple[Instance, Pending, _Lock]] = []
        self.waiting: List[Tuple[Instance, _Lock]] = []
        self.client = locate(ctx.config)
        self.missing = instances if self.client is None else ()
        for inst in () if self.client is None else instances:
            lock = pipe_lock(ctx, inst)
            if lock.acquire(0.0):  # free now (a deadline passed tries once)
                self._start(inst, lock)
            else:
                self.waiting.append((inst, lock))

    def _start(self, inst: Instance, lock: _Lock) -> None:
        self.started.append((inst, Pending([str(self.client)], self.command + "\n",
                                           client_env(self.ctx, inst)), lock))

    def collect(self) -> Dict[str, ControlAnswer]:
        answers = {inst.name: _unasked(self.command, "exec-failed", not_found(self.ctx.config))
                   for inst in self.missing}
        try:
            for inst, lock in self.waiting:
                if lock.acquire(self.deadline):
                    self._start(inst, lock)
                else:
                    answers[inst.name] = _unasked(
                        self.command, "skipped",
                        "another mps-health query to this pipe dir did not finish in time")
            waiting = self.ctx.queries.waiting({p: inst.name for inst, p, _ in self.started},
                                               self.command, self.deadline) \
                if self.ctx.queries is not None else None
            done = wait_all([p for _, p, _ in self.started], self.deadline, waiting)
        finally:
            for _, _, lock in self.started:
                lock.release()
        for (inst, _, _), completed in zip(self.started, done):
            answers[inst.name] = classify(self.command, completed)
        _record(self.ctx, [inst for inst, _, _ in self.started]
                + [inst for inst, _ in self.waiting], answers)
        return answers


def _record(ctx: Context, instances: Sequence[Instance], answers: Dict[str, ControlAnswer]
            ) -> None:
    """Hand this run's answers to the probes that ask the same daemons after us."""
    if ctx.queries is None:
        return
    for inst in instances:
        answer = answers.get(inst.name)
        if answer is not None:
            ctx.queries.record(inst.pipe_dir, answer)


def client_env(ctx: Context, inst: Instance) -> Dict[str, str]:
    """The environment that points the control client (or a CUDA client) at ``inst``."""
    env = child_env({"CUDA_MPS_PIPE_DIRECTORY": ctx.path(inst.pipe_dir),
                     "CUDA_MPS_LOG_DIRECTORY": ctx.path(inst.log_dir)})
    if ctx.env is not None:
        env.update(ctx.env)
    return env


def pipe_lock(ctx: Context, inst: Instance) -> _Lock:
    """The lock our queries to ``inst``'s pipe dir take turns on (acquire, then release)."""
    return _Lock(ctx, inst.pipe_dir)


def ask(ctx: Context, inst: Instance, command: str, deadline: float) -> ControlAnswer:
    """One query to ``inst``, bounded by the control timeout and ``deadline``; for a
    series of queries the caller holds :func:`pipe_lock`. A daemon that gave an earlier
    query of the run no answer is not asked ("skipped", at once)."""
    queries = ctx.queries
    if queries is not None:
        why = queries.unanswered(inst.pipe_dir, deadline)
        if why:
            return _unasked(command, "skipped", "not asked: " + why)
    deadline = min(deadline, time.monotonic() + ctx.config.control.timeout_s, ctx.deadline)
    client = locate(ctx.config)  # as every command finds it (never on PATH)
    if client is None:  # MPS is not installed
        return _unasked(command, "exec-failed", not_found(ctx.config))
    pending = Pending([client], command + "\n", client_env(ctx, inst))
    waiting = queries.waiting({pending: inst.name}, command, deadline) \
        if queries is not None else None
    answer = classify(command, pending.wait(deadline, waiting))
    _record(ctx, [inst], {inst.name: answer})
    return answer


VALUE_TYPE = Dict[str, ControlAnswer]
