"""A thin, typed layer over llama.cpp's C API (through llama-cpp-python's ctypes bindings).

Arbor talks to the low-level API directly: the high-level `Llama` class hides the memory
calls and state blobs that checkpoints need, and its cache logic trusts `seq_rm`, which reports
success on a sliding-window cache it emptied (docs/architecture.md, "llama.cpp facts the code
relies on").
Everything here must be called from one thread: the one that owns the runtime.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import llama_cpp as lc
import numpy as np

from engine.config.endpoints import parse_endpoint
from engine.config.params import KV_TYPE_NAMES, ContextParams, FlashAttention, SamplingParams
from engine.core.errors import DecodeError, ModelLoadError, UnsupportedRequest
from engine.core.memory import MemoryKind
from engine.llm import backends, rpc
from engine.llm.cpu import physical_cores
from engine.models.files import read_model_info
from engine.models.fit import GpuMemory

log = logging.getLogger(__name__)
native_log = logging.getLogger("llama.cpp")

SEQ = 0  # Arbor uses one sequence per context.

KV_TYPES: dict[str, int] = {  # keyed by engine.config.params.KV_TYPE_NAMES
    "f32": lc.GGML_TYPE_F32,
    "f16": lc.GGML_TYPE_F16,
    "q8_0": lc.GGML_TYPE_Q8_0,
    "q4_0": lc.GGML_TYPE_Q4_0,
}
assert tuple(KV_TYPES) == KV_TYPE_NAMES

_NO_ABORT = lc.ggml_abort_callback(0)  # a NULL callback
_ABORT_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)
_PROGRESS_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_float, ctypes.c_void_p)  # int: see below
_init_lock = threading.Lock()
_initialised = False


@lc.llama_log_callback
def _on_native_log(level: int, text: bytes | None, _user_data: ctypes.c_void_p) -> None:
    if not text:
        return
    message = text.decode("utf-8", errors="replace").rstrip("\n")
    if not message.strip(". "):
        return  # progress dots
    # GGML_LOG_LEVEL: 1 debug, 2 info, 3 warn, 4 error, 5 continuation
    if level == 4:
        native_log.error(message)
    elif level == 3:
        native_log.warning(message)
    else:
        native_log.debug(message)


def init_backend() -> None:
    """Initialise llama.cpp once per process and route its log into `logging`."""
    global _initialised
    with _init_lock:
        if _initialised:
            return
        lc.llama_log_set(_on_native_log, ctypes.c_void_p(0))
        backends.load()  # a portable build's CPU, GPU and RPC libraries
        lc.llama_backend_init()
        _initialised = True


def native_backends() -> backends.Backends:
    """What llama.cpp runs on in this process (loaded on first use)."""
    init_backend()
    return backends.load()


def supports_gpu_offload() -> bool:
    """Whether this machine has a GPU this build can use. (llama.cpp's own
    `llama_supports_gpu_offload` is also true for a build with the RPC backend.)"""
    return bool(gpu_devices())


def system_info() -> str:
    init_backend()
    return lc.llama_print_system_info().decode("utf-8", errors="replace")


def gpu_backend_name() -> str | None:
    """The GPU backend this llama.cpp build was compiled with, if any."""
    if not supports_gpu_offload():
        return None
    info = system_info().upper()
    for name in ("CUDA", "METAL", "VULKAN", "HIP", "SYCL"):
        if name in info:
            return name.capitalize() if name != "CUDA" else "CUDA"
    return "GPU"


# --- RPC workers -------------------------------------------------------------------------------

_DEVICE_GPU_TYPES = (1, 2)  # ggml_backend_dev_type: GPU, IGPU
_rpc_registered: dict[str, tuple[int, ...]] = {}  # endpoint -> its devices (process-wide)


def supports_rpc() -> bool:
    init_backend()
    return bool(lc.llama_supports_rpc())


def rpc_devices(endpoints: Sequence[str]) -> list[int]:
    """The devices of these workers, each registered once per process (llama.cpp cannot
    unregister one). The caller has probed them: llama.cpp aborts on one that is gone."""
    if endpoints and not supports_rpc():
        raise ModelLoadError("this llama.cpp build has no RPC backend (run `make`, which "
                             "builds it with RPC on)")
    devices: list[int] = []
    for endpoint in endpoints:
        if endpoint not in _rpc_registered:
            ggml = backends.ggml()
            reg = ggml.ggml_backend_reg_by_name(b"RPC")
            address = ggml.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_rpc_add_server")
            if not reg or not address:
                raise ModelLoadError("llama.cpp's RPC backend is missing its add_server call")
            add_server = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)(address)
            server = add_server(endpoint.encode())
            if not server:
                raise ModelLoadError(f"llama.cpp refused the RPC worker {endpoint}")
            ggml.ggml_backend_register(server)
            _rpc_registered[endpoint] = tuple(
                ggml.ggml_backend_reg_dev_get(server, i)
                for i in range(ggml.ggml_backend_reg_dev_count(server)))
        devices.extend(_rpc_registered[endpoint])
    return devices


def gpu_devices() -> list[int]:
    """This machine's GPUs (none on a CPU build); RPC workers' devices are not among them."""
    init_backend()
    ggml = backends.ggml()
    remote = {dev for devices in _rpc_registered.values() for dev in devices}
    return [dev for dev in (ggml.ggml_backend_dev_get(i)
                            for i in range(ggml.ggml_backend_dev_count()))
            if ggml.ggml_backend_dev_type(dev) in _DEVICE_GPU_TYPES and dev not in remote]


def gpu_description() -> str | None:
    """The first GPU's name as its backend gives it (for the status bar), if there is one."""
    devices = gpu_devices()
    if not devices:
        return None
    raw = backends.ggml().ggml_backend_dev_description(devices[0])
    return raw.decode("utf-8", errors="replace").strip() if raw else None


def multimodal_marker() -> str:
    """Load libmtmd, llama.cpp's multimodal library (images through a model's projector), and
    give its default media marker; raises ModelLoadError when this build lacks it."""
    try:
        from llama_cpp import mtmd_cpp
    except (OSError, RuntimeError, FileNotFoundError) as exc:
        raise ModelLoadError(f"this build of llama.cpp has no multimodal library: {exc}"
                             ) from exc
    return bytes(mtmd_cpp.mtmd_default_marker()).decode("utf-8", errors="replace")


