"""Evaluation stage: one module per check, each a pure function over the run's facts.

A check is ``check(facts, config) -> iterable of Result``; it reads only
``facts.sources`` and its config, never the system. Its module declares it at import
with ``registry.check(NAME, f"{__name__}:check", needs, order=...)``: the registry
imports every module here (``registry.checks()``), so no list names them. Its ``CODES``
are every code it reports besides ok, each with a runbook entry in docs/runbook.md. ``common``
holds the shared helpers (``registry.HELPERS``) and declares no check.
"""
