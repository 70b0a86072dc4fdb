"""textgen tune: the search space, the same-time pruner, a real study on a tiny corpus (it runs, prunes, resumes
after Ctrl-C or a kill) and its best recipe reproduced by train --config / --from-study."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from helpers import assert_one_line_error, invoke, run_python, subprocess_env, wait_for, wait_until, write_corpus
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState

from textgen.checkpoint import Run
from textgen.config import TrainConfig
from textgen.device import CPU
from textgen.errors import ConfigError
from textgen.recipe import read_recipe, recipe_of
from textgen.rundirs import study_path
from textgen.search import SameTimePruner, SearchSpace
from textgen.study import load_study_in, show_study, storage_of
from textgen.training.progress import NoProgress
from textgen.tune import Reporter, _requeue_interrupted

# A tiny model, so that a trial of a few seconds trains several epochs; the rest of the recipe is searched.
TINY = ["--units", "32", "--layers", "1", "--embedding-dim", "8", "--batch-size", "8", "--seq-len", "32"]
FIXED = {
    "data": {"batch_size": 8, "seq_len": 32},
    "model": {"units": 32, "layers": 1, "embedding_dim": 8},
    "training": {},
}


def _finished(study: optuna.Study, curve: dict[int, float], value: float | None = None) -> None:
    study.add_trial(
        optuna.trial.create_trial(
            params={"lr": 1e-3},
            distributions={"lr": FloatDistribution(1e-4, 1e-2, log=True)},
            value=min(curve.values()) if value is None else value,
            intermediate_values=curve,
        )
    )


@pytest.mark.parametrize(
    ("reports", "pruned"),
    [
        ({2000: 2.0}, True),  # behind both finished trials' best by 2 s (1.5 and 1.8)
        ({2000: 1.6}, False),  # ahead of their median (1.65)
        ({500: 9.0}, False),  # in the warm-up
        ({1200: 9.0}, False),  # only one finished trial had reported by 1.2 s
        ({2000: 1.4, 3000: 1.9}, False),  # its best by then counts, as the finished trials' does
    ],
)
def test_the_pruner_compares_trials_at_the_same_training_time(reports: dict[int, float], pruned: bool) -> None:
    study = optuna.create_study(pruner=SameTimePruner(min_trials=2, warmup_ms=1000))
    _finished(study, {1000: 2.5, 2000: 1.5, 4000: 1.2})
    _finished(study, {1500: 2.2, 1900: 1.8, 5000: 1.1})
    trial = study.ask()
    for step, value in reports.items():
        trial.report(value, step)
    assert trial.should_prune() is pruned


def test_a_trial_whose_epochs_are_long_is_judged_mid_epoch() -> None:
    """With no epoch's end for a fifth of its budget, a trial is validated mid-epoch, and pruned there if behind."""
    study = optuna.create_study(pruner=SameTimePruner(min_trials=2, warmup_ms=20_000))
    _finished(study, {10_000: 1.5, 30_000: 1.2, 100_000: 1.0})
    _finished(study, {10_000: 1.6, 30_000: 1.3, 100_000: 1.1})
    reporter = Reporter(study.ask(), NoProgress(), started=0.0, budget=100.0)
    assert not reporter.due(19.9) and reporter.due(20.0)
    assert not reporter.should_stop(20.0, 1.5)  # ahead of the finished trials' 1.55 by 20 s
    assert not reporter.due(39.9) and reporter.due(40.0)
    assert reporter.should_stop(40.0, 1.3)  # behind their 1.25 by 40 s
    assert reporter.due(80.0) and not reporter.due(80.1)  # not in the last fifth: the trial's own validation follows


