"""Dynamic evaluation: the update rule against a NumPy reference, the pull back to the trained weights, η = 0 as the
static score, the run's files (weights untouched, MS cached by checksum, dynamic.json), and the commands."""

from __future__ import annotations

import hashlib
import json
import tempfile
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from helpers import assert_one_line_error, invoke, make_text, run_python, write_corpus
from typer.testing import CliRunner

from textgen import dynamic
from textgen.cli import app
from textgen.config import DynamicConfig, ModelConfig, Split, Weights
from textgen.device import CPU
from textgen.dynamic import DynamicEvaluator, open_evaluator, read_settings, save_settings
from textgen.errors import CheckpointError, ConfigError
from textgen.evaluate import evaluate_run, split_ids
from textgen.layout import StreamLayout
from textgen.model import build_model
from textgen.scoring import compile_eval_step, model_logits, score

TINY = ModelConfig(vocab_size=11, embedding_dim=4, units=8, dropout=0.0)


def random_model(seed: int = 0):
    """A stateful batch-1 model of TINY with seeded random weights (big enough that gradients are not tiny)."""
    rng = np.random.default_rng(seed)
    model = build_model(TINY, 1)
    model.set_weights([rng.normal(0, 0.5, w.shape).astype(np.float32) for w in model.get_weights()])
    return model


def test_the_update_matches_a_numpy_reference_through_keras_lstm() -> None:
    """Two segments: θ₁ = θ₀ − η·g₀/(√MS + ε), θ₂ = θ₁ − η·g₁/(√MS + ε) + λ·(θ₀ − θ₁), each g that of the segment's
    summed cross-entropy with the state carried on, here from Keras' own LSTM (not textgen's fast one)."""
    rng = np.random.default_rng(1)
    model = random_model()
    theta0 = [v.numpy().astype(np.float64) for v in model.trainable_variables]
    mean_squares = [rng.uniform(0.5, 2.0, t.shape).astype(np.float32) for t in theta0]
    evaluator = DynamicEvaluator(model, CPU)
    evaluator.set_mean_squares(mean_squares)
    settings = DynamicConfig(eta=0.05, decay=0.3, segment_len=7)
    ids = rng.integers(1, TINY.vocab_size, 2 * 7 + 1).astype(np.int32)
    nats, chars = evaluator.adapt(ids, settings)

    roots = [np.sqrt(ms.astype(np.float64)) for ms in mean_squares]
    epsilon = dynamic.EPSILON_FRACTION * np.concatenate([r.ravel() for r in roots]).mean()
    reference = build_model(TINY, 1)  # Keras' LSTM: stateful, no fast path
    theta, total = [t.copy() for t in theta0], 0.0
    for first in (0, 7):
        for variable, value in zip(reference.trainable_variables, theta, strict=True):
            variable.assign(value.astype(np.float32))
        x, y = ids[None, first : first + 7], ids[None, first + 1 : first + 8]
        with tf.GradientTape() as tape:
            logits = reference(x)
            loss = tf.reduce_sum(tf.keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True))
        grads = [tf.convert_to_tensor(g).numpy() for g in tape.gradient(loss, reference.trainable_variables)]
        total += float(loss)
        theta = [
            t - settings.eta * g / (r + epsilon) + settings.decay * (t0 - t)
            for t, g, r, t0 in zip(theta, grads, roots, theta0, strict=True)
        ]
    assert chars == 14
    assert nats == pytest.approx(total, rel=1e-5)
    for got, want in zip(evaluator.variables, theta, strict=True):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-6)
    assert any(not np.allclose(v.numpy(), t0) for v, t0 in zip(evaluator.variables, theta0, strict=True))


def test_the_decay_pulls_the_weights_back_toward_the_trained_ones() -> None:
    model = random_model()
    evaluator = DynamicEvaluator(model, CPU)
    evaluator.set_mean_squares([np.ones(v.shape, np.float32) for v in evaluator.variables])
    theta0 = [v.numpy() for v in evaluator.variables]
    offsets = [np.full(t.shape, 0.1, np.float32) for t in theta0]
    for variable, t0, offset in zip(evaluator.variables, theta0, offsets, strict=True):
        variable.assign(t0 + offset)
    x = tf.constant(np.arange(1, 8, dtype=np.int32)[None])
    evaluator._step(x, x, tf.constant(0.0), tf.constant(0.25))  # η = 0: only the pull, a quarter of the way
    for variable, t0, offset in zip(evaluator.variables, theta0, offsets, strict=True):
        np.testing.assert_allclose(variable.numpy(), t0 + 0.75 * offset, rtol=1e-6, atol=1e-7)
    evaluator.restore()
    for variable, t0 in zip(evaluator.variables, theta0, strict=True):
        np.testing.assert_array_equal(variable.numpy(), t0)


