"""The end-of-run pictures of a run's history.csv: a text chart (a table for a short run) and an SVG image."""

from __future__ import annotations

import csv
import math
import textwrap
from dataclasses import dataclass
from pathlib import Path
from xml.sax.saxutils import escape

from textgen.durations import format_seconds
from textgen.files import atomic_write_text
from textgen.results import epochs_done

MARKS = {"bpc": "o", "val_bpc": "*"}
LABELS = {"bpc": "train bits/char", "val_bpc": "validation bits/char"}
COLOURS = {"bpc": "#1f77b4", "val_bpc": "#d62728"}
BATCH_LABEL = "train bits/char, by batch"  # the curve of a run of few epochs (``read_batch_losses``)
TABLE_UPTO = 3  # epochs shown as a table of numbers: a chart of so few points says less


def read_history(path: Path) -> dict[str, list[float]]:
    """Columns of a history.csv as floats (empty if the file is missing; an empty cell is NaN)."""
    if not Path(path).is_file():
        return {}
    with open(path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    return {key: [float(row[key] or "nan") for row in rows] for key in (rows[0] if rows else {})}


def read_batch_losses(path: Path) -> list[tuple[float, float]]:
    """A run's batch_losses.csv as (epochs trained, training bits/char) points, in order (none if the file is
    missing)."""
    if not Path(path).is_file():
        return []
    points = []
    with open(path, newline="") as fh:
        for row in csv.DictReader(fh):
            try:
                points.append((int(row["epoch"]) + int(row["batch"]) / int(row["steps"]), float(row["bpc"])))
            except (TypeError, ValueError, ZeroDivisionError):  # a row being written, or one a kill cut short
                continue
    return sorted(points)


def write_loss_charts(history_path: Path, batch_losses_path: Path, text_path: Path, svg_path: Path) -> None:
    """Write the text chart and the SVG image of a run's history.csv (and batch_losses.csv), titled with the run's
    name."""
    history = read_history(history_path)
    atomic_write_text(text_path, loss_chart(history))
    svg = loss_svg(history, title=Path(history_path).parent.name, batches=read_batch_losses(batch_losses_path))
    atomic_write_text(svg_path, svg)


def loss_chart(history: dict[str, list[float]], height: int = 12, width: int = 60) -> str:
    """Train and validation bits/char per epoch: a table up to ``TABLE_UPTO`` epochs, then a text chart ('o' train,
    '*' validation, drawn over 'o' where they meet) of at most ``width`` columns, each the mean of the epochs it
    covers; a summary line last."""
    if not any(history.get(key) for key in MARKS):
        return "no epochs yet\n"
    epochs = _epochs(history)
    lines = _table(history, epochs) if len(epochs) <= TABLE_UPTO else _chart(history, epochs, height, width)
    return "\n".join([*lines, summary(history)]) + "\n"


def summary(history: dict[str, list[float]]) -> str:
    """One line: the best epoch's validation bits/char (a fine-tuned run may keep its base's weights instead), and the
    epochs and time trained, counted as textgen counts them everywhere (an epoch a time budget cut, the last row, says
    so in its ``partial`` column)."""
    epochs = _epochs(history)
    parts = []
    val = [(v, e) for v, e in zip(history.get("val_bpc", []), epochs, strict=False) if math.isfinite(v)]
    if val:
        best, at = min(val)
        parts.append(f"best epoch {at}: validation {best:.3f} bits/char")
    seconds = history.get("seconds", [])
    trained = f" in {format_seconds(seconds[-1])}" if seconds and math.isfinite(seconds[-1]) else ""
    cut = history.get("partial", [0.0])[-1] == 1  # history.csv written before the column: every epoch whole
    batches = history.get("batches", [0.0])[-1] if cut else 0
    parts.append(f"{epochs_done(len(epochs) - cut, round(batches))}{trained}")
    return "; ".join(parts)


def loss_svg(
    history: dict[str, list[float]],
    title: str = "",
    width: int = 640,
    height: int = 400,
    batches: list[tuple[float, float]] | None = None,
) -> str:
    """Train and validation bits/char per epoch as an SVG line chart: a point per epoch, a gap at a value that is
    not finite. Up to ``TABLE_UPTO`` epochs, the training loss is drawn from ``batches`` instead, if there are any
    (``read_batch_losses``: a point an epoch would be a dot or two). ``title`` (the run's name) is shown as text."""
    epochs = _epochs(history)
    by_batch = bool(batches) and len(epochs) <= TABLE_UPTO
    points: dict[str, list[tuple[float, float]]] = {
        key: list(zip(epochs, history.get(key, []), strict=False)) for key in MARKS
    }
    if by_batch:
        points["bpc"] = list(batches or [])
    series = {key: p for key, p in points.items() if p}
    values = [v for p in series.values() for _, v in p if math.isfinite(v)]
    first, last = (epochs[0], epochs[-1]) if epochs else (1, 1)
    x0, x1 = (first, last) if last > first else (first - 0.5, last + 0.5)  # one epoch: in the middle
    if by_batch:  # from the start of training
        x0, x1 = 0, max(x for p in series.values() for x, _ in p)
    y_ticks = _value_ticks(values)
    frame = _Frame(64, width - 16, 72, height - 48, x0, x1, y_ticks[0], y_ticks[-1])
    heading = f"{title}: bits per character" if title else "bits per character"
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        'font-family="sans-serif" font-size="12">',
        '<rect width="100%" height="100%" fill="white"/>',
        f'<text x="{frame.left}" y="20" font-size="15">{_xml_text(heading)}</text>',
    ]
    # The summary under the heading, on two lines if it needs them (a 640-pixel image holds about 80 characters).
    for i, line in enumerate(textwrap.wrap(summary(history) if epochs else "no epochs yet", 80)):
        out.append(f'<text x="{frame.left}" y="{38 + 15 * i}" fill="#555">{_xml_text(line)}</text>')
    out += _axes(frame, y_ticks, height, whole_epochs=not by_batch)
    for key, p in series.items():
        out += _series(frame, key, p)
    labels = {**LABELS, "bpc": BATCH_LABEL} if by_batch else LABELS
    out += _legend(frame, list(series), labels)
    return "\n".join([*out, "</svg>"]) + "\n"