def test_the_search_space_keeps_fixed_settings_and_fits_the_corpus() -> None:
    space = SearchSpace(FIXED, val_chars=700, profile=CPU)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(20):
        recipe = space.suggest(study.ask())
        assert recipe["data"] == FIXED["data"] and {**recipe["model"], **FIXED["model"]} == recipe["model"]
        training = recipe["training"]
        assert training["momentum"] == (0.9 if training["optimizer"] == "sgd" else 0.0)
        assert (training["weight_decay"] > 0) == (training["optimizer"] == "adamw")
        assert (training["lr"] >= 0.02) == (training["optimizer"] == "sgd")  # SGD's own range
    free = SearchSpace({}, val_chars=6_000, profile=CPU)  # 64 x 100 does not fit: the first trial leaves it out
    assert free.batch_sizes == [16, 32, 64] and "batch_size" not in free.first_params()
    for _ in range(20):
        data = free.suggest(study.ask())["data"]
        assert data["batch_size"] * data["seq_len"] < 6_000
    assert SearchSpace({}, val_chars=200_000, profile=CPU).first_params() == {
        "optimizer": "adam",
        "lr": 2e-3,
        "weight_decay": 0.0,
        "clip_norm": 5.0,
        "units": 512,
        "layers": 1,
        "embedding_dim": 64,
        "dropout": 0.1,
        "layer_norm": False,
        "weight_drop": 0.0,
        "locked_output_dropout": None,
        "batch_size": 64,
        "seq_len": 100,
    }
    with pytest.raises(ConfigError, match="too short to tune on"):
        SearchSpace({}, val_chars=700, profile=CPU)
    # A fixed batch of 128 holds 128 x 50 but not the default 128 x 100; a fixed 400 holds 16 x 400 but not 64 x 400.
    for fixed in ({"batch_size": 128}, {"seq_len": 400}):
        space = SearchSpace({"data": fixed}, val_chars=10_000, profile=CPU)
        study = optuna.create_study()
        study.enqueue_trial(space.first_params())
        data = space.suggest(study.ask())["data"]
        assert data["batch_size"] * data["seq_len"] < 10_000, fixed


def test_the_search_tries_weight_drop_and_a_locked_output_unless_they_are_fixed() -> None:
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    space = SearchSpace(FIXED, val_chars=700, profile=CPU)
    models = [space.suggest(study.ask())["model"] for _ in range(30)]
    for m in models:  # 0 to 0.5 in steps of 0.05
        assert 0.0 <= m["weight_drop"] <= 0.5 and m["weight_drop"] == pytest.approx(round(m["weight_drop"] * 20) / 20)
    assert max(m["weight_drop"] for m in models) > 0.25
    locked = {m["locked_output_dropout"] for m in models}
    assert None in locked and locked - {None} and locked <= {None, 0.0, 0.1, 0.2, 0.3, 0.4}
    fixed = {**FIXED, "model": {**FIXED["model"], "weight_drop": 0.25, "locked_output_dropout": 0.2}}
    model = SearchSpace(fixed, val_chars=700, profile=CPU).suggest(study.ask())["model"]
    assert (model["weight_drop"], model["locked_output_dropout"]) == (0.25, 0.2)


def test_fixed_settings_that_cannot_work_are_refused_and_the_first_trial_follows_a_fixed_optimizer() -> None:
    with pytest.raises(ConfigError, match="--batch-size 64 x --seq-len 100 needs more validation text"):
        SearchSpace({"data": {"batch_size": 64, "seq_len": 100}}, val_chars=5_000, profile=CPU)
    with pytest.raises(ConfigError, match="a fixed --lr needs a fixed --optimizer"):
        SearchSpace({"training": {"lr": 0.01}}, val_chars=200_000, profile=CPU)
    sgd = SearchSpace({"training": {"optimizer": "sgd"}}, val_chars=200_000, profile=CPU).first_params()
    assert (sgd["sgd_lr"], "lr" in sgd) == (0.1, False)  # train's own SGD recipe, under the name SGD's rate has
    adamw = SearchSpace({"training": {"optimizer": "adamw"}}, val_chars=200_000, profile=CPU).first_params()
    assert adamw["weight_decay"] == 0.01
    decayed = SearchSpace({"training": {"optimizer": "adam", "weight_decay": 0.05}}, 200_000, CPU)
    assert decayed.suggest(optuna.create_study().ask())["training"]["weight_decay"] == 0.05  # any optimizer


def _tune(base: Path, *extra: str) -> list[str]:
    return ["tune", str(base / "tiny.txt"), "--checkpoint-dir", str(base / "ck"), *TINY, *extra]


def _lines(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines() if line.strip()]


