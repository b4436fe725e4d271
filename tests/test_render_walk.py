"""tools/render_walk.py: the walk of one bridged turn, as the closing notes quote it.

Guards the prompt side's structure: the renderer hands the turn to the bridge, the bridge to the
template context, and one turn's code stays within a few files. A refactor that spreads a turn
over more files, or sends the reader back and forth more, fails here and must say why.

The limits, and why they moved: 8 files, 16 functions opened, 40 returns until a turn's token
starts came from the tokens' byte lengths (``_tokenizer/token_starts.py``, a module of its own
because its soundness argument is a page): one more file, three calls into it from the
vocabulary and one search per span end from the bridge (19-20 opened, 44-46 returns).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from protocol_adapters import Renderer, RendererConfig, Vocabulary, qwen3_template

TOOL = Path(__file__).resolve().parent.parent / "tools" / "render_walk.py"


def render_walk() -> ModuleType:
    spec = importlib.util.spec_from_file_location("render_walk", TOOL)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["render_walk"] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


def test_one_bridged_turn_stays_in_the_prompt_sides_rooms(qwen_vocabulary: Vocabulary) -> None:
    tool = render_walk()
    for rate in (0.0, 1.0):
        renderer = Renderer(qwen_vocabulary, qwen3_template(), RendererConfig(rate, seed=0))
        tree, prompt = tool.session(renderer, qwen_vocabulary)
        walk = tool.trace(renderer, tree, prompt)
        assert walk.files[:3] == [
            "_bridge/renderer.py",
            "_bridge/bridge.py",
            "_template/context.py",
        ]
        rooms = {file.split("/")[0] for file in walk.files}
        assert rooms <= {"_bridge", "_template", "_tokenizer"}, walk.files
        assert len(walk.files) <= 9, walk.files
        assert walk.opened <= 21, walk.opened
        assert walk.returns <= 50, walk.returns
