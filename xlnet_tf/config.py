"""XLNetConfig: the checkpoint-bound shape (xlnet_config.json) plus the per-run options.

Reads three json layouts:
* the original release's ``xlnet_config.json`` (n_layer, d_model, n_head, d_head, d_inner, ff_activation,
  untie_r, n_token);
* HuggingFace's ``config.json`` (vocab_size instead of n_token, plus run options);
* our own ``xlnet_tf_config.json`` (every field below).

Activation names (``ff_activation``): a checkpoint computes what its own implementation computes with the name
its config holds. In our names (the original's and our format's): ``"gelu"`` is the original's tanh approximation
(what the released weights were trained with), ``"gelu_exact"`` the erf form, ``"relu"``. An HF ``config.json``
(it has ``model_type``, ``architectures`` or ``vocab_size``) is read in transformers' names (``HF_ACTIVATIONS``):
its ``"gelu"`` (transformers' default) is the erf form, ``"gelu_new"`` the tanh one. A checkpoint's format
decides when it is known (``checkpoint.resolve_config``: an HF directory's config in transformers' names, an
original checkpoint's in the original's, even a ``config.json`` beside it). ``describe_activation`` says which
function is in use (``resolve_config`` logs it); ``ff_activation=`` overrides it.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
from typing import Any, Dict, Optional

from xlnet_tf.fileutil import write_json

# Keys of the original xlnet_config.json (checkpoint-bound shape).
SHAPE_KEYS = ("n_layer", "d_model", "n_head", "d_head", "d_inner", "ff_activation", "untie_r", "n_token")
# Options that may differ from run to run over the same weights.
RUN_KEYS = ("dropout", "dropatt", "mem_len", "reuse_len", "attn_type", "bi_data", "clamp_len", "same_length",
            "initializer_range", "layer_norm_eps", "recompute", "pos_dropout", "accelerate")

# The accelerations ``accelerate`` may name (``xlnet_tf/accel``).
ACCELERATIONS = ("xla", "kernels", "chunks")

_ACTIVATION_ALIASES = {"gelu": "gelu", "gelu_new": "gelu", "gelu_tanh": "gelu", "gelu_pytorch_tanh": "gelu",
                       "gelu_exact": "gelu_exact", "gelu_erf": "gelu_exact", "gelu_python": "gelu_exact",
                       "relu": "relu"}
# transformers' ACT2FN names (what an HF config.json says) -> ours for the same function; HF's "gelu" is erf.
HF_ACTIVATIONS = {"gelu": "gelu_exact", "gelu_python": "gelu_exact", "gelu_new": "gelu", "gelu_pytorch_tanh": "gelu",
                  "gelu_fast": "gelu", "gelu_accurate": "gelu", "relu": "relu"}
# ours -> the ACT2FN name the HF export writes (read back through HF_ACTIVATIONS: the same function)
TO_HF_ACTIVATION = {"gelu": "gelu_new", "gelu_exact": "gelu", "relu": "relu"}
_ACTIVATION_FORMS = {"gelu": "the original XLNet's tanh-approximation GELU", "gelu_exact": "the exact erf GELU",
                     "relu": "ReLU"}


def describe_activation(name: str, why: str = "") -> str:
    """One phrase for a log line: the function ``ff_activation=name`` computes (``why``: where the name came from)
    and how to choose the other GELU."""
    other = {"gelu": "gelu_exact", "gelu_exact": "gelu"}.get(name)
    hint = f"; ff_activation={other!r} selects {_ACTIVATION_FORMS[other]}" if other else ""
    return f"feed-forward activation: {_ACTIVATION_FORMS[name]} (ff_activation={name!r}{', ' + why if why else ''}){hint}"


def _check_type(source: str, key: str, value: Any, annotation: str) -> None:
    """JSON types per field: booleans only from JSON booleans, integers not from strings or booleans."""
    kind = {"bool": bool, "int": int, "float": (int, float), "str": str}.get(str(annotation))
    if kind is None:
        return
    ok = isinstance(value, kind) and (kind is bool or not isinstance(value, bool))
    if not ok:
        want = {"bool": "a JSON boolean (true/false)", "int": "an integer", "float": "a number",
                "str": "a string"}[str(annotation)]
        raise ValueError(f"{source}: {key}: expected {want}, got {json.dumps(value)}")


@dataclasses.dataclass
class XLNetConfig:
    # --- shape (xlnet_config.json) ---
    n_layer: int = 12
    d_model: int = 768
    n_head: int = 12
    d_head: int = 64
    d_inner: int = 3072
    ff_activation: str = "gelu"
    untie_r: bool = True
    n_token: int = 32000
    # --- run options ---
    dropout: float = 0.1
    dropatt: float = 0.1
    mem_len: int = 0
    reuse_len: int = 0
    attn_type: str = "bi"          # "bi" | "uni"
    bi_data: bool = False
    clamp_len: int = -1            # <= 0: no clamping
    same_length: bool = False
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    recompute: bool = False        # recompute each block's activations in the backward pass
    # Dropout on the relative positional encodings: "per_example" (the original: tiled over the batch, then
    # dropped) or "shared" (one mask for the batch: the projection runs once, not per example, and the fused
    # training kernel applies; ~10% faster fine-tuning steps for XLNet-Base at 8x128, PERFORMANCE.md).
    pos_dropout: str = "per_example"
    # The measured speed paths beside the math (xlnet_tf/accel: XLA clusters with hand-written gradients, the
    # compiled attention kernels, query chunks): true (all), false (the plain TensorFlow ops
    # only) or a comma list of ACCELERATIONS.
    accelerate: object = True

    def __post_init__(self):
        self.validate()

    # ------------------------------------------------------------------ checks
    def validate(self) -> None:
        for key in ("n_layer", "d_model", "n_head", "d_head", "d_inner", "n_token"):
            val = getattr(self, key)
            if not isinstance(val, int) or isinstance(val, bool) or val <= 0:
                raise ValueError(f"XLNetConfig.{key}: expected a positive integer, got {val!r}")
        act = _ACTIVATION_ALIASES.get(str(self.ff_activation).lower())
        if act is None:
            raise ValueError(f"XLNetConfig.ff_activation: expected one of {sorted(_ACTIVATION_ALIASES)}, "
                             f"got {self.ff_activation!r}")
        self.ff_activation = act
        if self.attn_type not in ("bi", "uni"):
            raise ValueError(f"XLNetConfig.attn_type: expected 'bi' or 'uni', got {self.attn_type!r}")
        for key in ("dropout", "dropatt"):
            if not 0.0 <= float(getattr(self, key)) < 1.0:
                raise ValueError(f"XLNetConfig.{key}: expected a rate in [0, 1), got {getattr(self, key)!r}")
        for key in ("mem_len", "reuse_len"):
            if getattr(self, key) is None:
                setattr(self, key, 0)
            if int(getattr(self, key)) < 0:
                raise ValueError(f"XLNetConfig.{key}: expected >= 0, got {getattr(self, key)!r}")
        if self.clamp_len is None:
            self.clamp_len = -1
        if self.pos_dropout not in ("per_example", "shared"):
            raise ValueError(f"XLNetConfig.pos_dropout: expected 'per_example' or 'shared', got {self.pos_dropout!r}")
        self.accelerations  # noqa: B018  (checks the option)

    @property
    def accelerations(self) -> frozenset:
        """The accelerations ``accelerate`` selects."""
        option = self.accelerate
        if isinstance(option, bool):
            return frozenset(ACCELERATIONS) if option else frozenset()
        names = frozenset(n.strip() for n in option.split(",") if n.strip()) if isinstance(option, str) else None
        unknown = None if names is None else sorted(names - set(ACCELERATIONS))
        if names is None or unknown:
            raise ValueError(f"XLNetConfig.accelerate: expected true, false or a comma list of "
                             f"{', '.join(ACCELERATIONS)}, got {option!r}")
        return names

    # ------------------------------------------------------------------ presets
    @classmethod
    def base(cls, **overrides) -> "XLNetConfig":
        return cls(n_layer=12, d_model=768, n_head=12, d_head=64, d_inner=3072, **overrides)

    @classmethod
    def large(cls, **overrides) -> "XLNetConfig":
        return cls(n_layer=24, d_model=1024, n_head=16, d_head=64, d_inner=4096, **overrides)

    @classmethod
    def preset(cls, name: str, **overrides) -> "XLNetConfig":
        presets = {"base": cls.base, "large": cls.large,
                   "tiny": lambda **o: cls(n_layer=2, d_model=64, n_head=2, d_head=32, d_inner=128, **o),
                   "small": lambda **o: cls(n_layer=4, d_model=256, n_head=4, d_head=64, d_inner=1024, **o)}
        if name not in presets:
            raise ValueError(f"unknown config preset {name!r}; expected one of {sorted(presets)} or a json path")
        return presets[name](**overrides)

    # ------------------------------------------------------------------ (de)serialisation
    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)

    def to_original_dict(self) -> Dict[str, Any]:
        """The original release's xlnet_config.json content."""
        return {k: getattr(self, k) for k in SHAPE_KEYS}

    def replace(self, **overrides) -> "XLNetConfig":
        unknown = set(overrides) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ValueError(f"unknown XLNetConfig field(s): {sorted(unknown)}")
        return dataclasses.replace(self, **overrides)

    @classmethod
    def from_dict(cls, d: Dict[str, Any], source: str = "<dict>", names: Optional[str] = None,
                  **overrides) -> "XLNetConfig":
        """Builds a config from an original, HuggingFace or own dict; ``overrides`` win. ``names``: whose
        activation names the dict holds, "hf" (transformers') or "original" (the original's and ours), as the
        checkpoint format it came with says; None: by its layout (HF's keys: "hf")."""
        d = dict(d)
        hf = "model_type" in d or "architectures" in d or "vocab_size" in d  # HF configs carry more keys
        if "vocab_size" in d and "n_token" not in d:  # HuggingFace layout
            d["n_token"] = d.pop("vocab_size")
        if (names == "hf" or (names is None and hf)) and isinstance(d.get("ff_activation"), str):  # module docstring
            d["ff_activation"] = HF_ACTIVATIONS.get(d["ff_activation"].lower(), d["ff_activation"])
        if "mem_len" in d and d["mem_len"] is None:
            d["mem_len"] = 0
        fields = {f.name: f for f in dataclasses.fields(cls)}
        missing = [k for k in SHAPE_KEYS if k not in d and k not in overrides]
        if missing:
            raise ValueError(f"{source}: not an XLNet config, missing key(s) {missing} "
                             f"(expected the keys of xlnet_config.json: {list(SHAPE_KEYS)})")
        for key in d:
            if key in fields:
                continue
            close = difflib.get_close_matches(key, list(fields), n=1, cutoff=0.75)
            if close or not hf:
                hint = f"; did you mean {close[0]!r}?" if close else f" (known keys: {sorted(fields)})"
                raise ValueError(f"{source}: unknown config key {key!r}{hint}")
        for key, value in d.items():
            if key in fields and value is not None:
                _check_type(source, key, value, fields[key].type)
        kwargs = {k: v for k, v in d.items() if k in fields}
        kwargs.update(overrides)
        try:
            return cls(**kwargs)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{source}: {e}") from None

    @classmethod
    def from_json_file(cls, path: str, names: Optional[str] = None, **overrides) -> "XLNetConfig":
        try:
            with open(path, "r", encoding="utf-8") as f:
                d = json.load(f)
        except FileNotFoundError:
            raise FileNotFoundError(f"config file not found: {path}") from None
        except ValueError as e:
            raise ValueError(f"{path}: not valid json ({e})") from None
        if not isinstance(d, dict):
            raise ValueError(f"{path}: expected a json object, got {type(d).__name__}")
        return cls.from_dict(d, source=path, names=names, **overrides)

    @classmethod
    def load(cls, spec: str, **overrides) -> "XLNetConfig":
        """A preset name (tiny/small/base/large), a json file, or a directory holding one."""
        if os.path.isdir(spec):
            for name in ("xlnet_tf_config.json", "xlnet_config.json", "config.json"):
                if os.path.isfile(os.path.join(spec, name)):
                    return cls.from_json_file(os.path.join(spec, name), **overrides)
            raise FileNotFoundError(f"{spec}: no xlnet_tf_config.json, xlnet_config.json or config.json inside")
        if os.path.isfile(spec) or spec.endswith(".json"):
            return cls.from_json_file(spec, **overrides)
        return cls.preset(spec, **overrides)

    def to_json_file(self, path: str, original: bool = False) -> None:
        write_json(path, self.to_original_dict() if original else self.to_dict(), indent=2, sort_keys=True)
