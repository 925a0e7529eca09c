"""Model names: a name or a path in, a local folder out (``resolve``), for ``XLNetModel.from_pretrained``, the
Keras task models' ``from_pretrained`` and ``--init_checkpoint``. A local path always wins over a name.

Where a name's files come from (``PRESETS`` lists the known names, what each is and how big):

* a HuggingFace repo id (``xlnet/xlnet-base-cased``, or any repo holding an XLNet): ``huggingface_hub``'s
  ``snapshot_download`` into its cache, with its ``revision``, ``token`` and offline mode (``HF_HUB_OFFLINE=1`` or
  ``local_files_only=True``). Only what a model needs is fetched: ``config.json``, the weights (safetensors when
  the repo has them, else ``pytorch_model.bin``, read without unpickling anything but tensors), ``spiece.model``
  and the tokenizer's json files. ``HF_ENDPOINT`` is read at each call.
* an original release name (``xlnet_cased_L-12_H-768_A-12``, ``xlnet_cased_L-24_H-1024_A-16``): the release zip
  through ``keras.utils.get_file`` (its cache under ``KERAS_HOME``, its progress bar), extracted once; the folder
  is used only after the archive read whole and the files a model needs are there (a marker file of ours
  records it, so a later call needs no network).

Downloads are untrusted input: nothing from one is executed. A damaged or partial download (a cut archive, a
truncated weights file) fails in one line naming the file, is removed from the cache, and is fetched again on
the next call; a name that cannot be had (unknown, offline and not cached) fails in one line naming the name,
the cache and what to do.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import glob
import json
import logging
import os
import shutil
import zipfile
from typing import Dict, Optional

from safetensors import safe_open

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Preset:
    """A known name: ``source`` ("huggingface": ``repo`` is the HF repo id; "release": ``url`` the original zip)."""
    description: str
    size: str
    source: str
    repo: str = ""
    url: str = ""


_BASE = "XLNet-Base, cased: 12 layers, d_model 768, 12 heads, 117M parameters"
_LARGE = "XLNet-Large, cased: 24 layers, d_model 1024, 16 heads, 361M parameters"
RELEASE_URL = "https://storage.googleapis.com/xlnet/released_models/"
PRESETS: Dict[str, Preset] = {
    "xlnet/xlnet-base-cased": Preset(f"{_BASE}; HuggingFace's copy of the release", "0.47 GB", "huggingface",
                                     repo="xlnet/xlnet-base-cased"),
    "xlnet/xlnet-large-cased": Preset(f"{_LARGE}; HuggingFace's copy of the release", "1.44 GB", "huggingface",
                                      repo="xlnet/xlnet-large-cased"),
    "xlnet_cased_L-12_H-768_A-12": Preset(f"{_BASE}; the original TF1 release", "0.43 GB zip", "release",
                                          url=RELEASE_URL + "cased_L-12_H-768_A-12.zip"),
    "xlnet_cased_L-24_H-1024_A-16": Preset(f"{_LARGE}; the original TF1 release", "1.3 GB zip", "release",
                                           url=RELEASE_URL + "cased_L-24_H-1024_A-16.zip"),
}
ALIASES = {"xlnet-base-cased": "xlnet/xlnet-base-cased", "xlnet-large-cased": "xlnet/xlnet-large-cased"}

# What a model needs from a HuggingFace repo (the weights chosen apart: safetensors first).
HF_FILES = ["config.json", "spiece.model", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.json"]
HF_SAFETENSORS = ["model.safetensors", "model.safetensors.index.json", "model-*.safetensors"]
HF_TORCH = ["pytorch_model.bin", "pytorch_model.bin.index.json", "pytorch_model-*.bin"]
RELEASE_SUBDIR = "xlnet_tf"  # under keras.utils.get_file's cache_dir
COMPLETE = ".xlnet_tf_complete"  # written in an extracted release once it read whole


class NameNotFound(FileNotFoundError):
    """A name that cannot be had (unknown, offline and not cached, not on the Hub): the one-line message."""


def presets() -> Dict[str, Preset]:
    """The known names and what each is (KerasHub's ``presets``); any HuggingFace repo id holding an XLNet works
    too."""
    return dict(PRESETS)


def is_local(path: str) -> bool:
    """A path on disk (a file, a folder or a TF checkpoint prefix) or a URL a TF file system reads (gs://)."""
    path = os.fspath(path)
    return "://" in path or os.path.exists(os.path.expanduser(path)) or bool(glob.glob(glob.escape(path) + ".*"))


def resolve(name_or_path: str, revision: Optional[str] = None, token=None, cache_dir: Optional[str] = None,
            local_files_only: Optional[bool] = None, force_download: bool = False) -> str:
    """A local folder (or checkpoint path) for ``name_or_path``: a local path as given; a known release name
    through ``keras.utils.get_file``; anything else as a HuggingFace repo id through ``huggingface_hub``.
    ``local_files_only`` None: HuggingFace's offline mode (``HF_HUB_OFFLINE``) decides."""
    name = os.fspath(name_or_path)
    if is_local(name):
        if revision is not None:
            raise ValueError(f"revision={revision!r}: {name} is a local path, which has no revisions")
        return name
    if local_files_only is None:
        local_files_only = _env_true("HF_HUB_OFFLINE")
    name = ALIASES.get(name, name)
    preset = PRESETS.get(name)
    if preset is not None and preset.source == "release":
        if revision is not None:
            raise ValueError(f"revision={revision!r}: {name} is an original release archive, which has no revisions")
        return _release(name, preset, cache_dir, local_files_only, force_download)
    if "/" not in name.strip("/") or name.count("/") > 1:
        raise NameNotFound(f"{name_or_path}: no such file or directory, and not a model name (known names: "
                           f"{', '.join(PRESETS)}; or a HuggingFace repo id such as xlnet/xlnet-base-cased)")
    return _huggingface(name, revision, token, cache_dir, local_files_only, force_download)


def _env_true(key: str) -> bool:
    return os.environ.get(key, "").strip().upper() in ("1", "ON", "YES", "TRUE")


# ---------------------------------------------------------------------------------------------- HuggingFace
def _huggingface(repo: str, revision, token, cache_dir, local_files_only: bool, force_download: bool) -> str:
    from huggingface_hub import constants, snapshot_download  # (slow: ~0.15 s with requests; names only)
    from huggingface_hub.errors import (GatedRepoError, HfHubHTTPError, LocalEntryNotFoundError,  # (as above)
                                        RepositoryNotFoundError, RevisionNotFoundError)

    cache = cache_dir or constants.HF_HUB_CACHE
    where = f"{repo}" + (f"@{revision}" if revision else "")

    def fetch(patterns):
        return snapshot_download(repo, revision=revision, token=token, cache_dir=cache, allow_patterns=patterns,
                                 local_files_only=local_files_only, force_download=force_download,
                                 endpoint=os.environ.get("HF_ENDPOINT") or None)

    try:
        folder = fetch(HF_FILES + HF_SAFETENSORS)
        if not _has_any(folder, HF_SAFETENSORS):
            folder = fetch(HF_FILES + HF_TORCH)
    except LocalEntryNotFoundError:
        how = ("offline (HF_HUB_OFFLINE=1 or local_files_only=True)" if local_files_only
               else "the Hub could not be reached")
        raise NameNotFound(f"{where}: not in the HuggingFace cache {cache} and {how}; connect once (HF_HUB_OFFLINE=0) "
                           f"to download it, or pass the path of a local copy") from None
    except RevisionNotFoundError:
        raise NameNotFound(f"{where}: no such revision of the HuggingFace repo (cache {cache}); pass a branch, tag "
                           f"or commit of {repo}") from None
    except (RepositoryNotFoundError, GatedRepoError) as e:
        raise NameNotFound(f"{where}: no such local path, and no HuggingFace repo of that id you may read "
                           f"({type(e).__name__}; cache {cache}); check the name, or pass token= / log in with "
                           f"`hf auth login` for a private or gated repo") from None
    except (HfHubHTTPError, OSError) as e:
        raise NameNotFound(f"{where}: the download failed ({_one_line(e)}); cache {cache}; call again to resume "
                           f"it") from None
    _check_hf_folder(where, folder, cache)
    return folder


def _has_any(folder: str, patterns) -> bool:
    return any(glob.glob(os.path.join(folder, p)) for p in patterns)


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())[:300]


def _check_hf_folder(where: str, folder: str, cache: str) -> None:
    """Every downloaded file reads whole before anything uses it; a damaged one is removed from the cache (the
    snapshot's link and its blob), so the next call fetches it again."""
    if not os.path.isfile(os.path.join(folder, "config.json")):
        raise NameNotFound(f"{where}: the repo has no config.json (cache {cache}); not a transformers XLNet repo")
    if not (_has_any(folder, HF_SAFETENSORS) or _has_any(folder, HF_TORCH)):
        raise NameNotFound(f"{where}: the repo has no model.safetensors or pytorch_model.bin (cache {cache})")
    ours = HF_FILES + HF_SAFETENSORS + HF_TORCH  # (the snapshot may hold other files another program fetched)
    for path in sorted(glob.glob(os.path.join(folder, "*"))):
        if not any(fnmatch.fnmatch(os.path.basename(path), p) for p in ours):
            continue
        if path.endswith(".bin") and _legacy_torch(path):
            raise NameNotFound(f"{where}: {os.path.basename(path)} is in torch's legacy pickle format, which is not "
                               f"read (it would mean unpickling downloaded code); pass a revision with "
                               f"model.safetensors, or convert it once with transformers (cache {cache})")
        problem = _damage(path)
        if problem:
            _remove_cached(path)
            raise NameNotFound(f"{where}: {os.path.basename(path)} downloaded damaged ({problem}); removed from the "
                               f"cache {cache}: call again to download it again")


def _legacy_torch(path: str) -> bool:
    """torch.save's format before torch 1.6: a bare pickle stream (a magic number first), not a zip."""
    with open(path, "rb") as f:
        return not zipfile.is_zipfile(path) and f.read(2) == b"\x80\x02"


def _damage(path: str) -> Optional[str]:
    """What is wrong with a downloaded file, or None (headers and sizes checked; zip CRCs read)."""
    base = os.path.basename(path)
    try:
        if base.endswith(".json"):
            with open(path, encoding="utf-8") as f:
                json.load(f)
        elif base.endswith(".safetensors"):
            with safe_open(path, framework="np") as f:
                f.keys()
            _check_safetensors_length(path)
        elif base.endswith(".bin"):
            if not zipfile.is_zipfile(path):
                return "not a whole zip (torch) archive"
            with zipfile.ZipFile(path) as z:
                bad = z.testzip()
            if bad:
                return f"CRC error in {bad}"
        elif base.endswith(".model"):
            import sentencepiece as spm

            spm.SentencePieceProcessor(model_file=path)
    except Exception as e:  # noqa: BLE001 - whatever a damaged file raises becomes the one line
        return _one_line(e) or type(e).__name__
    return None


def _check_safetensors_length(path: str) -> None:
    """The file holds exactly the header's tensors (8-byte header length, the json header, the data)."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    end = max([v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"] or [0])
    size = os.path.getsize(path)
    if size != 8 + n + end:
        raise ValueError(f"{size} bytes, the header says {8 + n + end}")


def _remove_cached(path: str) -> None:
    """A snapshot file of huggingface_hub's cache: the link and the blob it points to."""
    target = os.path.realpath(path)
    for p in {path, target}:
        if os.path.lexists(p):
            os.remove(p)


# ---------------------------------------------------------------------------------------------- releases
def _release(name: str, preset: Preset, cache_dir, local_files_only: bool, force_download: bool) -> str:
    import keras

    root = os.path.expanduser(cache_dir or keras.config.keras_home())
    datadir = os.path.join(root, RELEASE_SUBDIR)
    archive = os.path.join(datadir, name + ".zip")
    extracted = os.path.join(datadir, name + "_extracted")
    done = os.path.join(extracted, COMPLETE)
    if os.path.isfile(done) and not force_download:
        with open(done, encoding="utf-8") as f:
            return os.path.join(extracted, f.read().strip())
    if local_files_only:
        raise NameNotFound(f"{name}: not in the cache {datadir} and offline (local_files_only=True or "
                           f"HF_HUB_OFFLINE=1); download it once online ({preset.url}), or pass the path of a "
                           f"local copy")
    _remove_ours(extracted)
    os.makedirs(root, exist_ok=True)  # get_file falls back to /tmp/.keras for a cache_dir it cannot write yet
    try:
        archive = keras.utils.get_file(fname=name + ".zip", origin=preset.url, cache_dir=root, cache_subdir=RELEASE_SUBDIR,
                             extract=False, force_download=force_download)
    except Exception as e:  # noqa: BLE001 - get_file raises a bare Exception for a failed fetch
        raise NameNotFound(f"{name}: download of {preset.url} failed ({_one_line(e)}); cache {datadir}: call again "
                           f"to retry, or pass the path of a local copy") from None
    extracted = os.path.join(os.path.dirname(archive), name + "_extracted")  # get_file's (its /tmp fallback too)
    done = os.path.join(extracted, COMPLETE)
    problem = _zip_damage(archive)
    if problem is None:
        try:
            keras.utils.get_file(fname=name + ".zip", origin=preset.url, cache_dir=root,
                                 cache_subdir=RELEASE_SUBDIR, extract=True)  # the cached archive: no download
        except Exception as e:  # noqa: BLE001
            problem = _one_line(e)
    folder = None if problem else _model_folder(extracted)
    if problem or folder is None:
        os.remove(archive)
        _remove_ours(extracted)
        what = problem or "no xlnet_config.json, spiece.model and xlnet_model.ckpt inside"
        raise NameNotFound(f"{name}: {os.path.basename(archive)} downloaded damaged ({what}); removed from the cache "
                           f"{datadir}: call again to download it again")
    with open(done, "w", encoding="utf-8") as f:
        f.write(os.path.relpath(folder, extracted))
    return folder


def _zip_damage(path: str) -> Optional[str]:
    if not zipfile.is_zipfile(path):
        return "not a whole zip archive"
    try:
        with zipfile.ZipFile(path) as z:
            bad = z.testzip()
            names = z.namelist()
    except (zipfile.BadZipFile, OSError, EOFError) as e:
        return _one_line(e)
    if bad:
        return f"CRC error in {bad}"
    if any(n.startswith("/") or ".." in n.split("/") for n in names):
        return "a member outside the archive's folder"
    return None


def _model_folder(extracted: str) -> Optional[str]:
    for folder, _dirs, files in os.walk(extracted):
        if "xlnet_config.json" in files and "spiece.model" in files and any(
                f.startswith("xlnet_model.ckpt") and f.endswith(".index") for f in files):
            return folder
    return None


def _remove_ours(extracted: str) -> None:
    """An extraction folder of ours (named by a preset under ``RELEASE_SUBDIR``) from an earlier, failed call."""
    if os.path.isdir(extracted):
        shutil.rmtree(extracted)
