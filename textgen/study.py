"""A ``textgen tune`` study as it is stored: Optuna's SQLite database in ``studies/<study>/``, read into
``TrialSummary`` rows, and the best recipe (``best.json``) written from it. Reading needs neither TensorFlow nor a
lock (``textgen tune --show``)."""

from __future__ import annotations

import contextlib
import math
import sqlite3
from pathlib import Path
from typing import Any

import optuna
import sqlalchemy.exc
from optuna.trial import FrozenTrial, TrialState

from textgen.checkpoint import Run
from textgen.commands import FIRST_STUDY, checkpoint_dir_flag, command
from textgen.config import DEFAULT_CHECKPOINT_DIR
from textgen.corpus import corpus_stem, resolve_corpora
from textgen.errors import CheckpointError, ConfigError
from textgen.recipe import BEST_RECIPE, Recipe, base_of, read_recipe, recipe_of, write_recipe
from textgen.results import StudyResult, StudyStop, TrialStatus, TrialSummary
from textgen.rundirs import safe_name, study_path

DATABASE = "study.db"
LOCK_WAIT = 30.0  # seconds


def storage_of(directory: Path) -> optuna.storages.RDBStorage:
    # Optuna logs every trial at INFO on stderr, between the table's redraws: textgen shows the trials itself.
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    # A reader (`tune --show`) and the running study share the file: each waits up to LOCK_WAIT for the other's lock
    # rather than SQLite's default 5 s, after which the study's own write fails ("database is locked").
    return optuna.storages.RDBStorage(
        f"sqlite:///{directory / DATABASE}", engine_kwargs={"connect_args": {"timeout": LOCK_WAIT}}
    )


def find_study(checkpoint_dir: Path = DEFAULT_CHECKPOINT_DIR, name: str | None = None) -> Path:
    """The directory of the study called ``name`` under ``checkpoint_dir``, or of the most recently updated one."""
    if name is None:
        databases = sorted((checkpoint_dir / "studies").glob(f"*/{DATABASE}"), key=lambda p: p.stat().st_mtime)
        if not databases:
            raise ConfigError(
                f"no study in {checkpoint_dir}/studies/; start one: {command(FIRST_STUDY)}{checkpoint_dir_flag(checkpoint_dir)}"
            )
        name = databases[-1].parent.name
    directory = study_path(checkpoint_dir, name)
    if not (directory / DATABASE).is_file():
        raise ConfigError(
            f"no study {name!r} in {checkpoint_dir}/studies/; "
            f"start one: {command(FIRST_STUDY)} --study {name}{checkpoint_dir_flag(checkpoint_dir)}"
        )
    return directory


def load_study_in(directory: Path) -> optuna.Study:
    """The study stored in ``directory`` (one per database, whatever the directory is called now)."""
    try:
        study = optuna.load_study(study_name=None, storage=storage_of(directory))
    except RuntimeError as error:  # Optuna's check of the database's schema: another Optuna version's
        raise ConfigError(_other_optuna(directory / DATABASE, error)) from None
    except (sqlalchemy.exc.SQLAlchemyError, ValueError, KeyError) as error:  # not SQLite, or not one Optuna study
        if "database is locked" in str(error):  # not damaged: moving it away would lose a running study
            raise ConfigError(
                f"{directory / DATABASE} stayed locked for {LOCK_WAIT:.0f} s by another process; try again"
            ) from None
        raise ConfigError(
            f"{directory / DATABASE} is damaged or not a textgen tune study; move it away or pick another --study"
        ) from None
    if "settings" not in study.user_attrs:
        raise ConfigError(f"{directory / DATABASE} is not a textgen tune study; move it away or pick another --study")
    return study


def _other_optuna(database: Path, error: RuntimeError) -> str:
    """What to do with a study database whose schema is another Optuna version's: Optuna's message says whether it
    can upgrade it (an older one), its version table which version wrote it."""
    try:
        with contextlib.closing(sqlite3.connect(database)) as db:
            written = f"Optuna {db.execute('SELECT library_version FROM version_info').fetchone()[0]}"
    except (sqlite3.Error, TypeError):
        written = "another Optuna version"
    if "storage upgrade" in str(error):
        return (
            f"{database} was written by {written}, whose format Optuna {optuna.__version__} no longer reads: back "
            f"it up, then upgrade it with: optuna storage upgrade --storage sqlite:///{database}"
        )
    return (
        f"{database} was written by {written}, newer than this Optuna ({optuna.__version__}): upgrade Optuna "
        "(pip install -U optuna), or pick another --study"
    )


def is_interrupted(trial: FrozenTrial) -> bool:
    """A trial stopped by a signal or a kill (a failed one records its error)."""
    return trial.state == TrialState.FAIL and "error" not in trial.user_attrs


def counts_as_done(trial: FrozenTrial) -> bool:
    """Whether a trial counts against --trials: it finished, was pruned, or failed (an interrupted one is resumed)."""
    return trial.state in (TrialState.COMPLETE, TrialState.PRUNED) or (
        trial.state == TrialState.FAIL and not is_interrupted(trial)
    )


def spent_seconds(study: optuna.Study) -> float:
    """Wall-clock the study's trials have taken, all invocations."""
    return sum(float(t.user_attrs.get("seconds", 0.0)) for t in study.get_trials(deepcopy=False))


_STATUS = {
    TrialState.COMPLETE: TrialStatus.COMPLETE,
    TrialState.PRUNED: TrialStatus.PRUNED,
    TrialState.RUNNING: TrialStatus.RUNNING,
    TrialState.WAITING: TrialStatus.WAITING,
}  # FAIL is interrupted or failed (see is_interrupted)


