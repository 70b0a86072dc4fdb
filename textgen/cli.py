"""The ``textgen`` command: each command parses its options, makes one call to ``textgen.api``, renders with ``ui``.

The options are declared in ``cliopts`` (a signature names each in one line), and how the command line behaves
apart from the commands (one-line usage errors, the help's look) is ``cliapp``'s. TensorFlow is imported only
inside ``api``'s calls, so ``textgen --help`` and bad flags answer at once.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from textgen import api, commands, examples, trainview, tuneview, ui, workview
from textgen import cliopts as o
from textgen.artifact import ExportFormat, Quantize
from textgen.cliapp import TextgenCommand, TextgenGroup, console, err_console, errors
from textgen.cliopts import (
    CheckpointDirOption,
    JsonOption,
    LastOption,
    ModelOption,
    RunOption,
    SeedOption,
    TempOption,
    TopKOption,
    TopPOption,
)
from textgen.config import DEFAULT_CHECKPOINT_DIR, Device, PruneConfig, Split, Weights, flag
from textgen.durations import parse_budget, parse_duration
from textgen.errors import ConfigError
from textgen.genconfig import SampleConfig, ServeConfig, parse_logit_bias
from textgen.generation import bias_row
from textgen.repl import GREETING, Session
from textgen.settings import (
    DataSettings,
    DistillSettings,
    ModelSettings,
    PruneSettings,
    TrainRequest,
    TrainSettings,
)

SAMPLING, SERVING = SampleConfig(), ServeConfig()

app = typer.Typer(  # no help=: it would hide the callback's docstring, quick start included
    cls=TextgenGroup,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",
    context_settings={"help_option_names": ["-h", "--help"]},
)
command = functools.partial(app.command, cls=TextgenCommand)  # each command's options shown the textgen way


def _show_version(asked: bool) -> None:
    if asked:
        console.print(" ".join(f"{name} {version}" for name, version in api.versions().items()), markup=False)
        raise typer.Exit()


# The help's first lines, with the quick start as the user runs textgen (``.venv/bin/textgen``, say): runnable as shown.
HELP = f"""Train character-level LSTM language models on a book, and play with them.

Quick start: the base model that comes with textgen writes English at once, with no run trained:

`{commands.command(commands.QUICK_START_SAMPLE)}`

Fine-tune it on your text (FILE) in 2 minutes, or train a model of War and Peace from scratch:

`{commands.fine_tune()}`

