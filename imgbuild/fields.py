"""Typed fields for the recipe's model: one declaration gives the check, the frozen value and the JSON schema.

A model is a frozen, keyword-only dataclass whose fields are declared with `typed(check, default)`:

    @dataclass(frozen=True, kw_only=True)
    class User:
        name: str = typed(Text(matches(USER_RE, "not a valid user name")), "user")

`validate(User, data)` checks untrusted data (parsed YAML) against it and returns the model, or every issue
found, each with the data path it is about. Checks are plain functions, so nothing is built at import time:
loading this module and declaring the models costs about a millisecond, which `imgbuild validate` and
`render` pay on every start.

Conversions follow what a YAML author means and nothing more: a string field takes only a string (a bare
`24.05` is a number; quoting is the fix), an integer field also takes its digits as text (what `${VAR}`
interpolation gives), a flag takes true/false (and yes/no/on/off/1/0 as text).
"""

from __future__ import annotations

import abc
import dataclasses
import math
import re
from collections.abc import Callable
from typing import Any

MISSING: Any = dataclasses.MISSING
_BAD = object()  # a value that failed its check (its issue is already recorded)
_INT_TEXT = re.compile(r"[+-]?[0-9]{1,19}")
_FLOAT_TEXT = re.compile(r"[+-]?(?:[0-9]{1,30}(?:\.[0-9]{0,30})?|\.[0-9]{1,30})(?:[eE][+-]?[0-9]{1,3})?")
_TRUE = frozenset({"true", "yes", "on", "1", "t", "y"})
_FALSE = frozenset({"false", "no", "off", "0", "f", "n"})

Path = tuple[Any, ...]


@dataclasses.dataclass(frozen=True)
class Issue:
    """One thing wrong with the data: where (a path into it), what, a hint; `key` when the key is at fault."""

    at: Path
    message: str
    hint: str = ""
    key: bool = False


Rule = Callable[[Any], Any]  # returns the (possibly normalised) value, raises ValueError "message (hint)"


def _issue(at: Path, text: str, key: bool = False) -> Issue:
    message, hint = text, ""
    if text.endswith(")") and " (" in text:
        message, hint = text[:-1].split(" (", 1)
    return Issue(at, message, hint, key)


class Check(abc.ABC):
    """Checks one value; `check` returns the value to keep, or records issues and returns _BAD."""

    @abc.abstractmethod
    def check(self, value: Any, at: Path, issues: list[Issue], key: bool = False) -> Any: ...

    @abc.abstractmethod
    def schema(self, defs: dict[str, Any]) -> dict[str, Any]: ...


def matches(pattern: re.Pattern[str], what: str, hint: str = "") -> Rule:
    """A rule: the whole string matches `pattern` (fullmatch: `$` would let a final newline through)."""

    def rule(value: str) -> str:
        if not pattern.fullmatch(value):
            raise ValueError(f"{what}: {show(value)}" + (f" ({hint})" if hint else ""))
        return value

    rule.pattern = pattern  # type: ignore[attr-defined]  # the schema shows it
    return rule


def show(value: str) -> str:
    """A value quoted for an error message: bounded, control characters visible."""
    return repr(value[:60] + ("..." if len(value) > 60 else ""))


class Text(Check):
    def __init__(self, *rules: Rule, max_length: int | None = None, numbers: bool = False) -> None:
        self.rules, self.max_length, self.numbers = rules, max_length, numbers

    def check(self, value: Any, at: Path, issues: list[Issue], key: bool = False) -> Any:
        if self.numbers and isinstance(value, int) and not isinstance(value, bool):
            value = str(value)  # `OMP_NUM_THREADS: 4` means the text "4" (a YAML float arrives as its text)
        if not isinstance(value, str):
            quote = "quote it: YAML reads yes/no/on/off as booleans" if isinstance(value, bool) else "quote it"
            issues.append(Issue(at, "must be a string", quote, key))
            return _BAD
        if self.max_length is not None and len(value) > self.max_length:
            issues.append(Issue(at, f"must be at most {self.max_length} characters", f"it has {len(value)}", key))
            return _BAD
        for rule in self.rules:
            try:
                value = rule(value)
            except ValueError as exc:
                issues.append(_issue(at, str(exc), key))
                return _BAD
        return value

    def schema(self, defs: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "string"}
        if self.max_length is not None:
            out["maxLength"] = self.max_length
        patterns = [r.pattern.pattern for r in self.rules if hasattr(r, "pattern")]
        if patterns:  # JSON Schema patterns search: anchored, they mean what fullmatch means; groups unnamed
            out["pattern"] = "^(?:" + re.sub(r"\(\?P<\w+>", "(?:", patterns[0]) + ")$"
        return out