def builtin_template_names() -> list[str]:
    """The chat templates llama.cpp knows by name (`llama_chat_builtin_templates`)."""
    count = int(lc.llama_chat_builtin_templates(None, 0))
    names = (ctypes.c_char_p * max(count, 1))()
    count = int(lc.llama_chat_builtin_templates(names, count))
    return sorted(
        name.decode("utf-8", errors="replace") for name in names[:count] if name is not None
    )


def apply_builtin_template(
    name: str, messages: Sequence[dict[str, str]], *, add_generation_prompt: bool
) -> str:
    """Render `messages` with llama.cpp's built-in template `name`.

    Raises ValueError for a name llama.cpp does not know.
    """
    keep = [(m["role"].encode("utf-8"), m["content"].encode("utf-8")) for m in messages]
    chat = (lc.llama_chat_message * max(len(keep), 1))()
    for i, (role, content) in enumerate(keep):
        chat[i].role = role
        chat[i].content = content
    capacity = 256 + 2 * sum(len(role) + len(content) for role, content in keep)
    for _ in range(2):
        buf = ctypes.create_string_buffer(capacity)
        n = int(lc.llama_chat_apply_template(
            name.encode("utf-8"), chat, len(keep), add_generation_prompt, buf, capacity
        ))
        if n < 0:
            raise ValueError(f"llama.cpp has no built-in chat template named {name!r}")
        if n <= capacity:
            return buf.raw[:n].decode("utf-8", errors="replace")
        capacity = n + 1
    raise ValueError(f"llama.cpp's template {name!r} gave an output of changing length")


QUANT_FILE_TYPES: dict[str, int] = {
    "q8_0": lc.LLAMA_FTYPE_MOSTLY_Q8_0,
    "q4_0": lc.LLAMA_FTYPE_MOSTLY_Q4_0,
    "q4_1": lc.LLAMA_FTYPE_MOSTLY_Q4_1,
    "q4_k_m": lc.LLAMA_FTYPE_MOSTLY_Q4_K_M,
    "q6_k": lc.LLAMA_FTYPE_MOSTLY_Q6_K,
}


def quantize_file(source: Path, target: Path, kind: str, *, n_threads: int = 0) -> None:
    """Write `source` (a GGUF) quantized to `kind` as `target`, with llama.cpp's own
    quantizer (`llama_model_quantize`). Tensors whose shape the type cannot hold fall back
    as llama.cpp decides."""
    init_backend()
    params = lc.llama_model_quantize_default_params()
    params.ftype = QUANT_FILE_TYPES[kind]
    params.nthread = n_threads
    status = int(lc.llama_model_quantize(
        str(source).encode(), str(target).encode(), ctypes.byref(params)
    ))
    if status != 0:
        raise ModelLoadError(f"llama.cpp could not quantize {source.name} to {kind}")


def default_thread_count() -> int:
    """Threads for prompt and generation when the settings say 0: the physical cores less
    one. llama.cpp's threads meet at a spinning barrier after every operation, so one of them
    descheduled stalls all: with one busy process beside it on 2 cores, 2 threads ran a
    prompt at 215 tokens/s and generated 19.5/s where 1 thread did 326 and 42 (Gemma 3 270M,
    `arbor-engine bench`). A desktop always has something else running, the window first."""
    return max(1, physical_cores() - 1)


