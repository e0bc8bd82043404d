"""A tiny random-weight multimodal projector ("mmproj") GGUF, for fast image tests.

llama.cpp reads images through libmtmd, which loads a second GGUF next to the text model:
a vision encoder plus a projector that maps the encoder's features into the text model's
embedding space. :func:`write_tiny_projector` writes a very small one (about 170 KB with
the defaults), so tests can tokenize and evaluate an image with the tiny text models of
:mod:`engine.bench.random_models` in well under a second.

The file is a LLaVA-style projector (``clip.projector_type = "mlp"``), the plainest kind
``tools/mtmd/clip.cpp`` knows:

* a CLIP-like ViT: a ``patch_size`` convolution over the RGB image (``v.patch_embd``),
  learned position embeddings, a pre-layer-norm and ``n_block`` pre-norm transformer
  blocks (``v.blk.N.*``: layer norms, Q/K/V/output projections with biases, a two-layer
  feed-forward with CLIP's quick GELU);
* the projector itself: ``mm.0`` (``width`` to ``n_embd_text``), GELU, ``mm.2``
  (``n_embd_text`` to ``n_embd_text``).

An image is resized to ``image_size`` square and becomes ``(image_size // patch_size) ** 2``
embeddings of width ``n_embd_text``: 4 with the defaults. libmtmd refuses a projector
whose ``mm.2`` output width is not the text model's ``n_embd``, so ``n_embd_text`` must
match the model it goes with. Like LLaVA, clip.cpp takes the features of the second-to-last
block, so the last block is stored (clip.cpp requires its tensors) but never run: with
``n_block=1`` the file still loads and encodes, but the encoder is no more than the patch
and position embeddings, hence the default of 2.

Weights are float32 random numbers from a seeded numpy generator (the same arguments give
byte-identical files), scaled like the text models' so activations stay in a sane range;
norms are ones and biases zeros.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from pathlib import Path

import gguf
import numpy as np
import numpy.typing as npt

from engine.bench.random_models import gguf_written

logger = logging.getLogger(__name__)

__all__ = ["write_tiny_projector"]

_PROJECTOR_TYPE = "mlp"  # clip.cpp's PROJECTOR_TYPE_MLP (LLaVA 1.5)
_N_HEAD = 4
_LAYER_NORM_EPS = 1e-5
_N_CHANNELS = 3
# CLIP's own normalization, as LLaVA's mmproj files carry it.
_IMAGE_MEAN = (0.48145466, 0.4578275, 0.40821073)
_IMAGE_STD = (0.26862954, 0.26130258, 0.27577711)


class _ProjectorTensors:
    """Seeded float32 tensors under clip.cpp's names, shapes given in ggml order."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.tensors: dict[str, npt.NDArray[np.float32]] = {}

    def normal(self, name: str, shape: Sequence[int], std: float) -> None:
        """Gaussian values for a tensor of ggml ``shape`` (stored reversed, as numpy has it)."""
        values = self.rng.standard_normal(tuple(reversed(shape)), dtype=np.float32)
        values *= np.float32(std)
        self.tensors[name] = values

    def full(self, name: str, n: int, value: float) -> None:
        self.tensors[name] = np.full(n, value, dtype=np.float32)

    def linear(self, prefix: str, n_in: int, n_out: int) -> None:
        """``prefix.weight`` (ggml ``{n_in, n_out}``) and a zero ``prefix.bias``."""
        self.normal(f"{prefix}.weight", (n_in, n_out), 1.0 / math.sqrt(n_in))
        self.full(f"{prefix}.bias", n_out, 0.0)

    def layer_norm(self, prefix: str, n: int) -> None:
        self.full(f"{prefix}.weight", n, 1.0)
        self.full(f"{prefix}.bias", n, 0.0)


