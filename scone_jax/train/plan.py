"""What a config's train step costs on a mesh, before any hardware runs it: the real step
(the SCONE one too) lowered and compiled for N devices with abstract inputs, so nothing the size
of the model is allocated, and read back from XLA's memory and cost analyses.

A SCONE step's prefix-forest buffers need sizes before any data exists: `fgrams.capacity` node
slots per data shard when set, else an estimate per token of the shard's microbatch rows
(`NODE_SLOTS_PER_TOKEN`, `OUTPUT_SLOTS_PER_TOKEN`, measured on WikiText-2 batches at K = 5 and
S = 20K: 0.84 node slots and 0.59 outputs per token; with `fgrams.suffix_rows`, whose forests
also hold every matched f-gram's suffixes, `SUFFIX_ROWS_*`, measured on WikiText-2's valid split
at K = 5 and S = 64K: up to 1.72 node slots and 1.41 outputs per token), rounded up to whole
blocks.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

import jax
import jax.numpy as jnp

from scone_jax.artifacts.checkpoint import abstract_with_shardings
from scone_jax.config import Config
from scone_jax.forest.layout import round_up
from scone_jax.metrics.flops import fgram_forest_forward, model_flops
from scone_jax.model.build import build_model_fn
from scone_jax.sharding.batch import batch_shardings, fgram_groups
from scone_jax.sharding.mesh import make_mesh
from scone_jax.sharding.rules import make_rules
from scone_jax.train.optimizer import make_optimizer
from scone_jax.train.session import check_batch_layout
from scone_jax.train.state import setup_train_state
from scone_jax.train.step import make_train_step

NODE_SLOTS_PER_TOKEN = 1.0
OUTPUT_SLOTS_PER_TOKEN = 0.75
SUFFIX_ROWS_NODE_SLOTS_PER_TOKEN = 1.8
SUFFIX_ROWS_OUTPUT_SLOTS_PER_TOKEN = 1.5
GIB = 1 << 30
FOREST_KEYS = ("fgram_nodes", "fgram_paths", "fgram_outputs")


def forest_shapes(cfg: Config, groups: int) -> dict[str, tuple[int, ...]]:
    """Shapes of the SCONE batch's forest buffers for this config (see the module docstring)."""
    fg, micro = cfg.fgrams, cfg.train.microbatches
    positions = cfg.train.batch_size // micro * cfg.data.seq_len / groups
    node_slots, output_slots = (
        (SUFFIX_ROWS_NODE_SLOTS_PER_TOKEN, SUFFIX_ROWS_OUTPUT_SLOTS_PER_TOKEN)
        if fg.suffix_rows
        else (NODE_SLOTS_PER_TOKEN, OUTPUT_SLOTS_PER_TOKEN)
    )
    slots = fg.capacity or node_slots * positions
    blocks = max(math.ceil(slots / fg.block_size), 1)
    outputs = round_up(max(math.ceil(output_slots * positions), 1), fg.block_size)
    lead = (micro,) if micro > 1 else ()
    return {
        "fgram_nodes": (*lead, groups, blocks, fg.block_size),
        "fgram_paths": (*lead, groups, blocks, fg.block_size, fg.max_n),
        "fgram_outputs": (*lead, groups, outputs),
    }


