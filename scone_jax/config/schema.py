"""The one config schema. Every field is typed; `validate()` checks values, not just types."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from scone_jax.errors import UserError

FAMILIES = ("gpt2", "llama")
DTYPES = ("float32", "bfloat16")
COMBINE_RULES = ("replace", "add", "gated")
DROP_TARGETS = ("unmatched", "suffix")
ATTENTION_IMPLEMENTATIONS = ("auto", "xla", "cudnn")
REMAT_POLICY_NAMES = ("none", "dots", "block")  # model/stack.py says what each keeps


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise UserError(message)


def _positive(value: float) -> bool:
    """Finite and above 0 (refuses nan and inf, which YAML's .nan and .inf spell)."""
    return 0 < value < math.inf


def _non_negative(value: float) -> bool:
    return 0 <= value < math.inf


@dataclass
class ModelConfig:
    """Decoder-only backbone. `gpt2`: learned positions, GeLU, LayerNorm. `llama`: RoPE, SwiGLU,
    RMSNorm."""

    family: str = "gpt2"
    vocab_size: int = 0  # 0 = take it from the tokenizer
    d_model: int = 128
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int = 0  # 0 = n_heads (no grouped-query attention)
    d_ff: int = 0  # 0 = 4 * d_model for gpt2, 8/3 * d_model rounded up to 64 for llama
    max_seq_len: int = 1024
    tie_embeddings: bool = True
    dtype: str = "float32"  # compute dtype
    param_dtype: str = "float32"
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    init_std: float = 0.02
    init_from: str = ""  # a Hugging Face checkpoint directory the backbone starts from
    # jax.nn.dot_product_attention: cudnn (fused flash attention, NVIDIA GPUs, bf16/fp16), xla,
    # or auto (cudnn where it can run, else xla)
    attention: str = "auto"
    remat: str = "none"  # what the backward pass keeps of each block: none | dots | block
    scan_layers: bool = False  # stack the blocks' parameters and lax.scan them (compiles once)

    def validate(self) -> None:
        _check(
            self.family in FAMILIES, f"model.family={self.family!r} (expected one of {FAMILIES})"
        )
        _check(
            self.attention in ATTENTION_IMPLEMENTATIONS,
            f"model.attention={self.attention!r} (expected one of {ATTENTION_IMPLEMENTATIONS})",
        )
        _check(
            self.remat in REMAT_POLICY_NAMES,
            f"model.remat={self.remat!r} (expected one of {REMAT_POLICY_NAMES})",
        )
        _check(self.dtype in DTYPES, f"model.dtype={self.dtype!r} (expected one of {DTYPES})")
        _check(
            self.param_dtype in DTYPES,
            f"model.param_dtype={self.param_dtype!r} (expected one of {DTYPES})",
        )
        for name in ("d_model", "n_layers", "n_heads", "max_seq_len"):
            _check(getattr(self, name) > 0, f"model.{name}={getattr(self, name)} (expected > 0)")
        _check(
            self.vocab_size >= 0,
            f"model.vocab_size={self.vocab_size} (expected >= 0; 0 = from tokenizer)",
        )
        _check(
            self.d_model % self.n_heads == 0,
            f"model.d_model={self.d_model} is not divisible by model.n_heads={self.n_heads}",
        )
        kv = self.kv_heads
        _check(
            kv > 0 and self.n_heads % kv == 0,
            f"model.n_kv_heads={self.n_kv_heads} (expected a divisor of n_heads={self.n_heads})",
        )
        if self.family == "llama":
            _check(self.head_dim % 2 == 0, f"llama needs an even head dim, got {self.head_dim}")
        _check(self.d_ff >= 0, f"model.d_ff={self.d_ff} (expected >= 0; 0 = family default)")
        for name in ("rope_theta", "norm_eps", "init_std"):
            value = getattr(self, name)
            _check(_positive(value), f"model.{name}={value} (expected a finite value > 0)")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def ffn_dim(self) -> int:
        if self.d_ff:
            return self.d_ff
        if self.family == "llama":
            return -(-(8 * self.d_model // 3) // 64) * 64
        return 4 * self.d_model


@dataclass
class FgramConfig:
    """SCONE f-gram settings (SCONE.md sections 2-4). `enabled: false` trains the baseline.

    The f-gram model has the backbone's block type; its depth is `n_layers` or, when 0,
    `model_size` (e.g. "0.5x", "1x", "2x", "3x") times the backbone's depth; its width is
    `d_model` (0 = the backbone's, else linear projections map T's rows in and its output out).
    """

    enabled: bool = False
    max_n: int = 5
    num_fgrams: int = 100_000
    min_count: int = 5
    fgram_set: str = ""  # a built f-gram set directory; empty = build one in the run directory
    model_size: str = "1x"
    n_layers: int = 0
    d_model: int = 0
    n_heads: int = 0  # 0 = backbone's heads when widths match, else d_model // 64
    combine: str = (
        "gated"  # gated (add through a zero-initialized learned gain) | add | replace (the paper)
    )
    dedup: bool = True  # compute each distinct f-gram of a batch once
    # F reads T's rows without sending gradients back to T (the paper trains T through both paths)
    detach_table: bool = False
    # share of matched training positions fed without their f-gram (a fresh draw per step and
    # position; evaluation and export use every match): a regularizer for text that training
    # repeats many times
    drop_rate: float = 0.0
    # what a dropped position is fed: unmatched (T's row alone) | suffix (the row of its f-gram's
    # longest proper suffix in the set, of 2 tokens or more: backoff to a shorter context; a
    # 2-gram, or an f-gram with no such suffix in the set, is fed unmatched)
    drop_to: str = "unmatched"
    # share of the f-gram embedding's features zeroed at each matched training position (the
    # rest scaled by 1 / (1 - rate); a fresh draw per step; evaluation and export use them all):
    # a gentler regularizer of the f-gram path than dropping whole positions
    embed_drop_rate: float = 0.0
    # a matched position's f-gram embedding is the sum of F over its f-gram and each of its
    # proper suffixes in the set (of 2 tokens or more), so a long f-gram's row adds to the rows
    # of its shorter contexts; the exported row of w is F(w) + the row of its longest suffix
    suffix_rows: bool = False
    capacity: int = (
        0  # f-gram model node slots per data shard (whole blocks) before they grow; 0 = calibrate
    )
    block_size: int = 32  # node slots per attention block of the prefix forest (>= max_n)
    permute_rows: bool = (
        False  # control: each f-gram embedded as another (fixed permutation); not exportable
    )

    def validate(self) -> None:
        _check(2 <= self.max_n <= 16, f"fgrams.max_n={self.max_n} (expected 2..16)")
        _check(self.num_fgrams > 0, f"fgrams.num_fgrams={self.num_fgrams} (expected > 0)")
        _check(self.min_count >= 1, f"fgrams.min_count={self.min_count} (expected >= 1)")
        _check(
            self.combine in COMBINE_RULES,
            f"fgrams.combine={self.combine!r} (expected one of {COMBINE_RULES})",
        )
        _check(
            self.n_layers >= 0 and self.d_model >= 0 and self.n_heads >= 0 and self.capacity >= 0,
            "fgrams.n_layers, d_model, n_heads and capacity must be >= 0",
        )
        _check(
            0.0 <= self.drop_rate < 1.0,
            f"fgrams.drop_rate={self.drop_rate} (expected 0 <= rate < 1)",
        )
        _check(
            0.0 <= self.embed_drop_rate < 1.0,
            f"fgrams.embed_drop_rate={self.embed_drop_rate} (expected 0 <= rate < 1)",
        )
        _check(
            self.drop_to in DROP_TARGETS,
            f"fgrams.drop_to={self.drop_to!r} (expected one of {DROP_TARGETS})",
        )
        _check(
            self.drop_to == "unmatched" or self.drop_rate > 0,
            f"fgrams.drop_to={self.drop_to!r} with fgrams.drop_rate=0 (expected a drop_rate > 0:"
            " nothing is dropped to back off from)",
        )
        _check(
            self.block_size >= self.max_n,
            f"fgrams.block_size={self.block_size} (expected >= fgrams.max_n={self.max_n})",
        )
        _check(
            _positive(self.size_multiplier),
            f"fgrams.model_size={self.model_size!r} (expected e.g. '0.5x', '1x', '3x')",
        )

    @property
    def size_multiplier(self) -> float:
        text = self.model_size.strip().lower().removesuffix("x")
        try:
            return float(text)
        except ValueError:
            return -1.0

    @property
    def index_links(self) -> int:
        """The trailing axis of a batch's `fgram_index`: K - 1 links per position with
        `suffix_rows` (the f-gram and its suffixes), 0 for none ([B, T])."""
        return self.max_n - 1 if self.suffix_rows else 0

    def model_config(self, backbone: ModelConfig) -> ModelConfig:
        """The f-gram model's architecture, derived from the backbone's."""
        d_model = self.d_model or backbone.d_model
        n_heads = self.n_heads or (
            backbone.n_heads if d_model == backbone.d_model else max(1, d_model // 64)
        )
        n_layers = self.n_layers or max(1, round(self.size_multiplier * backbone.n_layers))
        same_width = d_model == backbone.d_model
        return ModelConfig(
            family=backbone.family,
            vocab_size=backbone.vocab_size,
            d_model=d_model,
            n_layers=n_layers,
            n_heads=n_heads,
            n_kv_heads=backbone.n_kv_heads if same_width and n_heads == backbone.n_heads else 0,
            d_ff=backbone.d_ff if same_width else 0,
            max_seq_len=self.max_n,
            tie_embeddings=True,
            dtype=backbone.dtype,
            param_dtype=backbone.param_dtype,
            rope_theta=backbone.rope_theta,
            norm_eps=backbone.norm_eps,
            init_std=backbone.init_std,
            attention=backbone.attention,
            remat=backbone.remat,
            scan_layers=backbone.scan_layers,
        )


@dataclass
class DataConfig:
    """Where text comes from, how it is tokenized, and how it is cut into windows."""

    corpus: list[str] = field(
        default_factory=list
    )  # files or globs; empty = embedded default corpus
    doc_split: str = "file"  # file | blank_line  (for plain text files)
    text_field: str = "text"  # the text field of .jsonl records and column of .parquet files
    tokenizer: str = ""  # a sentencepiece .model or an HF tokenizer.json; empty = train one
    tokenizer_vocab_size: int = 2048
    tokenizer_type: str = "bpe"  # bpe | unigram
    dataset: str = ""  # an existing tokenized dataset directory; empty = tokenize into the run dir
    eval_fraction: float = 0.05  # fraction of documents held out for eval
    eval_datasets: list[str] = field(default_factory=list)  # extra named held-out datasets
    seq_len: int = 128
    seed: int = 0
    max_default_corpus_mb: float = 4.0

    def validate(self) -> None:
        _check(0 <= self.seed < 2**32, f"data.seed={self.seed} (expected 0 <= seed < 2**32)")
        _check(
            self.doc_split in ("file", "blank_line"),
            f"data.doc_split={self.doc_split!r} (expected 'file' or 'blank_line')",
        )
        _check(
            self.tokenizer_type in ("bpe", "unigram"),
            f"data.tokenizer_type={self.tokenizer_type!r} (expected 'bpe' or 'unigram')",
        )
        _check(
            self.tokenizer_vocab_size >= 260,  # 256 byte-fallback pieces + unk/bos/eos + 1
            f"data.tokenizer_vocab_size={self.tokenizer_vocab_size} (expected >= 260)",
        )
        _check(
            0.0 <= self.eval_fraction < 1.0,
            f"data.eval_fraction={self.eval_fraction} (expected 0 <= f < 1)",
        )
        _check(self.seq_len >= 2, f"data.seq_len={self.seq_len} (expected >= 2)")
        _check(
            self.max_default_corpus_mb > 0,
            f"data.max_default_corpus_mb={self.max_default_corpus_mb} (expected > 0)",
        )


@dataclass
class MeshConfig:
    """Device mesh sizes; exactly one axis may be -1 (= all remaining devices).

    `rules` overrides entries of the logical-axis rules table (sharding/rules.py), e.g.
    `{mlp: null}` to stop sharding the MLP over `tensor`.
    """

    data: int = -1
    fsdp: int = 1
    tensor: int = 1
    rules: dict[str, str | list[str] | None] = field(default_factory=dict)

    def validate(self) -> None:
        sizes = (self.data, self.fsdp, self.tensor)
        _check(
            all(s == -1 or s >= 1 for s in sizes),
            f"mesh sizes data={self.data} fsdp={self.fsdp} tensor={self.tensor} (expected >= 1 or "
            "-1)",
        )
        _check(
            sizes.count(-1) <= 1,
            f"mesh: at most one axis may be -1, got data={self.data} fsdp={self.fsdp} "
            f"tensor={self.tensor}",
        )


@dataclass
class OptimConfig:
    """AdamW with linear warmup and cosine decay to `min_lr_ratio * lr`, global-norm clipping."""

    lr: float = 3e-3
    warmup_steps: int = 20
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0  # 0 = no clipping
    fgram_lr_scale: float = 1.0  # the f-gram model's learning rate as a multiple of `lr`
    fgram_weight_decay: float | None = None  # the f-gram model's own decay (None: weight_decay)

    def validate(self) -> None:
        for name in ("lr", "eps", "fgram_lr_scale"):
            value = getattr(self, name)
            _check(_positive(value), f"optim.{name}={value} (expected a finite value > 0)")
        for name in ("weight_decay", "grad_clip"):
            value = getattr(self, name)
            _check(_non_negative(value), f"optim.{name}={value} (expected a finite value >= 0)")
        _check(self.warmup_steps >= 0, f"optim.warmup_steps={self.warmup_steps} (expected >= 0)")
        _check(
            0 <= self.min_lr_ratio <= 1, f"optim.min_lr_ratio={self.min_lr_ratio} (expected 0..1)"
        )
        _check(
            0 <= self.beta1 < 1 and 0 <= self.beta2 < 1,
            f"optim betas ({self.beta1}, {self.beta2}) (expected in [0, 1))",
        )
        _check(
            self.fgram_weight_decay is None or _non_negative(self.fgram_weight_decay),
            f"optim.fgram_weight_decay={self.fgram_weight_decay} (expected a finite value >= 0, "
            "or null for optim.weight_decay)",
        )


@dataclass
class TrainConfig:
    """`profile_steps: [a, b]` traces the steps that take the state from step a to step b
    (docs/training.md)."""

    steps: int = 200
    batch_size: int = 16  # global batch, in windows of data.seq_len tokens
    # gradient accumulation: the step runs the batch as this many microbatches (of batch_size /
    # microbatches rows each), summing gradients; the update equals the whole batch's
    microbatches: int = 1
    devices: int = 0  # the device count this config's global batch is meant for (`plan`); 0 = 8
    seed: int = 0
    eval_every: int = 50  # 0 = only at the end
    eval_batches: int = 8
    log_every: int = 10
    profile_steps: list[int] = field(default_factory=list)  # [start, stop): a profiler trace
    profile_process: int = 0  # the process that traces; -1 = every process

    def validate(self) -> None:
        _check(self.steps > 0, f"train.steps={self.steps} (expected > 0)")
        _check(0 <= self.seed < 2**32, f"train.seed={self.seed} (expected 0 <= seed < 2**32)")
        window = self.profile_steps
        _check(
            not window or (len(window) == 2 and 0 <= window[0] < window[1] <= self.steps),
            f"train.profile_steps={window} (expected [] or [start, stop] with "
            f"0 <= start < stop <= train.steps={self.steps})",
        )
        _check(
            self.profile_process >= -1,
            f"train.profile_process={self.profile_process} (expected a process index or -1)",
        )
        _check(self.batch_size > 0, f"train.batch_size={self.batch_size} (expected > 0)")
        _check(
            self.microbatches > 0 and self.batch_size % self.microbatches == 0,
            f"train.microbatches={self.microbatches} (expected a divisor of "
            f"train.batch_size={self.batch_size})",
        )
        _check(self.devices >= 0, f"train.devices={self.devices} (expected >= 0; 0 = 8)")
        _check(self.eval_every >= 0, f"train.eval_every={self.eval_every} (expected >= 0)")
        _check(self.eval_batches > 0, f"train.eval_batches={self.eval_batches} (expected > 0)")
        _check(self.log_every > 0, f"train.log_every={self.log_every} (expected > 0)")


@dataclass
class CheckpointConfig:
    every: int = 100  # save every N steps (and at the end, and on SIGTERM/SIGINT)
    keep: int = 3
    async_save: bool = True
    # an eval set's name (e.g. heldout): also keep the parameters of its lowest loss so far in
    # RUN_DIR/best_checkpoint/ (`--step best` in eval and export); "" keeps no best
    keep_best: str = ""

    def validate(self) -> None:
        _check(self.every > 0, f"checkpoint.every={self.every} (expected > 0)")
        _check(self.keep > 0, f"checkpoint.keep={self.keep} (expected > 0)")


@dataclass
class LoggingConfig:
    tensorboard: bool = True
    progress: bool = True  # a bar on stderr on a terminal, else plain lines (process 0 only)

    def validate(self) -> None:
        pass


@dataclass
class Config:
    run_dir: str = "runs/default"
    model: ModelConfig = field(default_factory=ModelConfig)
    fgrams: FgramConfig = field(default_factory=FgramConfig)
    data: DataConfig = field(default_factory=DataConfig)
    mesh: MeshConfig = field(default_factory=MeshConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)

    @property
    def dropout_seed(self) -> int | None:
        """The seed of the train step's random noise, or None when the model has none."""
        noisy = self.fgrams.enabled and self.fgrams.embed_drop_rate > 0
        return self.train.seed if noisy else None

    def validate(self) -> None:
        _check(bool(self.run_dir), "run_dir is empty (expected a directory path)")
        for section in (
            self.model,
            self.fgrams,
            self.data,
            self.mesh,
            self.optim,
            self.train,
            self.checkpoint,
            self.logging,
        ):
            section.validate()
        if self.fgrams.enabled:
            self.fgrams.model_config(self.model).validate()
        _check(
            not self.checkpoint.keep_best or self.train.eval_every > 0,
            f"checkpoint.keep_best={self.checkpoint.keep_best} needs train.eval_every > 0 "
            "(the best is chosen among the evaluations during training)",
        )
        _check(
            self.data.seq_len <= self.model.max_seq_len,
            f"data.seq_len={self.data.seq_len} exceeds model.max_seq_len={self.model.max_seq_len}",
        )
