"""Typed configuration shared by every component: a pydantic model per component.

Each component owns a :class:`Config` subclass beside it, with one docstring per field (pydantic reads
them as the field descriptions). Unknown keys are rejected and values are type-checked; failures raise
:class:`ConfigError` with one line per bad key and the list of valid keys.
"""

from __future__ import annotations

from typing import Any, Self

from pydantic import BaseModel, ConfigDict, ValidationError


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
