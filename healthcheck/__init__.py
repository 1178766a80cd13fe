"""slurmd's HealthCheckProgram: the run, what it remembers, detaching, the node's drain
and resume."""
