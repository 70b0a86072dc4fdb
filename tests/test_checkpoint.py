"""Run directories: atomic writes, reloading weights into fresh models, and damaged runs."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import keras
import numpy as np
import pytest
from helpers import plan_run

from textgen.checkpoint import Run, check_run_name
from textgen.config import RunConfig
from textgen.errors import CheckpointError, ConfigError
from textgen.files import atomic_path, atomic_write_text, fsync_tree
from textgen.layout import MASKED, StreamLayout
from textgen.model import build_model, reset_states
from textgen.rundirs import ensure_writable, find_run, list_runs, reserve_run
from textgen.runs import run_summaries
from textgen.settings import DataSettings, ModelSettings, TrainSettings
from textgen.vocab import Vocabulary

# --- atomic writes ---------------------------------------------------------------


def test_atomic_path_replaces_the_file_on_success(tmp_path: Path) -> None:
    target = tmp_path / "best.weights.h5"
    target.write_bytes(b"old")
    with atomic_path(target) as tmp:
        assert tmp.parent == tmp_path
        assert tmp.name.endswith(".weights.h5")  # Keras checks the suffix
        assert tmp != target
        tmp.write_bytes(b"new")
        assert target.read_bytes() == b"old"  # not replaced before the body finishes
    assert target.read_bytes() == b"new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.weights.h5"]


def test_atomic_path_keeps_the_old_file_when_the_body_raises(tmp_path: Path) -> None:
    target = tmp_path / "state.json"
    target.write_text('{"epoch": 3}')
    with pytest.raises(RuntimeError, match="disk on fire"), atomic_path(target) as tmp:
        tmp.write_text('{"epoch": ')  # half written
        raise RuntimeError("disk on fire")
    assert target.read_text() == '{"epoch": 3}'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]  # no temporary file left


def test_atomic_path_creates_nothing_when_the_body_raises(tmp_path: Path) -> None:
    target = tmp_path / "new.json"
    with pytest.raises(KeyboardInterrupt), atomic_path(target) as tmp:
        tmp.write_text("partial")
        raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []


def test_fsync_tree_syncs_every_file_and_directory_of_a_tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tree = tmp_path / "export"
    (tree / "variables").mkdir(parents=True)
    for name in ("textgen.json", "model.tflite", "variables/data"):
        (tree / name).write_text(name)
    synced, fsync = [], os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(os.readlink(f"/proc/self/fd/{fd}")), fsync(fd)))
    fsync_tree(tree)
    assert sorted(synced) == sorted(str(p) for p in [tree, *tree.rglob("*")])


def test_atomic_write_text(tmp_path: Path) -> None:
    target = tmp_path / "vocab.json"
    atomic_write_text(target, "first")
    atomic_write_text(target, "ünïcode second")
    assert target.read_text(encoding="utf-8") == "ünïcode second"
    assert [p.name for p in tmp_path.iterdir()] == ["vocab.json"]


def test_atomic_files_get_the_permissions_of_ordinary_files(tmp_path: Path) -> None:
    reference = tmp_path / "reference.txt"
    reference.write_text("made with open()")
    target = tmp_path / "config.json"
    atomic_write_text(target, "{}")
    assert stat.S_IMODE(target.stat().st_mode) == stat.S_IMODE(reference.stat().st_mode)


def test_run_files_get_the_permissions_of_ordinary_files(tmp_path: Path, trained_run) -> None:
    reference = tmp_path / "reference.txt"
    reference.write_text("made with open()")
    expected = stat.S_IMODE(reference.stat().st_mode)
    for path in trained_run.run.path.iterdir():
        if path.is_file():
            assert stat.S_IMODE(path.stat().st_mode) == expected, path.name


def test_a_resumed_run_keeps_the_batch_losses_up_to_where_it_starts(tmp_path: Path) -> None:
    run = Run(tmp_path / "run")
    run.path.mkdir()
    for epoch, batch in [(0, 5), (0, 10), (1, 5), (1, 10)]:
        run.add_batch_loss(epoch, batch, 10, 2.0)
    with open(run.batch_losses_path, "a") as fh:
        fh.write("2,5,1")  # a row a kill cut short
    run.keep_batch_losses(1, 7)  # resumed in the second epoch, from its 8th batch
    assert (
        run.batch_losses_path.read_text() == "epoch,batch,steps,bpc\n0,5,10,2.00000\n0,10,10,2.00000\n1,5,10,2.00000\n"
    )
    run.keep_batch_losses(0, 0)  # trained anew
    assert run.batch_losses_path.read_text() == "epoch,batch,steps,bpc\n"


# --- reloading a trained run -------------------------------------------------------


def val_loss(model: keras.Model, ids: np.ndarray, batch_size: int, seq_len: int) -> float:
    """Mean validation loss per character, computed the way training does (stateful, from zero state, every
    character after the first: the full batches, then the rest padded with masked targets)."""
    reset_states(model)
    layout = StreamLayout.covering(len(ids), batch_size, seq_len)
    total = 0.0
    for x, y in [layout.batch(ids, k) for k in range(layout.batches)] + layout.last_batches(ids):
        logits = model(x, training=False)
        losses = keras.losses.sparse_categorical_crossentropy(np.maximum(y, 0), logits, from_logits=True)
        total += float(np.sum(np.asarray(losses)[y != MASKED]))
    return total / (len(ids) - 1)


def test_load_config_and_vocab(trained_run) -> None:
    run = find_run(trained_run.checkpoint_dir, "tiny")
    assert run.load_config() == trained_run.plan.config
    assert run.load_vocab() == trained_run.plan.splits.vocab
    assert isinstance(run.load_config(), RunConfig)


def test_best_weights_reload_into_fresh_models(trained_run) -> None:
    run = Run(trained_run.run.path)
    cfg = run.load_config()
    batch, seq_len = cfg.data.batch_size, cfg.data.seq_len
    x = trained_run.plan.splits.val[: batch * seq_len].reshape(batch, seq_len).astype(np.int32)

    loaded = build_model(cfg.model, batch)
    run.load_weights(loaded)
    direct = build_model(cfg.model, batch)
    direct.load_weights(run.best_weights_path)  # plain Keras, no textgen wrapper
    small = build_model(cfg.model, 2)  # another batch size: weights do not depend on it
    run.load_weights(small)
    untrained = build_model(cfg.model, batch)

    for a, b, c in zip(loaded.get_weights(), direct.get_weights(), small.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, c)
    out = np.asarray(loaded(x))
    np.testing.assert_allclose(out, np.asarray(direct(x)), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(out[:2], np.asarray(small(x[:2])), rtol=1e-5, atol=1e-5)
    assert not np.allclose(out, np.asarray(untrained(x)), atol=1e-3)  # loading really changed the model


def test_best_weights_reproduce_the_best_validation_loss(trained_run) -> None:
    run = Run(trained_run.run.path)
    cfg = run.load_config()
    model = build_model(cfg.model, cfg.data.batch_size)
    run.load_weights(model, "best")
    loss = val_loss(model, trained_run.plan.splits.val, cfg.data.batch_size, cfg.data.seq_len)
    assert loss == pytest.approx(trained_run.result.best_val_loss, rel=1e-4)
    state = run.load_state()
    assert state.best_val_loss == pytest.approx(trained_run.result.best_val_loss)


def test_last_weights_are_the_weights_training_had_at_its_last_resume_point(tmp_path: Path) -> None:
    from helpers import TINY_DATA, TINY_MODEL, write_corpus

    from textgen.device import CPU
    from textgen.training.loop import train

    plan = plan_run(
        str(write_corpus(tmp_path / "tiny.txt", 3000)), CPU, checkpoint_dir=tmp_path / "ck", run_name="r",
        data=DataSettings(**TINY_DATA), model=ModelSettings(**TINY_MODEL), training=TrainSettings(epochs=2),
    )  # fmt: skip
    saved: list[list[np.ndarray]] = []
    original = plan.run.save_resume_point

    def record(model, optimizer, state, *streams) -> None:
        saved.append(model.get_weights())
        original(model, optimizer, state, *streams)

    plan.run.save_resume_point = record  # type: ignore[method-assign]
    train(plan)
    run = Run(plan.run.path)
    assert run.weights_path("last") == run.path / run.load_state().last_weights
    model = build_model(run.load_config().model, 1)  # another batch size: the weights do not depend on it
    run.load_weights(model, "last")
    assert len(saved) >= 2 and not all(np.array_equal(a, b) for a, b in zip(saved[0], saved[-1], strict=True))
    for loaded, at_the_end in zip(model.get_weights(), saved[-1], strict=True):
        np.testing.assert_array_equal(loaded, at_the_end)


def _saved_arrays(path: Path) -> dict[str, int]:
    """The arrays of a weights file: name -> number of values."""
    import h5py

    arrays: dict[str, int] = {}
    with h5py.File(path, "r") as fh:
        fh.visititems(lambda name, item: arrays.update({name: item.size}) if isinstance(item, h5py.Dataset) else None)
    return arrays


def _compiled_model(cfg, batch: int) -> keras.Model:
    """A model with a built Adam attached, as training has it (its save_weights would write Adam's moments too)."""
    model = build_model(cfg, batch)
    optimizer = keras.optimizers.Adam()
    model.compile(optimizer=optimizer)
    optimizer.build(model.trainable_variables)
    return model


def test_best_and_last_weights_hold_the_model_only(trained_run, tmp_path: Path) -> None:
    run = Run(trained_run.run.path)
    model = _compiled_model(run.load_config().model, 2)
    for path in (run.best_weights_path, run.weights_path("last")):
        arrays = _saved_arrays(path)
        assert not any(name.startswith("optimizer") for name in arrays), path.name
        assert sum(arrays.values()) == model.count_params(), path.name
    fresh = Run(tmp_path)
    fresh.save_best(model, 1.25)  # an attached optimizer is left out, the loss kept
    assert sum(_saved_arrays(fresh.best_weights_path).values()) == model.count_params()
    assert fresh.best_weights_loss() == 1.25


def test_weights_saved_with_the_optimizer_before_issue_41_still_load(recwarn: pytest.WarningsRecorder) -> None:
    run = Run(Path(__file__).parent / "fixtures" / "legacy-run")
    assert any(name.startswith("optimizer") for name in _saved_arrays(run.best_weights_path))
    plain = build_model(run.load_config().model, 2)
    run.load_weights(plain, "best")
    training = _compiled_model(run.load_config().model, 2)  # as a pruned run loads its source's best
    run.load_weights(training, "best")
    for a, b in zip(plain.get_weights(), training.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    assert int(training.optimizer.iterations.numpy()) == 0  # the file's optimizer state is not taken
    assert run.best_weights_loss() == pytest.approx(1.3261779308319093)
    assert not [w for w in recwarn if "optimizer" in str(w.message)]


# --- finding runs -------------------------------------------------------------------


def test_find_run_in_an_empty_dir_says_to_train_first(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError) as info:
        find_run(tmp_path)
    message = str(info.value)
    assert "no trained run" in message
    assert "train one first: textgen train" in message


def test_find_run_in_a_missing_dir(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="train one first"):
        find_run(tmp_path / "nowhere")


def test_find_run_by_unknown_name_lists_the_runs(trained_run) -> None:
    with pytest.raises(CheckpointError) as info:
        find_run(trained_run.checkpoint_dir, "nope")
    assert "no run 'nope'" in str(info.value)
    assert "tiny" in str(info.value)


def test_find_run_picks_the_most_recently_updated(tmp_path: Path, trained_run) -> None:
    old = trained_run.copy_to(tmp_path, "old")
    trained_run.copy_to(tmp_path, "new")
    (tmp_path / "not-a-run").mkdir()
    for path in (old.config_path, old.state_path):
        os.utime(path, (1_000_000, 1_000_000))
    assert find_run(tmp_path).name == "new"
    assert [r.name for r in list_runs(tmp_path)] == ["new", "old"]
    assert find_run(tmp_path, "old").path == old.path


def test_new_run_names_are_reserved_by_creating_the_directory(tmp_path: Path) -> None:
    def reserved(stem: str) -> str:
        run, lock = reserve_run(tmp_path, None, stem)
        lock.release()
        return run.name

    assert reserved("2600-0") == "2600-0"
    (tmp_path / "2600-0-2").mkdir()
    assert reserved("2600-0") == "2600-0-3"  # 2600-0 is taken by the first reservation
    assert reserved("my book (draft)") == "my-book-draft"
    assert reserved("...") == "run"
    (tmp_path / "afile").write_text("not a run")
    with pytest.raises(ConfigError, match="exists and is not a run directory"):
        reserve_run(tmp_path, "afile", "x")


@pytest.mark.parametrize("name", ["../escape", "a/b", ".hidden", "", "sp ace", "x" * 101])
def test_check_run_name_rejects(name: str) -> None:
    with pytest.raises(ConfigError, match="--run"):
        check_run_name(name)


# --- damaged runs ---------------------------------------------------------------------


@pytest.mark.parametrize("content", ["{not json", "", "[1, 2]", '{"data": {}}'])
def test_corrupt_config(tmp_path: Path, trained_run, content: str) -> None:
    run = trained_run.copy_to(tmp_path)
    run.config_path.write_text(content)
    with pytest.raises(CheckpointError, match=r"config\.json is corrupt"):
        run.load_config()


def test_config_from_another_version(tmp_path: Path, trained_run) -> None:
    run = trained_run.copy_to(tmp_path)
    data = json.loads(run.config_path.read_text())
    data["model"]["attention_heads"] = 4
    run.config_path.write_text(json.dumps(data))
    with pytest.raises(CheckpointError, match="attention_heads"):
        run.load_config()


def test_config_with_wrong_types(tmp_path: Path, trained_run) -> None:
    run = trained_run.copy_to(tmp_path)
    data = json.loads(run.config_path.read_text())
    data["training"]["lr"] = "fast"
    run.config_path.write_text(json.dumps(data))
    with pytest.raises(CheckpointError, match=r"config\.json is corrupt"):
        run.load_config()


def test_missing_config(tmp_path: Path, trained_run) -> None:
    run = trained_run.copy_to(tmp_path)
    run.config_path.unlink()
    with pytest.raises(CheckpointError, match=r"config\.json is missing"):
        run.load_config()


@pytest.mark.parametrize("content", ["{not json", "", '"a string"', '{"epoch": 1, "batch": 0}'])
def test_corrupt_state(tmp_path: Path, trained_run, content: str) -> None:
    run = trained_run.copy_to(tmp_path)
    run.state_path.write_text(content)
    with pytest.raises(CheckpointError, match=r"state\.json is corrupt"):
        run.load_state()


@pytest.mark.parametrize(
    ("key", "value"), [("best_val_loss", "1.2"), ("seconds", [1]), ("epoch", 1.5), ("batch", True)]
)
def test_a_state_number_of_the_wrong_type_is_corrupt_and_runs_lists_the_others(
    tmp_path: Path, trained_run, key: str, value: object
) -> None:
    damaged = trained_run.copy_to(tmp_path / "ck", "damaged")
    trained_run.copy_to(tmp_path / "ck", "fine")
    damaged.state_path.write_text(json.dumps({**json.loads(damaged.state_path.read_text()), key: value}))
    with pytest.raises(CheckpointError, match=rf"state\.json is corrupt \({key}="):
        damaged.load_state()
    summaries = {s.run: s for s in run_summaries(tmp_path / "ck")}
    assert summaries["fine"].problem is None and "corrupt" in (summaries["damaged"].problem or "")


@pytest.mark.parametrize("content", ["{not json", "", "[]", '{"letters": "abc"}', '{"chars": 5}', "null"])
def test_corrupt_vocab(tmp_path: Path, trained_run, content: str) -> None:
    run = trained_run.copy_to(tmp_path)
    run.vocab_path.write_text(content)
    with pytest.raises(CheckpointError, match=r"vocab\.json is corrupt"):
        run.load_vocab()


def test_missing_vocab(tmp_path: Path, trained_run) -> None:
    run = trained_run.copy_to(tmp_path)
    run.vocab_path.unlink()
    with pytest.raises(CheckpointError, match=r"vocab\.json is missing"):
        run.load_vocab()


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty"])
def test_damaged_best_weights(tmp_path: Path, trained_run, damage: str) -> None:
    run = trained_run.copy_to(tmp_path)
    data = run.best_weights_path.read_bytes()
    damaged = {"truncate": data[: len(data) // 2], "garbage": b"\x89HDF not really" * 100, "empty": b""}[damage]
    run.best_weights_path.write_bytes(damaged)
    model = build_model(run.load_config().model, 2)
    with pytest.raises(CheckpointError, match=r"best\.weights\.h5 is corrupt"):
        run.load_weights(model)


@pytest.mark.filterwarnings("ignore:Skipping nested container")
def test_weights_from_another_model(tmp_path: Path, trained_run) -> None:
    run = trained_run.copy_to(tmp_path)
    cfg = run.load_config().model
    other = build_model(type(cfg)(vocab_size=cfg.vocab_size, embedding_dim=cfg.embedding_dim, units=cfg.units + 8), 2)
    with pytest.raises(CheckpointError, match="corrupt or from another model"):
        run.load_weights(other)


def test_missing_best_weights(tmp_path: Path, trained_run) -> None:
    run = trained_run.copy_to(tmp_path)
    run.best_weights_path.unlink()
    model = build_model(run.load_config().model, 2)
    with pytest.raises(CheckpointError, match=r"no best weights yet .*use --last"):  # a run stopped mid-epoch
        run.load_weights(model)
    run.load_weights(model, "last")
    (run.path / run.load_state().last_weights).unlink()
    with pytest.raises(CheckpointError, match="no saved weights yet; train it first"):
        run.load_weights(model)


@pytest.mark.parametrize("damage", ["bad-zip", "truncate", "empty", "garbage", "missing"])
def test_damaged_optimizer_state(tmp_path: Path, trained_run, damage: str) -> None:
    run = trained_run.copy_to(tmp_path)
    path = run.path / run.load_state().optimizer
    data = path.read_bytes()
    if damage == "missing":
        path.unlink()
    else:
        damaged = {"bad-zip": b"PK\x03\x04 not a zip", "truncate": data[: len(data) // 2], "empty": b""}
        path.write_bytes(damaged.get(damage, b"garbage " * 50))
    optimizer = keras.optimizers.Adam()
    optimizer.build(build_model(run.load_config().model, 2).trainable_variables)
    with pytest.raises(CheckpointError, match="cannot resume"):
        run.load_optimizer(optimizer)


def test_optimizer_state_for_another_model(tmp_path: Path, trained_run) -> None:
    run = trained_run.copy_to(tmp_path)
    optimizer = keras.optimizers.Adam()
    optimizer.build(build_model(type(run.load_config().model)(vocab_size=7, units=4), 2).trainable_variables)
    with pytest.raises(CheckpointError, match="does not match"):
        run.load_optimizer(optimizer)


# --- unwritable places --------------------------------------------------------------------


def test_ensure_writable_under_a_file(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("not a directory")
    with pytest.raises(CheckpointError) as info:
        ensure_writable(tmp_path / "afile" / "sub")
    message = str(info.value)
    assert "cannot write to" in message and "afile" in message
    assert "--checkpoint-dir" in message


def test_ensure_writable_creates_the_dir_and_leaves_no_probe(tmp_path: Path) -> None:
    ensure_writable(tmp_path / "new" / "runs")
    assert list((tmp_path / "new" / "runs").iterdir()) == []


def test_run_create_in_an_unwritable_place(tmp_path: Path, trained_run) -> None:
    (tmp_path / "afile").write_text("not a directory")
    cfg = trained_run.plan.config
    with pytest.raises(CheckpointError, match="--checkpoint-dir"):
        Run(tmp_path / "afile" / "run").create(cfg, Vocabulary.from_text("abc"))
