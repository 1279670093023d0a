"""LRUCache: at most ``capacity`` entries; the least recently used one is evicted first."""

from collections import OrderedDict

_MISSING = object()


class LRUCache:
    """A bounded mapping. Both ``get`` and ``put`` count as a use of the key."""

    def __init__(self, capacity):
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self.hits = 0
        self.misses = 0
        self._data = OrderedDict()  # least recently used first

    def get(self, key, default=None):
        value = self._data.get(key, _MISSING)
        if value is _MISSING:
            self.misses += 1
            return default
        self.hits += 1
        return value

    def put(self, key, value):
        if key in self._data:
            self._data.move_to_end(key)
        self._data[key] = value
        while len(self._data) > self.capacity:
            self._data.popitem(last=False)

    def pop(self, key, default=None):
        return self._data.pop(key, default)

    def keys(self):
        """Keys from least to most recently used."""
        return list(self._data)

    def __contains__(self, key):
        # A membership test is not a use: it must not change what gets evicted.
        return key in self._data

    def __len__(self):
        return len(self._data)