@pytest.mark.slow  # ~30 s: a whole study, continued; a study stopped by a signal stays in the default suite
def test_a_study_runs_prunes_continues_and_its_best_recipe_trains_again(tmp_path: Path) -> None:
    write_corpus(tmp_path / "tiny.txt", 3000)
    out = invoke(*_tune(tmp_path, "--time-budget", "1m", "--trial-budget", "3s", "--trials", "3", "--json"))
    assert out.exit_code == 0, out.stderr
    *trials, study = _lines(out.stdout)
    assert [t["event"] for t in trials] == ["trial"] * 3 and study["event"] == "study"
    assert [t["number"] for t in study["trials"]] == [0, 1, 2] and study["stop_reason"] == "trials"
    first = trials[0]["recipe"]  # textgen train's own recipe first, with the fixed settings
    assert (first["optimizer"], first["lr"], first["dropout"], first["clip_norm"]) == ("adam", 2e-3, 0.1, 5.0)
    # No trial is compared with others before two have finished; the third may be stopped, the first two not.
    assert [t["state"] for t in trials[:2]] == ["complete"] * 2 and trials[2]["state"] in ("complete", "pruned")
    assert all(t["val_loss"] > 0 for t in trials)
    directory = study_path(tmp_path / "ck", "tiny")
    for t in trials:  # each trial is an ordinary run of its recipe, a finished one trained for the trial budget
        run = Run(directory / t["run"])
        assert run.load_state().finished == ("time_budget" if t["state"] == "complete" else "pruned")
        saved = recipe_of(run.load_config())
        flat = {**saved["data"], **saved["model"], **saved["training"]}
        assert {k: flat[k] for k in t["recipe"]} == t["recipe"]
    best = min((t for t in trials if t["state"] == "complete"), key=lambda t: t["val_loss"])
    assert study["best"]["number"] == best["number"]
    recipe = read_recipe(directory / "best.json")
    assert recipe == recipe_of(Run(directory / best["run"]).load_config())

    # Four finished trials whose curves are far ahead at every moment (their final scores are not: the best stays),
    # the median of any finished set: the next trials are stopped once past the warm-up.
    stored = load_study_in(study_path(tmp_path / "ck", "tiny"))
    for _ in range(4):
        _finished(stored, {1: 0.01}, value=99.0)
    out = invoke(*_tune(tmp_path, "--time-budget", "1m", "--trial-budget", "3s", "--trials", "9", "--json"))
    assert out.exit_code == 0, out.stderr
    *more, study = _lines(out.stdout)
    assert [t["number"] for t in more] == [7, 8]  # the study went on; finished trials were not rerun
    assert all(t["state"] == "pruned" for t in more)

    # The best recipe, trained from scratch by a new run (flags given on top win).
    for how in (["--config", str(directory / "best.json")], ["--from-study", "tiny"]):
        name = f"again-{how[0][2:]}"
        args = ["train", str(tmp_path / "tiny.txt"), *how, "--epochs", "1", "--run", name]
        out = invoke(*args, "--checkpoint-dir", str(tmp_path / "ck"), "--json")
        assert out.exit_code == 0, out.stderr
        assert recipe_of(Run(tmp_path / "ck" / name).load_config()) == recipe
    out = invoke("train", str(tmp_path / "tiny.txt"), "--from-study", "tiny", "--epochs", "1", "--units", "16",
                 "--run", "smaller", "--checkpoint-dir", str(tmp_path / "ck"), "--json")  # fmt: skip
    assert out.exit_code == 0, out.stderr
    assert Run(tmp_path / "ck" / "smaller").load_config().model.units == 16

    # --show reads the study without training anything.
    out = invoke("tune", "--show", "--checkpoint-dir", str(tmp_path / "ck"))
    assert out.exit_code == 0, out.stderr
    assert f"best: trial {best['number']}" in out.stdout and "--from-study tiny" in out.stdout
    assert out.stdout.count("pruned") >= 2
    # A study moved to another directory is shown from there, its best recipe too.
    moved = directory.parent / "moved"
    directory.rename(moved)
    out = invoke("tune", "--show", "--study", "moved", "--checkpoint-dir", str(tmp_path / "ck"), "--json")
    assert out.exit_code == 0, out.stderr
    shown = json.loads(out.stdout.splitlines()[-1])
    assert (shown["path"], shown["best_recipe"]) == (str(moved), str(moved / "best.json"))
    assert shown["study"] == "moved"
    out = invoke("tune", "--show", "--study", "moved", "--checkpoint-dir", str(tmp_path / "ck"))
    assert "--from-study moved" in out.stdout


