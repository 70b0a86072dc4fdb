"""The library's entry points, one per command: each checks what it can before TensorFlow is imported
(~3.5 s), then imports it quietly under the device profile and does the job.

The CLI makes one call here per command and renders what comes back; a Python program can do the same.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from textgen import __version__
from textgen.artifact import ArtifactInfo, ExportFormat, Quantize, artifact_dir, default_export_path
from textgen.checkpoint import DEFAULT_CHECKPOINT_DIR, checkpoint_dir_flag
from textgen.cluster import cluster_role, make_strategy
from textgen.commands import command
from textgen.config import (
    MAX_SAMPLES,
    DataConfig,
    Device,
    DistillConfig,
    ModelConfig,
    PruneConfig,
    RunConfig,
    SampleConfig,
    ServeConfig,
    Strategy,
    TrainConfig,
    check_fits_in_memory,
    settings_given,
)
from textgen.corpus import resolve_corpora
from textgen.device import apply_profile, configure_for_inference, import_tensorflow, resolve_profile
from textgen.durations import format_seconds
from textgen.errors import ConfigError, WeightsError
from textgen.idcache import cache_root
from textgen.recipe import BEST_RECIPE, apply_recipe, read_recipe, recipe_base
from textgen.results import ModelSource
from textgen.rundirs import ensure_writable, find_run, study_path
from textgen.settings import DataSettings, DistillSettings, InitSettings, ModelSettings, PruneSettings, TrainSettings

if TYPE_CHECKING:
    from textgen.generation import Sampler
    from textgen.results import Evaluation, ExportResult, RunSummary, StudyResult, TrainResult
    from textgen.training.progress import TrainingProgress
    from textgen.tune import TuneProgress


def train(
    corpus: str | Path | Sequence[str | Path] | None = None,
    *,
    device: Device | str = Device.auto,
    checkpoint_dir: Path = DEFAULT_CHECKPOINT_DIR,
    run_name: str | None = None,
    resume: bool = False,
    download: bool = False,
    keep_boilerplate: bool = False,
    encoding: str = "auto",
    threads: int | None = None,
    data: DataSettings | None = None,
    model: ModelSettings | None = None,
    training: TrainSettings | None = None,
    progress: TrainingProgress | None = None,
    distill: DistillSettings | None = None,
    prune: PruneSettings | None = None,
    recipe: Path | None = None,
    from_study: str | None = None,
    init_from: InitSettings | None = None,
) -> TrainResult:
    """Plan a new run (or reload one with ``resume``) and train it; ``data``, ``model`` and ``training`` hold the
    settings the user gave (fields left ``None`` take the defaults). ``distill`` trains a student of another run,
    ``prune`` a pruned copy of one, on that run's corpus. ``init_from`` starts the new run from another run's
    weights on its own corpus (fine-tuning: the base run's vocabulary extended, never renumbered).

    Under ``--strategy multiworker`` every worker makes this call with the same arguments; the chief
    plans and writes the run, the others plan a copy in scratch space and train in step with it.

    ``recipe`` (a recipe file or a run's config.json) or ``from_study`` (a ``textgen tune`` study's best recipe)
    supplies the settings not given.
    """
    started = time.monotonic()  # a time budget is wall-clock: TensorFlow's import and the planning count
    names = [str(name) for name in ([corpus] if isinstance(corpus, str | Path) else corpus or [])] or None
    data, model, training = data or DataSettings(), model or ModelSettings(), training or TrainSettings()
    if recipe is not None or from_study is not None:
        data, model, training, init_from = _with_recipe(
            checkpoint_dir, resume, data, model, training, init_from, recipe, from_study
        )
    saved = find_run(checkpoint_dir, run_name).load_config() if resume else None
    _check_train_settings(saved, run_name, device, threads, data, model, training, distill, prune)
    if init_from and (resume or distill or prune):
        what = "--resume" if resume else "textgen distill" if distill else "textgen prune"
        raise ConfigError(
            f"--init-from starts a new run from another run's weights; {what} does not take it "
            "(a fine-tuned run resumes with --resume alone)"
        )
    export = _float_export(init_from, model) if init_from else None
    strategy_name = training.strategy or (saved.training.strategy if saved else Strategy.none)
    role = cluster_role(strategy_name, saved=training.strategy is None)
    if names and strategy_name is not Strategy.multiworker:  # a missing file is said at once, not after TF's ~4 s
        resolve_corpora(names, download=download)  # (a worker of a cluster fails after joining it: see below)
    import_tensorflow()
    profile = saved.profile if saved else resolve_profile(device)  # a resumed run keeps its profile
    apply_profile(profile, threads=threads)
    # Before anything else of TensorFlow's runs (MultiWorkerMirroredStrategy insists) and before planning, so
    # that a worker that fails to plan (a missing corpus) ends the others' wait at once, not after TF's hour.
    strategy = make_strategy(strategy_name, role)
    from textgen.training.loop import train as train_plan
    from textgen.training.plan import plan_training

    with contextlib.ExitStack() as cleanup:
        with contextlib.ExitStack() as planning:
            base = None
            if export is not None:  # its weights read back into a file, which the new run copies in
                from textgen.export import export_base

                base = export_base(export, Path(planning.enter_context(tempfile.TemporaryDirectory(prefix="textgen-"))))
            plan_run = functools.partial(
                plan_training, names, profile, run_name=run_name, resume=resume, download=download,
                keep_boilerplate=keep_boilerplate, encoding=encoding, data=data, model=model, training=training,
                distill=distill, prune=prune, init_from=init_from, base=base,
            )  # fmt: skip
            if role.chief:
                plan = plan_run(checkpoint_dir=checkpoint_dir)
            else:
                scratch = Path(
                    cleanup.enter_context(tempfile.TemporaryDirectory(prefix=f"textgen-worker-{role.index}-"))
                )
                if resume:  # the chief's resume point, read before any worker trains (and the chief writes)
                    copy_run(find_run(checkpoint_dir, run_name).path, scratch)
                elif init_from and base is None:  # the run to start from, where this worker plans
                    copy_run(find_run(checkpoint_dir, init_from.source).path, scratch)
                plan = plan_run(checkpoint_dir=scratch, cache_dir=cache_root(checkpoint_dir))
        plan.chief, plan.started = role.chief, started
        return train_plan(plan, progress, strategy)
    raise AssertionError("unreachable")  # for the type checker: the with block returns or raises


def _tuned_from(
    checkpoint_dir: Path, init_from: InitSettings, model: dict[str, Any]
) -> tuple[InitSettings, dict[str, Any]]:
    """A study's ``--init-from``: the run by its full path (trials are runs in the study's directory), and the
    fixed model settings with the run's shape."""
    from textgen.training.plan import SHAPE_SETTINGS, Base, check_shape_kept

    export = artifact_dir(init_from.source)
    if export is not None:
        run = ArtifactInfo.read(export).run
        raise ConfigError(
            f"textgen tune --init-from takes a run (each trial copies its weights); {init_from.source} is an "
            f"export of run {run}: --init-from {run}"
        )
    base = Base.of_run(find_run(checkpoint_dir, init_from.source, init_from.weights), init_from.weights)
    check_shape_kept(model, base.name, base.model)
    source = dataclasses.replace(init_from, source=str(base.source))
    return source, {**model, **{k: getattr(base.model, k) for k in SHAPE_SETTINGS}}


