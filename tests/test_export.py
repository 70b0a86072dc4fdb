"""textgen export: LiteRT and SavedModel artifacts, used in fresh processes without the run directory."""

from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path

import numpy as np
import pytest
from helpers import assert_one_line_error, invoke, run_python, run_textgen, train_tiny_run, write_corpus

from textgen import api
from textgen.artifact import INFO_FILE, MANIFEST_FILE, START_FILE, Quantize
from textgen.checkpoint import Run
from textgen.errors import ConfigError
from textgen.genconfig import SampleConfig
from textgen.generation import RowSettings
from textgen.npsampling import row_uniforms
from textgen.runtime import open_artifact
from textgen.sampling import Generator

VARIANTS = {  # name: (format, quantize)
    "litert": ("litert", "none"),
    "litert-float16": ("litert", "float16"),
    "litert-int8": ("litert", "int8"),
    "savedmodel": ("savedmodel", "none"),
}
PROMPT = "the "


@pytest.fixture(scope="module")
def run(trained_run, tmp_path_factory: pytest.TempPathFactory) -> Run:
    return trained_run.copy_to(tmp_path_factory.mktemp("export") / "checkpoints", "tiny")


@pytest.fixture(scope="module")
def exports(run: Run, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Every variant exported, then moved away from a copy of the run that is deleted: self-contained or broken."""
    scratch = tmp_path_factory.mktemp("exporting")
    copy = scratch / "checkpoints"
    shutil.copytree(run.path, copy / run.name)
    shipped = tmp_path_factory.mktemp("shipped")
    paths = {}
    for name, (format, quantize) in VARIANTS.items():
        result = api.export(
            checkpoint_dir=copy, run_name=run.name, format=format, quantize=quantize, path=scratch / name
        )
        assert result.path == scratch / name and result.bytes > 0
        paths[name] = Path(shutil.move(str(result.path), shipped / name))
    shutil.rmtree(scratch)
    return paths


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Text like the run's, but not the text it was trained on."""
    return write_corpus(tmp_path_factory.mktemp("text") / "other.txt", 4000, seed=7)


def sample_json(args: list[str], cwd: Path) -> list[dict]:
    result = run_textgen(["sample", *args, "--json"], cwd)
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


def run_sample(run: Run, *args: str) -> list[str]:
    result = invoke("sample", "--checkpoint-dir", str(run.path.parent), "--run", run.name, "--json", *args)
    assert result.exit_code == 0, result.stderr
    return [json.loads(line)["text"] for line in result.stdout.splitlines()]


def test_export_writes_the_network_and_textgen_json(exports: dict[str, Path], run: Run) -> None:
    litert, savedmodel = exports["litert"], exports["savedmodel"]
    assert sorted(p.name for p in litert.iterdir()) == [MANIFEST_FILE, "model.tflite", START_FILE, INFO_FILE]
    assert (savedmodel / "saved_model.pb").is_file() and (savedmodel / INFO_FILE).is_file()
    info = json.loads((litert / INFO_FILE).read_text(encoding="utf-8"))
    assert info["run"] == "tiny" and info["format"] == "litert" and info["quantize"] == "none"
    assert info["model"] == json.loads((run.path / "config.json").read_text())["model"]
    assert info["chars"] == "".join(run.load_vocab().chars)


def test_quantized_files_are_smaller(exports: dict[str, Path]) -> None:
    size = {
        name: (exports[name] / "model.tflite").stat().st_size for name in ("litert", "litert-float16", "litert-int8")
    }
    assert size["litert-int8"] < size["litert-float16"] < size["litert"]


@pytest.mark.parametrize("variant", ["litert", "litert-float16", "savedmodel"])
def test_a_fresh_process_continues_an_export_like_the_run_greedily(
    variant: str, exports: dict[str, Path], run: Run, tmp_path: Path
) -> None:
    """float32 exactly; float16 weights too, on this model (its logits differ by < 1e-2, tested below)."""
    args = ["--temp", "0", "--prime", PROMPT, "--length", "200", "--num", "2"]
    expected = run_sample(run, *args)
    records = sample_json(["--model", str(exports[variant]), *args], tmp_path)
    assert [r["text"] for r in records] == expected
    assert records[0]["model"] == str(exports[variant])


def test_litert_with_a_seed_samples_what_the_run_samples(exports: dict[str, Path], run: Run) -> None:
    """The draws are made by one hash of (seed, position, row), in NumPy, for both samplers."""
    args = ["--temp", "0.8", "--top-k", "5", "--seed", "11", "--length", "150", "--num", "3", "--model"]
    expected = run_sample(run, *args[:-1])
    got = invoke("sample", "--json", *args, str(exports["litert"]))
    assert got.exit_code == 0, got.stderr
    assert [json.loads(line)["text"] for line in got.stdout.splitlines()] == expected
    assert len(set(expected)) == 3


PENALTIES = [
    "--frequency-penalty",
    "0.5",
    "--presence-penalty",
    "0.2",
    "--logit-bias",
    "e=-100",
    "--logit-bias",
    "space=1",
]


@pytest.mark.parametrize("variant", ["litert", "savedmodel"])
def test_an_export_applies_penalties_and_bias_as_the_run_does(variant: str, exports: dict[str, Path], run: Run) -> None:
    """LiteRT through NumPy's twin, a SavedModel through its own compiled penalized loop: the run's text."""
    args = ["--temp", "0.9", "--seed", "11", "--length", "150", "--num", "3", *PENALTIES]
    expected = run_sample(run, *args)
    assert "e" not in "".join(expected) and expected != run_sample(run, *args[:8])
    got = invoke("sample", "--json", *args, "--model", str(exports[variant]))
    assert got.exit_code == 0, got.stderr
    assert [json.loads(line)["text"] for line in got.stdout.splitlines()] == expected


def test_a_savedmodel_exported_before_the_penalties_asks_to_be_exported_again(exports: dict[str, Path]) -> None:
    sampler, _ = open_artifact(exports["savedmodel"])
    sampler.penalized_concrete = None  # as loaded from an export without generate_penalized
    sampler.generate([PROMPT], SampleConfig(length=5))
    with pytest.raises(ConfigError, match="exported before textgen had penalties and logit bias; export it again"):
        sampler.generate([PROMPT], SampleConfig(length=5, presence_penalty=0.5))


@pytest.mark.parametrize(("variant", "tolerance"), [("litert", 1e-4), ("litert-float16", 1e-2), ("litert-int8", 5e-2)])
def test_litert_step_logits_are_the_run_step_logits(
    variant: str, tolerance: float, exports: dict[str, Path], run: Run
) -> None:
    reference, (exported, _) = Generator.from_run(run), open_artifact(exports[variant])
    ids = reference.vocab.encode("the quick brown fox jumps over the lazy dog\n")[None, :]
    states = reference.zero_states(1)
    for t in range(ids.shape[1]):
        want, states_want = reference.read(ids[:, t : t + 1], states)
        got, states_got = exported.read(ids[:, t : t + 1], states)
        np.testing.assert_allclose(got, want, atol=tolerance * max(1.0, float(np.abs(want).max())))
        states = states_want
    assert len(states_got) == 2


@pytest.mark.parametrize("variant", ["run", "litert", "savedmodel"])
@pytest.mark.parametrize("prompts", [("the quick ", "a", "the lazy dog "), ("the quick ", "the lazy dog ")])
def test_prompts_fed_inside_a_call_are_each_read_alone_then_drawn(
    variant: str, prompts: tuple[str, ...], exports: dict[str, Path], run: Run
) -> None:
    """A server's call feeds each row its prompt and draws after it; where every row still reads, the call draws
    nothing (the second case's first 10 steps). Either way each row gets what reading its prompt alone and then
    drawing at the same uniforms gives."""
    sampler = Generator.from_run(run) if variant == "run" else open_artifact(exports[variant])[0]
    encoded = sampler.encode_prompts(prompts)
    rows, steps = len(prompts), 20
    forced = np.full([steps, rows], -1, np.int32)
    for row, ids in enumerate(encoded):
        forced[: len(ids), row] = ids
    draws = row_uniforms(np.full(rows, 5), np.zeros(rows), np.arange(rows), steps)
    settings = SampleConfig(temperature=1.0)
    start = np.zeros([rows, sampler.vocab.size], np.float32)
    ids, logits, states = sampler.generate_steps(
        start, sampler.zero_states(rows), draws, RowSettings.of(settings, rows, sampler.vocab), forced
    )
    for row, prompt in enumerate(encoded):
        read_logits, read_states = sampler.read(prompt[None, :], sampler.zero_states(1))
        drawn, alone_logits, alone_states = sampler.generate_steps(
            read_logits, read_states, draws[len(prompt) :, row : row + 1], RowSettings.of(settings, 1, sampler.vocab)
        )
        assert ids[row].tolist() == prompt.tolist() + drawn[0].tolist()
        np.testing.assert_allclose(logits[row], alone_logits[0], atol=1e-4)
        np.testing.assert_allclose(states[0][row], alone_states[0][0], atol=1e-5)


INT8_BOUND = 0.02  # nats/char: the bound on what int8 weights may cost


def test_int8_costs_little_per_character(exports: dict[str, Path], run: Run, corpus: Path) -> None:
    float32 = api.evaluate(file=str(corpus), model=exports["litert"])
    int8 = api.evaluate(file=str(corpus), model=exports["litert-int8"])
    assert float32.chars == int8.chars > 1000
    assert abs(int8.nats_per_char - float32.nats_per_char) <= INT8_BOUND


def test_evaluating_an_export_is_evaluating_its_run(exports: dict[str, Path], run: Run, corpus: Path) -> None:
    expected = api.evaluate(checkpoint_dir=run.path.parent, run_name=run.name, file=str(corpus))
    for variant in ("litert", "savedmodel"):
        got = api.evaluate(file=str(corpus), model=exports[variant])
        assert (got.chars, got.streams, got.seq_len) == (expected.chars, expected.streams, expected.seq_len)
        assert got.nats_per_char == pytest.approx(expected.nats_per_char, abs=1e-4)


SERVING = """
import json, sys
import numpy as np
import tensorflow as tf

loaded = tf.saved_model.load(sys.argv[1])
chars = [c.decode() for c in loaded.signatures["vocabulary"]()["chars"].numpy()]
index = {c: i for i, c in enumerate(chars)}
prompt = tf.constant([[index[c] for c in sys.argv[2]]] * 2, tf.int32)
args = dict(length=tf.constant(120), top_k=tf.constant(0), top_p=tf.constant(1.0), seed=tf.constant(3))
greedy = loaded.signatures["generate"](prompt=prompt, temperature=tf.constant(0.0), **args)["ids"].numpy()
drawn = loaded.signatures["generate"](prompt=prompt, temperature=tf.constant(1.0), **args)["ids"].numpy()
again = loaded.signatures["generate"](prompt=prompt, temperature=tf.constant(1.0), **args)["ids"].numpy()
nucleus_of_one = {**args, "top_p": tf.constant(0.0)}  # keeps the likeliest id alone, never nothing
top_p_0 = loaded.signatures["generate"](prompt=prompt, temperature=tf.constant(1.0), **nucleus_of_one)["ids"].numpy()
try:
    loaded.signatures["generate"](prompt=prompt, temperature=tf.constant(1.0), **{**args, "length": tf.constant(0)})
    refused = ""
except tf.errors.InvalidArgumentError as exc:
    refused = exc.message
unprompted = loaded.signatures["generate"](
    prompt=tf.zeros([1, 0], tf.int32), temperature=tf.constant(0.0), **args
)["ids"].numpy()
step = loaded.signatures["step"]
out = step(ids=prompt[:, 0], h_0=tf.zeros([2, {units}]), c_0=tf.zeros([2, {units}]))
print(json.dumps({
    "greedy": ["".join(chars[i] for i in row) for row in greedy],
    "drawn": ["".join(chars[i] for i in row) for row in drawn],
    "repeatable": bool((drawn == again).all()),
    "top_p_0_is_greedy": bool((top_p_0 == greedy).all()),
    "length_0": refused,
    "unprompted": "".join(chars[i] for i in unprompted[0]),
    "step": sorted(out),
}))
"""


def test_the_savedmodel_generates_with_its_signatures_alone(exports: dict[str, Path], run: Run, tmp_path: Path) -> None:
    """TensorFlow alone, no textgen: the generate, step and vocabulary signatures."""
    script = tmp_path / "serve.py"
    script.write_text(textwrap.dedent(SERVING.replace("{units}", str(run.load_config().model.units))))
    result = run_python([str(script), str(exports["savedmodel"]), PROMPT], tmp_path)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.splitlines()[-1])
    assert out["greedy"] == run_sample(run, "--temp", "0", "--prime", PROMPT, "--length", "120", "--num", "2")
    assert out["repeatable"] and out["drawn"][0] != out["drawn"][1]
    assert out["top_p_0_is_greedy"] and "length must be at least 1" in out["length_0"]
    assert out["step"] == ["c_0", "h_0", "logits"]
    assert [out["unprompted"]] == run_sample(run, "--temp", "0", "--length", "120")  # from the start's logits


