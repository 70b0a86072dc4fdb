"""Sampling: strategies on fake logits, the generator against the Keras model, and ``textgen sample``."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from helpers import assert_one_line_error, invoke, run_textgen, subprocess_env, train_tiny_run

from textgen.checkpoint import Run
from textgen.genconfig import SampleConfig
from textgen.generation import READING_PROMPT
from textgen.model import build_model
from textgen.npsampling import choose_next as np_choose_next
from textgen.npsampling import row_uniforms, uniforms
from textgen.sampling import Generator, choose_next, strategy

GREEDY = SampleConfig(length=40, temperature=0.0, seed=0)


# --- fixtures: a copy of the session's tiny run, and a 2-layer run ---------------------------


@pytest.fixture(scope="module")
def run1(trained_run, tmp_path_factory: pytest.TempPathFactory) -> Run:
    """A private copy of the session's 1-layer run (other tests may resume the original)."""
    return trained_run.copy_to(tmp_path_factory.mktemp("sampling") / "checkpoints", "tiny")


@pytest.fixture(scope="module")
def run2(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """A tiny 2-layer run (a few seconds)."""
    model = {"units": 16, "layers": 2, "embedding_dim": 8}
    return train_tiny_run(
        tmp_path_factory.mktemp("two-layers"), "two", model, {"epochs": 3, "lr": 0.02}
    )  # varied greedy text


@pytest.fixture(scope="module")
def run_ln(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """A tiny 2-layer layer-normalized run (a few seconds)."""
    model = {"units": 16, "layers": 2, "embedding_dim": 8, "layer_norm": True}
    return train_tiny_run(tmp_path_factory.mktemp("layer-norm"), "ln", model, {"epochs": 3, "lr": 0.02})


@pytest.fixture(scope="module")
def gen1(run1: Run) -> Generator:
    return Generator.from_run(run1)


@pytest.fixture(scope="module")
def checkpoint_dir(run1: Run) -> Path:
    """A checkpoint directory holding only the tiny run."""
    return run1.path.parent


def keras_model(run: Run):
    """The training model, stateless, batch 1, with the run's best weights."""
    model = build_model(run.load_config().model, batch_size=1, stateful=False)
    run.load_weights(model, "best")
    return model


# --- strategies: pure functions of fake logits ------------------------------------------------


def per_row(logits: np.ndarray, temperature, top_k, top_p) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Settings for every row of ``logits``: scalars broadcast, as ``RowSettings.of`` does."""
    batch = len(logits)
    return (
        np.broadcast_to(np.float32(temperature), batch).astype(np.float32),
        np.broadcast_to(np.int32(top_k), batch).astype(np.int32),
        np.broadcast_to(np.float32(top_p), batch).astype(np.float32),
    )


def tf_choose_next(logits: np.ndarray, temperature, top_k, top_p, u: np.ndarray) -> np.ndarray:
    t, k, p = per_row(logits, temperature, top_k, top_p)
    rows = strategy(tf.constant(t), tf.constant(k), tf.constant(p))
    return choose_next(tf.constant(logits, tf.float32), rows, tf.constant(u)).numpy()


def numpy_choose_next(logits: np.ndarray, temperature, top_k, top_p, u: np.ndarray) -> np.ndarray:
    return np_choose_next(logits, *per_row(logits, temperature, top_k, top_p), u)


# Every strategy test runs on both implementations: the compiled sampler's and LiteRT's NumPy twin.
@pytest.fixture(params=["tensorflow", "numpy"])
def choose(request: pytest.FixtureRequest) -> Callable[..., np.ndarray]:
    return tf_choose_next if request.param == "tensorflow" else numpy_choose_next


def draws(choose, logits: list[float], n: int, temperature=1.0, top_k=0, top_p=1.0, seed=0) -> np.ndarray:
    """``n`` independent draws (one per row) from one row of logits."""
    rows = np.tile(np.array([logits], np.float32), [n, 1])
    return choose(rows, temperature, top_k, top_p, uniforms(seed, 0, 1, n)[0])


def test_tensorflow_and_numpy_draw_the_same_ids() -> None:
    rng = np.random.default_rng(5)
    for case, (temperature, top_k, top_p) in enumerate([(1.0, 0, 1.0), (0.7, 5, 1.0), (1.3, 0, 0.9), (0.8, 8, 0.6)]):
        logits = rng.normal(scale=3.0, size=(512, 40)).astype(np.float32)
        u = uniforms(case, 100, 1, 512)[0]
        expected = tf_choose_next(logits, temperature, top_k, top_p, u)
        np.testing.assert_array_equal(numpy_choose_next(logits, temperature, top_k, top_p, u), expected)
        assert len(set(expected.tolist())) > 10  # real draws, not one id


def test_each_row_draws_with_its_own_settings_as_if_alone(choose) -> None:
    """A batch whose rows mix greedy, temperature, top-k and top-p draws for each row what a batch of
    rows all set alike draws for it (a server's rows each have their request's settings)."""
    rng = np.random.default_rng(11)
    logits = rng.normal(scale=3.0, size=(200, 30)).astype(np.float32)
    u = uniforms(9, 0, 1, 200)[0]
    kinds = [(0.0, 0, 1.0), (1.0, 0, 1.0), (0.7, 5, 1.0), (1.3, 0, 0.9), (0.8, 8, 0.6)]
    which = np.arange(200) % len(kinds)
    temperature, top_k, top_p = (np.array([kinds[w][i] for w in which]) for i in range(3))
    mixed = choose(logits, temperature, top_k, top_p, u)
    for n, (t, k, p) in enumerate(kinds):
        np.testing.assert_array_equal(mixed[which == n], choose(logits, t, k, p, u)[which == n])


def test_row_uniforms_give_each_row_the_stream_it_has_alone() -> None:
    seeds, positions, rows = np.array([3, 3, 8]), np.array([0, 17, 5]), np.array([0, 2, 1])
    mixed = row_uniforms(seeds, positions, rows, 40)
    for b in range(3):
        alone = uniforms(int(seeds[b]), int(positions[b]), 40, int(rows[b]) + 1)[:, -1]
        np.testing.assert_array_equal(mixed[:, b], alone)


def test_uniforms_depend_only_on_seed_position_and_row() -> None:
    whole = uniforms(3, 0, 50, 8)
    assert whole.dtype == np.float32 and whole.min() >= 0.0 and whole.max() < 1.0
    np.testing.assert_array_equal(uniforms(3, 20, 30, 8), whole[20:])  # a later call continues the stream
    np.testing.assert_array_equal(uniforms(3, 0, 50, 2), whole[:, :2])  # row b is row b in any batch
    assert not np.array_equal(uniforms(4, 0, 50, 8), whole)
    assert abs(float(uniforms(0, 0, 1000, 100).mean()) - 0.5) < 0.01
    # Seed 0's first draw was exactly 0 (the hash of (0, 0, 0)): the vocabulary's first character, whenever the model
    # gave it any probability. No seed's first draws sit at the extremes.
    firsts = [uniforms(seed, 0, 1, 1)[0, 0] for seed in range(100)]
    assert min(firsts) > 1e-4 and max(firsts) < 1 - 1e-4


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


def test_temperature_zero_is_argmax_of_the_known_ids(choose) -> None:
    logits = np.random.default_rng(0).normal(size=(64, 12)).astype(np.float32)
    expected = 1 + np.argmax(logits[:, 1:], axis=-1)
    for top_k, top_p in [(0, 1.0), (3, 1.0), (0, 0.5), (2, 0.3)]:  # filters do not matter when greedy
        for seed in (0, 7):
            ids = choose(logits, 0.0, top_k, top_p, uniforms(seed, 1, 1, 64)[0])
            np.testing.assert_array_equal(ids, expected)


@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_top_k_never_emits_outside_the_k_best(choose, k: int) -> None:
    rng = np.random.default_rng(k)
    logits = rng.normal(scale=0.5, size=10)
    logits[0] = 10.0  # the unknown id is the likeliest, and must not take one of the k places
    best = set((1 + np.argsort(-logits[1:]))[:k].tolist())
    seen: set[int] = set()
    for seed in range(20):
        ids = draws(choose, logits.tolist(), 200, temperature=1.5, top_k=k, seed=seed)
        assert set(ids.tolist()) <= best, f"seed {seed}: emitted {set(ids.tolist()) - best} outside the top {k}"
        seen |= set(ids.tolist())
    assert seen == best, "every one of the k best should be drawn at some point"


PROBS = [0.5, 0.3, 0.15, 0.05]


@pytest.mark.parametrize(
    ("p", "kept"),
    [(0.4, {1}), (0.7, {1, 2}), (0.85, {1, 2, 3}), (0.9, {1, 2, 3}), (0.97, {1, 2, 3, 4}), (1.0, {1, 2, 3, 4}),
     (0.0, {1}), (-1.0, {1}),  # as a SavedModel caller may pass: the likeliest is always kept
     (0.99999999, {1, 2, 3, 4})],  # 1 in float32, where TensorFlow decides: off for NumPy too
)  # fmt: skip
def test_top_p_keeps_the_smallest_set_reaching_p(choose, p: float, kept: set[int]) -> None:
    logits = [5.0, *np.log(PROBS).tolist()]  # a large unknown logit, masked before the mass is counted
    seen: set[int] = set()
    for seed in range(10):
        ids = set(draws(choose, logits, 500, top_p=p, seed=seed).tolist())
        assert ids <= kept, f"top_p={p}: emitted {ids - kept}"
        seen |= ids
    assert seen == kept


def test_top_p_applies_to_the_tempered_distribution(choose) -> None:
    # At temperature 0.5 the probabilities become [0.685, 0.247, 0.062, 0.007]: 0.6 needs only the first id.
    logits = [-50.0, *np.log(PROBS).tolist()]
    assert set(draws(choose, logits, 2000, temperature=0.5, top_p=0.6).tolist()) == {1}
    assert set(draws(choose, logits, 2000, temperature=1.0, top_p=0.6).tolist()) == {1, 2}


def test_top_p_on_random_distributions(choose) -> None:
    rng = np.random.default_rng(3)
    for case in range(20):
        logits = rng.normal(scale=1.5, size=9)
        probs = softmax(logits[1:])
        order = np.argsort(-probs)
        cumulative = np.cumsum(probs[order])
        p = float(rng.uniform(0.2, 0.95))
        if np.min(np.abs(cumulative - p)) < 1e-3:
            continue  # too close to a boundary for float32
        nucleus = set((1 + order[: int(np.searchsorted(cumulative, p)) + 1]).tolist())
        ids = set(draws(choose, logits.tolist(), 3000, top_p=p, seed=case).tolist())
        assert ids <= nucleus, f"case {case}: p={p:.3f} emitted {ids - nucleus}"
        likely = {i for i in nucleus if probs[i - 1] / probs[np.array(list(nucleus)) - 1].sum() > 0.01}
        assert likely <= ids


@pytest.mark.parametrize("temperature", [0.0, 0.5, 1.0, 3.0])
def test_the_unknown_id_is_never_emitted(choose, temperature: float) -> None:
    logits = [8.0, 0.0, 0.5, -0.5, 0.2]
    for top_k, top_p in [(0, 1.0), (1, 1.0), (0, 0.1), (3, 0.9)]:
        ids = draws(choose, logits, 3000, temperature=temperature, top_k=top_k, top_p=top_p, seed=11)
        assert 0 not in ids
    assert set(draws(choose, logits, 10, temperature=0.0).tolist()) == {2}


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_frequencies_follow_the_softmax(choose, temperature: float) -> None:
    logits = np.array([1.0, 0.3, -0.4, 1.1, 0.0, -1.5, 0.6])
    expected = softmax(logits[1:] / temperature)
    ids = np.concatenate([draws(choose, logits.tolist(), 10_000, temperature=temperature, seed=s) for s in (1, 2)])
    freq = np.bincount(ids, minlength=len(logits))[1:] / len(ids)
    assert np.bincount(ids, minlength=len(logits))[0] == 0
    np.testing.assert_allclose(freq, expected, atol=0.015)


def test_a_seed_decides_the_draws(choose) -> None:
    logits = [0.0, 0.1, 0.2, 0.3, 0.4]
    np.testing.assert_array_equal(draws(choose, logits, 100, seed=5), draws(choose, logits, 100, seed=5))
    assert not np.array_equal(draws(choose, logits, 100, seed=5), draws(choose, logits, 100, seed=6))


# --- the generator against the Keras training model ------------------------------------------


def test_same_seed_gives_the_same_text(gen1: Generator, run1: Run) -> None:
    settings = SampleConfig(length=120, temperature=1.0, seed=42)
    first = gen1.generate(["the "], settings)
    assert len(first[0]) == 120
    assert gen1.generate(["the "], settings) == first
    assert Generator.from_run(run1).generate(["the "], settings) == first  # nothing hidden in the instance


def test_chunking_does_not_change_the_text(gen1: Generator) -> None:
    settings = SampleConfig(length=50, temperature=1.0, seed=9)
    pieces = list(gen1.stream(["the ", "a"], settings, chunk=7, first_chunk=3))
    assert [len(p.texts[0]) for p in pieces] == [3, 7, 7, 7, 7, 7, 7, 5]
    assert ["".join(p.texts[i] for p in pieces) for i in range(2)] == gen1.generate(["the ", "a"], settings)


def test_the_last_piece_carries_the_state_after_the_text(gen1: Generator) -> None:
    """Continuing from a piece's state is reading the whole text so far (greedy, so no draws differ)."""
    *_, last = gen1.stream(["the "], GREEDY, chunk=16)
    after = list(gen1.stream(["a "], GREEDY, state=last.state))
    first = gen1.generate(["the "], GREEDY)[0]
    assert "".join(p.texts[0] for p in after) == gen1.generate(["the " + first + "a "], GREEDY)[0]


def test_different_seeds_give_different_text(gen1: Generator) -> None:
    texts = {gen1.generate(["the "], SampleConfig(length=100, temperature=1.0, seed=s))[0] for s in range(4)}
    assert len(texts) == 4


def test_a_batch_gives_different_samples(gen1: Generator) -> None:
    texts = gen1.generate(["the "] * 6, SampleConfig(length=100, temperature=1.0, seed=1))
    assert len(texts) == 6
    assert all(len(t) == 100 for t in texts)
    assert len(set(texts)) == 6


@pytest.mark.parametrize("run_name", ["run1", "run2", "run_ln"])
def test_step_reproduces_the_keras_logits(run_name: str, request: pytest.FixtureRequest) -> None:
    run = request.getfixturevalue(run_name)
    vocab = run.load_vocab()
    ids = vocab.encode("the quick brown fox jumps over a lazy dog\nand")
    expected = keras_model(run)(ids[None, :]).numpy()[0]
    for input_table in (True, False):  # sampling's precomputed first projection, and an export's
        generator = Generator.from_run(run, input_table=input_table)
        states, got = generator.zero_states(1), []
        for i in ids:
            logits, states = generator.step(tf.constant([i], tf.int32), states)
            got.append(logits.numpy()[0])
        np.testing.assert_allclose(np.array(got), expected, atol=1e-4, rtol=0)


@pytest.mark.parametrize("run_name", ["run1", "run2", "run_ln"])
def test_greedy_generation_is_the_keras_argmax_loop(run_name: str, request: pytest.FixtureRequest) -> None:
    run = request.getfixturevalue(run_name)
    generator, model = Generator.from_run(run), keras_model(run)
    prompt = "the cat sat "
    ids = list(generator.vocab.encode(prompt))
    call = tf.function(lambda x: model(x, training=False))  # Keras' LSTM loop run eagerly is slow
    window = np.zeros([1, len(ids) + GREEDY.length], np.int32)  # one shape for every call: one trace
    for _ in range(GREEDY.length):
        window[0, : len(ids)] = ids  # the padding on the right cannot change earlier (causal) positions
        last = call(tf.constant(window)).numpy()[0, len(ids) - 1]
        ids.append(1 + int(np.argmax(last[1:])))  # id 0 (unknown) excluded
    expected = generator.vocab.decode(ids[len(prompt) :])
    assert generator.generate([prompt], GREEDY) == [expected]


def test_per_sequence_prompts_equal_each_prompt_alone(gen1: Generator) -> None:
    prompts = ["abc", "xy z", "the river "]
    together = gen1.generate(prompts, GREEDY)
    assert together == [gen1.generate([p], GREEDY)[0] for p in prompts]
    assert all(len(t) == GREEDY.length for t in together)


def test_reading_prompts_is_tracked_call_by_call_to_the_end(gen1: Generator) -> None:
    heard: list[tuple[str, int, int]] = []
    long_prompt = "the river " * 500  # 5,000 characters: three calls of at most steps_per_call(1) = 2048
    alone = gen1.generate([long_prompt], GREEDY)
    assert gen1.generate([long_prompt], GREEDY, lambda *call: heard.append(call)) == alone
    assert heard == [(READING_PROMPT, 2048, 5000), (READING_PROMPT, 4096, 5000), (READING_PROMPT, 5000, 5000)]
    heard.clear()
    gen1.generate(["abc", "xy z", long_prompt], GREEDY, lambda *call: heard.append(call))
    done = [d for _, d, _ in heard]
    assert done == sorted(done) and done[-1] == 5007 and {t for _, _, t in heard} == {5007}  # the rows together


def test_characters_outside_the_vocabulary_are_skipped(gen1: Generator) -> None:
    assert gen1.vocab.unknown_chars("thé Q") == ["Q", "é"]
    assert gen1.generate(["thé Q"], GREEDY) == gen1.generate(["th "], GREEDY)


@pytest.mark.parametrize("settings", [GREEDY, SampleConfig(length=40, temperature=1.0, seed=3)])
def test_a_prompt_of_only_unknown_characters_starts_like_an_empty_one(gen1: Generator, settings: SampleConfig) -> None:
    # Both start at the start state's logits (a paragraph's start), not after reading a third newline.
    assert gen1.start is not None and gen1.start.logits is not None
    assert gen1.generate(["ÉQ"], settings) == gen1.generate([""], settings) != gen1.generate(["\n"], settings)
    if settings.temperature == 0:  # greedy: the start's likeliest character comes first
        first = next(gen1.stream([""], settings, first_chunk=1)).texts
        assert first == [gen1.vocab.decode([int(np.argmax(gen1.start.logits[0, 1:])) + 1])]
    # A start without its logits (an export from before them): reading nothing would leave zero logits, a first
    # character chosen without the model, so an empty prompt reads a newline first.
    gen1.start, kept = dataclasses.replace(gen1.start, logits=None), gen1.start
    try:
        assert gen1.generate(["ÉQ"], settings) == gen1.generate([""], settings) == gen1.generate(["\n"], settings)
    finally:
        gen1.start = kept


# --- textgen sample: errors, warnings and output ----------------------------------------------


def test_unknown_prime_characters_are_named_on_stderr(checkpoint_dir: Path) -> None:
    result = invoke("sample", "--checkpoint-dir", str(checkpoint_dir), "--prime", "thé Q", "--length", "10")
    assert result.exit_code == 0, result.stderr
    assert "warning" in result.stderr
    assert "'é'" in result.stderr and "'Q'" in result.stderr
    assert result.stdout.startswith("thé Q")
    assert len(result.stdout) == len("thé Q") + 10 + 1


def test_no_unknown_character_warning_for_a_known_prime(checkpoint_dir: Path) -> None:
    result = invoke("sample", "--checkpoint-dir", str(checkpoint_dir), "--prime", "the", "--length", "10")
    assert result.exit_code == 0, result.stderr
    assert result.stderr == ""


@pytest.mark.parametrize("command", ["sample", "repl"])
def test_no_checkpoint_yet(tmp_path: Path, no_base_model: None, command: str) -> None:
    result = invoke(command, "--checkpoint-dir", str(tmp_path / "empty"))
    assert_one_line_error(result, "no trained run", "textgen train")


def test_unknown_run_name(checkpoint_dir: Path) -> None:
    result = invoke("sample", "--checkpoint-dir", str(checkpoint_dir), "--run", "nope")
    assert_one_line_error(result, "no run 'nope'", "tiny")


def _delete_best(run: Path) -> None:
    (run / "best.weights.h5").unlink()


def _garbage_config(run: Path) -> None:
    (run / "config.json").write_text("{not json")


def _config_of_another_version(run: Path) -> None:
    cfg = json.loads((run / "config.json").read_text())
    cfg["model"]["heads"] = 4
    (run / "config.json").write_text(json.dumps(cfg))


def _garbage_weights(run: Path) -> None:
    (run / "best.weights.h5").write_bytes(b"this is not an HDF5 file" * 10)


def _truncated_weights(run: Path) -> None:
    path = run / "best.weights.h5"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _missing_vocab(run: Path) -> None:
    (run / "vocab.json").unlink()


def _weights_of_another_model(run: Path) -> None:
    cfg = json.loads((run / "config.json").read_text())
    cfg["model"]["units"] += 8
    (run / "config.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize(
    ("damage", "fragments"),
    [
        (_delete_best, ["best.weights.h5 is missing", "train"]),
        (_garbage_config, ["config.json is corrupt", "train again"]),
        (_config_of_another_version, ["config.json is corrupt", "heads"]),
        (_garbage_weights, ["best.weights.h5 is corrupt", "use --last"]),
        (_truncated_weights, ["best.weights.h5 is corrupt", "use --last"]),
        (_missing_vocab, ["vocab.json is missing", "train again"]),
        (_weights_of_another_model, ["best.weights.h5 is corrupt or from another model"]),
    ],
    ids=lambda v: v.__name__.strip("_") if callable(v) else None,
)
@pytest.mark.parametrize("command", ["sample", "repl"])
def test_damaged_checkpoint(tmp_path: Path, run1: Run, damage, fragments: list[str], command: str) -> None:
    shutil.copytree(run1.path, tmp_path / "ck" / "tiny")
    damage(tmp_path / "ck" / "tiny")
    result = invoke(command, "--checkpoint-dir", str(tmp_path / "ck"))
    assert_one_line_error(result, *fragments)


@pytest.mark.parametrize(
    ("flags", "fragment"),
    [
        (["--temp", "-1"], "--temp must be 0 (greedy) or between 0.001 and 1000 (got -1.0)"),
        (["--top-p", "0"], "--top-p must be in (0, 1] (got 0.0)"),
        (["--top-p", "1.5"], "--top-p must be in (0, 1] (got 1.5)"),
        (["--length", "0"], "--length must be a positive integer up to 2,147,483,647 (got 0)"),
        (["--num", "0"], "--num must be a positive integer up to 2,147,483,647 (got 0)"),
        (["--top-k", "-1"], "--top-k must be 0 (off) or a positive integer (got -1)"),
        (["--seed", "-3"], "--seed must be an integer in [0, 2**31) (got -3)"),
    ],
)
def test_bad_sample_flags(checkpoint_dir: Path, flags: list[str], fragment: str) -> None:
    assert_one_line_error(invoke("sample", "--checkpoint-dir", str(checkpoint_dir), *flags), fragment)
    if "--num" not in flags:
        assert_one_line_error(invoke("repl", "--checkpoint-dir", str(checkpoint_dir), *flags), fragment)


def test_bad_flags_are_reported_before_the_missing_checkpoint(tmp_path: Path, no_base_model: None) -> None:
    assert_one_line_error(invoke("sample", "--checkpoint-dir", str(tmp_path), "--temp", "-1"), "--temp")


def test_json_lines_in_process(checkpoint_dir: Path) -> None:
    result = invoke("sample", "--checkpoint-dir", str(checkpoint_dir), "--json", "--num", "2", "--length", "30")
    assert result.exit_code == 0, result.stderr
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["index"] for r in records] == [0, 1]
    assert all(len(r["text"]) == 30 for r in records)
    assert records[0]["seed"] == records[1]["seed"] is not None  # a fresh seed, reported so it can be reused


@pytest.mark.parametrize("seed", [["--seed", "7"], []])
def test_each_of_several_samples_is_labelled_with_what_reproduces_it(checkpoint_dir: Path, seed: list[str]) -> None:
    """--num 3 --seed 7 draws sample 2 as row 2 of seed 7's batch, which --seed 7 alone does not give: each label
    names the flags that give it again (with no --seed, the one picked)."""
    common = ["sample", "--checkpoint-dir", str(checkpoint_dir), "--length", "40", "--prime", "the "]

    def samples(*flags: str) -> list[tuple[str, str]]:
        result = invoke(*common, *flags)
        assert result.exit_code == 0, result.stderr
        return re.findall(r"--- sample \d+ of (.*?) ---\n(.*?)(?=\n\n--- |\n$)", result.stdout, re.DOTALL)

    labelled = samples("--num", "3", *seed)
    assert len(labelled) == 3 and len({text for _, text in labelled}) == 3
    for i, (flags, text) in enumerate(labelled):
        assert samples(*flags.split())[i] == (flags, text)
    assert labelled[0][0].split()[:2] == ["--num", "3"] and labelled[0][0].split()[2] == "--seed"


def test_sample_as_a_subprocess_prints_plain_reproducible_text(checkpoint_dir: Path, gen1: Generator) -> None:
    args = ["sample", "--checkpoint-dir", str(checkpoint_dir), "--length", "50", "--seed", "3"]
    first, second = run_textgen(args, checkpoint_dir, timeout=120), run_textgen(args, checkpoint_dir, timeout=120)
    for proc in (first, second):
        assert proc.returncode == 0, proc.stderr
        assert "Traceback" not in proc.stderr
    assert first.stdout == second.stdout
    text = first.stdout
    assert "\x1b" not in text, "escape codes in piped output"
    assert text.endswith("\n") and len(text) == 51, repr(text)
    assert not gen1.vocab.unknown_chars(text[:-1])


def test_sample_json_as_a_subprocess(checkpoint_dir: Path) -> None:
    args = ["sample", "--checkpoint-dir", str(checkpoint_dir), "--length", "50", "--seed", "3", "--json", "--num", "3"]
    proc = run_textgen(args, checkpoint_dir, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 3, proc.stdout
    records = [json.loads(line) for line in lines]
    for i, record in enumerate(records):
        assert record["index"] == i
        assert record["seed"] == 3
        assert record["temperature"] == SampleConfig().temperature
        assert len(record["text"]) == 50
    assert len({r["text"] for r in records}) == 3


@pytest.mark.slow
def test_the_sampling_benchmark_runs(checkpoint_dir: Path) -> None:
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "sampling.py"
    args = ["--checkpoint-dir", str(checkpoint_dir), "--seconds", "0.2", "--length", "50", "--json"]
    proc = subprocess.run(
        [sys.executable, str(script), *args], env=subprocess_env(), capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["run"] == "tiny" and report["cores"] == os.cpu_count()
    assert set(report["results"]) == {"textgen_b1", "textgen_b64", "naive_b1", "naive_b64"}
    assert all(row["chars_per_s"] > 0 for row in report["results"].values())
    assert set(report["ratios"]) == set(report["targets"]) == set(report["met"])
