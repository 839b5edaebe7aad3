"""Kubernetes label selectors (the ``labelSelector=`` query string).

Part of the export step: the HPA asks for the pods of one Deployment with
``labelSelector=migscale.io/deployment=resnet-1g-10gb`` (the Deployment's
``spec.selector`` rendered as a string). This module parses that string with
the grammar of ``k8s.io/apimachinery/pkg/labels.Parse``:

    key            exists          !key          does not exist
    key=v, key==v  equals          key!=v        not equal (or absent)
    key in (a,b)   one of          key notin (a,b)
    key>3, key<3   integer compare (the label must parse as an integer)

Keys are qualified names (``prefix/name``, name <= 63 chars, prefix a DNS
subdomain <= 253); values are <= 63 chars of ``[A-Za-z0-9_.-]`` starting and
ending alphanumeric, or empty. Anything else raises :class:`SelectorError`,
which the API turns into a 400 BadRequest Status -- never a 5xx.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache

__all__ = ["Requirement", "Selector", "SelectorError", "parse_selector"]


class SelectorError(ValueError):
    """A label selector string that does not parse; the message says where."""


_NAME = r"[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_NAME_RE = re.compile(rf"^{_NAME}$")
_DNS_SUBDOMAIN_RE = re.compile(r"^[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*$")
_VALUE_RE = re.compile(rf"^(?:{_NAME})?$")
_INT_RE = re.compile(r"^[+-]?[0-9]+$")

# One requirement, after the top-level split on commas. Set operators need
# whitespace or a parenthesis after the key (``keyin (a)`` is a key named "keyin").
_REQ_RE = re.compile(
    r"""^\s*(?:
        (?P<notkey>!\s*(?P<nk>[^\s=!<>(),]+))\s*$
      | (?P<key>[^\s=!<>(),]+)\s*
        (?:
            (?P<op>==|=|!=|<|>)\s*(?P<value>[^\s=!<>(),]*)\s*
          | (?P<setop>in|notin)\s*\(\s*(?P<values>[^()]*)\)\s*
        )?$
    )""",
    re.VERBOSE,
)


def _check_key(key: str) -> None:
    prefix, sep, name = key.rpartition("/")
    if sep and (not prefix or len(prefix) > 253 or not _DNS_SUBDOMAIN_RE.match(prefix)):
        raise SelectorError(f"invalid label key {key!r}: prefix must be a DNS subdomain")
    if len(name) > 63 or not _NAME_RE.match(name):
        raise SelectorError(
            f"invalid label key {key!r}: name must be 1-63 characters of [A-Za-z0-9_.-], "
            "starting and ending with an alphanumeric"
        )


def _check_value(value: str) -> None:
    if len(value) > 63 or not _VALUE_RE.match(value):
        raise SelectorError(
            f"invalid label value {value!r}: must be empty or 1-63 characters of [A-Za-z0-9_.-], "
            "starting and ending with an alphanumeric"
        )


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # "exists" | "!" | "=" | "!=" | "in" | "notin" | "<" | ">"
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        has = self.key in labels
        if self.op == "exists":
            return has
        if self.op == "!":
            return not has
        if self.op in ("=", "in"):
            return has and labels[self.key] in self.values
        if self.op in ("!=", "notin"):
            return not has or labels[self.key] not in self.values
        # "<" / ">": Kubernetes compares integers and fails the match when the
        # label is absent or not an integer.
        if not has or not _INT_RE.match(labels[self.key]):
            return False
        got, want = int(labels[self.key]), int(self.values[0])
        return got < want if self.op == "<" else got > want


@dataclass(frozen=True)
class Selector:
    requirements: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(r.matches(labels) for r in self.requirements)

    def equalities(self) -> dict[str, str]:
        """Keys pinned to one value (``k=v`` or ``k in (v)``): usable for an index lookup."""
        out: dict[str, str] = {}
        for r in self.requirements:
            if r.op in ("=", "in") and len(r.values) == 1:
                out.setdefault(r.key, r.values[0])
        return out

    @property
    def empty(self) -> bool:
        return not self.requirements

    def __str__(self) -> str:
        parts = []
        for r in self.requirements:
            if r.op == "exists":
                parts.append(r.key)
            elif r.op == "!":
                parts.append(f"!{r.key}")
            elif r.op in ("in", "notin"):
                parts.append(f"{r.key} {r.op} ({','.join(r.values)})")
            else:
                parts.append(f"{r.key}{r.op}{r.values[0]}")
        return ",".join(parts)


def _split_top(text: str) -> list[str]:
    """Split on commas that are not inside ``( )``."""
    if "(" not in text and ")" not in text:
        return text.split(",")
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch == "(":
            depth += 1
            if depth > 1:
                raise SelectorError(f"nested parentheses in selector {text!r}")
        elif ch == ")":
            depth -= 1
            if depth < 0:
                raise SelectorError(f"unbalanced ')' in selector {text!r}")
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth != 0:
        raise SelectorError(f"unbalanced '(' in selector {text!r}")
    parts.append("".join(cur))
    return parts


def parse_selector(text: str | None) -> Selector:
    """Parse a label selector string; ``None`` or ``""`` selects everything.

    Memoized: an HPA sends the same selector every sync period, and Selector
    is immutable. Errors are not memoized (they raise).
    """
    if text is None or not text.strip():
        return Selector()
    return _parse(text)


@lru_cache(maxsize=4096)
def _parse(text: str) -> Selector:
    if len(text) > 4096:
        raise SelectorError("selector longer than 4096 characters")
    reqs: list[Requirement] = []
    for part in _split_top(text):
        if not part.strip():
            raise SelectorError(f"empty requirement in selector {text!r}")
        m = _REQ_RE.match(part)
        if m is None:
            raise SelectorError(f"cannot parse requirement {part.strip()!r} in selector {text!r}")
        if m["notkey"]:
            _check_key(m["nk"])
            reqs.append(Requirement(m["nk"], "!"))
            continue
        key = m["key"]
        _check_key(key)
        if m["op"]:
            op = "=" if m["op"] == "==" else m["op"]
            value = m["value"]
            if op in ("<", ">"):
                if not _INT_RE.match(value):
                    raise SelectorError(f"{key}{op}{value!r}: '{op}' needs an integer value")
            else:
                _check_value(value)
            reqs.append(Requirement(key, op, (value,)))
        elif m["setop"]:
            values = tuple(v.strip() for v in m["values"].split(","))
            if values == ("",) and m["values"].strip() == "":
                raise SelectorError(f"{key} {m['setop']} (): the set must not be empty")
            for v in values:
                _check_value(v)
            reqs.append(Requirement(key, m["setop"], tuple(sorted(set(values)))))
        else:
            reqs.append(Requirement(key, "exists"))
    return Selector(tuple(reqs))
