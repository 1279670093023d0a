"""A least-recently-used cache with a fixed capacity."""

from lru.cache import LRUCache

__all__ = ["LRUCache"]