def _build_tensors(
    *, n_embd_text: int, seed: int, n_block: int, width: int, n_ff: int, n_patches: int,
    patch_size: int,
) -> dict[str, npt.NDArray[np.float32]]:
    t = _ProjectorTensors(seed)
    # The patch convolution: kernel {patch, patch, channels, width}, one output per feature.
    fan_in = _N_CHANNELS * patch_size * patch_size
    t.normal("v.patch_embd.weight", (patch_size, patch_size, _N_CHANNELS, width),
             1.0 / math.sqrt(fan_in))
    t.full("v.patch_embd.bias", width, 0.0)
    # One row per patch; clip.cpp picks rows 0..n_patches-1 (no class embedding here).
    t.normal("v.position_embd.weight", (width, n_patches), 0.02)
    t.layer_norm("v.pre_ln", width)
    for bid in range(n_block):
        blk = f"v.blk.{bid}"
        t.layer_norm(f"{blk}.ln1", width)
        for proj in ("attn_q", "attn_k", "attn_v", "attn_out"):
            t.linear(f"{blk}.{proj}", width, width)
        t.layer_norm(f"{blk}.ln2", width)
        # clip.cpp swaps up and down when ffn_down's input width is the model width (old
        # conversions named them the wrong way round), so n_ff must differ from width.
        t.linear(f"{blk}.ffn_up", width, n_ff)
        t.linear(f"{blk}.ffn_down", n_ff, width)
    # The LLaVA projector: mm.0, GELU, mm.2, whose output rows are the text model's width.
    t.linear("mm.0", width, n_embd_text)
    t.linear("mm.2", n_embd_text, n_embd_text)
    return t.tensors


def write_tiny_projector(
    out_path: Path,
    *,
    n_embd_text: int = 64,
    seed: int = 0,
    n_block: int = 2,
    width: int = 32,
    image_size: int = 28,
    patch_size: int = 14,
) -> Path:
    """Write a tiny random-weight LLaVA-style mmproj GGUF to ``out_path`` and return the path.

    Args:
        out_path: Destination file; written atomically, parent folders are created.
        n_embd_text: The embedding width of the text model it goes with (64 for the tiny
            models); libmtmd refuses a projector whose output width differs.
        seed: Seed for the weights; the same arguments give byte-identical files.
        n_block: Vision transformer blocks; the last one is stored but never run.
        width: The vision encoder's width; a multiple of 4 (its attention heads).
        image_size: The square size every image is resized to.
        patch_size: The patch side; ``image_size`` must be a multiple of it. An image
            becomes ``(image_size // patch_size) ** 2`` embeddings.
    """
    if n_embd_text < 1:
        raise ValueError(f"n_embd_text must be positive, got {n_embd_text}")
    if n_block < 1:
        raise ValueError(f"n_block must be positive, got {n_block}")
    if width < _N_HEAD or width % _N_HEAD:
        raise ValueError(f"width must be a positive multiple of {_N_HEAD}, got {width}")
    if patch_size < 1 or image_size < patch_size or image_size % patch_size:
        raise ValueError(f"image_size ({image_size}) must be a positive multiple of "
                         f"patch_size ({patch_size})")
    n_ff = 2 * width
    n_patches = (image_size // patch_size) ** 2

    started = time.perf_counter()
    out_path = Path(out_path)
    with gguf_written(out_path, gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.MMPROJ]) as writer:
        writer.add_name(f"arbor-tiny-mmproj-{n_block}x{width}-to-{n_embd_text}")
        writer.add_file_type(gguf.LlamaFileType.ALL_F32)
        writer.add_clip_has_vision_encoder(True)
        writer.add_clip_projector_type(_PROJECTOR_TYPE)
        writer.add_vision_embedding_length(width)
        writer.add_vision_feed_forward_length(n_ff)
        writer.add_vision_block_count(n_block)
        writer.add_vision_head_count(_N_HEAD)
        writer.add_vision_attention_layernorm_eps(_LAYER_NORM_EPS)
        writer.add_vision_projection_dim(n_embd_text)
        writer.add_vision_image_size(image_size)
        writer.add_vision_patch_size(patch_size)
        writer.add_vision_image_mean(list(_IMAGE_MEAN))
        writer.add_vision_image_std(list(_IMAGE_STD))
        writer.add_vision_use_gelu(False)  # CLIP's quick GELU in the encoder's FFN
        tensors = _build_tensors(n_embd_text=n_embd_text, seed=seed, n_block=n_block,
                                 width=width, n_ff=n_ff, n_patches=n_patches,
                                 patch_size=patch_size)
        for name, array in tensors.items():
            writer.add_tensor(name, np.ascontiguousarray(array))
    logger.info(
        "wrote %s (mmproj %s, %d blocks, width %d, %d tokens per image, n_embd %d, %.0f KB) "
        "in %.2f s",
        out_path,
        _PROJECTOR_TYPE,
        n_block,
        width,
        n_patches,
        n_embd_text,
        out_path.stat().st_size / 1e3,
        time.perf_counter() - started,
    )
    return out_path
