"""Hugging Face model directories: read offline, written back with the same layout.

A directory holds ``config.json`` and either ``model.safetensors`` or shards
named by ``model.safetensors.index.json`` (``{"weight_map": {key: shard}}``).
:func:`read_directory` checks the layout, :func:`load_directory` reads the
tensors one shard at a time and :func:`build_from_directory` builds the model
from its config (never reaching a hub). :func:`save_directory` writes a state
dict back in the same layout: the same config and other small files, the same
shards holding the same keys, a fresh index; into a temporary directory beside
the destination that then replaces it in one rename (:func:`wsym.io.atomic.replace_directory`),
so an interrupted write leaves the old directory as it was.

Example:
    >>> import tempfile, torch, transformers
    >>> cfg = transformers.BertConfig(hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
    ...                               intermediate_size=16, vocab_size=32)
    >>> src = tempfile.mkdtemp() + "/bert"
    >>> transformers.BertModel(cfg).save_pretrained(src)
    >>> model, sd = build_from_directory(src)
    >>> save_directory(sd, read_directory(src), src + "-copy")
    >>> sorted(p.name for p in Path(src + "-copy").iterdir())
    ['config.json', 'model.safetensors']
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from wsym.errors import WsymInputError
from wsym.io.atomic import directory_beside, replace_directory
from wsym.io.checkpoint import _detached, _load_safetensors, check_compatible

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"
#: Files of a source directory that :func:`save_directory` does not copy (it writes its own).
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".h5", ".msgpack", ".ckpt")


@dataclass(frozen=True)
class Directory:
    """The layout of a Hugging Face model directory.

    Attributes:
        path: The directory.
        config: ``config.json``'s content.
        shards: ``{shard file name: keys it holds, in file order}``.
        indexed: Whether the weights are sharded (an index file names the shards).
    """

    path: Path
    config: dict
    shards: dict[str, tuple[str, ...]]
    indexed: bool

    @property
    def keys(self) -> tuple[str, ...]:
        """Every tensor name, shard by shard."""
        return tuple(k for keys in self.shards.values() for k in keys)


def is_directory(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` names an existing directory (a Hugging Face model, if well formed)."""
    return Path(path).is_dir()


def read_directory(path: str | os.PathLike[str]) -> Directory:
    """Check ``path``'s layout and read its config and shard list (no tensors).

    Raises:
        WsymInputError: No ``config.json`` (or not JSON), no weights, an index
            that is not JSON or names a shard that is missing.
    """
    path = Path(path)
    if not path.is_dir():
        raise WsymInputError(f"model directory {path} not found; check the path")
    config = _json(path / CONFIG, f"the config of {path}")
    if config is None:
        raise WsymInputError(
            f"{path} has no {CONFIG}; point to a directory written by save_pretrained "
            "(config.json next to model.safetensors)"
        )
    index = _json(path / INDEX, "the shard index")
    if index is not None:
        return Directory(path, config, _indexed_shards(path, index), True)
    if not (path / WEIGHTS).is_file():
        extra = " (re-save it with save_pretrained(..., safe_serialization=True))"
        found = next((p.name for p in sorted(path.iterdir()) if p.suffix == ".bin"), None)
        raise WsymInputError(
            f"{path} has neither {WEIGHTS} nor {INDEX}; "
            + (
                f"found {found}, a pickle wsym does not read{extra}"
                if found
                else "save the weights with save_pretrained"
            )
        )
    return Directory(path, config, {WEIGHTS: _shard_keys(path / WEIGHTS)}, False)


def _json(file: Path, what: str) -> dict | None:
    if not file.is_file():
        return None
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise WsymInputError(f"{file} is not valid JSON ({err}); restore {what}") from err
    if not isinstance(data, dict):
        raise WsymInputError(f"{file} holds a {type(data).__name__}, not an object; restore {what}")
    return data


