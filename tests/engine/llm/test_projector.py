"""The tiny random projector (engine/bench/random_projector.py) on real libmtmd.

For every memory kind, the tiny text model and a projector of its width load together, a
28x28 image becomes one chunk of 4 image tokens, and the whole prompt (text, image, text)
evaluates into the model's memory. A projector of another width is refused when libmtmd
loads it (mtmd_init_from_file returns NULL), before any image is encoded.

These tests drive llama_cpp's low-level bindings directly; only the backend loading goes
through engine.llm.llama (a portable build's CPU library is loaded by hand).
"""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest

from engine.bench.random_projector import write_tiny_projector
from engine.core.memory import MemoryKind
from tests.conftest import ALL_KINDS

N_EMBD_TEXT = 64  # the tiny models' width
WRONG_N_EMBD_TEXT = 48
IMAGE_SIDE = 28
IMAGE_TOKENS = (IMAGE_SIDE // 14) ** 2  # patch size 14: a 2x2 grid
N_CTX = 512


@pytest.fixture(scope="module")
def projectors(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    """A projector for the tiny models' width, and one for a width they do not have."""
    out = tmp_path_factory.mktemp("projectors")
    return {
        width: write_tiny_projector(out / f"mmproj-{width}.gguf", n_embd_text=width)
        for width in (N_EMBD_TEXT, WRONG_N_EMBD_TEXT)
    }


@contextlib.contextmanager
def _text_model(path: Path) -> Iterator[tuple[Any, Any]]:
    """The tiny model and a context of N_CTX on it, freed on the way out."""
    from engine.llm.llama import init_backend

    init_backend()
    import llama_cpp.llama_cpp as lc

    with contextlib.ExitStack() as stack:
        model_params = lc.llama_model_default_params()
        model_params.n_gpu_layers = 0
        model = lc.llama_model_load_from_file(str(path).encode(), model_params)
        assert model, f"llama.cpp could not load {path}"
        stack.callback(lc.llama_model_free, model)
        assert lc.llama_model_n_embd_inp(model) == N_EMBD_TEXT
        ctx_params = lc.llama_context_default_params()
        ctx_params.n_ctx = N_CTX
        ctx_params.n_batch = N_CTX
        ctx_params.n_threads = 1
        ctx_params.n_threads_batch = 1
        ctx = lc.llama_init_from_model(model, ctx_params)
        assert ctx, "llama.cpp could not make a context"
        stack.callback(lc.llama_free, ctx)
        yield model, ctx


def _mtmd_params() -> Any:
    import llama_cpp.mtmd_cpp as mtmd

    params = mtmd.mtmd_context_params_default()
    params.use_gpu = False
    params.n_threads = 1
    return params


def test_the_projector_is_a_llava_mlp_whose_output_is_the_text_width(tmp_path: Path) -> None:
    path = write_tiny_projector(tmp_path / "mmproj.gguf", n_embd_text=N_EMBD_TEXT)
    reader = gguf.GGUFReader(path)
    field = reader.fields[gguf.Keys.Clip.PROJECTOR_TYPE]
    assert bytes(field.parts[field.data[0]]).decode() == "mlp"
    shapes = {t.name: tuple(int(n) for n in t.shape) for t in reader.tensors}  # ggml order
    assert shapes["mm.2.weight"] == (N_EMBD_TEXT, N_EMBD_TEXT)  # {n_in, rows = n_embd}
    assert shapes["v.patch_embd.weight"] == (14, 14, 3, 32)
    assert shapes["v.position_embd.weight"] == (32, IMAGE_TOKENS)
    assert {f"v.blk.{b}.ffn_down.weight" for b in range(2)} <= shapes.keys()
    again = write_tiny_projector(tmp_path / "again.gguf", n_embd_text=N_EMBD_TEXT)
    assert again.read_bytes() == path.read_bytes()  # seeded: byte for byte the same


@pytest.mark.parametrize("kind", ALL_KINDS, ids=lambda k: k.value)
def test_an_image_becomes_four_tokens_and_evaluates_into_every_memory_kind(
    kind: MemoryKind,
    tiny_models: dict[str, Path],
    projectors: dict[int, Path],
    record_property: Callable[[str, object], None],
) -> None:
    import llama_cpp.llama_cpp as lc
    import llama_cpp.mtmd_cpp as mtmd

    with _text_model(tiny_models[kind.value]) as (model, ctx), contextlib.ExitStack() as stack:
        mctx = mtmd.mtmd_init_from_file(str(projectors[N_EMBD_TEXT]).encode(), model,
                                        _mtmd_params())
        assert mctx, "libmtmd refused the projector"
        stack.callback(mtmd.mtmd_free, mctx)
        assert mtmd.mtmd_support_vision(mctx)

        pixels = np.random.default_rng(0).integers(0, 256, IMAGE_SIDE * IMAGE_SIDE * 3,
                                                   dtype=np.uint8)
        data = (ctypes.c_uint8 * pixels.size).from_buffer_copy(pixels.tobytes())
        bitmap = mtmd.mtmd_bitmap_init(IMAGE_SIDE, IMAGE_SIDE, data)
        assert bitmap
        stack.callback(mtmd.mtmd_bitmap_free, bitmap)

        chunks = mtmd.mtmd_input_chunks_init()
        assert chunks
        stack.callback(mtmd.mtmd_input_chunks_free, chunks)
        prompt = b"Look: " + mtmd.mtmd_default_marker() + b" What is in the picture?"
        text = mtmd.mtmd_input_text(text=prompt, text_len=len(prompt), add_special=True,
                                    parse_special=True)
        bitmaps = (mtmd.mtmd_bitmap_p_ctypes * 1)(bitmap)
        assert mtmd.mtmd_tokenize(mctx, chunks, ctypes.byref(text), bitmaps, 1) == 0

        found = []
        for i in range(mtmd.mtmd_input_chunks_size(chunks)):
            chunk = mtmd.mtmd_input_chunks_get(chunks, i)
            found.append((mtmd.mtmd_input_chunk_get_type(chunk),
                          mtmd.mtmd_input_chunk_get_n_tokens(chunk),
                          mtmd.mtmd_input_chunk_get_n_pos(chunk)))
        types = [t for t, _, _ in found]
        assert types == [mtmd.MTMD_INPUT_CHUNK_TYPE_TEXT, mtmd.MTMD_INPUT_CHUNK_TYPE_IMAGE,
                         mtmd.MTMD_INPUT_CHUNK_TYPE_TEXT]
        (_, image_tokens, image_pos), = (c for c in found if c[0] == types[1])
        assert image_tokens == IMAGE_TOKENS
        assert image_pos == IMAGE_TOKENS  # a plain LLaVA image: one position per token
        n_pos = sum(pos for _, _, pos in found)
        assert n_pos == mtmd.mtmd_helper_get_n_pos(chunks)

        new_n_past = lc.llama_pos(0)
        assert mtmd.mtmd_helper_eval_chunks(mctx, ctx, chunks, 0, 0, N_CTX, True,
                                            ctypes.byref(new_n_past)) == 0
        n_past = new_n_past.value
        assert n_past == n_pos
        assert lc.llama_memory_seq_pos_max(lc.llama_get_memory(ctx), 0) == n_past - 1
        n_vocab = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(model))
        logits = np.ctypeslib.as_array(lc.llama_get_logits_ith(ctx, -1), shape=(n_vocab,))
        assert np.isfinite(logits).all()

        record_property("chunks", found)
        record_property("n_past", n_past)
        print(f"{kind.value}: chunks (type, n_tokens, n_pos) {found}, n_past {n_past}")


@pytest.mark.parametrize("kind", ALL_KINDS, ids=lambda k: k.value)
def test_a_projector_of_another_width_is_refused_when_it_loads(
    kind: MemoryKind, tiny_models: dict[str, Path], projectors: dict[int, Path]
) -> None:
    """mtmd_init_from_file compares the projector's output width (mm.2's rows) with the
    text model's n_embd and fails cleanly (NULL, an error in the log) on a mismatch: the
    process lives on and no image is ever encoded with it."""
    import llama_cpp.mtmd_cpp as mtmd

    with _text_model(tiny_models[kind.value]) as (model, _ctx):
        mctx = mtmd.mtmd_init_from_file(str(projectors[WRONG_N_EMBD_TEXT]).encode(), model,
                                        _mtmd_params())
        if mctx:
            mtmd.mtmd_free(mctx)
        assert not mctx