class LlamaModel:
    """A loaded GGUF model (weights, vocabulary, metadata)."""

    def __init__(
        self,
        path: Path,
        *,
        n_gpu_layers: int = 0,
        rpc_workers: Sequence[str] = (),
        on_progress: Callable[[float], None] | None = None,
        repack: bool = True,
        fit: GpuFit | None = None,
        vocab_only: bool = False,
    ) -> None:
        """`rpc_workers`: addresses already probed; layers go to them (and any GPU). The
        device list is always explicit once a worker was registered in this process, so a
        load without workers never uses one left registered by an earlier load. `repack`:
        let llama.cpp repack the weights for its fastest CPU kernels (engine.llm.repack). `fit`:
        llama.cpp's fit for the GPU (it sets the layers). `vocab_only`: the vocabulary and
        metadata without the weights (a tokenizer; llama.cpp's vocabulary-only files)."""
        init_backend()
        self.path = path
        self.info = read_model_info(path)  # clear errors for missing or non-GGUF files
        params = lc.llama_model_default_params()
        params.n_gpu_layers = n_gpu_layers
        params.use_mmap = True
        params.use_extra_bufts = repack
        params.vocab_only = vocab_only
        if fit is not None:
            fit.apply(params)
        self._devices: ctypes.Array[ctypes.c_void_p] | None = None  # alive during the load
        if rpc_workers or _rpc_registered:
            chosen = [*gpu_devices(), *rpc_devices(rpc_workers)]
            self._devices = (ctypes.c_void_p * (len(chosen) + 1))(*chosen, None)
            params.devices = ctypes.cast(self._devices, ctypes.c_void_p)
        if on_progress is not None:

            def report(fraction: float, _user_data: ctypes.c_void_p) -> int:
                try:
                    on_progress(fraction)
                except Exception:  # never let Python unwind into llama.cpp
                    log.exception("model load progress callback failed")
                return 1  # go on loading

            # Kept alive in a local for the duration of the (synchronous) load.
            progress_fn = _PROGRESS_FN(report)
            params.progress_callback = ctypes.cast(progress_fn, lc.llama_progress_callback)
        self._ptr = lc.llama_model_load_from_file(str(path).encode(), params)
        if not self._ptr:
            raise ModelLoadError(
                f"llama.cpp could not load {path.name}: the file is damaged, truncated, or "
                f"uses an architecture this build does not support"
            )
        self.vocab = lc.llama_model_get_vocab(self._ptr)
        self.n_vocab = int(lc.llama_vocab_n_tokens(self.vocab))
        # Its weights on the workers keep llama.cpp's connections to them open while it lives.
        self._workers = tuple(parse_endpoint(w) for w in rpc_workers)
        rpc.hold(self._workers)

    @property
    def ptr(self) -> lc.llama_model_p:
        return self._ptr

    def close(self) -> None:
        if self._ptr:
            lc.llama_model_free(self._ptr)
            self._ptr = None
            rpc.release(self._workers)

    # --- classification ----------------------------------------------------------------

    @property
    def is_recurrent(self) -> bool:
        return bool(lc.llama_model_is_recurrent(self._ptr))

    @property
    def is_hybrid(self) -> bool:
        return bool(lc.llama_model_is_hybrid(self._ptr))

    @property
    def n_swa(self) -> int:
        return int(lc.llama_model_n_swa(self._ptr))

    def memory_kind(self) -> MemoryKind:
        """How this model's cache behaves in a context, asked of llama.cpp itself. A
        full-size window cache (`swa_full`) changes its size, not its kind."""
        if self.is_hybrid:
            return MemoryKind.HYBRID
        if self.is_recurrent:
            return MemoryKind.RECURRENT
        if self.n_swa > 0:
            # With `swa_full` too: llama.cpp saves only the window of the window layers (Gemma
            # 3 270M after 700 tokens: `pos_min` 188 once restored), and decoding on from that
            # differs from decoding on from the full-size cache (by more than 0.3 in the
            # logits), so a checkpoint is valid only if every mode lays the cache out the way
            # a restore does: settled, as the window cache is (engine.llm.runtime).
            return MemoryKind.SLIDING_WINDOW
        return MemoryKind.DENSE

    @property
    def n_params(self) -> int:
        return int(lc.llama_model_n_params(self._ptr))

    @property
    def n_ctx_train(self) -> int:
        return int(lc.llama_model_n_ctx_train(self._ptr))

    def description(self) -> str:
        buf = ctypes.create_string_buffer(256)
        lc.llama_model_desc(self._ptr, buf, len(buf))
        return buf.value.decode("utf-8", errors="replace")

    def chat_template(self) -> str | None:
        raw = lc.llama_model_chat_template(self._ptr, None)
        return raw.decode("utf-8") if raw else None

    # --- vocabulary --------------------------------------------------------------------

    def tokenize(self, text: str, *, add_special: bool = False,
                 special: bool = True) -> list[int]:
        """`text` as tokens; `special`: control tokens' texts become those tokens (a chat
        template's text), else they stay the tokens of their characters (content)."""
        data = text.encode("utf-8")
        capacity = len(data) + 8
        buf = (lc.llama_token * capacity)()
        n = lc.llama_tokenize(self.vocab, data, len(data), buf, capacity, add_special, special)
        if n < 0:
            capacity = -n
            buf = (lc.llama_token * capacity)()
            n = lc.llama_tokenize(self.vocab, data, len(data), buf, capacity, add_special,
                                  special)
        return list(buf[:n])

    def tokenize_plain(self, text: str) -> list[int]:
        """`text` as the tokens of its characters: no control token is parsed in it."""
        return self.tokenize(text, special=False)

    @functools.cached_property
    def control_texts(self) -> frozenset[str]:
        """The texts of the tokens llama.cpp matches only with special tokens parsed (its
        CONTROL and UNKNOWN attributes): what content must never turn into."""
        wanted = lc.LLAMA_TOKEN_ATTR_CONTROL | lc.LLAMA_TOKEN_ATTR_UNKNOWN
        out = set()
        for token in range(self.n_vocab):
            if int(lc.llama_vocab_get_attr(self.vocab, token)) & wanted:
                raw = lc.llama_vocab_get_text(self.vocab, token)
                if raw:
                    out.add(raw.decode("utf-8", errors="replace"))
        return frozenset(out)

    def token_bytes(self, token: int, *, special: bool = False) -> bytes:
        buf = ctypes.create_string_buffer(64)
        n = lc.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = lc.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        return buf.raw[:n]

    def token_text(self, token: int) -> str:
        return self.token_bytes(token, special=True).decode("utf-8", errors="replace")

    @functools.cached_property
    def call_markers(self) -> frozenset[int]:
        """Special tokens that open a tool call in a family's format (`[TOOL_CALLS]` of
        Mistral's newer vocabularies, `<|python_tag|>` of Llama 3's): llama.cpp leaves special
        tokens out of a reply's text, so a reply's text shows these, or its calls could not
        be read."""
        from engine.core.call_formats import FORMATS

        found = set()
        for marker in {m for call_format in FORMATS for m in call_format.shown}:
            tokens = self.tokenize(marker)
            if len(tokens) == 1 and self.token_bytes(tokens[0]) != marker.encode():
                found.add(tokens[0])
        return frozenset(found)

    def spelling(self, text: bytes) -> list[int] | None:
        """Tokens whose bytes are exactly `text` (the longest token at each step), or None
        where there are none. Not how the tokenizer splits it: for a grammar, which reads
        bytes, when the tokenizer does not give `text` back as it is."""
        out: list[int] = []
        at = 0
        pieces, longest = self._pieces
        while at < len(text):
            for size in range(min(longest, len(text) - at), 0, -1):
                token = pieces.get(text[at:at + size])
                if token is not None:
                    out.append(token)
                    at += size
                    break
            else:
                return None
        return out

    @functools.cached_property
    def _pieces(self) -> tuple[dict[bytes, int], int]:
        """Each token's bytes (control tokens' text too), the first token of each; and the
        longest's length."""
        pieces: dict[bytes, int] = {}
        for token in range(self.n_vocab):
            pieces.setdefault(self.token_bytes(token, special=True), token)
        pieces.pop(b"", None)
        return pieces, max(map(len, pieces), default=0)

    def is_eog(self, token: int) -> bool:
        return bool(lc.llama_vocab_is_eog(self.vocab, token))

    @property
    def eog(self) -> int:
        """An end-of-generation token (EOS, else EOT); -1 if the vocabulary has neither."""
        for token in (int(lc.llama_vocab_eos(self.vocab)), int(lc.llama_vocab_eot(self.vocab))):
            if token >= 0 and self.is_eog(token):
                return token
        return -1

    def special_text(self, token: int) -> str:
        return self.token_text(token) if token >= 0 else ""

    @property
    def bos_text(self) -> str:
        return self.special_text(int(lc.llama_vocab_bos(self.vocab)))

    @property
    def eos_text(self) -> str:
        return self.special_text(int(lc.llama_vocab_eos(self.vocab)))

    @property
    def bos(self) -> int | None:
        """The BOS token if the model wants one prepended, else None."""
        if not lc.llama_vocab_get_add_bos(self.vocab):
            return None
        token = int(lc.llama_vocab_bos(self.vocab))
        return token if token >= 0 else None


