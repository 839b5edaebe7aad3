"""Reading configuration files safely, writing YAML that reads back, and turning validation
errors into lines.

Part of the config edge (``autoscaler.config`` is the public face). A file
that a person or a tool hands the loop may be wrong, huge or hostile; this
module makes each failure one line ``path.to.field: message, got VALUE`` in a
``ConfigError`` and refuses, before anything large is built: files over
1 MiB, more than 100 YAML aliases, an alias expansion over 100,000 nodes
("billion laughs") and nesting deeper than 64 levels. Nothing here hangs.

One reader (``load_yaml``, ``parse_documents``: YAML 1.2 core types) and one writer
(``dump_yaml``, ``dump_yaml_all``: quotes what a reader would retype, no anchors) serve
every command, so what migscale writes it, and kubectl, read back unchanged.
"""

from __future__ import annotations

import difflib
import json
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import PydanticCustomError

# parse to well under a second on this hardware.
MAX_FILE_BYTES = 1 << 20
# A hand-written config uses a handful of anchors; 100 aliases of 10 nodes each
# already allow a "billion laughs" of 10**9 nodes, hence the second, expanded cap.
MAX_ALIASES = 100
MAX_EXPANDED_NODES = 100_000
MAX_DEPTH = 64


class ConfigError(Exception):
    """Invalid configuration; ``problems`` holds one line per problem."""

    def __init__(self, problems: Sequence[str], path: str | Path | None = None):
        self.problems = list(problems)
        self.path = str(path) if path is not None else None
        super().__init__("\n".join(self.problems))


