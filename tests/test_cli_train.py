"""The ``textgen`` command line for training: help, clean one-line errors, real runs, Ctrl-C."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import (
    assert_one_line_error,
    invoke,
    make_text,
    read_history,
    run_python,
    run_textgen,
    subprocess_env,
    wait_for,
    write_corpus,
)

TINY_FLAGS = ["--device", "cpu", "--units", "32", "--embedding-dim", "8", "--batch-size", "4", "--seq-len", "16"]


def squash(text: str) -> str:
    """Text with all runs of whitespace made single spaces (help output wraps at 80 columns)."""
    return " ".join(text.split())


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Run in an empty directory, with no ./corpora and no $TEXTGEN_CORPUS_PATH."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TEXTGEN_CORPUS_PATH", raising=False)
    return tmp_path


# --- help ----------------------------------------------------------------------------


def test_top_level_help_shows_a_quick_start() -> None:
    result = invoke("--help")
    assert result.exit_code == 0
    out = squash(result.stdout)
    assert "train" in out
    assert "textgen sample --temp 0.8" in out, "textgen --help should show the base model's sample first"
    assert "textgen train FILE --init-from base:en" in out and "textgen train 2600-0.txt --device cpu" in out


@pytest.mark.parametrize("command", [[], ["train"], ["sample"], ["repl"], ["tune"], ["runs"]])
def test_h_is_help(command: list[str]) -> None:
    short, long = invoke(*command, "-h"), invoke(*command, "--help")
    assert short.exit_code == long.exit_code == 0
    assert squash(short.stdout) == squash(long.stdout) and "Usage:" in short.stdout


def test_version_names_textgen_tensorflow_and_keras() -> None:
    import importlib.metadata

    import textgen

    result = invoke("--version")
    assert result.exit_code == 0
    assert result.stdout == (
        f"textgen {textgen.__version__} tensorflow {importlib.metadata.version('tensorflow-cpu')} "
        f"keras {importlib.metadata.version('keras')}\n"
    )


def test_train_help_shows_examples() -> None:
    result = invoke("train", "--help")
    assert result.exit_code == 0
    out = squash(result.stdout)
    assert "Examples" in out
    assert "textgen train 2600-0.txt --device cpu" in out
    assert "textgen train --resume" in out
    for option in ("--units", "--epochs", "--time-budget", "--device", "--resume", "--checkpoint-dir"):
        assert option in out


# --- one-line errors -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "fragment"),
    [
        (["--units", "0"], "--units must be a positive integer up to 2,147,483,647 (got 0)"),
        (["--epochs", "-1"], "--epochs must be a positive integer up to 2,147,483,647 (got -1)"),
        (["--time-budget", "abc"], "--time-budget must be a duration like 90s, 30m or 1h30m (got 'abc')"),
        (["--time-budget", "0"], "--time-budget must be positive"),
        (["--time-budget", "+1m"], "--time-budget +1m00s adds time to a run you resume: add --resume"),
        (["--dropout", "1.5"], "--dropout must be in [0, 1) (got 1.5)"),
        (["--weight-drop", "1"], "--weight-drop must be in [0, 1) (got 1.0)"),
        (["--locked-output-dropout", "-0.1"], "--locked-output-dropout must be in [0, 1) (got -0.1)"),
        (["--batch-size", "0"], "--batch-size must be a positive integer up to 2,147,483,647 (got 0)"),
        (["--seq-len", "-4"], "--seq-len must be a positive integer up to 2,147,483,647 (got -4)"),
        (["--lr", "0"], "--lr must be a positive number"),
        (["--anneal", "1.5"], "--anneal must be in (0, 1] (got 1.5)"),
        (["--run", "../escape", "--batch-size", "4", "--seq-len", "16"], "--run must be 1 to 100 letters, digits"),
    ],
)
def test_bad_flag_values(workdir: Path, flags: list[str], fragment: str) -> None:
    write_corpus(workdir / "tiny.txt", 400)
    result = invoke("train", "tiny.txt", "--checkpoint-dir", "ck", *flags)
    assert_one_line_error(result, fragment)
    assert result.exit_code == 1
    assert not (workdir / "ck").exists() or not any((workdir / "ck").iterdir())


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (
            ["train", "x.txt", "--device", "tpu"],
            "invalid value for '--device': 'tpu' is not one of 'auto', 'cpu', 'gpu'",
        ),
        (["train", "x.txt", "--lr-schedule", "step"], "invalid value for '--lr-schedule': 'step' is not one of"),
        (["train", "x.txt", "--units", "many"], "invalid value for '--units': not a whole number"),
        (["sample", "--temp", "warm"], "invalid value for '--temp': not a number"),
        (["evaluate", "--split", "train"], "invalid value for '--split': 'train' is not one of 'test', 'val'"),
        (["sample", "--bogus"], "no such option --bogus for sample"),
        (["trian"], "no such command 'trian' (did you mean 'train'?)"),
        (["export"], "missing option '--format'. Choose from: litert, savedmodel"),
    ],
)
def test_usage_errors_are_one_line(workdir: Path, args: list[str], fragment: str) -> None:
    result = invoke(*args)
    line = assert_one_line_error(result, fragment)
    assert result.exit_code == 2  # click's code for a usage error
    assert line.endswith("--help")


def test_bad_flag_values_are_caught_before_tensorflow_is_imported(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from textgen.cli import app\n"
        "for flags in (['--units', '0'], ['--epochs', '-1'], ['--time-budget', 'abc'], ['--device', 'tpu']):\n"
        "    result = CliRunner().invoke(app, ['train', 'x.txt', *flags])\n"
        "    assert result.exit_code in (1, 2) and result.stderr.startswith('error:'), result.stderr\n"
        "assert 'tensorflow' not in sys.modules, 'flag checks imported TensorFlow'\n"
    )
    proc = run_python(["-c", code], tmp_path)
    assert proc.returncode == 0, proc.stderr


def test_missing_corpus(workdir: Path) -> None:
    result = invoke("train", "nope.txt", "--device", "cpu", "--checkpoint-dir", "ck")
    assert_one_line_error(result, "corpus 'nope.txt' not found", "corpora")


def test_missing_gutenberg_corpus_suggests_download(workdir: Path) -> None:
    result = invoke("train", "2600-0.txt", "--device", "cpu", "--checkpoint-dir", "ck")
    assert_one_line_error(result, "--download")


def test_directory_as_corpus(workdir: Path) -> None:
    (workdir / "books").mkdir()
    result = invoke("train", "books", "--device", "cpu", "--checkpoint-dir", "ck")
    assert_one_line_error(result, "books has no .txt files")


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (b"", "is empty"),
        (b"\x00\x01\x02binary\x00", "looks like a binary file"),
        ("\ufeffhello\n".encode("utf-16"), "is UTF-16 text; pass --encoding utf-16"),
    ],
    ids=["empty", "binary", "utf-16"],
)
def test_unusable_corpus_files(workdir: Path, content: bytes, fragment: str) -> None:
    (workdir / "book.txt").write_bytes(content)
    result = invoke("train", "book.txt", "--device", "cpu", "--checkpoint-dir", "ck")
    assert_one_line_error(result, "book.txt", fragment)


def test_corpus_too_short(workdir: Path) -> None:
    write_corpus(workdir / "short.txt", 200)
    result = invoke("train", "short.txt", "--device", "cpu", "--batch-size", "64", "--seq-len", "100")
    line = assert_one_line_error(result, "corpus too short", "training split", "--batch-size", "--seq-len")
    assert "smaller" in line
    assert not (workdir / "checkpoints").exists() or not [
        p for p in (workdir / "checkpoints").iterdir() if p.name != ".cache"
    ]


def test_gpu_without_a_gpu(workdir: Path) -> None:
    write_corpus(workdir / "tiny.txt", 400)
    result = invoke("train", "tiny.txt", "--device", "gpu", "--checkpoint-dir", "ck")
    line = assert_one_line_error(result, "--device gpu", "--device cpu")
    assert "pip install -e '.[gpu]'" in line  # printed literally, not eaten as console markup


def test_unwritable_checkpoint_dir(workdir: Path) -> None:
    write_corpus(workdir / "tiny.txt", 400)
    (workdir / "afile").write_text("a file, not a directory")
    result = invoke("train", "tiny.txt", "--device", "cpu", "--checkpoint-dir", "afile/sub")
    assert_one_line_error(result, "cannot write to afile/sub", "--checkpoint-dir")


def test_resume_with_no_runs(workdir: Path) -> None:
    result = invoke("train", "--resume", "--device", "cpu", "--checkpoint-dir", "ck")
    assert_one_line_error(result, "train one first")


def test_existing_run_name(workdir: Path, trained_run) -> None:
    result = invoke(
        "train",
        str(trained_run.corpus),
        *TINY_FLAGS,
        "--checkpoint-dir",
        str(trained_run.checkpoint_dir),
        "--run",
        "tiny",
    )
    assert_one_line_error(result, "run 'tiny' already exists", "--resume")


def test_resume_with_changed_model_flags(workdir: Path, trained_run) -> None:
    args = ["train", "--resume", "--device", "cpu", "--checkpoint-dir", str(trained_run.checkpoint_dir)]
    result = invoke(*args, "--run", "tiny", "--units", "64")
    assert_one_line_error(result, "--units cannot change when resuming run 'tiny'")


# --- real runs ----------------------------------------------------------------------------


def test_a_run_with_weight_drop_and_a_locked_output_saves_them_and_evaluates_without_masks(workdir: Path) -> None:
    write_corpus(workdir / "tiny.txt", 1500)
    where = ["--checkpoint-dir", "ck", "--run", "wd"]
    regularized = ["--weight-drop", "0.3", "--locked-output-dropout", "0.2"]
    trained = invoke("train", "tiny.txt", *TINY_FLAGS, *where, *regularized, "--epochs", "1", "--json")
    assert trained.exit_code == 0, trained.stderr
    model = json.loads((workdir / "ck" / "wd" / "config.json").read_text())["model"]
    assert (model["weight_drop"], model["locked_output_dropout"]) == (0.3, 0.2)
    refused = invoke("train", "--resume", "--device", "cpu", *where, "--weight-drop", "0.1")
    assert_one_line_error(refused, "--weight-drop cannot change when resuming run 'wd' (it has --weight-drop 0.3)")
    done = json.loads(trained.stdout.splitlines()[-1])
    evaluated = invoke("evaluate", "--split", "val", "--json", *where)  # validation's figure: no mask in either
    assert evaluated.exit_code == 0, evaluated.stderr
    assert json.loads(evaluated.stdout)["nats_per_char"] == pytest.approx(done["best_val_loss"], rel=1e-5)


def test_a_layer_normalized_run_trains_resumes_evaluates_and_says_so(workdir: Path) -> None:
    write_corpus(workdir / "tiny.txt", 1500)
    where = ["--checkpoint-dir", "ck", "--run", "ln"]
    trained = invoke("train", "tiny.txt", *TINY_FLAGS, *where, "--layer-norm", "--epochs", "1", "--json")
    assert trained.exit_code == 0, trained.stderr
    assert json.loads((workdir / "ck" / "ln" / "config.json").read_text())["model"]["layer_norm"] is True
    refused = invoke("train", "--resume", "--device", "cpu", *where, "--no-layer-norm")
    assert_one_line_error(refused, "--layer-norm cannot change when resuming run 'ln' (it has --layer-norm)")
    resumed = invoke("train", "--resume", "--device", "cpu", *where, "--epochs", "2", "--json")  # keeps it
    assert resumed.exit_code == 0, resumed.stderr
    done = json.loads(resumed.stdout.splitlines()[-1])
    evaluated = invoke("evaluate", "--split", "val", "--json", *where)
    assert evaluated.exit_code == 0, evaluated.stderr
    assert json.loads(evaluated.stdout)["nats_per_char"] == pytest.approx(done["best_val_loss"], rel=1e-5)
    listed = invoke("runs", "--checkpoint-dir", "ck")
    assert "1 × 32 LSTM, dropout 0.1, layer-normalized" in listed.stdout


def test_json_output(workdir: Path) -> None:
    write_corpus(workdir / "tiny.txt", 1500)
    result = invoke("train", "tiny.txt", *TINY_FLAGS, "--epochs", "1", "--checkpoint-dir", "ck", "--run", "j", "--json")
    assert result.exit_code == 0, result.stderr
    events = [json.loads(line) for line in result.stdout.splitlines() if line.strip()]
    assert [e["event"] for e in events] == ["epoch", "done"]
    assert events[0]["epoch"] == 1 and events[0]["val_loss"] > 0
    done = events[1]
    assert done["run"] == "j" and done["epochs"] == 1 and done["stop_reason"] == "epochs"
    assert done["best_val_bpc"] == pytest.approx(done["best_val_loss"] / 0.6931471805599453)
    assert Path(done["path"], "best.weights.h5").is_file()


def test_import_is_light() -> None:
    code = "import textgen.cli, sys; assert 'tensorflow' not in sys.modules, 'textgen.cli imported TensorFlow'"
    proc = run_python(["-c", code])
    assert proc.returncode == 0, proc.stderr


def test_module_help_runs(tmp_path: Path) -> None:
    proc = run_textgen(["--help"], cwd=tmp_path, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "train" in proc.stdout
    assert "Traceback" not in proc.stderr


def test_train_end_to_end(tmp_path: Path) -> None:
    write_corpus(tmp_path / "tiny.txt", 1000)
    args = ["train", "tiny.txt", *TINY_FLAGS, "--epochs", "2", "--checkpoint-dir", "X", "--run", "r"]
    proc = run_textgen(args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "(new run)" in out
    assert "epoch 1/2" in out and "epoch 2/2" in out
    assert "done (all epochs done) after 2 epochs" in out
    assert "bits/char" in out
    # A finished run is told what it needs to train further, as a command that starts textgen as this one was
    # started (python -m textgen) and runs as printed.
    hint = next(line for line in out.splitlines() if "train 10 more epochs: " in line).split("more epochs: ")[1]
    assert hint.endswith(" -m textgen train --resume --run r --checkpoint-dir X --epochs 12")
    assert "Traceback" not in proc.stderr
    assert "oneDNN" not in proc.stderr and "cpu_feature_guard" not in proc.stderr  # TensorFlow's start-up chatter
    run = tmp_path / "X" / "r"
    for name in ("config.json", "vocab.json", "best.weights.h5", "state.json", "history.csv"):
        assert (run / name).is_file(), name
    assert [row["epoch"] for row in read_history(run)] == [0, 1]
    assert json.loads((run / "state.json").read_text())["finished"] == "epochs"
    again = subprocess.run(
        shlex.split(hint), cwd=tmp_path, env=subprocess_env(), capture_output=True, text=True, timeout=180
    )  # the command as shown
    assert again.returncode == 0, again.stderr
    assert "done (all epochs done) after 12 epochs" in again.stdout
    assert [row["epoch"] for row in read_history(run)] == list(range(12))


def test_ctrl_c_saves_and_resume_continues(tmp_path: Path) -> None:
    write_corpus(tmp_path / "tiny.txt", 6000)  # about 27,000 characters: a few seconds per epoch
    args = ["train", "tiny.txt", *TINY_FLAGS, "--epochs", "50", "--checkpoint-dir", "ck", "--run", "r"]
    out_path, err_path = tmp_path / "out.txt", tmp_path / "err.txt"
    with open(out_path, "w") as out, open(err_path, "w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "textgen", *args], cwd=tmp_path, env=subprocess_env(), stdout=out, stderr=err
        )
        try:
            wait_for(out_path, "epoch 1/50", proc, timeout=120)
            proc.send_signal(signal.SIGINT)
            returncode = proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
    stderr = err_path.read_text()
    assert returncode == 130, stderr
    assert "Traceback" not in stderr
    assert "stopped" in stderr
    assert "--resume --run r --checkpoint-dir ck" in stderr, f"the message should say how to continue: {stderr!r}"
    run = tmp_path / "ck" / "r"
    state = json.loads((run / "state.json").read_text())
    assert state["finished"] is None
    assert (state["epoch"], state["batch"]) >= (1, 0)  # at least the first epoch was kept
    assert (run / state["last_weights"]).is_file() and (run / state["optimizer"]).is_file()

    resume_args = ["train", "--resume", "--run", "r", "--checkpoint-dir", "ck", "--device", "cpu", "--epochs", "2"]
    proc2 = run_textgen([*resume_args, "--time-budget", "10m"], cwd=tmp_path)
    assert proc2.returncode == 0, proc2.stderr
    assert re.search(r"resuming at epoch 2, [\d.ms]+ trained of its 10m00s", proc2.stdout), proc2.stdout
    assert "done" in proc2.stdout
    assert [row["epoch"] for row in read_history(run)] == [0, 1]
    assert json.loads((run / "state.json").read_text())["finished"] == "epochs"


def find_on_corpus_path(name: str) -> Path | None:
    for directory in os.environ.get("TEXTGEN_CORPUS_PATH", "").split(os.pathsep):
        if directory and (Path(directory) / name).is_file():
            return Path(directory) / name
    return None


def test_war_and_peace_with_a_time_budget(tmp_path: Path) -> None:
    found = find_on_corpus_path("2600-0.txt")
    if found is None:
        pytest.skip("2600-0.txt is not in any directory of $TEXTGEN_CORPUS_PATH")
    args = ["train", "2600-0.txt", "--device", "cpu", "--time-budget", "8s", "--units", "64", "--anneal", "0.5"]
    corpus_path = str(found.parent.resolve())  # $TEXTGEN_CORPUS_PATH may be relative to this directory
    proc = run_textgen(
        [*args, "--checkpoint-dir", "ck", "--run", "wp"], cwd=tmp_path, timeout=300, TEXTGEN_CORPUS_PATH=corpus_path
    )
    assert proc.returncode == 0, proc.stderr
    assert "done (time budget spent)" in proc.stdout
    assert "bits/char" in proc.stdout
    assert (tmp_path / "ck" / "wp" / "best.weights.h5").is_file()
    config = json.loads((tmp_path / "ck" / "wp" / "config.json").read_text())
    assert config["data"]["strip_boilerplate"] is True
    assert config["model"]["units"] == 64 and config["training"]["anneal"] == 0.5


# --- many files ---------------------------------------------------------------------------


@pytest.mark.slow  # ~31 s, three CLI processes; many files' own tests (test_data.py, test_corpus.py) stay by default
def test_a_directory_of_books_trains_then_samples_and_evaluates(workdir: Path) -> None:
    """A user's library: train on a directory of books, then sample and evaluate, as subprocesses."""
    for i in range(3):
        write_corpus(workdir / "library" / f"book{i}.txt", 2500, seed=i)
    (workdir / "library" / "notes.md").write_text("not a book", encoding="utf-8")
    trained = run_textgen(["train", "library", *TINY_FLAGS, "--epochs", "1", "--max-vocab", "20", "--json"], workdir)
    assert trained.returncode == 0, trained.stderr
    done = json.loads(trained.stdout.splitlines()[-1])
    assert done["run"] == "library" and done["documents"] == 3
    assert done["unknown_chars"] > 0  # the random words use more than 20 distinct characters
    config = json.loads((workdir / "checkpoints" / "library" / "config.json").read_text())
    assert [Path(f).name for f in config["data"]["files"]] == ["book0.txt", "book1.txt", "book2.txt"]
    assert config["data"]["max_vocab"] == 20
    sampled = run_textgen(["sample", "--length", "50", "--seed", "1", "--last"], workdir)
    assert sampled.returncode == 0, sampled.stderr
    evaluated = run_textgen(["evaluate", "--split", "val", "--json", "--last"], workdir)
    assert evaluated.returncode == 0, evaluated.stderr
    assert "3 files" in json.loads(evaluated.stdout)["source"]
    # the second run on the same books opens the encoded corpus in the cache
    entries = list((workdir / "checkpoints" / ".cache").iterdir())
    again = run_textgen(
        ["train", "library/", *TINY_FLAGS, "--epochs", "1", "--max-vocab", "20", "--run", "two"], workdir
    )
    assert again.returncode == 0, again.stderr
    assert list((workdir / "checkpoints" / ".cache").iterdir()) == entries


