"""The base model in the package (``base:en``): found by its name wherever a run is, used when there is no run, its
files checked, fine-tuned from with its vocabulary extended, and never taken for a run. The package's own export is
stood in for by a tiny run's LiteRT float16 export."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from helpers import TINY_DATA, assert_one_line_error, invoke, plan_run, write_corpus

from textgen import basemodel
from textgen.basemodel import BASE_CHARS, BASE_NAME
from textgen.settings import DataSettings, InitSettings


@pytest.fixture(scope="module")
def base_export(trained_run, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's tiny run exported as the base model ships: LiteRT float16."""
    from textgen import api

    path = tmp_path_factory.mktemp("package") / "base" / "en"
    api.export(
        checkpoint_dir=trained_run.checkpoint_dir, run_name="tiny", format="litert", quantize="float16", path=path
    )
    return path


@pytest.fixture
def packaged(base_export: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the base export put where the package's would be (a test may damage it)."""
    copy = tmp_path / "site-packages" / "textgen" / "base" / "en"
    shutil.copytree(base_export, copy)
    monkeypatch.setattr(basemodel, "base_dir", lambda: copy)
    return copy


def sample_json(*args: str) -> tuple[list[dict], str]:
    result = invoke("sample", "--json", "--length", "40", "--seed", "3", *args)
    assert result.exit_code == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()], result.stderr


def test_with_no_run_sample_uses_the_base_model_and_says_so(packaged: Path, tmp_path: Path) -> None:
    empty = tmp_path / "checkpoints"
    records, stderr = sample_json("--checkpoint-dir", str(empty))
    assert records[0]["model"] == BASE_NAME
    assert f"no trained run in {empty}/: using the base model {BASE_NAME}" in stderr
    assert f"--init-from {BASE_NAME}" in stderr
    same, _ = sample_json("--model", str(packaged))  # the same export, named by its path
    assert records[0]["text"] == same[0]["text"]


def test_with_runs_the_latest_is_used_and_base_en_names_the_base(packaged: Path, trained_run) -> None:
    where = ("--checkpoint-dir", str(trained_run.checkpoint_dir))
    latest, stderr = sample_json(*where)
    assert latest[0]["run"] == "tiny" and BASE_NAME not in stderr
    base, stderr = sample_json(*where, "--run", BASE_NAME)
    assert base[0]["model"] == BASE_NAME and "no trained run" not in stderr


