"""Evaluation stage: one module per check, each a pure function over the run's facts.

A check is ``check(facts, config) -> iterable of Result``; it reads only
``facts.sources`` and its config, never the system. Register it in
``mps_health.model.registry`` with one line.
"""