# ---------------------------------------------------------------- safe YAML


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader that counts aliases and nesting while composing the node graph."""

    def __init__(self, stream: str):
        super().__init__(stream)
        self._aliases = 0
        self._depth = 0

    def compose_node(self, parent, index):  # type: ignore[override]
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                mark = self.peek_event().start_mark
                raise _LimitError(
                    f"line {mark.line + 1}, column {mark.column + 1}: "
                    f"more than {MAX_ALIASES} YAML aliases, refused"
                )
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise _LimitError(
                    f"line {mark.line + 1}, column {mark.column + 1}: "
                    f"nesting deeper than {MAX_DEPTH} levels, refused"
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node, deep=False):  # type: ignore[override]
        # PyYAML keeps the last of two equal keys silently; a config with
        # ``min_replicas`` twice is a mistake worth a line, not a guess.
        seen: set = set()
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                key = (key_node.tag, key_node.value)
                if key in seen:
                    mark = key_node.start_mark
                    raise _LimitError(
                        f"line {mark.line + 1}, column {mark.column + 1}: "
                        f"duplicate key, got {key_node.value!r}"
                    )
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


# Plain scalars are typed by the YAML 1.2 core schema (the JSON schema plus ``~``, ``0o``/``0x``
# and ``.inf``; kubectl too reads ``1e3`` as a number), not by PyYAML's YAML 1.1 table:
# there ``max_replicas: 010`` is 8 (octal), ``p99_ms: 2:30`` is 150 (base 60), ``1_000`` is 1000,
# ``prometheus: off`` is false, ``2024-01-01`` a date and ``1e3`` text. Here 010 is 10, 0o10 is 8,
# ``1e3`` is 1000.0, and ``2:30``, ``1_000``, ``off`` and ``2024-01-01`` are strings, which a
# number or boolean field then refuses by name. ``<<`` merge keys stay (kubectl reads them too).
CORE_RESOLVERS: tuple[tuple[str, re.Pattern[str], list[str]], ...] = (
    ("tag:yaml.org,2002:null", re.compile(r"^(?:~|null|Null|NULL|)$"), ["~", "n", "N", ""]),
    ("tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")),
    ("tag:yaml.org,2002:int", re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$"), list("-+0123456789")),
    (
        "tag:yaml.org,2002:float",
        re.compile(
            r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
            r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
        ),
        list("-+0123456789."),
    ),
)


def _core_int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int:
    text = str(loader.construct_scalar(node))
    if text.startswith(("0o", "0x")):
        return int(text, 0)
    return int(text, 10)  # "010" is ten: YAML 1.2 has no leading-zero octal


_BoundedLoader.yaml_implicit_resolvers = {}
for _tag, _regexp, _first in CORE_RESOLVERS:
    _BoundedLoader.add_implicit_resolver(_tag, _regexp, _first)
_BoundedLoader.add_implicit_resolver("tag:yaml.org,2002:merge", re.compile(r"^(?:<<)$"), ["<"])
_BoundedLoader.add_constructor("tag:yaml.org,2002:int", _core_int)


# ---------------------------------------------------------------- the one YAML writer


class _Dumper(yaml.SafeDumper):
    """SafeDumper that quotes every string a YAML 1.1 or 1.2 reader would type otherwise, and
    writes shared objects out in full.

    Its plain-scalar table is PyYAML's (YAML 1.1: ``yes``, ``010``, ``2:30``, dates) plus the
    loader's core schema (``1e3``, ``0o10``), so a string such as a model directory ``1e3``
    comes back from this loader, kubectl or a YAML 1.1 tool as the same string. Anchors
    (``&id001``) are never written: a renderer that reuses one dict in two places means two
    copies, and some readers (and people) do not follow aliases.
    """

    def ignore_aliases(self, data: Any) -> bool:
        return True


for _tag, _regexp, _first in CORE_RESOLVERS:
    _Dumper.add_implicit_resolver(_tag, _regexp, _first)


def dump_yaml(data: Any, *, sort_keys: bool = False, width: int | None = None) -> str:
    """``data`` as block-style YAML that ``load_yaml`` reads back as the same values
    (``width``: where long lines fold; PyYAML's 80 when None)."""
    return yaml.dump(data, Dumper=_Dumper, sort_keys=sort_keys, default_flow_style=False, width=width)


def dump_yaml_all(docs: Iterable[Any], *, sort_keys: bool = False, width: int | None = None) -> str:
    """Several documents, separated by ``---``, as ``dump_yaml`` writes each."""
    return yaml.dump_all(docs, Dumper=_Dumper, sort_keys=sort_keys, default_flow_style=False, width=width)


class _LimitError(Exception):
    pass


def _expanded_size(node: yaml.Node) -> int:
    """Nodes the document would have with every alias copied out.

    Memoised per node object, so a bomb of 10 levels x 10 aliases costs 100
    steps to measure, not 10**10. A node that contains itself (``&a [*a]``)
    is refused.
    """
    sizes: dict[int, int] = {}
    active: set[int] = set()

    def size(n: yaml.Node) -> int:
        key = id(n)
        if key in sizes:
            return sizes[key]
        if key in active:
            raise _LimitError(f"line {n.start_mark.line + 1}: recursive YAML alias, refused")
        active.add(key)
        total = 1
        if isinstance(n, yaml.SequenceNode):
            total += sum(size(c) for c in n.value)
        elif isinstance(n, yaml.MappingNode):
            total += sum(size(k) + size(v) for k, v in n.value)
        active.discard(key)
        sizes[key] = total
        if total > MAX_EXPANDED_NODES:
            raise _LimitError(f"YAML expands to more than {MAX_EXPANDED_NODES} nodes (alias bomb?), refused")
        return total

    return size(node)


def load_yaml(path: str | Path, *, max_bytes: int = MAX_FILE_BYTES) -> Any:
    """Read one YAML document with size, alias and depth limits; ConfigError on any failure."""
    p = Path(path)
    return _parse_yaml_text(_file_text(p, max_bytes), p)


def _file_text(p: Path, max_bytes: int, kind: str = "a YAML file") -> str:
    try:
        if not p.exists():
            raise ConfigError([f"{p}: file not found"], p)
        if p.is_dir():
            raise ConfigError([f"{p}: is a directory, expected {kind}"], p)
        if not p.is_file():  # a FIFO or device would block or never end
            raise ConfigError([f"{p}: not a regular file, expected {kind}"], p)
        size = p.stat().st_size
        if size > max_bytes:
            raise ConfigError([f"{p}: file is {size} bytes, limit is {max_bytes} bytes"], p)
        with p.open("rb") as fh:
            raw = fh.read(max_bytes + 1)  # re-check: the file may grow between stat and read
        if len(raw) > max_bytes:
            raise ConfigError([f"{p}: file is over {max_bytes} bytes"], p)
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            [f"{p}: not UTF-8 text (byte {exc.start}), got {raw[exc.start : exc.start + 4]!r}"], p
        ) from None
    except OSError as exc:
        raise ConfigError([f"{p}: cannot read: {exc.strerror or exc}"], p) from None
    return text


