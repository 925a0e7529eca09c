"""Checkpoint I/O: the original TF1 release, HuggingFace XLNet weights, and our own format.

One name map drives everything: every backbone weight has its ORIGINAL checkpoint name
(``model/transformer/layer_3/rel_attn/q/kernel``; per-layer biases stacked into ``model/transformer/r_w_bias``
[n_layer, n_head, d_head] as released). HuggingFace keys are translated to those names, and our own format IS
an original-named TF checkpoint (``xlnet_model.ckpt``) next to ``xlnet_tf_config.json`` (all config fields) and
``xlnet_config.json`` (the original's keys), so a model we save is also loadable by the original code and by
HuggingFace's converter. The same map, read the other way, writes HuggingFace directories (``config.json`` +
``model.safetensors``, ``save_pretrained(..., format="huggingface")``); safetensors are read memory-mapped and
written through the ``safetensors`` package.

Loading is strict: a missing backbone weight or a shape mismatch raises an error naming the variable, the
expected and the found shape; no backbone weight is ever left at its random initial value.

The HuggingFace export (``save_pretrained(format="huggingface")``, ``convert --to=huggingface``,
``--export_huggingface``) reads the HF name map the other way (``_hf_key_map`` + ``_hf_layout``: which weights
are per-layer stacks, which are transposed). The config names the same function in transformers' names
(``config.TO_HF_ACTIVATION``: our tanh GELU ``gelu_new``, the erf form ``gelu``, read back as the same functions);
shared biases (``untie_r=false``) are repeated per layer (HF's modules always hold one per layer);
HF derives ``d_head = d_model / n_head``, so other shapes are refused. A backbone is written as
``XLNetLMHeadModel`` (with the LM bias; the bare ``XLNetModel`` lists it as unused); a fine-tuned model as the HF
class of its head (``XLNetForSequenceClassification`` with ``summary_proj_to_labels=false``,
``XLNetForMultipleChoice``, ``XLNetForQuestionAnswering``). Not representable, refused before any work: deeper
head MLPs, the ``attn`` summary, and our ``mean`` summary (over real tokens; HF's averages the padding).
``tests/test_huggingface_export.py`` holds outputs and predictions equal (<= 1e-5 relative) through
transformers' classes on SST-2, STS-B, RACE and SQuAD dev rows.
"""

from __future__ import annotations

import dataclasses
import glob
import io
import json
import logging
import os
import pickle
import re
import zipfile
from collections import OrderedDict
from typing import Callable, Dict, List, Mapping, Optional, Tuple

import numpy as np

from xlnet_tf.config import TO_HF_ACTIVATION, XLNetConfig, describe_activation
from xlnet_tf.fileutil import atomic_directory, write_json

PREFIX = "model/transformer/"
OWN_CONFIG = "xlnet_tf_config.json"
CKPT_NAME = "xlnet_model.ckpt"

log = logging.getLogger(__name__)


class CheckpointError(ValueError):
    """A checkpoint that does not fit the model: names the variable, the expected and the found shape."""


# ---------------------------------------------------------------------------------------------- name map
def backbone_name_map(model) -> "OrderedDict[str, object]":
    """Original name -> variable, or a list of per-layer variables stacked along axis 0."""
    c = model.config
    m: "OrderedDict[str, object]" = OrderedDict()
    m[PREFIX + "word_embedding/lookup_table"] = model.word_embedding
    m[PREFIX + "mask_emb/mask_emb"] = model.mask_emb
    for bias in ("r_w_bias", "r_r_bias", "r_s_bias"):
        if c.untie_r:
            m[PREFIX + bias] = [getattr(b.rel_attn, bias) for b in model.blocks]
        else:
            m[PREFIX + bias] = model.shared_biases[bias]
    m[PREFIX + "seg_embed"] = [b.rel_attn.segment.seg_embed for b in model.blocks]
    for i, b in enumerate(model.blocks):
        p = f"{PREFIX}layer_{i}/"
        attn, ff = b.rel_attn, b.ff
        for w in ("q", "k", "v", "r", "o"):
            m[f"{p}rel_attn/{w}/kernel"] = getattr(attn, w)
        m[p + "rel_attn/LayerNorm/gamma"] = attn.ln_gamma
        m[p + "rel_attn/LayerNorm/beta"] = attn.ln_beta
        for n in ("layer_1", "layer_2"):
            m[f"{p}ff/{n}/kernel"] = getattr(ff, f"{n}_kernel")
            m[f"{p}ff/{n}/bias"] = getattr(ff, f"{n}_bias")
        m[p + "ff/LayerNorm/gamma"] = ff.ln_gamma
        m[p + "ff/LayerNorm/beta"] = ff.ln_beta
    m["model/lm_loss/bias"] = model.lm_bias
    return m