def _float_export(init_from: InitSettings, model: ModelSettings) -> Path | None:
    """The export directory ``--init-from`` names, if it names one, once it is known to hold float weights that
    the model settings given leave as they are."""
    from textgen.training.plan import check_shape_kept

    path = artifact_dir(init_from.source)
    if path is None:
        return None
    info = ArtifactInfo.read(path)
    if info.quantize == Quantize.int8.value:
        raise ConfigError(
            f"--init-from {init_from.source} is an int8 export: its weights were rounded to 8 bits, and training "
            f"on from them would start from a worse model; give a float export or the run, --init-from {info.run}"
        )
    if init_from.weights != "best" and init_from.weights != info.weights:
        raise ConfigError(
            f"--init-from {init_from.source} holds one set of weights (run {info.run}'s {info.weights}); "
            "drop --last, or give the run"
        )
    check_shape_kept(model.given(), info.run, info.model)
    return path


def _with_recipe(
    checkpoint_dir: Path,
    resume: bool,
    data: DataSettings,
    model: ModelSettings,
    training: TrainSettings,
    init_from: InitSettings | None,
    recipe: Path | None,
    from_study: str | None,
) -> tuple[DataSettings, ModelSettings, TrainSettings, InitSettings | None]:
    """The settings given, with a recipe's (a file, or a study's best) for those not given: a recipe tuned for
    fine-tuning a run starts from that run unless ``init_from`` says another."""
    if recipe is not None and from_study is not None:
        raise ConfigError("give --config or --from-study, not both")
    if resume:
        raise ConfigError("--config and --from-study start a new run; drop them to --resume (a run keeps its recipe)")
    if from_study is not None:
        directory = study_path(checkpoint_dir, from_study, "--from-study")
        if not directory.is_dir():
            raise ConfigError(
                f"no study {from_study!r} in {checkpoint_dir}/studies/; start one: textgen tune CORPUS --study {from_study}"
            )
        from textgen.study import best_recipe  # Optuna's import: only for a study

        settings = best_recipe(directory)
        recipe = directory / BEST_RECIPE
    else:
        assert recipe is not None
        settings = read_recipe(recipe)
    merged = apply_recipe(settings, data=data.given(), model=model.given(), training=training.given())
    return (
        DataSettings(**merged["data"]),
        ModelSettings(**merged["model"]),
        dataclasses.replace(training, **merged["training"]),
        init_from or recipe_base(recipe),
    )


