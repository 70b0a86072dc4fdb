"""Frequency and presence penalties and logit bias: the math in both twins, the compiled loop's counts, the CLI's
flags, the REPL's commands. (The server's are in tests/test_server.py and test_engine.py, the exports' in
test_export.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from helpers import assert_one_line_error, invoke
from test_repl import FakeGenerator, make_session

from textgen.checkpoint import Run
from textgen.errors import ConfigError
from textgen.genconfig import SampleConfig, bias_form, parse_logit_bias
from textgen.generation import bias_row
from textgen.npsampling import NEG_INF, penalize, uniforms
from textgen.npsampling import choose_next as np_choose_next
from textgen.sampling import Generator, Penalty, choose_next, strategy
from textgen.vocab import for_display


@pytest.fixture(scope="module")
def run1(trained_run, tmp_path_factory: pytest.TempPathFactory) -> Run:
    return trained_run.copy_to(tmp_path_factory.mktemp("penalties") / "checkpoints", "tiny")


@pytest.fixture(scope="module")
def gen1(run1: Run) -> Generator:
    return Generator.from_run(run1)


# --- the math, in both twins ---------------------------------------------------------------


def random_case(seed: int, batch: int = 256, vocab: int = 40):
    """Logits, counts, per-row settings (greedy rows among them) and penalties, with bans."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(scale=3.0, size=(batch, vocab)).astype(np.float32)
    counts = rng.integers(0, 4, size=(batch, vocab)).astype(np.float32)
    temperature = rng.choice([0.0, 0.7, 1.0, 1.5], batch).astype(np.float32)
    top_k = rng.choice([0, 5], batch).astype(np.int32)
    top_p = rng.choice([1.0, 0.8], batch).astype(np.float32)
    frequency = rng.choice([0.0, 0.3, -0.5, 2.0], batch).astype(np.float32)
    presence = rng.choice([0.0, 0.6, -1.0], batch).astype(np.float32)
    bias = np.where(rng.random((batch, vocab)) < 0.1, rng.choice([-100.0, -3.0, 5.0], (batch, vocab)), 0)
    return logits, counts, temperature, top_k, top_p, (frequency, presence, bias.astype(np.float32))


def tf_choose(logits, counts, temperature, top_k, top_p, penalties, u) -> np.ndarray:
    rows = strategy(tf.constant(temperature), tf.constant(top_k), tf.constant(top_p))
    penalty = Penalty(*(tf.constant(a) for a in (counts, *penalties)))
    return choose_next(tf.constant(logits), rows, tf.constant(u), penalty).numpy()


def test_tensorflow_and_numpy_penalize_and_draw_the_same_ids() -> None:
    for seed in range(4):
        logits, counts, temperature, top_k, top_p, penalties = random_case(seed)
        u = uniforms(seed, 3, 1, len(logits))[0]
        expected = tf_choose(logits, counts, temperature, top_k, top_p, penalties, u)
        got = np_choose_next(logits, temperature, top_k, top_p, u, (counts, *penalties))
        np.testing.assert_array_equal(got, expected)
        assert len(set(expected.tolist())) > 10


def test_the_penalties_are_openai_s() -> None:
    logits = np.array([[0.0, 2.0, 1.0, 0.5]], np.float32)
    counts = np.array([[0, 3, 1, 0]], np.float32)
    bias = np.array([[0, 0, 0.25, 0]], np.float32)
    got = penalize(logits, counts, np.float32([0.5]), np.float32([0.2]), bias)
    np.testing.assert_allclose(got, [[0.0, 2.0 - 1.5 - 0.2, 1.0 + 0.25 - 0.5 - 0.2, 0.5]], rtol=1e-6)


def test_a_penalty_changes_greedy_decoding() -> None:
    logits = np.array([[0.0, 3.0, 2.5]], np.float32)  # id 0 is the unknown id, never chosen
    greedy = np.zeros(1, np.float32), np.zeros(1, np.int32), np.ones(1, np.float32)
    u = np.zeros(1, np.float32)
    counts = np.array([[0, 2, 0]], np.float32)
    off = (counts, np.float32([0]), np.float32([0]), np.zeros_like(logits))
    on = (counts, np.float32([0.3]), np.float32([0]), np.zeros_like(logits))
    for choose in (np_choose_next, lambda lg, t, k, p, u, pen: tf_choose(lg, pen[0], t, k, p, pen[1:], u)):
        assert choose(logits, *greedy, u, off).tolist() == [1]
        assert choose(logits, *greedy, u, on).tolist() == [2]  # 3 - 2 x 0.3 < 2.5


