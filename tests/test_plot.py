"""The text loss chart written next to history.csv."""

from pathlib import Path

from textgen.plot import loss_chart, read_history


def test_chart_puts_the_highest_value_on_top_and_the_lowest_at_the_bottom() -> None:
    chart = loss_chart({"bpc": [3.0, 2.0, 1.5], "val_bpc": [2.5, 2.2, 1.0]}, height=8).splitlines()
    assert chart[0].startswith(" 3.000 |o")  # train epoch 1, the maximum
    assert chart[7].startswith(" 1.000 |") and chart[7].rstrip().endswith("*")  # validation epoch 3, the minimum
    assert sum(line.count("o") for line in chart[:8]) == 3
    assert sum(line.count("*") for line in chart[:8]) == 3
    assert "epoch 3" in chart[9]


def test_chart_of_no_history() -> None:
    assert loss_chart({}) == "no epochs yet\n"
    assert read_history(Path("/nonexistent/history.csv")) == {}


def test_trained_run_has_a_loss_curve(trained_run) -> None:
    history = read_history(trained_run.run.history_path)
    curve = trained_run.run.loss_curve_path.read_text(encoding="utf-8")
    assert curve == loss_chart(history)
    assert f"epoch {len(history['val_bpc'])}" in curve
