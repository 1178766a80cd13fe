"""The run: gather the facts the chosen checks need, judge them; snapshots of them."""
