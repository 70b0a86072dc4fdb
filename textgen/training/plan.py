"""Planning a run from a checked request: a new one on a corpus, one made from another run (distilled or pruned),
or a saved one to resume, with its configs built once and its splits encoded. No TensorFlow: a request is checked
(``textgen.request``) and its run reserved before TensorFlow's seconds of import.
"""

from __future__ import annotations

import dataclasses
import shlex
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from textgen import config as cfgmod
from textgen.basemodel import has_base
from textgen.baserun import Base
from textgen.checkpoint import ResumeState, Run, RunLock, check_corpus_unchanged, resume_hint
from textgen.commands import fine_tune
from textgen.config import (
    DataConfig,
    DeviceProfile,
    DistillConfig,
    Freeze,
    InitConfig,
    ModelConfig,
    PruneConfig,
    RunConfig,
    Strategy,
    TrainConfig,
    Weights,
    check_fits_in_memory,
)
from textgen.corpus import corpus_fingerprint, corpus_stem, find_corpora, resolve_encoding
from textgen.data import Splits, fit_small_corpus, load_splits
from textgen.durations import MORE_TIME, format_seconds
from textgen.errors import ConfigError, WeightsError
from textgen.idcache import cache_root
from textgen.layout import StreamLayout
from textgen.results import StopReason
from textgen.rundirs import discard_reserved, ensure_writable, find_run, reserve_run
from textgen.settings import DistillSettings, TrainRequest


@dataclass(frozen=True)
class CheckedRequest:
    """A ``TrainRequest`` that passed every check needing no TensorFlow (``textgen.request.check_request``), with
    what those checks read and built, so that planning reads and resolves nothing twice."""

    request: TrainRequest  # with a recipe's settings in it, and the run a fine-tuning recipe starts from
    training: TrainConfig  # the run's (a resumed run's: its own, with the changes a resume allows)
    resumed: Run | None = None  # the run to resume
    saved: RunConfig | None = None  # its config.json, read once
    found: tuple[Path, ...] = ()  # a new run's corpus files; empty where planning finds them (a cluster's worker)
    base: Base | None = None  # the run (or float export, read back) a fine-tuned run starts from
    export: Path | None = None  # the float export ``--init-from`` names, read back into ``base`` once TF loads

    @property
    def strategy(self) -> Strategy:
        """How the run is spread: as given, else as the resumed run was."""
        given = self.request.training.strategy
        return given or (self.saved.training.strategy if self.saved else Strategy.none)


@dataclass(frozen=True)
class TrainPlan:
    """What ``train`` will do: the run, its config, its data, where it resumes, and for whom."""

    run: Run
    config: RunConfig
    splits: Splits
    resume_state: ResumeState | None = None  # None: the run starts from its first batch
    lock: RunLock | None = None  # held from planning until ``train`` returns: one writer per run
    chief: bool = True  # False for the other workers of a multi-worker run: their run is a scratch copy
    # When the command (or the tuning trial) started, by time.monotonic(): its start-up counts toward the time
    # budget, which is wall-clock.
    started: float = dataclasses.field(default_factory=time.monotonic)
    trial: bool = False  # a ``textgen tune`` trial: its process goes on after the run, so no exit is allowed for
    saved: RunConfig | None = None  # a resumed run's config as read, which the run's own file still holds
    layout_note: str | None = None  # why a small text got a smaller batch layout than the default
    base_hint: str | None = None  # that a small text trained from scratch would likely do better from the base model
    fit_note: str | None = None  # how a fine-tune of a small text is regularized, and why

    def saved_note(self) -> str:
        """Where the run was saved and how to continue it, for messages."""
        if not self.chief:
            return "the chief worker saved the run; start every worker again with the same command and --resume"
        return f"saved {self.run.path}; {resume_hint(self.run)}"


