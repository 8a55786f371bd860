"""libmemunreachable's leak folding: unreachable allocations grouped by what holds them.

Strongly connected components of the unreachable graph are found (Tarjan's
algorithm, with an explicit stack); a component that no other unreachable
component references is a *dominator*. Every member of a dominator is reported,
with what it references: everything reachable from its component, counted once,
minus itself. So a chain or tree reports its head, and a cycle nobody holds
reports each member.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass


@dataclass(frozen=True)
class FoldedLeak:
    node: int  # index of the reported allocation
    referenced_count: int
    referenced_size: int


def strongly_connected(nodes: list[int], successors: dict[int, list[int]]) -> dict[int, int]:
    """node -> component number (Tarjan, iterative)."""
    index: dict[int, int] = {}
    low: dict[int, int] = {}
    on_stack: set[int] = set()
    stack: list[int] = []
    component: dict[int, int] = {}
    counter = components = 0
    for root in nodes:
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            node, next_child = work.pop()
            if next_child == 0:
                index[node] = low[node] = counter
                counter += 1
                stack.append(node)
                on_stack.add(node)
            children = successors.get(node, ())
            while next_child < len(children):
                child = children[next_child]
                next_child += 1
                if child not in index:
                    work.append((node, next_child))
                    work.append((child, 0))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                if low[node] == index[node]:
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component[member] = components
                        if member == node:
                            break
                    components += 1
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
    return component


@dataclass(frozen=True)
class Components:
    """The strongly connected components of a graph and the references between them."""

    members: dict[int, list[int]]  # component -> its nodes
    links: dict[int, set[int]]  # component -> the other components it references
    referenced: set[int]  # components another one references

    @property
    def dominators(self) -> list[int]:
        """The components nothing else references, by their lowest node."""
        return sorted((c for c in self.members if c not in self.referenced), key=lambda c: min(self.members[c]))


def components_of(nodes: list[int], edges: list[tuple[int, int]]) -> Components:
    successors: dict[int, list[int]] = defaultdict(list)
    for source, target in edges:
        if source != target:
            successors[source].append(target)
    component = strongly_connected(nodes, successors)
    members: dict[int, list[int]] = defaultdict(list)
    for node in nodes:
        members[component[node]].append(node)
    links: dict[int, set[int]] = defaultdict(set)
    referenced: set[int] = set()
    for source, targets in successors.items():
        for target in targets:
            a, b = component[source], component[target]
            if a != b:
                links[a].add(b)
                referenced.add(b)
    return Components(members, links, referenced)


def lost_leaders(nodes: list[int], edges: list[tuple[int, int]]) -> set[int]:
    """valgrind's definitely lost blocks among lost ones: the lowest node (address) of each
    component no other lost block references; the rest are indirectly lost."""
    found = components_of(nodes, edges)
    return {min(found.members[c]) for c in found.dominators}


def fold_leaks(nodes: list[int], sizes: dict[int, int], edges: list[tuple[int, int]]) -> list[FoldedLeak]:
    """The leaks to report among the unreachable nodes, given the references between them."""
    found = components_of(nodes, edges)
    members, links = found.members, found.links
    leaks = []
    for number in found.dominators:
        seen, todo = {number}, [number]
        while todo:
            for following in links[todo.pop()]:
                if following not in seen:
                    seen.add(following)
                    todo.append(following)
        count = sum(len(members[c]) for c in seen)
        size = sum(sizes[n] for c in seen for n in members[c])
        leaks += [FoldedLeak(node, count - 1, size - sizes[node]) for node in sorted(members[number])]
    return leaks
