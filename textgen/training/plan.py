"""Planning a run: a new one on a corpus, one made from another run (distilled or pruned), or a saved one to
resume, with its corpus resolved, its settings checked and its splits encoded. No TensorFlow: the CLI plans (and
reports a bad flag) before TensorFlow's seconds of import.
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from textgen import config as cfgmod
from textgen.checkpoint import ResumeState, Run, RunLock, check_corpus_unchanged, resume_hint
from textgen.commands import QUICK_START_TRAIN, command
from textgen.config import (
    DataConfig,
    DeviceProfile,
    DistillConfig,
    InitConfig,
    ModelConfig,
    PruneConfig,
    RunConfig,
    TrainConfig,
    check_fits_in_memory,
)
from textgen.corpus import corpus_fingerprint, corpus_stem, find_corpora, resolve_corpora, resolve_encoding, same_codec
from textgen.data import Splits, fit_small_corpus, load_splits
from textgen.durations import MORE_TIME, format_seconds
from textgen.errors import ConfigError, WeightsError
from textgen.idcache import cache_root
from textgen.layout import StreamLayout
from textgen.results import StopReason
from textgen.rundirs import discard_reserved, ensure_writable, find_run, reserve_run
from textgen.settings import DataSettings, DistillSettings, InitSettings, ModelSettings, PruneSettings, TrainSettings
from textgen.vocab import Vocabulary


@dataclass
class TrainPlan:
    """What ``train`` will do: the run, its config, its data, and where it resumes."""

    run: Run
    config: RunConfig
    splits: Splits
    resume_state: ResumeState | None = None  # None: the run starts from its first batch
    lock: RunLock | None = None  # held from planning until ``train`` returns: one writer per run
    chief: bool = True  # False for the other workers of a multi-worker run: their run is a scratch copy
    # When this invocation started (time.monotonic()), if before ``train``: its start-up counts toward the time
    # budget, which is wall-clock. ``textgen.api.train`` sets it to its own start, before TensorFlow's import.
    started: float | None = None
    layout_note: str | None = None  # why a small text got a smaller batch layout than the default

    def saved_note(self) -> str:
        """Where the run was saved and how to continue it, for messages."""
        if not self.chief:
            return "the chief worker saved the run; start every worker again with the same command and --resume"
        return f"saved {self.run.path}; {resume_hint(self.run)}"


@dataclass(frozen=True)
class Base:
    """What a fine-tuned run starts from (``--init-from``): a run's best or last weights, or the float weights of
    an export, read back into a weights file of its model's shape."""

    source: Path  # the run's or the export's directory
    name: str  # the run's name (an export's: the run it was exported from)
    weights: str  # best or last
    weights_file: Path
    vocab: Vocabulary
    model: ModelConfig
    corpus: str | None  # what it trained on (an export does not say)
    val_loss: float | None  # its best validation loss (an export does not say)
    export: str | None = None  # an export's format and weights, e.g. "litert float16"; None for a run

    @classmethod
    def of_run(cls, run: Run, weights: str) -> Base:
        config = run.load_config()
        return cls(
            source=run.path.resolve(),
            name=run.name,
            weights=weights,
            weights_file=run.intact_weights(weights),
            vocab=run.load_vocab(),
            model=config.model,
            corpus=config.data.corpus_name,
            val_loss=_finite_or_none(run.best_weights_loss()),
        )


