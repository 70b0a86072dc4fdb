"""A ``TrainRequest`` checked once, before TensorFlow loads: a recipe's settings merged in, a resumed run's config
read (once) and the changes it allows checked, the corpus found, the run or export to start from resolved, and the
training config built. Planning (``textgen.training.plan``) then builds the run from what this step found."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from textgen import config as cfgmod
from textgen.artifact import ArtifactInfo, Quantize, artifact_dir
from textgen.basemodel import BASE_NAME, is_base_dir
from textgen.baserun import Base, check_shape_kept
from textgen.commands import QUICK_START_TRAIN, command
from textgen.config import (
    InitConfig,
    ModelConfig,
    PruneConfig,
    RunConfig,
    Strategy,
    TrainConfig,
    Weights,
    check_fits_in_memory,
)
from textgen.corpus import find_corpora, resolve_corpora, same_codec
from textgen.errors import ConfigError
from textgen.recipe import BEST_RECIPE, apply_recipe, read_recipe, recipe_base
from textgen.rundirs import find_run, study_path
from textgen.settings import InitSettings, ModelSettings, TrainRequest
from textgen.training.plan import CheckedRequest, check_weight_drop_after

# What a resumed run may change; every other setting must be the run's own (or left out).
RESUMABLE_CHANGES = frozenset({"epochs", "time_budget", "save_every", "sample_every", "strategy"})


def check_request(request: TrainRequest) -> CheckedRequest:
    """Check ``request`` against the files it names, raising the one-line errors; read each file once."""
    request = _with_recipe(request)
    if request.resume:
        return _check_resume(request)
    if not request.corpus and request.derived_from is None:
        raise ConfigError(f"give a corpus to train on, e.g. {command(QUICK_START_TRAIN)}")
    training = dict(request.training.given())
    if request.prune:
        training = {"lr": PruneConfig.FINE_TUNE_LR, **training}
    if request.init_from:
        training = {"warmup": InitConfig.WARMUP_STEPS, **training}
    checked = CheckedRequest(request, TrainConfig.of(**training))
    if request.init_from:
        checked = _with_base(checked, request.init_from)
    elif request.derived_from is None:
        check_weight_drop_after(request.model.given(), rate=None)
        # A model too big for this machine is refused before the corpus is read and TensorFlow loads: its size
        # with one character (planning checks it again with the corpus's vocabulary, which adds little).
        check_fits_in_memory(ModelConfig(vocab_size=1, **request.model.given()))
    # A missing file is said at once, not after TF's ~4 s; a worker of a cluster finds the corpus once it has
    # joined the others (textgen.api.train), so that its failure ends their wait at once.
    if request.corpus and checked.strategy is not Strategy.multiworker:
        checked = dataclasses.replace(checked, found=tuple(find_corpora(list(request.corpus), request.download)))
    return checked


def _with_recipe(request: TrainRequest) -> TrainRequest:
    """The request with a recipe's settings (a file, or a study's best) for those not given: a recipe tuned for
    fine-tuning a run starts from that run unless the request says another."""
    if request.recipe is None and request.from_study is None:
        return request
    recipe = request.recipe
    if request.from_study is not None:
        directory = study_path(request.checkpoint_dir, request.from_study, "--from-study")
        if not directory.is_dir():
            raise ConfigError(
                f"no study {request.from_study!r} in {request.checkpoint_dir}/studies/; start one: "
                f"textgen tune CORPUS --study {request.from_study}"
            )
        from textgen.study import best_recipe  # Optuna's import: only for a study

        settings, recipe = best_recipe(directory), directory / BEST_RECIPE
    else:
        assert recipe is not None
        settings = read_recipe(recipe)
    merged = apply_recipe(
        settings, data=request.data.given(), model=request.model.given(), training=request.training.given()
    )
    return dataclasses.replace(
        request,
        data=dataclasses.replace(request.data, **merged["data"]),
        model=ModelSettings(**merged["model"]),
        training=dataclasses.replace(request.training, **merged["training"]),
        init_from=request.init_from or recipe_base(recipe),
        recipe=None,
        from_study=None,
    )


def _check_resume(request: TrainRequest) -> CheckedRequest:
    """A resume: the run's own config, read once; only the changes a resume allows (``RESUMABLE_CHANGES``)."""
    run = find_run(request.checkpoint_dir, request.run_name)
    saved = run.load_config()
    if request.device != "auto" and saved.profile.name != request.device:
        raise ConfigError(
            f"run {request.run_name or 'the latest'!r} was trained with the {saved.profile.name} profile; a resumed "
            f"run keeps it: use --device {saved.profile.name}, or auto"
        )
    if request.corpus:
        _check_same_corpus(run.name, saved, list(request.corpus))
    given: dict[str, Any] = {**request.data.given(), **request.model.given(), **request.training.given()}
    encoding = given.pop("encoding", None)
    if (
        encoding
        and encoding.lower() != "auto"
        and (saved.data.encoding == "auto" or not same_codec(encoding, saved.data.encoding))
    ):
        given["encoding"] = encoding
    saved_values = {
        **dataclasses.asdict(saved.data),
        **dataclasses.asdict(saved.model),
        **dataclasses.asdict(saved.training),
    }
    changed = sorted(k for k, v in given.items() if k not in RESUMABLE_CHANGES and v != saved_values[k])
    if changed:
        flags = ", ".join(cfgmod.flag(k) for k in changed)
        was = ", ".join(cfgmod.flag_setting(k, saved_values[k]) for k in changed)
        raise ConfigError(
            f"{flags} cannot change when resuming run {run.name!r} (it has {was}); drop them or start a new run"
        )
    allowed = {k: v for k, v in request.training.given().items() if k in RESUMABLE_CHANGES}
    training = cfgmod.replace(saved.training, **allowed)
    return CheckedRequest(request, training, resumed=run, saved=saved)


