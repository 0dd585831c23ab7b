"""Typed configuration shared by every component: a pydantic model per component.

Each component owns a :class:`Config` subclass beside it, with one docstring per field (pydantic reads
them as the field descriptions). Unknown keys are rejected and values are type-checked; failures raise
:class:`ConfigError` with one line per bad key and the list of valid keys.

A run's configuration (``agentrl train``'s :class:`~agentrl.rl.config.TrainConfig`, ``agentrl
sft``'s :class:`~agentrl.sft.config.SFTConfig`) is a :class:`RunConfig`: its fields are the
components' configs as sections, read from one YAML file with dotted ``key.sub=value`` overrides
(:func:`read_values`), documented by :func:`config_reference` (``--help-config``) and the
generated Markdown page (:func:`reference_markdown`). A key that moved is still read for one
release under its old name (:attr:`RunConfig.MOVED_KEYS`), with a warning naming the new key.
"""

from __future__ import annotations

import argparse
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Self, TypeVar, overload

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

if TYPE_CHECKING:
    from rich.console import Console

C = TypeVar("C")


class ConfigError(ValueError):
    """A configuration was given an unknown key or an ill-typed value."""


class Config(BaseModel):
    """Base class for component configs: strict keys, field docs from attribute docstrings."""

    model_config = ConfigDict(
        extra="forbid",
        use_attribute_docstrings=True,
        validate_default=True,
        arbitrary_types_allowed=True,
        frozen=True,
    )

    @classmethod
    def build(cls, where: str, values: dict[str, Any]) -> Self:
        """Validate ``values`` into this config; ``where`` names the component in error messages."""
        try:
            return cls(**values)
        except ValidationError as exc:
            raise ConfigError(describe_errors(cls, where, exc)) from None

    @classmethod
    def describe_fields(cls) -> list[tuple[str, str, str]]:
        """(name, default, description) for each field, for help texts and docs."""
        return [
            (name, repr(field.default), field.description or "")
            for name, field in cls.model_fields.items()
        ]


def describe_errors(cls: type[Config], where: str, exc: ValidationError) -> str:
    lines = [f"{where}: invalid configuration"]
    for error in exc.errors():
        key = ".".join(str(part) for part in error["loc"]) or "(root)"
        if error["type"] == "extra_forbidden":
            lines.append(f"  - {key}: unknown key")
        else:
            lines.append(f"  - {key}: {error['msg']} (got {error.get('input')!r})")
    lines.append(f"  valid keys: {', '.join(cls.model_fields)}")
    return "\n".join(lines)


def registered(value: str, names: Iterable[str], what: str) -> str:
    """``value`` if it is one of ``names`` (a registry's keys), else ``ValueError`` listing them:
    the check of a config field whose allowed values come from a registry."""
    names = list(names)
    if value not in names:
        raise ValueError(f"unknown {what} {value!r}; registered: {names}")
    return value


class RunConfig(Config):
    """A run's configuration: components' configs as sections, read from YAML with overrides."""

    WHAT: ClassVar[str] = "config"
    """What the file is, in error messages (``train config``)."""
    MOVED_KEYS: ClassVar[dict[str, str]] = {}
    """Old dotted key -> its new dotted key, read with a warning for one release."""

    @classmethod
    def load(cls, path: str | Path | None = None, overrides: list[str] | None = None) -> Self:
        """Read ``path`` (YAML; None: all defaults), apply ``key.sub=value`` overrides, validate."""
        return cls.build(str(path or cls.WHAT), read_values(path, overrides))

    @classmethod
    def build(cls, where: str, values: dict[str, Any]) -> Self:
        """Validate ``values`` (nested sections), after moving keys of :attr:`MOVED_KEYS`."""
        values = move_keys(values, cls.MOVED_KEYS, where)
        try:
            return cls(**values)
        except ValidationError as exc:
            raise ConfigError(describe_nested_errors(cls, where, exc)) from None

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)


def move_keys(values: dict[str, Any], moved: dict[str, str], where: str) -> dict[str, Any]:
    """``values`` with each old dotted key of ``moved`` that is set put under its new key, each
    with a ``FutureWarning`` naming the new key; both set is a :class:`ConfigError`."""
    for old, new in moved.items():
        *old_parents, old_leaf = old.split(".")
        section = _section_values(values, old_parents, where)
        if section is None or old_leaf not in section:
            continue
        *new_parents, new_leaf = new.split(".")
        target = _section_values(values, new_parents, where, create=True)
        if new_leaf in target:
            raise ConfigError(f"{where}: {old} and {new} both set; {old} is the old name of {new}")
        target[new_leaf] = section.pop(old_leaf)
        warnings.warn(
            f"{where}: {old} is deprecated and goes in the next release; use {new}",
            FutureWarning,
            stacklevel=3,
        )
    return values


@overload
def _section_values(
    values: dict[str, Any], path: list[str], where: str, *, create: Literal[True]
) -> dict[str, Any]: ...
@overload
def _section_values(
    values: dict[str, Any], path: list[str], where: str, *, create: bool = False
) -> dict[str, Any] | None: ...
def _section_values(
    values: dict[str, Any], path: list[str], where: str, *, create: bool = False
) -> dict[str, Any] | None:
    """The mapping of the section at dotted ``path`` in ``values``: None where a part is missing
    or no mapping; with ``create``, missing sections are added and a part that is no mapping is a
    :class:`ConfigError` (``where``: what the values are, in its message)."""
    node = values
    for part in path:
        child = node.setdefault(part, {}) if create else node.get(part)
        if not isinstance(child, dict):
            if create:
                raise ConfigError(f"{where}: {part} is not a section")
            return None
        node = child
    return node