def read_text(path: str | Path, *, max_bytes: int = MAX_FILE_BYTES, kind: str = "a YAML file") -> str:
    """A file's UTF-8 text (``-`` reads standard input), refused over ``max_bytes``;
    ``kind`` names what was expected in the refusal of a directory or a FIFO."""
    if str(path) == "-":
        raw = sys.stdin.buffer.read(max_bytes + 1)
        if len(raw) > max_bytes:
            raise ConfigError([f"(stdin): more than {max_bytes} bytes"], "-")
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ConfigError([f"(stdin): not UTF-8 text (byte {exc.start})"], "-") from None
    return _file_text(Path(path), max_bytes, kind)  # the refusals of load_yaml: missing, FIFO, size, encoding


def parse_documents(text: str, where: str | Path) -> list[Any]:
    """Every document of a multi-document YAML text, or the one value of a JSON text.

    Text that parses as JSON is read as JSON: a YAML 1.1 reader takes ``1e-05`` (how Go's encoder,
    and so ``kubectl get -o json``, writes 0.00001) for a string. YAML gets the
    limits of ``load_yaml``, the expanded size counted over all documents.
    Empty documents (a trailing ``---``) are dropped.
    """
    p = Path(str(where))
    if text.lstrip().startswith(("{", "[")):
        try:
            return [json.loads(text, parse_constant=_no_constant, object_pairs_hook=_unique_keys)]
        except json.JSONDecodeError:
            pass  # not JSON after all: YAML flow style (``{a: 1}``), read below
        except RecursionError:
            raise ConfigError([f"{p}: JSON nested too deeply, refused"], p) from None
        except ValueError as exc:
            raise ConfigError([f"{p}: JSON error: {exc}"], p) from None
    if not text.strip():
        raise ConfigError([f"{p}: file is empty, expected YAML or JSON"], p)
    return [d for d in _documents(text, p, single=False) if d is not None]


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict:
    out: dict = {}
    for key, value in pairs:
        if key in out:  # as in YAML: a repeated key is a mistake worth a line, not a guess
            raise ValueError(f"duplicate key, got {key!r}")
        out[key] = value
    return out


def _parse_yaml_text(text: str, p: Path) -> Any:
    if not text.strip() or all(ln.lstrip().startswith("#") or not ln.strip() for ln in text.splitlines()):
        raise ConfigError([f"{p}: file is empty, expected a YAML mapping"], p)
    return _documents(text, p, single=True)[0]


def _documents(text: str, p: Path, *, single: bool) -> list[Any]:
    """The documents of ``text`` (exactly one when ``single``), the expanded size counted over all."""
    loader = _BoundedLoader(text)
    docs: list[Any] = []
    total = 0
    try:
        if single:
            node = loader.get_single_node()
            if node is None:
                raise ConfigError([f"{p}: file is empty, expected a YAML mapping"], p)
            nodes = iter([node])
        else:
            # check_node first: it drops the stream-start event get_node would choke on
            nodes = iter(lambda: loader.get_node() if loader.check_node() else None, None)
        for node in nodes:
            total += _expanded_size(node)
            if total > MAX_EXPANDED_NODES:
                raise _LimitError(f"documents expand to more than {MAX_EXPANDED_NODES} nodes, refused")
            docs.append(loader.construct_document(node))
        return docs
    except _LimitError as exc:
        raise ConfigError([f"{p}: {exc}"], p) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        what = " ".join(x for x in (exc.context, exc.problem) if x)
        raise ConfigError([f"{p}: {where}YAML syntax error: {what}"], p) from None
    except (yaml.YAMLError, RecursionError, ValueError) as exc:
        raise ConfigError(
            [f"{p}: YAML error: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"], p
        ) from None
    finally:
        loader.dispose()


# ---------------------------------------------------------------- error formatting


