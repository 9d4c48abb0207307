"""Serving: f-gram table tiers, the input-layer lookup-and-add, evaluation and generation."""
