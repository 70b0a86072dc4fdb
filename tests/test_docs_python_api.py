"""docs/python-api.md's examples run as written: its ```python blocks, in order, in one namespace, in an empty
directory (so the page cannot silently rot). A tiny model: about 20 s on 2 cores, TensorFlow's import included."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

PAGE = Path(__file__).resolve().parent.parent / "docs" / "python-api.md"
BLOCK = re.compile(r"^```python\n(.*?)^```$", re.DOTALL | re.MULTILINE)


def code_blocks(text: str) -> list[str]:
    """The page's ```python blocks, in order."""
    return BLOCK.findall(text)


def test_the_page_has_its_examples() -> None:
    blocks = code_blocks(PAGE.read_text(encoding="utf-8"))
    assert len(blocks) >= 8
    joined = "\n".join(blocks)
    for call in ("api.train(", "api.runs(", "api.open_generator(", "api.evaluate(", "api.export(", "resume=True"):
        assert call in joined, call


@pytest.mark.slow  # ~22 s: the page's examples, trained and run end to end
def test_the_pages_examples_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)  # the page writes tiny.txt, checkpoints/ and exports/ in the working directory
    monkeypatch.delenv("TEXTGEN_CACHE_DIR", raising=False)  # the encoded corpus stays under checkpoints/
    namespace: dict[str, Any] = {"__name__": "python_api_page"}
    for number, block in enumerate(code_blocks(PAGE.read_text(encoding="utf-8")), start=1):
        exec(compile(block, f"{PAGE.name}, python block {number}", "exec"), namespace)
    out = capsys.readouterr().out

    result, resumed = namespace["result"], namespace["resumed"]
    assert (result.run, result.epochs, result.stop_reason.value) == ("tiny", 3, "epochs")
    assert Path(result.path).resolve() == (tmp_path / "checkpoints" / "tiny").resolve()
    assert (resumed.run, resumed.epochs) == ("tiny", 4)
    assert [line.split(":")[0] for line in out.splitlines() if line.startswith("epoch ")] == [
        f"epoch {n}" for n in (1, 2, 3, 4)
    ]  # the progress callback's epoch_end, three epochs and one resumed
    assert len(namespace["progress"].losses) > 3  # batch_end, every batch

    texts = namespace["texts"]
    assert len(texts) == 3 and all(len(text) == 60 for text in texts)
    assert texts[0] != texts[2]  # the same prompt in two rows: two samples
    assert len("".join(piece.texts[0] for piece in namespace["pieces"])) == 80
    assert namespace["evaluation"].chars > 0
    assert (tmp_path / "exports" / "tiny-int8" / "model.tflite").is_file()
    assert "ModelSource(name='tiny', weights='best')" in out
    assert "CheckpointError no run 'no-such-run'" in out
