"""The end-of-run pictures of a run's history: the text chart (a table for a short run) and the SVG image."""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from pathlib import Path

from textgen.plot import BATCH_LABEL, loss_chart, loss_svg, read_batch_losses, read_history, write_loss_charts

SVG = "{http://www.w3.org/2000/svg}"


def history(epochs: int) -> dict[str, list[float]]:
    """A falling curve of ``epochs`` rows, as read_history returns a run's history.csv."""
    return {
        "epoch": [float(i) for i in range(epochs)],
        "bpc": [1.2 + 2.5 * math.exp(-i / 50) for i in range(epochs)],
        "val_bpc": [1.4 + 2.0 * math.exp(-i / 50) for i in range(epochs)],
        "batches": [96.0] * epochs,
        "seconds": [90.0 * (i + 1) for i in range(epochs)],
    }


def svg_points(svg: str) -> dict[str, int]:
    """Points drawn per series: the vertices of its lines."""
    counts = {"bpc": 0, "val_bpc": 0}
    for line in ET.fromstring(svg).iter(f"{SVG}polyline"):
        counts[line.get("class", "")] += len(line.get("points", "").split())
    return counts


def test_one_epoch_is_its_numbers_not_a_chart() -> None:
    lines = loss_chart({**history(1), "bpc": [3.5], "val_bpc": [2.25]}).splitlines()
    assert lines == [
        "epoch  train bits/char  validation bits/char  trained",
        "    1            3.500                 2.250    1m30s",
        "best epoch 1: validation 2.250 bits/char; 1 epoch in 1m30s",
    ]


def test_two_epochs_are_a_table_and_a_last_epoch_cut_short_says_so() -> None:
    cut = {**history(2), "batches": [96.0, 54.0], "partial": [0.0, 1.0]}
    lines = loss_chart(cut).splitlines()
    assert [line.split()[0] for line in lines[1:3]] == ["1", "2"]
    assert lines[-1].endswith("1 epoch and 54 batches in 3m00s")  # complete epochs, as textgen counts them


def test_a_first_epoch_cut_short_is_not_counted_as_an_epoch() -> None:
    cut = {**history(1), "batches": [404.0], "partial": [1.0]}
    assert loss_chart(cut).splitlines()[-1].endswith("; 0 epochs and 404 batches in 1m30s")


def test_chart_puts_the_highest_value_on_top_and_the_lowest_at_the_bottom() -> None:
    chart = loss_chart({"bpc": [3.0, 2.0, 1.6, 1.5], "val_bpc": [2.5, 2.2, 2.0, 1.0]}, height=8).splitlines()
    assert chart[0].startswith("3.000 |o")  # train epoch 1, the maximum
    assert chart[7].startswith("1.000 |") and chart[7].rstrip().endswith("*")  # validation epoch 4, the minimum
    assert sum(line.count("o") for line in chart[:8]) == 4
    assert sum(line.count("*") for line in chart[:8]) == 4
    assert chart[9].split() == ["1", "2", "3", "4", "epoch"]
    assert chart[-1] == "best epoch 4: validation 1.000 bits/char; 4 epochs"


def test_500_epochs_fit_the_width_with_round_epoch_labels() -> None:
    chart = loss_chart(history(500), height=10, width=60).splitlines()
    plot = chart[:10]
    assert {len(line) for line in plot} == {len("4.200 |") + 60}
    assert chart[11].split() == ["1", "100", "200", "300", "400", "500", "epoch"]
    assert "the mean of up to 9 epochs" in chart[12]
    assert chart[-1].startswith("best epoch 500: validation 1.4") and chart[-1].endswith("500 epochs in 12h30m")


def test_values_that_are_not_finite_are_left_out_of_the_chart_and_shown_in_the_table() -> None:
    broken = {"bpc": [3.0, math.nan, 2.0, math.inf, 1.5], "val_bpc": [2.5, 2.2, math.nan, 1.9, 1.8]}
    chart = loss_chart(broken, height=6).splitlines()
    assert sum(line.count("o") for line in chart[:6]) == 3
    assert sum(line.count("*") for line in chart[:6]) == 4
    assert chart[-1].startswith("best epoch 5: validation 1.800 bits/char")
    table = loss_chart({"bpc": [math.nan, math.inf], "val_bpc": [math.nan, 2.0]}).splitlines()
    assert table[1].split()[1:3] == ["nan", "nan"] and table[2].split()[1:3] == ["inf", "2.000"]
    assert loss_chart({"bpc": [math.nan] * 5}).startswith("no finite losses to chart")
    assert svg_points(loss_svg(broken)) == {"bpc": 3, "val_bpc": 4}
    assert len([line for line in ET.fromstring(loss_svg(broken)).iter(f"{SVG}polyline")]) == 5  # gaps break lines


