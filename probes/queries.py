"""One run's control queries, shared by the probes that ask a daemon (``ctx.queries``):
a daemon that gave one query no answer is asked nothing more and costs one timeout.
Apart from the control probe so that the run's ``Context`` can name its type.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from typing import Callable, Dict, List, Optional, Sequence

from mps_health.hostio.runner import Pending
from mps_health.model.facts import ControlAnswer

QUERY = "get_default_active_thread_percentage"  # the control probe's own query


class Queries:
    """One run's control queries, shared by the probes that ask a daemon: ``expect`` marks
    a query as out, ``record`` takes its answer, ``unanswered`` waits for it and says why
    the daemon is not to be asked again (it would only wait out another timeout)."""

    def __init__(self) -> None:
        self.tell = os.isatty(2)  # False, never an error, for a closed fd
        self._out: Dict[str, threading.Event] = {}  # pipe dir -> set once it is answered
        self._unanswered: Dict[str, str] = {}  # pipe dir -> why

    def expect(self, pipe_dir: str) -> None:
        self._out.setdefault(pipe_dir, threading.Event())

    def record(self, pipe_dir: str, answer: ControlAnswer) -> None:
        if answer.status in ("timeout", "skipped") and pipe_dir not in self._unanswered:
            self._unanswered[pipe_dir] = (f"the control daemon gave no answer to "
                                          f"{answer.command} this run ({answer.detail})")
        self.settle([pipe_dir])

    def settle(self, pipe_dirs: Sequence[str]) -> None:
        """These are in (or no answer will come: the query failed): their waiters go on."""
        for pipe_dir in pipe_dirs:
            answered = self._out.pop(pipe_dir, None)
            if answered is not None:
                answered.set()

    def unanswered(self, pipe_dir: str, deadline: float) -> str:
        """Why the daemon of ``pipe_dir`` is asked nothing more this run ("": ask it),
        once the run's query of it that is out is in (or at ``deadline``)."""
        answered = self._out.get(pipe_dir)
        if answered is not None:
            answered.wait(min(max(0.0, deadline - time.monotonic()), threading.TIMEOUT_MAX))
        return self._unanswered.get(pipe_dir, "")

    def waiting(self, names: Dict[Pending, str], command: str, deadline: float
                ) -> Optional[Callable[[List[Pending]], None]]:
        """wait_all's ``waiting`` for the clients in ``names`` (each one's instance): a line on
        stderr, on a terminal only (slurmd, Nagios, a pipe read only our documented output)."""
        if not self.tell:
            return None

        def say(still: Sequence[Pending]) -> None:
            from mps_health.model.printable import printable

            shown = [printable(names[p]) for p in still if p in names]
            if not shown:
                return
            whose = (f"the control daemon of {shown[0]}" if len(shown) == 1 else
                     f"the control daemons of {', '.join(shown[:5])}"
                     + (f" and {len(shown) - 5} more" if len(shown) > 5 else ""))
            what = "" if command == QUERY else f" to answer {printable(command)}"
            up_to = f"{max(0.0, deadline - min(p.started for p in still)):.1f}"
            line = (f"mps-health: waiting for {whose}{what} "
                    f"(up to {up_to.rstrip('0').rstrip('.')}s)...\n")
            with contextlib.suppress(OSError):
                os.write(2, line.encode("utf-8", "replace"))

        return say