def _context_params(params: ContextParams) -> Any:
    """llama.cpp's context parameters for `params` (one sequence, one ubatch a chunk)."""
    cparams = lc.llama_context_default_params()
    cparams.n_ctx = params.n_ctx
    cparams.n_batch = params.n_batch
    cparams.n_ubatch = params.n_batch  # one chunk = one ubatch: aborts roll back whole chunks
    cparams.n_seq_max = 1
    threads = params.n_threads or default_thread_count()
    cparams.n_threads = threads
    cparams.n_threads_batch = threads
    cparams.flash_attn_type = {
        FlashAttention.AUTO: lc.LLAMA_FLASH_ATTN_TYPE_AUTO,
        FlashAttention.ON: lc.LLAMA_FLASH_ATTN_TYPE_ENABLED,
        FlashAttention.OFF: lc.LLAMA_FLASH_ATTN_TYPE_DISABLED,
    }[params.flash_attn]
    cparams.type_k = KV_TYPES[params.type_k]
    cparams.type_v = KV_TYPES[params.type_v]
    cparams.swa_full = params.swa_full
    cparams.no_perf = True
    return cparams


# --- GPU layers: llama.cpp's own fit -----------------------------------------------------------

# `common_fit_params` (llama.cpp's common/fit.h, what llama-server runs before a load): it loads
# the model and context without allocating, measures what each device would hold, and lowers
# the GPU layers (and, for MoE models, moves experts to the CPU) until every GPU keeps a margin
# free. llama-cpp-python does not bind libllama-common, so its C++ name is called by hand.
_FIT_SYMBOL = ("_Z17common_fit_paramsPKcP18llama_model_paramsP20llama_context_paramsPfP32"
               "llama_model_tensor_buft_overridePmjPK22common_fit_extra_model14ggml_log_level")
FIT_MARGIN_BYTES = 1 << 30  # llama-server's default margin per device (--fit-target 1024 MiB)
_GGML_LOG_LEVEL_ERROR = 4


def gpu_memory() -> GpuMemory | None:
    """The free and total memory of this machine's GPUs, summed over `gpu_devices()`, with the
    margin llama.cpp's fit keeps free on each; None without a GPU."""
    devices = gpu_devices()
    if not devices:
        return None
    ggml = backends.ggml()
    free = total = 0
    for dev in devices:
        dev_free, dev_total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        ggml.ggml_backend_dev_memory(dev, ctypes.byref(dev_free), ctypes.byref(dev_total))
        free, total = free + dev_free.value, total + dev_total.value
    return GpuMemory(free, total, margin=FIT_MARGIN_BYTES * len(devices))


class _BuftOverride(ctypes.Structure):
    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


@dataclass(frozen=True)
class GpuFit:
    """What llama.cpp's fit chose: the GPU layers, and the split and overrides it wrote (kept
    here: the model's parameters point into them while it loads)."""

    n_gpu_layers: int
    ok: bool  # False: it projects no setting that fits; the closest is used
    tensor_split: Any = None
    overrides: Any = None

    def apply(self, params: Any) -> None:
        params.n_gpu_layers = self.n_gpu_layers
        if self.tensor_split is not None and any(self.tensor_split):
            params.tensor_split = self.tensor_split
        if self.overrides is not None and self.overrides[0].pattern is not None:
            params.tensor_buft_overrides = ctypes.cast(self.overrides, ctypes.c_void_p)


def _common_library() -> ctypes.CDLL | None:
    """libllama-common, where llama-cpp-python's build installs it (beside libllama, or in the
    wheel's top-level lib/); None if this build has none."""
    folder = backends.library_dir()
    for where in (folder, folder.parent.parent / "lib"):
        candidate = backends.linked_file(where, "llama-common")
        if candidate.exists():
            try:
                return ctypes.CDLL(str(candidate))
            except OSError as exc:
                log.warning("llama.cpp's common library cannot be loaded: %s", exc)
                return None
    return None


def fit_gpu_layers(path: Path, context: ContextParams, *, repack: bool = True
                   ) -> GpuFit | None:
    """How many layers of `path` fit this machine's GPUs with a context of `context`, as
    llama.cpp itself fits them; None if this build cannot tell (no common library)."""
    init_backend()
    lib = _common_library()
    fit = getattr(lib, _FIT_SYMBOL, None) if lib is not None else None
    if fit is None:
        return None
    fit.argtypes = [ctypes.c_char_p, ctypes.POINTER(lc.llama_model_params),
                    ctypes.POINTER(lc.llama_context_params), ctypes.POINTER(ctypes.c_float),
                    ctypes.POINTER(_BuftOverride), ctypes.POINTER(ctypes.c_size_t),
                    ctypes.c_uint32, ctypes.c_void_p, ctypes.c_int]
    fit.restype = ctypes.c_int
    mparams = lc.llama_model_default_params()  # n_gpu_layers -1: the fit may lower it
    mparams.use_extra_bufts = repack
    cparams = _context_params(context)
    n_devices = int(lc.llama_max_devices())
    split = (ctypes.c_float * n_devices)()
    overrides = (_BuftOverride * (int(lc.llama_max_tensor_buft_overrides()) + 1))()
    margins = (ctypes.c_size_t * n_devices)(*([FIT_MARGIN_BYTES] * n_devices))
    status = int(fit(str(path).encode(), ctypes.byref(mparams), ctypes.byref(cparams), split,
                     overrides, margins, context.n_ctx, None, _GGML_LOG_LEVEL_ERROR))
    if status == 2:  # a hard error (the file): the load that follows says what
        return None
    return GpuFit(int(mparams.n_gpu_layers), status == 0, split, overrides)