def plan_training(
    checked: CheckedRequest,
    profile: DeviceProfile,
    *,
    started: float,
    checkpoint_dir: Path | None = None,
    cache_dir: Path | None = None,
    chief: bool = True,
    trial: bool = False,
) -> TrainPlan:
    """The plan of a checked request: a new run created (its corpus encoded, its configs built once), a derived one
    made from its teacher or source, or a saved one reloaded to resume. The run is locked for this process until
    ``train`` returns. It is written in ``checkpoint_dir`` (by default the request's; a cluster's other workers
    plan a scratch copy), and encoded corpora are cached in ``cache_dir`` (by default beside the runs)."""
    request = checked.request
    checkpoint_dir = checkpoint_dir or request.checkpoint_dir
    ensure_writable(checkpoint_dir)
    cache_dir = cache_dir or cache_root(checkpoint_dir)
    if checked.resumed is not None and checked.saved is not None:
        run = Run(checkpoint_dir / checked.resumed.name)
        lock = run.lock()  # before anything is read: a second trainer of the run stops here, at once
        try:
            plan = _plan_resume(run, lock, checked, cache_dir)
        except BaseException:
            lock.release()
            raise
    elif request.derived_from is not None:
        plan = _plan_derived(checked, profile, checkpoint_dir, cache_dir)
    else:
        plan = _plan_new(checked, profile, checkpoint_dir, cache_dir)
    return dataclasses.replace(plan, started=started, chief=chief, trial=trial)


def _plan_new(checked: CheckedRequest, profile: DeviceProfile, checkpoint_dir: Path, cache_dir: Path) -> TrainPlan:
    """A new run on the request's corpus, or fine-tuned on it from ``checked.base``, the base's vocabulary
    extended by the corpus's characters."""
    request, base = checked.request, checked.base
    names = list(request.corpus)
    found = list(checked.found) or find_corpora(names, download=request.download)
    run, lock = reserve_run(checkpoint_dir, request.run_name, corpus_stem(names, found))  # before the encoding
    try:
        data_given = request.data.given()
        data_given = {**data_given, "base_vocab": "".join(base.vocab.chars)} if base else data_given
        data_cfg = new_data_config(names, found, **{"batch_size": profile.batch_size, **data_given})
        accumulate = checked.training.accumulate
        data_cfg, layout_note = fit_small_corpus(data_cfg, cache_dir, accumulate, set(data_given))
        splits = load_splits(data_cfg, cache_dir, train_streams=data_cfg.batch_size * accumulate)
        model_given = request.model.given()
        fit_note = None
        if base is not None and request.init_from is not None:
            regularized = small_text_regularization(splits.chars, set(model_given))
            model_cfg = cfgmod.replace(base.model, vocab_size=splits.vocab.size, **regularized, **model_given)
            check_weight_drop_after(model_given, rate=model_cfg.weight_drop)  # the base's, or a small text's
            init_cfg: InitConfig | None = _init_config(run, base, request.init_from.freeze)
            fit_note = _fit_note(splits.chars, regularized)
        else:
            model_cfg, init_cfg = ModelConfig(vocab_size=splits.vocab.size, **model_given), None
        check_fits_in_memory(model_cfg)
        config = RunConfig(data_cfg, model_cfg, checked.training, profile, init_from=init_cfg)
        run.create(config, splits.vocab)
    except BaseException:
        discard_reserved(run, lock)
        raise
    return TrainPlan(
        run,
        config,
        splits,
        lock=lock,
        layout_note=layout_note,
        base_hint=_base_hint(checked, splits),
        fit_note=fit_note,
    )


def check_weight_drop_after(given: dict[str, Any], rate: float | None) -> None:
    """``--weight-drop-after`` (in ``given``, the model settings given) with no weight-drop ``rate`` to delay
    (none given, and the run's own, None if not yet known, 0) would change nothing: refused, not ignored. A rate
    given, 0 included (a tuning trial always gives one), passes."""
    if given.get("weight_drop_after") and "weight_drop" not in given and not rate:
        raise ConfigError(
            f"--weight-drop-after {given['weight_drop_after']} delays weight-drop, which this run does not use: "
            "add --weight-drop RATE (e.g. 0.1), or drop --weight-drop-after"
        )


# Under this many characters a text fine-tuned from the base model beats one trained from scratch by a wide margin
# (docs/finetuning.md: 0.27-0.34 nats/char at 2 minutes on 1 MB of a book, from a War and Peace run).
SMALL_TEXT = 1_000_000


def small_text_regularization(chars: int, given: set[str]) -> dict[str, float]:
    """The regularization a fine-tune of ``chars`` characters gets: none if its command, recipe or tuning trial
    (``given``) sets either rate, since they go together (a trial always sets weight-drop, so its locked dropout,
    "off" included, stays as searched)."""
    if chars >= InitConfig.REGULARIZE_BELOW or given & {"weight_drop", "locked_output_dropout"}:
        return {}
    return {"weight_drop": InitConfig.WEIGHT_DROP, "locked_output_dropout": InitConfig.LOCKED_OUTPUT_DROPOUT}


