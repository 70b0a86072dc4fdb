"""A plain-text line chart of the training history, written next to history.csv."""

from __future__ import annotations

import csv
import math
from pathlib import Path

MARKS = {"bpc": "o", "val_bpc": "*"}
LABELS = {"bpc": "train bits/char", "val_bpc": "validation bits/char"}


def read_history(path: Path) -> dict[str, list[float]]:
    """Columns of a history.csv as floats (empty if the file is missing)."""
    if not Path(path).is_file():
        return {}
    with open(path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    return {key: [float(row[key]) for row in rows] for key in (rows[0] if rows else {})}


def loss_chart(history: dict[str, list[float]], height: int = 12, width: int = 60) -> str:
    """Train and validation bits/char per epoch as a text chart ('o' train, '*' validation)."""
    series = {k: history[k] for k in MARKS if history.get(k)}
    if not series:
        return "no epochs yet\n"
    values = [v for s in series.values() for v in s if math.isfinite(v)]
    low, high = min(values), max(values)
    span = (high - low) or 1.0
    epochs = max(len(s) for s in series.values())
    columns = min(width, max(4 * (epochs - 1) + 1, 16))  # room between epochs
    grid = [[" "] * columns for _ in range(height)]
    for key, points in series.items():
        for i, value in enumerate(points):
            if not math.isfinite(value):
                continue
            col = round(i * (columns - 1) / max(epochs - 1, 1))
            row = round((high - value) / span * (height - 1))
            grid[row][col] = MARKS[key]
    lines = [f"{high - r * span / (height - 1):6.3f} |{''.join(cells)}" for r, cells in enumerate(grid)]
    lines.append(" " * 7 + "+" + "-" * columns)
    lines.append(" " * 8 + f"epoch 1{'':>{max(columns - 14, 1)}}epoch {epochs}")
    lines.append("        " + "   ".join(f"{MARKS[k]} {LABELS[k]}" for k in series))
    return "\n".join(lines) + "\n"