@dataclass(frozen=True)
class _Frame:
    """The chart's plot area in pixels, and the epochs (x) and values (y) it spans."""

    left: float
    right: float
    top: float
    bottom: float
    x0: float
    x1: float
    y0: float
    y1: float

    def x(self, epoch: float) -> float:
        return self.left + (epoch - self.x0) / (self.x1 - self.x0) * (self.right - self.left)

    def y(self, value: float) -> float:
        return self.bottom - (value - self.y0) / (self.y1 - self.y0) * (self.bottom - self.top)


def _value_ticks(values: list[float]) -> list[float]:
    """Round values from at or below the lowest of ``values`` to at or above the highest, about 6 steps."""
    low, high = (min(values), max(values)) if values else (0.0, 1.0)
    step = _step(high - low or abs(high) or 1.0, 6)
    bottom_tick = math.floor(low / step + 1e-9)
    top_tick = max(math.ceil(high / step - 1e-9), bottom_tick + 1)
    return [k * step for k in range(bottom_tick, top_tick + 1)]


def _axes(frame: _Frame, y_ticks: list[float], height: int, whole_epochs: bool) -> list[str]:
    """Grid lines and labels at ``y_ticks``, round epochs (``whole_epochs``: whole ones) along the bottom, and the
    axes."""
    y_step = y_ticks[1] - y_ticks[0]
    decimals = max(0, -math.floor(math.log10(y_step) + 1e-9))
    x_step = _step(frame.x1 - frame.x0, 6)
    if whole_epochs:
        x_step = max(1, round(x_step))
    first, last = math.ceil(frame.x0 / x_step - 1e-9), math.floor(frame.x1 / x_step + 1e-9)
    x_ticks = [k * x_step for k in range(first, last + 1)]
    left, right, bottom = frame.left, frame.right, frame.bottom
    out = []
    for tick in y_ticks:
        y = frame.y(tick)
        out.append(f'<line x1="{left}" y1="{y:.1f}" x2="{right}" y2="{y:.1f}" stroke="#e4e4e4"/>')
        out.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{tick:.{decimals}f}</text>')
    for tick in x_ticks:
        x = frame.x(tick)
        out.append(f'<line x1="{x:.1f}" y1="{bottom}" x2="{x:.1f}" y2="{bottom + 5}" stroke="black"/>')
        out.append(f'<text x="{x:.1f}" y="{bottom + 18}" text-anchor="middle">{tick:g}</text>')
    out.append(f'<path d="M{left},{frame.top} V{bottom} H{right}" fill="none" stroke="black"/>')
    out.append(f'<text x="{(left + right) / 2:.0f}" y="{height - 10}" text-anchor="middle">epoch</text>')
    return out


def _series(frame: _Frame, key: str, points: list[tuple[float, float]]) -> list[str]:
    """One series as lines between its finite points (a value that is not finite breaks the line), and dots."""
    colour = COLOURS[key]
    runs: list[list[tuple[float, float]]] = [[]]
    for epoch, value in points:
        if math.isfinite(value):
            runs[-1].append((epoch, value))
        elif runs[-1]:
            runs.append([])
    out = []
    for run in filter(None, runs):
        coords = " ".join(f"{frame.x(e):.1f},{frame.y(v):.1f}" for e, v in run)
        out.append(f'<polyline class="{key}" points="{coords}" fill="none" stroke="{colour}" stroke-width="2"/>')
    if len(points) <= 60:  # dots while they stay apart: one epoch is a dot, not an invisible line
        dots = [(e, v) for e, v in points if math.isfinite(v)]
        out += [
            f'<circle class="{key}" cx="{frame.x(e):.1f}" cy="{frame.y(v):.1f}" r="3" fill="{colour}"/>'
            for e, v in dots
        ]
    return out


