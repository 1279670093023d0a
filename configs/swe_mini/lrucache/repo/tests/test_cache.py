import pytest

from lru import LRUCache


def test_capacity_must_be_positive():
    with pytest.raises(ValueError):
        LRUCache(0)


class TestPutAndGet:
    def test_get_returns_what_was_put(self):
        cache = LRUCache(2)
        cache.put("a", 1)
        assert cache.get("a") == 1

    def test_missing_key_gives_the_default(self):
        assert LRUCache(1).get("nope", 42) == 42

    def test_hits_and_misses_are_counted(self):
        cache = LRUCache(2)
        cache.put("a", 1)
        cache.get("a")
        cache.get("b")
        assert (cache.hits, cache.misses) == (1, 1)

    def test_overwrite_keeps_one_entry(self):
        cache = LRUCache(2)
        cache.put("a", 1)
        cache.put("a", 2)
        assert len(cache) == 1 and cache.get("a") == 2


class TestEviction:
    def test_oldest_entry_is_evicted(self):
        cache = LRUCache(2)
        for key in "abc":
            cache.put(key, key.upper())
        assert cache.keys() == ["b", "c"]

    def test_put_refreshes_a_key(self):
        cache = LRUCache(2)
        cache.put("a", 1)
        cache.put("b", 2)
        cache.put("a", 3)
        cache.put("c", 4)
        assert "a" in cache and "b" not in cache

    def test_membership_test_does_not_refresh(self):
        cache = LRUCache(2)
        cache.put("a", 1)
        cache.put("b", 2)
        assert "a" in cache
        cache.put("c", 3)
        assert "a" not in cache