def short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _path(loc: Sequence[Any]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


_PLAIN = {
    "int_type": "must be an integer",
    "int_from_float": "must be a whole number",
    "float_type": "must be a number",
    "finite_number": "must be a finite number",
    "string_type": "must be a string",
    "bool_type": "must be true or false",
    "list_type": "must be a list",
    "dict_type": "must be a mapping",
    "model_type": "must be a mapping",
    "model_attributes_type": "must be a mapping",
    "none_required": "must be null",
}


def _allowed_keys(model: type[BaseModel] | None, loc: Sequence[Any]) -> list[str]:
    """Field names valid at ``loc``'s parent, to suggest a fix for an unknown key."""
    for part in loc[:-1]:
        if model is None:
            return []
        if isinstance(part, int):
            continue
        field = model.model_fields.get(str(part))
        if field is None:
            return []
        model = _model_of(field.annotation)
    return list(model.model_fields) if model is not None else []


def _model_of(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _model_of(arg)
        if found is not None:
            return found
    return None


def format_errors(
    exc: ValidationError, root: type[BaseModel], relocate: Callable[[list], list] | None = None
) -> list[str]:
    """One line per error. ``relocate`` maps a location inside ``root`` to the one the
    reader knows (a MigModel's ``name`` is ``metadata.name``, its other fields ``spec.*``)."""

    def where(loc: Sequence[Any]) -> str:
        return _path(relocate(list(loc)) if relocate is not None else loc)

    lines: list[str] = []
    for err in exc.errors(include_url=False):
        loc = list(err["loc"])
        kind = err["type"]
        ctx = err.get("ctx") or {}
        value = err.get("input")
        if loc and loc[-1] == "[key]":  # a mapping key of the wrong type: name the mapping
            lines.append(f"{where(loc[:-2])}: keys must be strings, got {short(loc[-2])}")
            continue
        if kind == "invalid_key":
            lines.append(f"{where(loc[:-1])}: keys must be strings, got {short(value)}")
            continue
        if kind == "semantic":
            for field, msg, got in ctx["items"]:
                path = where(loc + ([field] if isinstance(field, (str, int)) else list(field)))
                lines.append(f"{path}: {msg}, got {short(got)}")
            continue
        if kind == "missing":
            lines.append(f"{where(loc)}: required field is missing")
            continue
        if kind == "extra_forbidden":
            allowed = _allowed_keys(root, loc)
            hint = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
            extra = (
                f" (did you mean {hint[0]!r}?)"
                if hint
                else (f" (allowed: {', '.join(allowed)})" if allowed else "")
            )
            lines.append(f"{where(loc)}: unknown key{extra}, got {short(value)}")
            continue
        if kind in _PLAIN:
            msg = _PLAIN[kind]
        elif kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
            op = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}[
                kind
            ]
            bound = next(iter(ctx.values()))
            msg = f"must be {op} {bound:g}" if isinstance(bound, (int, float)) else f"must be {op} {bound}"
        elif kind == "literal_error":
            msg = f"must be one of {ctx.get('expected')}"
        elif kind in ("too_short", "too_long"):
            word = "at least" if kind == "too_short" else "at most"
            n = ctx.get("min_length", ctx.get("max_length"))
            msg = (
                f"must have {word} {n} item(s)"
                if not isinstance(value, str)
                else f"must have {word} {n} character(s)"
            )
        elif kind in ("string_too_short", "string_too_long"):
            word = "at least" if kind == "string_too_short" else "at most"
            msg = f"must have {word} {ctx.get('min_length', ctx.get('max_length'))} character(s)"
        else:
            msg = err["msg"]
            msg = msg.removeprefix("Value error, ")
            msg = msg[:1].lower() + msg[1:]
        lines.append(f"{where(loc)}: {msg}, got {short(value)}")
    return lines


class Problems:
    """Collects cross-field problems inside a model validator; raised as one error."""

    def __init__(self) -> None:
        self.items: list[tuple[Any, str, Any]] = []

    def add(self, field: Any, msg: str, got: Any) -> None:
        self.items.append((field, msg, got))

    def raise_if_any(self) -> None:
        if self.items:
            raise PydanticCustomError("semantic", "{items}", {"items": tuple(self.items)})