class LlamaContext:
    """One llama.cpp context with one sequence, and the batch used to feed it."""

    def __init__(self, model: LlamaModel, params: ContextParams) -> None:
        self.model = model
        self.params = params
        cparams = _context_params(params)
        self._abort_check: Callable[[], bool] | None = None
        # Declared as returning int, not bool: CPython 3.11's ctypes mis-counts references of
        # the bools a c_bool callback returns ("bool_dealloc" at exit). Same ABI for 0 / 1.
        self._abort_fn = _ABORT_FN(self._should_abort)
        self._abort_cb = ctypes.cast(self._abort_fn, lc.ggml_abort_callback)
        self._ptr = lc.llama_init_from_model(model.ptr, cparams)
        if not self._ptr:
            raise ModelLoadError(
                f"llama.cpp could not create a context of {params.n_ctx} tokens for "
                f"{model.path.name} (not enough memory, or an unsupported cache type)"
            )
        self.memory = lc.llama_get_memory(self._ptr)
        self.n_ctx = int(lc.llama_n_ctx(self._ptr))
        self._batch = lc.llama_batch_init(params.n_batch, 0, 1)

    def close(self) -> None:
        if self._ptr:
            lc.llama_batch_free(self._batch)
            lc.llama_free(self._ptr)
            self._ptr = None

    @property
    def ptr(self) -> lc.llama_context_p:
        return self._ptr

    # --- abort -------------------------------------------------------------------------

    def _should_abort(self, _data: ctypes.c_void_p) -> int:
        # Called by llama.cpp's compute thread between graph nodes while a decode runs.
        check = self._abort_check
        return 1 if check is not None and check() else 0

    def arm_abort(self, check: Callable[[], bool] | None) -> None:
        """While armed, a decode stops mid-graph as soon as `check()` is true.

        The callback runs in Python once per graph node, which costs about 7% of the
        one-token decode speed, so it is registered only while armed (prompt decoding).
        """
        self._abort_check = check
        callback = self._abort_cb if check is not None else _NO_ABORT
        lc.llama_set_abort_callback(self._ptr, callback, ctypes.c_void_p(0))

    # --- memory ------------------------------------------------------------------------

    def clear(self) -> None:
        lc.llama_memory_clear(self.memory, True)

    def seq_rm(self, p0: int, p1: int = -1) -> bool:
        return bool(lc.llama_memory_seq_rm(self.memory, SEQ, p0, p1))

    def pos_min(self) -> int:
        return int(lc.llama_memory_seq_pos_min(self.memory, SEQ))

    def pos_max(self) -> int:
        return int(lc.llama_memory_seq_pos_max(self.memory, SEQ))

    # --- state -------------------------------------------------------------------------

    def state_size(self, flags: int = 0) -> int:
        return int(lc.llama_state_seq_get_size_ext(self._ptr, SEQ, flags))

    def state_get(self, flags: int = 0) -> bytearray:
        """The sequence's state, written by llama.cpp straight into the returned buffer (one
        copy). Treat it as immutable."""
        return self.state_into(None, flags)[0]

    def state_into(self, buf: bytearray | None, flags: int = 0) -> tuple[bytearray, int]:
        """The sequence's state written at the start of `buf` (a new buffer of its size where
        `buf` is None or too small): the buffer, and the state's size."""
        size = self.state_size(flags)
        blob = buf if buf is not None and len(buf) >= size else bytearray(size)
        view = (ctypes.c_uint8 * size).from_buffer(blob)
        written = int(lc.llama_state_seq_get_data_ext(self._ptr, view, size, SEQ, flags))
        del view
        if written != size:
            raise DecodeError(f"llama.cpp saved {written} of {size} bytes of state")
        return blob, size

    def state_set(self, blob: bytes | bytearray, flags: int = 0, *, size: int = -1) -> int:
        """Load a state blob (its first `size` bytes, where given) into the sequence; returns
        the bytes read (0 on failure)."""
        size = len(blob) if size < 0 else size
        if isinstance(blob, bytearray):
            buf = (ctypes.c_uint8 * size).from_buffer(blob)  # no copy
        else:
            buf = (ctypes.c_uint8 * size).from_buffer_copy(blob)
        return int(lc.llama_state_seq_set_data_ext(self._ptr, buf, size, SEQ, flags))

    # --- decoding ----------------------------------------------------------------------

    def decode(self, tokens: Sequence[int], start_pos: int, *, want_logits: bool = True) -> int:
        """Decode `tokens` at positions start_pos.. in one llama_decode call.

        Returns llama_decode's status: 0 ok, 2 aborted. Raises DecodeError on other failures.
        """
        n = len(tokens)
        if not 0 < n <= self.params.n_batch:
            raise ValueError(f"batch of {n} tokens (n_batch is {self.params.n_batch})")
        b = self._batch
        for i, token in enumerate(tokens):
            b.token[i] = token
            b.pos[i] = start_pos + i
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = SEQ
            b.logits[i] = 0
        b.logits[n - 1] = 1 if want_logits else 0
        b.n_tokens = n
        status = int(lc.llama_decode(self._ptr, b))
        if status in (0, 2):
            return status
        if status == 1:
            raise DecodeError("llama.cpp found no room in the cache for this batch")
        raise DecodeError(f"llama.cpp failed to decode a batch (status {status})")

    def logits(self) -> np.ndarray:
        """A copy of the logits of the last decoded token."""
        ptr = lc.llama_get_logits_ith(self._ptr, -1)
        return np.ctypeslib.as_array(ptr, shape=(self.model.n_vocab,)).copy()


# llama_token_data as numpy lays it out: {int32 id; float logit; float p}.
_TOKEN_DATA = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])
assert _TOKEN_DATA.itemsize == ctypes.sizeof(lc.llama_token_data)


