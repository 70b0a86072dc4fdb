"""textgen distill and textgen prune: the soft-target loss, the pruning masks and schedule, and the runs they make."""

from __future__ import annotations

import itertools
import json
import signal
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from helpers import assert_one_line_error, invoke, plan_run, run_textgen

from textgen.checkpoint import Run
from textgen.config import PruneConfig
from textgen.device import CPU
from textgen.errors import TrainingInterrupted
from textgen.model import build_model
from textgen.settings import DataSettings, DistillSettings, ModelSettings, PruneSettings, TrainSettings
from textgen.training.loop import train
from textgen.training.progress import NoProgress
from textgen.training.pruning import PruneSchedule, prunable_kernels
from textgen.training.step import soft_cross_entropy

TEACHER = "tiny"


@pytest.fixture(scope="module")
def checkpoints(trained_run, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A private copy of the session's tiny run, as the teacher and the run to prune."""
    directory = tmp_path_factory.mktemp("compress") / "checkpoints"
    trained_run.copy_to(directory, TEACHER)
    return directory


def kernels(run: Run, which: str = "best") -> list[np.ndarray]:
    cfg = run.load_config()
    model = build_model(cfg.model, 1, stateful=False)
    run.load_weights(model, which)
    return [k.numpy() for k in prunable_kernels(model)]


def derived_plan(
    checkpoints: Path,
    name: str,
    distill: dict | None = None,
    prune: dict | None = None,
    model: dict | None = None,
    training: dict | None = None,
):
    return plan_run(
        None,
        CPU,
        checkpoint_dir=checkpoints,
        run_name=name,
        distill=DistillSettings(**distill) if distill else None,
        prune=PruneSettings(**prune) if prune else None,
        model=ModelSettings(**(model or {})),
        training=TrainSettings(**(training or {})),
    )


# --- distillation -------------------------------------------------------------------------


def test_soft_cross_entropy_is_the_tempered_cross_entropy_times_t_squared() -> None:
    rng = np.random.default_rng(0)
    teacher, student = rng.normal(size=(2, 3, 7)), rng.normal(size=(2, 3, 7))
    temperature = 2.5

    def softmax(z: np.ndarray) -> np.ndarray:
        e = np.exp(z - z.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)

    expected = -(softmax(teacher / temperature) * np.log(softmax(student / temperature))).sum() * temperature**2
    got = soft_cross_entropy(tf.constant(teacher, tf.float32), tf.constant(student, tf.float32), temperature)
    assert float(got) == pytest.approx(expected, rel=1e-5)


def test_soft_targets_pass_no_gradient_to_the_teacher() -> None:
    teacher, student = tf.Variable(tf.random.normal([4, 5])), tf.Variable(tf.random.normal([4, 5]))
    with tf.GradientTape() as tape:
        loss = soft_cross_entropy(teacher, student, 2.0)
    d_teacher, d_student = tape.gradient(loss, [teacher, student])
    assert d_teacher is None
    assert float(tf.reduce_sum(tf.abs(d_student))) > 0


def test_distillation_with_alpha_one_is_ordinary_training(checkpoints: Path) -> None:
    """alpha = 1 gives the teacher's term no weight: the student's weights are those of training from scratch
    on the same streams, which shows the teacher reads the student's batches without disturbing them."""
    student = derived_plan(
        checkpoints, "alpha1", distill={"teacher": TEACHER, "alpha": 1.0}, training={"epochs": 1}, model={"units": 8}
    )
    train(student)
    teacher_cfg = Run(checkpoints / TEACHER).load_config()
    plain = plan_run(
        teacher_cfg.data.corpus,
        CPU,
        checkpoint_dir=checkpoints,
        run_name="plain",
        data=DataSettings(batch_size=teacher_cfg.data.batch_size, seq_len=teacher_cfg.data.seq_len),
        model=ModelSettings(**{**_model_settings(teacher_cfg.model), "units": 8}),
        training=TrainSettings(epochs=1),
    )
    train(plain)
    for a, b in zip(kernels(student.run, "last"), kernels(plain.run, "last"), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6)


def _model_settings(model) -> dict:
    return {"embedding_dim": model.embedding_dim, "layers": model.layers, "dropout": model.dropout}


@pytest.mark.slow  # ~15 s; test_distillation_with_alpha_one_is_ordinary_training stays in the default suite
def test_a_student_learns_from_the_teacher_and_is_an_ordinary_run(checkpoints: Path) -> None:
    plan = derived_plan(
        checkpoints,
        "student",
        distill={"teacher": TEACHER, "temperature": 2.0, "alpha": 0.0},
        model={"units": 12},
        training={"epochs": 3, "lr": 1e-2},
    )
    result = train(plan)
    cfg = plan.run.load_config()
    assert cfg.model.units == 12
    assert cfg.distill is not None and Path(cfg.distill.teacher) == (checkpoints / TEACHER).resolve()
    assert plan.run.load_vocab() == Run(checkpoints / TEACHER).load_vocab()
    assert result.best_val_loss < 3.0  # the uniform distribution over the tiny vocabulary is ~3.3 nats/char
    sample = run_textgen(
        ["sample", "--run", "student", "--length", "40", "--checkpoint-dir", str(checkpoints), "--json"], Path.cwd()
    )
    assert sample.returncode == 0, sample.stderr
    assert len(json.loads(sample.stdout)["text"]) == 40  # (text ending in newlines made a plain-text count flaky)


def test_a_student_refuses_a_teacher_whose_best_weights_changed(trained_run, tmp_path: Path) -> None:
    """Its soft targets would change in the middle of the run: a teacher trained further is another teacher."""
    import h5py

    from textgen.errors import ConfigError
    from textgen.training.step import build_trainer

    teacher = trained_run.copy_to(tmp_path / "ck", "teacher")
    plan = derived_plan(tmp_path / "ck", "student", distill={"teacher": "teacher"}, model={"units": 12})
    assert plan.config.distill is not None and plan.config.distill.teacher_val_loss == teacher.best_weights_loss()
    plan.lock.release()
    build_trainer(plan.config)  # the same teacher: fine
    with h5py.File(teacher.best_weights_path, "a") as fh:  # as a further epoch of the teacher would leave it
        fh.attrs["textgen_val_loss"] = teacher.best_weights_loss() - 0.01
    with pytest.raises(ConfigError, match="the teacher run 'teacher' has other best weights than when this student"):
        build_trainer(plan.config)


# --- pruning ------------------------------------------------------------------------------


def test_the_schedule_rises_on_a_cubic_to_the_target_by_the_end_of_the_ramp() -> None:
    schedule = PruneSchedule([], target=0.8, ramp=0.5, progress=lambda epoch, batch: 0.0)
    values = [schedule.sparsity_at(p / 100) for p in range(101)]
    assert values[0] == 0.0
    assert values[50] == pytest.approx(0.8) and values[100] == pytest.approx(0.8)
    assert all(a <= b for a, b in itertools.pairwise(values))
    assert values[25] == pytest.approx(0.8 * (1 - 0.5**3))  # fast at first: 70% of the target half-way up
    assert schedule.sparsity_at(0.2549) == schedule.sparsity_at(0.25)  # steps of 1% of the run


def test_pruned_weights_are_exactly_zero_at_the_target_and_stay_so(checkpoints: Path) -> None:
    plan = derived_plan(checkpoints, "pruned", prune={"source": TEACHER, "sparsity": 0.75}, training={"epochs": 3})
    result = train(plan)
    assert plan.run.load_config().prune == PruneConfig(source=str((checkpoints / TEACHER).resolve()), sparsity=0.75)
    for which in ("best", "last"):
        for kernel in kernels(plan.run, which):
            assert (kernel == 0).mean() == pytest.approx(0.75, abs=1 / kernel.size), which
    # the fine-tuning changed the surviving weights (it is not a one-shot cut)
    source, pruned = kernels(Run(checkpoints / TEACHER)), kernels(plan.run)
    kept = pruned[0] != 0
    assert not np.allclose(source[0][kept], pruned[0][kept])
    assert result.best_val_loss < 3.0


def test_a_pruned_run_resumes_with_the_same_masks(checkpoints: Path) -> None:
    """Stopped mid-run, a pruned run resumes with exactly the weights it had masked (a mask is the set of zeros),
    and they stay zero to the end."""

    class StopAtBatch5(NoProgress):
        def batch_end(self, batch: int, loss: float) -> None:
            if batch == 4:
                signal.raise_signal(signal.SIGINT)

    plan = derived_plan(checkpoints, "resumed", prune={"source": TEACHER, "sparsity": 0.5}, training={"epochs": 2})
    with pytest.raises(TrainingInterrupted):
        train(plan, StopAtBatch5())
    before = [k == 0 for k in kernels(plan.run, "last")]
    assert 0 < before[0].mean() < 0.5  # stopped during the ramp
    resumed = plan_run(None, CPU, checkpoint_dir=checkpoints, run_name="resumed", resume=True)
    train(resumed)
    after = [k == 0 for k in kernels(plan.run, "last")]
    for zero_before, zero_after in zip(before, after, strict=True):
        assert np.all(zero_after[zero_before])  # what was masked stayed masked
        assert zero_after.mean() == pytest.approx(0.5, abs=1 / zero_after.size)


def test_a_pruned_run_given_more_epochs_never_unmasks_a_weight(checkpoints: Path) -> None:
    """More --epochs move the schedule back (3 of 3 epochs is 3 of 13); the sparsity goes on from the weights'."""
    prune = {"source": TEACHER, "sparsity": 0.5}
    plan = derived_plan(checkpoints, "extended", prune=prune, training={"epochs": 2})
    train(plan)
    before = [k == 0 for k in kernels(plan.run, "last")]
    best_before = plan.run.best_weights_path.read_bytes()
    train(
        plan_run(
            None, CPU, checkpoint_dir=checkpoints, run_name="extended", resume=True, training=TrainSettings(epochs=5)
        )
    )
    for zero_before, zero_after in zip(before, [k == 0 for k in kernels(plan.run, "last")], strict=True):
        assert zero_before.mean() == pytest.approx(0.5, abs=1 / zero_before.size)
        assert np.array_equal(zero_after, zero_before)  # not one pruned weight trained again
    assert plan.run.best_weights_path.read_bytes() != best_before  # the extra epochs may still be the best


def test_the_schedule_starts_from_the_sparsity_the_weights_have() -> None:
    import keras

    kernel = keras.Variable(np.array([[0.0, 0.0, 3.0, -4.0], [5.0, 0.0, 7.0, 8.0]], np.float32))
    mask = keras.Variable(np.ones((2, 4), np.float32))
    schedule = PruneSchedule([(kernel, mask)], target=0.5, ramp=0.5, progress=lambda epoch, batch: 0.0)
    schedule.on_train_begin()
    assert (schedule.reached, schedule.at_target) == (3 / 8, False)
    schedule.on_train_batch_begin(0)  # the schedule says 0 at the start: the weights' 3 zeros stay masked
    assert mask.numpy().tolist() == [[0, 0, 1, 1], [1, 0, 1, 1]]
    kernel.assign(np.array([[0.0, 0.0, 3.0, -4.0], [0.0, 0.0, 7.0, 8.0]], np.float32))
    schedule.on_train_begin()  # 4 of 8 zeros: at the target, though no batch has set a mask (a validation only)
    assert (schedule.reached, schedule.at_target) == (0.5, True)


def test_prune_and_distill_commands(checkpoints: Path) -> None:
    where = ["--checkpoint-dir", str(checkpoints), "--json"]
    result = invoke("prune", "--source", TEACHER, "--sparsity", "0.6", "--epochs", "1", *where)
    assert result.exit_code == 0, result.output
    done = json.loads(result.output.strip().splitlines()[-1])
    assert done["run"] == f"{TEACHER}-pruned60"
    result = invoke(
        "distill", "--teacher", TEACHER, "--units", "8", "--epochs", "1", "--checkpoint-dir", str(checkpoints), "--json"
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.output.strip().splitlines()[-1])["run"] == f"{TEACHER}-8u"
    listed = invoke("runs", "--checkpoint-dir", str(checkpoints))  # each made run says what it was made from
    rows = {line.split()[0]: line for line in listed.stdout.splitlines()}  # piped: a line per run
    assert rows[f"{TEACHER}-pruned60"].endswith(f"  pruned to 60% from {TEACHER}")
    assert rows[f"{TEACHER}-8u"].endswith(f"  distilled from {TEACHER}")


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["prune", "--source", "nope"], ["nope"]),
        (["prune", "--source", TEACHER, "--sparsity", "1.5"], ["--sparsity", "between 0 and 1"]),
        (["prune", "--source", TEACHER, "--lr", "0"], ["--lr must be a positive number"]),
        (["prune", "--source", TEACHER, "--ramp", "1"], ["--ramp must be in (0, 0.99]"]),
        (["prune", "--source", TEACHER, "--time-budget", "0"], ["--time-budget must be"]),
        (["distill", "--teacher", TEACHER, "--time-budget", "soon"], ["--time-budget must be a duration"]),
        (["distill", "--teacher", TEACHER, "--alpha", "2"], ["--alpha", "between 0 and 1"]),
        (["distill", "--teacher", TEACHER, "--temperature", "0"], ["--temperature"]),
    ],
)
def test_bad_input_gets_one_line(checkpoints: Path, args: list[str], fragments: list[str]) -> None:
    assert_one_line_error(invoke(*args, "--checkpoint-dir", str(checkpoints)), *fragments)