def test_no_history(tmp_path: Path) -> None:
    assert loss_chart({}) == "no epochs yet\n"
    assert read_history(Path("/nonexistent/history.csv")) == {}
    (tmp_path / "history.csv").write_text("epoch,bpc,val_bpc\n")  # a run stopped before its first epoch's end
    charts = (tmp_path / "loss_curve.txt", tmp_path / "loss_curve.svg")
    write_loss_charts(tmp_path / "history.csv", tmp_path / "batch_losses.csv", *charts)
    assert (tmp_path / "loss_curve.txt").read_text() == "no epochs yet\n"
    svg = ET.fromstring(loss_svg({}))
    assert "no epochs yet" in "".join(svg.itertext()) and not list(svg.iter(f"{SVG}polyline"))


def test_svg_has_both_series_with_a_point_per_epoch() -> None:
    for epochs in (1, 2, 500):
        svg = loss_svg(history(epochs))
        root = ET.fromstring(svg)
        assert root.tag == f"{SVG}svg"
        assert svg_points(svg) == {"bpc": epochs, "val_bpc": epochs}
        text = "".join(root.itertext())
        assert "train bits/char" in text and "validation bits/char" in text and "epoch" in text
        assert f"{epochs} epoch" in text
    one = ET.fromstring(loss_svg(history(1)))
    assert len(list(one.iter(f"{SVG}circle"))) == 2  # one epoch: a dot per series, not an invisible line


def test_a_run_of_few_epochs_draws_its_training_loss_by_batch(tmp_path: Path) -> None:
    batches = [(i / 50, 3.5 - i / 50) for i in range(1, 51)]  # one epoch of 50 points
    root = ET.fromstring(loss_svg(history(1), batches=batches))
    assert svg_points(ET.tostring(root, encoding="unicode")) == {"bpc": 50, "val_bpc": 1}
    labels = [t.text for t in root.iter(f"{SVG}text")]
    assert BATCH_LABEL in labels and [t for t in labels if t and t[0] in "01"] == ["0", "0.2", "0.4", "0.6", "0.8", "1"]
    assert svg_points(loss_svg(history(4), batches=batches)) == {"bpc": 4, "val_bpc": 4}  # more epochs: one an epoch
    early = ET.fromstring(loss_svg({}, batches=batches[:10]))  # the first epoch under way
    assert svg_points(ET.tostring(early, encoding="unicode")) == {"bpc": 10, "val_bpc": 0}
    assert "no epochs yet" in "".join(early.itertext())
    path = tmp_path / "batch_losses.csv"
    path.write_text("epoch,batch,steps,bpc\n1,10,20,2.5\n0,20,20,3.0\n1,1")  # a row being written last
    assert read_batch_losses(path) == [(1.0, 3.0), (1.5, 2.5)]
    assert read_batch_losses(tmp_path / "none.csv") == []


def test_svg_text_is_escaped() -> None:
    title = "<b>war & peace</b> 'x' \"y\"\x01"
    root = ET.fromstring(loss_svg(history(3), title=title))
    heading = root.find(f"{SVG}text")
    assert heading is not None and heading.text == "<b>war & peace</b> 'x' \"y\": bits per character"
    assert not list(root.iter(f"{SVG}b"))


def test_write_loss_charts_writes_both_files_from_history_csv(tmp_path: Path) -> None:
    run = tmp_path / "my-run"
    run.mkdir()
    (run / "history.csv").write_text("epoch,bpc,val_bpc,seconds\n0,3.5,3.0,60\n1,2.5,,120\n")
    write_loss_charts(run / "history.csv", run / "batch_losses.csv", run / "loss_curve.txt", run / "loss_curve.svg")
    assert (run / "loss_curve.txt").read_text().splitlines()[2].split() == ["2", "2.500", "nan", "2m00s"]
    root = ET.parse(run / "loss_curve.svg").getroot()
    assert "my-run: bits per character" in "".join(root.itertext())
    assert svg_points(ET.tostring(root, encoding="unicode")) == {"bpc": 2, "val_bpc": 1}
    assert sorted(p.name for p in run.iterdir()) == ["history.csv", "loss_curve.svg", "loss_curve.txt"]


def test_trained_run_has_a_loss_curve(trained_run) -> None:
    history = read_history(trained_run.run.history_path)
    curve = trained_run.run.loss_curve_path.read_text(encoding="utf-8")
    assert curve == loss_chart(history)
    assert f"{len(history['val_bpc'])} epochs in " in curve
    rows = trained_run.run.batch_losses_path.read_text().splitlines()[1:]
    ends = [(int(e), int(b)) for e, b, steps, _ in (row.split(",") for row in rows) if b == steps]
    assert ends == [(epoch, trained_run.steps_per_epoch) for epoch in range(3)]  # the first 3 of its 4 epochs
    assert len(rows) <= 3 * 100 + 3