def plan_training(
    corpus: str | list[str] | None,
    profile: DeviceProfile,
    *,
    checkpoint_dir: Path,
    run_name: str | None = None,
    resume: bool = False,
    download: bool = False,
    keep_boilerplate: bool = False,
    encoding: str = "auto",
    data: DataSettings | None = None,
    model: ModelSettings | None = None,
    training: TrainSettings | None = None,
    cache_dir: Path | None = None,
    distill: DistillSettings | None = None,
    prune: PruneSettings | None = None,
    init_from: InitSettings | None = None,
    base: Base | None = None,
) -> TrainPlan:
    """Resolve the corpus (files, directories, globs) and configs for a new run, or reload a run to resume;
    either way the run is locked for this process until ``train`` returns. With ``distill`` (a teacher run) or
    ``prune`` (a run to prune), the new run trains on that run's corpus, splits and vocabulary; with ``init_from``,
    it starts from another run's weights (or ``base``, an export's, read back) on its own corpus, the base's
    vocabulary extended.

    ``data``, ``model`` and ``training`` hold the settings the user gave (fields left ``None`` take the defaults).
    On resume, only epochs, time budget, save interval and strategy may change. Encoded corpora are cached in
    ``cache_dir`` (by default ``idcache.cache_root(checkpoint_dir)``).
    """
    cache_dir = cache_dir or cache_root(checkpoint_dir)
    names = [corpus] if isinstance(corpus, str) else list(corpus or [])
    data_given, model_given, training_given = (s.given() if s else {} for s in (data, model, training))
    more_time = training.more_time if training else None
    ensure_writable(checkpoint_dir)
    if resume:
        run = find_run(checkpoint_dir, run_name)
        lock = run.lock()  # before anything is read: a second trainer of the run stops here, at once
        try:
            return _plan_resume(
                run, lock, names, encoding, {**data_given, **model_given}, training_given, more_time, cache_dir
            )
        except BaseException:
            lock.release()
            raise
    if distill or prune:
        derived_from = distill or prune
        assert derived_from is not None
        return _plan_derived(
            checkpoint_dir, run_name, profile, data_given, model_given, training_given, cache_dir, derived_from
        )
    if not names:
        raise ConfigError(f"give a corpus to train on, e.g. {command(QUICK_START_TRAIN)}")
    if init_from and base is None:
        base = Base.of_run(find_run(checkpoint_dir, init_from.source, init_from.weights), init_from.weights)
    if base is not None:
        check_shape_kept(model_given, base.name, base.model)
    found = find_corpora(names, download=download)
    run, lock = reserve_run(checkpoint_dir, run_name, corpus_stem(names, found))  # before the corpus is encoded
    try:
        data_given = {**data_given, "base_vocab": "".join(base.vocab.chars)} if base else data_given
        data_cfg = new_data_config(
            names, found, keep_boilerplate, encoding, **{"batch_size": profile.batch_size, **data_given}
        )
        data_cfg, layout_note = fit_small_corpus(data_cfg, cache_dir, _accumulate(training_given), set(data_given))
        splits = load_splits(data_cfg, cache_dir, train_streams=data_cfg.batch_size * _accumulate(training_given))
        if base is not None and init_from is not None:
            model_cfg = cfgmod.replace(base.model, vocab_size=splits.vocab.size, **model_given)
            training_given = {"warmup": InitConfig.WARMUP_STEPS, **training_given}
            init_cfg: InitConfig | None = _init_config(run, base, init_from)
        else:
            model_cfg, init_cfg = ModelConfig(vocab_size=splits.vocab.size, **model_given), None
        check_fits_in_memory(model_cfg)
        config = RunConfig(data_cfg, model_cfg, TrainConfig.of(**training_given), profile, init_from=init_cfg)
        run.create(config, splits.vocab)
    except BaseException:
        discard_reserved(run, lock)
        raise
    return TrainPlan(run, config, splits, lock=lock, layout_note=layout_note)


def _init_config(run: Run, base: Base, init_from: InitSettings) -> InitConfig:
    """Where the fine-tuned ``run`` came from, once ``base``'s weights are copied into it."""
    return InitConfig(
        source=str(base.source),
        name=base.name,
        weights=base.weights,
        weights_hash=run.copy_in_weights(base.weights_file),
        val_loss=base.val_loss,
        corpus=base.corpus,
        model=base.model,
        freeze=init_from.freeze,
        export=base.export,
    )


SHAPE_SETTINGS = ("units", "layers", "embedding_dim", "layer_norm")  # what a fine-tuned run takes from its base