NO_TENSORFLOW = """
import sys
from textgen.cli import main
sys.argv = ["textgen", *sys.argv[1:]]
try:
    main()
except SystemExit as exit:
    assert not exit.code, exit.code
assert "tensorflow" not in sys.modules and "keras" not in sys.modules, "TensorFlow was imported"
"""


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["sample", "--model", "{litert-int8}", "--length", "50", "--seed", "1"],
        ["evaluate", "--model", "{litert-int8}", "{corpus}"],
    ],
)
def test_litert_paths_never_import_tensorflow(args: list[str], exports: dict[str, Path], corpus: Path, tmp_path: Path):
    paths = {**{k: str(v) for k, v in exports.items()}, "corpus": str(corpus)}
    result = run_python(["-c", NO_TENSORFLOW, *[a.format(**paths) for a in args]], tmp_path)
    assert result.returncode == 0, result.stderr


def test_the_repl_runs_on_an_export(exports: dict[str, Path], run: Run) -> None:
    from typer.testing import CliRunner

    from textgen.cli import app

    args = ["repl", "--model", str(exports["litert"]), "--temp", "0", "--length", "30"]
    result = CliRunner().invoke(app, args, input=f"{PROMPT}\n:quit\n")
    assert result.exit_code == 0, result.stderr
    assert f"{exports['litert']} loaded" in result.stdout and "Traceback" not in result.stdout + result.stderr
    expected = run_sample(run, "--temp", "0", "--prime", PROMPT, "--length", "30")[0]
    assert expected in result.stdout


