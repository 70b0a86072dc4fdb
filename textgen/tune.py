"""``textgen tune``: a wall-clock-budgeted search over training recipes, with Optuna.

Each trial is an ordinary run (``textgen.training``) of one recipe for ``trial_budget`` seconds, saved as
``studies/<study>/trial-NNN`` under the checkpoint directory, so it can be sampled, evaluated or trained further.
A finished trial is scored on the validation split read as ``SCORE_STREAMS`` streams, whatever its batch size:
the same weights read War and Peace's validation split 0.03 nats/char worse as 256 streams than as 16 (each
stream starts cold), which would otherwise favour small batches. The study (Optuna's SQLite database) and the best
recipe (``best.json``) live in the same directory; running the same command again continues the study.

Why Optuna rather than KerasTuner: its ask-and-tell interface drives textgen's own training loop as it is (KerasTuner
wants a ``model.fit`` to call), its TPE sampler handles the conditional settings (SGD's learning rate, AdamW's
decay), and its storage makes the study resumable. What a study searches, and its pruner, are in ``textgen.search``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import signal
import time
import warnings
from pathlib import Path
from typing import Any, Protocol

import keras
import optuna
from optuna.trial import TrialState

from textgen.checkpoint import Run, RunLock
from textgen.config import DEFAULT_CHECKPOINT_DIR, DeviceProfile, Freeze, Split, Weights, flag_setting, settings_given
from textgen.corpus import check_unchanged, corpus_fingerprint
from textgen.data import load_splits
from textgen.device import apply_profile, resolve_profile
from textgen.errors import CheckpointError, ConfigError, TextgenError, TrainingDiverged, TrainingInterrupted, one_line
from textgen.evaluate import evaluate_run
from textgen.idcache import cache_root
from textgen.recipe import Recipe
from textgen.request import check_request
from textgen.results import EpochLog, StopReason, StudyResult, StudyStop, TrainResult, TrialStatus, TrialSummary
from textgen.search import PRUNE_WARMUP, SameTimePruner, SearchSpace
from textgen.settings import DataSettings, InitSettings, ModelSettings, TrainRequest, TrainSettings
from textgen.study import (
    DATABASE,
    counts_as_done,
    is_interrupted,
    load_study_in,
    locate_study,
    save_best_recipe,
    spent_seconds,
    storage_of,
    study_result,
    trial_summary,
)
from textgen.training.loop import train
from textgen.training.plan import TrainPlan, new_data_config, plan_training
from textgen.training.progress import NoProgress, TrainingProgress
from textgen.weightsfile import weights_checksum

SCORE_STREAMS = 64
TRIAL_EPOCHS = 10_000  # trials end with their time budget
# A trial with no validation for this share of its budget is validated mid-epoch, for the pruner: a 2 x 512 epoch
# of War and Peace takes ~7 minutes on 2 cores, most of a 10-minute trial. At most 4 a trial: each costs a
# validation of the split (~15 s for 2 x 512 layer-normalized on War and Peace, 2.5% of a 10-minute trial), taken
# from its training time.
VALIDATE_EVERY = 0.2
STARTUP_TRIALS = 4  # random recipes before TPE models the results (the first trial is the default recipe)


class TuneProgress(Protocol):
    """What the study reports as it goes (the CLI's table implements it)."""

    def begin(self, study: StudyResult) -> None: ...
    def trial_begin(self, trial: TrialSummary, budget: float) -> TrainingProgress: ...
    def trial_end(self, trial: TrialSummary) -> None: ...
    def end(self, result: StudyResult) -> None: ...  # also after Ctrl-C or an error


class Reporter(NoProgress):
    """A trial's training progress, passed on to the display; the trial's wall-clock goes to the study as it grows
    (a killed trial's time still counts). As the run's ``CurveJudge``, it passes the validation loss to Optuna,
    which may prune the trial: at each epoch end (the run has just committed the epoch), and mid-epoch once
    ``VALIDATE_EVERY`` of the budget has passed since the last report, so that a recipe whose epochs are long next
    to the budget is judged too."""

    SAVE_SECONDS_EVERY = 10.0

    def __init__(self, trial: optuna.Trial, display: TrainingProgress, started: float, budget: float) -> None:
        self.trial, self.display, self.started, self.budget = trial, display, started, budget
        self.saved = started
        self.reported_at = 0.0  # training seconds at the last report (a resumed trial's run: at its resume)

    def start(self, plan: TrainPlan, steps: int) -> None:
        self.reported_at = plan.resume_state.seconds if plan.resume_state else 0.0
        self.display.start(plan, steps)

    def epoch_begin(self, epoch: int, first_batch: int) -> None:
        self.display.epoch_begin(epoch, first_batch)

    def batch_end(self, batch: int, loss: float) -> None:
        self.display.batch_end(batch, loss)
        if time.monotonic() - self.saved >= self.SAVE_SECONDS_EVERY:
            self.save_seconds()

    def validating(self) -> None:
        self.display.validating()

    def epoch_end(self, log: EpochLog) -> None:
        self.display.epoch_end(log)
        self.save_seconds()

    def due(self, seconds: float) -> bool:
        """None in the budget's last fifth either: the trial's own last validation follows."""
        return (
            VALIDATE_EVERY * self.budget <= seconds - self.reported_at and seconds <= (1 - VALIDATE_EVERY) * self.budget
        )

    def should_stop(self, seconds: float, val_loss: float) -> bool:
        """Report the validation loss to Optuna; whether the pruner ends the trial."""
        self.reported_at = seconds
        if math.isfinite(val_loss):
            self.trial.report(val_loss, round(seconds * 1000))
        # A trial that has trained its whole budget is scored, not pruned: pruning saves no time then, and the
        # finished trials the pruner compares against would keep only those ahead of the median.
        return seconds < self.budget and self.trial.should_prune()

    def end(self) -> None:
        self.display.end()

    def save_seconds(self) -> None:
        self.saved = time.monotonic()
        self.trial.set_user_attr("seconds", self.saved - self.started)


DEFAULT_TIME_BUDGET, DEFAULT_TRIAL_BUDGET = 2 * 3600.0, 600.0
MAX_ERRORS_IN_A_ROW = 3  # trials failing at once, one after another, mean something is wrong beyond the recipes


def tune(
    corpus: list[str] | None,
    device: str,
    *,
    study_name: str | None,
    checkpoint_dir: Path = DEFAULT_CHECKPOINT_DIR,
    time_budget: float | None = None,
    trial_budget: float | None = None,
    trials: int | None = None,
    seed: int | None = None,
    fixed: Recipe | None = None,
    init_from: InitSettings | None = None,
    progress: TuneProgress | None = None,
) -> StudyResult:
    """Run (or continue) a study until its wall-clock ``time_budget`` has no room for another trial, or it has
    ``trials`` trials; Ctrl-C saves the running trial, which the next call resumes. ``fixed`` holds the recipe
    settings not to search; ``init_from``, the run every trial fine-tunes. A continued study keeps its corpus,
    trial budget, device profile, seed, fixed settings and ``init_from`` (each may be given again, not changed),
    and its time budget unless a new one is given."""
    name, files, directory = locate_study(checkpoint_dir, corpus, study_name)
    given: dict[str, Any] = {
        "corpus": [str(f) for f in files],
        "trial_budget": trial_budget,
        "time_budget": time_budget,
        "device": None if device == "auto" else device,
        "seed": seed,
        "fixed": {part: kept for part, values in (fixed or {}).items() if (kept := settings_given(values))},
        "init_from": dataclasses.asdict(init_from) if init_from else None,
    }
    directory.mkdir(parents=True, exist_ok=True)
    busy = "study {name!r} is being tuned by process {pid}; wait for it, stop it, or pick another --study"
    lock = RunLock(Run(directory), busy)
    new = not (directory / DATABASE).is_file()  # under the lock: another process may have made the study meanwhile
    begun = False  # whether the study holds its settings (until then, a new one is removed on any error or stop)
    try:
        study = None if new else load_study_in(directory)
        settings = _new_settings(given) if study is None else _continued_settings(study, name, given)
        if settings.get("init_from"):
            _check_base_unchanged(name, settings)
        profile = resolve_profile(settings["device"] or "auto")
        apply_profile(profile)
        settings["device"] = profile.name
        # The budgets must hold a trial, and the corpus the search space, before a new study is written.
        if settings["time_budget"] < settings["trial_budget"]:
            raise ConfigError(
                f"--time-budget must hold at least one --trial-budget (got {settings['time_budget']:g}s for "
                f"{settings['trial_budget']:g}s trials)"
            )
        space = _search_space(settings, profile, checkpoint_dir)
        if study is None:
            study = optuna.create_study(study_name=name, storage=storage_of(directory), direction="minimize")
        _set_search(study, settings)
        study.set_user_attr("settings", settings)
        begun = True
        _requeue_interrupted(study)
        return _run_study(study, directory, settings, space, trials, checkpoint_dir, progress)
    except BaseException:
        if new and not begun:  # leave nothing of a study that never started
            (directory / DATABASE).unlink(missing_ok=True)
            (directory / ".lock").unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                directory.rmdir()
        raise
    finally:
        lock.release()


def _new_settings(given: dict[str, Any]) -> dict[str, Any]:
    return {
        **given,
        "trial_budget": given["trial_budget"] or DEFAULT_TRIAL_BUDGET,
        "time_budget": given["time_budget"] or DEFAULT_TIME_BUDGET,
        "seed": given["seed"] or 0,
        "corpus_fingerprint": list(corpus_fingerprint([Path(f) for f in given["corpus"]])),
    }


def _continued_settings(study: optuna.Study, name: str, given: dict[str, Any]) -> dict[str, Any]:
    """A continued study's settings: what it started with, and a new time budget if one is given. The others may
    be given again but not changed: its trials are compared with each other."""
    saved = dict(study.user_attrs["settings"])
    changed = [
        k
        for k in ("corpus", "trial_budget", "device", "seed", "init_from")
        if given[k] not in (None, []) and given[k] != saved.get(k)
    ]
    fixed = [
        flag_setting(k, v)
        for part, values in given["fixed"].items()
        for k, v in values.items()
        if saved["fixed"].get(part, {}).get(k) != v
    ]
    if changed or fixed:
        was = [
            f"{_describe(k, saved.get(k))} (not {_describe(k, given[k])} as given)"
            if k == "init_from"
            else f"{k.replace('_', ' ')} {_describe(k, saved[k])}"
            for k in changed
        ]
        if fixed:
            was.append(f"{_describe('fixed', saved['fixed'])} (not {', '.join(fixed)} as given)")
        raise ConfigError(
            f"study {name!r} was started with {'; '.join(was)}; its trials are compared with each other, "
            "so that cannot change: give it as before (or leave it out), or start another --study"
        )
    _check_corpus_unchanged(name, saved)
    return {**saved, "time_budget": given["time_budget"] or saved["time_budget"]}


def _check_base_unchanged(name: str, settings: dict[str, Any]) -> None:
    """The run a study fine-tunes is there, with the weights its first trial started from (their checksum is
    kept with the study's settings): trials that started from other weights would not compare."""
    init = settings["init_from"]
    try:
        checksum = weights_checksum(Run(Path(init["source"])).weights_path(init["weights"]))
    except (CheckpointError, OSError) as exc:
        raise ConfigError(
            f"study {name!r} fine-tunes the run {init['source']}, whose {init['weights']} weights cannot be read "
            f"({one_line(exc)}); put the run back to continue the study"
        ) from None
    if settings.setdefault("init_checksum", checksum) != checksum:
        raise ConfigError(
            f"study {name!r} fine-tunes the run {init['source']}, whose {init['weights']} weights changed since the "
            "study started; its trials would start from other weights, so restore them or start another --study"
        )


def _check_corpus_unchanged(name: str, saved: dict[str, Any]) -> None:
    """Refuse a corpus whose bytes changed since the study started: new trials would be scored on other splits."""
    check_unchanged(
        [Path(f) for f in saved["corpus"]],
        saved.get("corpus_fingerprint"),
        gone=lambda path: f"the corpus of study {name!r}, {path}, is gone; put it back to continue the study",
        changed=lambda then, now: (
            f"the corpus of study {name!r} changed since it started ({then:,} bytes then, "
            f"{now:,} now); its trials would be scored on other splits. Restore the original text, or start another --study"
        ),
    )


def _describe(key: str, value: Any) -> str:
    """A study setting as the user gave it."""
    if key == "corpus":
        return " ".join(value)
    if key == "trial_budget":
        return f"{value:g}s"
    if key == "init_from":
        if not value:
            return "no --init-from"
        last = " --last" if value["weights"] == Weights.last else ""
        freeze = f" --freeze {value['freeze']}" if value["freeze"] != "none" else ""
        return f"--init-from {value['source']}{last}{freeze}"
    if key == "fixed":
        settings = (flag_setting(k, v) for part in value.values() for k, v in part.items())
        return " ".join(settings) or "nothing fixed"
    return str(value)


def _search_space(settings: dict[str, Any], profile: DeviceProfile, checkpoint_dir: Path) -> SearchSpace:
    """The study's search space on its corpus (encoded once, into the id cache that training reads)."""
    files = [Path(f) for f in settings["corpus"]]
    probe = new_data_config(settings["corpus"], files, batch_size=1, seq_len=1)
    return SearchSpace(settings["fixed"], len(load_splits(probe, cache_root(checkpoint_dir)).val), profile)


def _set_search(study: optuna.Study, settings: dict[str, Any]) -> None:
    """The study's TPE sampler and same-time pruner (neither is stored with it)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # multivariate TPE
        # The sampler's seed moves on with the study, or a continued study would draw its first random recipes again.
        study.sampler = optuna.samplers.TPESampler(
            seed=settings["seed"] + len(study.trials), n_startup_trials=STARTUP_TRIALS, multivariate=True, group=True
        )
    study.pruner = SameTimePruner(warmup_ms=round(PRUNE_WARMUP * settings["trial_budget"] * 1000))


def _requeue_interrupted(study: optuna.Study) -> None:
    """Trials left running by a killed process are interrupted ones (the lock says nobody runs them); each
    interrupted trial not yet resumed is queued again with its recipe and its run, for the next trial to resume."""
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        study.tell(trial.number, state=TrialState.FAIL)
    trials = study.get_trials(deepcopy=False)
    resumed = {t.user_attrs.get("resumes") for t in trials}
    for trial in trials:
        if is_interrupted(trial) and trial.number not in resumed and "run" in trial.user_attrs:
            # A trial of a study begun before --layer-norm (or weight-drop, or a locked output) was searched trained
            # without it: resumed, it must not draw it.
            params = {"layer_norm": False, "weight_drop": 0.0, "locked_output_dropout": None, **trial.params}
            study.enqueue_trial(params, user_attrs={"resumes": trial.number, "run": trial.user_attrs["run"]})


class _NoTuneProgress:
    def begin(self, study: StudyResult) -> None: ...
    def trial_begin(self, trial: TrialSummary, budget: float) -> TrainingProgress:
        return NoProgress()

    def trial_end(self, trial: TrialSummary) -> None: ...
    def end(self, result: StudyResult) -> None: ...


def _run_study(
    study: optuna.Study,
    directory: Path,
    settings: dict[str, Any],
    space: SearchSpace,
    max_trials: int | None,
    checkpoint_dir: Path,
    progress: TuneProgress | None,
) -> StudyResult:
    progress = progress or _NoTuneProgress()
    trial_budget, time_budget = float(settings["trial_budget"]), float(settings["time_budget"])
    if not study.trials:
        study.enqueue_trial(space.first_params())
    stop_reason, errors = StudyStop.INTERRUPTED, list[str]()
    progress.begin(study_result(study, directory, time_budget, None))
    try:
        while True:
            if (
                max_trials is not None
                and sum(counts_as_done(t) for t in study.get_trials(deepcopy=False)) >= max_trials
            ):
                stop_reason = StudyStop.TRIALS
                break
            if time_budget - spent_seconds(study) < _room_needed(study, directory, trial_budget):
                stop_reason = StudyStop.TIME_BUDGET
                break
            error = _run_trial(study, directory, settings, space, checkpoint_dir, progress)
            errors = [*errors, error] if error else []
            if len(errors) >= MAX_ERRORS_IN_A_ROW:
                raise ConfigError(f"{len(errors)} trials in a row failed; the last: {error}")
    finally:
        save_best_recipe(study, directory)
        result = study_result(study, directory, time_budget, stop_reason)
        progress.end(result)
    return result


def trained_seconds(run: Run) -> float:
    """How long a trial's run has trained, all invocations (0 before its first resume point)."""
    return run.load_state().seconds if run.has_state() else 0.0


def _room_needed(study: optuna.Study, directory: Path, trial_budget: float) -> float:
    """Wall-clock the next trial needs: its training (the rest of the interrupted trial it resumes, if it does) and
    the most a finished trial took beyond its training (building, compiling, scoring). A trial starts only if the
    study's budget holds both."""
    waiting = study.get_trials(deepcopy=False, states=(TrialState.WAITING,))  # study.ask() takes the first
    training = trial_budget
    if waiting and "run" in waiting[0].user_attrs:
        run = Run(directory / str(waiting[0].user_attrs["run"]))
        training -= trained_seconds(run)
    finished = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    overhead = max(
        (float(t.user_attrs.get("seconds", 0.0)) - float(t.user_attrs.get("trained", trial_budget)) for t in finished),
        default=0.0,
    )
    return max(training, 0.0) + max(overhead, 0.0)


def _run_trial(
    study: optuna.Study,
    directory: Path,
    settings: dict[str, Any],
    space: SearchSpace,
    checkpoint_dir: Path,
    progress: TuneProgress,
) -> str | None:
    """Ask for a trial, train its recipe (or resume the interrupted trial it repeats) for the trial budget, score it
    and tell the study. Returns the error of a trial that failed to run, if any."""
    trial = study.ask()
    started, trial_budget = time.monotonic(), float(settings["trial_budget"])
    run = Run(directory / trial.user_attrs.get("run", f"trial-{trial.number:03d}"))
    trial.set_user_attr("run", run.name)

    trained_before = trained_seconds(run)

    def finish(state: TrialState, value: float | None = None, error: str | None = None) -> None:
        trial.set_user_attr("seconds", time.monotonic() - started)
        trial.set_user_attr("trained", trained_seconds(run) - trained_before)  # of those seconds, training's
        if error:
            trial.set_user_attr("error", error[:500])
        study.tell(trial, value, state=state)
        progress.trial_end(trial_summary(study.get_trials(deepcopy=False)[trial.number], {}))

    try:
        recipe, reporter = _start_trial(trial, space, run, progress, started, trial_budget)
        result = _train_trial(recipe, run, settings, space, directory, checkpoint_dir, reporter)
        if result is not None and result.stop_reason is StopReason.PRUNED:
            finish(TrialState.PRUNED)
            return None
        stop_requested = result.stop_requested if result else None
        value = evaluate_run(
            run, split=Split.val, streams=SCORE_STREAMS, cache_dir=cache_root(checkpoint_dir)
        ).nats_per_char
        if not math.isfinite(value):
            raise TrainingDiverged(f"training diverged: the validation loss is {value}", "the search goes on")
    except (TrainingInterrupted, KeyboardInterrupt) as exc:
        finish(TrialState.FAIL)  # no error recorded: interrupted, to be resumed
        reason = exc.what if isinstance(exc, TrainingInterrupted) else "interrupted"
        raise TrainingInterrupted(
            f"{reason}: trial {trial.number} of study {directory.name!r} is saved",
            "run the same command to continue the study",
            exit_code=exc.exit_code if isinstance(exc, TrainingInterrupted) else 130,
        ) from None
    except TrainingDiverged as exc:  # a recipe that diverges is a bad recipe: the search goes on
        finish(TrialState.FAIL, error=exc.what)
        return None
    except TextgenError as exc:  # not the recipe's doing (the corpus gone, a disk full): stop the study
        finish(TrialState.FAIL, error=str(exc))
        raise
    except Exception as exc:  # a recipe this machine cannot train (out of memory, say): the search goes on
        error = f"{type(exc).__name__}: {' '.join(str(exc).split())}"
        finish(TrialState.FAIL, error=error)
        return error
    finally:
        keras.backend.clear_session()  # each trial builds its own model: free the last one's graphs
    finish(TrialState.COMPLETE, value)
    save_best_recipe(study, directory)
    if stop_requested:  # it came as the trial's last epoch ended: the trial is scored, and the study stops
        raise TrainingInterrupted(
            f"stopped ({stop_requested}) after trial {trial.number}, which finished: study {directory.name!r} is saved",
            "run the same command to continue the study",
            exit_code=128 + signal.Signals[stop_requested].value,
        )
    return None


def _start_trial(
    trial: optuna.Trial, space: SearchSpace, run: Run, progress: TuneProgress, started: float, budget: float
) -> tuple[Recipe, Reporter]:
    """The trial's recipe, chosen now and shown as running, and the reporter its training reports to."""
    recipe = space.suggest(trial)
    flat = {**recipe["data"], **recipe["model"], **recipe["training"]}
    trial.set_user_attr("recipe", flat)
    note = f"resumes trial {trial.user_attrs['resumes']}" if "resumes" in trial.user_attrs else ""
    running = TrialSummary(trial.number, TrialStatus.RUNNING, flat, None, 0.0, run.name, note)
    return recipe, Reporter(trial, progress.trial_begin(running, budget), started, budget)


def _train_trial(
    recipe: Recipe,
    run: Run,
    settings: dict[str, Any],
    space: SearchSpace,
    directory: Path,
    checkpoint_dir: Path,
    reporter: Reporter,
) -> TrainResult | None:
    """Train the trial's recipe (resuming its run if it repeats an interrupted trial) for the trial budget; None
    for a run killed past its budget after its last epoch's commit: it has only its scoring left."""
    if run.has_state() and run.load_state().finished:
        return None
    resume = run.config_path.is_file()
    request = TrainRequest(
        () if resume else tuple(settings["corpus"]),
        checkpoint_dir=directory,
        run_name=run.name,
        resume=resume,
        data=DataSettings(**recipe["data"]),
        model=ModelSettings(**recipe["model"]),
        training=TrainSettings(
            **recipe["training"],
            time_budget=float(settings["trial_budget"]),  # the run's: a resumed trial trains for what is left
            epochs=TRIAL_EPOCHS,
            seed=settings["seed"],
            sample_every=0.0,  # nobody reads a trial's samples
        ),
        init_from=None if resume else _init_settings(settings),
    )
    plan = plan_training(
        check_request(request),
        space.profile,
        started=time.monotonic(),
        cache_dir=cache_root(checkpoint_dir),
        trial=True,
    )
    return train(plan, reporter, judge=reporter)


def _init_settings(settings: dict[str, Any]) -> InitSettings | None:
    """The run a study's trials fine-tune, if any (a study from before ``--init-from`` has no entry)."""
    init = settings.get("init_from")
    return (
        InitSettings(init["source"], Weights.parse(init["weights"], "weights"), Freeze.parse(init["freeze"], "freeze"))
        if init
        else None
    )
