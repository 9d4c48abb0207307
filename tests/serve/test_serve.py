"""Serving: tiers agree, the table path scores like the live model, the KV cache decodes
like a full recompute, and an exported backbone serves like the checkpoint."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scone_jax.errors import UserError
from scone_jax.evaluation.run import evaluate_run
from scone_jax.export.backbone import export_backbone
from scone_jax.export.table import export_table
from scone_jax.fgrams.tag import tag_tokens
from scone_jax.serve.engine import engine_from_export, engine_from_run
from scone_jax.serve.generate import decode_steps, generate, prompt_fgram_ids
from scone_jax.serve.input_layer import TableLookup
from scone_jax.serve.sampling import Sampling
from scone_jax.serve.tables import TIERS, open_table
from tests.scone_run import train_scone_run
from tests.serve.reference import generate_reference


@pytest.fixture(
    scope="module", params=["replace", "gated"]
)  # add's rows are gated's without the gain
def exported(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(f"serve_{request.param}")
    run_dir = train_scone_run(
        root, seed=int(np.random.SeedSequence().entropy % 2**31), combine=request.param
    )
    for dtype in ("float32", "bfloat16", "int8"):
        export_table(run_dir, str(root / dtype), dtype=dtype, progress=False)
    return run_dir, root


def sample_tokens(run_dir, rng, batch=3, length=24):
    import json

    from scone_jax.data.dataset import TokenizedDataset

    ds = TokenizedDataset.open(json.loads((run_dir / "run_info.json").read_text())["dataset"])
    starts = rng.integers(0, ds.num_tokens - length, batch)
    return [np.asarray(ds.tokens[s : s + length], np.int64) for s in starts]


def test_device_host_and_disk_tiers_give_identical_logits(exported, rng):
    run_dir, root = exported
    seqs = sample_tokens(run_dir, rng)
    tokens = np.stack(seqs).astype(np.int32)
    logits = {}
    for tier in ("device", "host", "disk"):
        engine = engine_from_run(run_dir, str(root / "float32"), tier)
        ids = prompt_fgram_ids(engine, seqs, tokens.shape[1])
        assert (ids >= 0).mean() > 0.3  # the comparison exercises real lookups
        logits[tier] = np.asarray(engine.logits(tokens, ids))
    np.testing.assert_array_equal(logits["device"], logits["host"])
    np.testing.assert_array_equal(logits["host"], logits["disk"])


def test_every_tier_decodes_the_same_tokens(exported, rng):
    run_dir, root = exported
    prompts = [s[: int(rng.integers(3, 12))].tolist() for s in sample_tokens(run_dir, rng)]
    outs = [
        generate(engine_from_run(run_dir, str(root / "float32"), tier), prompts, 10)
        for tier in TIERS
    ]
    assert outs[0] == outs[1] == outs[2]


@pytest.mark.parametrize("dtype", ["bfloat16", "int8"])
def test_a_decode_step_adds_the_row_of_each_new_tokens_longest_match(exported, dtype, rng):
    run_dir, root = exported
    fgram_set = open_table(str(root / dtype), "host").fgram_set
    cut, length = int(rng.integers(2, 8)), 20
    for _ in range(50):  # text whose continuation has matched and unmatched tokens
        seqs = sample_tokens(run_dir, rng, batch=4, length=length)
        # the reference: each prefix tagged as one document, the f-gram at its last token
        expected = np.array(
            [tag_tokens(fgram_set, s, np.array([0, length]))[0][cut:] for s in seqs]
        )
        if (expected >= 0).any() and (expected < 0).any():
            break
    assert (expected >= 0).any() and (expected < 0).any(), (
        "no text with both matched and unmatched tokens"
    )
    for tier in TIERS:
        table = open_table(str(root / dtype), tier)
        lookup = TableLookup(table)
        step = lookup.decoder([s[:cut] for s in seqs])
        for t in range(cut, length):
            prepared = step(np.array([s[t] for s in seqs]))
            added = np.asarray(
                jax.jit(lookup.add_rows)(jnp.zeros((len(seqs), 1, table.width)), prepared)
            )[:, 0]
            ids = expected[:, t - cut]
            want = np.where((ids >= 0)[:, None], table.gather(np.maximum(ids, 0)), 0)
            np.testing.assert_array_equal(added, want, err_msg=f"{tier} tier, step {t}")


@pytest.mark.parametrize("dtype", ["bfloat16", "int8"])
def test_disk_row_cache_returns_the_stored_rows(exported, dtype, rng):
    _, root = exported
    host = open_table(str(root / dtype), "host")
    disk = open_table(
        str(root / dtype), "disk", cache_bytes=64 * 4 * host.width
    )  # 64 row slots: evictions
    for size in (1, 12, 12, 90, 1, 12):  # a decode step's few rows (a loop), or many (whole arrays)
        ids = rng.integers(0, min(host.num_rows, 200), size)
        ids = np.concatenate([ids, ids[:4]])  # repeats within a call too
        np.testing.assert_array_equal(disk.gather(ids), host.gather(ids))


def test_table_perplexity_equals_the_live_fgram_model(exported, capsys):
    run_dir, root = exported
    live = evaluate_run(run_dir)["results"]["heldout"]["perplexity"]
    table = evaluate_run(run_dir, table=str(root / "float32"))["results"]["heldout"]["perplexity"]
    assert abs(table - live) / live < 1e-4
    for dtype in ("bfloat16", "int8"):  # measured and reported, not required to match
        other = evaluate_run(run_dir, table=str(root / dtype), tier="disk")["results"]["heldout"][
            "perplexity"
        ]
        with capsys.disabled():
            print(
                "\n"
                f"perplexity live {live:.4f}, {dtype} table {other:.4f} "
                f"({(other - live) / live:+.2e} relative)"
            )
        assert abs(other - live) / live < 0.05


@pytest.mark.parametrize(
    "sampling",
    [Sampling(), Sampling(temperature=0.9, top_k=20, top_p=0.9)],
    ids=["greedy", "sampled"],
)
def test_kv_cache_generation_equals_full_recompute(exported, rng, sampling):
    run_dir, root = exported
    engine = engine_from_run(run_dir, str(root / "float32"), "host")
    prompts = [s[: int(rng.integers(3, 12))].tolist() for s in sample_tokens(run_dir, rng)]
    fast = generate(engine, prompts, 10, sampling, seed=5)
    slow = generate_reference(engine, prompts, 10, sampling, seed=5)
    assert fast == slow
    assert generate(engine, prompts, 10, sampling, seed=5) == fast  # a fixed seed, a fixed output
    # an end-of-sequence id ends its row (kept) and, once every row has it, the whole batch
    eos = fast[0][int(rng.integers(0, 10))]
    cut = [row[: row.index(eos) + 1] if eos in row else row for row in fast]
    assert generate(engine, prompts, 10, sampling, seed=5, eos_id=eos) == cut
    steps = decode_steps(engine, prompts, 10, sampling, seed=5)
    assert [next(steps).tolist() for _ in range(3)] == [[row[i] for row in fast] for i in range(3)]
    assert generate(engine, prompts, 0) == [[] for _ in prompts]


def test_generation_reaches_the_last_position_of_the_context(exported, rng):
    """The last new token is returned, never fed back: a prompt of L - k tokens gets k + 1 new
    ones (a whole-context prompt still gets one), exactly as a full recompute would."""
    run_dir, root = exported
    engine = engine_from_run(run_dir, str(root / "float32"), "host")
    limit = engine.model.cfg.max_seq_len
    full, other = sample_tokens(run_dir, rng, batch=2, length=limit)
    k = int(rng.integers(1, 6))
    print("context", limit, "k", k)
    for prompts, new in (
        ([full[: limit - k].tolist(), other[:5].tolist()], k + 1),
        ([full.tolist()], 1),
    ):
        fast = generate(engine, prompts, new)
        assert fast == generate_reference(engine, prompts, new) and len(fast[0]) == new
    with pytest.raises(UserError, match="exceeds the model's max_seq_len"):
        generate(engine, [full[: limit - k].tolist()], k + 2)


def test_exported_backbone_serves_like_the_checkpoint(exported, rng):
    run_dir, root = exported
    export_backbone(run_dir, root / "backbone", overwrite=True)
    seqs = sample_tokens(run_dir, rng, batch=2)
    tokens = np.stack(seqs).astype(np.int32)
    a = engine_from_run(run_dir, str(root / "float32"))
    b = engine_from_export(root / "backbone", str(root / "float32"))
    ids = prompt_fgram_ids(a, seqs, tokens.shape[1])
    # the checkpoint's params are sharded over 8 devices, the export's live on one: float noise only
    np.testing.assert_allclose(
        np.asarray(a.logits(tokens, ids)), np.asarray(b.logits(tokens, ids)), atol=1e-5
    )
    assert (root / "backbone" / "params.npz").is_file() and not any(
        k.startswith("fgram") for k in np.load(root / "backbone" / "params.npz").files
    )
    with pytest.raises(UserError, match="is an exported backbone, not an f-gram table"):
        open_table(str(root / "backbone"), "host")  # the export's other output, taken for it