class Sampler:
    """A seeded llama.cpp sampler chain for one reply (engine.config.params.SamplingParams):
    logit bias, penalties, then greedy (temperature 0) or top-k, top-p, min-p, temperature
    and a seeded draw. `history`, the prompt's tokens, feeds the penalties as llama-server's
    prompt does (never the grammar, which starts at the reply).

    A JSON schema's grammar is applied as llama-server applies it (common/sampling.cpp): the
    chain draws a token, the grammar checks that one; only when it refuses is the draw made
    again from the logits the grammar allows. Checking every token of the vocabulary at
    every step costs more than the decode on a small model.

    A lazy grammar (`SamplingParams.json_lazy`: a tool call under "auto"; a forced call or
    JSON output after a reply's reasoning) holds only from its trigger on: until then the
    chain alone draws, as it does without a grammar, and each token's text is watched for
    the trigger. The trigger is found here, not by llama.cpp's own lazy grammar, whose
    trigger check runs inside `llama_sampler_accept` and throws a C++ exception (which ends
    the process under ctypes) when the text after the trigger in the same token is not what
    the grammar allows; here every token is checked before the grammar takes it."""

    def __init__(self, params: SamplingParams, seed: int, *, model: LlamaModel | None = None,
                 history: Sequence[int] = ()) -> None:
        chain_params = lc.llama_sampler_chain_default_params()
        chain_params.no_perf = True
        self._ptr = lc.llama_sampler_chain_init(chain_params)
        self._grammar: Any = None
        self._model = model
        self._lazy = params.json_lazy
        self._holding = self._lazy is None  # whether the grammar (if any) applies now
        self._free = b""  # lazy, while free: the text since the last call, as the trigger needs
        self._opened = False  # lazy: the reply has written something other than whitespace
        self._eog = -1  # an end-of-generation token: the grammar allows it once it is complete
        try:
            self._add_constraints(params, model, history)
        except BaseException:
            self.close()
            raise
        if params.greedy:
            lc.llama_sampler_chain_add(self._ptr, lc.llama_sampler_init_greedy())
        else:
            if params.top_k > 0:
                lc.llama_sampler_chain_add(self._ptr, lc.llama_sampler_init_top_k(params.top_k))
            if params.top_p < 1.0:
                lc.llama_sampler_chain_add(self._ptr,
                                           lc.llama_sampler_init_top_p(params.top_p, 1))
            if params.min_p > 0.0:
                lc.llama_sampler_chain_add(self._ptr,
                                           lc.llama_sampler_init_min_p(params.min_p, 1))
            lc.llama_sampler_chain_add(self._ptr, lc.llama_sampler_init_temp(params.temperature))
            lc.llama_sampler_chain_add(self._ptr, lc.llama_sampler_init_dist(seed & 0xFFFFFFFF))
        if self._lazy is not None and self._grammar is not None and self._lazy.written:
            self._watch(self._lazy.written.encode("utf-8"))

    def _add_constraints(self, params: SamplingParams, model: LlamaModel | None,
                         history: Sequence[int]) -> None:
        wanted = (params.logit_bias or params.json_schema is not None
                  or params.grammar is not None or params.penalized)
        if not wanted:
            return
        if model is None:
            raise ValueError("logit bias, grammars and penalties need the model's vocabulary")
        if params.json_schema is not None or params.grammar is not None:
            lazy = params.json_lazy
            if params.json_schema is None:
                assert params.grammar is not None
                grammar, root = params.grammar, "root"
            elif lazy is None:
                grammar = json_grammar(params.json_schema, params.json_around)
                root = "root" if params.json_around == ("", "") else WRAPPED_ROOT
            else:
                grammar = call_grammar(params.json_schema, params.json_around, lazy.joiner)
                root = WRAPPED_ROOT
            if lazy is not None:
                self._eog = model.eog
            self._grammar = lc.llama_sampler_init_grammar(model.vocab, grammar.encode(),
                                                          root.encode())
            if not self._grammar:
                self._grammar = None
                raise UnsupportedRequest("llama.cpp could not use the grammar made from this "
                                         "JSON schema" if params.grammar is None else
                                         "llama.cpp could not use the grammar of this "
                                         "model's tool calls")
        if params.logit_bias:
            bad = [t for t, _ in params.logit_bias if not 0 <= t < model.n_vocab]
            if bad:
                raise UnsupportedRequest(f"token {bad[0]} is not in this model's vocabulary "
                                         f"of {model.n_vocab:,}")
            biases = (lc.llama_logit_bias * len(params.logit_bias))(
                *(lc.llama_logit_bias(token=t, bias=b) for t, b in params.logit_bias))
            lc.llama_sampler_chain_add(self._ptr, lc.llama_sampler_init_logit_bias(
                model.n_vocab, len(params.logit_bias), biases))
        if params.penalized:
            penalties = lc.llama_sampler_init_penalties(
                model.n_vocab, params.penalty_last_n, params.repeat_penalty,
                params.frequency_penalty, params.presence_penalty)
            for token in history[max(0, len(history) - params.penalty_last_n):]:
                lc.llama_sampler_accept(penalties, token)
            lc.llama_sampler_chain_add(self._ptr, penalties)

    @property
    def constrained(self) -> bool:
        """Whether a grammar holds for the next token (a lazy one: a call has begun)."""
        return self._grammar is not None and self._holding

    def sample(self, ctx: LlamaContext) -> int:
        if self.constrained:
            return self.sample_logits(ctx.logits())
        token = int(lc.llama_sampler_sample(self._ptr, ctx.ptr, -1))
        self._after(token)
        return token

    def sample_logits(self, logits: np.ndarray) -> int:
        """Sample from logits held outside the context (a checkpoint's), exactly as
        `llama_sampler_sample` samples from the context's: the candidates are every token in
        id order with its logit and p 0, unsorted; the chain is applied, the selected token
        read and accepted (llama-sampler.cpp, the path without backend sampling)."""
        n = int(logits.shape[0])
        if logits.ndim != 1 or n == 0:
            raise ValueError(f"logits of shape {logits.shape}")
        constrained = self.constrained
        token = self._draw(logits, grammar_first=False)
        if constrained and not self._allows(token):
            token = self._draw(logits, grammar_first=True)
        lc.llama_sampler_accept(self._ptr, token)
        if constrained:
            lc.llama_sampler_accept(self._grammar, token)
        self._after(token)
        return token

    # --- the lazy grammar's trigger ----------------------------------------------------------

    def _after(self, token: int) -> None:
        """A lazy grammar's bookkeeping once `token` is drawn: the trigger watched for while
        free, the call's end while holding."""
        if self._lazy is None or self._grammar is None or self._model is None:
            return
        if not self._holding:
            self._watch(self._model.token_bytes(token, special=True))
        elif not self._lazy.once and self._allows(self._eog):  # the call is whole: free again
            self._release()

    def _watch(self, data: bytes) -> None:
        """Free text written: start the grammar where a call begins in it, on what follows."""
        lazy = self._lazy
        assert lazy is not None
        trigger = lazy.trigger.encode("utf-8")
        text = self._free + data
        begun = -1
        if not self._opened:
            body = text.lstrip()
            if body:
                self._opened = True
                if lazy.at_open and body.startswith(b"{"):
                    begun = len(text) - len(body)
        if begun < 0 and trigger:
            found = text.find(trigger)
            if found >= 0:
                begun = found + len(trigger)
        if begun < 0:
            self._free = text[max(0, len(text) - len(trigger) + 1):]
            return
        self._free = b""
        self._holding = True
        log.debug("a tool call begins: its grammar holds from here")
        self._take(text[begun:])

    def _take(self, text: bytes) -> None:
        """What the reply wrote after a trigger in the same token (or in the text a continued
        reply had): given to the grammar as the tokens it reads as, each checked first. Text
        it refuses leaves this call unconstrained (the reply goes on free)."""
        if not text:
            return
        assert self._model is not None and self._lazy is not None
        try:
            tokens: list[int] | None = self._model.tokenize(text.decode("utf-8"))
        except UnicodeDecodeError:
            tokens = None
        if tokens is None or b"".join(self._model.token_bytes(t, special=True)
                                      for t in tokens) != text:
            # A tokenizer may not give the text back as it is (SentencePiece's space before
            # a text's start): any tokens that spell it will do for the grammar.
            tokens = self._model.spelling(text)
        if tokens is None:
            log.warning("the text after a tool call's marker cannot be given to its grammar "
                        "token by token: this call is not constrained")
            self._release()
            return
        for at, token in enumerate(tokens):
            if not self._allows(token):
                log.warning("the model began a tool call its grammar does not allow "
                            "(%r): this call is not constrained", text[:40])
                self._release()
                return
            lc.llama_sampler_accept(self._grammar, token)
            if not self._lazy.once and self._allows(self._eog):
                self._release()
                rest = b"".join(self._model.token_bytes(t, special=True)
                                for t in tokens[at + 1:])
                if rest:
                    self._watch(rest)
                return

    def _release(self) -> None:
        """Back to free text: the grammar starts over at the next trigger."""
        lc.llama_sampler_reset(self._grammar)
        self._holding = False
        self._free = b""

    # --- drawing -----------------------------------------------------------------------------

    def _draw(self, logits: np.ndarray, *, grammar_first: bool) -> int:
        n = int(logits.shape[0])
        candidates = np.empty(n, dtype=_TOKEN_DATA)
        candidates["id"] = np.arange(n, dtype=np.int32)
        candidates["logit"] = logits
        candidates["p"] = 0.0
        array = lc.llama_token_data_array(
            data=candidates.ctypes.data_as(lc.llama_token_data_p), size=n, selected=-1,
            sorted=False,
        )
        if grammar_first:
            lc.llama_sampler_apply(self._grammar, ctypes.byref(array))
        lc.llama_sampler_apply(self._ptr, ctypes.byref(array))
        if not 0 <= array.selected < array.size:
            raise DecodeError(f"the sampler selected candidate {array.selected} of {array.size}")
        return int(array.data[array.selected].id)  # samplers may move `data`: read through it

    def _allows(self, token: int) -> bool:
        """Whether the grammar lets `token` come next (its state is not moved)."""
        if token < 0:
            return False
        one = np.array([(token, 1.0, 0.0)], dtype=_TOKEN_DATA)
        array = lc.llama_token_data_array(
            data=one.ctypes.data_as(lc.llama_token_data_p), size=1, selected=-1, sorted=False)
        lc.llama_sampler_apply(self._grammar, ctypes.byref(array))
        return bool(np.isfinite(one["logit"][0]))

    def close(self) -> None:
        if self._ptr:
            lc.llama_sampler_free(self._ptr)
            self._ptr = None
        if self._grammar:
            lc.llama_sampler_free(self._grammar)
            self._grammar = None