@pytest.mark.parametrize("temperature", [0.0, 1.0, 1000.0])
def test_a_ban_is_probability_zero_at_any_temperature(temperature: float) -> None:
    """-100 bans outright (not a logit 100 lower, which temperature 1000 would make a 10% cut); the uniforms
    include 0, the draw's edge."""
    rows = 4096
    logits = np.tile(np.array([[0.0, 9.0, 1.0, 1.0]], np.float32), [rows, 1])
    bias = np.tile(np.array([[0, -100, 0, 0]], np.float32), [rows, 1])
    zeros = np.zeros(rows, np.float32)
    settings = np.full(rows, temperature, np.float32), np.zeros(rows, np.int32), np.ones(rows, np.float32)
    u = uniforms(1, 0, 1, rows)[0]
    u[0] = 0.0
    penalties = (np.zeros_like(logits), zeros, zeros, bias)
    ids = np_choose_next(logits, *settings, u, penalties)
    np.testing.assert_array_equal(tf_choose(logits, penalties[0], *settings, penalties[1:], u), ids)
    assert 1 not in ids.tolist() and 0 not in ids.tolist()
    assert penalize(logits, *penalties)[0, 1] == NEG_INF


def test_rows_without_penalties_draw_as_the_plain_strategy() -> None:
    logits, counts, temperature, top_k, top_p, _ = random_case(9)
    u = uniforms(9, 0, 1, len(logits))[0]
    zeros = np.zeros(len(logits), np.float32)
    penalties = (counts, zeros, zeros, np.zeros_like(logits))
    plain = np_choose_next(logits, temperature, top_k, top_p, u)
    np.testing.assert_array_equal(np_choose_next(logits, temperature, top_k, top_p, u, penalties), plain)


# --- the compiled loop carries each row's counts -------------------------------------------

PENALIZED = SampleConfig(
    length=120, num=3, temperature=0.0, seed=4, frequency_penalty=0.4, presence_penalty=0.3, logit_bias=(("e", -2.0),)
)


def reference(sampler, prompts: list[str], settings: SampleConfig) -> list[str]:
    """A character at a time: NumPy's strategy on the logits ``read`` gives, counting each row's draws."""
    state = sampler.feed(sampler.encode_prompts(prompts))
    logits, states = state.logits, state.states
    batch, vocab = len(prompts), sampler.vocab
    counts = np.zeros([batch, vocab.size], np.float32)
    full = lambda value, dtype: np.full(batch, value, dtype)  # noqa: E731
    bias = np.repeat(bias_row(settings.logit_bias, vocab)[None], batch, axis=0)
    penalty = (full(settings.frequency_penalty, np.float32), full(settings.presence_penalty, np.float32), bias)
    out = []
    for t in range(settings.length):
        u = uniforms(settings.seed or 0, t, 1, batch)[0]
        ids = np_choose_next(
            logits,
            full(settings.temperature, np.float32),
            full(settings.top_k, np.int32),
            full(settings.top_p, np.float32),
            u,
            (counts, *penalty),
        )
        counts[np.arange(batch), ids] += 1
        out.append(ids)
        logits, states = sampler.read(ids[:, None], states)
    return [vocab.decode(row) for row in np.stack(out, axis=1)]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_compiled_loop_is_the_character_at_a_time_reference(gen1: Generator, temperature: float) -> None:
    settings = SampleConfig(**{**PENALIZED.__dict__, "temperature": temperature})
    prompts = ["the ", "a", "the lazy "]
    got = gen1.generate(prompts, settings)
    assert got == reference(gen1, prompts, settings)
    plain = gen1.generate(prompts, SampleConfig(length=120, num=3, temperature=temperature, seed=4))
    assert got != plain  # the penalties did something


def test_counts_carry_across_chunks(gen1: Generator) -> None:
    whole = gen1.generate(["the "], SampleConfig(**{**PENALIZED.__dict__, "num": 1}))
    pieces = gen1.stream(["the "], SampleConfig(**{**PENALIZED.__dict__, "num": 1}), chunk=7, first_chunk=3)
    assert "".join(p.texts[0] for p in pieces) == whole[0]


def test_a_banned_character_never_appears(gen1: Generator) -> None:
    settings = SampleConfig(length=400, temperature=1.5, seed=2, logit_bias=(("e", -100.0), (" ", -100.0)))
    text = gen1.generate(["the "], settings)[0]
    assert "e" not in text and " " not in text and len(text) == 400


def test_bias_row_refuses_unknown_characters_and_banning_everything(gen1: Generator) -> None:
    with pytest.raises(ConfigError, match="the model has no 'Z'"):
        bias_row((("Z", 1.0),), gen1.vocab)
    everything = tuple((char, -100.0) for char in gen1.vocab.chars)
    with pytest.raises(ConfigError, match="bans every character"):
        bias_row(everything, gen1.vocab)
    assert bias_row(everything[1:], gen1.vocab).shape == (gen1.vocab.size,)  # one left is enough


# --- textgen sample's flags --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "char"),
    [
        ("e=1", "e"),
        ("space=1", " "),
        ("\\n=1", "\n"),
        ("\\t=1", "\t"),
        ("==1", "="),
        ("\\u00e9=1", "é"),
        ("\\\\=1", "\\"),
    ],
)
def test_logit_bias_forms(spec: str, char: str) -> None:
    assert parse_logit_bias([spec]) == ((char, 1.0),)
    assert parse_logit_bias([f"{bias_form(char)}=1"]) == ((char, 1.0),)  # the REPL shows it as it is typed