class Integer(Check):
    def __init__(self, ge: int | None = None, le: int | None = None) -> None:
        self.ge, self.le = ge, le

    def check(self, value: Any, at: Path, issues: list[Issue], key: bool = False) -> Any:
        if isinstance(value, str) and _INT_TEXT.fullmatch(value.strip()):
            value = int(value)
        if not isinstance(value, int) or isinstance(value, bool):
            issues.append(Issue(at, "must be an integer", "", key))
            return _BAD
        if self.ge is not None and value < self.ge:
            issues.append(Issue(at, f"must be greater than or equal to {self.ge}", "", key))
            return _BAD
        if self.le is not None and value > self.le:
            issues.append(Issue(at, f"must be less than or equal to {self.le}", "", key))
            return _BAD
        return value

    def schema(self, defs: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "integer"}
        if self.ge is not None:
            out["minimum"] = self.ge
        if self.le is not None:
            out["maximum"] = self.le
        return out


class Number(Check):
    def __init__(self, gt: float | None = None, ge: float | None = None) -> None:
        self.gt, self.ge = gt, ge

    def check(self, value: Any, at: Path, issues: list[Issue], key: bool = False) -> Any:
        if isinstance(value, str) and _FLOAT_TEXT.fullmatch(value.strip()):
            value = float(value)
        if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
            issues.append(Issue(at, "must be a finite number", "", key))
            return _BAD
        if self.gt is not None and not value > self.gt:
            issues.append(Issue(at, f"must be greater than {self.gt:g}", "", key))
            return _BAD
        if self.ge is not None and not value >= self.ge:
            issues.append(Issue(at, f"must be {self.ge:g} or more", "", key))
            return _BAD
        return float(value)

    def schema(self, defs: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "number"}
        if self.gt is not None:
            out["exclusiveMinimum"] = self.gt
        if self.ge is not None:
            out["minimum"] = self.ge
        return out


class Flag(Check):
    def check(self, value: Any, at: Path, issues: list[Issue], key: bool = False) -> Any:
        if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
            return value.strip().lower() in _TRUE
        if isinstance(value, int) and not isinstance(value, bool) and value in (0, 1):
            return bool(value)
        if not isinstance(value, bool):
            issues.append(Issue(at, "must be true or false", "", key))
            return _BAD
        return value

    def schema(self, defs: dict[str, Any]) -> dict[str, Any]:
        return {"type": "boolean"}


class OneOf(Check):
    def __init__(self, *values: str) -> None:
        self.values = values

    def check(self, value: Any, at: Path, issues: list[Issue], key: bool = False) -> Any:
        if not isinstance(value, str) or value not in self.values:
            issues.append(Issue(at, "must be " + " or ".join(repr(v) for v in self.values), "", key))
            return _BAD
        return value

    def schema(self, defs: dict[str, Any]) -> dict[str, Any]:
        return {"type": "string", "enum": list(self.values)}


class Maybe(Check):
    """The check, or null (the field is then unset)."""

    def __init__(self, inner: Check) -> None:
        self.inner = inner

    def check(self, value: Any, at: Path, issues: list[Issue], key: bool = False) -> Any:
        return None if value is None else self.inner.check(value, at, issues, key)

    def schema(self, defs: dict[str, Any]) -> dict[str, Any]:
        return {"anyOf": [self.inner.schema(defs), {"type": "null"}]}


class ListOf(Check):
    def __init__(self, item: Check, max_length: int | None = None, unique: bool = False) -> None:
        self.item, self.max_length, self.unique = item, max_length, unique

    def check(self, value: Any, at: Path, issues: list[Issue], key: bool = False) -> Any:
        if not isinstance(value, list):
            issues.append(Issue(at, "must be a list", "", key))
            return _BAD
        if self.max_length is not None and len(value) > self.max_length:
            issues.append(Issue(at, f"must have at most {self.max_length} items", f"it has {len(value)}", key))
            return _BAD
        out = [self.item.check(v, (*at, i), issues) for i, v in enumerate(value)]
        if any(v is _BAD for v in out):
            return _BAD
        if self.unique and (twice := next((i for i, v in enumerate(out) if v in out[:i]), None)) is not None:
            issues.append(Issue((*at, twice), "is named twice", "", key))
            return _BAD
        return out

    def schema(self, defs: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "array", "items": self.item.schema(defs)}
        if self.max_length is not None:
            out["maxItems"] = self.max_length
        if self.unique:
            out["uniqueItems"] = True
        return out


class ListOrText(Check):
    """A list of strings, or one string (an exec-form or shell-form command)."""

    def __init__(self, item: Text) -> None:
        self.item, self.items = item, ListOf(item)

    def check(self, value: Any, at: Path, issues: list[Issue], key: bool = False) -> Any:
        if isinstance(value, list):
            return self.items.check(value, at, issues, key)
        if isinstance(value, str):
            return self.item.check(value, at, issues, key)
        issues.append(Issue(at, "must be a string or a list of strings", "", key))
        return _BAD

    def schema(self, defs: dict[str, Any]) -> dict[str, Any]:
        return {"anyOf": [self.items.schema(defs), self.item.schema(defs)]}


