"""One module per ``mps-health`` subcommand: ``register(parser)`` returns its handler."""