def _check_train_settings(
    saved: RunConfig | None,
    run_name: str | None,
    device: Device | str,
    threads: int | None,
    data: DataSettings,
    model: ModelSettings,
    training: TrainSettings,
    distill: DistillSettings | None,
    prune: PruneSettings | None,
) -> None:
    """Refuse bad settings before TensorFlow's seconds of import: each config is built from them."""
    # A resumed run's flags are checked against its own optimizer (--momentum restated for an SGD run, say).
    own = {"optimizer": training.optimizer or saved.training.optimizer} if saved else {}
    _check_settings(data.given(), model.given(), {**training.given(), **own})
    if distill:
        DistillConfig(**{**distill.given(), "teacher": ""})
    if prune:
        PruneConfig(**{**prune.given(), "source": ""})
    if threads is not None and not 0 < threads <= 1024:
        raise ConfigError(f"--threads must be between 1 and 1024 (got {threads})")
    if training.more_time is not None and not saved:  # forgetting --resume must not start a second run quietly
        more = format_seconds(training.more_time)
        raise ConfigError(
            f"--time-budget +{more} adds time to a run you resume: add --resume (the latest run, or --run NAME), "
            f"or give --time-budget {more} for a new run"
        )
    if saved and device != "auto" and saved.profile.name != device:
        raise ConfigError(
            f"run {run_name or 'the latest'!r} was trained with the {saved.profile.name} profile; a resumed run "
            f"keeps it: use --device {saved.profile.name}, or auto"
        )


def copy_run(source: Path, dest_dir: Path) -> None:
    """Copy a run's files (not its lock, temporary files or logs) into ``dest_dir``; a file the chief replaces
    meanwhile is skipped (only its resume point is read, which it commits by renames)."""
    (dest_dir / source.name).mkdir()
    for path in source.iterdir():
        if path.is_file() and not path.name.startswith("."):
            with contextlib.suppress(FileNotFoundError):
                shutil.copy2(path, dest_dir / source.name / path.name)


def open_generator(
    checkpoint_dir: Path = DEFAULT_CHECKPOINT_DIR,
    run_name: str | None = None,
    which: str = "best",
    model: Path | None = None,
    warm_up: bool = False,
) -> tuple[Sampler, ModelSource]:
    """The sampler of a run (the latest if ``run_name`` is None) with its ``best`` or ``last`` weights, or of an
    exported ``model`` (a LiteRT one without importing TensorFlow); and where it came from. ``warm_up`` compiles
    its steps now (an interactive session's first prompt then answers at once)."""
    if model is not None:
        from textgen.runtime import open_artifact

        if run_name is not None:
            raise ConfigError("give --run or --model, not both")
        sampler: Sampler = open_artifact(model)[0]
        source = ModelSource(str(model))
    else:
        run = find_run(checkpoint_dir, run_name, which)
        import_tensorflow()
        configure_for_inference()
        from textgen.sampling import Generator

        sampler, source = Generator.from_run(run, which), ModelSource(run.name, which)
    if warm_up:
        sampler.generate([" "], SampleConfig(length=2, seed=0))
    return sampler, source