def check_shape_kept(model: dict[str, Any], name: str, shape: ModelConfig) -> None:
    """No setting may change the model's shape, which a fine-tuned run takes from its base, the run ``name`` of
    model ``shape`` (the same value again changes nothing: a recipe may hold it)."""
    changed = [cfgmod.flag(k) for k in SHAPE_SETTINGS if k in model and model[k] != getattr(shape, k)]
    if changed:
        raise ConfigError(
            f"{', '.join(changed)} would change the model, which a fine-tuned run takes from {name!r}; "
            "drop it (or train a new model without --init-from)"
        )


def _finite_or_none(value: float) -> float | None:
    return value if np.isfinite(value) else None


def new_data_config(
    names: list[str], found: list[Path], keep_boilerplate: bool, encoding: str, **data: Any
) -> DataConfig:
    """The data config of a new run on the files ``found`` from ``names``, fingerprinted, with each file's codec:
    the corpus as the user gave it (a file as found, not resolved through links), its files by their real paths
    (which a resume from another directory reads)."""
    size, digest = corpus_fingerprint(found)
    codecs = {resolve_encoding(f, encoding) for f in found}
    return DataConfig(
        corpus=str(found[0]) if len(found) == 1 else " ".join(names),
        files=tuple(str(f.resolve()) for f in found),
        strip_boilerplate=not keep_boilerplate,
        encoding=codecs.pop() if len(codecs) == 1 else "auto",
        corpus_size=size,
        corpus_hash=digest,
        **data,
    )


def _plan_derived(
    checkpoint_dir: Path,
    run_name: str | None,
    profile: DeviceProfile,
    data: dict[str, Any],
    model: dict[str, Any],
    training: dict[str, Any],
    cache_dir: Path,
    derived_from: DistillSettings | PruneSettings,
) -> TrainPlan:
    """A new run made from another: a student of a teacher run (``DistillSettings``), or a pruned copy of a run
    (``PruneSettings``), on that run's corpus, splits and vocabulary. A pruned run fine-tunes at
    ``PruneConfig.FINE_TUNE_LR`` unless given another rate."""
    distill, prune = isinstance(derived_from, DistillSettings), isinstance(derived_from, PruneSettings)
    settings = derived_from.given()
    flag = "--teacher" if distill else "--source"
    try:
        base = find_run(checkpoint_dir, settings.pop(flag[2:]), "best")
        base.intact_weights("best")  # refused before a run is made from it, not by the first load
    except WeightsError as exc:  # no --last here: another run, or better best weights
        step = f"{flag} reads a run's best weights: give another run, or train this one until an epoch beats its best"
        raise exc.instead(step) from None
    saved = base.load_config()
    if data:
        raise ConfigError(f"a {'distilled' if distill else 'pruned'} run reads the streams of {base.name!r} as it did")
    if prune and model:
        raise ConfigError("a pruned run keeps its model; give --units, --layers and the like to textgen distill")
    if training.get("accumulate", 1) != 1 and distill:
        raise ConfigError("textgen distill does not combine with --accumulate (the teacher reads one batch at a time)")
    check_corpus_unchanged(base, saved.data)
    if prune:
        training = {"lr": PruneConfig.FINE_TUNE_LR, **training}
    source = str(base.path.resolve())
    distill_cfg = (
        DistillConfig(teacher=source, teacher_val_loss=base.best_weights_loss(), **settings) if distill else None
    )
    prune_cfg = PruneConfig(source=source, **settings) if prune else None
    if distill_cfg:
        stem = f"{base.name}-{model.get('units', saved.model.units)}u"
    else:
        assert prune_cfg is not None
        stem = f"{base.name}-pruned{round(100 * prune_cfg.sparsity)}"
    run, lock = reserve_run(checkpoint_dir, run_name, stem)
    try:
        vocab = base.load_vocab()
        splits = load_splits(saved.data, cache_dir, vocab, train_streams=saved.data.batch_size * _accumulate(training))
        model_cfg = cfgmod.replace(saved.model, **model) if distill else saved.model
        check_fits_in_memory(model_cfg)
        config = RunConfig(saved.data, model_cfg, TrainConfig.of(**training), profile, distill_cfg, prune_cfg)
        run.create(config, vocab)
    except BaseException:
        discard_reserved(run, lock)
        raise
    return TrainPlan(run, config, splits, lock=lock)