`{commands.command(commands.QUICK_START_TRAIN)}`
"""


@app.callback(help=HELP)
def _main(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            help="Print the versions of textgen, TensorFlow and Keras, and exit",
            callback=_show_version,
            is_eager=True,
        ),
    ] = False,
) -> None:
    """The options every command shares (``--version``); the help is ``HELP``."""


@command(epilog=examples.TRAIN)
def train(
    corpus: o.TrainCorpus = None,
    batch_size: o.BatchSize = None,
    seq_len: o.SeqLen = None,
    download: o.Download = False,
    keep_boilerplate: o.KeepBoilerplate = False,
    encoding: o.Encoding = "auto",
    max_vocab: o.MaxVocab = None,
    shift_windows: o.ShiftWindows = None,
    units: o.Units = None,
    layers: o.Layers = None,
    embedding_dim: o.EmbeddingDim = None,
    dropout: o.Dropout = None,
    layer_norm: o.LayerNorm = None,
    weight_drop: o.WeightDrop = None,
    weight_drop_after: o.WeightDropAfter = None,
    locked_output_dropout: o.LockedOutputDropout = None,
    lr: o.LR = None,
    optimizer: o.OptimizerOption = None,
    weight_decay: o.WeightDecay = None,
    momentum: o.Momentum = None,
    lr_schedule: o.Schedule = None,
    anneal: o.Anneal = None,
    clip_norm: o.ClipNorm = None,
    epochs: o.EpochsOption = None,
    time_budget: o.TimeBudget = None,
    seed: o.TrainSeed = None,
    accumulate: o.Accumulate = None,
    device: o.DeviceOption = Device.auto,
    strategy: o.StrategyOption = None,
    threads: o.Threads = None,
    run: o.TrainRun = None,
    checkpoint_dir: o.RunsDirOption = DEFAULT_CHECKPOINT_DIR,
    resume: o.Resume = False,
    save_every: o.SaveEvery = None,
    sample_every: o.SampleEveryOption = None,
    recipe: o.Recipe = None,
    from_study: o.FromStudy = None,
    init_from: o.InitFromOption = None,
    last: o.InitLastOption = False,
    freeze: o.FreezeOption = None,
    warmup: o.Warmup = None,
    as_json: o.TrainJsonOption = False,
) -> None:
    """Train a character-level LSTM on text files, saving checkpoints as it goes."""
    given = locals()
    with errors():
        budget, more_time = parse_budget(time_budget)
        request = TrainRequest(
            tuple(corpus or ()),
            device=device,
            checkpoint_dir=checkpoint_dir,
            run_name=run,
            resume=resume,
            download=download,
            threads=threads,
            data=o.settings(DataSettings, given, strip_boilerplate=False if keep_boilerplate else None),
            model=o.settings(ModelSettings, given),
            training=o.settings(
                TrainSettings,
                given,
                time_budget=budget,
                more_time=more_time,
                save_every=parse_duration(save_every, "--save-every") if save_every else None,
                sample_every=parse_duration(sample_every, "--sample-every", zero=True) if sample_every else None,
            ),
            recipe=recipe,
            from_study=from_study,
            init_from=o.init_settings(init_from, last, freeze),
        )
        _train(request, as_json)


def _train(request: TrainRequest, as_json: bool) -> None:
    """Train as ``request`` says, showing progress live (or JSON lines), then the result."""
    result = api.train(request, trainview.TrainingDisplay(console, as_json=as_json))
    trainview.show_train_result(console, result, as_json)


@command(epilog=examples.DISTILL)
def distill(
    teacher: o.Teacher,
    units: o.StudentUnits = None,
    layers: o.StudentLayers = None,
    embedding_dim: o.StudentEmbeddingDim = None,
    dropout: o.StudentDropout = None,
    layer_norm: o.StudentLayerNorm = None,
    weight_drop: o.StudentWeightDrop = None,
    locked_output_dropout: o.StudentLockedOutputDropout = None,
    temperature: o.Temperature = None,
    alpha: o.Alpha = None,
    lr: o.DistillLR = None,
    epochs: o.EpochsOption = None,
    time_budget: o.FromRunTimeBudget = None,
    seed: o.TrainSeed = None,
    device: o.FromRunDevice = Device.auto,
    run: o.StudentRun = None,
    checkpoint_dir: o.RunsDirOption = DEFAULT_CHECKPOINT_DIR,
    as_json: o.TrainJsonOption = False,
) -> None:
    """Train a smaller student on a trained run's softened predictions (knowledge distillation)."""
    with errors():  # settings are checked as they are made
        model = o.settings(ModelSettings, locals())
        training = TrainSettings(lr=lr, epochs=epochs, seed=seed)
        distill = DistillSettings(teacher, temperature, alpha)
    _train_from_run(device, checkpoint_dir, run, training, time_budget, as_json, distill, model)


@command(epilog=examples.PRUNE)
def prune(
    ctx: typer.Context,
    # Not required by click: the old form, prune --run SOURCE --name NAME, names it with --run (see below).
    source: o.Source = None,
    sparsity: o.Sparsity = PruneConfig.sparsity,
    ramp: o.Ramp = PruneConfig.ramp,
    lr: o.PruneLR = None,
    epochs: o.EpochsOption = None,
    time_budget: o.FromRunTimeBudget = None,
    seed: o.TrainSeed = None,
    device: o.FromRunDevice = Device.auto,
    run: o.PrunedRun = None,
    checkpoint_dir: o.RunsDirOption = DEFAULT_CHECKPOINT_DIR,
    as_json: o.TrainJsonOption = False,
    name: Annotated[str | None, typer.Option(hidden=True)] = None,
) -> None:
    """Prune a trained run to a sparsity, fine-tuning it as the smallest weights are masked to zero."""
    if name is not None:  # the old form, prune --run SOURCE --name NAME: kept for one release
        if source is not None or run is None:
            ctx.fail(f"--name is deprecated: write textgen prune --source {source or 'SOURCE'} --run {name}")
        ui.warn(err_console, f"--name is deprecated: write textgen prune --source {run} --run {name}")
        source, run = run, name
    if source is None:
        instead = f": write textgen prune --source {run} (--run names the pruned run)" if run else ""
        ctx.fail(f"missing option '--source', the run to prune{instead}")
    with errors():  # settings are checked as they are made
        training, pruning = TrainSettings(lr=lr, epochs=epochs, seed=seed), PruneSettings(source, sparsity, ramp)
    _train_from_run(device, checkpoint_dir, run, training, time_budget, as_json, pruning)