def _indexed_shards(path: Path, index: dict) -> dict[str, tuple[str, ...]]:
    """``{shard: keys}`` from the index's weight map, every shard checked to exist."""
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise WsymInputError(
            f"{path / INDEX} has no weight_map; re-save the model with save_pretrained"
        )
    shards: dict[str, list[str]] = {}
    for key, shard in weight_map.items():
        shards.setdefault(str(shard), []).append(str(key))
    for shard in shards:
        if Path(shard).name != shard or not (path / shard).is_file():
            raise WsymInputError(
                f"{path / INDEX} names shard {shard}, which is missing from {path}; "
                "copy the missing shard into the directory (or re-save the model)"
            )
    return {shard: tuple(keys) for shard, keys in shards.items()}


def _shard_keys(file: Path) -> tuple[str, ...]:
    from safetensors import safe_open

    try:
        with safe_open(file, framework="pt") as handle:
            return tuple(handle.keys())
    except Exception as err:  # SafetensorError: a truncated or corrupt header
        raise WsymInputError(
            f"checkpoint {file} is truncated or corrupt ({err}); re-download or re-save it"
        ) from err


def load_directory(directory: Directory, tied: Mapping[str, str] | None = None) -> dict:
    """Every tensor of ``directory``, read one shard at a time.

    ``tied`` (``{key: key it is tied to}``, :func:`tied_keys`) fills the keys
    ``save_pretrained`` leaves out because they share another's tensor.

    Raises:
        WsymInputError: A shard that is corrupt or lacks keys its index names.
    """
    out: dict[str, torch.Tensor] = {}
    for shard, keys in directory.shards.items():
        tensors = _load_safetensors(directory.path / shard)
        missing = [k for k in keys if k not in tensors]
        if missing:
            raise WsymInputError(
                f"shard {directory.path / shard} lacks {len(missing)} tensor(s) the index "
                f"names (first {missing[0]!r}); re-save the model with save_pretrained"
            )
        out.update((k, tensors[k]) for k in keys)
    for key, source in (tied or {}).items():
        if key not in out and source in out:
            out[key] = out[source]
    return out


def skeleton(directory: Directory) -> torch.nn.Module:
    """The directory's architecture on the meta device (shapes only, no memory, offline).

    The class is the config's first ``architectures`` entry when ``transformers``
    has it, else ``AutoModel``'s for the config.

    Raises:
        WsymInputError: A config that ``transformers`` cannot read.
    """
    transformers = _transformers()
    try:
        config = transformers.AutoConfig.from_pretrained(directory.path, local_files_only=True)
    except (ValueError, KeyError, OSError) as err:
        raise WsymInputError(
            f"{directory.path / CONFIG} is not a config transformers can read "
            f"({_first_line(err)}); fix model_type in it"
        ) from err
    names = directory.config.get("architectures") or []
    cls = getattr(transformers, str(names[0]), None) if names else None
    with torch.device("meta"):
        if cls is not None:
            return cls(config)
        return transformers.AutoModel.from_config(config)


def tied_keys(model: torch.nn.Module) -> dict[str, str]:
    """``{key: the first key sharing its parameter}`` for every tied parameter of ``model``."""
    first: dict[int, str] = {}
    out = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        if id(param) in first:
            out[name] = first[id(param)]
        else:
            first[id(param)] = name
    return out


def check_fits(directory: Directory, model: torch.nn.Module) -> None:
    """The directory's tensors have the names and shapes ``model`` (its config) expects.

    Reads only the shards' headers. Keys tied to another one may be absent.

    Raises:
        WsymInputError: One line naming the directory, the mismatches and the fix.
    """
    from safetensors import safe_open

    shapes = {}
    for shard, keys in directory.shards.items():
        with safe_open(directory.path / shard, framework="pt") as handle:
            for k in keys:
                shapes[k] = torch.empty(handle.get_slice(k).get_shape(), device="meta")
    tied = tied_keys(model)
    own = {k: v for k, v in model.state_dict().items() if not (k in tied and k not in shapes)}
    check_compatible(own, shapes, directory.path)


