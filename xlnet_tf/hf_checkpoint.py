"""HuggingFace XLNet directories: the key map between transformers' names and the original's (``hf_key_map``,
``hf_layout``: which weights are per-layer stacks, which are transposed), reading ``model.safetensors`` (memory
mapped, one tensor at a time), sharded indexes and ``pytorch_model.bin`` (without torch) under original names
(``HFReader``), and what the export writes (``hf_config``, ``write_safetensors``, a head's ``HFHead``).
``checkpoint.py`` uses these to load and save."""

from __future__ import annotations

import base64
import dataclasses
import io
import json
import os
import pickle
import zipfile
from collections import OrderedDict
from typing import Callable, Dict, Mapping, Optional, Tuple

import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from xlnet_tf.config import TO_HF_ACTIVATION, XLNetConfig
from xlnet_tf.tf_checkpoint import PREFIX, CheckpointError

HF_CONFIG = "config.json"
HF_WEIGHTS = "model.safetensors"
# Per-layer weights HF keeps one tensor per layer and the original stacks along axis 0.
_HF_STACKED = ("r_w_bias", "r_r_bias", "r_s_bias", "seg_embed")



def hf_key_map(config: XLNetConfig) -> Dict[str, Tuple[str, ...]]:
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


def hf_layout(name: str) -> Tuple[bool, bool]:
    """(stacked over layers, transposed) of an original name's HF tensor(s): the one rule both ways."""
    return name.split("/")[-1] in _HF_STACKED, "/ff/layer_" in name and name.endswith("/kernel")


def hf_key(key: str) -> str:
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
        try:
            return safe_open(self.path, framework="np")
        except (SafetensorError, OSError, ValueError) as e:
            raise CheckpointError(f"{self.path}: not a safetensors file ({e})") from None

    def get(self, key: str) -> np.ndarray:
        with self._open() as f:
            if f.get_slice(key).get_dtype() == "BF16":
                import ml_dtypes  # noqa: F401  (registers numpy's bfloat16; slow: ~1 s, bfloat16 files only)

                return f.get_tensor(key).astype(np.float32)
            return f.get_tensor(key)


def read_safetensors(path: str) -> Dict[str, np.ndarray]:
    """Every tensor of a safetensors file (bfloat16 as float32)."""
    f = _SafetensorsFile(path)
    return {k: f.get(k) for k in f.shapes}


def write_safetensors(path: str, tensors: Mapping[str, np.ndarray]) -> None:
    """Writes ``tensors`` with the ``safetensors`` package, marked as PyTorch weights (what transformers expects)."""
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
        self.keys = hf_key_map(config)
        self._backbone_keys = {k for keys in self.keys.values() for k in keys}
        self.directory = directory

    def head_keys(self) -> Tuple[str, ...]:
        """The keys outside the backbone and its LM head: a task head's (``Head.huggingface_weights``)."""
        return tuple(sorted(k for k in self.sources if k not in self._backbone_keys and not k.startswith("lm_loss.")))

    def head_shape(self, key: str) -> Optional[Tuple[int, ...]]:
        return tuple(self.sources[key][0]) if key in self.sources else None

    def head_get(self, key: str) -> np.ndarray:
        return self.sources[key][1]()

    def _keys(self, name: str) -> Optional[Tuple[str, ...]]:
        keys = self.keys.get(name)
        return None if keys is None or any(k not in self.sources for k in keys) else keys

    def shape(self, name: str) -> Optional[Tuple[int, ...]]:
        keys = self._keys(name)
        if keys is None:
            return None
        stacked, transposed = hf_layout(name)
        shapes = sorted({tuple(self.sources[k][0]) for k in keys})
        if len(shapes) > 1:
            raise CheckpointError(f"{self.directory}: {name}: its per-layer tensors differ in shape ({shapes})")
        shape = ((len(keys),) if stacked else ()) + shapes[0]
        return shape[::-1] if transposed else shape

    def get(self, name: str) -> Optional[np.ndarray]:
        keys = self._keys(name)
        if keys is None:
            return None
        stacked, transposed = hf_layout(name)
        arr = np.stack([self.sources[k][1]() for k in keys]) if stacked else self.sources[keys[0]][1]()
        return arr.T if transposed else arr



def hf_tokenizer_json(spiece_model_file: str, lower: bool, remove_space: bool, keep_accents: bool) -> dict:
    """The ``tokenizer.json`` with which transformers' fast XLNet tokenizer gives the ids of ``XLNetTokenizer`` (the
    original's preprocessing, then SentencePiece's unigram model): the pieces and scores of ``spiece.model``, its
    normaliser's precompiled character map, the preprocessing as normalisers, ``<sep> <cls>`` appended. What
    transformers' own conversion of the slow tokenizer lacks: the strip of leading and trailing spaces, and the
    user-defined pieces (``-``, ``.``, ...) kept as pieces, not added tokens (added tokens split the text before the
    model, so the piece after a hyphen got a word start: 15% of SST-2 sentences differed). Left: SentencePiece's
    digit-comma rule (``tokenizer.py``), and its unigram ties broken otherwise (2 of 20,000 SST-2 sentences)."""

    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto()
    with open(spiece_model_file, "rb") as f:
        proto.ParseFromString(f.read())
    pieces = [(p.piece, float(p.score)) for p in proto.pieces]
    specials = {p.piece: i for i, p in enumerate(proto.pieces) if p.type in (2, 3)}  # UNKNOWN, CONTROL

    def replace(pattern, content, regex=False):
        return {"type": "Replace", "pattern": {"Regex" if regex else "String": pattern}, "content": content}

    norm = ([{"type": "Strip", "strip_left": True, "strip_right": True}] if remove_space else []) + \
        [replace("``", '"'), replace("''", '"')] + \
        ([] if keep_accents else [{"type": "NFKD"}, {"type": "StripAccents"}]) + \
        ([{"type": "Lowercase"}] if lower else []) + \
        [{"type": "Precompiled",
          "precompiled_charsmap": base64.b64encode(proto.normalizer_spec.precompiled_charsmap).decode()}] + \
        ([replace(" {2,}", " ", regex=True)] if remove_space else [])
    meta = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": True}
    seq = lambda seg, t: {"Sequence": {"id": seg, "type_id": t}}  # noqa: E731
    tok = lambda name, t: {"SpecialToken": {"id": name, "type_id": t}}  # noqa: E731
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": i, "content": p, "single_word": False, "lstrip": p == "<mask>", "rstrip": False,
                          "normalized": False, "special": True} for p, i in specials.items()],
        "normalizer": {"type": "Sequence", "normalizers": norm}, "pre_tokenizer": meta,
        "post_processor": {
            "type": "TemplateProcessing", "single": [seq("A", 0), tok("<sep>", 0), tok("<cls>", 2)],
            "pair": [seq("A", 0), tok("<sep>", 0), seq("B", 1), tok("<sep>", 1), tok("<cls>", 2)],
            "special_tokens": {n: {"id": n, "ids": [specials[n]], "tokens": [n]} for n in ("<cls>", "<sep>")}},
        "decoder": meta,
        "model": {"type": "Unigram", "unk_id": specials.get("<unk>", 0), "vocab": [list(p) for p in pieces],
                  "byte_fallback": False},
    }


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