def test_an_interrupted_trial_from_before_layer_norm_resumes_without_it() -> None:
    """A study begun before layer normalization (or weight-drop, or a locked output) was searched: its interrupted
    trial's params lack it, and the trial that resumes it must build the model its run holds, whatever the sampler
    would draw (seeds 0-9 draw both)."""
    space = SearchSpace(FIXED, val_chars=700, profile=CPU)
    params = {"optimizer": "adam", "lr": 0.002, "clip_norm": 5.0, "dropout": 0.1}
    distributions = {
        "optimizer": optuna.distributions.CategoricalDistribution(["adam", "adamw", "rmsprop", "sgd"]),
        "lr": FloatDistribution(5e-4, 1e-2, log=True),
        "clip_norm": FloatDistribution(0.5, 10.0, log=True),
        "dropout": FloatDistribution(0.0, 0.4, step=0.05),
    }
    for seed in range(10):
        study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
        killed = optuna.trial.create_trial(
            params=params, distributions=distributions, state=TrialState.FAIL, user_attrs={"run": "trial-000"}
        )
        study.add_trial(killed)
        _requeue_interrupted(study)
        resuming = study.ask()
        assert resuming.user_attrs["resumes"] == 0
        recipe = space.suggest(resuming)
        assert recipe["model"]["layer_norm"] is False and recipe["training"]["lr"] == 0.002
        assert (recipe["model"]["weight_drop"], recipe["model"]["locked_output_dropout"]) == (0.0, None)


# 61 s: a study killed mid-trial and resumed (run with -m slow)
@pytest.mark.slow
def test_a_stopped_study_resumes_its_trial(tmp_path: Path) -> None:
    """Ctrl-C saves the running trial; a kill leaves it running in the database. Either way the same command
    resumes it (a new trial trains its run on from its resume point) and never reruns a finished trial. One
    study, stopped both ways in turn: Ctrl-C in trial 1, then a kill in trial 3 (trial 2 resumes trial 1)."""
    write_corpus(tmp_path / "tiny.txt", 3000)
    # 12 s trials: on this host under load (a 921 s suite) a 6 s trial 1 had finished before Ctrl-C arrived.
    args = [sys.executable, "-m", "textgen", *_tune(tmp_path, "--time-budget", "2m", "--trial-budget", "12s")]
    args += ["--trials", "3", "--json"]
    directory = study_path(tmp_path / "ck", "tiny")

    def stop_in(run_name: str, stop: signal.Signals, log: Path) -> float:
        """Start the study, stop it once the trial training ``run_name`` has saved a resume point; the seconds
        that run had trained then."""
        with open(log, "w") as fh:
            proc = subprocess.Popen(args, stdout=fh, stderr=subprocess.STDOUT, env=subprocess_env())
        wait_for(log, '"event": "trial"', proc)  # the trial before it is done
        wait_for(directory / run_name / "state.json", "", proc)
        proc.send_signal(stop)
        assert proc.wait(timeout=60) == (130 if stop == signal.SIGINT else -9)
        return Run(directory / run_name).load_state().seconds

    interrupted_at = stop_in("trial-001", signal.SIGINT, tmp_path / "first.txt")
    assert "trial 1 of study 'tiny' is saved; run the same command to continue" in (tmp_path / "first.txt").read_text()
    done_state = (directory / "trial-000" / "state.json").read_text()
    killed_at = stop_in("trial-003", signal.SIGKILL, tmp_path / "second.txt")
    log_lines = (tmp_path / "second.txt").read_text().splitlines()  # TensorFlow's stderr is in the log too
    resumed = next(json.loads(line) for line in log_lines if line.startswith('{"event": "trial"'))
    # A pruned trial's note also says why: the first part says what it resumes.
    assert (resumed["number"], resumed["run"], resumed["note"].split("; ")[0]) == (2, "trial-001", "resumes trial 1")
    assert resumed["state"] in ("complete", "pruned")
    assert Run(directory / "trial-001").load_state().seconds > interrupted_at

    again = subprocess.run(args, capture_output=True, text=True, env=subprocess_env(), timeout=120)
    assert again.returncode == 0, again.stderr
    *trials, study = _lines(again.stdout)
    assert [(t["number"], t["run"], t["note"].split("; ")[0]) for t in trials] == [(4, "trial-003", "resumes trial 3")]
    assert trials[0]["state"] in ("complete", "pruned")
    assert (directory / "trial-000" / "state.json").read_text() == done_state  # not trained again
    run = Run(directory / "trial-003")
    assert run.load_state().seconds > killed_at
    # The rest of the trial's budget, not a new one: tune gives the resumed run the trial budget as the run's, and
    # the run's clock counts its earlier invocations (test_train's time-budget tests show that, on a fake clock).
    # Not timed here: how far past the budget the resumed invocation's first step ends depends on the host.
    assert run.load_config().training.time_budget == 12
    states = {t["number"]: t["state"] for t in study["trials"]}
    assert states[1] == states[3] == "interrupted"
    assert sorted(n for n, s in states.items() if s in ("complete", "pruned")) == [0, 2, 4]