def serve(
    config: ServeConfig,
    checkpoint_dir: Path = DEFAULT_CHECKPOINT_DIR,
    run_name: str | None = None,
    model: Path | None = None,
    on_ready: Callable[[str, ModelSource], None] | None = None,
) -> None:
    """Serve a run's best weights (the latest run if ``run_name`` is None) or an exported ``model`` over HTTP until
    SIGTERM or Ctrl-C drains the server; ``on_ready`` hears its address once the model answers (with
    ``--log-format json``, a start-up record on stderr says it instead)."""
    from textgen.engine import Engine
    from textgen.server import card_of_export, card_of_run, configure_logs, create_app, listen, log_start, run

    sock = listen(config.host, config.port)
    with contextlib.closing(sock):
        try:
            sampler, source = open_generator(checkpoint_dir, run_name, "best", model)
        except WeightsError as exc:  # serve reads a run's best weights only: it has no --last
            raise exc.instead(_serve_last_weights(exc.run)) from None
        if model is not None:
            path = Path(model)
            directory = path.parent if path.is_file() else path
            card = card_of_export(directory.name, ArtifactInfo.read(directory))
        else:
            from textgen.runs import run_summary

            card = card_of_run(run_summary(find_run(checkpoint_dir, source.name)), sampler.cfg, sampler.vocab.size)
        engine = Engine(sampler, config.slots, config.max_queue, config.prefill)
        engine.start()
        try:
            app = create_app(engine, card, config, None if model is not None else checkpoint_dir)
            host, port = sock.getsockname()[:2]
            url = f"http://{f'[{host}]' if ':' in host else host}:{port}"
            configure_logs(config.log_format)  # once the server will run: a failed start leaves logging as it was
            if config.log_format == "json":
                log_start(url, card.model, config)
            elif on_ready is not None:
                on_ready(url, source)
            run(app, sock, engine, config.drain_seconds)
        finally:
            engine.close()


def _serve_last_weights(run: Path) -> str:
    """How to serve the last resume point's weights of the run in ``run``: exported, as serve reads a run's best."""
    flags = f"--run {run.name}{checkpoint_dir_flag(run.parent)}"
    export = command(f"export {flags} --last --format litert")
    serve = command(f"serve --model {default_export_path(run.name, ExportFormat.litert.value)}")
    return f"serve its last resume point's weights from an export instead: {export}, then {serve}"


def export(
    checkpoint_dir: Path = DEFAULT_CHECKPOINT_DIR,
    run_name: str | None = None,
    format: str = "litert",
    quantize: str = "none",
    path: Path | None = None,
    which: str = "best",
) -> ExportResult:
    """Export a run as a self-contained LiteRT or SavedModel directory (see ``textgen.export``)."""
    run = find_run(checkpoint_dir, run_name, which)
    import_tensorflow()
    configure_for_inference()
    from textgen.export import export_run

    return export_run(run, format, quantize, path, which)


def evaluate(
    checkpoint_dir: Path = DEFAULT_CHECKPOINT_DIR,
    run_name: str | None = None,
    split: str = "test",
    file: str | None = None,
    which: str = "best",
    encoding: str = "auto",
    model: Path | None = None,
    streams: int | None = None,
) -> Evaluation:
    """Cross-entropy of a run on its ``split`` or on a text ``file``, or of an exported ``model`` on a ``file``
    (see ``textgen.evaluate``), read as the run's batch of streams or as ``streams`` of them."""
    if streams is not None and not 0 < streams <= MAX_SAMPLES:
        raise ConfigError(f"--streams must be between 1 and {MAX_SAMPLES} (got {streams})")
    if model is not None:
        from textgen.runtime import evaluate_artifact

        if run_name is not None:
            raise ConfigError("give --run or --model, not both")
        if file is None:
            raise ConfigError("an exported --model has no corpus splits: give a text FILE to score")
        return evaluate_artifact(model, file, encoding, streams)
    run = find_run(checkpoint_dir, run_name, which)
    if file is not None:  # a missing or empty file is said at once, not after TensorFlow's ~3 s
        resolve_corpora([file])
    import_tensorflow()
    configure_for_inference()
    from textgen.evaluate import evaluate_run

    return evaluate_run(run, split=split, file=file, which=which, encoding=encoding, streams=streams)


