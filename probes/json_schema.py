"""The keys of a JSON file daskprobe writes (run.json, summary.json), each defined once: its type,
what it means, and what a reader takes when it is absent. The writer checks what it wrote and
the reader what it read against these, and docs/run_json.md and docs/summary_json.md are
rendered from them (python -m daskprobe.dashboards.reference).

A type is a Python one, as json.loads gives values back: str, int, float (an int fits), bool,
None, Any, list[T], dict[str, T], unions (int | None), or an Object: a JSON object with keys
of its own (made by `obj`)."""

from __future__ import annotations

import contextlib
import copy
import json
import os
import sys
import types
import typing
from dataclasses import dataclass
from typing import Any


class SchemaError(ValueError):
    """A table, or a JSON file's key, that does not match its definition."""


@dataclass(frozen=True)
class Key:
    name: str
    type: Any
    doc: str
    default: Any = None  # what a reader takes when the key is absent (an older daskprobe's, or a run cut short)


class Object:
    """A JSON object's keys (a subclass per object, made by `obj`): a type that list[...] and dict[...] take."""
    title: str
    doc: str
    keys: dict[str, Key]


def obj(title: str, doc: str, *keys: Key) -> type[Object]:
    return type(title.replace(".", "_").replace(" ", "_"), (Object,),
                {"title": title, "doc": doc, "keys": {k.name: k for k in keys}})


def problems(value, kind, where: str, unknown_ok: bool = False) -> list[str]:
    """What in `value` does not fit `kind`, each as "where: what"; [] if it fits. A key an Object
    does not define is a problem unless unknown_ok (a reader meeting a newer daskprobe's key)."""
    origin = typing.get_origin(kind)
    if origin in (typing.Union, types.UnionType):
        options = [k for k in typing.get_args(kind) if k is not type(None)]
        if value is None and len(options) < len(typing.get_args(kind)):
            return []
        if len(options) == 1:  # X | None: what inside X does not fit, else that it is neither
            inner = problems(value, options[0], where, unknown_ok)
            return [_mismatch(value, kind, where)] if inner == [_mismatch(value, options[0], where)] else inner
        fits = any(not problems(value, k, where, unknown_ok) for k in options)
        return [] if fits else [_mismatch(value, kind, where)]
    if origin is list:
        if not isinstance(value, list):
            return [_mismatch(value, kind, where)]
        item = typing.get_args(kind)[0]
        return [p for i, v in enumerate(value) for p in problems(v, item, f"{where}[{i}]", unknown_ok)]
    if origin is dict:
        if not isinstance(value, dict):
            return [_mismatch(value, kind, where)]
        item = typing.get_args(kind)[1]
        return [p for k, v in value.items() for p in problems(v, item, f"{where}.{k}", unknown_ok)]
    if isinstance(kind, type) and issubclass(kind, Object):
        if not isinstance(value, dict):
            return [_mismatch(value, kind, where)]
        out = []
        for k, v in value.items():
            if k in kind.keys:
                out += problems(v, kind.keys[k].type, f"{where}.{k}", unknown_ok)
            elif not unknown_ok:
                out.append(f"{where}.{k}: a key {kind.title} does not define")
        return out
    return [] if _fits(value, kind) else [_mismatch(value, kind, where)]


def _fits(value, kind) -> bool:
    if kind is Any:
        return True
    if kind is None or kind is type(None):
        return value is None
    if isinstance(value, bool) and kind is not bool:  # a bool is an int to Python, not to JSON
        return False
    return isinstance(value, (int, float) if kind is float else kind)


def _mismatch(value, kind, where: str) -> str:
    shown = json.dumps(value, default=str)
    return f"{where}: {shown if len(shown) <= 60 else shown[:57] + '...'} is not {type_name(kind)}"


