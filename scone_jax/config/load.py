"""YAML presets + `key=value` overrides -> a validated `Config`.

Strict: an unknown key, a value of the wrong type or an invalid value is a `UserError`
naming the key and what was expected. YAML is read with a safe loader only (`load_yaml`: no
Python objects, no repeated keys). A config may name another in `base:` (a path relative to
itself, or a shipped preset's name); its keys are applied first.
"""

from __future__ import annotations

import dataclasses
import os
import re
import types
import typing
from pathlib import Path
from typing import Any

import yaml

from scone_jax.atomic import atomic_write_text
from scone_jax.config.schema import Config
from scone_jax.errors import UserError

PRESET_DIR = Path(__file__).resolve().parents[2] / "experiments"
# (section, old key) -> new key
ALIASES = {("data", "jsonl_field"): "text_field"}
_FLOAT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


class _NoRepeatedKeys(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a mapping that names a key twice: plain YAML keeps the
    last, so a second `train:` section or a point given twice would silently drop the first."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue  # `<<: *anchor`: the base class merges it, and a key may override it
                key = self.construct_object(key_node, deep=deep)
                if not isinstance(key, typing.Hashable):
                    continue  # the base class reports an unhashable key
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None,
                        None,
                        f"key {key!r} is repeated (line {key_node.start_mark.line + 1})",
                        key_node.start_mark,
                    )
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


