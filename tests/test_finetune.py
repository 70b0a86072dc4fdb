"""Fine-tuning (``textgen train --init-from``): the vocabulary extended, never renumbered; the base's predictions
kept exactly before any update; the run's provenance, resume, evaluation and frozen layers."""

from __future__ import annotations

import io
import json
import math
import re
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
from helpers import TINY_DATA, assert_one_line_error, invoke, make_text, plan_run, read_history
from hypothesis import given
from hypothesis import strategies as st

from textgen.checkpoint import Run
from textgen.config import Freeze, InitConfig, LRSchedule, ModelConfig
from textgen.data import corpus_source
from textgen.device import CPU
from textgen.errors import ConfigError
from textgen.model import build_model
from textgen.results import StopReason
from textgen.settings import DataSettings, InitSettings, ModelSettings, TrainSettings
from textgen.training.schedules import warmup_factor
from textgen.training.warmstart import NEW_CHAR_MARGIN, extended_output, freeze, start_from_base
from textgen.vocab import DOCUMENT_BOUNDARY, Vocabulary, char_counts

BASE = "tiny"
NEW_CHARS = "Ω!¶"  # none in the tiny run's text; "!" sorts before its letters


@pytest.fixture(scope="module")
def checkpoints(trained_run, tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("finetune") / "checkpoints"
    trained_run.copy_to(directory, BASE)
    return directory


def new_text(path: Path, seed: int = 7, words: int = 2500) -> Path:
    """A text like the base run's, with characters it never saw."""
    text = make_text(words, seed).replace(" cat ", f" {NEW_CHARS[0]}at ").replace(" dog ", f" {NEW_CHARS[1:]}og ")
    path.write_text(text, encoding="utf-8")
    return path


text_strategy = st.text(
    st.characters(codec="utf-8", exclude_categories=("Cs",), exclude_characters=DOCUMENT_BOUNDARY), max_size=200
)


@given(text_strategy, text_strategy, st.none() | st.integers(1, 60), st.booleans())
def test_an_extended_vocabulary_keeps_every_id_and_appends_the_rest(
    base_text: str, new: str, max_chars: int | None, boundary: bool
) -> None:
    base = Vocabulary.from_text(base_text)
    extended = base.extending(*char_counts(new), max_chars, boundary)
    assert extended.chars[: len(base.chars)] == base.chars
    added = extended.chars[len(base.chars) :]
    assert not set(added) & set(base.chars)
    assert set(added) - {DOCUMENT_BOUNDARY} <= set(new)
    assert (DOCUMENT_BOUNDARY in extended.chars) == (boundary or DOCUMENT_BOUNDARY in base.chars)
    room = len(set(new) - set(base.chars)) if max_chars is None else max(0, max_chars - len(base.chars))
    assert len(set(added) - {DOCUMENT_BOUNDARY} - set(base.chars)) == min(room, len(set(new) - set(base.chars)))
    ids = base.encode(base_text)
    assert np.array_equal(extended.encode(base_text), ids)  # a text the base reads keeps its ids


def test_extending_keeps_the_most_frequent_new_characters_under_a_cap() -> None:
    base = Vocabulary.from_text("abc")
    extended = base.extending(*char_counts("zzzz yy x"), max_chars=5)
    assert extended.chars == ("a", "b", "c", " ", "z")


def test_a_new_output_column_is_silent_for_every_state() -> None:
    rng = np.random.default_rng(0)
    kernel, bias = rng.normal(size=(16, 5)).astype(np.float32), rng.normal(size=5).astype(np.float32)
    new_kernel, new_bias = extended_output(kernel, bias, 7)
    assert np.array_equal(new_kernel[:, :5], kernel) and np.array_equal(new_bias[:5], bias)
    for h in (np.ones(16), -np.ones(16), np.sign(kernel[:, 0]), rng.uniform(-1, 1, 16)):
        logits = h @ new_kernel + new_bias
        assert logits[5:].max() <= logits[:5].max() - NEW_CHAR_MARGIN


def test_warmup_rises_linearly_then_holds() -> None:
    assert [warmup_factor(u, 4) for u in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert warmup_factor(0, 0) == 1.0


def test_a_fine_tuned_run_predicts_as_its_base_before_training(checkpoints: Path, tmp_path: Path) -> None:
    plan = plan_run(
        str(new_text(tmp_path / "new.txt")),
        CPU,
        checkpoint_dir=checkpoints,
        run_name="exact",
        data=DataSettings(**TINY_DATA),
        init_from=InitSettings(BASE),
    )
    try:
        base_run = Run(checkpoints / BASE)
        base_vocab, vocab = base_run.load_vocab(), plan.splits.vocab
        assert vocab.chars[: len(base_vocab.chars)] == base_vocab.chars
        assert set(NEW_CHARS) <= set(vocab.chars[len(base_vocab.chars) :])
        base_model = build_model(base_run.load_config().model, 1, stateful=False)
        base_run.load_weights(base_model, "best")
        model = build_model(plan.config.model, 1, stateful=False)
        start_from_base(model, plan.run, plan.config)
        ids = base_vocab.encode(make_text(60, seed=3))[None, :]  # a text the base run could read
        before = np.asarray(base_model(ids, training=False))
        after = np.asarray(model(vocab.encode(base_vocab.decode(ids[0]))[None, :], training=False))
        assert np.abs(after[..., : base_vocab.size] - before).max() <= 1e-6
        new_mass = np.exp(after - after.max(-1, keepdims=True))
        new_mass = new_mass[..., base_vocab.size :].sum(-1) / new_mass.sum(-1)
        assert new_mass.max() < 1e-4
    finally:
        assert plan.lock is not None
        plan.lock.release()


def test_a_fine_tune_that_only_gets_worse_keeps_its_base_s_weights(
    checkpoints: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from textgen.training import loop

    real_build = loop.build_trainer
    noise = np.random.default_rng(0)

    def damaging_trainer(cfg, strategy=None):  # every update also adds noise to every weight
        trainer = real_build(cfg, strategy)
        update = trainer.train_step

        def train_step(x, y):
            loss = update(x, y)
            for weight in trainer.model.trainable_weights:
                weight.assign(np.asarray(weight) + noise.normal(0, 0.05, weight.shape).astype(np.float32))
            return loss

        trainer.train_step = train_step
        return trainer

    monkeypatch.setattr(loop, "build_trainer", damaging_trainer)
    plan = plan_run(
        str(new_text(tmp_path / "new.txt")),
        CPU,
        checkpoint_dir=checkpoints,
        run_name="worse",
        data=DataSettings(**TINY_DATA),
        training=TrainSettings(epochs=6, patience=2, lr_schedule=LRSchedule.cosine),  # no hold: every epoch counts
        init_from=InitSettings(BASE),
    )
    result = loop.train(plan)
    start = result.start_val_loss
    assert start is not None and math.isfinite(start)
    assert result.best_val_loss == start == plan.run.best_weights_loss()
    assert all(row["val_loss"] > start for row in read_history(plan.run.path))
    # Early stopping counted from the base: two epochs that did not beat it, not three after a first "best" one.
    assert (result.stop_reason, result.epochs) == (StopReason.EARLY_STOPPING, 2)
    started = build_model(plan.config.model, 1, stateful=False)
    start_from_base(started, plan.run, plan.config)
    best = build_model(plan.config.model, 1, stateful=False)
    plan.run.load_weights(best, "best")
    base_chars = Run(checkpoints / BASE).load_vocab().size
    for layer in best.layers:  # a new character's embedding row is drawn at random: the base's rows are its weights
        for kept, base in zip(layer.get_weights(), started.get_layer(layer.name).get_weights(), strict=True):
            rows = base_chars if layer.name == "embedding" else len(kept)
            np.testing.assert_array_equal(kept[:rows], base[:rows])
    assert "(the base's weights: no epoch beat them)" in _summary(result)


def test_a_resumed_fine_tune_still_compares_with_its_base_s_weights(checkpoints: Path, tmp_path: Path) -> None:
    from textgen.training import loop

    first = loop.train(
        plan_run(
            str(new_text(tmp_path / "new.txt")),
            CPU,
            checkpoint_dir=checkpoints,
            run_name="resumed",
            data=DataSettings(**TINY_DATA),
            training=TrainSettings(epochs=1),
            init_from=InitSettings(BASE),
        )
    )
    assert first.start_val_loss is not None
    resumed = loop.train(
        plan_run(
            None, CPU, checkpoint_dir=checkpoints, run_name="resumed", resume=True, training=TrainSettings(epochs=2)
        )
    )
    assert resumed.epochs == 2
    assert resumed.start_val_loss == first.start_val_loss  # scored once, before the first update, and kept
    assert "the base's weights" in _summary(resumed)  # the end line compares with them, as the first session's did


def _summary(result) -> str:
    from rich.console import Console

    from textgen.trainview import show_train_result

    console = Console(record=True, width=400, file=io.StringIO())
    show_train_result(console, result, as_json=False)
    return console.export_text()


def test_a_small_text_is_fine_tuned_with_weight_drop_and_locked_output_dropout(
    checkpoints: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = str(new_text(tmp_path / "new.txt"))

    def planned(name: str, **request) -> tuple[ModelConfig, str | None]:
        plan = plan_run(text, CPU, checkpoint_dir=checkpoints, run_name=name, data=DataSettings(**TINY_DATA), **request)
        assert plan.lock is not None
        plan.lock.release()
        return plan.config.model, plan.fit_note

    model, note = planned("small", init_from=InitSettings(BASE))
    assert (model.weight_drop, model.locked_output_dropout) == (0.25, 0.2)
    assert note is not None and "weight-drop 0.25 and locked output dropout 0.2" in note
    model, note = planned("given", init_from=InitSettings(BASE), model=ModelSettings(locked_output_dropout=0.1))
    assert (model.weight_drop, model.locked_output_dropout, note) == (0.0, 0.1, None)  # either rate given: as given
    model, note = planned("scratch-fit")  # only fine-tunes: the base's weights are what it would overfit away
    assert (model.weight_drop, model.locked_output_dropout, note) == (0.0, None, None)
    monkeypatch.setattr(InitConfig, "REGULARIZE_BELOW", 1000)  # the same text, counted as a large one
    model, note = planned("large", init_from=InitSettings(BASE))
    assert (model.weight_drop, model.locked_output_dropout, note) == (0.0, None, None)
    with pytest.raises(ConfigError, match="--weight-drop-after 2 delays weight-drop, which this run does not use"):
        planned("idle", init_from=InitSettings(BASE), model=ModelSettings(weight_drop_after=2))  # no rate to delay
    assert not (checkpoints / "idle").exists()
    monkeypatch.undo()  # a small text again: its default rate is what --weight-drop-after delays
    model, _ = planned("delayed", init_from=InitSettings(BASE), model=ModelSettings(weight_drop_after=2))
    assert (model.weight_drop, model.weight_drop_after) == (0.25, 2)


def test_a_fine_tuned_corpus_has_its_own_cache_entry(checkpoints: Path, tmp_path: Path) -> None:
    text = new_text(tmp_path / "new.txt")
    plan = plan_run(
        str(text), CPU, checkpoint_dir=checkpoints, run_name="cached", data=DataSettings(**TINY_DATA),
        init_from=InitSettings(BASE),
    )  # fmt: skip
    assert plan.lock is not None
    plan.lock.release()
    scratch = plan_run(str(text), CPU, checkpoint_dir=checkpoints, run_name="scratch",
                            data=DataSettings(**TINY_DATA))  # fmt: skip
    assert scratch.lock is not None
    scratch.lock.release()
    assert corpus_source(plan.config.data).key() != corpus_source(scratch.config.data).key()
    assert scratch.splits.vocab == Vocabulary(tuple(sorted(scratch.splits.vocab.chars)))  # its own, in order
    assert plan.splits.vocab != scratch.splits.vocab
    assert plan.splits.vocab.decode(plan.splits.train[:500]) == scratch.splits.vocab.decode(scratch.splits.train[:500])


def test_fine_tune_resume_evaluate_and_runs_from_the_cli(checkpoints: Path, tmp_path: Path) -> None:
    text = str(new_text(tmp_path / "new.txt"))
    where = ("--checkpoint-dir", str(checkpoints))
    result = invoke("train", text, "--init-from", BASE, "--run", "ft", "--epochs", "1", "--batch-size", "8",
                    "--seq-len", "32", "--sample-every", "0", *where)  # fmt: skip
    assert result.exit_code == 0, result.output
    # The start-up block names the base and how good it was, and the rate the run starts at: the warm-up's.
    base_loss = Run(checkpoints / BASE).best_weights_loss()
    assert (
        f"base      fine-tuned from {BASE}, {len(NEW_CHARS)} new characters; its best validation loss "
        f"{base_loss:.4f} nats/char ({base_loss / math.log(2):.3f} bits/char) on tiny.txt"
    ) in result.stdout
    warmup = r"learning rate 0\.002 \(rising from 0 over the first 100 updates, ([\d.]+ epochs|\d+% of an epoch): the warm-up\) held, then"
    assert re.search(warmup, result.stdout), result.stdout
    # The base's weights are scored first; the summary sets the best against them.
    start = float(re.search(r"base      its weights score (\d+\.\d+) nats/char", result.stdout)[1])
    best = float(re.search(r"best validation (\d+\.\d+) nats/char", result.stdout)[1])
    assert best <= start
    kept = "(the base's weights: no epoch beat them)"
    assert (
        kept if best == start else f"better than the base's weights before fine-tuning ({start:.4f})"
    ) in result.stdout
    config = json.loads((checkpoints / "ft" / "config.json").read_text())
    base = json.loads((checkpoints / BASE / "config.json").read_text())
    init = config["init_from"]
    assert init["name"] == BASE and init["weights"] == "best" and init["model"] == base["model"]
    assert init["val_loss"] == pytest.approx(Run(checkpoints / BASE).best_weights_loss())
    with h5py.File(checkpoints / BASE / "best.weights.h5") as fh:
        assert init["weights_hash"] == fh.attrs["textgen_sha256"]
    assert config["model"]["vocab_size"] == base["model"]["vocab_size"] + len(NEW_CHARS)
    assert config["training"]["warmup"] > 0
    # The base run may change or go: its weights were copied in.
    moved = checkpoints.parent / "moved-base"
    shutil.move(checkpoints / BASE, moved)
    try:
        result = invoke("train", "--resume", "--run", "ft", "--epochs", "2", *where)
        assert result.exit_code == 0, result.output
        result = invoke("evaluate", "--run", "ft", "--json", *where)
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout)["nats_per_char"] > 0
        result = invoke("runs", *where)
        assert "fine-tuned from tiny, 3 new characters" in result.stdout
        result = invoke("sample", "--run", "ft", "--length", "40", "--seed", "1", "--json", *where)
        assert result.exit_code == 0, result.output
        # Downstream commands read the run's corpus as it did: with its extended vocabulary.
        for command in (["prune", "--source", "ft", "--run", "ft-pruned"], ["distill", "--teacher", "ft", "--units",
                        "16", "--run", "ft-small"]):  # fmt: skip
            result = invoke(*command, "--epochs", "1", *where)
            assert result.exit_code == 0, result.output
            assert Run(checkpoints / command[-1]).load_vocab() == Run(checkpoints / "ft").load_vocab()
    finally:
        shutil.move(moved, checkpoints / BASE)


def test_a_frozen_embedding_stays_as_the_base_left_it(checkpoints: Path, tmp_path: Path) -> None:
    text = str(new_text(tmp_path / "new.txt"))
    result = invoke("train", text, "--init-from", BASE, "--freeze", "embedding", "--run", "frozen", "--epochs", "1",
                    "--batch-size", "8", "--seq-len", "32", "--sample-every", "0", "--checkpoint-dir",
                    str(checkpoints))  # fmt: skip
    assert result.exit_code == 0, result.output
    run = Run(checkpoints / "frozen")
    config = run.load_config()
    assert config.init_from is not None and config.init_from.freeze is Freeze.embedding
    base = build_model(config.init_from.model, 1, stateful=False)
    Run(checkpoints / BASE).load_weights(base, "best")
    trained = build_model(config.model, 1, stateful=False)
    run.load_weights(trained, "last")  # the best may be the base's own
    (base_rows,), (rows,) = base.get_layer("embedding").get_weights(), trained.get_layer("embedding").get_weights()
    assert np.array_equal(rows[: len(base_rows)], base_rows)
    assert not np.array_equal(base.get_layer("lstm_0").get_weights()[0], trained.get_layer("lstm_0").get_weights()[0])


@pytest.mark.parametrize(
    ("what", "trained"),
    [
        (Freeze.none, {"embedding", "lstm_0", "logits"}),
        (Freeze.embedding, {"lstm_0", "logits"}),
        (Freeze.lstm, {"logits"}),
    ],
)
def test_freezing_leaves_only_the_rest_to_train(what: Freeze, trained: set[str]) -> None:
    from textgen.config import ModelConfig

    model = build_model(ModelConfig(vocab_size=20, units=8, embedding_dim=4), 2)
    freeze(model, what)
    assert {v.path.split("/")[0] for v in model.trainable_variables} == trained


@pytest.mark.parametrize(
    ("flags", "fragments"),
    [
        (["--init-from", BASE, "--units", "64"], ["--units", "would change the model", BASE]),
        (["--init-from", BASE, "--layer-norm"], ["--layer-norm", "would change the model"]),
        (["--freeze", "lstm"], ["--freeze goes with --init-from"]),
        (["--last"], ["--last goes with --init-from"]),
        (["--init-from", "nope"], ["no run 'nope'"]),
        (["--init-from", BASE, "--warmup", "-1"], ["--warmup"]),
    ],
)
def test_bad_fine_tuning_flags_get_one_line(checkpoints: Path, tmp_path: Path, flags, fragments) -> None:
    text = str(new_text(tmp_path / "new.txt"))
    result = invoke("train", text, *flags, "--run", "refused", "--checkpoint-dir", str(checkpoints))
    assert_one_line_error(result, *fragments)
    assert not (checkpoints / "refused").exists()


# 10-17 s each; LiteRT's with -m slow.
@pytest.mark.parametrize(("format", "quantize", "tolerance"),
                         [("savedmodel", "none", 0.0), pytest.param("litert", "none", 0.0, marks=pytest.mark.slow),
                          pytest.param("litert", "float16", 1e-3, marks=pytest.mark.slow)])  # fmt: skip
def test_a_float_export_starts_a_run_with_its_run_s_weights(
    checkpoints: Path, tmp_path: Path, format: str, quantize: str, tolerance: float
) -> None:
    export = tmp_path / "exported"
    result = invoke("export", "--run", BASE, "--format", format, "--quantize", quantize, "-o", str(export),
                    "--checkpoint-dir", str(checkpoints))  # fmt: skip
    assert result.exit_code == 0, result.output
    name = f"from-{format}-{quantize}"
    result = invoke("train", str(new_text(tmp_path / "new.txt")), "--init-from", str(export), "--run", name,
                    "--epochs", "1", "--batch-size", "8", "--seq-len", "32", "--sample-every", "0",
                    "--checkpoint-dir", str(checkpoints))  # fmt: skip
    assert result.exit_code == 0, result.output
    run = Run(checkpoints / name)
    init = run.load_config().init_from
    assert init is not None and init.name == BASE and init.export == f"{format} {quantize}".removesuffix(" none")
    assert init.source == str(export.resolve()) and init.val_loss is None and init.corpus is None
    assert f"base      fine-tuned from tiny ({init.export} export), " in result.stdout
    assert "; its best validation loss not recorded in an export" in result.stdout
    original, read_back = (build_model(init.model, 1, stateful=False) for _ in range(2))
    Run(checkpoints / BASE).load_weights(original, "best")
    run.load_init_weights(read_back)
    for want, got in zip(original.get_weights(), read_back.get_weights(), strict=True):
        assert np.abs(want - got).max() <= tolerance * max(1.0, np.abs(want).max())
    assert f"fine-tuned from tiny ({init.export} export)" in invoke("runs", "--checkpoint-dir", str(checkpoints)).stdout


@pytest.mark.parametrize(
    ("quantize", "flags", "fragments"),
    [("int8", [], ["int8 export", "rounded to 8 bits", f"--init-from {BASE}"]),
     ("none", ["--last"], ["one set of weights", "drop --last"])],
)  # fmt: skip
def test_an_export_without_float_weights_is_refused(
    checkpoints: Path, tmp_path: Path, quantize: str, flags: list[str], fragments: list[str]
) -> None:
    export = tmp_path / "exported"
    result = invoke("export", "--run", BASE, "--format", "litert", "--quantize", quantize, "-o", str(export),
                    "--checkpoint-dir", str(checkpoints))  # fmt: skip
    assert result.exit_code == 0, result.output
    result = invoke("train", str(new_text(tmp_path / "new.txt")), "--init-from", str(export), *flags,
                    "--run", "refused", "--checkpoint-dir", str(checkpoints))  # fmt: skip
    assert_one_line_error(result, *fragments)
    assert not (checkpoints / "refused").exists()


# 11-18 s each. By default: each format, each kind of layer, 2 layers; the rest with -m slow (the suite ~10 min).
@pytest.mark.parametrize(
    ("format", "layers", "layer_norm"),
    [
        ("litert", 2, False),
        ("savedmodel", 2, True),
        pytest.param("litert", 2, True, marks=pytest.mark.slow),
        pytest.param("savedmodel", 2, False, marks=pytest.mark.slow),
        pytest.param("litert", 1, True, marks=pytest.mark.slow),
        pytest.param("savedmodel", 1, True, marks=pytest.mark.slow),
    ],
)
def test_the_weights_read_out_of_an_export_are_the_model_s(
    tmp_path: Path, format: str, layers: int, layer_norm: bool
) -> None:
    from textgen.artifact import ArtifactInfo
    from textgen.config import ModelConfig
    from textgen.export import _generator_options, _write, export_base
    from textgen.sampling import Generator

    # Units equal to the embedding's width: both kernels of a layer have one shape, and the embedding (9 x 8) is
    # the output kernel's (8 x 9) transposed, as LiteRT keeps a kernel: shapes alone could not place them.
    cfg = ModelConfig(vocab_size=9, units=8, embedding_dim=8, layers=layers, layer_norm=layer_norm, dropout=0.0)
    vocab = Vocabulary(tuple("abcdefgh"))
    model = build_model(cfg, 1, stateful=False)
    rng = np.random.default_rng(1)
    model.set_weights([rng.normal(size=w.shape).astype(np.float32) for w in model.get_weights()])
    generator = Generator(cfg, vocab, model.get_weights(), **_generator_options(format))
    info = ArtifactInfo(format, "none", cfg, vocab, "random", "best", 4, 16, False)
    _write(generator, info, tmp_path / "export", lambda: None)
    base = export_base(tmp_path / "export", tmp_path)
    read_back = build_model(cfg, 1, stateful=False)
    read_back.load_weights(base.weights_file)
    for want, got in zip(model.get_weights(), read_back.get_weights(), strict=True):
        assert np.array_equal(want, got)


def test_weights_that_do_not_give_the_export_s_logits_are_refused(
    checkpoints: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import textgen.export

    export = tmp_path / "exported"
    result = invoke("export", "--run", BASE, "--format", "litert", "-o", str(export), "--checkpoint-dir",
                    str(checkpoints))  # fmt: skip
    assert result.exit_code == 0, result.output
    place = textgen.export._place

    def misread(*args):  # as if one array had been misplaced
        weights = place(*args)
        weights[3] = weights[3] + 1.0  # the LSTM's bias
        return weights

    monkeypatch.setattr(textgen.export, "_place", misread)
    with pytest.raises(
        ConfigError, match=f"do not reproduce its logits; give the run it was exported from, --init-from {BASE}"
    ):
        textgen.export.export_base(export, tmp_path)


@pytest.mark.slow  # ~31 s: a study of fine-tunes; fine-tuning and tuning each stay in the default suite
def test_a_study_fine_tunes_a_run_in_every_trial(checkpoints: Path, tmp_path: Path) -> None:
    text = str(new_text(tmp_path / "new.txt", seed=11, words=4000))  # a validation split of a batch of 16 x 50
    where = ("--checkpoint-dir", str(checkpoints))
    shutil.copytree(checkpoints / BASE, checkpoints / "base-of-study")
    tune = (
        "tune",
        text,
        "--study",
        "ft",
        "--init-from",
        "base-of-study",
        "--time-budget",
        "1m",
        "--trial-budget",
        "3s",
    )
    out = invoke(*tune, "--trials", "2", "--json", *where)
    assert out.exit_code == 0, out.stderr
    *trials, study = (json.loads(line) for line in out.stdout.splitlines())
    assert len(trials) == 2 and study["event"] == "study"
    base = Run(checkpoints / "base-of-study")
    shape = base.load_config().model
    for trial in trials:  # each trial is a fine-tuned run of the base, its shape fixed, its vocabulary extended
        run = Run(checkpoints / "studies" / "ft" / trial["run"])
        config = run.load_config()
        assert config.init_from is not None and config.init_from.name == "base-of-study"
        assert config.init_from.source == str(base.path.resolve())
        assert (config.model.units, config.model.layers, config.model.embedding_dim) == (
            shape.units, shape.layers, shape.embedding_dim)  # fmt: skip
        assert run.load_vocab().chars[: shape.vocab_size - 1] == base.load_vocab().chars
    # The best recipe trains again from the base, which best.json names: the shape it holds is the base's, so it is no
    # change; another --init-from may be given.
    best = json.loads((checkpoints / "studies" / "ft" / "best.json").read_text())
    assert best["tuned"]["init_from"] == {"source": str(base.path.resolve()), "weights": "best", "freeze": "none"}
    out = invoke("train", text, "--from-study", "ft", "--epochs", "1", "--run", "best-ft", *where)
    assert out.exit_code == 0, out.stderr
    init = Run(checkpoints / "best-ft").load_config().init_from
    assert init is not None and init.name == "base-of-study"
    out = invoke(
        "train", text, "--from-study", "ft", "--init-from", BASE, "--epochs", "1", "--run", "best-ft-2", *where
    )
    assert out.exit_code == 0, out.stderr
    init = Run(checkpoints / "best-ft-2").load_config().init_from
    assert init is not None and init.name == BASE
    # A continued study keeps its base; another one, a shape of its own or an export are refused.
    out = invoke("tune", "--study", "ft", "--trials", "3", "--json", *where)
    assert out.exit_code == 0, out.stderr
    assert Run(checkpoints / "studies" / "ft" / "trial-002").load_config().init_from is not None
    assert_one_line_error(invoke("tune", "--study", "ft", "--init-from", "base-of-study", "--freeze", "lstm", *where),
                          "was started with --init-from", "not --init-from", "--freeze lstm", "cannot change")  # fmt: skip
    # The base trained further (other best weights), or gone: the study's trials would not compare.
    model = build_model(shape, 1, stateful=False)
    base.load_weights(model, "best")
    model.set_weights([w * 0.5 for w in model.get_weights()])
    base.save_best(model, 1.0)
    best = base.best_weights_path
    assert_one_line_error(invoke("tune", "--study", "ft", "--trials", "4", *where), "changed since the study started")
    best.unlink()
    assert_one_line_error(invoke("tune", "--study", "ft", "--trials", "4", *where), "put the run back")
    assert_one_line_error(invoke("tune", text, "--study", "other", "--init-from", BASE, "--units", "64", *where),
                          "--units would change the model")  # fmt: skip
    export = tmp_path / "exported"
    assert invoke("export", "--run", BASE, "--format", "litert", "-o", str(export), *where).exit_code == 0
    assert_one_line_error(invoke("tune", text, "--study", "x", "--init-from", str(export / "model.tflite"), *where),
                          "takes a run", f"--init-from {BASE}")  # fmt: skip


def test_a_fine_tuned_run_exports_and_serves_its_new_characters(checkpoints: Path, tmp_path: Path) -> None:
    from types import SimpleNamespace

    import httpx
    from test_server import start_server

    from textgen.genconfig import ServeConfig
    from textgen.sampling import Generator

    where = ("--checkpoint-dir", str(checkpoints))
    result = invoke("train", str(new_text(tmp_path / "new.txt")), "--init-from", BASE, "--run", "ft-out",
                    "--epochs", "1", "--batch-size", "8", "--seq-len", "32", "--sample-every", "0", *where)  # fmt: skip
    assert result.exit_code == 0, result.output
    export = tmp_path / "ft-out-litert"
    assert invoke("export", "--run", "ft-out", "--format", "litert", "-o", str(export), *where).exit_code == 0
    prompt = f"the {NEW_CHARS[0]}at"  # a character only the fine-tuned run knows: no warning
    result = invoke("sample", "--model", str(export), "--prime", prompt, "--length", "30", "--json")
    assert result.exit_code == 0, result.output
    assert "warning" not in result.output.lower()
    run = Run(checkpoints / "ft-out")
    served = start_server(SimpleNamespace(run=run, checkpoint_dir=checkpoints), Generator.from_run(run), ServeConfig())
    server = next(served)
    try:
        answer = httpx.post(f"{server.url}/v1/completions", timeout=30,
                            json={"model": server.model, "prompt": prompt, "max_tokens": 20, "seed": 1}).json()  # fmt: skip
        assert answer["choices"][0]["finish_reason"] == "length" and "warnings" not in answer
        assert len(answer["choices"][0]["text"]) == 20
    finally:
        next(served, None)