def test_prune_reads_source_and_makes_run_as_distill_reads_teacher(checkpoints: Path) -> None:
    """--source names the run read, --run the run made: naming the source itself as the new run is refused as an
    existing run, before any training."""
    where = ["--checkpoint-dir", str(checkpoints)]
    assert_one_line_error(invoke("prune", "--source", TEACHER, "--run", TEACHER, *where), f"run {TEACHER!r} already")
    missing = invoke("prune", "--run", TEACHER, *where)  # the old form without --name: --run is now the new run
    assert missing.exit_code == 2
    assert_one_line_error(
        missing, f"missing option '--source', the run to prune: write textgen prune --source {TEACHER}"
    )


def test_prune_run_name_keeps_working_for_a_release_with_one_deprecation_line(checkpoints: Path) -> None:
    result = invoke("prune", "--run", "nope", "--name", TEACHER, "--checkpoint-dir", str(checkpoints))
    deprecation, error = result.stderr.splitlines()
    assert deprecation == f"warning: --name is deprecated: write textgen prune --source nope --run {TEACHER}"
    assert error.startswith("error: no run 'nope'")  # --run named the run to prune, as it did
    assert result.exit_code == 1


def test_a_run_without_best_weights_is_refused_before_a_run_is_made_from_it(trained_run, tmp_path: Path) -> None:
    checkpoints = tmp_path / "checkpoints"
    young = trained_run.copy_to(checkpoints, "young")
    young.best_weights_path.unlink()
    for command in (["prune", "--source", "young"], ["distill", "--teacher", "young"]):
        assert_one_line_error(invoke(*command, "--checkpoint-dir", str(checkpoints)), "best.weights.h5 is missing")
    assert sorted(p.name for p in checkpoints.iterdir() if not p.name.startswith(".")) == ["young"]
