"""The plan's DAG: stages as nodes in the order the rules added them, an edge per producer → consumer pair carrying
the operands it passes. A few dozen lines in place of networkx, whose import was ~0.15 s of every cold start (a fresh
process's spec compile) for the five operations the pipeline uses."""

from __future__ import annotations

import heapq
from collections.abc import Callable, Hashable, Iterator
from typing import Any


class StageGraph:
    """A directed graph over hashable nodes; `edges[a, b]` is the edge's attribute dict (e.g. `operands`)."""

    def __init__(self) -> None:
        self._succ: dict[Hashable, dict[Hashable, dict[str, Any]]] = {}
        self._pred: dict[Hashable, dict[Hashable, dict[str, Any]]] = {}

    # --- building ---
    def add_node(self, n: Hashable) -> None:
        self._succ.setdefault(n, {})
        self._pred.setdefault(n, {})

    def add_edge(self, a: Hashable, b: Hashable, **attrs: Any) -> None:
        self.add_node(a)
        self.add_node(b)
        self._succ[a][b] = self._pred[b][a] = dict(attrs)

    def remove_node(self, n: Hashable) -> None:
        for b in self._succ.pop(n):
            del self._pred[b][n]
        for a in self._pred.pop(n):
            del self._succ[a][n]

    def relabel(self, mapping: dict[Hashable, Hashable]) -> StageGraph:
        """A copy with the nodes in `mapping` replaced, in place in the node order, edges kept."""
        g = StageGraph()
        for n in self._succ:
            g.add_node(mapping.get(n, n))
        for a, b in self.edges:
            g.add_edge(mapping.get(a, a), mapping.get(b, b), **self.edges[a, b])
        return g

    def copy(self) -> StageGraph:
        return self.relabel({})

    # --- reading ---
    @property
    def nodes(self) -> list[Hashable]:
        return list(self._succ)

    @property
    def edges(self) -> _Edges:
        return _Edges(self._succ)

    def has_edge(self, a: Hashable, b: Hashable) -> bool:
        return b in self._succ.get(a, {})

    def predecessors(self, n: Hashable) -> Iterator[Hashable]:
        return iter(self._pred[n])

    def number_of_edges(self) -> int:
        return len(self.edges)

    def topological_order(self, key: Callable[[Hashable], Any] | None = None) -> list[Hashable]:
        """Kahn's order: of the nodes ready, the one with the smallest `key` first, ties (and key None) in the order
        the nodes were added; ValueError on a cycle."""
        index = {n: i for i, n in enumerate(self._succ)}
        rank = (lambda n: (key(n), index[n])) if key is not None else index.__getitem__
        indegree = {n: len(p) for n, p in self._pred.items()}
        ready = [(rank(n), n) for n in self._succ if indegree[n] == 0]
        heapq.heapify(ready)
        order = []
        while ready:
            _, n = heapq.heappop(ready)
            order.append(n)
            for b in self._succ[n]:
                indegree[b] -= 1
                if indegree[b] == 0:
                    heapq.heappush(ready, (rank(b), b))
        if len(order) != len(self._succ):
            raise ValueError("the graph has a cycle")
        return order

    def is_acyclic(self) -> bool:
        try:
            self.topological_order()
        except ValueError:
            return False
        return True


class _Edges:
    """`for a, b in g.edges` and `g.edges[a, b]` (the attribute dict), as networkx spells them."""

    def __init__(self, succ: dict[Hashable, dict[Hashable, dict[str, Any]]]) -> None:
        self._succ = succ

    def __iter__(self) -> Iterator[tuple[Hashable, Hashable]]:
        return ((a, b) for a, s in self._succ.items() for b in s)

    def __getitem__(self, ab: tuple[Hashable, Hashable]) -> dict[str, Any]:
        a, b = ab
        return self._succ[a][b]

    def __len__(self) -> int:
        return sum(len(s) for s in self._succ.values())