def plan_train_step(cfg: Config, devices: Sequence[jax.Device], device_memory_gib: float) -> dict:
    """Compile the train step for a mesh over `devices`; per-device bytes, FLOPs, timings."""
    mesh = make_mesh(cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor, devices=devices)
    check_batch_layout(cfg, mesh.shape["data"] * mesh.shape["fsdp"])
    rules = make_rules(cfg.mesh.rules)
    vocab = cfg.model.vocab_size or cfg.data.tokenizer_vocab_size
    tx, schedule = make_optimizer(cfg.optim, cfg.train.steps)
    setup = setup_train_state(build_model_fn(cfg, vocab), tx, cfg.train.seed, mesh, rules)
    batch, seq = cfg.train.batch_size, cfg.data.seq_len
    scone = cfg.fgrams.enabled
    shardings = batch_shardings(
        mesh,
        rules,
        batch,
        seq,
        cfg.fgrams.max_n if scone else None,
        cfg.train.microbatches,
        cfg.fgrams.index_links,
    )
    shapes = {key: (batch, seq) for key in ("inputs", "targets")}
    links = cfg.fgrams.index_links
    shapes["fgram_index"] = (batch, seq, *((links,) if links else ()))
    if scone:
        shapes.update(forest_shapes(cfg, fgram_groups(mesh, rules)))
    abstract_batch = {
        key: jax.ShapeDtypeStruct(shapes[key], jnp.int32, sharding=sh)
        for key, sh in shardings.items()
    }
    abstract_state = abstract_with_shardings(setup.abstract_state, setup.shardings)
    step = make_train_step(
        setup.handle,
        tx,
        schedule,
        mesh,
        rules,
        setup.shardings,
        shardings,
        cfg.train.microbatches,
        cfg.dropout_seed,
    )
    start = time.perf_counter()
    lowered = step.lower(abstract_state, abstract_batch)
    lowered_at = time.perf_counter()
    compiled = lowered.compile()
    compiled_at = time.perf_counter()
    memory = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    per_device = {
        "arguments": int(memory.argument_size_in_bytes),
        "outputs": int(memory.output_size_in_bytes),
        "temp": int(memory.temp_size_in_bytes),
    }
    # donated state: outputs written into the arguments' buffers are counted once
    per_device["peak"] = (
        per_device["arguments"]
        + per_device["outputs"]
        - int(memory.alias_size_in_bytes)
        + per_device["temp"]
    )
    counted = model_flops(cfg.model, vocab, seq).train_per_token * batch * seq
    if scone:
        counted += 3 * fgram_forest_forward(
            cfg.fgrams,
            cfg.model,
            math.prod(shapes["fgram_nodes"]),
            math.prod(shapes["fgram_outputs"]),
        )
    return {
        "devices": len(devices),
        "platform": devices[0].platform,
        "mesh": dict(mesh.shape),
        "batch": [batch, seq],
        "microbatches": cfg.train.microbatches,
        "remat": cfg.model.remat,
        "scan_layers": cfg.model.scan_layers,
        "per_device_bytes": per_device,
        "device_memory_gib": device_memory_gib,
        "fits": per_device["peak"] <= device_memory_gib * GIB,
        "lower_s": round(lowered_at - start, 2),
        "compile_s": round(compiled_at - lowered_at, 2),
        # XLA counts the partitioned program of one device; a whole step is that on every device
        "flops_per_step": float(cost.get("flops", 0.0)) * len(devices),
        "flops_per_step_counted": float(counted),
        "forest_shapes": {k: list(v) for k, v in shapes.items() if k in FOREST_KEYS},
    }


def plan_text(name: str, plan: dict) -> str:
    """The plan as a few lines for a terminal."""
    b = plan["per_device_bytes"]
    gib = {k: v / GIB for k, v in b.items()}
    fits = "fits in" if plan["fits"] else "does NOT fit in"
    batch = plan["batch"]
    lines = [
        f"plan {name}: {plan['devices']} {plan['platform']} devices, mesh {plan['mesh']}, batch "
        f"{batch[0]} x {batch[1]} in {plan['microbatches']} microbatch(es), remat "
        f"{plan['remat']}, scan_layers {str(plan['scan_layers']).lower()}",
        f"per device: arguments {gib['arguments']:.2f} GiB, outputs {gib['outputs']:.2f} GiB, "
        f"temporaries {gib['temp']:.2f} GiB, peak {gib['peak']:.2f} GiB: {fits} "
        f"{plan['device_memory_gib']:g} GiB",
        f"FLOPs per step: {plan['flops_per_step']:.3e} (XLA: recomputation included, a loop's "
        f"body counted once), {plan['flops_per_step_counted']:.3e} (model FLOPs, counted)",
        f"lowering {plan['lower_s']:.1f} s, compile {plan['compile_s']:.1f} s",
    ]
    if plan["forest_shapes"]:
        lines.append(f"f-gram forest buffers (estimated): {plan['forest_shapes']}")
    return "\n".join(lines)
