"""Unit tests of the simulator's prefix cache (radix.py) and hardware profiles (profiles.py)."""

from __future__ import annotations

import pytest

from sglang_sim.profiles import PROFILES, get_profile, hicache_capacity_tokens, kv_capacity_tokens
from sglang_sim.radix import RadixCache


def test_match_returns_longest_prefix_and_splits_node_and_insert_counts_new_tokens() -> None:
    cache = RadixCache()
    cache.insert((1, 2, 3, 4, 5), now_s=1.0)
    m = cache.match_prefix((1, 2, 3, 9), now_s=2.0)
    assert (m.device_len, m.host_len) == (3, 0)
    assert m.device_node.key == (1, 2, 3)  # split at the divergence point
    assert cache.device_size == 5
    assert cache.match_prefix((7,), now_s=3.0).device_len == 0
    cache = RadixCache()  # an insert counts only the new tokens
    assert cache.insert((1, 2, 3), 0.0)[1] == 3
    assert cache.insert((1, 2, 3, 4, 5), 0.0)[1] == 2
    assert cache.insert((1, 2, 6), 0.0)[1] == 1
    assert cache.device_size == 6


def test_locked_prefix_is_not_evictable() -> None:
    cache = RadixCache()
    node, _ = cache.insert((1, 2, 3, 4), 0.0)
    cache.insert((5, 6), 1.0)
    cache.lock(node)
    assert (cache.protected_size, cache.evictable_size) == (4, 2)
    assert cache.evict(100) == 2
    assert cache.device_size == 4
    cache.unlock(node)
    assert cache.evictable_size == 4
    # reset empties device and host but keeps what is locked
    cache = RadixCache(host_capacity_tokens=100)
    kept, _ = cache.insert((9, 9), 0.0)
    cache.lock(kept)
    cache.insert((1, 2), 0.0)
    cache.evict(2)
    cache.insert((3, 4), 0.0)
    cache.reset()
    assert (cache.device_size, cache.host_size, cache.protected_size) == (2, 0, 2)


def test_eviction_is_least_recently_used_first() -> None:
    cache = RadixCache()
    cache.insert((1, 1), now_s=1.0)
    cache.insert((2, 2), now_s=2.0)
    cache.insert((3, 3), now_s=3.0)
    cache.match_prefix((1, 1), now_s=4.0)  # touch: now (2, 2) is the oldest
    assert cache.evict(1) == 2
    assert cache.match_prefix((2, 2), 5.0).device_len == 0
    assert cache.match_prefix((1, 1), 5.0).device_len == 2


def test_host_tier_keeps_evicted_prefix_and_loads_it_back() -> None:
    cache = RadixCache(host_capacity_tokens=10)
    cache.insert((1, 2, 3, 4), 0.0)
    assert cache.evict(4) == 4
    assert (cache.device_size, cache.host_size) == (0, 4)
    m = cache.match_prefix((1, 2, 3, 4, 5), 1.0)
    assert (m.device_len, m.host_len) == (0, 4)
    assert cache.load_back(m.host_node) == 4
    assert (cache.device_size, cache.host_size) == (4, 0)
    # full: the oldest is dropped
    cache = RadixCache(host_capacity_tokens=4)
    cache.insert((1, 1, 1), 0.0)
    cache.insert((2, 2, 2), 1.0)
    cache.evict(6)
    assert cache.host_size == 3  # only one of the two fits in 4 host tokens
    assert cache.match_prefix((2, 2, 2), 2.0).host_len == 3
    assert cache.match_prefix((1, 1, 1), 2.0).host_len == 0


@pytest.mark.parametrize(
    ("profile", "mem", "dtype", "tokens"),
    [("seed", 0.85, "auto", 116_000), ("seed", 0.85, "bf16", 116_000), ("seed", 0.88, "bf16", 159_000),
     ("seed", 0.90, "fp8_e4m3", 376_000), ("seed", 0.90, "fp8_e5m2", 376_000), ("seed", 0.90, "bf16", 188_000),
     ("fast", 0.5, "bf16", 24_576), ("fast", 0.9, "fp8_e4m3", 24_576)],  # the fast pool is fixed
)
def test_pool_matches_the_seed_servers_and_fast_is_fixed(profile: str, mem: float, dtype: str, tokens: int) -> None:
    assert kv_capacity_tokens(profile, mem, dtype) == tokens


def test_unknown_dtype_and_profile_are_refused_and_hicache_gb_converts_to_tokens() -> None:
    with pytest.raises(ValueError) as err:
        kv_capacity_tokens("seed", 0.85, "int4")
    assert str(err.value) == (
        "unsupported kv_cache_dtype 'int4'; choose one of ['auto', 'bf16', 'bfloat16', 'fp8_e4m3', 'fp8_e5m2']"
    )
    with pytest.raises(ValueError) as err:
        get_profile("h100")
    assert str(err.value) == "unknown hardware profile 'h100'; choose one of ['fast', 'h200', 'seed']"
    # hicache_size converts GB to tokens
    assert hicache_capacity_tokens("seed", 48, "bf16") == int(48e9 / 98_400)
    assert hicache_capacity_tokens("seed", 48, "fp8_e4m3") == int(48e9 / 49_200)


def test_step_time_grows_with_batch_kv_and_prefill_and_fp8_halves_attention() -> None:
    p = PROFILES["seed"]
    base = p.step_time_s(10, 10_000, 0)
    assert p.step_time_s(20, 10_000, 0) > base
    assert p.step_time_s(10, 20_000, 0) > base
    assert p.step_time_s(10, 10_000, 100) > base
    # ~17 tok/s per request at ~40 running on a full 116K bf16 pool (the seed's figure)
    assert 15.0 < 1.0 / p.step_time_s(40, 100_000, 0) < 20.0
    bf16, fp8 = get_profile("seed", "bf16"), get_profile("seed", "fp8_e4m3")
    assert fp8.decode_per_kv_token_s == pytest.approx(bf16.decode_per_kv_token_s / 2)
    assert fp8.step_time_s(1, 0, 0) == bf16.step_time_s(1, 0, 0)
