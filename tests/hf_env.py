"""transformers and torch for the Hugging Face interop tests, offline; a skip where the optional
`hf` extra is not installed (setup.cfg: Python 3.12 has no CPU wheel of the pinned torch)."""

import os

os.environ["HF_HUB_OFFLINE"] = "1"  # local files only: a test never reaches the network
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import pytest  # noqa: E402


def transformers_and_torch():
    torch = pytest.importorskip("torch", reason="the optional hf extra (torch) is not installed")
    transformers = pytest.importorskip("transformers", reason="the optional hf extra is absent")
    torch.set_num_threads(1)
    return transformers, torch