def _check_settings(data: dict[str, Any], model: dict[str, Any], training: dict[str, Any]) -> None:
    """Validate the given settings by building the configs (the values, not the corpus) before TensorFlow loads."""
    given = [settings_given(d) for d in (data, model, training)]
    DataConfig(corpus="", **given[0])
    check_fits_in_memory(ModelConfig(vocab_size=1, **given[1]))
    TrainConfig.of(**given[2])


MIN_TRIAL_SECONDS = 2.0  # a trial trains at least a batch and validates


def tune(
    corpus: list[str] | None,
    *,
    device: str,
    checkpoint_dir: Path,
    study: str | None,
    time_budget: float | None,
    trial_budget: float | None,
    trials: int | None = None,
    seed: int | None = None,
    data: DataSettings | None = None,
    model: ModelSettings | None = None,
    training: TrainSettings | None = None,
    init_from: InitSettings | None = None,
    progress: TuneProgress | None = None,
    download: bool = False,
) -> StudyResult:
    """Run or continue a ``textgen tune`` study (see ``textgen.tune``); ``data``, ``model`` and ``training`` hold
    the recipe settings the user fixed, which are not searched. With ``init_from``, every trial fine-tunes that
    run: its model's shape is fixed. ``download`` fetches a Project Gutenberg book the corpus names, if absent."""
    if trials is not None and not 0 < trials <= 10_000:
        raise ConfigError(f"--trials must be between 1 and 10000 (got {trials})")
    fixed = {
        part: settings.given() if settings else {}
        for part, settings in (("data", data), ("model", model), ("training", training))
    }
    _check_settings(fixed["data"], fixed["model"], {**fixed["training"], "seed": seed})
    if init_from is not None:
        init_from, fixed["model"] = _tuned_from(checkpoint_dir, init_from, fixed["model"])
    if trial_budget is not None and trial_budget < MIN_TRIAL_SECONDS:
        raise ConfigError(f"--trial-budget must be at least {MIN_TRIAL_SECONDS:g}s (got {trial_budget:g}s)")
    from textgen.study import DATABASE, check_fixed_settings, locate_study

    directory = locate_study(checkpoint_dir, corpus, study, download)[2]  # the book fetched here, if asked
    if not (directory / DATABASE).is_file():  # a continued study's own fixed settings count too: checked with them
        check_fixed_settings(fixed)
    ensure_writable(checkpoint_dir)
    import_tensorflow()  # the profile is the study's: tune resolves and applies it
    from textgen.tune import tune as run_study

    return run_study(
        corpus,
        device,
        study_name=study,
        checkpoint_dir=checkpoint_dir,
        time_budget=time_budget,
        trial_budget=trial_budget,
        trials=trials,
        seed=seed,
        fixed=fixed,
        init_from=init_from,
        progress=progress,
    )


def show_study(
    checkpoint_dir: Path, study: str | None, corpus: list[str] | None = None, searching: Sequence[str] = ()
) -> StudyResult:
    """A study's trials and best recipe: the study named, or the corpus's, or the latest; without TensorFlow.
    ``searching`` names the flags of a search that were given with it, which it refuses (it only shows)."""
    if searching:
        raise ConfigError(f"--show only lists a study: drop {', '.join(searching)}")
    from textgen.study import show_study as read_study
    from textgen.study import study_name_of

    return read_study(checkpoint_dir, study_name_of(corpus, study)[0] if corpus or study else None)


def runs(checkpoint_dir: Path = DEFAULT_CHECKPOINT_DIR) -> list[RunSummary]:
    """The runs in ``checkpoint_dir``, most recent first (a damaged one says what is wrong with it)."""
    from textgen.runs import run_summaries

    return run_summaries(checkpoint_dir)


def versions() -> dict[str, str]:
    """textgen's version and those of the libraries it runs on, for bug reports, read without importing them."""
    from importlib.metadata import PackageNotFoundError, version

    found = {"textgen": __version__}
    for name, packages in (("tensorflow", ("tensorflow", "tensorflow-cpu")), ("keras", ("keras",))):
        for package in packages:
            with contextlib.suppress(PackageNotFoundError):
                found[name] = version(package)
                break
        else:
            found[name] = "not installed"
    return found
