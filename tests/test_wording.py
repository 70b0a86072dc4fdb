"""A run's numbers are worded one way: the serve page's JavaScript words them as textgen.results does."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from importlib import resources

import pytest

from textgen.results import epochs_done, lstm_shape

EPOCHS = [(0, 0), (1, 0), (5, 0), (0, 404), (1, 1), (12, 1089)]
SHAPES = [(1, 512), (3, 1024)]


@pytest.mark.skipif(shutil.which("node") is None, reason="runs the page's JavaScript with node")
def test_the_page_words_epochs_and_model_shapes_as_textgen_does() -> None:
    page = resources.files("textgen").joinpath("page.html").read_text(encoding="utf-8")
    helpers = [
        re.search(rf"^const {name} = .*?(?=\n(?:const |//|\n))", page, re.MULTILINE | re.DOTALL)
        for name in ("fmtNum", "fmtEpochs", "fmtShape")
    ]
    assert all(helpers), "the page's formatting helpers moved"
    script = "\n".join(m.group(0) for m in helpers if m) + (
        f"\nconsole.log(JSON.stringify([{json.dumps(EPOCHS)}.map(([e, b]) => fmtEpochs(e, b)), "
        f"{json.dumps(SHAPES)}.map(([l, u]) => fmtShape(l, u))]));"
    )
    done = subprocess.run(["node", "-e", script], capture_output=True, text=True, timeout=60, check=True)
    assert json.loads(done.stdout) == [[epochs_done(*e) for e in EPOCHS], [lstm_shape(*s) for s in SHAPES]]