def _expected_shape(target) -> Tuple[int, ...]:
    if isinstance(target, list):
        return (len(target),) + tuple(target[0].shape)
    return tuple(target.shape)


def _value(target) -> np.ndarray:
    if isinstance(target, list):
        return np.stack([np.asarray(v.numpy()) for v in target])
    return np.asarray(target.numpy())


def _assign(target, value: np.ndarray) -> None:
    if isinstance(target, list):
        for v, x in zip(target, value):
            v.assign(x.astype(v.dtype))
    else:
        target.assign(value.astype(target.dtype))


def assign_from(name_map: Mapping[str, object], reader, source: str, optional: Tuple[str, ...] = ()) -> List[str]:
    """Assigns every variable of ``name_map`` from ``reader`` (``shape(name)``: the stored shape or None, known
    without reading the data; ``get(name)``: the array). Strict: every name and shape is checked before anything
    is assigned; then the tensors are read and assigned one at a time, so loading holds the model plus one
    tensor, not a second copy of the checkpoint.

    ``optional`` names may be absent (they keep their initial value and are returned).
    """
    problems, missing_optional, todo = [], [], []
    for name, target in name_map.items():
        found = reader.shape(name)
        expected = _expected_shape(target)
        if found is None:
            if name in optional:
                missing_optional.append(name)
            else:
                problems.append(f"{name}: missing (expected shape {list(expected)})")
            continue
        if tuple(found) != expected:
            problems.append(f"{name}: expected shape {list(expected)}, found {list(found)}")
            continue
        todo.append((name, target))
    if problems:
        raise CheckpointError(f"{source}: checkpoint does not match the model config:\n  " + "\n  ".join(problems))
    for name, target in todo:
        _assign(target, np.asarray(reader.get(name)))
    return missing_optional


# ---------------------------------------------------------------------------------------------- TF checkpoints
def write_tf_checkpoint(prefix: str, tensors: Mapping[str, np.ndarray]) -> None:
    """Writes a name-keyed TF checkpoint (the TF1 Saver's V2 format) at ``prefix``."""
    import tensorflow as tf

    names = list(tensors)
    with tf.device("CPU:0"):
        tf.raw_ops.SaveV2(prefix=prefix, tensor_names=names, shape_and_slices=[""] * len(names),
                          tensors=[tf.constant(tensors[n]) for n in names])


def find_tf_checkpoint(path: str) -> Optional[str]:
    """A checkpoint prefix from a prefix, an .index file or a directory; None if there is none."""
    import tensorflow as tf

    if path.endswith(".index") and os.path.isfile(path):
        return path[: -len(".index")]
    if os.path.isfile(path + ".index"):
        return path
    if os.path.isdir(path):
        latest = tf.train.latest_checkpoint(path)
        if latest:
            return latest
        idx = sorted(glob.glob(os.path.join(path, "*.index")))
        if len(idx) == 1:
            return idx[0][: -len(".index")]
        if len(idx) > 1:
            named = [i for i in idx if os.path.basename(i) == CKPT_NAME + ".index"]
            if named:
                return named[0][: -len(".index")]
            raise CheckpointError(f"{path}: several checkpoints inside ({[os.path.basename(i) for i in idx]}); "
                                  f"pass the prefix of one")
    return None


class TFCheckpointReader:
    """Reads tensors by name from a TF checkpoint; tolerates a leading scope (e.g. an Estimator's)."""

    def __init__(self, prefix: str):
        import tensorflow as tf

        try:
            self.reader = tf.train.load_checkpoint(prefix)
        except Exception as e:  # noqa: BLE001 - TF raises several types here
            raise CheckpointError(f"{prefix}: not a readable TF checkpoint ({e})") from None
        self.prefix = prefix
        self.shapes = self.reader.get_variable_to_shape_map()

    def names(self) -> List[str]:
        return sorted(self.shapes)

    def shape(self, name: str) -> Optional[Tuple[int, ...]]:
        return tuple(self.shapes[name]) if name in self.shapes else None

    def get(self, name: str) -> Optional[np.ndarray]:
        if name not in self.shapes:
            return None
        import tensorflow as tf

        try:
            return self.reader.get_tensor(name)
        except (IndexError, tf.errors.OpError) as e:  # a truncated or corrupted data file
            raise damage_error(self.prefix, e, name) from None