@pytest.fixture
def few_segments(monkeypatch: pytest.MonkeyPatch) -> None:
    """MS from 20 training segments, not 300: the tests' runs are tiny, and the machine small."""
    monkeypatch.setattr(dynamic, "MS_SEGMENTS", 20)


def test_eta_zero_is_the_static_score(trained_run, tmp_path: Path, few_segments: None) -> None:
    run = trained_run.copy_to(tmp_path)
    evaluator = open_evaluator(run, Weights.best, 50)
    with tempfile.TemporaryDirectory() as scratch:
        ids = split_ids(run, Split.test, Path(scratch))
        layout = StreamLayout.covering(len(ids), 1, 50)
        scored: list[tuple[str, int, int]] = []
        static, chars = score(
            compile_eval_step(evaluator.model, CPU), evaluator.model, ids, layout, track=lambda *c: scored.append(c)
        )
        ids = np.asarray(ids, np.int32)
    adapting: list[tuple[str, int, int]] = []
    still = evaluator.adapt(ids, DynamicConfig(eta=0.0, decay=1e-3, segment_len=50), lambda *c: adapting.append(c))
    assert still[1] == chars
    # Both are heard segment by segment, to the last character.
    assert len(scored) == len(adapting) == -(-chars // 50) and scored[-1] == ("scoring", chars, chars)
    assert adapting[-1] == ("adapting", chars, chars) and [d for _, d, _ in adapting] == [d for _, d, _ in scored]
    assert still[0] == pytest.approx(static, rel=1e-6)
    adapted = evaluator.adapt(ids, DynamicConfig(eta=3e-4, decay=1e-4, segment_len=50))
    assert adapted[0] != pytest.approx(static, rel=1e-6)
    # One stream carries its state throughout: how it is cut into batches does not change the score.
    one_stream = evaluate_run(run, Split.test, streams=1)
    assert static / chars == pytest.approx(one_stream.nats_per_char, rel=1e-5)


def test_the_mean_squares_are_cached_and_measured_again_for_other_weights(
    trained_run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, few_segments: None
) -> None:
    run = trained_run.copy_to(tmp_path)
    measured: list[int] = []
    real = DynamicEvaluator.mean_squared_gradients

    def counting(self, *args, **kwargs):
        measured.append(1)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(DynamicEvaluator, "mean_squared_gradients", counting)
    first = open_evaluator(run, Weights.best, 50)
    assert len(measured) == 1 and (run.path / dynamic.MS_FILE).is_file()
    open_evaluator(run, Weights.best, 50)
    assert len(measured) == 1  # read from dynamic-ms.npz
    open_evaluator(run, Weights.best, 20)
    assert len(measured) == 2  # other segments: measured again
    model = first.model
    model.set_weights([w * 1.01 for w in model.get_weights()])
    run.save_best(model, 1.0)  # new weights: a new checksum
    open_evaluator(run, Weights.best, 20)
    assert len(measured) == 3
    (run.path / dynamic.MS_FILE).write_bytes(b"damaged")
    open_evaluator(run, Weights.best, 20)
    assert len(measured) == 4


def test_settings_round_trip_and_bad_ones_are_refused(trained_run, tmp_path: Path) -> None:
    run = trained_run.copy_to(tmp_path)
    assert read_settings(run) is None
    settings = DynamicConfig(eta=3e-5, decay=1e-2, segment_len=100)
    save_settings(run, settings)
    assert read_settings(run) == settings
    for bad in ({"eta": -1.0}, {"decay": 1.0}, {"segment_len": 0}, {"eta": float("nan")}):
        with pytest.raises(ConfigError):
            DynamicConfig(**bad)
    for damaged in ('{"eta": "fast"}', '{"eta": 1e-4, "speed": 2}', '{"segment_len": 0}', "[1]", "not json"):
        (run.path / dynamic.SETTINGS_FILE).write_text(damaged, encoding="utf-8")
        with pytest.raises(CheckpointError, match=r"dynamic\.json is corrupt .*--retune"):
            read_settings(run)


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_evaluate_dynamic_json_prints_both_figures_and_tunes_once(
    trained_run, tmp_path: Path, few_segments: None
) -> None:
    run = trained_run.copy_to(tmp_path / "checkpoints")
    before = digest(run.best_weights_path)
    args = ["evaluate", "--run", run.name, "--checkpoint-dir", str(run.path.parent), "--dynamic", "--json"]
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout.strip().splitlines()[-1])
    assert record["static_nats_per_char"] > 0 and record["dynamic_nats_per_char"] > 0
    assert record["tuned_seconds"] is not None and record["static_seconds"] >= 0 and record["dynamic_seconds"] >= 0
    saved = read_settings(run)
    assert saved is not None and (saved.eta, saved.decay) == (record["eta"], record["decay"])
    again = json.loads(invoke(*args).stdout.strip().splitlines()[-1])
    assert again["tuned_seconds"] is None and again["static_nats_per_char"] == record["static_nats_per_char"]
    text = invoke(*args[:-1])
    assert text.exit_code == 0 and "static" in text.stdout and "dynamic" in text.stdout
    assert digest(run.best_weights_path) == before  # six settings tried while tuning, three texts scored: never saved