def yaml_problem(error: yaml.YAMLError) -> str:
    """What is wrong and where, on one line: `line 3, column 2: expected ',' or ']', but got
    ':' (while parsing a flow sequence)`."""
    mark = getattr(error, "problem_mark", None)
    problem = getattr(error, "problem", None) or str(error).splitlines()[0]
    context = getattr(error, "context", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    return " ".join(f"{where}{problem}{f' ({context})' if context else ''}".split())


def load_yaml(text: str) -> Any:
    """The one YAML reader: safe (no Python objects) and strict about repeated keys."""
    loader = _NoRepeatedKeys(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def shipped_preset(name: str) -> Path | None:
    """experiments/NAME or experiments/NAME.yaml, where one is a file."""
    for candidate in (PRESET_DIR / name, PRESET_DIR / f"{name}.yaml"):
        if candidate.is_file():
            return candidate
    return None


def resolve_preset(name_or_path: str) -> Path:
    """A config path, or the name of a shipped preset (`tiny` -> experiments/tiny.yaml). A bare
    preset name means the preset even beside a file or run directory of that name (a run_dir
    named after its preset is common); `./NAME` names the local file."""
    path = Path(name_or_path)
    is_bare = "/" not in name_or_path and path.suffix not in (".yaml", ".yml")
    if is_bare and (preset := shipped_preset(name_or_path)) is not None:
        return preset
    if path.is_file():
        return path
    if path.exists():
        raise UserError(
            f"config {name_or_path!r} is not a file (expected a YAML file or a preset name)"
        )
    if (preset := shipped_preset(name_or_path)) is not None:
        return preset
    raise UserError(
        f"config {name_or_path!r} not found (expected a YAML file or a preset name in {PRESET_DIR})"
    )


def _read_yaml(path: Path, seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    path = path.resolve()
    if path in seen:
        raise UserError(f"config {path}: 'base' chain loops back to itself")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise UserError(
            f"config {path} is not valid UTF-8 at byte offset {e.start} (expected a UTF-8 YAML "
            "file)"
        ) from None
    except OSError as e:
        raise UserError(f"cannot read config {path}: {e.strerror or e}") from None
    try:
        data = load_yaml(text) or {}
    except yaml.YAMLError as e:
        raise UserError(f"config {path} is not valid YAML: {yaml_problem(e)}") from None
    if not isinstance(data, dict):
        raise UserError(
            f"config {path} must be a mapping at the top level, got {type(data).__name__}"
        )
    base = data.pop("base", None)
    if base is None:
        return data
    beside = path.parent / str(base)
    target = beside if beside.is_file() else shipped_preset(str(base))
    if target is None:
        raise UserError(
            f"config {path}: base {base!r} is neither a file beside it nor a preset name "
            f"(expected a path relative to {path.parent}, or a preset in {PRESET_DIR})"
        )
    merged = _read_yaml(target, seen + (path,))
    _deep_merge(merged, data)
    return merged


def _deep_merge(into: dict, new: dict) -> None:
    for key, value in new.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict) and key != "rules":
            _deep_merge(into[key], value)
        else:
            into[key] = value


def _type_name(tp) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(value: Any, tp, key: str) -> Any:
    """Check `value` against the annotation `tp`; ints are accepted for floats, nothing else is
    converted."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        for arm in typing.get_args(tp):
            if arm is type(None) and value is None:
                return None
            try:
                return _coerce(value, arm, key)
            except UserError:
                continue
        raise UserError(
            f"config key {key}={value!r} has the wrong type (expected {_type_name(tp)})"
        )
    if origin is list:
        (item,) = typing.get_args(tp)
        if isinstance(value, str | int | float) and not isinstance(value, bool) and item is str:
            value = [str(value)] if not isinstance(value, str) else [value]
        if not isinstance(value, list):
            raise UserError(f"config key {key}={value!r} has the wrong type (expected a list)")
        return [_coerce(v, item, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        ktp, vtp = typing.get_args(tp)
        if not isinstance(value, dict):
            raise UserError(f"config key {key}={value!r} has the wrong type (expected a mapping)")
        return {_coerce(k, ktp, key): _coerce(v, vtp, f"{key}.{k}") for k, v in value.items()}
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str) and _FLOAT.fullmatch(value.strip()):
            return float(value)  # YAML 1.1 reads 3e-4 (no dot) as a string
    elif tp is str:
        if isinstance(value, str):
            return value
    elif tp is type(None):
        if value is None:
            return None
    else:  # pragma: no cover - schema bug
        raise TypeError(f"unsupported config annotation {tp!r} for {key}")
    raise UserError(f"config key {key}={value!r} has the wrong type (expected {_type_name(tp)})")


def _build(cls, data: dict[str, Any], prefix: str):
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in data.items():
        full = f"{prefix}{key}"
        if key not in names:
            raise UserError(
                f"unknown config key {full!r} (expected one of: {', '.join(sorted(names))})"
            )
        tp = hints[key]
        if dataclasses.is_dataclass(tp):
            if not isinstance(value, dict):
                raise UserError(
                    f"config key {full}={value!r} has the wrong type (expected a mapping)"
                )
            kwargs[key] = _build(tp, value, f"{full}.")
        else:
            kwargs[key] = _coerce(value, tp, full)
    return cls(**kwargs)


def parse_overrides(overrides: list[str]) -> dict[str, Any]:
    """`["train.steps=10", "data.corpus=[a.txt, b.txt]"]` -> a nested dict; values parsed as
    YAML."""
    nested: dict[str, Any] = {}
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise UserError(f"override {item!r} is not of the form key=value")
        try:
            value = load_yaml(raw) if raw.strip() else ""
        except yaml.YAMLError as e:
            if raw.lstrip().startswith(("{", "[")):  # meant as a mapping or a list: say why not
                why = " ".join(str(getattr(e, "problem", None) or e).split())
                raise UserError(f"override {item!r}: {why} (expected a YAML value)") from None
            value = raw  # plain text that YAML reads otherwise (a path with ': ')
        parts = key.strip().split(".")
        if not all(parts):
            raise UserError(f"override {item!r}: its key has an empty part (expected section.key)")
        node = nested
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise UserError(f"override {item!r} conflicts with an earlier override of {part!r}")
        node[parts[-1]] = value
    return nested


def _apply_aliases(data: dict[str, Any]) -> None:
    """Rename old keys (`data.jsonl_field`) to their new names, so older configs still load."""
    for (section, old), new in ALIASES.items():
        part = data.get(section)
        if not isinstance(part, dict) or old not in part:
            continue
        value = part.pop(old)
        if new in part and part[new] != value:
            raise UserError(
                f"config keys {section}.{old}={value!r} and {section}.{new}={part[new]!r} "
                f"disagree ({old} is the old name of {new}; expected one of them)"
            )
        part[new] = value


def load_config(
    preset: str | os.PathLike | None = None, overrides: list[str] | None = None
) -> Config:
    """Read a preset (optional), apply overrides, build the typed config and validate it."""
    data: dict[str, Any] = _read_yaml(resolve_preset(str(preset))) if preset else {}
    _apply_aliases(data)
    overridden = parse_overrides(overrides or [])
    _apply_aliases(overridden)
    _deep_merge(data, overridden)
    config = _build(Config, data, "")
    config.validate()
    return config


def to_dict(config: Config) -> dict[str, Any]:
    return dataclasses.asdict(config)


def save_config(config: Config, path: str | os.PathLike) -> None:
    """Write the resolved config as YAML (atomically); `load_config(path)` reads it back."""
    atomic_write_text(path, yaml.safe_dump(to_dict(config), sort_keys=False))