def _accumulate(training: dict[str, Any]) -> int:
    return int(training.get("accumulate", TrainConfig.accumulate))


RESUMABLE_CHANGES = {"epochs", "time_budget", "save_every", "sample_every", "strategy"}


def _plan_resume(
    run: Run,
    lock: RunLock,
    corpus: list[str],
    encoding: str,
    given: dict[str, Any],
    training: dict[str, Any],
    more_time: float | None,
    cache_dir: Path,
) -> TrainPlan:
    """Reload a locked run to continue it; only its epochs, time budget, save and sample intervals and strategy may
    change. ``more_time`` sets a time budget that much beyond what the run has trained.

    A run with no state.json (killed before its first save) starts again from scratch; a damaged one is
    reported.
    """
    saved = run.load_config()
    if corpus:
        given_files, saved_files = resolve_corpora(corpus), [Path(p).resolve() for p in saved.data.paths]
        if given_files != saved_files:
            added, removed = set(given_files) - set(saved_files), set(saved_files) - set(given_files)
            differ = (
                f" ({len(added)} file(s) added, {len(removed)} gone)" if added or removed else " (in another order)"
            )
            differ = differ if len(given_files) > 1 or len(saved_files) > 1 else ""
            raise ConfigError(
                f"run {run.name!r} trains on {saved.data.corpus_name}, not {' '.join(corpus)}{differ}; "
                "drop the corpus to resume it, or start a new run without --resume"
            )
    if encoding.lower() != "auto" and (saved.data.encoding == "auto" or not same_codec(encoding, saved.data.encoding)):
        given = {**given, "encoding": encoding}
    given = {**given, **{k: v for k, v in training.items() if k not in RESUMABLE_CHANGES}}
    saved_values = {**asdict(saved.data), **asdict(saved.model), **asdict(saved.training)}
    changed = sorted(k for k, v in given.items() if v != saved_values[k])
    if changed:
        flags = ", ".join(cfgmod.flag(k) for k in changed)
        was = ", ".join(cfgmod.flag_setting(k, saved_values[k]) for k in changed)
        raise ConfigError(
            f"{flags} cannot change when resuming run {run.name!r} (it has {was}); drop them or start a new run"
        )
    check_corpus_unchanged(run, saved.data)
    state = None
    if run.has_state():
        run.check_usable()  # a damaged resume point is reported, never silently replaced
        state = run.load_state()
    else:  # stopped before its first save: start it cleanly
        run.start_over()
    if more_time is not None:
        training = {**training, "time_budget": (state.seconds if state else 0.0) + more_time}
    config = dataclasses.replace(saved, training=cfgmod.replace(saved.training, **training))
    if state:
        _check_room_to_train(run.name, config.training, state, saved.training.time_budget)
    splits = load_splits(config.data, cache_dir, run.load_vocab(), train_streams=config.train_streams)
    return TrainPlan(run, config, splits, state, lock)


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


def keep_extension(run: Run, config: RunConfig) -> None:
    """Save the epochs and time budget a resume gave with the run, so that a plain ``--resume`` after it keeps
    them (not its strategy or save interval: those say how one invocation runs, not what the run is)."""
    saved = run.load_config()
    kept = dataclasses.replace(saved.training, epochs=config.training.epochs, time_budget=config.training.time_budget)
    if kept != saved.training:
        run.save_config(dataclasses.replace(saved, training=kept))


def training_layout(plan: TrainPlan, epoch: int) -> StreamLayout:
    """The training split's layout in ``epoch``: ``--batch-size`` x ``--accumulate`` streams; with
    ``--shift-windows``, shifted by a draw of the run's seed and the epoch (the same on a resume, on every worker)."""
    n, streams, seq_len = len(plan.splits.train), plan.config.train_streams, plan.config.data.seq_len
    if not plan.config.data.shift_windows:
        return StreamLayout.of(n, streams, seq_len)
    return StreamLayout.shifted(n, streams, seq_len, np.random.default_rng([plan.config.training.seed, epoch]))
