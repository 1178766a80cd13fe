"""What probes, checks and outputs share: facts, results, the registry, the run's context."""