def _tf_message(e: BaseException) -> str:
    """TensorFlow's error text on one line, without its op and function decorations."""
    text = re.sub(r"\{\{function_node [^}]*\}\}|\[Op:\w+\]", "", str(e))
    return " ".join(text.split()) or type(e).__name__


def damage_error(prefix: str, error: BaseException, tensor: Optional[str] = None) -> CheckpointError:
    """The one-line error of a checkpoint whose data cannot be read back (``error``: what TensorFlow raised reading
    ``tensor``): its data file and what is wrong with it."""
    files = sorted(glob.glob(glob.escape(prefix) + ".data-*"))
    where = files[0] if len(files) == 1 else prefix + ".data-*"
    what = f"tensor {tensor!r}" if tensor else "a tensor"
    detail = _tf_message(error)
    if isinstance(error, IndexError) or "Read less bytes than requested" in detail:
        size = f"{os.path.getsize(where):,} bytes" if len(files) == 1 else "a data file"
        return CheckpointError(f"{where}: damaged checkpoint: truncated ({size}, {what} ends beyond it)")
    if "Checksum does not match" in detail:
        return CheckpointError(f"{where}: damaged checkpoint: corrupted ({what} fails its checksum)")
    if not files:
        return CheckpointError(f"{prefix}: damaged checkpoint: no data file ({prefix}.data-*) beside its index")
    return CheckpointError(f"{where}: damaged checkpoint: {what} cannot be read ({detail})")


def check_readable(prefix: str) -> None:
    """Reads every tensor of the TF checkpoint at ``prefix`` back once, one at a time (TensorFlow checks each
    one's length and CRC32C); a checkpoint that does not read whole raises ``damage_error`` (its file and what is
    wrong). The trainer calls it on the checkpoint it resumes from before restoring anything."""
    import tensorflow as tf

    if not os.path.isfile(prefix + ".index"):
        raise CheckpointError(f"{prefix}.index: damaged checkpoint: its index file is missing")
    try:
        dtypes = tf.train.load_checkpoint(prefix).get_variable_to_dtype_map()
    except (IndexError, tf.errors.OpError) as e:
        raise CheckpointError(f"{prefix}.index: damaged checkpoint: not a readable index ({_tf_message(e)})") from None
    for name, dtype in sorted(dtypes.items()):
        try:
            with tf.device("CPU:0"):
                tf.raw_ops.RestoreV2(prefix=prefix, tensor_names=[name], shape_and_slices=[""], dtypes=[dtype])
        except (IndexError, tf.errors.OpError) as e:
            raise damage_error(prefix, e, name) from None


# ---------------------------------------------------------------------------------------------- HuggingFace
HF_CONFIG = "config.json"
HF_WEIGHTS = "model.safetensors"
# Per-layer weights HF keeps one tensor per layer and the original stacks along axis 0.
_HF_STACKED = ("r_w_bias", "r_r_bias", "r_s_bias", "seg_embed")



def _hf_key_map(config: XLNetConfig) -> Dict[str, Tuple[str, ...]]:
    """Original name -> HF key(s) under ``transformer.`` (a tuple of per-layer keys for the stacked weights)."""
    m: Dict[str, Tuple[str, ...]] = {
        PREFIX + "word_embedding/lookup_table": ("word_embedding.weight",),
        PREFIX + "mask_emb/mask_emb": ("mask_emb",),
        "model/lm_loss/bias": ("lm_loss.bias",),
    }
    L = config.n_layer
    for bias in _HF_STACKED:
        m[PREFIX + bias] = tuple(f"layer.{i}.rel_attn.{bias}" for i in range(L))
    for i in range(L):
        p, h = f"{PREFIX}layer_{i}/", f"layer.{i}."
        for w in ("q", "k", "v", "r", "o"):
            m[f"{p}rel_attn/{w}/kernel"] = (f"{h}rel_attn.{w}",)
        m[p + "rel_attn/LayerNorm/gamma"] = (f"{h}rel_attn.layer_norm.weight",)
        m[p + "rel_attn/LayerNorm/beta"] = (f"{h}rel_attn.layer_norm.bias",)
        m[p + "ff/layer_1/kernel"] = (f"{h}ff.layer_1.weight",)  # torch Linear: [out, in]
        m[p + "ff/layer_1/bias"] = (f"{h}ff.layer_1.bias",)
        m[p + "ff/layer_2/kernel"] = (f"{h}ff.layer_2.weight",)
        m[p + "ff/layer_2/bias"] = (f"{h}ff.layer_2.bias",)
        m[p + "ff/LayerNorm/gamma"] = (f"{h}ff.layer_norm.weight",)
        m[p + "ff/LayerNorm/beta"] = (f"{h}ff.layer_norm.bias",)
    return m