def _fit_note(chars: int, regularized: dict[str, float]) -> str | None:
    """The start-up line on a small text's regularization, if it has the default's."""
    if not regularized:
        return None
    return (
        f"a small text ({chars:,} characters) overfits within a minute: weight-drop {regularized['weight_drop']:g} and "
        f"locked output dropout {regularized['locked_output_dropout']:g}, the best on 50 KB (give --weight-drop or "
        "--locked-output-dropout to set your own)"
    )


def _base_hint(checked: CheckedRequest, splits: Splits) -> str | None:
    """For a small text trained from scratch, the command that starts it from the base model instead."""
    chars = splits.chars
    if checked.base is not None or checked.request.init_from is not None or chars >= SMALL_TEXT or not has_base():
        return None
    corpus = " ".join(shlex.quote(name) for name in checked.request.corpus)
    train = fine_tune(corpus, checked.request.checkpoint_dir)
    return f"a small text ({chars:,} characters): starting from the base model is likely better: {train}"


def _init_config(run: Run, base: Base, freeze: Freeze) -> InitConfig:
    """Where the fine-tuned ``run`` came from, once ``base``'s weights are copied into it."""
    return InitConfig(
        source=str(base.source),
        name=base.name,
        weights=base.weights,
        weights_hash=run.copy_in_weights(base.weights_file),
        val_loss=base.val_loss,
        corpus=base.corpus,
        model=base.model,
        freeze=freeze,
        export=base.export,
    )


def new_data_config(names: list[str], found: list[Path], **data: Any) -> DataConfig:
    """The data config of a new run on the files ``found`` from ``names``, fingerprinted, with each file's codec
    (``encoding``: a codec, or auto): the corpus as the user gave it (a file as found, not resolved through links),
    its files by their real paths (which a resume from another directory reads)."""
    size, digest = corpus_fingerprint(found)
    encoding = data.pop("encoding", None) or "auto"
    codecs = {resolve_encoding(f, encoding) for f in found}
    return DataConfig(
        corpus=str(found[0]) if len(found) == 1 else " ".join(names),
        files=tuple(str(f.resolve()) for f in found),
        encoding=codecs.pop() if len(codecs) == 1 else "auto",
        corpus_size=size,
        corpus_hash=digest,
        **data,
    )


def _plan_derived(checked: CheckedRequest, profile: DeviceProfile, checkpoint_dir: Path, cache_dir: Path) -> TrainPlan:
    """A new run made from another: a student of a teacher run (``distill``), or a pruned copy of a run (``prune``),
    on that run's corpus, splits and vocabulary."""
    request = checked.request
    derived_from = request.derived_from
    assert derived_from is not None
    distill = isinstance(derived_from, DistillSettings)
    settings = derived_from.given()
    flag = "--teacher" if distill else "--source"
    try:
        base = find_run(request.checkpoint_dir, settings.pop(flag[2:]), Weights.best)
        base.intact_weights(Weights.best)  # refused before a run is made from it, not by the first load
    except WeightsError as exc:  # no --last here: another run, or better best weights
        step = f"{flag} reads a run's best weights: give another run, or train this one until an epoch beats its best"
        raise exc.instead(step) from None
    saved = base.load_config()
    model = request.model.given()
    if request.data.given():
        raise ConfigError(f"a {'distilled' if distill else 'pruned'} run reads the streams of {base.name!r} as it did")
    if not distill and model:
        raise ConfigError("a pruned run keeps its model; give --units, --layers and the like to textgen distill")
    if checked.training.accumulate != 1 and distill:
        raise ConfigError("textgen distill does not combine with --accumulate (the teacher reads one batch at a time)")
    check_corpus_unchanged(base, saved.data)
    source = str(base.path.resolve())
    distill_cfg = (
        DistillConfig(teacher=source, teacher_val_loss=base.best_weights_loss(), **settings) if distill else None
    )
    prune_cfg = None if distill else PruneConfig(source=source, **settings)
    if distill_cfg:
        stem = f"{base.name}-{model.get('units', saved.model.units)}u"
    else:
        assert prune_cfg is not None
        stem = f"{base.name}-pruned{round(100 * prune_cfg.sparsity)}"
    run, lock = reserve_run(checkpoint_dir, request.run_name, stem)
    try:
        vocab = base.load_vocab(saved.model.vocab_size)
        streams = saved.data.batch_size * checked.training.accumulate
        splits = load_splits(saved.data, cache_dir, vocab, train_streams=streams)
        model_cfg = cfgmod.replace(saved.model, **model) if distill else saved.model
        check_fits_in_memory(model_cfg)
        config = RunConfig(saved.data, model_cfg, checked.training, profile, distill_cfg, prune_cfg)
        run.create(config, vocab)
    except BaseException:
        discard_reserved(run, lock)
        raise
    return TrainPlan(run, config, splits, lock=lock)


