"""YAML parsing with bounds, for every policy text (a file, a hot reload, another replica's).

PyYAML's aliases share one node, so a few hundred bytes can stand for billions of values
("billion laughs"): the parse is cheap, but the `${ENV}` pass and the schema walk every
copy (a 300-byte file ran `tiergate check-policy` past 30 s and 1 GB). The composed graph
is measured as if every alias were expanded, before anything walks it, and refused past
the bounds; nesting is bounded as it is composed, since composing recurses.
"""

from typing import Any

import yaml

MAX_BYTES = 1024 * 1024  # a policy is a few KB; difficulty examples belong in JSONL files
MAX_ALIASES = 64  # `*name` uses in one policy
MAX_NODES = 100_000  # values, with every alias expanded
MAX_DEPTH = 32  # nesting levels, with every alias expanded (a policy uses about 6)


class PolicyYamlError(yaml.YAMLError):
    """Past a bound; `problem` and `problem_mark` as in PyYAML's errors."""

    def __init__(self, problem: str, mark: yaml.Mark | None = None) -> None:
        super().__init__(problem)
        self.problem, self.problem_mark = problem, mark


class _BoundedComposer:
    """Mixin for a PyYAML loader: counts aliases and nesting while it composes."""

    _aliases = 0
    _depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                mark = self.peek_event().start_mark
                raise PolicyYamlError(f"more than {MAX_ALIASES} aliases (*name)", mark)
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise PolicyYamlError(f"nested deeper than {MAX_DEPTH} levels", mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _measure(node: yaml.Node, depth: int, sizes: dict[int, tuple[int, int]], open_: set) -> int:
    """Values under `node` (itself included) as if aliases were copies; raises past a
    bound. `sizes` memoises (values, height) per node, so a shared node costs once."""
    if depth > MAX_DEPTH:  # checked first, so this recursion stays shallow too
        raise PolicyYamlError(f"nested deeper than {MAX_DEPTH} levels once aliases are expanded")
    key = id(node)
    if key in open_:
        raise PolicyYamlError("an alias refers to a value that contains it", node.start_mark)
    if key not in sizes:
        open_.add(key)
        count, height = 1, 0
        for child in _children(node):
            count += _measure(child, depth + 1, sizes, open_)
            height = max(height, sizes[id(child)][1] + 1)
            if count > MAX_NODES:
                raise PolicyYamlError(f"more than {MAX_NODES} values once aliases are expanded")
        open_.discard(key)
        sizes[key] = (count, height)
    if depth + sizes[key][1] > MAX_DEPTH:
        raise PolicyYamlError(f"nested deeper than {MAX_DEPTH} levels once aliases are expanded")
    return sizes[key][0]


def load_bounded(text: str, loader: type[yaml.SafeLoader]) -> Any:
    """`yaml.load(text, loader)` within the bounds above; raises yaml.YAMLError."""
    size = len(text.encode())
    if size > MAX_BYTES:
        raise PolicyYamlError(f"the policy is {size:,} bytes, over the {MAX_BYTES:,} allowed")
    bounded = type("BoundedLoader", (_BoundedComposer, loader), {})
    instance = bounded(text)
    try:
        node = instance.get_single_node()
        if node is None:
            return None
        _measure(node, 0, {}, set())
        return instance.construct_document(node)
    finally:
        instance.dispose()
