"""The one table from logical axis names to mesh axes, and the helpers that apply it.

Every parameter carries `logical_axes` metadata (e.g. `("embed", "mlp")`) and every main
activation is constrained with `constrain(x, ("batch", "seq", "embed"))`. Changing a row of
`DEFAULT_RULES` (or `mesh.rules` in the config) re-shards the whole model without touching it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Mapping, Sequence

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from scone_jax.errors import UserError

MeshAxes = str | tuple[str, ...] | None

# logical name -> mesh axis (or axes, or None = replicated). FSDP shards the embed dimension
# of every weight; tensor parallelism shards heads, the MLP hidden dimension and the vocab.
DEFAULT_RULES: dict[str, MeshAxes] = {
    "batch": ("data", "fsdp"),
    "seq": None,
    "embed": "fsdp",
    "vocab": "tensor",
    "heads": "tensor",
    "kv_heads": "tensor",
    "head_dim": None,
    "mlp": "tensor",
    "qkv": None,
    "positions": None,
    "norm": None,
    "backbone_embed": "fsdp",  # the backbone-width side of the f-gram model's projections
    "layers": None,  # the stacked axis of scanned blocks (model.scan_layers): each device has all
}

# The f-gram model (SCONE) names its axes "fgram/<name>" (see `axis_namespace`). A
# "fgram/<name>" row, when present, overrides "<name>" for the f-gram model only, so its
# layout is a config change (`mesh.rules={fgram/mlp: null}`); absent, it follows the backbone.
NAMESPACES = ("fgram/",)

MESH_AXES = ("data", "fsdp", "tensor")


def make_rules(overrides: Mapping[str, object] | None = None) -> dict[str, MeshAxes]:
    """DEFAULT_RULES with config overrides applied; unknown names or axes are a UserError."""
    rules = dict(DEFAULT_RULES)
    for name, target in (overrides or {}).items():
        base = next((name[len(ns) :] for ns in NAMESPACES if name.startswith(ns)), name)
        if base not in DEFAULT_RULES:
            raise UserError(
                f"mesh.rules: unknown logical axis {name!r} (expected one of {sorted(rules)})"
            )
        if isinstance(target, list):
            target = tuple(target)
        axes = (target,) if isinstance(target, str) else (target or ())
        for axis in axes:
            if axis not in MESH_AXES:
                raise UserError(
                    f"mesh.rules.{name}: unknown mesh axis {axis!r} (expected one of {MESH_AXES} "
                    "or null)"
                )
        rules[name] = target
    return rules


def _lookup(name: str, rules: Mapping[str, MeshAxes]) -> MeshAxes:
    if name in rules:
        return rules[name]
    for ns in NAMESPACES:
        if name.startswith(ns) and name[len(ns) :] in rules:
            return rules[name[len(ns) :]]
    raise KeyError(f"logical axis {name!r} has no rule in the rules table")


def logical_to_spec(names: Sequence[str | None], rules: Mapping[str, MeshAxes]) -> PartitionSpec:
    """Map logical names to a PartitionSpec; a mesh axis is used at most once per spec."""
    used: set[str] = set()
    out = []
    for name in names:
        target = _lookup(name, rules) if name is not None else None
        axes = (target,) if isinstance(target, str) else tuple(target or ())
        axes = tuple(a for a in axes if a not in used)
        used.update(axes)
        out.append(None if not axes else axes[0] if len(axes) == 1 else axes)
    return PartitionSpec(*out)


def fit_spec(spec: PartitionSpec, shape: Sequence[int], mesh: Mesh) -> PartitionSpec:
    """Drop mesh axes that do not divide a dimension (e.g. a 2-wide bias over 4 devices)."""
    out = []
    for dim, entry in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec))):
        axes = (entry,) if isinstance(entry, str) else tuple(entry or ())
        kept = []
        size = 1
        for axis in axes:
            if dim % (size * mesh.shape[axis]) == 0:
                kept.append(axis)
                size *= mesh.shape[axis]
        out.append(None if not kept else kept[0] if len(kept) == 1 else tuple(kept))
    return PartitionSpec(*out)


def named_sharding(
    names: Sequence[str | None], shape: Sequence[int], mesh: Mesh, rules: Mapping[str, MeshAxes]
) -> NamedSharding:
    return NamedSharding(mesh, fit_spec(logical_to_spec(names, rules), shape, mesh))


# --- namespaces and activation constraints ----------------------------------------------

_context = threading.local()


@contextlib.contextmanager
def axis_namespace(prefix: str) -> Iterator[None]:
    """Inside this block, logical names given to `axis_names` and `constrain` get `prefix`."""
    if prefix not in NAMESPACES:
        raise ValueError(f"unknown axis namespace {prefix!r}")
    previous = getattr(_context, "prefix", "")
    _context.prefix = prefix
    try:
        yield
    finally:
        _context.prefix = previous


def axis_names(names: Sequence[str | None]) -> tuple[str | None, ...]:
    """Logical names in the current namespace (what parameters and activations record)."""
    prefix = getattr(_context, "prefix", "")
    return tuple(n if n is None or not prefix else prefix + n for n in names)


@contextlib.contextmanager
def activation_sharding(mesh: Mesh, rules: Mapping[str, MeshAxes]) -> Iterator[None]:
    """Within this block (while tracing), `constrain` pins activations to the mesh."""
    previous = getattr(_context, "value", None)
    _context.value = (mesh, rules)
    try:
        yield
    finally:
        _context.value = previous


def constrain(x: jax.Array, names: Sequence[str | None]) -> jax.Array:
    """`with_sharding_constraint` by logical names; a no-op outside `activation_sharding`."""
    ctx = getattr(_context, "value", None)
    if ctx is None:
        return x
    mesh, rules = ctx
    return jax.lax.with_sharding_constraint(
        x, named_sharding(axis_names(names), x.shape, mesh, rules)
    )
