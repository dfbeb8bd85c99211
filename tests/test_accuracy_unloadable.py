"""The accuracy harness says where a measured deployment, as its CSV states it, is one the engine
refuses to load (so the run cannot have used it as stated), and prices it as stated."""
from __future__ import annotations

from types import SimpleNamespace

import jaxprice as jp
from jaxprice._src.accuracy import _unloadable_notes


def test_a_layout_the_engine_refuses_to_load_is_named_in_the_notes():
    """MiniMax-M2.5's block-wise FP8 experts (128 x 128 blocks, intermediate 1536) at tp 8 without
    expert parallelism are 192 wide a GPU: vLLM refuses to load them (the dev set's
    minimax-m2.5-h200-fp8-vllm-tp8 states that layout); at tp 4 they are 384 wide, three blocks."""
    tp8 = SimpleNamespace(name="mm-tp8", deployment=jp.load_deployment("minimax-m2.5-h200-fp8-vllm-tp8"))
    tp4 = SimpleNamespace(name="mm-tp4", deployment=jp.load_deployment("minimax-m2.5-h200-fp8-vllm-tp4"))
    notes = _unloadable_notes([tp8, tp4])
    assert len(notes) == 1 and notes[0].startswith("mm-tp8: tp 8, dp 1, expert parallelism off as stated")
    assert "192 per GPU (1536 / 8)" in notes[0] and "priced as stated" in notes[0]


def test_the_note_names_the_engine_of_the_point():
    """The same layout measured on SGLang is SGLang's refusal, not vLLM's."""
    group = SimpleNamespace(name="mm-tp8", index=[0], deployment=jp.load_deployment("minimax-m2.5-h200-fp8-vllm-tp8"))
    note, = _unloadable_notes([group], [SimpleNamespace(engine="sglang")])
    assert "SGLang refuses to load it" in note and "vLLM" not in note