def _train_from_run(
    device: Device,
    checkpoint_dir: Path,
    run_name: str | None,
    training: TrainSettings,
    time_budget: str | None,
    as_json: bool,
    derived_from: DistillSettings | PruneSettings,
    model: ModelSettings | None = None,
) -> None:
    """Train a run made from another (a student, or a pruned copy; see ``api.train``) on that run's corpus."""
    with errors():
        budget, more_time = parse_budget(time_budget)
        training = dataclasses.replace(training, time_budget=budget, more_time=more_time)
        request = TrainRequest(
            device=device,
            checkpoint_dir=checkpoint_dir,
            run_name=run_name,
            model=model or ModelSettings(),
            training=training,
            distill=derived_from if isinstance(derived_from, DistillSettings) else None,
            prune=derived_from if isinstance(derived_from, PruneSettings) else None,
        )
        _train(request, as_json)


@command(epilog=examples.SAMPLE)
def sample(
    run: RunOption = None,
    checkpoint_dir: CheckpointDirOption = DEFAULT_CHECKPOINT_DIR,
    last: LastOption = False,
    prime: o.Prime = "",
    length: o.SampleLength = SAMPLING.length,
    num: o.Num = SAMPLING.num,
    temp: TempOption = SAMPLING.temperature,
    top_k: TopKOption = SAMPLING.top_k,
    top_p: TopPOption = SAMPLING.top_p,
    frequency_penalty: o.FrequencyPenaltyOption = SAMPLING.frequency_penalty,
    presence_penalty: o.PresencePenaltyOption = SAMPLING.presence_penalty,
    logit_bias: o.LogitBiasOption = None,
    seed: SeedOption = None,
    as_json: o.SampleJson = False,
    model: ModelOption = None,
    prime_file: o.PrimeFileOption = None,
    adapt: o.Adapt = False,
) -> None:
    """Generate text from a trained run (the latest by default) or an exported model."""
    with errors():
        settings = SampleConfig(
            length=length, num=num, temperature=temp, top_k=top_k, top_p=top_p, seed=seed,
            frequency_penalty=frequency_penalty, presence_penalty=presence_penalty,
            logit_bias=parse_logit_bias(logit_bias or []),
        ).seeded()  # fmt: skip
        if adapt and prime_file is None:
            raise ConfigError("--adapt adapts the weights to a document: add --prime-file PATH")
        if prime_file is not None and prime:
            raise ConfigError("give --prime or --prime-file, not both")
        document = ui.read_prime_file(err_console, prime_file)
        with workview.tracker(err_console) as track:
            sampler, source = api.open_generator(
                checkpoint_dir=checkpoint_dir, run_name=run, weights=Weights.of(last), model=model,
                adapt_to=document if adapt else None, fallback=True, track=track,
            )  # fmt: skip
            prompt = prime if document is None else document
            ui.show_sampling(
                console, err_console, sampler, source, prompt, settings, as_json, prime_file, track, read=adapt
            )


