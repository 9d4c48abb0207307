"""On-disk formats: the run directory's layout, checkpoints, the table and backbone export
formats, and restoring a run's parameters. Knows formats and paths, not training."""
