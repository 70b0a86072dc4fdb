"""The library's entry points, one per command: each checks what it can before TensorFlow is imported
(~3.5 s), then imports it quietly under the device profile and does the job.

The CLI makes one call here per command and renders what comes back; a Python program can do the same.
"""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from textgen import __version__
from textgen.artifact import ArtifactInfo, ExportFormat, Quantize, artifact_dir, default_export_path
from textgen.basemodel import BASE_NAME, base_path, has_base, is_base_dir, names_base
from textgen.cluster import cluster_role, make_strategy
from textgen.commands import checkpoint_dir_flag, command, fine_tune
from textgen.config import DEFAULT_CHECKPOINT_DIR, MAX_SAMPLES, Split, TrainConfig, Weights, settings_given
from textgen.corpus import resolve_corpora
from textgen.device import apply_profile, configure_for_inference, import_tensorflow, resolve_profile
from textgen.errors import ConfigError, WeightsError
from textgen.genconfig import SampleConfig, ServeConfig
from textgen.idcache import cache_root
from textgen.request import check_request
from textgen.results import ModelSource
from textgen.rundirs import ensure_writable, find_run, list_runs
from textgen.settings import DataSettings, InitSettings, ModelSettings, TrainRequest, TrainSettings
from textgen.tracking import Track, untracked

if TYPE_CHECKING:
    from textgen.generation import Sampler
    from textgen.results import DynamicEvaluation, Evaluation, ExportResult, RunSummary, StudyResult, TrainResult
    from textgen.training.progress import TrainingProgress
    from textgen.tune import TuneProgress


def train(request: TrainRequest, progress: TrainingProgress | None = None) -> TrainResult:
    """Train what ``request`` asks: a new run, a resumed one, a student, a pruned copy or a fine-tuned run (see
    ``TrainRequest``), reporting to ``progress``. The request is checked before TensorFlow loads; the run is
    planned once it has, under the device profile.

    Under ``--strategy multiworker`` every worker makes this call with the same request; the chief plans and writes
    the run, the others plan a copy in scratch space and train in step with it.
    """
    started = time.monotonic()  # a time budget is wall-clock: TensorFlow's import and the planning count
    checked = check_request(request)
    role = cluster_role(checked.strategy, saved=request.training.strategy is None)
    import_tensorflow()
    profile = checked.saved.profile if checked.saved else resolve_profile(request.device)  # a resume keeps it
    apply_profile(profile, threads=request.threads)
    # Before anything else of TensorFlow's runs (MultiWorkerMirroredStrategy insists) and before planning, so
    # that a worker that fails to plan (a missing corpus) ends the others' wait at once, not after TF's hour.
    strategy = make_strategy(checked.strategy, role)
    from textgen.training.loop import train as train_plan
    from textgen.training.plan import plan_training

    with contextlib.ExitStack() as scratch:
        if checked.export is not None:  # its float weights read back into a file, which the new run copies in
            from textgen.export import export_base

            into = Path(scratch.enter_context(tempfile.TemporaryDirectory(prefix="textgen-")))
            checked = dataclasses.replace(checked, base=export_base(checked.export, into))
        checkpoint_dir = request.checkpoint_dir
        if not role.chief:  # the chief's run, read before any worker trains (and the chief writes), or a copy
            worker_dir = tempfile.TemporaryDirectory(prefix=f"textgen-worker-{role.index}-")
            checkpoint_dir = Path(scratch.enter_context(worker_dir))
            if checked.resumed is not None:
                copy_run(checked.resumed.path, checkpoint_dir)
        plan = plan_training(
            checked, profile, started=started, checkpoint_dir=checkpoint_dir,
            cache_dir=cache_root(request.checkpoint_dir), chief=role.chief,
        )  # fmt: skip
        result = train_plan(plan, progress, strategy)
    return result


def _tuned_from(
    checkpoint_dir: Path, init_from: InitSettings, model: dict[str, Any]
) -> tuple[InitSettings, dict[str, Any]]:
    """A study's ``--init-from``: the run by its full path (trials are runs in the study's directory), and the
    fixed model settings with the run's shape."""
    from textgen.baserun import SHAPE_SETTINGS, Base, check_shape_kept

    if names_base(init_from.source):
        raise ConfigError(
            f"textgen tune --init-from takes a run (each trial copies its weights); {BASE_NAME} is the package's "
            f"export: fine-tune it into a run first ({fine_tune()}), then tune "
            "--init-from that run"
        )
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


def copy_run(source: Path, dest_dir: Path) -> None:
    """Copy a run's files (not its lock, temporary files or logs) into ``dest_dir``; a file the chief replaces
    meanwhile is skipped (only its resume point is read, which it commits by renames)."""
    (dest_dir / source.name).mkdir()
    for path in source.iterdir():
        if path.is_file() and not path.name.startswith("."):
            with contextlib.suppress(FileNotFoundError):
                shutil.copy2(path, dest_dir / source.name / path.name)


