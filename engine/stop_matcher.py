"""Stop strings matched as text streams in: an Aho-Corasick automaton fed one character at a
time, so a step costs O(new text) however many and however long the stop strings are.

The automaton's state is the longest suffix of the text so far that is a prefix of some
stop string; its depth is exactly how much text must be held back (it may still become a
stop string), and reaching a state that ends a stop string is a match.
"""

from dataclasses import dataclass, field


@dataclass
class _Node:
    depth: int  # characters from the root: the length of the prefix this node stands for
    children: dict[str, int] = field(default_factory=dict)
    fail: int = 0  # the node of the longest proper suffix that is also a prefix
    match_len: int = 0  # longest stop string ending here (itself or via fail links); 0: none


class StopMatcher:
    def __init__(self, stops: list[str]) -> None:
        self._nodes = [_Node(0)]
        for stop in stops:
            if stop:
                self._insert(stop)
        self._link()
        self._state = 0

    @property
    def held(self) -> int:
        """Characters at the end of the text fed so far that may start a stop string."""
        return self._nodes[self._state].depth

    def feed(self, text: str) -> int | None:
        """Advance over `text`; on a match, the index in `text` just past the stop string.

        Of the stop strings that end at the same character the longest wins (it starts
        first). Nothing is fed past a match: the caller cuts the text there.
        """
        nodes, state = self._nodes, self._state
        for i, ch in enumerate(text):
            while state and ch not in nodes[state].children:
                state = nodes[state].fail
            state = nodes[state].children.get(ch, 0)
            if nodes[state].match_len:
                self._state = state
                return i + 1
        self._state = state
        return None

    @property
    def match_len(self) -> int:
        """Length of the stop string the last `feed` matched (0: none)."""
        return self._nodes[self._state].match_len

    def _insert(self, stop: str) -> None:
        node = 0
        for ch in stop:
            nxt = self._nodes[node].children.get(ch)
            if nxt is None:
                nxt = len(self._nodes)
                self._nodes.append(_Node(self._nodes[node].depth + 1))
                self._nodes[node].children[ch] = nxt
            node = nxt
        self._nodes[node].match_len = len(stop)

    def _link(self) -> None:
        """Failure links breadth first, so a node's fail target is finished before it."""
        queue = list(self._nodes[0].children.values())
        for node_id in queue:  # grows while iterated: a breadth-first walk
            node = self._nodes[node_id]
            for ch, child_id in node.children.items():
                fail = node.fail
                while fail and ch not in self._nodes[fail].children:
                    fail = self._nodes[fail].fail
                target = self._nodes[fail].children.get(ch, 0)
                child = self._nodes[child_id]
                child.fail = target
                child.match_len = child.match_len or self._nodes[child.fail].match_len
                queue.append(child_id)
