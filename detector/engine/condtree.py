"""What a pySigma condition tree needs, read without evaluating it: the compiler (compile.py)
orders and guards each rule's tests with these."""

from __future__ import annotations

from typing import Any

from sigma.conditions import ConditionAND, ConditionFieldEqualsValueExpression, ConditionOR
from sigma.types import SigmaExists, SigmaFieldReference, SigmaNull


def conjuncts(node: Any) -> list[Any]:
    """The AND-ed parts of a condition (the generated code may test them in any order: they
    have no side effects)."""
    if isinstance(node, ConditionAND):
        return [c for a in node.args for c in conjuncts(a)]
    return [node]


def necessary_test(node: Any) -> Any:
    """A condition implied by `node` that reads few fields (the node itself for a field test;
    for AND the first part's, for OR the OR of every branch's), or None."""
    if isinstance(node, ConditionFieldEqualsValueExpression):
        return node
    if isinstance(node, ConditionAND):
        return next((t for t in map(necessary_test, node.args) if t is not None), None)
    if isinstance(node, ConditionOR):
        tests = [necessary_test(a) for a in node.args]
        if not tests or any(t is None for t in tests):
            return None
        return (
            node
            if all(t is a for t, a in zip(tests, node.args, strict=True))
            else ConditionOR(tests)
        )
    return None  # NOT, keywords, empty


def necessary_fields(node: Any) -> list[str]:
    """Fields the condition cannot be true without (present and not null), in rule order."""
    if isinstance(node, ConditionAND):
        return list(dict.fromkeys(f for a in node.args for f in necessary_fields(a)))
    if isinstance(node, ConditionOR):
        lists = [necessary_fields(a) for a in node.args]
        return [f for f in lists[0] if all(f in other for other in lists[1:])] if lists else []
    if isinstance(node, ConditionFieldEqualsValueExpression):
        value = node.value
        if isinstance(value, SigmaNull) or (isinstance(value, SigmaExists) and not value.exists):
            return []
        if isinstance(value, SigmaFieldReference):
            return [node.field, value.field]
        return [node.field]
    return []  # NOT, keywords, empty
