"""What every layer shares: facts, results, printable text, the snapshot codec, exit codes."""