def build_from_directory(
    path: str | os.PathLike[str], dtype: torch.dtype | None = None
) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    """``(model, state dict)``: the directory's model with its weights, offline.

    The layout and every tensor's name and shape are checked first (headers
    only: :func:`check_fits`), then ``from_pretrained(local_files_only=True)``
    loads it, in ``dtype`` when given (else as stored). The state dict's tensors
    are the model's own (no second copy).

    Raises:
        WsymInputError: A bad layout (:func:`read_directory`), a config that
            ``transformers`` cannot read, or tensors that do not fit the config.
    """
    directory = read_directory(path)
    shape = skeleton(directory)
    check_fits(directory, shape)
    transformers = _transformers()
    kwargs = {"dtype": dtype} if dtype is not None else {"dtype": "auto"}
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    try:
        model = type(shape).from_pretrained(directory.path, local_files_only=True, **kwargs)
    finally:
        transformers.logging.set_verbosity(verbosity)
        transformers.logging.enable_progress_bar()
    return model.eval(), model.state_dict()


def _transformers():
    try:
        import transformers
    except ImportError as err:
        raise WsymInputError(
            "a Hugging Face model directory needs the transformers package, which is not "
            "installed; pip install 'wsym[models]'"
        ) from err
    return transformers


def save_directory(
    state_dict: Mapping[str, torch.Tensor],
    like: Directory,
    out: str | os.PathLike[str],
) -> None:
    """Write ``state_dict`` as a Hugging Face directory laid out like ``like``.

    Same ``config.json`` (and the source's other non-weight files: tokenizer,
    generation config), the same shards with the same keys in the same order,
    each tensor in the dtype the source stored it in; a fresh index (its
    ``total_size`` recomputed). Written shard by shard into a temporary
    directory beside ``out``, which then replaces ``out`` atomically.

    Raises:
        WsymInputError: ``state_dict`` lacks a key the layout names, or ``out``'s
            parent directory is missing.
    """
    out = Path(out)
    if not out.parent.is_dir():
        raise WsymInputError(f"cannot write {out}: directory {out.parent} does not exist")
    missing = [k for k in like.keys if k not in state_dict]
    if missing:
        raise WsymInputError(
            f"cannot write {out}: the state dict lacks {missing[0]!r} (and {len(missing) - 1} "
            f"more) that {like.path} holds; pass a state dict of that model"
        )
    dtypes = _stored_dtypes(like)
    with directory_beside(out) as tmp:
        _copy_small_files(like.path, tmp)
        total = 0
        for shard, keys in like.shards.items():
            tensors = _detached(
                {k: state_dict[k].to(dtypes.get(k, state_dict[k].dtype)) for k in keys}
            )
            total += sum(t.numel() * t.element_size() for t in tensors.values())
            _write_shard(tensors, tmp / shard)
        if like.indexed:
            index = {
                "metadata": {"total_size": total},
                "weight_map": {k: shard for shard, keys in like.shards.items() for k in keys},
            }
            (tmp / INDEX).write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
        replace_directory(tmp, out)


def _stored_dtypes(like: Directory) -> dict[str, torch.dtype]:
    from safetensors import safe_open

    out = {}
    for shard, keys in like.shards.items():
        with safe_open(like.path / shard, framework="pt") as handle:
            for k in keys:
                out[k] = handle.get_slice(k).get_dtype()
    return {k: _DTYPES.get(v, None) for k, v in out.items() if v in _DTYPES}


_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
}


def _write_shard(tensors: dict[str, torch.Tensor], file: Path) -> None:
    from safetensors.torch import save_file

    save_file(tensors, file, metadata={"format": "pt"})
    with open(file, "rb") as handle:
        os.fsync(handle.fileno())


def _copy_small_files(src: Path, dst: Path) -> None:
    """Every plain file of ``src`` but the weights and the index (config, tokenizer, ...)."""
    for item in sorted(src.iterdir()):
        if item.is_file() and item.name != INDEX and not item.name.endswith(WEIGHT_SUFFIXES):
            shutil.copy2(item, dst / item.name)


def _first_line(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    return lines[0].strip() if lines else type(err).__name__