def type_name(kind, link=lambda o: o.title) -> str:
    """The type as the docs say it: int, list[str], dict[str, float], str or null; an Object as link(it)."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(type_name(k, link) for k in args)
    if origin is list:
        return f"list[{type_name(args[0], link)}]"
    if origin is dict:
        return f"dict[{type_name(args[0], link)}, {type_name(args[1], link)}]"
    if isinstance(kind, type) and issubclass(kind, Object):
        return link(kind)
    return {None: "null", type(None): "null", Any: "any"}.get(kind) or kind.__name__


def strict() -> bool:
    """The tests (tests/conftest.py sets DASKPROBE_STRICT=1) raise on a problem: it is a bug. A user's run
    says it and goes on: a wrong key costs nothing that was captured."""
    return os.environ.get("DASKPROBE_STRICT") == "1"


_said: set[str] = set()


def report(found: list[str], what: str) -> None:
    """Raise (strict) or say once each, on stderr, what does not match."""
    if not found:
        return
    if strict():
        raise SchemaError(f"{what} does not match its definition: " + "; ".join(found[:5]))
    new = [p for p in found if p not in _said]
    _said.update(new)
    if new:
        with contextlib.suppress(OSError):  # a closed terminal costs the warning, not the run
            print(f"daskprobe: warning: {what} does not match its definition (a bug: please report it): "
                  + "; ".join(new[:5]), file=sys.stderr)


def check_written(text: str, keys: type[Object], what: str, only=None) -> None:
    """Check what a writer wrote (text: the file's JSON, as a reader will see it), after writing it: a
    problem must never cost the data. `only`: the keys to check (those just updated)."""
    value = json.loads(text)
    if only is not None:
        value = {k: value[k] for k in only if k in value}
    report(problems(value, keys, what), what)


class Checked(dict):
    """A JSON object as read, checked against its keys (KEYS): a key whose value does not fit is
    said and dropped (its reader gets the default). An attribute gives a key's value, or its
    documented default when absent (an older daskprobe's file); an undefined name is an AttributeError."""
    KEYS: type[Object]
    WHAT = "a JSON file"

    @classmethod
    def parse(cls, text: str, what: str | None = None):
        value = json.loads(text)
        what = what or cls.WHAT
        if not isinstance(value, dict):
            report([f"{what}: not a JSON object"], what)
            return cls()
        bad = {k for k in value if problems({k: value[k]}, cls.KEYS, what, unknown_ok=True)}
        report(problems(value, cls.KEYS, what, unknown_ok=True), what)
        return cls({k: v for k, v in value.items() if k not in bad})

    def __getattr__(self, name: str):
        key = type(self).KEYS.keys.get(name)
        if key is None:
            raise AttributeError(f"{type(self).WHAT} defines no key {name!r}")
        return self[name] if name in self else copy.deepcopy(key.default)


def markdown(root: type[Object], title: str, intro: str, generator: str) -> str:
    """A page of the docs: the file's keys, then each object they hold, one table each."""
    objects, todo = [], [root]
    while todo:
        o = todo.pop(0)
        if o not in objects:
            objects.append(o)
            todo += [n for k in o.keys.values() for n in _objects(k.type)]
    anchor = lambda o: f"[{o.title}](#{o.title.lower().replace('.', '').replace(' ', '-')})"  # noqa: E731
    out = [f"# {title}", "", f"<!-- generated by `{generator}`; do not edit -->", "", intro, ""]
    for o in objects:
        out += [f"## {o.title}", "", o.doc, "", "| key | type | if absent | definition |", "| --- | --- | --- | --- |"]
        out += [f"| `{k.name}` | {type_name(k.type, anchor)} | `{json.dumps(k.default)}` | {k.doc} |"
                for k in o.keys.values()]
        out.append("")
    return "\n".join(out)


def _objects(kind) -> list[type[Object]]:
    if isinstance(kind, type) and issubclass(kind, Object):
        return [kind]
    return [o for k in typing.get_args(kind) for o in _objects(k)]
