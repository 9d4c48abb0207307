"""Sweeps: expand a sweep file into runs, run them (here or through `launch/`), report the
results."""