def _run_or_model(
    checkpoint_dir: Path, run_name: str | None, model: Path | None, fallback: bool = False
) -> tuple[str | None, Path | None, str | None]:
    """The run's name or the export's path a command was given, with ``--run base:en`` taken as the package's
    export; with ``fallback``, neither given and no run in ``checkpoint_dir``, the base model, and a note saying
    so (else None)."""
    if run_name is not None and model is not None:
        raise ConfigError("give --run or --model, not both")
    if names_base(run_name):
        return None, base_path(), None
    if fallback and run_name is None and model is None and not list_runs(checkpoint_dir) and has_base():
        train = fine_tune(checkpoint_dir=checkpoint_dir)
        note = f"no trained run in {checkpoint_dir}/: using the base model {BASE_NAME}; train your own: {train}"
        return None, base_path(), note
    return run_name, model, None


def open_generator(
    *,
    checkpoint_dir: Path = DEFAULT_CHECKPOINT_DIR,
    run_name: str | None = None,
    weights: Weights = Weights.best,
    model: Path | None = None,
    warm_up: bool = False,
    adapt_to: str | None = None,
    fallback: bool = False,
    track: Track = untracked,
) -> tuple[Sampler, ModelSource]:
    """The sampler of a run (the latest if ``run_name`` is None) with its best or last ``weights``, or of an
    exported ``model`` (a LiteRT one without importing TensorFlow; ``base:en``, as a run's name too, is the
    package's base model); and where it came from. With ``fallback``, the base model when there is no run at
    all (``ModelSource.note`` says so). ``warm_up`` compiles its steps now (an interactive session's first prompt
    then answers at once). ``adapt_to``: a run's weights adapted to this text first, by dynamic evaluation
    (``textgen.dynamic``) with the run's ``dynamic.json`` settings or the defaults, ``track`` hearing how it goes;
    the sampler starts where that reading ended, so an empty prompt continues the text. The run's files are not
    changed."""
    run_name, model, note = _run_or_model(checkpoint_dir, run_name, model, fallback)
    if model is not None:
        from textgen.runtime import open_artifact

        if adapt_to is not None and is_base_dir(model):
            raise ConfigError(
                f"--adapt adapts a trained run's weights, and {BASE_NAME} is an export; drop --adapt, or fine-tune "
                f"it into a run first: {fine_tune(checkpoint_dir=checkpoint_dir)}"
            )
        if adapt_to is not None:
            raise ConfigError("--adapt adapts a trained run's weights, not an exported --model; give its --run")
        sampler: Sampler = open_artifact(model)[0]
        source = ModelSource(BASE_NAME if names_base(model) or is_base_dir(model) else str(model), note=note)
    else:
        run = find_run(checkpoint_dir, run_name, weights)
        import_tensorflow()
        configure_for_inference()
        from textgen.sampling import Generator

        source = ModelSource(run.name, Weights(weights).value)
        if adapt_to is None:
            sampler = Generator.from_run(run, weights)
        else:
            from textgen.dynamic import adapted_generator

            sampler = adapted_generator(run, weights, adapt_to, cache_root(checkpoint_dir), track)
    if warm_up:
        sampler.generate([" "], SampleConfig(length=2, seed=0))
    return sampler, source


def serve(
    config: ServeConfig,
    *,
    checkpoint_dir: Path = DEFAULT_CHECKPOINT_DIR,
    run_name: str | None = None,
    model: Path | None = None,
    on_ready: Callable[[str, ModelSource], None] | None = None,
) -> None:
    """Serve a run's best weights (the latest run if ``run_name`` is None) or an exported ``model`` over HTTP until
    SIGTERM or Ctrl-C drains the server; ``on_ready`` hears its address once the model answers (with
    ``--log-format json``, a start-up record on stderr says it instead)."""
    from textgen.engine import Engine
    from textgen.promptcache import PromptCache
    from textgen.server import card_of_export, card_of_run, configure_logs, create_app, listen, log_start, run

    sock = listen(config.host, config.port)
    with contextlib.closing(sock):
        run_name, model, note = _run_or_model(checkpoint_dir, run_name, model, fallback=True)
        try:
            sampler, source = open_generator(checkpoint_dir=checkpoint_dir, run_name=run_name, model=model)
        except WeightsError as exc:  # serve reads a run's best weights only: it has no --last
            raise exc.instead(_serve_last_weights(exc.run)) from None
        source = dataclasses.replace(source, note=note)
        if model is not None:
            directory = artifact_dir(model) or Path(model)
            card = card_of_export(source.name, ArtifactInfo.read(directory), base=is_base_dir(directory))
        else:
            from textgen.runs import run_summary

            card = card_of_run(run_summary(find_run(checkpoint_dir, source.name)), sampler.cfg, sampler.vocab.size)
        engine = Engine(sampler, config.slots, config.max_queue, config.prefill, cache=PromptCache(config.prompt_cache))
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
    *,
    checkpoint_dir: Path = DEFAULT_CHECKPOINT_DIR,
    run_name: str | None = None,
    format: ExportFormat = ExportFormat.litert,
    quantize: Quantize = Quantize.none,
    path: Path | None = None,
    weights: Weights = Weights.best,
) -> ExportResult:
    """Export a run's ``weights`` as a self-contained LiteRT or SavedModel directory at ``path`` (by default
    ``exports/<run>-<format>[-<quantize>]``; see ``textgen.export``). The base model (``base:en``), a LiteRT float16
    export already, is copied as it is."""
    if names_base(run_name):
        from textgen.export import copy_export

        return copy_export(base_path(), ExportFormat(format).value, Quantize(quantize).value, path)
    run = find_run(checkpoint_dir, run_name, weights)
    import_tensorflow()
    configure_for_inference()
    from textgen.export import export_run

    return export_run(run, ExportFormat(format).value, Quantize(quantize).value, path, weights)