REFUSED_WITHOUT_TENSORFLOW = """
import sys
from textgen.cli import main
sys.argv = ["textgen", "train", "missing.txt", "--checkpoint-dir", "ck"]
try:
    main()
except SystemExit as exit:
    assert exit.code == 1, exit.code
assert "tensorflow" not in sys.modules, "TensorFlow was imported"
"""


def test_a_missing_corpus_is_refused_before_tensorflow_loads(tmp_path: Path) -> None:
    result = run_python(["-c", REFUSED_WITHOUT_TENSORFLOW], tmp_path)
    assert result.returncode == 0, result.stderr
    assert "corpus 'missing.txt' not found" in result.stderr


def test_a_small_text_trains_end_to_end_showing_samples_and_a_plus_budget_adds_time(tmp_path: Path) -> None:
    """A text too small for the default 64 x 100 batch trains with a layout that fits, says so, shows what the model
    writes after each epoch; a resume with --time-budget +N trains N more seconds than the run has."""
    (tmp_path / "small.txt").write_text(make_text(2200)[:10_000], encoding="utf-8")
    model = ["--device", "cpu", "--units", "32", "--embedding-dim", "8", "--checkpoint-dir", "X", "--run", "s"]
    proc = run_textgen(["train", "small.txt", *model, "--epochs", "2"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (
        "layout    a small text (10,000 characters): batches of 4 streams x 100 characters, not 64 x 100" in proc.stdout
    )
    samples = [line for line in proc.stdout.splitlines() if line.startswith("  | ")]
    assert len(samples) >= 2  # after each of the two epochs, a line or more
    assert "loss curves: X/s/loss_curve.svg" in proc.stdout

    run = tmp_path / "X" / "s"
    trained = json.loads((run / "state.json").read_text())["seconds"]
    more = run_textgen(["train", "--resume", "--run", "s", "--checkpoint-dir", "X", "--epochs", "3",
                        "--time-budget", "+20s", "--sample-every", "0", "--json"], cwd=tmp_path)  # fmt: skip
    assert more.returncode == 0, more.stderr
    assert json.loads((run / "config.json").read_text())["training"]["time_budget"] == pytest.approx(trained + 20)
    records = [json.loads(line) for line in more.stdout.splitlines()]
    epochs = [r for r in records if r["event"] == "epoch"]
    assert epochs and all(r["sample"] is None for r in epochs)  # --sample-every 0
