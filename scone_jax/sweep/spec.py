"""A sweep file: one base config, overrides shared by every point, named points and a grid.

    name: cpu_num_fgrams
    config: ../tiny_scone.yaml          # a config path (relative to this file) or a preset name
    overrides: {train.steps: 500}        # applied to every point
    eval_corpora:                        # extra held-out corpora, tokenized once with the
                                         # sweep's tokenizer
      shakespeare: ${SCONE_SHARED_DATA:-../shared/data}/tinyshakespeare/input.txt
    points:                              # named points, e.g. the baselines
      baseline: {fgrams.enabled: false}
    grid:                                # every combination becomes a point named
                                         # key-value_key-value
      fgrams.num_fgrams: [1000, 4000]
      fgrams.model_size: [0.5x, 1x]

Strings may use `${VAR}` or `${VAR:-default}`; an unset variable without a default is an error.
"""

from __future__ import annotations

import itertools
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from scone_jax.config.load import PRESET_DIR, load_yaml, resolve_preset, yaml_problem
from scone_jax.errors import UserError

KEYS = {"name", "description", "config", "overrides", "eval_corpora", "points", "grid"}
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclass
class Point:
    """One run of the sweep: its directory name, its overrides and the values of the grid axes."""

    name: str
    overrides: dict[str, Any]
    axes: dict[str, Any] = field(default_factory=dict)


@dataclass
class SweepSpec:
    name: str
    path: Path
    config: Path
    overrides: dict[str, Any]
    eval_corpora: dict[str, str]
    points: list[Point]
    description: str = ""


def expand_vars(text: str, where: str) -> str:
    def substitute(match: re.Match) -> str:
        name, default = match.group(1), match.group(2)
        if name in os.environ:
            return os.environ[name]
        if default is None:
            raise UserError(
                f"{where}: environment variable {name} is not set (or give ${{{name}:-default}})"
            )
        return default

    return _VAR.sub(substitute, text)


def _expand(value: Any, where: str) -> Any:
    if isinstance(value, str):
        return expand_vars(value, where)
    if isinstance(value, list):
        return [_expand(v, where) for v in value]
    if isinstance(value, dict):
        return {k: _expand(v, where) for k, v in value.items()}
    return value


def format_value(value: Any) -> str:
    """A value as a `key=value` override reads it back (YAML flow style)."""
    text = yaml.safe_dump(value, default_flow_style=True, width=1 << 30).strip()
    return text.removesuffix("...").strip()


def _mapping(value: Any, where: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise UserError(f"{where} must be a mapping of 'section.key: value', got {value!r}")
    return value


def _point_name(axes: dict[str, Any]) -> str:
    parts = []
    for key, value in axes.items():
        text = re.sub(r"[^A-Za-z0-9._-]+", "-", format_value(value)).strip("-")
        parts.append(f"{key.rsplit('.', 1)[-1]}-{text}")
    return "_".join(parts)


def _grid_points(grid: dict, where: str) -> list[Point]:
    if not grid:
        return []
    for key, values in grid.items():
        if not isinstance(values, list) or not values:
            raise UserError(f"{where}.{key} must be a non-empty list of values, got {values!r}")
    keys = list(grid)
    points = []
    for combo in itertools.product(*(grid[k] for k in keys)):
        axes = dict(zip(keys, combo))
        points.append(Point(name=_point_name(axes), overrides=dict(axes), axes=axes))
    return points


def load_sweep(path: str | os.PathLike) -> SweepSpec:
    """Read and check a sweep file (safe YAML); every point gets a unique directory name."""
    path = Path(path)
    if not path.is_file() and (PRESET_DIR / "sweeps" / f"{path}.yaml").is_file():
        path = PRESET_DIR / "sweeps" / f"{path}.yaml"
    try:
        data = load_yaml(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(
            f"sweep file {path} not found (expected a YAML file or a name in "
            f"{PRESET_DIR / 'sweeps'})"
        ) from None
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"cannot read sweep file {path}: {e}") from None
    except yaml.YAMLError as e:
        raise UserError(f"sweep file {path} is not valid YAML: {yaml_problem(e)}") from None
    if not isinstance(data, dict):
        raise UserError(f"sweep file {path} must be a mapping at the top level")
    unknown = sorted(set(data) - KEYS)
    if unknown:
        raise UserError(f"sweep file {path}: unknown key(s) {unknown} (expected {sorted(KEYS)})")
    where = f"sweep file {path}"
    data = _expand(data, where)
    name = str(data.get("name") or path.stem)
    if not _NAME.match(name):
        raise UserError(f"{where}: name {name!r} (expected letters, digits, '.', '_' or '-')")
    if "config" not in data:
        raise UserError(f"{where}: missing 'config' (the base config path or preset name)")
    config = path.parent / str(data["config"])
    config = config if config.is_file() else resolve_preset(str(data["config"]))
    eval_corpora = {
        str(k): str(v)
        for k, v in _mapping(data.get("eval_corpora"), f"{where}: eval_corpora").items()
    }
    for corpus_name in eval_corpora:
        if not _NAME.match(corpus_name) or corpus_name == "train":
            raise UserError(
                f"{where}: eval corpus name {corpus_name!r} (expected letters, digits, '.', "
                "'_' or '-', and not 'train')"
            )
    points = [
        Point(name=str(n), overrides=_mapping(o, f"{where}: points.{n}"))
        for n, o in _mapping(data.get("points"), f"{where}: points").items()
    ]
    points += _grid_points(_mapping(data.get("grid"), f"{where}: grid"), f"{where}: grid")
    if not points:
        raise UserError(f"{where}: no points (expected 'points', 'grid' or both)")
    seen: set[str] = set()
    for point in points:
        if not _NAME.match(point.name) or point.name in seen:
            raise UserError(
                f"{where}: point name {point.name!r} is "
                f"{'repeated' if point.name in seen else 'invalid'} (expected unique names of "
                "letters, digits, '.', '_' or '-')"
            )
        seen.add(point.name)
    return SweepSpec(
        name=name,
        path=path,
        config=config,
        description=str(data.get("description", "")),
        overrides=_mapping(data.get("overrides"), f"{where}: overrides"),
        eval_corpora=eval_corpora,
        points=points,
    )