def _legend(frame: _Frame, keys: list[str], labels: dict[str, str]) -> list[str]:
    out = []
    for i, key in enumerate(keys):
        row, right = frame.top + 12 + 18 * i, frame.right
        out.append(
            f'<line x1="{right - 150}" y1="{row}" x2="{right - 130}" y2="{row}" stroke="{COLOURS[key]}" stroke-width="2"/>'
        )
        out.append(f'<text x="{right - 124}" y="{row + 4}">{labels[key]}</text>')
    return out


def _epochs(history: dict[str, list[float]]) -> list[int]:
    """The 1-based epoch of each row (history.csv counts from 0)."""
    if history.get("epoch"):
        return [int(e) + 1 for e in history["epoch"]]
    return list(range(1, max((len(history.get(key, [])) for key in MARKS), default=0) + 1))


def _table(history: dict[str, list[float]], epochs: list[int]) -> list[str]:
    def cell(key: str, i: int) -> str:
        column = history.get(key, [])
        return f"{column[i]:.3f}" if i < len(column) else "-"

    lines = [f"{'epoch':>5}  {LABELS['bpc']:>15}  {LABELS['val_bpc']:>20}  {'trained':>7}"]
    for i, epoch in enumerate(epochs):
        seconds = history.get("seconds", [])
        trained = format_seconds(seconds[i]) if i < len(seconds) and math.isfinite(seconds[i]) else "-"
        lines.append(f"{epoch:>5}  {cell('bpc', i):>15}  {cell('val_bpc', i):>20}  {trained:>7}")
    return lines


def _chart(history: dict[str, list[float]], epochs: list[int], height: int, width: int) -> list[str]:
    count = len(epochs)
    columns = min(width, max(4 * (count - 1) + 1, 16))  # room between the epochs of a short run

    def column(i: int) -> int:
        return round(i * (columns - 1) / (count - 1))

    means: dict[str, dict[int, float]] = {}
    for key in MARKS:
        buckets: dict[int, list[float]] = {}
        for i, value in enumerate(history.get(key, [])):
            if math.isfinite(value):
                buckets.setdefault(column(i), []).append(value)
        means[key] = {c: sum(vs) / len(vs) for c, vs in buckets.items()}
    values = [v for by_column in means.values() for v in by_column.values()]
    if not values:
        return ["no finite losses to chart"]
    low, high = min(values), max(values)
    span = (high - low) or 1.0
    grid = [[" "] * columns for _ in range(height)]
    for key, by_column in means.items():
        for c, value in by_column.items():
            grid[round((high - value) / span * (height - 1))][c] = MARKS[key]
    labels = [f"{high - r * span / (height - 1):.3f}" for r in range(height)]
    pad = max(map(len, labels))
    lines = [f"{label:>{pad}} |{''.join(cells)}" for label, cells in zip(labels, grid, strict=True)]
    lines.append(" " * pad + " +" + "-" * columns)
    # Epoch labels under their columns: the first and the last, then round ones where they clear the others, at
    # most about six of them.
    room = (len(str(epochs[-1])) + 1) * (count - 1) / (columns - 1)  # epochs a label and a space span
    step = max(1, round(_step(max(room, (epochs[-1] - epochs[0]) / 6), 1)))
    row, taken = [" "] * columns, [False] * (columns + 1)
    for i in [0, count - 1, *(i for i, e in enumerate(epochs) if e % step == 0)]:
        text = str(epochs[i])
        start = min(max(column(i) - len(text) // 2, 0), columns - len(text))
        if not any(taken[max(start - 1, 0) : start + len(text) + 1]):
            row[start : start + len(text)] = text
            taken[start : start + len(text)] = [True] * len(text)
    lines.append(" " * (pad + 2) + "".join(row) + "  epoch")
    legend = "   ".join(f"{MARKS[k]} {LABELS[k]}" for k in MARKS if means[k])
    if count > columns:
        legend += f"   (a column: the mean of up to {math.ceil(count / columns)} epochs)"
    lines.append(" " * (pad + 2) + legend)
    return lines


def _step(span: float, most: int) -> float:
    """A round step, 1, 2 or 5 x 10^k, that cuts ``span`` into at most about ``most`` parts."""
    raw = span / most
    power = 10.0 ** math.floor(math.log10(raw))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= raw * (1 - 1e-9))


def _xml_text(text: str) -> str:
    """``text`` as XML character data: escaped, and without the control characters XML 1.0 cannot hold."""
    return escape("".join(ch for ch in text if ch.isprintable()))
