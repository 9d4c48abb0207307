"""`scone-jax generate (RUN_DIR [--step N] | --backbone DIR) [--table URL] --prompt TEXT ...`."""

from __future__ import annotations

from scone_jax.cli.step_arg import add_step_argument


def register(sub) -> None:
    p = sub.add_parser(
        "generate",
        help="generate text with the KV cache (SCONE: f-gram rows from an exported table)",
        description="Batched prefill over the prompts (with a batched f-gram lookup), then one "
        "token per step with the longest f-gram match over the last K-1 tokens. The model is "
        "RUN_DIR's latest (or --step) checkpoint, or an exported backbone (--backbone). Greedy "
        "by default; --temperature with --top-k/--top-p samples, and --seed fixes the output.",
    )
    p.add_argument("run_dir", nargs="?", help="a run directory made by `scone-jax train`")
    p.add_argument(
        "--backbone", default=None, help="an exported backbone directory (instead of RUN_DIR)"
    )
    add_step_argument(p, "of RUN_DIR to generate with")
    p.add_argument(
        "--table", default=None, metavar="URL", help="the exported f-gram table (SCONE models)"
    )
    p.add_argument(
        "--tier", default="host", choices=("device", "host", "disk"), help="where the table lives"
    )
    p.add_argument("--prompt", action="append", required=True, help="a prompt; repeat for a batch")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=0, help="0 = off")
    p.add_argument("--top-p", type=float, default=1.0, help="1 = off")
    p.add_argument("--seed", type=int, default=0, help="0 <= seed < 2**32")
    p.add_argument(
        "--tokenizer",
        default=None,
        help="a sentencepiece .model or Hugging Face tokenizer.json (default: the run's dataset "
        "tokenizer, or the backbone export's)",
    )
    p.set_defaults(func=run)


def run(args) -> int:
    from pathlib import Path

    from scone_jax.data.tokenizer import find_tokenizer_file, load_tokenizer
    from scone_jax.errors import UserError
    from scone_jax.serve.engine import engine_from_export, engine_from_run
    from scone_jax.serve.generate import generate
    from scone_jax.serve.sampling import Sampling

    if bool(args.run_dir) == bool(args.backbone):
        raise UserError("give either RUN_DIR or --backbone DIR (exactly one)")
    if args.backbone and args.step is not None:
        raise UserError(
            f"--step={args.step} with --backbone (an exported backbone is one checkpoint; "
            "--step picks one of RUN_DIR's)"
        )
    if args.max_new_tokens <= 0:
        raise UserError(f"--max-new-tokens={args.max_new_tokens} (expected > 0)")
    sampling = Sampling(args.temperature, args.top_k, args.top_p)
    sampling.validate()  # before the model is loaded
    if not 0 <= args.seed < 2**32:  # a sampling key takes 32 bits: larger seeds would alias
        raise UserError(f"--seed={args.seed} (expected 0 <= seed < 2**32)")
    if args.run_dir:
        import json

        from scone_jax.artifacts.run_dir import RUN_INFO_FILE

        engine = engine_from_run(args.run_dir, args.table, args.tier, args.step)
        default_tok = find_tokenizer_file(
            json.loads((Path(args.run_dir) / RUN_INFO_FILE).read_text())["dataset"]
        )
    else:
        engine = engine_from_export(args.backbone, args.table, args.tier)
        default_tok = find_tokenizer_file(args.backbone)
    tokenizer = load_tokenizer(args.tokenizer or default_tok)
    if engine.tokenizer_sha256 and tokenizer.sha256 != engine.tokenizer_sha256:
        raise UserError(
            f"tokenizer {tokenizer.path} (sha256 {tokenizer.sha256[:12]}) is not the model's "
            f"({engine.tokenizer_sha256[:12]})"
        )
    prompts = [tokenizer.encode(text) for text in args.prompt]
    outputs = generate(engine, prompts, args.max_new_tokens, sampling, args.seed, tokenizer.eos_id)
    for i, (text, ids, new) in enumerate(zip(args.prompt, prompts, outputs, strict=True)):
        if len(prompts) > 1:
            print(f"--- prompt {i + 1} of {len(prompts)} ---")
        print(text + continuation(tokenizer, ids, [t for t in new if t != tokenizer.eos_id]))
    return 0


def continuation(tokenizer, prompt_ids: list[int], new_ids: list[int]) -> str:
    """The text the new tokens add to the prompt's, decoded together: a piece that begins a word
    decodes alone without its leading space ("the"), after the prompt with it (" the")."""
    prompt_text = tokenizer.decode(list(prompt_ids))
    whole = tokenizer.decode(list(prompt_ids) + list(new_ids))
    if whole.startswith(prompt_text):
        return whole[len(prompt_text) :]
    return tokenizer.decode(list(new_ids))