def _hf_layout(name: str) -> Tuple[bool, bool]:
    """(stacked over layers, transposed) of an original name's HF tensor(s): the one rule both ways."""
    return name.split("/")[-1] in _HF_STACKED, "/ff/layer_" in name and name.endswith("/kernel")


def _hf_key(key: str) -> str:
    """The full HF key of a backbone key: under ``transformer.`` except the LM head's bias."""
    return key if key.startswith("lm_loss.") else "transformer." + key


class _SafetensorsFile:
    """One safetensors file through the ``safetensors`` package's NumPy API: the header (names, shapes) is read
    once; each tensor is copied out of a memory mapping that is closed right after, so the mapped pages do not
    stay resident while the rest loads. bfloat16 is widened to float32 (``ml_dtypes``, a TensorFlow dependency)."""

    def __init__(self, path: str):
        self.path = path
        with self._open() as f:
            self.shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}

    def _open(self):
        from safetensors import SafetensorError, safe_open

        try:
            return safe_open(self.path, framework="np")
        except (SafetensorError, OSError, ValueError) as e:
            raise CheckpointError(f"{self.path}: not a safetensors file ({e})") from None

    def get(self, key: str) -> np.ndarray:
        with self._open() as f:
            if f.get_slice(key).get_dtype() == "BF16":
                import ml_dtypes  # noqa: F401  (registers numpy's bfloat16)

                return f.get_tensor(key).astype(np.float32)
            return f.get_tensor(key)


def read_safetensors(path: str) -> Dict[str, np.ndarray]:
    """Every tensor of a safetensors file (bfloat16 as float32)."""
    f = _SafetensorsFile(path)
    return {k: f.get(k) for k in f.shapes}


def write_safetensors(path: str, tensors: Mapping[str, np.ndarray]) -> None:
    """Writes ``tensors`` with the ``safetensors`` package, marked as PyTorch weights (what transformers expects)."""
    from safetensors.numpy import save_file

    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, path, metadata={"format": "pt"})