TUNE_REFUSED_WITHOUT_TENSORFLOW = """
import sys
from typer.testing import CliRunner
from textgen.cli import app
for args, fragment in (
    ([], "give a corpus to tune on"),
    (["--study", "nope"], "there is no study 'nope' yet"),
    (["missing.txt"], "missing.txt"),
    (["book.txt", "--lr", "0.01"], "a fixed --lr needs a fixed --optimizer"),
    (["book.txt", "--trials", "0"], "--trials must be between"),
):
    result = CliRunner().invoke(app, ["tune", *args, "--checkpoint-dir", "ck"])
    assert result.exit_code == 1 and result.stderr.startswith("error:") and fragment in result.stderr, result.stderr
assert "tensorflow" not in sys.modules, "TensorFlow was imported"
"""


def test_bad_tune_inputs_are_refused_before_tensorflow_loads(tmp_path: Path) -> None:
    write_corpus(tmp_path / "book.txt", 3000)
    proc = run_python(["-c", TUNE_REFUSED_WITHOUT_TENSORFLOW], tmp_path)
    assert proc.returncode == 0, proc.stderr


def test_bad_tune_inputs(tmp_path: Path) -> None:
    write_corpus(tmp_path / "tiny.txt", 3000)
    ck = str(tmp_path / "ck")
    assert_one_line_error(invoke("tune", "--show", "--checkpoint-dir", ck), "no study", "textgen tune")
    assert_one_line_error(invoke("tune", "--show", "--units", "64", "--trials", "3"),
                          "--show only lists a study: drop --trials, --units")  # fmt: skip
    assert_one_line_error(
        invoke("tune", str(tmp_path / "tiny.txt"), "--time-budget", "1m", "--trial-budget", "2m"),
        "--time-budget must hold at least one --trial-budget",
    )
    assert_one_line_error(invoke("tune", "--checkpoint-dir", ck, "--study", "nope"), "there is no study 'nope'")
    assert_one_line_error(invoke("tune", str(tmp_path / "tiny.txt"), "--checkpoint-dir", ck), "too short to tune on")
    out = invoke(*_tune(tmp_path, "--time-budget", "10s", "--trial-budget", "2s", "--trials", "1", "--json"))
    assert out.exit_code == 0, out.stderr
    assert_one_line_error(
        invoke(*_tune(tmp_path, "--time-budget", "10s", "--trial-budget", "3s")), "cannot change", "trial budget 2s"
    )
    assert_one_line_error(invoke("train", str(tmp_path / "tiny.txt"), "--from-study", "nope", "--checkpoint-dir", ck),
                          "no study 'nope'", "textgen tune")  # fmt: skip
    assert_one_line_error(invoke("train", "--resume", "--from-study", "tiny", "--checkpoint-dir", ck),
                          "drop them to --resume")  # fmt: skip
    # A continued study may be given some of its fixed settings again, not others.
    out = invoke("tune", "--study", "tiny", "--checkpoint-dir", ck, "--units", "32", "--trials", "1", "--json")
    assert out.exit_code == 0, out.stderr
    assert_one_line_error(invoke("tune", "--study", "tiny", "--checkpoint-dir", ck, "--units", "64"),
                          "--units 32", "not --units 64 as given")  # fmt: skip
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"model": {"units": 32, "colour": "red"}}))
    assert_one_line_error(invoke("train", str(tmp_path / "tiny.txt"), "--config", str(bad)), "unknown model settings")
    assert_one_line_error(invoke("train", str(tmp_path / "tiny.txt"), "--config", str(tmp_path / "none.json")),
                          "no such file")  # fmt: skip
    with open(tmp_path / "tiny.txt", "a", encoding="utf-8") as text:  # new trials would read other splits
        text.write("a few more words\n")
    assert_one_line_error(invoke("tune", "--study", "tiny", "--checkpoint-dir", ck, "--trials", "3"),
                          "the corpus of study 'tiny' changed since it started", "another --study")  # fmt: skip


