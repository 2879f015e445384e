"""Token trees: the static shape of a step's candidates, as a few arrays.

A tree is given as a tuple of paths, the format Medusa calls "choices": each path is the tuple
of child ranks leading from the root to a node, rank 0 being the drafter's first candidate at
that node. `((0,), (1,), (0, 0))` is a root with two children, the first of which has a child.
The root itself is the row's last token (chosen, not yet fed to the target); it has no path.

Nodes are numbered 0 (the root), then the paths in breadth-first order (by depth, then by ranks):
the nodes of one depth are consecutive, which lets a draft model feed a whole level in one call.
Everything a decoding step needs follows from the topology and is computed once, on the host:

    parent[i]       the parent node of node i (the root is its own parent)
    depth[i]        0 for the root; a node at depth d sits at position length - 1 + d
    rank[i]         its rank among its siblings
    ancestors[i, j] j is i or an ancestor of i: node i attends to node j
    children[i, r]  the rank-r child of node i, or -1

A chain of K drafted tokens is the tree `((0,), (0, 0), ..., (0,) * K)`; its ancestor matrix is
lower-triangular, the causal mask, so trees need no special code path in the attention.
The topology is hashable and lives in the static `DecodeSpec`; only the tokens change per step.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import numbers
from typing import Sequence

import jax
import numpy as np


class TreeError(ValueError):
    """A malformed tree: the message names the offending path."""


@dataclasses.dataclass(frozen=True)
class Tree:
    paths: tuple[tuple[int, ...], ...]   # breadth-first, validated: see `Tree.from_paths`

    @classmethod
    def from_paths(cls, paths) -> "Tree":
        """Validates the paths and sorts them breadth-first.

        Every prefix of a path must itself be a path (a node's parent exists), ranks are integers
        >= 0, the ranks among siblings are 0..w-1 with none missing, and no path repeats.
        """
        if isinstance(paths, (str, bytes)) or not isinstance(paths, Sequence) or not paths:
            raise TreeError(f"a tree is a non-empty list of paths (lists of child ranks), "
                            f"got {paths!r}")
        clean = []
        for path in paths:
            if isinstance(path, (str, bytes)) or not isinstance(path, Sequence) or not path:
                raise TreeError(f"tree path {path!r} must be a non-empty list of child ranks")
            for r in path:
                if isinstance(r, bool) or not isinstance(r, numbers.Integral) or r < 0:
                    raise TreeError(f"tree path {list(path)} has rank {r!r}; ranks are "
                                    "integers >= 0")
            clean.append(tuple(int(r) for r in path))
        seen = set()
        for path in clean:
            if path in seen:
                raise TreeError(f"tree path {list(path)} appears twice")
            seen.add(path)
        for path in clean:
            if len(path) > 1 and path[:-1] not in seen:
                raise TreeError(f"tree path {list(path)} has no parent: {list(path[:-1])} is "
                                "not in the tree")
            if path[-1] > 0 and path[:-1] + (path[-1] - 1,) not in seen:
                raise TreeError(f"tree path {list(path)} skips a rank: "
                                f"{list(path[:-1] + (path[-1] - 1,))} is not in the tree")
        return cls(tuple(sorted(clean, key=lambda p: (len(p), p))))

    @classmethod
    def full(cls, widths: Sequence[int]) -> "Tree":
        """The full tree with `widths[d]` children under every node of depth d: (3, 2, 1) has
        3 + 6 + 6 nodes. A chain of K is `full((1,) * K)`."""
        if isinstance(widths, (str, bytes)) or not isinstance(widths, Sequence) or not widths:
            raise TreeError(f"tree widths must be a non-empty list of integers >= 1, "
                            f"got {widths!r}")
        for w in widths:
            if isinstance(w, bool) or not isinstance(w, numbers.Integral) or w < 1:
                raise TreeError(f"tree widths must be integers >= 1, got {list(widths)}")
        paths = [p for d in range(1, len(widths) + 1)
                 for p in itertools.product(*(range(w) for w in widths[:d]))]
        return cls.from_paths(paths)

    @classmethod
    def chain(cls, k: int) -> "Tree":
        return cls.full((1,) * k)

    @classmethod
    def from_json(cls, path: str) -> "Tree":
        """Reads a JSON list of paths, e.g. `[[0], [1], [0, 0]]`."""
        try:
            with open(path) as f:
                paths = json.load(f)
        except OSError as e:
            raise TreeError(f"cannot read tree file {path}: {e.strerror}") from None
        except json.JSONDecodeError as e:
            raise TreeError(f"tree file {path} is not valid JSON: {e}") from None
        return cls.from_paths(paths)

    # -- The arrays, computed once per topology (the class is frozen and hashable) -------------

    @property
    def size(self) -> int:
        """Number of candidate nodes, the root excluded."""
        return len(self.paths)

    @property
    def max_depth(self) -> int:
        return max(len(p) for p in self.paths)

    @property
    def max_width(self) -> int:
        return max(p[-1] for p in self.paths) + 1

    @functools.cached_property
    def _index(self) -> dict:
        return {(): 0, **{p: i + 1 for i, p in enumerate(self.paths)}}

    @functools.cached_property
    def parent(self) -> np.ndarray:
        """[T + 1] int32."""
        return np.array([0] + [self._index[p[:-1]] for p in self.paths], np.int32)

    @functools.cached_property
    def depth(self) -> np.ndarray:
        """[T + 1] int32."""
        return np.array([0] + [len(p) for p in self.paths], np.int32)

    @functools.cached_property
    def rank(self) -> np.ndarray:
        """[T + 1] int32 (0 for the root)."""
        return np.array([0] + [p[-1] for p in self.paths], np.int32)

    @functools.cached_property
    def ancestors(self) -> np.ndarray:
        """[T + 1, T + 1] bool: ancestors[i, j] iff node j is node i or one of its ancestors."""
        n = self.size + 1
        a = np.eye(n, dtype=bool)
        for i in range(1, n):                 # breadth-first: a parent's row is already done
            a[i] |= a[self.parent[i]]
        return a

    @functools.cached_property
    def children(self) -> np.ndarray:
        """[T + 1, W] int32: children[i, r] is the rank-r child of node i, or -1."""
        c = np.full((self.size + 1, self.max_width), -1, np.int32)
        for i in range(1, self.size + 1):
            c[self.parent[i], self.rank[i]] = i
        return c

    def level(self, d: int) -> range:
        """The nodes of depth d: consecutive in breadth-first order."""
        nodes = np.flatnonzero(self.depth == d)
        return range(int(nodes[0]), int(nodes[-1]) + 1)

    def full_widths(self) -> tuple[int, ...] | None:
        """The widths if this is a full tree, else None."""
        widths = []
        for d in range(1, self.max_depth + 1):
            level = [p for p in self.paths if len(p) == d]
            parents = [p for p in self.paths if len(p) == d - 1] if d > 1 else [()]
            if len(level) % len(parents):
                return None
            widths.append(len(level) // len(parents))
        return tuple(widths) if Tree.full(widths) == self else None


@dataclasses.dataclass(frozen=True)
class DynamicTree:
    """EAGLE-2's draft tree (Li et al. 2024, "EAGLE-2"): a shape chosen anew every step, per
    row, from the drafter's confidence; only its sizes are static.

    The drafter expands the `top_k` most likely children of every frontier node, scores each
    node by its path's cumulative log-probability under the drafter, keeps the `top_k` best new
    nodes as the next frontier, `depth` times; then the `total_tokens` best of all the nodes it
    made (a child never scores above its parent, so they form a tree) are the tree the target
    verifies in one call. `decoding.eagle` builds it; `RowTrees` carries it.
    """
    depth: int
    top_k: int
    total_tokens: int

    def __post_init__(self):
        for name in ("depth", "top_k", "total_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
                raise TreeError(f"a dynamic tree's {name} must be an integer >= 1, got {value!r}")
        if self.total_tokens > self.pool_size:
            raise TreeError(f"a dynamic tree of depth {self.depth} and top_k {self.top_k} makes "
                            f"{self.pool_size} nodes; total_tokens={self.total_tokens} is more")

    @property
    def pool_size(self) -> int:
        """The nodes the drafter makes: top_k at depth 1, then top_k^2 per depth."""
        return self.top_k + (self.depth - 1) * self.top_k ** 2

    @property
    def size(self) -> int:
        return self.total_tokens

    @property
    def max_depth(self) -> int:
        return self.depth

    @property
    def max_width(self) -> int:
        return self.top_k

    @classmethod
    def parse(cls, text: str) -> "DynamicTree":
        """`"5,4,16"` -> DynamicTree(depth=5, top_k=4, total_tokens=16) (`--dynamic-tree`)."""
        try:
            depth, top_k, total = (int(part) for part in text.split(","))
        except ValueError:
            raise TreeError(f"a dynamic tree is DEPTH,TOP_K,TOTAL_TOKENS (e.g. 5,4,16), "
                            f"got {text!r}") from None
        return cls(depth, top_k, total)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class RowTrees:
    """One tree per row, as data: the arrays of `Tree` with a leading batch axis [B, ...]
    (n = total nodes with the root). `rejection.verify_tree` and tree attention read them
    where they would read a static tree's."""
    parent: jax.Array          # [B, n] int32 (the root is its own parent)
    depth: jax.Array           # [B, n] int32
    children: jax.Array        # [B, n, W] int32, -1 where none
    ancestors: jax.Array       # [B, n, n] bool
    max_depth: int = dataclasses.field(metadata=dict(static=True))
    max_width: int = dataclasses.field(metadata=dict(static=True))

    @property
    def size(self) -> int:
        return self.parent.shape[-1] - 1


def parse_widths(text: str) -> Tree:
    """`"3,2,1"` -> the full tree of those widths (the CLI's `--tree`)."""
    try:
        widths = [int(w) for w in text.split(",")]
    except ValueError:
        raise TreeError(f"--tree takes comma-separated widths such as 3,2,1, "
                        f"got {text!r}") from None
    return Tree.full(widths)