@command(epilog=examples.REPL)
def repl(
    run: RunOption = None,
    checkpoint_dir: CheckpointDirOption = DEFAULT_CHECKPOINT_DIR,
    last: LastOption = False,
    length: o.ReplLength = 300,
    temp: TempOption = SAMPLING.temperature,
    top_k: TopKOption = SAMPLING.top_k,
    top_p: TopPOption = SAMPLING.top_p,
    frequency_penalty: o.FrequencyPenaltyOption = SAMPLING.frequency_penalty,
    presence_penalty: o.PresencePenaltyOption = SAMPLING.presence_penalty,
    logit_bias: o.LogitBiasOption = None,
    seed: SeedOption = None,
    model: ModelOption = None,
    prime_file: o.PrimeFileOption = None,
) -> None:
    """Type a prompt, watch the continuation stream in; the model is loaded once."""
    with errors():
        settings = SampleConfig(
            length=length, temperature=temp, top_k=top_k, top_p=top_p, seed=seed, frequency_penalty=frequency_penalty,
            presence_penalty=presence_penalty, logit_bias=parse_logit_bias(logit_bias or []),
        )  # fmt: skip
        document = ui.read_prime_file(err_console, prime_file)
        sampler, source = api.open_generator(
            checkpoint_dir=checkpoint_dir, run_name=run, weights=Weights.of(last), model=model, warm_up=True,
            fallback=True,
        )  # fmt: skip
        bias_row(settings.logit_bias, sampler.vocab)
    ui.note(err_console, source.note)
    console.print(f"[bold]{escape(source.name)}[/] loaded. {GREETING}")
    session = Session(
        sampler, settings, sys.stdout, lambda msg: err_console.print(f"[yellow]{escape(msg)}[/]"),
        functools.partial(workview.tracker, err_console),  # a bar while a long prompt is read
    )  # fmt: skip
    with errors():
        if document is not None:  # the file's text is the first prompt; the conversation goes on from it
            session.generate(document)
        session.run("> ")


@command(epilog=examples.SERVE)
def serve(
    run: RunOption = None,
    checkpoint_dir: CheckpointDirOption = DEFAULT_CHECKPOINT_DIR,
    model: ModelOption = None,
    host: o.Host = SERVING.host,
    port: o.Port = SERVING.port,
    slots: o.Slots = SERVING.slots,
    max_queue: o.MaxQueue = SERVING.max_queue,
    api_key: o.ApiKey = None,
    max_body: o.MaxBody = SERVING.max_body,
    request_timeout: o.RequestTimeout = SERVING.request_timeout,
    drain: o.Drain = SERVING.drain_seconds,
    prefill: o.Prefill = SERVING.prefill,
    log_format: o.LogFormat = SERVING.log_format,
    prompt_cache: o.PromptCache = SERVING.prompt_cache,
) -> None:
    """Serve a run (or an export) to many clients at once: an OpenAI-compatible API and a page to try it."""
    with errors():
        config = ServeConfig(
            host, port, slots, max_queue, api_key, max_body, request_timeout, drain, prefill, log_format, prompt_cache
        )
        api.serve(
            config,
            checkpoint_dir=checkpoint_dir,
            run_name=run,
            model=model,
            on_ready=lambda url, source: ui.show_serving(console, url, source, config),
        )
    console.print("stopped")


@command(epilog=examples.EVALUATE)
def evaluate(
    file: o.EvaluateFile = None,
    run: RunOption = None,
    checkpoint_dir: CheckpointDirOption = DEFAULT_CHECKPOINT_DIR,
    split: o.SplitOption = Split.test,
    last: LastOption = False,
    encoding: o.EvaluateEncoding = "auto",
    streams: o.Streams = None,
    as_json: JsonOption = False,
    model: ModelOption = None,
    dynamic: o.Dynamic = False,
    retune: o.Retune = False,
) -> None:
    """Cross-entropy of a run (or an exported model) on held-out text: nats/char, bits/char and perplexity."""
    with errors():
        if retune and not dynamic:
            raise ConfigError("--retune tunes --dynamic's settings: add --dynamic")
        weights = Weights.of(last)
        if dynamic:  # a run's weights, read as one stream
            if model is not None or streams is not None:
                raise ConfigError(
                    f"--dynamic adapts a run's weights as one stream: drop {'--model' if model else '--streams'}"
                )
            with workview.tracker(err_console) as track:
                adapted = api.evaluate_dynamic(
                    checkpoint_dir=checkpoint_dir, run_name=run, split=split, file=file, weights=weights,
                    encoding=encoding, retune=retune, track=track,
                )  # fmt: skip
            ui.show_dynamic_evaluation(console, err_console, adapted, as_json)
            return
        with workview.tracker(err_console) as track:
            result = api.evaluate(
                checkpoint_dir=checkpoint_dir, run_name=run, split=split, file=file, weights=weights,
                encoding=encoding, model=model, streams=streams, track=track,
            )  # fmt: skip
        ui.show_evaluation(console, err_console, result, as_json)


