"""Value classes for modules every short command imports, where `dataclasses` (with `inspect`,
`ast` and `dis` under it) would cost more start-up than all of the command's own code.

A subclass names its fields, in order, as its `__slots__` and writes its own typed `__init__`;
it gets what `@dataclass` (`eq=True`, and `frozen=True` for FrozenRecord) would give: `==` on
the tuple of the fields (those in `_not_compared` left out, as `field(compare=False)`), a
repr `Name(field=value, ...)`, pickling and copying by the constructor, and for a FrozenRecord
a hash of the compared fields and no assignment after `__init__`.
"""

from __future__ import annotations


class Record:
    __slots__: tuple[str, ...] = ()
    _not_compared: frozenset[str] = frozenset()

    def _compared(self) -> tuple[object, ...]:
        return tuple(getattr(self, f) for f in self.__slots__ if f not in self._not_compared)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._compared() == other._compared()

    __hash__ = None  # type: ignore[assignment]  # mutable: as a dataclass with eq=True

    def __repr__(self) -> str:
        fields = ", ".join(f"{f}={getattr(self, f)!r}" for f in self.__slots__)
        return f"{type(self).__qualname__}({fields})"

    def __reduce__(self) -> tuple[type, tuple[object, ...]]:
        return (type(self), tuple(getattr(self, f) for f in self.__slots__))


class FrozenRecord(Record):
    __slots__ = ()

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(self._compared())

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"cannot delete field {name!r}")

    def _set(self, **values: object) -> None:
        """For `__init__`: the fields' values."""
        for name, value in values.items():
            object.__setattr__(self, name, value)
