"""The `scone-jax` command line: argument parsing and error reporting only; logic lives in the
stages."""