def _schema_grammar(schema: str) -> str:
    """The GBNF grammar of JSON following `schema` (its JSON text), rooted at `root`."""
    from llama_cpp.llama_grammar import JSON_GBNF, json_schema_to_gbnf

    if schema.strip() in ('{"type": "object"}', '{"type":"object"}'):
        return JSON_GBNF  # OpenAI's json_object: an object, whatever it holds
    try:
        grammar = json_schema_to_gbnf(schema)
    except Exception as exc:  # the converter raises many kinds: all the schema's fault
        raise UnsupportedRequest(f"this JSON schema cannot be turned into a grammar: "
                                 f"{exc}") from None
    # The port lets a string hold control characters raw, which JSON does not (json.loads
    # refuses them); llama.cpp's own converter keeps them out, as this does.
    return grammar.replace('char ::= [^"\\\\] |', 'char ::= [^"\\\\\\x7F\\x00-\\x1F] |', 1)


def json_grammar(schema: str, around: tuple[str, str] = ("", "")) -> str:
    """The GBNF grammar of replies that are JSON following `schema` (its JSON text), by
    llama-cpp-python's port of llama.cpp's converter; `{"type": "object"}` is any object.
    `around`: literal text before and after the JSON (a tool call's markers)."""
    grammar = _schema_grammar(schema)
    if around == ("", ""):
        return grammar
    # A rule of its own around the JSON's root, which the sampler starts from (WRAPPED_ROOT).
    return (f"{WRAPPED_ROOT} ::= {_gbnf_literal(around[0])} root {_gbnf_literal(around[1])}\n"
            f"{grammar}")


def call_grammar(schema: str, around: tuple[str, str], joiner: str = "") -> str:
    """The grammar of what follows a lazy grammar's trigger: JSON following `schema` between
    `around`, whitespace at their edges free (a model writes `<tool_call>` and then a newline
    or not), and with a `joiner` more values joined by it (Mistral's list of calls)."""
    parts = [_LAZY_SPACE]
    if around[0].strip():
        parts += [_gbnf_literal(around[0].strip()), _LAZY_SPACE]
    parts.append("root")
    if joiner:
        parts.append(f"({_LAZY_SPACE} {_gbnf_literal(joiner)} {_LAZY_SPACE} root)*")
    if around[1].strip():
        parts += [_LAZY_SPACE, _gbnf_literal(around[1].strip())]
    return (f"{WRAPPED_ROOT} ::= {' '.join(parts)}\n"
            f"{_LAZY_SPACE} ::= [ \\t\\n]{{0,20}}\n"
            f"{_schema_grammar(schema)}")