def test_retune_tunes_again_at_the_saved_segment_length_and_mends_a_damaged_file(
    trained_run, tmp_path: Path, few_segments: None
) -> None:
    run = trained_run.copy_to(tmp_path)
    save_settings(run, DynamicConfig(eta=0.0, decay=0.0, segment_len=20))  # a length set by hand
    kept = dynamic.evaluate_dynamic(run)
    assert (kept.eta, kept.segment_len, kept.tuned_seconds) == (0.0, 20, None)
    retuned = dynamic.evaluate_dynamic(run, retune=True)
    assert retuned.segment_len == 20 and retuned.tuned_seconds is not None and retuned.eta in dynamic.TUNE_ETAS
    assert read_settings(run) == DynamicConfig(retuned.eta, retuned.decay, 20)
    (run.path / dynamic.SETTINGS_FILE).write_text("not json", encoding="utf-8")
    with pytest.raises(CheckpointError, match="--retune"):
        dynamic.evaluate_dynamic(run)
    mended = dynamic.evaluate_dynamic(run, retune=True)  # from the defaults
    assert mended.segment_len == DynamicConfig.segment_len and read_settings(run) is not None


@pytest.mark.parametrize(
    ("flags", "fragment"),
    [
        (["--dynamic", "--streams", "4"], "--streams"),
        (["--retune"], "--dynamic"),
        (["--dynamic", "--model", "exports/x"], "--model"),
    ],
)
def test_bad_dynamic_flags_are_one_line(trained_run, flags: list[str], fragment: str) -> None:
    result = invoke("evaluate", "--checkpoint-dir", str(trained_run.checkpoint_dir), *flags)
    assert_one_line_error(result, fragment)


def sample_args(trained_run, *flags: str) -> list[str]:
    return ["sample", "--checkpoint-dir", str(trained_run.checkpoint_dir), "--length", "20", "--seed", "3", *flags]


def test_sample_reads_the_prime_file_from_stdin(trained_run) -> None:
    document = "the quick brown fox jumps over the lazy dog\n" * 20
    runner = CliRunner()
    plain = runner.invoke(app, sample_args(trained_run, "--prime-file", "-", "--json"), input=document)
    assert plain.exit_code == 0, plain.output
    record = json.loads(plain.stdout.strip().splitlines()[-1])
    assert record["prime_file"] == "-" and record["prime_chars"] == len(document) and len(record["text"]) == 20
    same = runner.invoke(app, sample_args(trained_run, "--prime", document, "--json"))
    assert json.loads(same.stdout.strip().splitlines()[-1])["text"] == record["text"]  # the file's text is the prime


def test_an_adapted_sampler_goes_on_from_the_states_its_adaptation_carried(
    trained_run, tmp_path: Path, few_segments: None
) -> None:
    """What ``sample --adapt`` continues from is what benchmarks/dynamic_eval.py measures: the document's whole
    segments read while adapting, the states carried on, then the rest read by the adapted weights, frozen."""
    from textgen.sampling import Generator

    run = trained_run.copy_to(tmp_path)
    settings = DynamicConfig()
    document = make_text(300, seed=5)[:1234]
    sampler = dynamic.adapted_generator(run, Weights.best, document)
    ids = run.load_vocab().encode(document)
    read = (len(ids) - 1) // settings.segment_len * settings.segment_len
    assert 0 < len(ids) - read <= settings.segment_len
    evaluator = open_evaluator(run, Weights.best, settings.segment_len)
    evaluator.segment_losses(ids[: read + 1], settings)
    expected = model_logits(evaluator.model, evaluator.profile, tf.constant(ids[None, read:]), False)[0, -1]
    assert sampler.start is not None and sampler.start.logits is not None
    np.testing.assert_allclose(sampler.start.logits[0], expected.numpy(), atol=1e-4)
    plain = Generator.from_run(run, Weights.best)
    unadapted = plain.feed(plain.encode_prompts([document])).logits[0]
    assert np.abs(unadapted - sampler.start.logits[0]).max() > 1e-3  # the weights did move
    # Characters the vocabulary lacks are left out, as from any prompt: they move neither the weights nor the states.
    unknown = dynamic.adapted_generator(run, Weights.best, document[:600] + "\u2603" * 7 + document[600:])
    assert unknown.start is not None and unknown.start.logits is not None
    np.testing.assert_allclose(unknown.start.logits, sampler.start.logits, atol=1e-6)
    # A document no longer than a segment is read as any prompt is, by the run's own weights; an empty one is none.
    for short in (document[:30], ""):
        started = dynamic.adapted_generator(run, Weights.best, short).start
        assert started is not None and started.logits is not None
        np.testing.assert_allclose(started.logits, plain.feed(plain.encode_prompts([short])).logits, atol=1e-5)