class _TorchUnpickler(pickle.Unpickler):
    """Reads a torch.save zip (pytorch_model.bin) into numpy without importing torch."""

    _STORAGE = {"FloatStorage": np.float32, "HalfStorage": np.float16, "DoubleStorage": np.float64,
                "LongStorage": np.int64, "IntStorage": np.int32, "BFloat16Storage": "bf16",
                "ByteStorage": np.uint8, "BoolStorage": np.bool_}

    def __init__(self, fileobj, zf: zipfile.ZipFile, root: str):
        super().__init__(fileobj)
        self.zf, self.root = zf, root

    def find_class(self, module, name):
        if module == "torch._utils" and name == "_rebuild_tensor_v2":
            return self._rebuild
        if module == "torch" and name in self._STORAGE:
            return self._STORAGE[name]
        if module == "collections" and name == "OrderedDict":
            return OrderedDict
        if module == "torch._utils" and name == "_rebuild_parameter":
            return lambda data, requires_grad, hooks: data
        raise pickle.UnpicklingError(f"unsupported object in checkpoint: {module}.{name}")

    def persistent_load(self, pid):
        _, dtype, key, _location, _numel = pid
        raw = self.zf.read(f"{self.root}/data/{key}")
        if dtype == "bf16":
            return (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        return np.frombuffer(raw, dtype=np.dtype(dtype).newbyteorder("<"))

    @staticmethod
    def _rebuild(storage, offset, size, stride, *args):
        if not size:
            return storage[offset].copy()
        itemsize = storage.dtype.itemsize
        return np.lib.stride_tricks.as_strided(storage[offset:], shape=tuple(size),
                                               strides=tuple(s * itemsize for s in stride)).copy()


def read_torch_bin(path: str) -> Dict[str, np.ndarray]:
    if not zipfile.is_zipfile(path):
        raise CheckpointError(f"{path}: not a torch zip checkpoint (legacy pickles are not supported; "
                              f"re-save it with a recent torch or as safetensors)")
    with zipfile.ZipFile(path) as zf:
        pkl = [n for n in zf.namelist() if n.endswith("data.pkl")]
        if not pkl:
            raise CheckpointError(f"{path}: no data.pkl inside")
        root = pkl[0][: -len("/data.pkl")]
        return _TorchUnpickler(io.BytesIO(zf.read(pkl[0])), zf, root).load()


def _hf_sources(directory: str) -> Dict[str, Tuple[Tuple[int, ...], Callable[[], np.ndarray]]]:
    """Key -> (shape, a reader of that tensor) for every tensor of a HuggingFace directory (safetensors preferred,
    read one tensor at a time; sharded indexes supported)."""
    files = None
    for index_name in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        index = os.path.join(directory, index_name)
        if os.path.isfile(index):
            with open(index) as f:
                files = [os.path.join(directory, fn) for fn in sorted(set(json.load(f)["weight_map"].values()))]
            break
    if files is None:
        files = [p for p in (os.path.join(directory, n) for n in (HF_WEIGHTS, "pytorch_model.bin"))
                 if os.path.isfile(p)][:1]
    if not files:
        raise CheckpointError(f"{directory}: no {HF_WEIGHTS} or pytorch_model.bin")
    sources: Dict[str, Tuple[Tuple[int, ...], Callable[[], np.ndarray]]] = {}
    for path in files:
        if path.endswith(".safetensors"):
            st = _SafetensorsFile(path)
            sources.update({k: (shape, lambda k=k, st=st: st.get(k)) for k, shape in st.shapes.items()})
        else:
            sources.update({k: (v.shape, lambda v=v: v) for k, v in read_torch_bin(path).items()})
    return sources


class HFReader:
    """Serves HF tensors under original names (prefix 'transformer.' optional; Linear kernels transposed), each
    read when asked for."""

    def __init__(self, directory: str, config: XLNetConfig):
        prefix = "transformer."
        self.sources = {(k[len(prefix):] if k.startswith(prefix) else k): f for k, f in _hf_sources(directory).items()}
        self.keys = _hf_key_map(config)
        self.directory = directory

    def _keys(self, name: str) -> Optional[Tuple[str, ...]]:
        keys = self.keys.get(name)
        return None if keys is None or any(k not in self.sources for k in keys) else keys

    def shape(self, name: str) -> Optional[Tuple[int, ...]]:
        keys = self._keys(name)
        if keys is None:
            return None
        stacked, transposed = _hf_layout(name)
        shapes = sorted({tuple(self.sources[k][0]) for k in keys})
        if len(shapes) > 1:
            raise CheckpointError(f"{self.directory}: {name}: its per-layer tensors differ in shape ({shapes})")
        shape = ((len(keys),) if stacked else ()) + shapes[0]
        return shape[::-1] if transposed else shape

    def get(self, name: str) -> Optional[np.ndarray]:
        keys = self._keys(name)
        if keys is None:
            return None
        stacked, transposed = _hf_layout(name)
        arr = np.stack([self.sources[k][1]() for k in keys]) if stacked else self.sources[keys[0]][1]()
        return arr.T if transposed else arr


class _SharedBiases:
    """A reader seen by a model with ``untie_r=False`` (shared [n_head, d_head] biases): per-layer copies are
    accepted when all layers are equal (checked with the shapes, before anything is assigned)."""

    def __init__(self, reader):
        self.reader = reader

    def _per_layer(self, name: str) -> bool:
        shape = self.reader.shape(name)
        return name.split("/")[-1] in ("r_w_bias", "r_r_bias", "r_s_bias") and shape is not None and len(shape) == 3

    def shape(self, name: str) -> Optional[Tuple[int, ...]]:
        if not self._per_layer(name):
            return self.reader.shape(name)
        val = self.reader.get(name)
        if not all(np.array_equal(val[0], v) for v in val):
            raise CheckpointError(f"{name}: the checkpoint has per-layer (untied) values but the config "
                                  f"says untie_r=false")
        return tuple(val.shape[1:])

    def get(self, name: str) -> Optional[np.ndarray]:
        val = self.reader.get(name)
        return val[0] if self._per_layer(name) else val


# ---------------------------------------------------------------------------------------------- entry points
def detect_format(path: str) -> str:
    """'own' | 'original' | 'hf' for a path (directory or checkpoint prefix)."""
    if os.path.isdir(path):
        if os.path.isfile(os.path.join(path, OWN_CONFIG)):
            return "own"
        if any(os.path.isfile(os.path.join(path, n)) for n in
               ("model.safetensors", "pytorch_model.bin", "model.safetensors.index.json",
                "pytorch_model.bin.index.json")):
            return "hf"
        if find_tf_checkpoint(path):
            return "original"
        raise CheckpointError(f"{path}: no checkpoint found (expected {OWN_CONFIG}, an original TF checkpoint "
                              f"with xlnet_config.json, or a HuggingFace model.safetensors/pytorch_model.bin)")
    if find_tf_checkpoint(path):
        return "original"
    raise CheckpointError(f"{path}: not a checkpoint directory or prefix")


_IMPLEMENTATION = {"own": "xlnet-tf", "original": "the original XLNet", "hf": "transformers"}
_CONFIG_NAMES = {"own": (OWN_CONFIG,), "hf": ("config.json",), "original": ("xlnet_config.json", "config.json")}


def config_file(path: str, fmt: str) -> Optional[str]:
    """The config json next to the checkpoint at ``path`` (format ``fmt``), or None."""
    base = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
    found = [p for p in (os.path.join(base, n) for n in _CONFIG_NAMES[fmt]) if os.path.isfile(p)]
    return found[0] if found else None


def resolve_config(path: str, fmt: str, config: Optional[XLNetConfig], overrides: dict,
                   fix: str = "pass config=XLNetConfig(...)") -> XLNetConfig:
    """``config`` (with ``overrides``), else the config next to the checkpoint, read in the names of the format's
    own implementation (``config.py``'s docstring); ``fix``: how the caller's user gives one when there is none (the
    Python API's argument, a command's flag). Logs one line naming the feed-forward activation in use and how to
    choose the other GELU."""
    if config is not None:
        cfg = config.replace(**overrides) if overrides else config
        log.info("%s: %s", path, describe_activation(cfg.ff_activation, "as configured"))
        return cfg
    found = config_file(path, fmt)
    if found is None:
        raise CheckpointError(f"{path}: no {' or '.join(_CONFIG_NAMES[fmt])} next to the checkpoint; {fix}")
    cfg = XLNetConfig.from_json_file(found, names="hf" if fmt == "hf" else "original", **overrides)
    how = ("as given" if "ff_activation" in overrides
           else f"{os.path.basename(found)} read as {_IMPLEMENTATION[fmt]} reads it")
    log.info("%s: %s", path, describe_activation(cfg.ff_activation, how))
    return cfg


def reader_for(path: str, fmt: str, config: XLNetConfig):
    """An object with get(original_name) -> ndarray|None for any supported format."""
    if fmt == "hf":
        return HFReader(path, config)
    prefix = find_tf_checkpoint(path)
    if prefix is None:
        raise CheckpointError(f"{path}: no TF checkpoint found")
    return TFCheckpointReader(prefix)


def load_backbone_weights(model, path: str, fmt: Optional[str] = None) -> object:
    """Fills every backbone weight of ``model`` from ``path``; returns the reader (heads may read more)."""
    fmt = fmt or detect_format(path)
    reader = reader_for(path, fmt, model.config)
    # The LM bias only exists in pretraining checkpoints (and HF's LM-head model): optional.
    assign_from(backbone_name_map(model), reader if model.config.untie_r else _SharedBiases(reader), source=path,
                optional=("model/lm_loss/bias",))
    return reader


def load_pretrained(cls, path: str, config: Optional[XLNetConfig] = None, **overrides):
    fmt = detect_format(path)
    cfg = resolve_config(path, fmt, config, overrides)
    model = cls(cfg)
    load_backbone_weights(model, path, fmt)
    return model


def backbone_tensors(model) -> "OrderedDict[str, np.ndarray]":
    return OrderedDict((name, _value(t)) for name, t in backbone_name_map(model).items())


@dataclasses.dataclass
class HFHead:
    """A task head in HuggingFace's layout: its config fields (its model class under ``architectures``) and its
    tensors (HF keys); ``Head.huggingface_config`` / ``huggingface_tensors``."""
    config: Dict[str, object]
    tensors: Dict[str, np.ndarray]


def hf_config(config: XLNetConfig, head: Optional[HFHead] = None) -> Dict[str, object]:
    """The ``config.json`` with which transformers' XLNet computes what ``config`` computes (inference)."""
    c = config
    if c.n_head * c.d_head != c.d_model:
        raise CheckpointError(f"HuggingFace's XLNet needs d_head = d_model / n_head; this model has d_model="
                              f"{c.d_model}, n_head={c.n_head}, d_head={c.d_head}")
    out = {"architectures": ["XLNetLMHeadModel"], "model_type": "xlnet",
           "vocab_size": c.n_token, "d_model": c.d_model, "n_layer": c.n_layer, "n_head": c.n_head,
           "d_head": c.d_head, "d_inner": c.d_inner, "ff_activation": TO_HF_ACTIVATION[c.ff_activation],
           "untie_r": c.untie_r, "attn_type": c.attn_type, "bi_data": c.bi_data, "clamp_len": c.clamp_len,
           "same_length": c.same_length, "mem_len": c.mem_len or None, "reuse_len": c.reuse_len or None,
           "dropout": c.dropout, "layer_norm_eps": c.layer_norm_eps, "initializer_range": c.initializer_range,
           "torch_dtype": "float32"}
    head_config = dict(head.config) if head else {}
    clash = sorted(k for k, v in head_config.items() if k != "architectures" and k in out and out[k] != v)
    if clash:
        raise CheckpointError("the head and the backbone need different values of " + ", ".join(
            f"{k} (backbone {out[k]!r}, head {head_config[k]!r})" for k in clash) + " in HuggingFace's one config")
    out.update(head_config)
    return out


def hf_backbone_tensors(model) -> "OrderedDict[str, np.ndarray]":
    """The backbone's weights under HF keys (``transformer.`` prefixed; the reverse of ``HFReader.get``).
    HF holds r_w/r_r/r_s biases per layer: shared ones (``untie_r=false``) are repeated."""
    c = model.config
    keys = _hf_key_map(c)
    out: "OrderedDict[str, np.ndarray]" = OrderedDict()
    for name, value in backbone_tensors(model).items():
        stacked, transposed = _hf_layout(name)
        value = value.T if transposed else value
        if stacked and value.ndim == 2:  # a shared bias [n_head, d_head]
            value = np.stack([value] * c.n_layer)
        for key, part in zip(keys[name], value if stacked else [value]):
            out[_hf_key(key)] = part
    return out


SAVE_FORMATS = ("own", "huggingface")


def save_pretrained(model, directory: str, extra: Optional[Mapping[str, np.ndarray]] = None, format: str = "own",
                    hf_head: Optional[HFHead] = None) -> None:
    """Writes ``directory`` atomically (a temp directory renamed over it once complete).

    ``format="own"``: our format (``extra``: more tensors under original names, e.g. a fine-tuned head).
    ``format="huggingface"``: ``config.json`` + ``model.safetensors`` for transformers' PyTorch XLNet:
    ``XLNetLMHeadModel`` (and ``XLNetModel``) for a backbone, or ``hf_head``'s class for a fine-tuned model."""
    if format not in SAVE_FORMATS:
        raise ValueError(f"format: expected one of {SAVE_FORMATS}, got {format!r}")
    if format == "huggingface":
        config = hf_config(model.config, hf_head)  # checked before anything is written
        tensors = hf_backbone_tensors(model)
        if hf_head is not None:  # a task model has no LM head
            del tensors["lm_loss.bias"]
            tensors.update(hf_head.tensors)
        with atomic_directory(directory) as tmp:
            write_safetensors(os.path.join(tmp, HF_WEIGHTS), tensors)
            write_json(os.path.join(tmp, HF_CONFIG), config, indent=2, sort_keys=True)
        return
    with atomic_directory(directory) as tmp:
        tensors = backbone_tensors(model)
        if extra:
            tensors.update(extra)
        write_tf_checkpoint(os.path.join(tmp, CKPT_NAME), tensors)
        model.config.to_json_file(os.path.join(tmp, OWN_CONFIG))
        model.config.to_json_file(os.path.join(tmp, "xlnet_config.json"), original=True)
        with open(os.path.join(tmp, "checkpoint"), "w") as f:
            f.write(f'model_checkpoint_path: "{CKPT_NAME}"\n')
