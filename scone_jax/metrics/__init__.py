"""Metrics: FLOP counts and MFU, and writers (stdout, JSONL, tensorboard) from process 0."""
