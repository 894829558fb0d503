"""A JSON schema whose ``$ref`` cycle has no finite instance: ``{"$defs": {"n": {"type": "object",
"properties": {"c": {"$ref": "#/$defs/n"}}, "required": ["c"]}}, "$ref": "#/$defs/n"}`` asks for an object
that holds another such object without end, and ``{"$defs": {"n": {"$ref": "#/$defs/n"}}}`` for a value made
of nothing but itself. The grammar library takes both and fails later (mid-reply, or with a message naming
its internals), so they are found here first.

A value is finite-buildable when some branch of it can be written out: a scalar type, ``const`` or ``enum``
always can; an object when each ``required`` property can; an array when its first ``minItems`` items can;
``allOf`` when all can, ``anyOf`` / ``oneOf`` when one can; ``$ref`` when its target can. What a ref can build
is the least fixed point over the schema's refs. Other keywords are taken to allow a value, so a schema is
only refused when it certainly has no finite instance.
"""
from __future__ import annotations

import re

_INDEX = re.compile(r"[0-9]{1,9}")   # an array index in a JSON pointer
_BUDGET = 200_000            # subschemas visited at most; a larger schema is not checked here


class _OverBudget(Exception):
    pass


def endless_ref(schema: dict) -> str | None:
    """The first ``$ref`` (``#/$defs/n``) through which ``schema`` has no finite instance, or None when it has
    one (or when it is too large to tell)."""
    refs, anchors = _walk(schema)
    targets = {r: _resolve(schema, r, anchors) for r in refs}
    check = _Check({r: targets[r] is None for r in refs})      # a ref that points nowhere is not judged here
    try:
        changed = True
        while changed:                       # least fixed point: a ref builds once its target can be built
            changed = False
            for r in refs:
                if not check.built[r] and check.finite(targets[r]):
                    check.built[r] = changed = True
        check.blamed = []
        return None if check.finite(schema) else (check.blamed[0] if check.blamed else "#")
    except _OverBudget:
        return None


class _Check:
    def __init__(self, built: dict[str, bool]) -> None:
        self.built = built
        self.blamed: list[str] = []
        self._left = _BUDGET

    def finite(self, node: object) -> bool:
        self._left -= 1
        if self._left < 0:
            raise _OverBudget
        if not isinstance(node, dict) or "const" in node or "enum" in node:
            return True
        ref = node.get("$ref")
        if isinstance(ref, str) and not self.built.get(ref, True):
            self.blamed.append(ref)
            return False
        if not all(self.finite(s) for s in _list(node, "allOf")):
            return False
        for key in ("anyOf", "oneOf"):
            branches = _list(node, key)
            if branches and not any(self.finite(s) for s in branches):
                return False
        kind = node.get("type")
        kinds = set(kind) if isinstance(kind, list) else {kind} if isinstance(kind, str) else None
        if kinds is None or kinds - {"object", "array"}:        # a scalar will do (or a type left to the library)
            return True
        return ("object" in kinds and self._object(node)) or ("array" in kinds and self._array(node))

    def _object(self, node: dict) -> bool:
        properties = node.get("properties") if isinstance(node.get("properties"), dict) else {}
        # a name no property lists may match a patternProperties pattern, which is not matched here (a pattern
        # run by Python's backtracking engine could take forever): such a name is taken to be buildable
        extra = node.get("additionalProperties") if not node.get("patternProperties") else None
        required = node.get("required") if isinstance(node.get("required"), list) else []
        return all(self.finite(properties.get(name, extra)) for name in required if isinstance(name, str))

    def _array(self, node: dict) -> bool:
        least = node.get("minItems")
        least = least if isinstance(least, int) and not isinstance(least, bool) else 0
        items = node.get("items")
        prefix = _list(node, "prefixItems") or (items if isinstance(items, list) else [])
        rest = items if isinstance(items, dict) else node.get("additionalItems")
        return all(self.finite(s) for s in prefix[:least]) and (least <= len(prefix) or self.finite(rest))


def _list(node: dict, key: str) -> list:
    value = node.get(key)
    return value if isinstance(value, list) else []


def _walk(schema: dict) -> tuple[list[str], dict[str, dict]]:
    """The schema's local refs (each once, in a fixed order) and its subschemas by ``$anchor``."""
    refs: dict[str, None] = {}
    anchors: dict[str, dict] = {}
    stack: list = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            ref, anchor = node.get("$ref"), node.get("$anchor")
            if isinstance(ref, str) and ref.startswith("#"):
                refs[ref] = None
            if isinstance(anchor, str):
                anchors.setdefault(anchor, node)
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return list(refs), anchors


def _resolve(root: dict, ref: str, anchors: dict[str, dict]) -> object | None:
    """The subschema a local ``$ref`` (a JSON pointer after ``#``, or an ``$anchor``) names; None when it
    names none."""
    if ref == "#":
        return root
    if not ref.startswith("#/"):
        return anchors.get(ref[1:])
    node: object = root
    for part in ref[2:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and _INDEX.fullmatch(part) and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node