def _check_same_corpus(name: str, saved: RunConfig, corpus: list[str]) -> None:
    """A corpus given with ``--resume`` must be the run's own files, in its order."""
    given_files, saved_files = resolve_corpora(corpus), [Path(p).resolve() for p in saved.data.paths]
    if given_files == saved_files:
        return
    added, removed = set(given_files) - set(saved_files), set(saved_files) - set(given_files)
    differ = f" ({len(added)} file(s) added, {len(removed)} gone)" if added or removed else " (in another order)"
    differ = differ if len(given_files) > 1 or len(saved_files) > 1 else ""
    raise ConfigError(
        f"run {name!r} trains on {saved.data.corpus_name}, not {' '.join(corpus)}{differ}; "
        "drop the corpus to resume it, or start a new run without --resume"
    )


def _with_base(checked: CheckedRequest, init_from: InitSettings) -> CheckedRequest:
    """``--init-from``: the run's weights to start from, checked intact, or a float export's directory; either way
    the model settings given must keep its shape."""
    model = checked.request.model.given()
    path = artifact_dir(init_from.source)
    if path is None:
        run = find_run(checked.request.checkpoint_dir, init_from.source, init_from.weights)
        base = Base.of_run(run, init_from.weights)
        check_shape_kept(model, base.name, base.model)
        return dataclasses.replace(checked, base=base)
    info = ArtifactInfo.read(path)
    name = BASE_NAME if is_base_dir(path) else info.run  # the run it was exported from, which the base's user lacks
    if info.quantize == Quantize.int8.value:
        raise ConfigError(
            f"--init-from {init_from.source} is an int8 export: its weights were rounded to 8 bits, and training "
            f"on from them would start from a worse model; give a float export or the run, --init-from {info.run}"
        )
    if init_from.weights != Weights.best and init_from.weights != info.weights:
        raise ConfigError(
            f"--init-from {init_from.source} holds one set of weights (run {name}'s {info.weights}); "
            "drop --last, or give the run"
        )
    check_shape_kept(model, name, info.model)
    return dataclasses.replace(checked, export=path)