@pytest.mark.slow  # ~10-15 s on 2 busy cores: gradient statistics measured, a step compiled, a sampler built
def test_sample_adapts_to_the_prime_file(trained_run, few_segments: None) -> None:
    document = "the quick brown fox jumps over the lazy dog\n" * 20
    args = sample_args(trained_run, "--prime-file", "-", "--adapt", "--json")
    adapted = CliRunner().invoke(app, args, input=document)
    assert adapted.exit_code == 0, adapted.output
    record = json.loads(adapted.stdout.strip().splitlines()[-1])
    assert len(record["text"]) == 20 and record["prime_chars"] == len(document)
    assert not (trained_run.run.path / dynamic.SETTINGS_FILE).exists()  # the defaults, nothing written


@pytest.mark.parametrize(
    ("flags", "fragment"),
    [
        (["--prime-file", "no-such-prime.txt"], "no-such-prime.txt"),
        (["--adapt"], "--prime-file"),
        (["--prime-file", "-", "--prime", "x"], "--prime"),
    ],
)
def test_bad_prime_files_are_one_line(trained_run, flags: list[str], fragment: str) -> None:
    assert_one_line_error(invoke(*sample_args(trained_run, *flags)), fragment)


def test_an_undecodable_or_binary_prime_is_one_line(trained_run, tmp_path: Path) -> None:
    binary = tmp_path / "binary.txt"
    binary.write_bytes(b"abc\x00def")
    assert_one_line_error(invoke(*sample_args(trained_run, "--prime-file", str(binary))), "binary")
    result = CliRunner().invoke(app, sample_args(trained_run, "--prime-file", "-"), input=b"abc\x00def")
    assert_one_line_error(result, "standard input", "binary")
    noise = bytes(range(1, 32)) * 40  # control bytes, no NUL
    result = CliRunner().invoke(app, sample_args(trained_run, "--prime-file", "-"), input=noise)
    assert_one_line_error(result, "standard input looks binary", "control characters")
    empty = CliRunner().invoke(app, sample_args(trained_run, "--prime-file", "-"), input=b" \n")
    assert_one_line_error(empty, "standard input is empty")


def test_repl_reads_the_prime_file_as_its_first_prompt(trained_run, tmp_path: Path) -> None:
    prime = tmp_path / "prime.txt"
    prime.write_text("the cat sat on the mat\n", encoding="utf-8")
    args = ["repl", "--checkpoint-dir", str(trained_run.checkpoint_dir), "--length", "15", "--seed", "1"]
    result = CliRunner().invoke(app, [*args, "--prime-file", str(prime)], input=":quit\n")
    assert result.exit_code == 0, result.output
    missing = invoke(*args, "--prime-file", str(tmp_path / "gone.txt"))
    assert_one_line_error(missing, "gone.txt")


@pytest.mark.slow  # a subprocess that imports TensorFlow, tunes and scores: ~30 s
def test_the_benchmark_prints_the_test_split_and_the_documents_table(trained_run, tmp_path: Path) -> None:
    run = trained_run.copy_to(tmp_path / "checkpoints")
    books = tmp_path / "books"
    write_corpus(books / "other.txt", 2000, seed=5)
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "dynamic_eval.py"
    args = [str(script), "--run-dir", str(run.path), "--documents", "1", "--corpora", str(books)]
    result = run_python([*args, "--prompt-chars", "1000", "--score-chars", "200", "--skip", "0"])
    assert result.returncode == 0, result.stderr
    assert "static" in result.stdout and "ratio" in result.stdout
    assert "other.txt" in result.stdout and "mean" in result.stdout


@pytest.mark.slow  # a subprocess that imports TensorFlow and times a few segments: ~20 s
def test_the_step_profile_times_the_chain_and_both_steps(trained_run, tmp_path: Path) -> None:
    run = trained_run.copy_to(tmp_path / "checkpoints")
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "profile_dynamic_step.py"
    result = run_python([str(script), "--run-dir", str(run.path), "--segments", "5", "--compile-whole"])
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "steps compiled whole; 5 segments of 50" in lines[0]
    for line, what in zip(lines[1:4], ("matvec chain", "static step", "dynamic step"), strict=True):
        assert line.split()[:2] == what.split() and float(line.split()[2]) > 0
    assert "the whole test split dynamically" in lines[4]
