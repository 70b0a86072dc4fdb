"""A recipe: the settings that make a run what it is (model, batch layout, optimizer), without its corpus or
budget, so that ``textgen train CORPUS --config FILE`` trains it again on any text for any time.

A recipe file is JSON with ``data``, ``model`` and ``training`` sections holding only ``RECIPE_FIELDS``;
``textgen tune`` writes its best trial's as ``best.json``, with where it came from under ``tuned`` (and the run its
trials fine-tuned, if they did: ``tuned.init_from``). A run's ``config.json`` reads as a recipe too.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from textgen.config import DataConfig, Freeze, ModelConfig, RunConfig, TrainConfig, Weights, settings_given
from textgen.errors import ConfigError, shown
from textgen.files import atomic_write_text, read_json_object
from textgen.settings import InitSettings
from textgen.typedjson import from_dict, to_dict

RECIPE_FIELDS: dict[str, tuple[str, ...]] = {
    "data": ("batch_size", "seq_len", "max_vocab", "shift_windows"),
    "model": (
        "embedding_dim",
        "units",
        "layers",
        "dropout",
        "layer_norm",
        "weight_drop",
        "weight_drop_after",
        "locked_output_dropout",
    ),
    "training": ("lr", "lr_schedule", "anneal", "clip_norm", "optimizer", "weight_decay", "momentum", "accumulate"),
}
Recipe = dict[str, dict[str, Any]]  # section -> settings
OPTIMIZER_SETTINGS = ("lr", "momentum", "weight_decay")  # what belongs to a recipe's optimizer
BEST_RECIPE = "best.json"  # a study's best trial's recipe, in its directory


def recipe_of(config: RunConfig) -> Recipe:
    """The recipe a run was trained with."""
    sections = {"data": to_dict(config.data), "model": to_dict(config.model), "training": to_dict(config.training)}
    return {part: {k: sections[part][k] for k in names} for part, names in RECIPE_FIELDS.items()}


def base_of(config: RunConfig) -> dict[str, str] | None:
    """The run ``config``'s run was fine-tuned from, as ``--init-from`` gives it (None: it trained from scratch)."""
    init = config.init_from
    return None if init is None else {"source": init.source, "weights": init.weights, "freeze": init.freeze.value}


def recipe_base(path: Path) -> InitSettings | None:
    """The run a tuned recipe's trials fine-tuned (``tuned.init_from``, written by ``base_of``): a recipe tuned for
    fine-tuning trains again from the same base. None for any other recipe."""
    tuned = read_json_object(path).get("tuned")
    init = tuned.get("init_from") if isinstance(tuned, dict) else None
    if init is None:
        return None
    fits = isinstance(init, dict) and set(init) == {"source", "weights", "freeze"}
    if not fits or not isinstance(init["source"], str) or init["weights"] not in tuple(w.value for w in Weights):
        raise ConfigError(f"recipe {path}: tuned.init_from={shown(init)}, not a run's source, weights and freeze")
    return InitSettings(init["source"], init["weights"], Freeze.parse(init["freeze"], "freeze"))


def write_recipe(path: Path, recipe: Recipe, **about: Any) -> None:
    """Save a recipe atomically, with ``about`` (where it came from) beside its sections."""
    atomic_write_text(path, json.dumps({**recipe, **about}, indent=2) + "\n")


def read_recipe(path: Path) -> Recipe:
    """The recipe in a recipe file or a run's ``config.json`` (whose corpus, budget and the like are left out);
    one error naming the file, and the setting, if it holds none."""
    try:
        data = read_json_object(path)
    except FileNotFoundError:
        raise ConfigError(f"--config {path}: no such file") from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"recipe {path} is not a readable JSON object ({exc})") from None
    if not any(isinstance(data.get(part), dict) for part in RECIPE_FIELDS):
        raise ConfigError(f"recipe {path} has no data, model or training section: is it a recipe or config.json?")
    run_config = "profile" in data  # a run's config.json: everything beyond the recipe is left out
    recipe: Recipe = {}
    for part, names in RECIPE_FIELDS.items():
        section = data.get(part, {})
        if not isinstance(section, dict):
            raise ConfigError(f"recipe {path}: its {part} section is not a JSON object of settings")
        unknown = sorted(set(section) - set(names))
        if unknown and not run_config:
            raise ConfigError(f"recipe {path}: unknown {part} settings {unknown} (a recipe holds {list(names)})")
        recipe[part] = {k: v for k, v in section.items() if k in names}
    try:
        _check(recipe)
    except ConfigError as exc:
        raise ConfigError(f"recipe {path}: {exc}") from None
    return recipe


# What each section's config needs beyond a recipe, to check the recipe's settings by making one.
_CONFIGS: dict[str, tuple[type, dict[str, Any]]] = {
    "data": (DataConfig, {"corpus": ""}),
    "model": (ModelConfig, {"vocab_size": 2}),
    "training": (TrainConfig, {}),
}


def _check(recipe: Recipe) -> None:
    """Raise what is wrong with a recipe's settings: a type (``model.units='x', not an integer``), or a value its
    config refuses (``--units must be ...``)."""
    for part, (kind, rest) in _CONFIGS.items():
        from_dict(kind, {**rest, **recipe[part]}, part)


def apply_recipe(recipe: Recipe, **given: dict[str, Any]) -> Recipe:
    """Each section of ``recipe`` overridden by the settings given (``None`` values are not given). Another
    optimizer than the recipe's gets its own defaults for the learning rate, momentum and decay not given."""
    given = {part: settings_given(values) for part, values in given.items()}
    base = {part: dict(recipe.get(part, {})) for part in RECIPE_FIELDS}
    optimizer = given.get("training", {}).get("optimizer")
    if optimizer is not None and optimizer != base["training"].get("optimizer", TrainConfig.optimizer):
        for key in OPTIMIZER_SETTINGS:
            base["training"].pop(key, None)
    return {part: {**base[part], **given.get(part, {})} for part in RECIPE_FIELDS}
