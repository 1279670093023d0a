"""Matrix operations on lists of rows."""


def shape(m):
    """(rows, columns) of ``m``; every row must have the same, non-zero length."""
    if not m or not m[0]:
        raise ValueError("a matrix needs at least one row and one column")
    width = len(m[0])
    if any(len(row) != width for row in m):
        raise ValueError("rows have different lengths")
    return len(m), width


def identity(n):
    return [[1 if i == j else 0 for j in range(n)] for i in range(n)]


def transpose(m):
    rows, cols = shape(m)
    return [[m[i][j] for i in range(rows)] for j in range(cols)]


def add(a, b):
    if shape(a) != shape(b):
        raise ValueError(f"cannot add a {shape(a)} matrix and a {shape(b)} matrix")
    return [[x + y for x, y in zip(ra, rb)] for ra, rb in zip(a, b)]


def multiply(a, b):
    """The matrix product ``a @ b``."""
    rows_a, cols_a = shape(a)
    rows_b, cols_b = shape(b)
    if cols_a != rows_b:
        raise ValueError(f"cannot multiply a {rows_a}x{cols_a} matrix by a {rows_b}x{cols_b} matrix")
    return [[sum(a[i][k] * b[k][j] for k in range(rows_a)) for j in range(cols_b)] for i in range(rows_a)]
