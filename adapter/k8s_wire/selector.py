"""The Kubernetes label-selector grammar (k8s.io/apimachinery labels.Parse), as the HPA sends it.

`k=v`, `k==v`, `k!=v`, `k in (a,b)`, `k notin (a,b)`, `k` (exists), `!k` (does not exist),
and `k>n` / `k<n` (integer comparisons, n an int64), comma-separated; requirements are ANDed.

A parsed selector is normal: the requirements on one key are combined into the fewest that
select the same label sets (`k in (a,b),k=b` is `k=b`), so equivalent spellings are one series
in the cache, and a selector that can match nothing is refused (`k in (a,b),k=c`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum

_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_KEY = re.compile(rf"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?{_NAME}$")
_VALUE = re.compile(rf"^({_NAME})?$")
_SPECIAL = "!=(),<>"
_INTEGER = re.compile(r"[+-]?\d+")
_INT64 = range(-(2**63), 2**63)


class SelectorError(ValueError):
    """The selector is not valid Kubernetes label-selector syntax (answered with 400)."""


class Operator(Enum):
    EQUALS = "="
    NOT_EQUALS = "!="
    IN = "in"
    NOT_IN = "notin"
    EXISTS = "exists"
    DOES_NOT_EXIST = "!"
    GREATER_THAN = ">"
    LESS_THAN = "<"


@dataclass(frozen=True)
class Requirement:
    key: str
    operator: Operator
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key, "")
        match self.operator:
            case Operator.EQUALS | Operator.IN:
                return present and value in self.values
            case Operator.NOT_EQUALS | Operator.NOT_IN:
                return not present or value not in self.values
            case Operator.EXISTS:
                return present
            case Operator.DOES_NOT_EXIST:
                return not present
            case Operator.GREATER_THAN | Operator.LESS_THAN:
                if not present or not _INTEGER.fullmatch(value):
                    return False
                bound = int(self.values[0])
                return int(value) > bound if self.operator is Operator.GREATER_THAN else int(value) < bound

    def __str__(self) -> str:
        match self.operator:
            case Operator.EXISTS:
                return self.key
            case Operator.DOES_NOT_EXIST:
                return f"!{self.key}"
            case Operator.IN | Operator.NOT_IN:
                return f"{self.key} {self.operator.value} ({','.join(self.values)})"
            case _:
                return f"{self.key}{self.operator.value}{self.values[0]}"


@dataclass(frozen=True)
class Selector:
    requirements: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(requirement.matches(labels) for requirement in self.requirements)

    def values_for(self, key: str) -> tuple[str, ...] | None:
        """Values an `=`/`==`/`in` requirement gives `key`, or None when none does."""
        for requirement in self.requirements:
            if requirement.key == key and requirement.operator in (Operator.EQUALS, Operator.IN):
                return requirement.values
        return None

    def __str__(self) -> str:
        """Canonical form, as Go's `Selector.String()`: requirements sorted by key (a stable sort)."""
        return ",".join(str(r) for r in sorted(self.requirements, key=lambda r: r.key))


# A token is `==`, `!=`, one special character, or a run of anything else but whitespace; whitespace
# between tokens is what findall skips. One regular expression: a 16 KiB selector is scanned in C, not
# character by character in Python (that cost a request ~50 ms of the event loop).
_TOKEN = re.compile(r"==|!=|[!=(),<>]|[^\s!=(),<>]+")

# Far above any selector an HPA or KEDA trigger sends (one to three requirements), far below what
# makes parsing and normalising a request cost the event loop: every caller shares it.
MAX_REQUIREMENTS = 32
MAX_SET_VALUES = 256


