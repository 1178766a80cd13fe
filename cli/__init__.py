"""The ``mps-health`` subcommands (``main.COMMANDS``): ``register(parser)`` returns the handler."""
