"""summarize: count, min, max and mean of every numeric column of a CSV text."""

import csv
import io


def summarize(text):
    """``{column: {"count", "min", "max", "mean"}}`` for every numeric column of ``text``.

    The first row is the header. A column is numeric when every non-blank cell in it is a
    number; blank cells are not counted.
    """
    reader = csv.DictReader(io.StringIO(text))
    columns = {name: [] for name in reader.fieldnames or []}
    for row in reader:
        for name in columns:
            columns[name].append(row.get(name))
    summary = {}
    for name, cells in columns.items():
        try:
            values = [float(cell) for cell in cells]
        except ValueError:
            continue  # a text column
        if values:
            summary[name] = {
                "count": len(values),
                "min": min(values),
                "max": max(values),
                "mean": sum(values) / len(values),
            }
    return summary


def format_summary(summary):
    """One line per column: name, count, min, max, mean, aligned."""
    if not summary:
        return ""
    width = max(len(name) for name in summary)
    lines = []
    for name, stats in summary.items():
        lines.append(
            f"{name:<{width}}  n={stats['count']}  min={stats['min']:g}  max={stats['max']:g}  mean={stats['mean']:.3g}"
        )
    return "\n".join(lines)
