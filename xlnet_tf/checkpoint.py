"""Checkpoint I/O: the original TF1 release, HuggingFace XLNet weights, and our own format. The files of each
format are read and written in ``tf_checkpoint.py`` and ``hf_checkpoint.py``; this module holds the name map,
the format and config of a path, and loading and saving.

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
``--export_huggingface``) reads the HF name map the other way (``hf_key_map`` + ``hf_layout``: which weights
are per-layer stacks, which are transposed). The config names the same function in transformers' names
(``config.TO_HF_ACTIVATION``: our tanh GELU ``gelu_new``, the erf form ``gelu``, read back as the same functions);
shared biases (``untie_r=false``) are repeated per layer (HF's modules always hold one per layer);
HF derives ``d_head = d_model / n_head``, so other shapes are refused. A backbone is written as
``XLNetLMHeadModel`` (with the LM bias; the bare ``XLNetModel`` lists it as unused); a fine-tuned model as the HF
class of its head (``XLNetForSequenceClassification`` with ``summary_proj_to_labels=false``,
``XLNetForMultipleChoice``, ``XLNetForQuestionAnswering``). Not representable, refused before any work: deeper
head MLPs, the ``attn`` summary, and our ``mean`` summary (over real tokens; HF's averages the padding).
``tests/test_huggingface_export.py`` holds outputs and predictions equal (<= 1e-5 relative) through
transformers' classes on SST-2, STS-B, RACE and SQuAD dev rows. Given a tokenizer, both formats also hold
``spiece.model`` and what transformers' ``AutoTokenizer`` reads (``write_tokenizer``); an HF folder's head is read
back through the head's ``huggingface_weights`` (``TaskModel.load_init_checkpoint``), so what is saved comes back
whole (``tests/test_pretrained_roundtrip.py``). Names (``xlnet/xlnet-base-cased``) become folders in
``xlnet_tf/presets.py``, before any of this.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections import OrderedDict
from typing import List, Mapping, Optional, Tuple

import numpy as np

from xlnet_tf.config import XLNetConfig, describe_activation
from xlnet_tf.fileutil import Written, atomic_directory, check_replaceable, write_json
from xlnet_tf.hf_checkpoint import (HF_CONFIG, HF_WEIGHTS, HFHead, HFReader, hf_config, hf_key, hf_key_map, hf_layout,
                                    hf_tokenizer_json, write_safetensors)
from xlnet_tf.tf_checkpoint import (CKPT_NAME, PREFIX, CheckpointError, TFCheckpointReader, find_tf_checkpoint,
                                    write_tf_checkpoint)

OWN_CONFIG = "xlnet_tf_config.json"
SPIECE = "spiece.model"
TOKENIZER_CONFIG = "tokenizer_config.json"
TOKENIZER_JSON = "tokenizer.json"
TASK_FILE = "xlnet_tf_task.json"  # a Keras task model's class and arguments (tasks/keras_task.py)
SPECIAL_TOKENS_MAP = "special_tokens_map.json"
# transformers' XLNetTokenizer's special tokens (the pieces of spiece.model: xlnet_tf/tokenizer.py's SPECIAL_PIECES)
HF_SPECIAL_TOKENS = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "sep_token": "<sep>",
                     "pad_token": "<pad>", "cls_token": "<cls>", "mask_token": "<mask>",
                     "additional_special_tokens": ["<eop>", "<eod>"]}

log = logging.getLogger(__name__)


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


# ---------------------------------------------------------------------------------------------- readers' wrapper
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


def hf_backbone_tensors(model) -> "OrderedDict[str, np.ndarray]":
    """The backbone's weights under HF keys (``transformer.`` prefixed; the reverse of ``HFReader.get``).
    HF holds r_w/r_r/r_s biases per layer: shared ones (``untie_r=false``) are repeated."""
    c = model.config
    keys = hf_key_map(c)
    out: "OrderedDict[str, np.ndarray]" = OrderedDict()
    for name, value in backbone_tensors(model).items():
        stacked, transposed = hf_layout(name)
        value = value.T if transposed else value
        if stacked and value.ndim == 2:  # a shared bias [n_head, d_head]
            value = np.stack([value] * c.n_layer)
        for key, part in zip(keys[name], value if stacked else [value]):
            out[hf_key(key)] = part
    return out


SAVE_FORMATS = ("own", "huggingface")


# What each save_pretrained format writes (fileutil.Written): only an earlier such directory, or an empty one, is
# replaced. Both hold the tokenizer and the task's arguments when they have them.
_BESIDE = {SPIECE, TOKENIZER_CONFIG, SPECIAL_TOKENS_MAP, TOKENIZER_JSON, TASK_FILE}
EXTRA_FILES = {TASK_FILE}  # what save_pretrained's extra_files may name
OWN_WRITTEN = Written("xlnet_tf checkpoint", marks={OWN_CONFIG, "checkpoint", CKPT_NAME + ".index"},
                      names={CKPT_NAME + ".data-00000-of-00001", "xlnet_config.json"} | _BESIDE)
HF_WRITTEN = Written("HuggingFace export", marks={HF_CONFIG, HF_WEIGHTS}, names=_BESIDE)
# Either format replaces an earlier save_pretrained folder of either (the one being written named first)
SAVED_FOLDERS = {"own": (OWN_WRITTEN, HF_WRITTEN), "huggingface": (HF_WRITTEN, OWN_WRITTEN)}


def write_tokenizer(folder: str, tokenizer) -> None:
    """``spiece.model`` and the files with which transformers' ``AutoTokenizer`` builds the same XLNet tokenizer
    (``tokenizer_config.json``, ``special_tokens_map.json``, and ``tokenizer.json`` for its default fast tokenizer:
    ``hf_checkpoint.hf_tokenizer_json``; ``do_lower_case`` is read back by ``tokenizer_lower``)."""
    shutil.copyfile(tokenizer.spiece_model_file, os.path.join(folder, SPIECE))
    specials = dict(HF_SPECIAL_TOKENS)
    write_json(os.path.join(folder, SPECIAL_TOKENS_MAP), specials, indent=2, sort_keys=True)
    write_json(os.path.join(folder, TOKENIZER_CONFIG),
               dict(specials, tokenizer_class="XLNetTokenizer", do_lower_case=bool(tokenizer.lower),
                    remove_space=bool(tokenizer.remove_space), keep_accents=bool(tokenizer.keep_accents),
                    padding_side="left", model_max_length=1000000000000000019884624838656),
               indent=2, sort_keys=True)
    write_json(os.path.join(folder, TOKENIZER_JSON),
               hf_tokenizer_json(tokenizer.spiece_model_file, tokenizer.lower, tokenizer.remove_space,
                                 tokenizer.keep_accents))


def tokenizer_lower(folder: str) -> bool:
    """``do_lower_case`` of the ``tokenizer_config.json`` in ``folder`` (False without one)."""
    try:
        with open(os.path.join(folder, TOKENIZER_CONFIG), encoding="utf-8") as f:
            return bool(json.load(f).get("do_lower_case", False))
    except (OSError, ValueError, AttributeError):
        return False


def save_pretrained(model, directory: str, extra: Optional[Mapping[str, np.ndarray]] = None, format: str = "own",
                    hf_head: Optional[HFHead] = None, tokenizer=None, extra_files: Optional[Mapping] = None) -> None:
    """Writes ``directory`` atomically (a temp directory renamed over it once complete); an existing directory
    only when it is empty or an earlier one of the same format (``OWN_WRITTEN`` / ``HF_WRITTEN``, refused in one
    line before any work otherwise).

    ``format="own"``: our format (``extra``: more tensors under original names, e.g. a fine-tuned head).
    ``format="huggingface"``: ``config.json`` + ``model.safetensors`` for transformers' PyTorch XLNet:
    ``XLNetLMHeadModel`` (and ``XLNetModel``) for a backbone, or ``hf_head``'s class for a fine-tuned model.
    ``tokenizer`` (an ``XLNetTokenizer``): written beside the weights (``write_tokenizer``); ``extra_files``:
    {name in ``EXTRA_FILES``: JSON value} written too."""
    bad = sorted(set(extra_files or ()) - EXTRA_FILES)
    if bad:
        raise ValueError(f"extra_files: {bad} are not among the files save_pretrained writes "
                         f"({sorted(EXTRA_FILES)})")
    if format not in SAVE_FORMATS:
        raise ValueError(f"format: expected one of {SAVE_FORMATS}, got {format!r}")
    check_replaceable(directory, *SAVED_FOLDERS[format])
    if format == "huggingface":
        config = hf_config(model.config, hf_head)  # checked before anything is written
        tensors = hf_backbone_tensors(model)
        if hf_head is not None:  # a task model has no LM head
            del tensors["lm_loss.bias"]
            tensors.update(hf_head.tensors)
        with atomic_directory(directory, *SAVED_FOLDERS[format]) as tmp:
            write_safetensors(os.path.join(tmp, HF_WEIGHTS), tensors)
            write_json(os.path.join(tmp, HF_CONFIG), config, indent=2, sort_keys=True)
            if tokenizer is not None:
                write_tokenizer(tmp, tokenizer)
            for name, value in (extra_files or {}).items():
                write_json(os.path.join(tmp, name), value, indent=2, sort_keys=True)
        return
    with atomic_directory(directory, *SAVED_FOLDERS[format]) as tmp:
        if tokenizer is not None:
            write_tokenizer(tmp, tokenizer)
        for name, value in (extra_files or {}).items():
            write_json(os.path.join(tmp, name), value, indent=2, sort_keys=True)
        tensors = backbone_tensors(model)
        if extra:
            tensors.update(extra)
        write_tf_checkpoint(os.path.join(tmp, CKPT_NAME), tensors)
        model.config.to_json_file(os.path.join(tmp, OWN_CONFIG))
        model.config.to_json_file(os.path.join(tmp, "xlnet_config.json"), original=True)
        with open(os.path.join(tmp, "checkpoint"), "w") as f:
            f.write(f'model_checkpoint_path: "{CKPT_NAME}"\n')