def trial_summary(trial: FrozenTrial, resumed_by: dict[int, int]) -> TrialSummary:
    state = _STATUS.get(trial.state, TrialStatus.INTERRUPTED if is_interrupted(trial) else TrialStatus.FAILED)
    values = [v for v in trial.intermediate_values.values() if math.isfinite(v)]
    value = trial.value if trial.state == TrialState.COMPLETE else (values[-1] if values else None)
    notes = []
    if "resumes" in trial.user_attrs:
        notes.append(f"resumes trial {trial.user_attrs['resumes']}")
    if trial.number in resumed_by:
        notes.append(f"resumed as trial {resumed_by[trial.number]}")
    if "error" in trial.user_attrs:
        notes.append(str(trial.user_attrs["error"]))
    if trial.state == TrialState.PRUNED:
        notes.append("behind the finished trials at the same training time")
    return TrialSummary(
        number=trial.number,
        state=state,
        recipe=dict(trial.user_attrs.get("recipe", trial.params)),
        val_loss=value,
        seconds=float(trial.user_attrs.get("seconds", 0.0)),
        run=str(trial.user_attrs.get("run", "")),
        note="; ".join(notes),
    )


def study_result(
    study: optuna.Study,
    directory: Path,
    time_budget: float | None = None,
    stop_reason: StudyStop | None = StudyStop.SHOWN,
) -> StudyResult:
    """The study as it stands."""
    trials = study.get_trials(deepcopy=False)
    resumed_by = {int(t.user_attrs["resumes"]): t.number for t in trials if "resumes" in t.user_attrs}
    summaries = [trial_summary(t, resumed_by) for t in trials]
    complete = [s for s in summaries if s.state is TrialStatus.COMPLETE and s.val_loss is not None]
    settings: dict[str, Any] = study.user_attrs.get("settings", {})
    best_recipe = directory / BEST_RECIPE
    return StudyResult(
        study=directory.name,  # the name --study and --from-study find it by (a renamed study keeps its old one)
        path=directory,
        corpus=list(settings.get("corpus", [])),
        trial_budget=float(settings.get("trial_budget", 0.0)),
        time_budget=time_budget,
        seconds=spent_seconds(study),
        trials=summaries,
        best=min(complete, key=lambda s: s.val_loss or math.inf) if complete else None,
        best_recipe=best_recipe if best_recipe.is_file() else None,
        stop_reason=stop_reason,
    )


def save_best_recipe(study: optuna.Study, directory: Path) -> None:
    """Write the best finished trial's recipe as best.json. The database is the authority: whatever the file held
    (a truncated copy, a hand edit) is replaced."""
    finished = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if not finished:
        return
    best = min(finished, key=lambda t: t.value if t.value is not None else math.inf)
    try:
        config = Run(directory / str(best.user_attrs.get("run", ""))).load_config()
    except CheckpointError:  # the trial's run is gone or damaged: the study goes on without its recipe
        return
    about = {"study": directory.name, "trial": best.number, "val_loss": best.value}
    if (base := base_of(config)) is not None:
        about["init_from"] = base
    write_recipe(directory / BEST_RECIPE, recipe_of(config), tuned=about)


def best_recipe(directory: Path) -> Recipe:
    """The best recipe of the study in ``directory`` (``train --from-study``): its best.json, written again from
    the database if it is missing or damaged."""
    path = directory / BEST_RECIPE
    try:
        return read_recipe(path)
    except ConfigError:
        if not (directory / DATABASE).is_file():
            raise
    save_best_recipe(load_study_in(directory), directory)
    if not path.is_file():
        raise ConfigError(
            f"study {directory.name!r} has no finished trial yet; "
            f"let it run: {command('tune')} --study {directory.name}{checkpoint_dir_flag(directory.parent.parent)}"
        )
    return read_recipe(path)


def show_study(checkpoint_dir: Path = DEFAULT_CHECKPOINT_DIR, name: str | None = None) -> StudyResult:
    """A study's trials and best recipe, read without a lock (a running study shows where it is)."""
    directory = find_study(checkpoint_dir, name)  # its name, not the study's own, if it was renamed
    return study_result(load_study_in(directory), directory)


def locate_study(
    checkpoint_dir: Path, corpus: list[str] | None, study_name: str | None, download: bool = False
) -> tuple[str, list[Path], Path]:
    """A study's name, its corpus's files (if given; ``download`` fetches a missing Project Gutenberg book) and its
    directory; a study that does not exist yet needs a corpus."""
    name, files = study_name_of(corpus, study_name, download)
    directory = study_path(checkpoint_dir, name)
    if not (directory / DATABASE).is_file() and not files:
        raise ConfigError(
            f"there is no study {name!r} yet; give a corpus to tune on, e.g. {command(FIRST_STUDY)} --study {name}{checkpoint_dir_flag(checkpoint_dir)}"
        )
    return name, files, directory


def check_fixed_settings(fixed: dict[str, dict[str, Any]]) -> None:
    """Refuse fixed settings no search can follow (they are checked before TensorFlow loads)."""
    training = fixed.get("training", {})
    if "lr" in training and "optimizer" not in training:
        raise ConfigError("a fixed --lr needs a fixed --optimizer (SGD's steps are ~50x Adam's): give both, or neither")


def study_name_of(corpus: list[str] | None, study_name: str | None, download: bool = False) -> tuple[str, list[Path]]:
    """The study's name (given, or made from the corpus's) and the corpus's files."""
    names = list(corpus or [])
    files = resolve_corpora(names, download=download) if names else []
    if study_name is not None:
        return study_name, files
    if not files:
        raise ConfigError(f"give a corpus to tune on, e.g. {command(FIRST_STUDY)}, or --study NAME to continue one")
    return safe_name(corpus_stem(names, files)), files
