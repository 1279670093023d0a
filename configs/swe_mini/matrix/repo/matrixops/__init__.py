"""Small dense-matrix helpers on lists of lists."""

from matrixops.ops import add, identity, multiply, shape, transpose

__all__ = ["add", "identity", "multiply", "shape", "transpose"]