def test_sample_flags_give_the_sampler_s_text(run1: Run, gen1: Generator) -> None:
    flags = ["--temp", "0", "--length", "120", "--num", "3", "--seed", "4", "--frequency-penalty", "0.4"]
    flags += ["--presence-penalty", "0.3", "--logit-bias", "e=-2", "--prime", "the "]
    result = invoke("sample", "--checkpoint-dir", str(run1.path.parent), "--json", *flags)
    assert result.exit_code == 0, result.stderr
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["text"] for r in records] == gen1.generate(["the "] * 3, PENALIZED)
    assert records[0]["logit_bias"] == {"e": -2} and records[0]["frequency_penalty"] == 0.4  # as the API takes them


@pytest.mark.parametrize(
    ("flags", "fragment"),
    [
        (["--frequency-penalty", "3"], "--frequency-penalty must be a number from -2 to 2 (0 = off) (got 3.0)"),
        (["--presence-penalty", "nan"], "--presence-penalty must be a number from -2 to 2"),
        (["--logit-bias", "e"], "--logit-bias takes CHAR=BIAS"),
        (["--logit-bias", "ab=1"], "--logit-bias takes one character before '='"),
        (["--logit-bias", "e=lots"], "--logit-bias needs a number after '='"),
        (["--logit-bias", "e=-101"], "--logit-bias must be from -100 (a ban) to 100 for 'e' (got -101.0)"),
    ],
)
def test_bad_penalty_flags(checkpoint_dir: Path, flags: list[str], fragment: str) -> None:
    for command in ("sample", "repl"):
        assert_one_line_error(invoke(command, "--checkpoint-dir", str(checkpoint_dir), *flags), fragment)


@pytest.fixture(scope="module")
def checkpoint_dir(run1: Run) -> Path:
    return run1.path.parent


def test_a_character_the_model_lacks_is_one_line(checkpoint_dir: Path) -> None:
    result = invoke("sample", "--checkpoint-dir", str(checkpoint_dir), "--logit-bias", "Z=-100")
    assert_one_line_error(
        result, "--logit-bias must be keyed by characters of the model's vocabulary: the model has no 'Z'"
    )


# --- the REPL's commands ---------------------------------------------------------------------


def test_repl_commands_set_the_penalties_and_bias() -> None:
    session, out, warnings = make_session(FakeGenerator())
    for line in (":freq 0.5", ":presence -0.25", ":bias a=-100", ":bias space=2", ":bias \\n=1"):
        session.handle(line)
    assert warnings == []
    settings = session.settings
    assert (settings.frequency_penalty, settings.presence_penalty) == (0.5, -0.25)
    assert settings.logit_bias == (("a", -100.0), (" ", 2.0), ("\n", 1.0))
    assert "freq 0.5  presence -0.25  bias a=-100 space=2 \\n=1" in out.getvalue().splitlines()[-1]
    session.handle("ab")
    assert session.generator.calls[-1][1].logit_bias == settings.logit_bias
    session.handle(":bias clear")
    assert session.settings.logit_bias == () and "bias none" in out.getvalue().splitlines()[-1]


def test_the_repl_gives_the_text_textgen_sample_gives(gen1: Generator) -> None:
    session, out, warnings = make_session(gen1, length=120, temperature=0.0, top_p=1.0, seed=4)
    for line in (":freq 0.4", ":presence 0.3", ":bias e=-2"):
        session.handle(line)
    before = len(out.getvalue())
    session.handle("the ")
    expected = gen1.generate(["the "], SampleConfig(**{**PENALIZED.__dict__, "num": 1}))[0]
    assert out.getvalue()[before:] == for_display(expected) + "\n" and warnings == []


@pytest.mark.parametrize(
    ("line", "warning"),
    [
        (":freq 5", ":freq must be a number from -2 to 2"),
        (":presence x", ":presence needs a number"),
        (":bias q=1", ":bias must be keyed by characters of the model's vocabulary: the model has no 'q'"),
        (":bias a", ":bias takes CHAR=BIAS"),
        (":bias a=-200", ":bias must be from -100 (a ban) to 100"),
    ],
)
def test_bad_repl_penalties_warn_and_keep_the_old_ones(line: str, warning: str) -> None:
    session, _, warnings = make_session(FakeGenerator())
    session.handle(line)
    assert len(warnings) == 1 and warnings[0].startswith(warning), warnings
    assert not session.settings.penalized


# --- benchmarks/loops.py's cycle detector ------------------------------------------------------


def test_a_loop_is_a_tail_that_repeats_with_a_period_of_at_most_200(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from loops import loop_of

    rng = np.random.default_rng(0)
    prose = "".join(rng.choice(list("abcdefgh "), 1000))
    assert loop_of(prose) is None
    assert loop_of(prose + "and more " * 60) == (9, 1000)
    assert loop_of(prose + ("x" * 199 + "y") * 3) == (200, 1000)
    assert loop_of(prose + ("x" * 200 + "y") * 3) is None  # a period of 201 is too long
    assert loop_of(prose + "and more " * 20) is None  # 180 characters: too short a repeat