@pytest.mark.parametrize("section", [5, [], 0, ""])  # falsy ones too: not read as an empty section
def test_a_recipe_section_that_is_not_an_object_is_one_error(tmp_path: Path, section) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"data": {}, "model": section}))
    with pytest.raises(ConfigError, match="its model section is not a JSON object"):
        read_recipe(bad)


def test_a_recipe_with_an_optimizer_that_is_not_a_name_is_one_error(tmp_path: Path) -> None:
    write_corpus(tmp_path / "tiny.txt", 200)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"training": {"optimizer": ["adam"]}}))
    out = invoke("train", str(tmp_path / "tiny.txt"), "--config", str(bad), "--checkpoint-dir", str(tmp_path / "ck"))
    assert_one_line_error(out, "training.optimizer=['adam'], not adam or adamw or rmsprop or sgd")


def test_a_runs_config_reads_as_its_recipe(trained_run) -> None:
    recipe = read_recipe(trained_run.run.config_path)
    assert recipe == recipe_of(trained_run.run.load_config())
    assert set(recipe["training"]) == {
        "lr", "lr_schedule", "anneal", "clip_norm", "optimizer", "weight_decay", "momentum", "accumulate",
    }  # fmt: skip


def test_a_damaged_study_database_is_one_error(tmp_path: Path) -> None:
    write_corpus(tmp_path / "tiny.txt", 3000)
    directory = study_path(tmp_path / "ck", "broken")
    directory.mkdir(parents=True)
    (directory / "study.db").write_bytes(b"not a database" * 100)
    ck = ["--checkpoint-dir", str(tmp_path / "ck")]
    for args in (["--show", "--study", "broken"], [str(tmp_path / "tiny.txt"), "--study", "broken"]):
        assert_one_line_error(invoke("tune", *args, *ck), "study.db is damaged or not a textgen tune study", "move it")