class MapOf(Check):
    """A mapping of checked keys to checked values; `pair` judges each key with its value (ValueError says why)."""

    def __init__(self, key: Text, value: Check, pair: Callable[[str, Any], None] | None = None) -> None:
        self.key, self.value, self.pair = key, value, pair

    def check(self, value: Any, at: Path, issues: list[Issue], key: bool = False) -> Any:
        if not isinstance(value, dict):
            issues.append(Issue(at, "must be a mapping", "", key))
            return _BAD
        out = {}
        bad = False
        for k, v in value.items():
            checked_key = self.key.check(k, (*at, k), issues, key=True)
            checked = self.value.check(v, (*at, k), issues)
            if self.pair is not None and checked_key is not _BAD and checked is not _BAD:
                try:
                    self.pair(checked_key, checked)
                except ValueError as exc:
                    issues.append(Issue((*at, k), str(exc), ""))
                    checked = _BAD
            bad = bad or checked_key is _BAD or checked is _BAD
            out[checked_key] = checked
        return _BAD if bad else out

    def schema(self, defs: dict[str, Any]) -> dict[str, Any]:
        return {"type": "object", "additionalProperties": self.value.schema(defs)}


def typed(check: Check, default: Any = MISSING, *, factory: Callable[[], Any] | None = None, doc: str = "") -> Any:
    """Declare a model field: its check, its default (or a factory for lists, maps and models), its text."""
    metadata = {"check": check, "doc": doc}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


class Model(Check):
    """A mapping with the model's fields and no others; then the model's own `checked` hook, if any."""

    def __init__(self, cls: type) -> None:
        self.cls = cls

    def fields(self) -> list[dataclasses.Field[Any]]:
        return [f for f in dataclasses.fields(self.cls) if "check" in f.metadata]

    def check(self, value: Any, at: Path, issues: list[Issue], key: bool = False) -> Any:
        if not isinstance(value, dict):
            issues.append(Issue(at, "must be a mapping", "", key))
            return _BAD
        fields = self.fields()
        names = [f.name for f in fields]
        bad = False
        for k in value:
            if k not in names:
                issues.append(Issue((*at, k), "unknown key", did_you_mean(str(k), names), key=True))
                bad = True
        out = {}
        for f in fields:
            if f.name in value:
                out[f.name] = f.metadata["check"].check(value[f.name], (*at, f.name), issues)
                bad = bad or out[f.name] is _BAD
            elif f.default is MISSING and f.default_factory is MISSING:
                issues.append(Issue((*at, f.name), "missing required field"))
                bad = True
        if bad:
            return _BAD
        made = self.cls(**out)
        hook = getattr(made, "checked", None)
        if hook is None:
            return made
        try:
            return hook()
        except ValueError as exc:
            issues.append(_issue(at, str(exc)))
            return _BAD

    def schema(self, defs: dict[str, Any]) -> dict[str, Any]:
        name = self.cls.__name__
        if name not in defs:
            defs[name] = {}  # a placeholder while the fields are described (models may nest)
            defs[name] = self._describe(defs)
        return {"$ref": f"#/$defs/{name}"}

    def _describe(self, defs: dict[str, Any]) -> dict[str, Any]:
        properties: dict[str, Any] = {}
        required = []
        for f in self.fields():
            prop = f.metadata["check"].schema(defs)
            if f.metadata["doc"]:
                prop = {**prop, "description": f.metadata["doc"]}
            if f.metadata.get("site_only"):  # settings only the site config may set (imgbuild.config.site)
                prop = {**prop, "x-site-only": f.metadata["site_only"]}
            if f.default is not MISSING and (f.default is None or isinstance(f.default, str | int | float | bool)):
                prop = {**prop, "default": f.default}
            elif f.default is MISSING and f.default_factory is MISSING:
                required.append(f.name)
            properties[f.name] = prop
        out: dict[str, Any] = {"type": "object", "title": self.cls.__name__, "additionalProperties": False}
        if self.cls.__doc__ and not self.cls.__doc__.startswith(self.cls.__name__ + "("):
            out["description"] = self.cls.__doc__.strip()
        out["properties"] = properties
        if required:
            out["required"] = required
        return out


def did_you_mean(word: str, known: list[str]) -> str:
    """The hint for an unknown `word`: the closest of `known`, else the list of them (in the order given)."""
    import difflib  # only when there is an unknown key to explain

    close = difflib.get_close_matches(word, known, n=1)
    return f"did you mean {close[0]!r}?" if close else (f"known: {', '.join(known)}" if known else "")


def validate(cls: type, data: Any) -> tuple[Any, list[Issue]]:
    """`data` checked against the model `cls`: (the model, []) or (None, every issue found)."""
    issues: list[Issue] = []
    made = Model(cls).check(data, (), issues)
    return (None if made is _BAD else made), issues


def json_schema(cls: type) -> dict[str, Any]:
    """The model as a JSON Schema (2020-12), nested models under $defs."""
    defs: dict[str, Any] = {}
    root = Model(cls)._describe(defs)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **root, "$defs": defs}