def evaluate(
    *,
    checkpoint_dir: Path = DEFAULT_CHECKPOINT_DIR,
    run_name: str | None = None,
    split: Split = Split.test,
    file: str | None = None,
    weights: Weights = Weights.best,
    encoding: str = "auto",
    model: Path | None = None,
    streams: int | None = None,
    track: Track = untracked,
) -> Evaluation:
    """Cross-entropy of a run on its ``split`` or on a text ``file``, or of an exported ``model`` on a ``file``
    (see ``textgen.evaluate``), read as the run's batch of streams or as ``streams`` of them; ``track`` hears the
    characters scored."""
    if streams is not None and not 0 < streams <= MAX_SAMPLES:
        raise ConfigError(f"--streams must be between 1 and {MAX_SAMPLES} (got {streams})")
    given = run_name if names_base(run_name) else "an exported --model"
    run_name, model, _ = _run_or_model(checkpoint_dir, run_name, model)
    if model is not None:
        from textgen.runtime import evaluate_artifact

        if file is None:
            raise ConfigError(f"{given} has no corpus splits: give a text FILE to score")
        evaluation = evaluate_artifact(model, file, encoding, streams, track)
        return dataclasses.replace(evaluation, run=BASE_NAME) if is_base_dir(model) else evaluation
    run = find_run(checkpoint_dir, run_name, weights)
    if file is not None:  # a missing or empty file is said at once, not after TensorFlow's ~3 s
        resolve_corpora([file])
    import_tensorflow()
    configure_for_inference()
    from textgen.evaluate import evaluate_run

    return evaluate_run(
        run, split=Split(split), file=file, weights=weights, encoding=encoding, streams=streams, track=track
    )


def evaluate_dynamic(
    *,
    checkpoint_dir: Path = DEFAULT_CHECKPOINT_DIR,
    run_name: str | None = None,
    split: Split = Split.test,
    file: str | None = None,
    weights: Weights = Weights.best,
    encoding: str = "auto",
    retune: bool = False,
    track: Track = untracked,
) -> DynamicEvaluation:
    """A run's cross-entropy on its ``split`` or a text ``file`` read as one stream, static and with dynamic
    evaluation (see ``textgen.dynamic``): the settings in the run's ``dynamic.json``, tuned on its validation split
    first when it has none or ``retune`` asks; ``track`` hears each stage's characters."""
    if names_base(run_name):
        raise ConfigError(
            f"--dynamic adapts a run's weights, and {BASE_NAME} is an export; score it without --dynamic, or "
            f"fine-tune it into a run first: {fine_tune()}"
        )
    run = find_run(checkpoint_dir, run_name, weights)
    if file is not None:  # a missing or empty file is said at once, not after TensorFlow's ~3 s
        resolve_corpora([file])
    import_tensorflow()
    configure_for_inference()
    from textgen.dynamic import evaluate_dynamic as evaluate_run_dynamically

    return evaluate_run_dynamically(
        run, split=Split(split), file=file, weights=weights, encoding=encoding, retune=retune,
        cache_dir=cache_root(checkpoint_dir), track=track,
    )  # fmt: skip


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
    TrainConfig.of(**fixed["training"], **settings_given({"seed": seed}))  # every trial's, with its recipe's
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
    *, checkpoint_dir: Path, study: str | None, corpus: list[str] | None = None, searching: Sequence[str] = ()
) -> StudyResult:
    """A study's trials and best recipe: the study named, or the corpus's, or the latest; without TensorFlow.
    ``searching`` names the flags of a search that were given with it, which it refuses (it only shows)."""
    if searching:
        raise ConfigError(f"--show only lists a study: drop {', '.join(searching)}")
    from textgen.study import show_study as read_study
    from textgen.study import study_name_of

    return read_study(checkpoint_dir, study_name_of(corpus, study)[0] if corpus or study else None)


def runs(*, checkpoint_dir: Path = DEFAULT_CHECKPOINT_DIR) -> list[RunSummary]:
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