def _plan_resume(run: Run, lock: RunLock, checked: CheckedRequest, cache_dir: Path) -> TrainPlan:
    """Reload a locked run to continue it, with the training config the check built; ``--time-budget +30m`` sets a
    budget that much beyond what the run has trained.

    A run with no state.json (killed before its first save) starts again from scratch; a damaged one is
    reported.
    """
    saved = checked.saved
    assert saved is not None
    check_corpus_unchanged(run, saved.data)
    vocab = run.load_vocab(saved.model.vocab_size)  # and checked against the model's size
    state = None
    if run.has_state():
        run.check_usable(vocab_size=saved.model.vocab_size)  # a damaged resume point is reported, never replaced
        state = run.load_state()
    else:  # stopped before its first save: start it cleanly
        run.start_over()
    training, more_time = checked.training, checked.request.training.more_time
    if more_time is not None:
        training = dataclasses.replace(training, time_budget=(state.seconds if state else 0.0) + more_time)
    config = dataclasses.replace(saved, training=training)
    if state:
        _check_room_to_train(run.name, config.training, state, saved.training.time_budget)
    splits = load_splits(config.data, cache_dir, vocab, train_streams=config.train_streams)
    return TrainPlan(run, config, splits, state, lock, saved=saved)


def _check_room_to_train(name: str, training: TrainConfig, state: ResumeState, saved_budget: float | None) -> None:
    """Refuse to resume a run that has done all its epochs, or has trained as long as its time budget, saying what
    to add. Only a run killed past its own budget before validating its last epoch resumes, to validate it; a
    budget given now that the run has already spent is refused, not saved."""
    trained, budget = state.seconds, training.time_budget
    what, add = [], []
    if training.epochs is not None and state.epoch >= training.epochs:
        what.append(f"all {training.epochs} epochs")
        add.append(f"--epochs {state.epoch + 10} (or more)")
    # A run its budget stopped has trained up to the budget less what it held back for its last validation.
    stopped_by_it = state.finished is StopReason.TIME_BUDGET and budget == saved_budget
    spent = budget is not None and (trained >= budget or stopped_by_it)
    if budget is not None and spent and (state.finished is not None or budget != saved_budget):
        limit = f"--time-budget {format_seconds(budget)}"
        what.append(
            f"{format_seconds(trained)} of training, "
            + (f"its {limit}" if budget == saved_budget else f"more than the {limit} given")
        )
        add.append(f"--time-budget {MORE_TIME} (that much more)")
    if what:
        raise ConfigError(f"run {name!r} has done {' and '.join(what)}; add {' and '.join(add)} to train it further")


def keep_extension(plan: TrainPlan) -> None:
    """Save the epochs and time budget a resume gave with the run, so that a plain ``--resume`` after it keeps
    them (not its strategy or save interval: those say how one invocation runs, not what the run is)."""
    saved, training = plan.saved, plan.config.training
    if saved is None:
        return
    kept = dataclasses.replace(saved.training, epochs=training.epochs, time_budget=training.time_budget)
    if kept != saved.training:
        plan.run.save_config(dataclasses.replace(saved, training=kept))


def training_layout(plan: TrainPlan, epoch: int) -> StreamLayout:
    """The training split's layout in ``epoch``: ``--batch-size`` x ``--accumulate`` streams; with
    ``--shift-windows``, shifted by a draw of the run's seed and the epoch (the same on a resume, on every worker)."""
    n, streams, seq_len = len(plan.splits.train), plan.config.train_streams, plan.config.data.seq_len
    if not plan.config.data.shift_windows:
        return StreamLayout.of(n, streams, seq_len)
    return StreamLayout.shifted(n, streams, seq_len, np.random.default_rng([plan.config.training.seed, epoch]))