def read_values(path: str | Path | None, overrides: list[str] | None) -> dict[str, Any]:
    """The YAML mapping in ``path`` (None: empty) with ``key.sub=value`` overrides applied."""
    values: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file {path} does not exist")
        loaded = yaml.safe_load(path.read_text())
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"{path}: expected a mapping of sections, got {type(loaded)}")
        values = loaded or {}
    for item in overrides or []:
        apply_override(values, item)
    return values


def apply_override(values: dict[str, Any], item: str) -> None:
    """Set ``values[a][b] = parsed`` for ``item = "a.b=parsed"`` (the value is read as YAML)."""
    key, sep, raw = item.partition("=")
    if not sep or not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override {item!r}: expected section.key=value")
    try:
        value = yaml.safe_load(raw) if raw else ""
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {item!r}: the value is not valid YAML ({exc})") from None
    *parents, leaf = key.split(".")
    _section_values(values, parents, f"override {item!r}", create=True)[leaf] = value


def describe_nested_errors(cls: type[Config], where: str, exc: ValidationError) -> str:
    """One line per bad key (dotted), each with the valid keys of the section it is in."""
    lines = [f"{where}: invalid configuration"]
    for error in exc.errors():
        loc = [str(part) for part in error["loc"]]
        key = ".".join(loc) or "(root)"
        section = _section(cls, loc[:-1])
        if error["type"] == "extra_forbidden":
            valid = ", ".join(section.model_fields) if section else "?"
            lines.append(f"  - {key}: unknown key (valid keys here: {valid})")
        elif not loc or isinstance(error.get("input"), dict):  # a check across keys
            lines.append(f"  - {key}: {error['msg']}")
        else:
            lines.append(f"  - {key}: {error['msg']} (got {error.get('input')!r})")
    return "\n".join(lines)


def _section(cls: type[Config], path: list[str]) -> type[Config] | None:
    node = cls
    for part in path:
        field = node.model_fields.get(part)
        annotation = field.annotation if field is not None else None
        if not (isinstance(annotation, type) and issubclass(annotation, Config)):
            return None
        node = annotation
    return node


def config_reference(cls: type[Config], prefix: str = "") -> list[tuple[str, str, str]]:
    """(dotted key, default, description) for every leaf key, for ``--help-config`` and docs."""
    rows = []
    for name, field in cls.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, Config):
            rows.extend(config_reference(annotation, f"{prefix}{name}."))
        else:
            default = field.get_default(call_default_factory=True)
            rows.append((f"{prefix}{name}", repr(default), field.description or ""))
    return rows


def reference_markdown(cls: type[Config], title: str, intro: str) -> str:
    """Every key of ``cls`` as a Markdown page: ``title``, ``intro`` and one table row per key
    (the generated ``docs/*_config.md`` pages, which tests keep in sync)."""
    lines = [
        f"# {title}",
        "",
        intro.strip(),
        "",
        "| key | default | description |",
        "|---|---|---|",
    ]
    for key, default, description in config_reference(cls):
        text = " ".join(description.split()).replace("|", "\\|")
        lines.append(f"| `{key}` | `{default}` | {text} |")
    return "\n".join(lines) + "\n"


def add_arguments(
    parser: argparse.ArgumentParser, example: str = "trainer.steps=50 actor.lr=5e-6"
) -> None:
    """A config file, its overrides and ``--help-config`` (``agentrl train`` and ``agentrl sft``)."""
    parser.add_argument("config", nargs="?", type=Path, help="YAML config (see examples/)")
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY=VALUE",
        help=f"dotted overrides with YAML values, e.g. {example}",
    )
    parser.add_argument(
        "--help-config", action="store_true", help="list every config key with its default"
    )
    parser.add_argument(
        "--markdown", action="store_true", help="with --help-config: print a Markdown table"
    )


def config_from_args(
    args: argparse.Namespace,
    command: str,
    config_class: type[Config],
    load: Callable[[Path | None, list[str]], C],
    markdown: Callable[[], str],
    console: Console,
) -> C | int:
    """The config ``args`` names (a YAML file and dotted overrides), loaded by ``load``; or the
    exit code when there is nothing to run: 0 once ``--help-config`` printed every key of
    ``config_class`` (``markdown()`` with ``--markdown``), 2 once a bad config's error is printed.
    Shared by ``agentrl train`` and ``agentrl sft``."""
    from rich.table import Table

    if args.help_config and args.markdown:
        print(markdown(), end="")
        return 0
    if args.help_config:
        table = Table("key", "default", "description", title=f"{command} configuration")
        for key, default, description in config_reference(config_class):
            table.add_row(key, default, description)
        console.print(table)
        return 0
    if args.config is None:
        raise SystemExit(f"{command}: give a config file (see examples/) or --help-config")
    try:
        return load(args.config, args.overrides)
    except ConfigError as exc:
        console.print(f"[red]{exc}[/red]", highlight=False)
        return 2