def test_showing_a_study_waits_out_a_lock_longer_than_sqlites_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`tune --show` beside a running study: a write that holds the database 6 s is waited for (SQLite's default is
    to give up after 5 s, and when the reader is the one holding the lock, it is the running study that fails); a
    lock held longer than textgen waits is one line saying so, not "damaged, move it away"."""
    import sqlite3
    import threading

    import textgen.study

    directory = study_path(tmp_path / "ck", "s")
    directory.mkdir(parents=True)
    study = optuna.create_study(study_name="s", storage=storage_of(directory))
    study.set_user_attr("settings", {"corpus": ["c.txt"], "trial_budget": 60.0})
    writer = sqlite3.connect(directory / "study.db", isolation_level=None, check_same_thread=False)
    try:
        writer.execute("BEGIN EXCLUSIVE")
        with monkeypatch.context() as patched:
            patched.setattr(textgen.study, "LOCK_WAIT", 0.2)
            with pytest.raises(ConfigError, match=r"study.db stayed locked for 0 s by another process; try again"):
                show_study(tmp_path / "ck", "s")
        released = threading.Event()

        def release() -> None:
            released.set()  # before the lock goes: a reader that got through saw it set
            writer.rollback()

        holder = threading.Timer(6.0, release)  # longer than SQLite's 5 s, however late the timer fires
        holder.start()
        shown = show_study(tmp_path / "ck", "s")
        assert released.is_set()  # it waited for the lock to go, not failed, nor read past it
        holder.join()
    finally:
        writer.close()
    assert shown.study == "s" and shown.trials == [] and shown.trial_budget == 60.0


def test_a_new_study_stopped_before_it_begins_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C between the database's creation and its settings would leave a study no command could continue."""
    import textgen.tune as tuning

    def ctrl_c(*args) -> None:
        raise KeyboardInterrupt

    write_corpus(tmp_path / "tiny.txt", 3000)
    monkeypatch.setattr(tuning, "_set_search", ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        tuning.tune([str(tmp_path / "tiny.txt")], "cpu", study_name=None, checkpoint_dir=tmp_path / "ck", fixed=FIXED)
    assert not study_path(tmp_path / "ck", "tiny").exists()


# `textgen tune` with one-epoch trials (a trial's first validation is its last), whose trial stops in that validation
# until the test's signal has been handled: the signal lands there on any machine, however loaded.
TUNE_HELD_IN_ITS_LAST_VALIDATION = """
import signal
import sys
import time
from pathlib import Path

import textgen.tune as tuning
from textgen.cli import main

marker, validating = Path(sys.argv.pop(1)), tuning.Reporter.validating
tuning.TRIAL_EPOCHS = 1


def held(self):
    if not marker.exists():  # the first trial's only
        stop = signal.getsignal(signal.SIGTERM).__self__  # training's StopSignals, as its handler
        marker.touch()
        while stop.requested is None:  # until the test's SIGTERM has been handled
            time.sleep(0.01)
    validating(self)


tuning.Reporter.validating = held
main()
"""


def test_a_signal_as_a_trial_finishes_scores_it_and_stops_the_study(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGTERM to `textgen tune` during a trial's last validation (textgen train then finishes the run): the trial is
    scored and kept as the best so far, the study stops saying so with SIGTERM's exit code, and the same command
    continues with the next trial, never training the finished one again."""
    import textgen.tune as tuning

    write_corpus(tmp_path / "tiny.txt", 3000)
    # 5-minute trials: no mid-epoch validation (after a fifth of the budget) comes before the one-epoch trial's own,
    # even when the first batch's compilation is slow.
    args = _tune(tmp_path, "--time-budget", "30m", "--trial-budget", "5m", "--json")
    marker = tmp_path / "validating"
    proc = subprocess.Popen(
        [sys.executable, "-c", TUNE_HELD_IN_ITS_LAST_VALIDATION, str(marker), *args, "--trials", "3"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=subprocess_env(),
    )
    try:
        wait_until(lambda: marker.exists() or proc.poll() is not None, "trial 0 did not validate", timeout=180)
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "stopped (SIGTERM) after trial 0, which finished: study 'tiny' is saved; run the same command" in err
    assert "Traceback" not in err
    trials = [line for line in _lines(out) if line["event"] == "trial"]
    assert [(t["number"], t["state"]) for t in trials] == [(0, "complete")]
    directory = study_path(tmp_path / "ck", "tiny")
    study = load_study_in(directory)
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] and study.trials[0].value == trials[0]["val_loss"]
    run = Run(directory / "trial-000")
    assert run.load_state().finished == "epochs"
    assert read_recipe(directory / "best.json") == recipe_of(run.load_config())
    done_state = run.state_path.read_text()

    monkeypatch.setattr(tuning, "TRIAL_EPOCHS", 1)
    again = invoke(*args, "--trials", "2")
    assert again.exit_code == 0, again.stderr
    assert [(t["number"], t["state"]) for t in _lines(again.stdout) if t["event"] == "trial"] == [(1, "complete")]
    assert run.state_path.read_text() == done_state  # trial 0 was not trained again


def test_a_trial_starts_only_if_the_study_holds_its_training_and_the_most_a_trial_took_beyond_it(
    tmp_path: Path,
) -> None:
    """The overhead is measured beyond each trial's own training (a resumed trial trains only the rest of its
    budget), never negative; a queued resume needs only what its run has left."""
    from textgen.tune import _room_needed

    def finished(seconds: float, **trained: float) -> optuna.trial.FrozenTrial:
        return optuna.trial.create_trial(value=1.0, user_attrs={"seconds": seconds, **trained})

    study = optuna.create_study()
    assert _room_needed(study, tmp_path, 100) == 100
    study.add_trial(finished(80))  # an older trial, stopped early by EarlyStopping: nothing beyond its budget
    assert _room_needed(study, tmp_path, 100) == 100
    study.add_trial(finished(130, trained=100))
    study.add_trial(finished(45, trained=20))  # a resumed trial: 25 s beyond the 20 s it trained
    assert _room_needed(study, tmp_path, 100) == 130
    run = tmp_path / "trial-007"
    run.mkdir()
    state = {"epoch": 3, "batch": 0, "last_weights": "w", "optimizer": "o", "seconds": 70.0}
    (run / "state.json").write_text(json.dumps(state))
    study.enqueue_trial({}, user_attrs={"resumes": 7, "run": "trial-007"})
    assert _room_needed(study, tmp_path, 100) == 30 + 30


def test_a_trial_that_trained_its_whole_budget_is_scored_not_pruned() -> None:
    from textgen.training.progress import NoProgress
    from textgen.tune import Reporter

    class Behind:
        def report(self, value: float, step: int) -> None: ...
        def set_user_attr(self, key: str, value: float) -> None: ...
        def should_prune(self) -> bool:
            return True

    reporter = Reporter(Behind(), NoProgress(), started=0.0, budget=10.0)  # type: ignore[arg-type]
    assert reporter.should_stop(9.0, 2.0)
    assert not reporter.should_stop(10.0, 2.0)  # the budget is spent: scored


def test_an_interrupted_trial_counts_as_resumable_not_failed() -> None:
    from textgen.study import counts_as_done, is_interrupted

    study = optuna.create_study()
    study.tell(study.ask(), state=TrialState.FAIL)
    failed = study.ask()
    failed.set_user_attr("error", "training diverged")
    study.tell(failed, state=TrialState.FAIL)
    a, b = study.get_trials()
    assert is_interrupted(a) and not counts_as_done(a)
    assert not is_interrupted(b) and counts_as_done(b)


def test_a_trial_that_cannot_run_fails_and_the_search_goes_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An error no recipe setting explains (here the first scoring raises) fails that trial with its message;
    the next trials run; three in a row would stop the study."""
    import textgen.tune as tuning

    write_corpus(tmp_path / "tiny.txt", 3000)
    calls = []
    real = tuning.evaluate_run

    def flaky(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("out of memory\n  (simulated)")
        return real(*args, **kwargs)

    monkeypatch.setattr(tuning, "evaluate_run", flaky)
    result = tuning.tune(
        [str(tmp_path / "tiny.txt")],
        "cpu",
        study_name=None,
        checkpoint_dir=tmp_path / "ck",
        time_budget=60,
        trial_budget=2,
        trials=2,
        fixed=FIXED,
    )
    states = [(t.state, t.note) for t in result.trials]
    assert states[0] == ("failed", "RuntimeError: out of memory (simulated)")
    assert states[1][0] == "complete" and len(states) == 2
    assert result.best is not None and result.best.number == 1
    assert (result.path / "best.json").is_file()


def test_recipes_take_the_flags_given_and_another_optimizer_brings_its_defaults() -> None:
    from textgen.recipe import apply_recipe

    recipe = {
        "data": {"batch_size": 32},
        "model": {"units": 256},
        "training": {"optimizer": "sgd", "lr": 0.3, "momentum": 0.8},
    }
    same = apply_recipe(recipe, data={"batch_size": None}, model={"units": 128}, training={"optimizer": "sgd"})
    assert same["data"] == {"batch_size": 32} and same["model"] == {"units": 128}
    assert same["training"] == {"optimizer": "sgd", "lr": 0.3, "momentum": 0.8}
    other = apply_recipe(recipe, training={"optimizer": "adam", "lr": None})
    assert other["training"] == {"optimizer": "adam"}  # Adam's own learning rate, no SGD momentum
    TrainConfig.of(**other["training"])  # a valid config, not "--momentum is SGD's"


def test_a_recipe_carries_weight_drop_and_the_locked_output(tmp_path: Path) -> None:
    from textgen.config import DataConfig, ModelConfig, RunConfig
    from textgen.recipe import write_recipe

    model = ModelConfig(vocab_size=9, weight_drop=0.3, locked_output_dropout=0.2)
    recipe = recipe_of(RunConfig(DataConfig(corpus="c.txt"), model, TrainConfig(), CPU))
    assert (recipe["model"]["weight_drop"], recipe["model"]["locked_output_dropout"]) == (0.3, 0.2)
    write_recipe(tmp_path / "best.json", recipe)
    assert read_recipe(tmp_path / "best.json") == recipe
    write_recipe(tmp_path / "old.json", {"model": {"units": 64}})  # a recipe from before: the defaults
    assert read_recipe(tmp_path / "old.json")["model"] == {"units": 64}


def test_adamw_without_decay_is_allowed() -> None:
    from textgen.training.step import make_optimizer

    assert make_optimizer(TrainConfig.of(optimizer="adamw", weight_decay=0.0)).weight_decay == 0.0
