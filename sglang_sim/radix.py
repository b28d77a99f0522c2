"""Prefix cache for the simulator: a compressed radix tree over token ids with
LRU eviction of unreferenced leaves, and an optional host tier (hicache).

Mirrors the parts of SGLang's `mem_cache/radix_cache.py` and `hiradix_cache.py`
that the scheduler can observe: the longest cached prefix, lock references that
protect a running request's prefix from eviction, `evictable_size`, and eviction
of least-recently-used unlocked leaves. With a host tier, evicted device nodes
are kept in host RAM (up to `host_capacity_tokens`) and a later match reports
them as a host hit that the engine loads back instead of recomputing.

Sizes are in tokens. No KV values are stored: the engine only needs the counts.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["MatchResult", "RadixCache", "RadixNode"]


class RadixNode:
    """One edge of the tree: `key` is the run of token ids leading to this node."""

    __slots__ = ("key", "children", "parent", "lock_ref", "last_access", "on_device", "order")

    _created = 0  # creation counter: a deterministic LRU tie-break (id() is not)

    def __init__(self, key: tuple[int, ...], parent: RadixNode | None, now_s: float) -> None:
        RadixNode._created += 1
        self.order = RadixNode._created
        self.key = key
        self.children: dict[int, RadixNode] = {}
        self.parent = parent
        self.lock_ref = 0
        self.last_access = now_s
        self.on_device = True

    def has_device_child(self) -> bool:
        return any(c.on_device for c in self.children.values())


@dataclass(frozen=True, slots=True)
class MatchResult:
    """Longest cached prefix: `device_len` tokens on GPU, then `host_len` on host only.

    `device_node` ends the device part (lock it); `host_node` ends the host part."""

    device_node: RadixNode
    device_len: int
    host_node: RadixNode
    host_len: int


class RadixCache:
    """Token-id radix tree; counts device, protected (locked) and host-only tokens."""

    def __init__(self, host_capacity_tokens: int = 0) -> None:
        self.root = RadixNode((), None, 0.0)
        self.root.lock_ref = 1  # the root is never evicted (as in SGLang)
        self.host_capacity_tokens = host_capacity_tokens
        self.device_size = 0  # tokens whose KV is on the GPU and owned by the tree
        self.protected_size = 0  # device tokens locked by running requests
        self.host_size = 0  # tokens kept only in host RAM

    @property
    def evictable_size(self) -> int:
        """Device tokens no running request references (freeable on demand)."""
        return self.device_size - self.protected_size

    # ---- lookup -------------------------------------------------------------

    def match_prefix(self, tokens: Sequence[int], now_s: float) -> MatchResult:
        """Longest cached prefix of `tokens`; splits a node matched part-way (as SGLang)."""
        node, pos, n = self.root, 0, len(tokens)
        device_node, device_len = self.root, 0
        while pos < n:
            child = node.children.get(tokens[pos])
            if child is None:
                break
            common = _common_len(child.key, tokens, pos)
            if common < len(child.key):
                child = self._split(child, common)
            child.last_access = now_s
            node, pos = child, pos + common
            if child.on_device:
                device_node, device_len = child, pos
        return MatchResult(device_node, device_len, node, pos - device_len)

    def _split(self, child: RadixNode, at: int) -> RadixNode:
        """Cut `child` after `at` tokens; returns the new upper node (same state)."""
        parent = child.parent
        assert parent is not None
        upper = RadixNode(child.key[:at], parent, child.last_access)
        upper.lock_ref = child.lock_ref
        upper.on_device = child.on_device
        parent.children[child.key[0]] = upper
        child.key = child.key[at:]
        child.parent = upper
        upper.children[child.key[0]] = child
        return upper

    # ---- insert / load back -------------------------------------------------

    def insert(self, tokens: Sequence[int], now_s: float) -> tuple[RadixNode, int]:
        """Insert `tokens` on device; returns (last node, tokens newly put on device).

        Host-only nodes on the path come back to the device (the caller just computed them)."""
        node, pos, n, new_device = self.root, 0, len(tokens), 0
        while pos < n:
            child = node.children.get(tokens[pos])
            if child is None:
                leaf = RadixNode(tuple(tokens[pos:]), node, now_s)
                node.children[tokens[pos]] = leaf
                self.device_size += n - pos
                return leaf, new_device + n - pos
            common = _common_len(child.key, tokens, pos)
            if common < len(child.key):
                child = self._split(child, common)
            child.last_access = now_s
            if not child.on_device:
                new_device += self._to_device(child)
            node, pos = child, pos + common
        return node, new_device

    def load_back(self, host_node: RadixNode) -> int:
        """Bring the host-only nodes ending at `host_node` back to the GPU; returns tokens."""
        loaded = 0
        node: RadixNode | None = host_node
        while node is not None and not node.on_device:
            loaded += self._to_device(node)
            node = node.parent
        return loaded

    def _to_device(self, node: RadixNode) -> int:
        node.on_device = True
        size = len(node.key)
        self.host_size -= size
        self.device_size += size
        if node.lock_ref > 0:
            self.protected_size += size
        return size

    # ---- locking ------------------------------------------------------------

    def lock(self, node: RadixNode) -> None:
        """Protect the path root..node from eviction (SGLang `inc_lock_ref`)."""
        while node is not self.root:
            if node.lock_ref == 0 and node.on_device:
                self.protected_size += len(node.key)
            node.lock_ref += 1
            node = node.parent  # type: ignore[assignment]

    def unlock(self, node: RadixNode) -> None:
        """Undo one `lock(node)` (SGLang `dec_lock_ref`)."""
        while node is not self.root:
            node.lock_ref -= 1
            if node.lock_ref == 0 and node.on_device:
                self.protected_size -= len(node.key)
            node = node.parent  # type: ignore[assignment]

    # ---- eviction -----------------------------------------------------------

    def evict(self, num_tokens: int) -> int:
        """Free at least `num_tokens` device tokens if possible, LRU leaves first.

        Returns the device tokens freed; with a host tier they move to host RAM."""
        if num_tokens <= 0 or self.evictable_size == 0:
            return 0
        heap = [(n.last_access, n.order, n) for n in self._device_leaves()]
        heapq.heapify(heap)
        freed = 0
        while freed < num_tokens and heap:
            _, _, node = heapq.heappop(heap)
            freed += self._evict_node(node)
            parent = node.parent
            if (
                parent is not None
                and parent is not self.root
                and parent.on_device
                and parent.lock_ref == 0
                and not parent.has_device_child()
            ):
                heapq.heappush(heap, (parent.last_access, parent.order, parent))
        return freed

    def _device_leaves(self) -> list[RadixNode]:
        out, stack = [], [self.root]
        while stack:
            node = stack.pop()
            device_kids = [c for c in node.children.values() if c.on_device]
            if not device_kids and node is not self.root and node.lock_ref == 0:
                out.append(node)
            stack.extend(device_kids)
        return out

    def _evict_node(self, node: RadixNode) -> int:
        size = len(node.key)
        self.device_size -= size
        if self.host_capacity_tokens > 0 and size <= self.host_capacity_tokens:
            self._make_host_room(size, keep=node)
            node.on_device = False
            self.host_size += size
        else:
            self._delete(node)
        return size

    def _make_host_room(self, size: int, keep: RadixNode) -> None:
        """Drop LRU host-only leaves until `size` more tokens fit in the host tier."""
        while self.host_size + size > self.host_capacity_tokens:
            leaves = [n for n in self._host_leaves() if n is not keep]
            if not leaves:
                return
            victim = min(leaves, key=lambda n: (n.last_access, n.order))
            self.host_size -= len(victim.key)
            self._delete(victim)

    def _host_leaves(self) -> list[RadixNode]:
        out, stack = [], [self.root]
        while stack:
            node = stack.pop()
            if not node.children and not node.on_device and node.lock_ref == 0:
                out.append(node)  # a locked host node is about to be loaded back
            stack.extend(node.children.values())
        return out

    def _delete(self, node: RadixNode) -> None:
        """Remove a node whose subtree is already gone from the device (children go too)."""
        parent = node.parent
        assert parent is not None
        del parent.children[node.key[0]]
        stack = list(node.children.values())
        while stack:  # host-only descendants of a deleted node are unreachable
            child = stack.pop()
            self.host_size -= len(child.key)
            stack.extend(child.children.values())

    def reset(self) -> None:
        """Drop every unlocked entry, device and host (SGLang `/flush_cache`)."""
        saved, self.host_capacity_tokens = self.host_capacity_tokens, 0
        self.evict(self.evictable_size)
        self.host_capacity_tokens = saved
        stack = [self.root]
        while stack:  # host-only nodes never have device descendants
            node = stack.pop()
            for child in list(node.children.values()):
                if child.on_device:
                    stack.append(child)
                else:
                    self.host_size -= len(child.key)
                    self._delete(child)


def _common_len(key: tuple[int, ...], tokens: Sequence[int], pos: int) -> int:
    """Length of the common prefix of `key` and `tokens[pos:]`."""
    n = min(len(key), len(tokens) - pos)
    if tuple(tokens[pos : pos + n]) == key[:n]:
        return n
    lo, hi = 0, n  # binary search on slice equality: C-speed compares, log n steps
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if tuple(tokens[pos : pos + mid]) == key[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo
