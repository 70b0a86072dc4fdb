"""textgen evaluate: stateful cross-entropy equals the hand computation; unknown characters; bad inputs."""

import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import assert_one_line_error, invoke, read_history, run_python, subprocess_env, write_corpus

from textgen.checkpoint import Run
from textgen.config import ModelConfig
from textgen.data import load_splits, write_id_file
from textgen.device import CPU
from textgen.errors import ConfigError, CorpusError
from textgen.evaluate import evaluate_run
from textgen.idcache import cache_root
from textgen.layout import StreamLayout
from textgen.model import build_model
from textgen.scoring import compile_eval_step, score


def stream_cross_entropy(model, ids: np.ndarray, streams: int) -> float:
    """Summed -log p(next) of every character of ``ids`` after the first, in ``streams`` contiguous streams of equal
    length (the last one also taking what is left over), each read whole from zero states by a stateless model."""
    length = (len(ids) - 1) // streams
    total = 0.0
    for s in range(streams):
        start, end = s * length, (s + 1) * length if s < streams - 1 else len(ids) - 1
        inputs, targets = ids[start:end], ids[start + 1 : end + 1]
        logits = model(np.asarray(inputs, np.int32)[None, :]).numpy()[0].astype(np.float64)
        top = logits.max(-1, keepdims=True)
        log_probs = logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))
        total -= log_probs[np.arange(end - start), targets].sum()
    return total


def hand_cross_entropy(run, ids: np.ndarray, streams: int) -> tuple[float, int]:
    """Mean -log p(next) over every character of ``ids`` after the first, by ``stream_cross_entropy``, with ``run``'s
    best weights; and how many characters that is."""
    cfg: ModelConfig = run.load_config().model
    model = build_model(cfg, batch_size=1, stateful=False)
    run.load_weights(model)
    return stream_cross_entropy(model, ids, streams) / (len(ids) - 1), len(ids) - 1


# A tiny random model scored over 203 ids (202 targets) as (streams, seq_len): each stream's rest and the last
# stream's extra in one padded batch (4, 7), the last stream's in two (6, 5), the rows' rests equal (2, 50), only
# the last row's extra after the full batches (4, 50), and nothing left after them (2, 101).
SCORING_MODEL = ModelConfig(vocab_size=11, embedding_dim=4, units=8, dropout=0.0)
SCORING_CASES = [(4, 7), (6, 5), (2, 50), (4, 50), (2, 101)]


def scoring_case(path: Path) -> tuple[np.memmap, list[np.ndarray]]:
    """203 seeded random ids, written to the id file ``path``, and seeded random weights of SCORING_MODEL."""
    rng = np.random.default_rng(0)
    ids = write_id_file(rng.integers(1, SCORING_MODEL.vocab_size, 203).astype(np.uint8), path)
    shapes = [w.shape for w in build_model(SCORING_MODEL, 1, stateful=False).get_weights()]
    return ids, [rng.normal(0.0, 0.5, shape).astype(np.float32) for shape in shapes]


def scores(
    ids: np.memmap, weights: list[np.ndarray], strategy, fast_lstm: bool, cases: list[tuple[int, int]] = SCORING_CASES
) -> list[tuple[float, int]]:
    """``score`` of each of ``cases`` under ``strategy``, given a training layout (as training's validation)."""
    replicas, profile = strategy.num_replicas_in_sync, dataclasses.replace(CPU, fast_lstm=fast_lstm)
    results = []
    for streams, seq_len in cases:
        with strategy.scope():
            model = build_model(SCORING_MODEL, streams // replicas)
        model.set_weights(weights)
        layout = StreamLayout.of(len(ids), streams, seq_len)
        results.append(score(compile_eval_step(model, profile, strategy), model, ids, layout, strategy))
    return results


def expected_scores(
    ids: np.memmap, weights: list[np.ndarray], cases: list[tuple[int, int]] = SCORING_CASES
) -> list[float]:
    """Each of ``cases``'s summed nats by ``stream_cross_entropy``, with no layout at all."""
    model = build_model(SCORING_MODEL, 1, stateful=False)
    model.set_weights(weights)
    return [stream_cross_entropy(model, ids, streams) for streams, _ in cases]


@pytest.mark.parametrize("fast_lstm", [True, False], ids=["fast-lstm", "keras-lstm"])
def test_score_reads_every_character_exactly(tmp_path: Path, fast_lstm: bool) -> None:
    """Full batches, then the padded rest: the nats of every character after the first, as each stream read
    whole from zero states gives them."""
    import tensorflow as tf

    ids, weights = scoring_case(tmp_path / "ids")
    got = scores(ids, weights, tf.distribute.get_strategy(), fast_lstm)
    for (nats, chars), expected in zip(got, expected_scores(ids, weights), strict=True):
        assert chars == len(ids) - 1
        assert nats == pytest.approx(expected, rel=1e-6)


MIRRORED_SCORES = """
import json, sys
from pathlib import Path
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
from test_evaluate import REPLICA_CASES, scoring_case, scores
ids, weights = scoring_case(Path(sys.argv[1]))
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
print(json.dumps(scores(ids, weights, strategy, fast_lstm=True, cases=REPLICA_CASES)))
"""
# Two replicas: every row's rest in one padded batch, and only the second replica's last row with any (each case
# compiles its own steps: ~7 s apiece in a fresh process, so not all of SCORING_CASES).
REPLICA_CASES = [(4, 7), (4, 50)]


def test_score_over_two_replicas_reads_every_character_exactly(tmp_path: Path) -> None:
    """Through a real MirroredStrategy over two logical CPUs (the default profile's LSTM path): each replica scores
    its own streams, the padded rest included (in (4, 50) only the second replica's last row has characters left)."""
    out = run_python(["-c", MIRRORED_SCORES, str(tmp_path / "ids")], cwd=Path(__file__).parent)
    assert out.returncode == 0, out.stderr
    ids, weights = scoring_case(tmp_path / "ids")
    got = json.loads(out.stdout.strip().splitlines()[-1])
    for (nats, chars), expected in zip(got, expected_scores(ids, weights, REPLICA_CASES), strict=True):
        assert chars == len(ids) - 1
        assert nats == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize(("streams", "seq_len"), [(1, 7), (3, 7), (2, 50), (9, 4)])
def test_score_equals_the_cross_entropy_by_hand(trained_run, streams: int, seq_len: int) -> None:
    """Batches of seq_len characters with the state carried across them read each stream as one piece, and the
    characters that fill no whole batch are scored too (of the 683 validation characters, (9, 4) leaves each
    stream 3 after its full batches and the last 7 more: three padded batches)."""
    run = trained_run.run
    val = load_splits(run.load_config().data, cache_root(run.path.parent), run.load_vocab()).val
    cfg = run.load_config()
    model = build_model(cfg.model, batch_size=streams)
    run.load_weights(model)
    nats, chars = score(compile_eval_step(model, cfg.profile), model, val, StreamLayout.of(len(val), streams, seq_len))
    expected, count = hand_cross_entropy(run, val, streams)
    assert chars == count == len(val) - 1
    assert nats / chars == pytest.approx(expected, rel=1e-5)


def test_evaluate_scores_a_split_in_the_runs_own_layout(trained_run) -> None:
    run = trained_run.run
    data = run.load_config().data
    val = load_splits(data, cache_root(run.path.parent), run.load_vocab()).val
    result = evaluate_run(run, split="val")
    assert (result.streams, result.seq_len) == (data.batch_size, data.seq_len)
    expected, count = hand_cross_entropy(run, val, data.batch_size)
    assert result.chars == count
    assert result.nats_per_char == pytest.approx(expected, rel=1e-5)
    assert result.bits_per_char == pytest.approx(expected / np.log(2), rel=1e-5)
    assert result.perplexity == pytest.approx(np.exp(expected), rel=1e-5)


def test_streams_reads_the_split_as_that_many_streams(trained_run) -> None:
    """--streams scores runs of different --batch-size alike: by the hand computation for that many streams."""
    run = trained_run.run
    data = run.load_config().data
    val = load_splits(data, cache_root(run.path.parent), run.load_vocab()).val
    result = evaluate_run(run, split="val", streams=3)
    assert (result.streams, result.seq_len) == (3, data.seq_len)
    expected, count = hand_cross_entropy(run, val, 3)
    assert result.chars == count
    assert result.nats_per_char == pytest.approx(expected, rel=1e-5)
    checkpoints = str(run.path.parent)
    out = invoke("evaluate", "--checkpoint-dir", checkpoints, "--run", run.name, "--streams", "3", "--json")
    assert out.exit_code == 0, out.stderr
    assert json.loads(out.stdout)["streams"] == 3
    assert_one_line_error(invoke("evaluate", "--checkpoint-dir", checkpoints, "--streams", "0"), "--streams must be")


def test_evaluate_on_val_reproduces_the_best_validation_loss_of_training(trained_run) -> None:
    """Training's validation and textgen evaluate are one routine: the same number for the same weights."""
    run = trained_run.run
    best = min(row["val_loss"] for row in read_history(run.path))
    assert best == pytest.approx(trained_run.result.best_val_loss, rel=1e-9)
    assert evaluate_run(run, split="val").nats_per_char == pytest.approx(best, abs=1e-4)
    out = invoke("evaluate", "--checkpoint-dir", str(run.path.parent), "--run", run.name, "--split", "val", "--json")
    assert out.exit_code == 0, out.stderr
    assert json.loads(out.stdout)["nats_per_char"] == pytest.approx(best, abs=1e-4)


def test_a_text_shorter_than_one_batch_is_read_as_fewer_streams(trained_run, tmp_path: Path) -> None:
    data = trained_run.run.load_config().data  # 8 streams x 32
    path = tmp_path / "short.txt"
    path.write_text(trained_run.corpus.read_text(encoding="utf-8")[:101], encoding="utf-8")
    result = evaluate_run(trained_run.run, file=str(path))
    assert (result.streams, result.seq_len, result.chars) == (3, data.seq_len, 100)  # 100 // 32 streams, all scored
    path.write_text("the cat", encoding="utf-8")
    result = evaluate_run(trained_run.run, file=str(path))
    assert (result.streams, result.seq_len, result.chars) == (1, 6, 6)


def test_file_with_unknown_characters_counts_them(trained_run, tmp_path: Path) -> None:
    text = trained_run.corpus.read_text(encoding="utf-8")[:2000]
    path = tmp_path / "other.txt"
    path.write_text(text[:1000] + "ЖЖЖ€" + text[1000:], encoding="utf-8")
    result = evaluate_run(trained_run.run, file=str(path))
    assert result.unknown_chars == 4
    assert result.source == str(path)
    out = invoke(
        "evaluate", str(path), "--checkpoint-dir", str(trained_run.run.path.parent), "--run", trained_run.run.name
    )
    assert out.exit_code == 0, out.stderr
    assert "4 characters are not in the run's vocabulary" in out.stderr


def test_bad_inputs(trained_run, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--split must be one of test, val"):
        evaluate_run(trained_run.run, split="train")
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    with pytest.raises(CorpusError, match="is empty"):
        evaluate_run(trained_run.run, file=str(empty))
    assert_one_line_error(
        invoke("evaluate", "--checkpoint-dir", str(tmp_path / "none")), "no trained run", "textgen train"
    )
    checkpoints = str(trained_run.run.path.parent)
    assert_one_line_error(invoke("evaluate", "--checkpoint-dir", checkpoints, "--run", "nope"), "no run 'nope'")
    assert_one_line_error(invoke("evaluate", str(empty), "--checkpoint-dir", checkpoints), "is empty")


def test_runs_lists_the_run(trained_run) -> None:
    out = invoke("runs", "--checkpoint-dir", str(trained_run.run.path.parent), "--json")
    assert out.exit_code == 0, out.stderr
    row = json.loads(out.stdout)
    assert row["run"] == trained_run.run.name
    assert row["epochs"] == trained_run.result.epochs
    assert row["best_val_bpc"] == pytest.approx(trained_run.result.best_val_bpc)
    assert row["config"] == trained_run.plan.config.to_dict()  # the whole config, to compare runs by
    assert row["batches_into_epoch"] == 0


def test_runs_shows_an_epoch_cut_short(trained_run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")  # no wrapping inside the table's cells
    run_dir = shutil.copytree(trained_run.run.path, tmp_path / "checkpoints" / "cut")
    state = json.loads((run_dir / "state.json").read_text())
    cut = {"batch": 3, "step": state["step"] + 3, "finished": "time_budget"}  # 3 batches into the next epoch
    (run_dir / "state.json").write_text(json.dumps({**state, **cut}))
    out = invoke("runs", "--checkpoint-dir", str(run_dir.parent))
    assert out.exit_code == 0, out.stderr
    row = next(line for line in out.stdout.splitlines() if line.startswith("cut "))
    assert f"  {state['epoch']} epochs and 3 batches  " in row  # complete epochs, and batches, as train says them
    assert row.endswith("budget spent")


def test_runs_names_a_state_with_an_unknown_stop_reason(trained_run, tmp_path: Path) -> None:
    run_dir = shutil.copytree(trained_run.run.path, tmp_path / "checkpoints" / "odd")
    state = json.loads((run_dir / "state.json").read_text())
    (run_dir / "state.json").write_text(json.dumps({**state, "finished": "bogus"}))
    out = invoke("runs", "--checkpoint-dir", str(run_dir.parent))
    assert out.exit_code == 0, out.stderr  # listed as damaged, with the reason
    assert "damaged" in out.stdout and "state.json is corrupt (finished='bogus', not epochs or" in out.stdout


@pytest.mark.parametrize(
    ("epochs", "batches", "cell"),
    [
        (1, 0, "1 epoch"),
        (4, 0, "4 epochs"),
        (5, 89, "5 epochs and 89 batches"),
        (0, 1089, "0 epochs and 1,089 batches"),
        (2, 1, "2 epochs and 1 batch"),
    ],
)
def test_epochs_done(epochs: int, batches: int, cell: str) -> None:
    from textgen.results import epochs_done

    assert epochs_done(epochs, batches) == cell


@pytest.mark.slow  # 27 s of two real training runs; a benchmark's plumbing, not textgen's (keeps the suite ~10 min)
def test_the_quality_benchmark_trains_scores_and_ranks_recipes(tmp_path: Path) -> None:
    corpus = write_corpus(tmp_path / "tiny.txt", 3000)
    tiny = "--embedding-dim 8 --batch-size 4 --seq-len 16"
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "quality.py"
    args = ["--corpus", str(corpus), "--time-budget", "2s", "--checkpoint-dir", str(tmp_path / "runs")]
    args += ["--recipe", f"--units 16 {tiny}", "--recipe", f"--units 24 {tiny} --lr-schedule plateau"]
    proc = subprocess.run(
        [sys.executable, str(script), *args], env=subprocess_env(), capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith(f"recipe --units 16 {tiny}, budget 2s: ")
    assert lines[1].startswith(f"recipe --units 24 {tiny} --lr-schedule plateau, budget 2s: ")
    assert "ranked by test loss (2s each):" in proc.stdout
    table = [line for line in lines if line.startswith("| `")]
    assert len(table) == 2
    losses = [float(row.split("|")[5]) for row in table]
    assert losses == sorted(losses)
    for name, units in (("tiny", 16), ("tiny-2", 24)):
        assert Run(tmp_path / "runs" / name).load_config().model.units == units


def test_the_quality_frontier_sets_each_budget_beside_pytorch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from quality import frontier

    report = {"epochs": 3, "chars_per_sec": 17_000.0, "test_nats_per_char": 1.25}
    table = frontier(
        [{**report, "time_budget": "20m"}, {**report, "time_budget": "10m"}, {**report, "time_budget": "7m"}]
    )
    rows = table.splitlines()[2:]
    assert rows[0] == "| 7m | 3 | 17,000 | 1.2500 | - | - |"  # no reference at 7 minutes
    assert rows[1] == "| 10m | 3 | 17,000 | 1.2500 | 1.298 | -0.0480 |"
    assert rows[2] == "| 20m | 3 | 17,000 | 1.2500 | 1.231 | +0.0190 |"


MISSING_FILE_WITHOUT_TENSORFLOW = """
import sys
from textgen.cli import main
sys.argv = ["textgen", "evaluate", "missing.txt", "--checkpoint-dir", sys.argv[1]]
try:
    main()
except SystemExit as exit:
    assert exit.code == 1, exit.code
assert "tensorflow" not in sys.modules, "TensorFlow was imported"
"""


def test_a_missing_file_to_score_is_refused_before_tensorflow_loads(trained_run, tmp_path: Path) -> None:
    result = run_python(["-c", MISSING_FILE_WITHOUT_TENSORFLOW, str(trained_run.run.path.parent)], tmp_path)
    assert result.returncode == 0, result.stderr
    assert "corpus 'missing.txt' not found" in result.stderr
