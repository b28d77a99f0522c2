"""The simulated KV token pool: the radix prefix cache plus tokens private to requests.

Mirrors SGLang's token_to_kv_pool_allocator + tree_cache pairing
(python/sglang/srt/mem_cache/): free = pool - cached on device - held privately;
evicting unreferenced cache makes room. Pure: no clock, no I/O.
"""

from __future__ import annotations

from sglang_sim.engine_request import SchedReq
from sglang_sim.radix import RadixCache

__all__ = ["KVPool"]


class KVPool:
    """KV accounting in tokens: `radix` owns cached tokens, `private` sums what
    running and chunked requests hold beyond their locked prefix."""

    def __init__(self, max_total_num_tokens: int, hicache_tokens: int) -> None:
        self.max_total_num_tokens = max_total_num_tokens
        self.radix = RadixCache(hicache_tokens)
        self.private = 0  # sum of SchedReq.private over running and chunked requests

    @property
    def used_tokens(self) -> int:
        """KV tokens in the pool: running requests plus the whole prefix cache."""
        return self.radix.device_size + self.private

    def cache_tokens(self) -> dict[str, int]:
        """Prefix-cache sizes in tokens: on GPU, of which evictable, and host-only."""
        radix = self.radix
        return {"device": radix.device_size, "evictable": radix.evictable_size, "host": radix.host_size}

    def free(self) -> int:
        """Tokens free right now, without evicting anything."""
        return self.max_total_num_tokens - self.radix.device_size - self.private

    def ensure_free(self, tokens: int) -> bool:
        """Evict unreferenced cache until `tokens` are free; False if impossible."""
        short = tokens - self.free()
        if short > 0:
            self.radix.evict(short)
        return self.free() >= tokens

    def grow(self, req: SchedReq, tokens: int) -> None:
        """Charge `tokens` new KV tokens to the request (prefill chunk or decode)."""
        req.private += tokens
        self.private += tokens

    def commit_prefill(self, req: SchedReq, now_s: float) -> None:
        """Insert the prefilled sequence into the cache and lock it (cache_unfinished_req)."""
        node, _ = self.radix.insert(req.seq[: req.target], now_s)
        self.radix.lock(node)
        if req.node is not None:
            self.radix.unlock(req.node)
        # The tree now owns every prefilled token; copies another request already
        # inserted are freed, as SGLang frees duplicate indices on insert.
        self.private -= req.private
        req.node, req.locked_len, req.private = node, req.target, 0

    def finish(self, req: SchedReq, now_s: float) -> None:
        """Insert prompt + output into the cache and unlock it (cache_finished_req)."""
        self.radix.insert(req.seq, now_s)
        self.private -= req.private
        req.private = 0
        self.release(req)

    def release(self, req: SchedReq) -> None:
        """Free the request's private KV and unpin its cached prefix (no insert)."""
        self.private -= req.private
        req.private = 0
        if req.node is not None:
            self.radix.unlock(req.node)
        req.node, req.locked_len = None, 0