def test_a_damaged_base_model_gets_one_line(packaged: Path, tmp_path: Path) -> None:
    network = packaged / "model.tflite"
    data = bytearray(network.read_bytes())
    data[len(data) // 2] ^= 0xFF
    network.write_bytes(bytes(data))
    result = invoke("sample", "--run", BASE_NAME, "--checkpoint-dir", str(tmp_path))
    assert_one_line_error(result, f"the packaged base model {BASE_NAME} is damaged", "reinstall textgen")
    (tmp_path / "site-packages" / ".git").mkdir()  # the package is a clone's (an editable install): git restores it
    result = invoke("sample", "--run", BASE_NAME, "--checkpoint-dir", str(tmp_path))
    clone = tmp_path / "site-packages"
    assert_one_line_error(result, "is damaged", f"restore it: git -C {clone} checkout -- textgen/base/en")


def test_an_installation_without_the_base_model_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(basemodel, "base_dir", lambda: tmp_path / "missing")
    result = invoke("sample", "--run", BASE_NAME, "--checkpoint-dir", str(tmp_path))
    assert_one_line_error(result, "this installation of textgen has no base model")
    result = invoke("sample", "--checkpoint-dir", str(tmp_path / "checkpoints"))  # no run, no base: as before
    assert_one_line_error(result, "no trained run in")


def test_its_name_is_no_run_s_name(packaged: Path, tmp_path: Path) -> None:
    corpus = write_corpus(tmp_path / "tiny.txt", 300)
    result = invoke("train", str(corpus), "--run", BASE_NAME, "--checkpoint-dir", str(tmp_path), "--epochs", "1")
    assert_one_line_error(result, "--run must be 1 to 100 letters")
    # A directory of that name in the checkpoint directory (made by hand) is not what --run base:en opens.
    (tmp_path / BASE_NAME).mkdir()
    (tmp_path / BASE_NAME / "config.json").write_text("{}", encoding="utf-8")
    records, _ = sample_json("--checkpoint-dir", str(tmp_path), "--run", BASE_NAME)
    assert records[0]["model"] == BASE_NAME


def test_evaluate_scores_a_file_with_it(packaged: Path, trained_run, tmp_path: Path) -> None:
    result = invoke("evaluate", str(trained_run.corpus), "--run", BASE_NAME, "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["nats_per_char"] > 0
    assert_one_line_error(invoke("evaluate", "--run", BASE_NAME), f"{BASE_NAME} has no corpus splits")
    assert_one_line_error(invoke("evaluate", "--run", BASE_NAME, "--dynamic"), "--dynamic adapts a run's weights")


def test_sample_adapt_needs_a_run_and_says_how_to_make_one(packaged: Path, tmp_path: Path) -> None:
    prime = tmp_path / "doc.txt"
    prime.write_text("It was the best of times.\n", encoding="utf-8")
    empty = tmp_path / "no-runs"  # no run trained: sample falls back to the base model
    result = invoke("sample", "--checkpoint-dir", str(empty), "--prime-file", str(prime), "--adapt")
    assert_one_line_error(result, f"{BASE_NAME} is an export; drop --adapt, or fine-tune", "--init-from base:en")


def test_export_copies_it_and_refuses_what_needs_a_run(packaged: Path, tmp_path: Path) -> None:
    out = tmp_path / "exports" / "mine"
    result = invoke("export", "--run", BASE_NAME, "--format", "litert", "-o", str(out))
    assert result.exit_code == 0, result.stderr
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in packaged.iterdir())
    assert (out / "model.tflite").read_bytes() == (packaged / "model.tflite").read_bytes()
    records, _ = sample_json("--model", str(out))
    assert records[0]["text"] == sample_json("--run", BASE_NAME, "--checkpoint-dir", str(tmp_path))[0][0]["text"]
    result = invoke("export", "--run", BASE_NAME, "--format", "savedmodel", "-o", str(tmp_path / "sm"))
    assert_one_line_error(result, f"{BASE_NAME} ships as a litert float16 export", "--init-from base:en")


def test_a_small_text_trained_from_scratch_is_told_of_the_base(packaged: Path, tmp_path: Path) -> None:
    from textgen.device import CPU

    corpus = str(write_corpus(tmp_path / "small.txt", 3000))
    plan = plan_run(corpus, CPU, checkpoint_dir=tmp_path / "c1", data=DataSettings(**TINY_DATA))
    assert plan.base_hint is not None and f"--init-from {BASE_NAME} --time-budget 2m" in plan.base_hint
    assert "small.txt" in plan.base_hint
    plan.lock.release()
    init = InitSettings(BASE_NAME)
    plan = plan_run(corpus, CPU, checkpoint_dir=tmp_path / "c2", data=DataSettings(**TINY_DATA), init_from=init)
    assert plan.base_hint is None
    plan.lock.release()


@pytest.mark.slow
def test_fine_tuning_from_it_extends_its_vocabulary(packaged: Path, tmp_path: Path) -> None:
    """A text with a character the base lacks: the run keeps the base's ids and adds the new one."""
    from textgen.artifact import ArtifactInfo
    from textgen.checkpoint import Run

    corpus = tmp_path / "new.txt"
    corpus.write_text(write_corpus(tmp_path / "w.txt", 400).read_text(encoding="utf-8") + "§ § §\n", encoding="utf-8")
    checkpoints = tmp_path / "checkpoints"
    result = invoke(
        "train", str(corpus), "--init-from", BASE_NAME, "--checkpoint-dir", str(checkpoints), "--epochs", "1",
        "--batch-size", "4", "--seq-len", "16", "--sample-every", "0",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    run = Run(checkpoints / "new")
    base_chars = ArtifactInfo.read(packaged).vocab.chars
    chars = run.load_vocab().chars
    assert chars[: len(base_chars)] == base_chars and "§" in chars[len(base_chars) :]
    assert run.load_config().init_from.name == BASE_NAME  # type: ignore[union-attr]


def test_the_served_card_labels_it_the_base_model(packaged: Path) -> None:
    from textgen.artifact import ArtifactInfo
    from textgen.server import card_of_export

    card = card_of_export(BASE_NAME, ArtifactInfo.read(packaged), base=True)
    assert card.model == BASE_NAME and card.training["base_model"] is True
    assert "base_model" not in card_of_export("other", ArtifactInfo.read(packaged)).training


def test_its_vocabulary_covers_english_text() -> None:
    assert len(set(BASE_CHARS)) == len(BASE_CHARS)
    for text in ("Hello, world! 42 ~ {x}", "café naïve Æsop façade", "“Quoted” — ‘single’ … it’s", "\u00a0\t\n"):
        assert set(text) <= set(BASE_CHARS), text


def test_the_packaged_base_model_is_checked_and_writes_english(tmp_path: Path) -> None:
    """The model the package ships (not a stand-in): its files match their manifest, its vocabulary starts with
    what users' text holds, and with no run trained, ``textgen sample`` writes English words with it."""
    from textgen.artifact import ArtifactInfo

    info = ArtifactInfo.read(basemodel.base_dir())  # checksums verified, or one line naming the damage
    assert (info.format, info.quantize) == ("litert", "float16")
    assert "".join(info.vocab.chars).startswith(BASE_CHARS)
    records, stderr = sample_json("--checkpoint-dir", str(tmp_path / "checkpoints"), "--temp", "0.5", "--length", "400")
    assert records[0]["model"] == BASE_NAME and "using the base model" in stderr
    words = set(records[0]["text"].lower().split())
    assert len(words & {"the", "and", "of", "to", "a", "in", "he", "she", "was", "that", "his", "her", "it"}) >= 4