@pytest.mark.slow  # ~15 s: a second export of each format
def test_exporting_again_replaces_the_export(run: Run, tmp_path: Path) -> None:
    target = tmp_path / "wp"
    first = api.export(checkpoint_dir=run.path.parent, run_name=run.name, path=target)
    second = api.export(checkpoint_dir=run.path.parent, run_name=run.name, quantize=Quantize.int8, path=target)
    assert second.bytes < first.bytes
    assert json.loads((target / INFO_FILE).read_text())["quantize"] == "int8"
    assert [p.name for p in tmp_path.iterdir()] == ["wp"]  # no temporary directory left behind


def test_the_default_path_names_the_run_and_variant(run: Run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = invoke("export", "--checkpoint-dir", str(run.path.parent), "--format", "litert", "--quantize", "int8")
    assert result.exit_code == 0, result.stderr
    assert (tmp_path / "exports" / "tiny-litert-int8" / "model.tflite").is_file()
    assert "textgen sample --model exports/tiny-litert-int8" in result.stdout


def test_export_json(run: Run, tmp_path: Path) -> None:
    result = invoke(
        "export",
        "--checkpoint-dir",
        str(run.path.parent),
        "--format",
        "savedmodel",
        "-o",
        str(tmp_path / "s"),
        "--json",
    )
    assert result.exit_code == 0, result.stderr
    record = json.loads(result.stdout)
    assert record["run"] == "tiny" and record["format"] == "savedmodel" and record["bytes"] > 0


def test_bad_exports_and_models_are_one_line(run: Run, exports: dict[str, Path], tmp_path: Path) -> None:
    checkpoints = ["--checkpoint-dir", str(run.path.parent)]
    occupied = tmp_path / "occupied"
    occupied.mkdir()
    (occupied / "notes.txt").write_text("mine")
    damaged = tmp_path / "damaged"
    shutil.copytree(exports["litert-int8"], damaged)
    (damaged / INFO_FILE).write_text("{not json")
    not_an_object = tmp_path / "not-an-object"
    shutil.copytree(exports["litert-int8"], not_an_object)
    (not_an_object / INFO_FILE).write_text("null")
    broken = tmp_path / "broken"
    shutil.copytree(exports["litert-int8"], broken)
    (broken / "model.tflite").write_bytes(b"not a model")
    mismatched = tmp_path / "mismatched"  # a textgen.json edited to describe another model than the file's
    shutil.copytree(exports["litert-int8"], mismatched)
    info = json.loads((mismatched / INFO_FILE).read_text())
    (mismatched / INFO_FILE).write_text(json.dumps({**info, "model": {**info["model"], "layers": 2}}))
    cases = [
        (
            ["export", *checkpoints, "--format", "savedmodel", "--quantize", "int8"],
            "--quantize applies to --format litert",
        ),
        (["export", *checkpoints, "--format", "litert", "-o", str(occupied)], "is not a textgen export"),
        (["export", *checkpoints, "--format", "onnx"], "'onnx' is not one of"),
        (["sample", "--model", str(tmp_path / "missing")], "no such file or directory"),
        (["sample", "--model", str(occupied)], "is not a textgen export"),
        (["sample", "--model", str(damaged)], "is damaged"),
        (["sample", "--model", str(not_an_object)], "is damaged (a JSON null, not an object)"),
        (["sample", "--model", str(broken)], "export the run again"),
        (["sample", "--model", str(mismatched)], f"{INFO_FILE} has changed since it was exported"),
        (["sample", "--model", str(exports["litert"]), "--run", "tiny"], "give --run or --model, not both"),
        (["evaluate", "--model", str(exports["litert"])], "give a text FILE"),
    ]
    for args, fragment in cases:
        assert_one_line_error(invoke(*args), fragment)
    assert_one_line_error(invoke("sample", "--model", str(occupied / "notes.txt")), "is not a textgen export")
    assert (occupied / "notes.txt").read_text() == "mine"


def test_a_file_inside_an_export_names_the_export(exports: dict[str, Path]) -> None:
    result = invoke("sample", "--model", str(exports["litert-int8"] / "model.tflite"), "--length", "20", "--json")
    assert result.exit_code == 0, result.stderr
    assert len(json.loads(result.stdout)["text"]) == 20


def test_sampler_settings_apply_to_exports(exports: dict[str, Path]) -> None:
    sampler, _ = open_artifact(exports["litert-int8"])
    texts = sampler.generate(["a", "the "], SampleConfig(length=64, temperature=0.7, top_k=3, top_p=0.9, seed=5))
    assert [len(t) for t in texts] == [64, 64]
    assert not sampler.vocab.unknown_chars("".join(texts).replace("\n", ""))


# 31 s: trains and exports a second run (run with -m slow)
@pytest.mark.slow
def test_a_two_layer_layer_normalized_run_exports_with_its_four_states(tmp_path: Path) -> None:
    model = {"units": 16, "layers": 2, "embedding_dim": 8, "layer_norm": True}
    run = train_tiny_run(tmp_path, "two", model, {"epochs": 2, "lr": 0.02})
    greedy = SampleConfig(length=60, temperature=0.0, seed=0)
    expected = Generator.from_run(run).generate([PROMPT, "a"], greedy)
    for format in ("litert", "savedmodel"):
        exported = api.export(
            checkpoint_dir=tmp_path / "checkpoints", run_name="two", format=format, path=tmp_path / format
        ).path
        sampler, info = open_artifact(exported)
        assert info.model.layers == 2 and info.model.layer_norm and len(sampler.zero_states(1)) == 4
        assert sampler.generate([PROMPT, "a"], greedy) == expected


@pytest.mark.parametrize("name", ["litert", "savedmodel"])
def test_an_export_is_served_with_the_text_its_sampler_gives(exports: dict[str, Path], name: str) -> None:
    from starlette.testclient import TestClient

    from textgen.engine import Engine
    from textgen.genconfig import SampleConfig, ServeConfig
    from textgen.promptcache import PromptCache
    from textgen.runtime import open_artifact
    from textgen.server import card_of_export, create_app

    sampler, info = open_artifact(exports[name])
    engine = Engine(sampler, slots=4, max_queue=4, cache=PromptCache(16))
    assert engine.lanes == (1 if name == "litert" else 2)  # LiteRT's interpreter runs one call at a time
    engine.start()
    card = card_of_export(exports[name].name, info)
    body = {"model": card.model, "prompt": PROMPT, "max_tokens": 80, "seed": 3, "n": 2, "top_k": 5}
    try:
        with TestClient(create_app(engine, card, ServeConfig())) as client:
            answer = client.post("/v1/completions", json=body).json()
            long = {**body, "prompt": ("old fox sat on the mat the " * 12)[:300], "n": 1}  # kept: 256 and 300
            again = [client.post("/v1/completions", json=long).json() for _ in "ab"]
            penalized = {**body, "frequency_penalty": 0.5, "logit_bias": {"e": -100}}
            penalized_answer = client.post("/v1/completions", json=penalized).json()
            assert client.get("/info").json()["source"] == info.format
            assert client.get("/runs").status_code == 404  # an export has no checkpoint directory
    finally:
        engine.close()
    expected = sampler.generate([PROMPT] * 2, SampleConfig(length=80, num=2, seed=3, top_k=5))
    assert [c["text"] for c in answer["choices"]] == expected
    # From the prompt cache's state, the text read from the start gave (and the sampler gives).
    assert [a["usage"]["prompt_tokens_details"]["cached_tokens"] for a in again] == [0, 300]
    expected = sampler.generate([long["prompt"]], SampleConfig(length=80, seed=3, top_k=5))
    assert [a["choices"][0]["text"] for a in again] == expected * 2
    settings = SampleConfig(length=80, num=2, seed=3, top_k=5, frequency_penalty=0.5, logit_bias=(("e", -100.0),))
    assert [c["text"] for c in penalized_answer["choices"]] == sampler.generate([PROMPT] * 2, settings)