WRAPPED_ROOT = "arbor-wrapped"
_LAZY_SPACE = "arbor-space"


def _gbnf_literal(text: str) -> str:
    escaped = (text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
               .replace("\t", "\\t"))
    return f'"{escaped}"'


# --- the baseline: a plain app on llama-cpp-python's high-level API -------------------------


@contextlib.contextmanager
def _default_repack(repack: bool) -> Iterator[None]:
    """While inside, llama-cpp-python's model parameters come with `use_extra_bufts` =
    `repack`."""
    module = lc.llama_cpp
    original = module.llama_model_default_params

    def params() -> Any:
        made = original()
        made.use_extra_bufts = repack
        return made

    module.llama_model_default_params = params
    try:
        yield
    finally:
        module.llama_model_default_params = original


class PlainChat:
    """What a plain chat app on llama-cpp-python does, for the benchmark to measure Arbor
    against: `Llama.create_chat_completion` re-renders the messages and reuses the longest
    common prefix of its one cache; with `ram_cache`, `LlamaRAMCache` also keeps the state
    after each reply and loads the stored one with the longest common prefix. Greedy."""

    def __init__(self, path: Path, *, n_ctx: int, n_batch: int, n_threads: int,
                 ram_cache: bool = False, swa_full: bool = False,
                 chat_format: str | None = None) -> None:
        """`chat_format`: one of llama-cpp-python's named formats, for a model without a
        template of its own (llama-cpp-python falls back to llama-2's otherwise)."""
        from engine.llm.repack import RepackGuard

        # The backends Arbor chose, and repacking off where Arbor's engine runs without it:
        # `Llama` takes no such argument, so its default parameters say so while it loads.
        decision = RepackGuard(path, native_backends()).decide()
        with _default_repack(decision.repack):
            self.llm = lc.Llama(str(path), n_ctx=n_ctx, n_batch=n_batch, n_threads=n_threads,
                                n_threads_batch=n_threads, swa_full=swa_full, seed=0,
                                chat_format=chat_format, verbose=False)
        if ram_cache:
            self.llm.set_cache(lc.LlamaRAMCache(capacity_bytes=4 << 30))
        self._batches: list[int] = []  # the tokens of each eval: the prompt's tail, then ones
        evaluate = self.llm.eval

        def counting(tokens: Sequence[int]) -> None:
            self._batches.append(len(tokens))
            evaluate(tokens)

        self.llm.eval = counting  # type: ignore[method-assign]

    def close(self) -> None:
        self.llm.close()

    def ask(self, messages: list[dict[str, str]], max_tokens: int) -> tuple[str, float, int]:
        """A reply to `messages`: its text, the time to its first token (ms) and the prompt
        tokens decoded for it."""
        stream: Any = self.llm.create_chat_completion(
            messages=cast(Any, messages), temperature=0.0, max_tokens=max_tokens, stream=True,
            seed=0)
        return self._read(chunk["choices"][0]["delta"].get("content") or "" for chunk in stream)

    def resume(self, messages: list[dict[str, str]], partial: str,
               max_tokens: int) -> tuple[str, float, int]:
        """More of the reply `partial` to `messages`, as such an app continues one: the chat
        template's rendering of `messages` with the partial reply appended, completed."""
        formats = lc.llama_chat_format

        template = self.llm.metadata.get("tokenizer.chat_template")
        if template is not None:

            def text(token: int) -> str:
                return self.llm.detokenize([token], special=True).decode("utf-8", "replace")

            rendered = formats.Jinja2ChatFormatter(
                template, eos_token=text(self.llm.token_eos()),
                bos_token=text(self.llm.token_bos()))(messages=cast(Any, messages))
        else:
            name = (self.llm.chat_format or "").replace("-", "_")
            render = getattr(formats, f"format_{name}", None)
            if render is None:
                raise ModelLoadError(f"no chat format {name!r} to continue a reply with")
            rendered = render(messages=cast(Any, messages))
        prompt = self.llm.tokenize((rendered.prompt + partial).encode(),
                                   add_bos=not rendered.added_special, special=True)
        stream: Any = self.llm.create_completion(prompt=prompt, temperature=0.0,
                                            max_tokens=max_tokens, stream=True, seed=0)
        return self._read(chunk["choices"][0]["text"] for chunk in stream)

    def _read(self, pieces: Iterable[str]) -> tuple[str, float, int]:
        """Drain a reply's stream: its text, the time to its first text (ms), and the prompt
        tokens decoded (the first eval of a reply holds the prompt's uncached tail)."""
        self._batches.clear()
        started = time.perf_counter()
        first: float | None = None
        out: list[str] = []
        for piece in pieces:
            if piece and first is None:
                first = time.perf_counter()
            out.append(piece)
        ended = time.perf_counter()
        decoded = self._batches[0] if self._batches else 0
        return "".join(out), ((first or ended) - started) * 1000.0, decoded


def serve_plain(path: Path, *, host: str, port: int, n_ctx: int, n_batch: int,
                n_threads: int, chat_format: str | None = None) -> None:
    """llama-cpp-python's own OpenAI-compatible server (`python -m llama_cpp.server`) on the
    backends Arbor chose, with repacking as Arbor's engine runs it, until interrupted: the
    benchmark's peer for API sessions. Its defaults otherwise (one cache, prefix reuse)."""
    import uvicorn
    from llama_cpp.server.app import create_app
    from llama_cpp.server.settings import ModelSettings, ServerSettings

    from engine.llm.repack import RepackGuard

    decision = RepackGuard(path, native_backends()).decide()
    with _default_repack(decision.repack):
        app = create_app(
            server_settings=ServerSettings(host=host, port=port),
            model_settings=[ModelSettings(
                model=str(path), n_ctx=n_ctx, n_batch=n_batch, n_threads=n_threads,
                n_threads_batch=n_threads, chat_format=chat_format, verbose=False)])
    uvicorn.run(app, host=host, port=port, log_level="warning")
