"""Training: optimizer, sharded state, the pure jitted step, checkpoints, and the loop."""
