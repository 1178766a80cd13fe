"""Acquisition stage: probes that read the node once per run into frozen facts.

Each module reads one kind of fact. ``read_*`` functions do the I/O and ``parse_*``
functions are pure, tested on real captured text.
"""