@command(epilog=examples.EXPORT)
def export(
    format: Annotated[
        ExportFormat,
        typer.Option(help="litert: a .tflite next-token step; savedmodel: a SavedModel for TensorFlow Serving"),
    ],
    run: RunOption = None,
    checkpoint_dir: CheckpointDirOption = DEFAULT_CHECKPOINT_DIR,
    last: LastOption = False,
    quantize: Annotated[
        Quantize, typer.Option(help="LiteRT weights: none (float32), float16 (half size) or int8 (dynamic range)")
    ] = Quantize.none,
    output: Annotated[
        Path | None,
        typer.Option("-o", "--output", help="Directory to write", show_default="exports/RUN-FORMAT[-QUANTIZE]"),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Export a run as a self-contained model for LiteRT or TensorFlow Serving."""
    with errors():
        result = api.export(
            checkpoint_dir=checkpoint_dir, run_name=run, format=format, quantize=quantize, path=output,
            weights=Weights.of(last),
        )  # fmt: skip
        ui.show_export(console, result, as_json)


@command(epilog=examples.TUNE)
def tune(
    corpus: o.TuneCorpus = None,
    time_budget: o.StudyBudget = None,
    trial_budget: o.TrialBudget = None,
    trials: o.Trials = None,
    study: o.Study = None,
    seed: o.StudySeed = None,
    units: o.FixedUnits = None,
    layers: o.FixedLayers = None,
    embedding_dim: o.FixedEmbeddingDim = None,
    dropout: o.FixedDropout = None,
    layer_norm: o.FixedLayerNorm = None,
    weight_drop: o.FixedWeightDrop = None,
    locked_output_dropout: o.FixedLockedOutputDropout = None,
    batch_size: o.FixedBatchSize = None,
    seq_len: o.FixedSeqLen = None,
    optimizer: o.FixedOptimizer = None,
    lr: o.FixedLR = None,
    weight_decay: o.FixedWeightDecay = None,
    clip_norm: o.FixedClipNorm = None,
    init_from: o.TuneInitFrom = None,
    last: o.InitLastOption = False,
    freeze: o.FreezeOption = None,
    device: o.TuneDevice = Device.auto,
    download: o.TuneDownload = False,
    checkpoint_dir: CheckpointDirOption = DEFAULT_CHECKPOINT_DIR,
    show: o.Show = False,
    as_json: o.TuneJson = False,
) -> None:
    """Search for the training recipe that scores best on a corpus's validation split, in a time budget."""
    with errors():  # settings are checked as they are made
        data = DataSettings(batch_size=batch_size, seq_len=seq_len)
        model = o.settings(ModelSettings, locals())
        training = TrainSettings(optimizer=optimizer, lr=lr, weight_decay=weight_decay, clip_norm=clip_norm)
        if show:
            searching = {
                "--time-budget": time_budget,
                "--trial-budget": trial_budget,
                "--trials": trials,
                "--seed": seed,
                "--device": None if device is Device.auto else device,
                "--init-from": init_from,
                "--last": last or None,
                "--freeze": freeze,
                **{flag(k): v for settings in (data, model, training) for k, v in settings.given().items()},
            }
            given = [name for name, value in searching.items() if value is not None]
            tuneview.show_study(
                console,
                api.show_study(checkpoint_dir=checkpoint_dir, study=study, corpus=corpus, searching=given),
                as_json,
            )
            return
        display = tuneview.TuneDisplay(console, as_json=as_json)
        result = api.tune(
            corpus,
            device=device,
            checkpoint_dir=checkpoint_dir,
            study=study,
            time_budget=parse_duration(time_budget) if time_budget else None,
            trial_budget=parse_duration(trial_budget, "--trial-budget") if trial_budget else None,
            trials=trials,
            seed=seed,
            data=data,
            model=model,
            training=training,
            init_from=o.init_settings(init_from, last, freeze),
            progress=display,
            download=download,
        )
        tuneview.show_study(console, result, as_json, shown_live=display.live is not None)


@command(epilog=examples.RUNS)
def runs(checkpoint_dir: CheckpointDirOption = DEFAULT_CHECKPOINT_DIR, as_json: JsonOption = False) -> None:
    """List trained runs, most recent first, with their model, epochs and best validation loss."""
    with errors():
        ui.show_runs(console, api.runs(checkpoint_dir=checkpoint_dir), checkpoint_dir, as_json)


def main() -> None:
    """Console-script entry point."""
    app()