def _tokens(text: str) -> list[str]:
    return _TOKEN.findall(text)


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = _tokens(text)
        self.position = 0

    def peek(self) -> str | None:
        return self.tokens[self.position] if self.position < len(self.tokens) else None

    def take(self) -> str:
        token = self.peek()
        if token is None:
            raise self.error("unexpected end of selector")
        self.position += 1
        return token

    def error(self, message: str) -> SelectorError:
        shown = self.text if len(self.text) <= 200 else self.text[:200] + "..."  # answers and logs stay small
        return SelectorError(f"unable to parse label selector {shown!r}: {message}")

    def key(self, token: str) -> str:
        if token in _SPECIAL or token in ("==", "!=") or not _KEY.match(token) or len(token) > 316:
            raise self.error(f"{token!r} is not a valid label key")
        return token

    def value(self, token: str) -> str:
        if not _VALUE.match(token):
            raise self.error(f"{token!r} is not a valid label value")
        return token

    def requirement(self) -> Requirement:
        token = self.take()
        if token == "!":
            return Requirement(self.key(self.take()), Operator.DOES_NOT_EXIST)
        key = self.key(token)
        following = self.peek()
        if following is None or following == ",":
            return Requirement(key, Operator.EXISTS)
        operator = self.take()
        if operator in ("=", "=="):
            return Requirement(key, Operator.EQUALS, (self.single_value(),))
        if operator == "!=":
            return Requirement(key, Operator.NOT_EQUALS, (self.single_value(),))
        if operator in (">", "<"):
            bound = self.take()
            # As Kubernetes (strconv.ParseInt, base 10, 64 bits); written back in one spelling ("+05" is "5").
            if not _INTEGER.fullmatch(bound) or int(bound) not in _INT64:
                raise self.error(f"for {operator!r}, the value must be a 64-bit integer, not {bound!r}")
            kind = Operator.GREATER_THAN if operator == ">" else Operator.LESS_THAN
            return Requirement(key, kind, (str(int(bound)),))
        if operator in ("in", "notin"):
            kind = Operator.IN if operator == "in" else Operator.NOT_IN
            return Requirement(key, kind, self.value_set(key))
        raise self.error(f"expected an operator after {key!r}, found {operator!r}")

    def single_value(self) -> str:
        following = self.peek()
        if following is None or following == ",":
            return ""  # `k=` selects an empty value, as in Kubernetes
        return self.value(self.take())

    def value_set(self, key: str) -> tuple[str, ...]:
        if self.take() != "(":
            raise self.error("expected '(' after in/notin")
        values: list[str] = []
        while True:
            if len(values) == MAX_SET_VALUES:
                raise self.error(f"the value set of {key!r} has more than {MAX_SET_VALUES} values")
            token = self.take()
            if token == ")" and not values:
                break  # `k in ()` is an empty set
            if token in (",", ")"):
                values.append("")
            else:
                values.append(self.value(token))
                token = self.take()
            if token == ")":
                break
            if token != ",":
                raise self.error(f"expected ',' or ')' in a value set, found {token!r}")
        if not values:
            raise self.error("a value set must not be empty")
        return tuple(sorted(set(values)))

    def parse(self) -> Selector:
        requirements: list[Requirement] = []
        while self.peek() is not None:
            if len(requirements) == MAX_REQUIREMENTS:
                keys = ", ".join(sorted({requirement.key for requirement in requirements}))
                raise self.error(f"more than {MAX_REQUIREMENTS} requirements (on {keys})")
            requirements.append(self.requirement())
            token = self.peek()
            if token is None:
                break
            if self.take() != ",":
                raise self.error(f"expected ',' between requirements, found {token!r}")
            if self.peek() is None:
                raise self.error("a selector must not end with ','")
        by_key: dict[str, list[Requirement]] = {}
        for requirement in requirements:
            by_key.setdefault(requirement.key, []).append(requirement)
        combined = [normal for key in sorted(by_key) for normal in self.combine(key, by_key[key])]
        return Selector(tuple(combined))

    def combine(self, key: str, requirements: list[Requirement]) -> list[Requirement]:
        """The fewest requirements on `key` that select what all of `requirements` together select."""
        allowed: set[str] | None = None  # from = and in: the intersection
        excluded: set[str] = set()  # from != and notin
        exists = absent = False
        above: int | None = None  # the value must be > above
        below: int | None = None  # the value must be < below
        for requirement in requirements:
            match requirement.operator:
                case Operator.EQUALS | Operator.IN:
                    values = set(requirement.values)
                    allowed = values if allowed is None else allowed & values
                case Operator.NOT_EQUALS | Operator.NOT_IN:
                    excluded.update(requirement.values)
                case Operator.EXISTS:
                    exists = True
                case Operator.DOES_NOT_EXIST:
                    absent = True
                case Operator.GREATER_THAN:
                    bound = int(requirement.values[0])
                    above = bound if above is None else max(above, bound)
                case Operator.LESS_THAN:
                    bound = int(requirement.values[0])
                    below = bound if below is None else min(below, bound)
        clauses = ", ".join(str(requirement) for requirement in requirements)
        never = self.error(f"the requirements on {key!r} ({clauses}) can never all hold: the selector matches nothing")
        compared = above is not None or below is not None
        if absent:
            if allowed is not None or exists or compared:
                raise never
            return [Requirement(key, Operator.DOES_NOT_EXIST)]
        if allowed is not None:
            kept = sorted(
                value
                for value in allowed - excluded
                if not compared
                or (
                    _INTEGER.fullmatch(value)
                    and (above is None or int(value) > above)
                    and (below is None or int(value) < below)
                )
            )
            if not kept:
                raise never
            if len(kept) == 1:
                return [Requirement(key, Operator.EQUALS, (kept[0],))]
            return [Requirement(key, Operator.IN, tuple(kept))]
        if above is not None and below is not None and below - above <= 1:
            raise never
        combined: list[Requirement] = []
        if excluded:
            kind = Operator.NOT_EQUALS if len(excluded) == 1 else Operator.NOT_IN
            combined.append(Requirement(key, kind, tuple(sorted(excluded))))
        if exists and not compared:  # a comparison already needs the label
            combined.append(Requirement(key, Operator.EXISTS))
        if above is not None:
            combined.append(Requirement(key, Operator.GREATER_THAN, (str(above),)))
        if below is not None:
            combined.append(Requirement(key, Operator.LESS_THAN, (str(below),)))
        return combined


def parse_selector(text: str) -> Selector:
    """Parse a selector into its normal form; the empty string selects everything."""
    return _Parser(text).parse()
