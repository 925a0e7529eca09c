"""Model names (``xlnet_tf.presets``): a HuggingFace repo id through ``huggingface_hub`` and an original release
name through ``keras.utils.get_file``, both served by a local HTTP server on 127.0.0.1 (the Hub's two routes, the
release zip); nothing leaves the machine. The cache, offline mode, revisions, a local path winning over a name,
the one-line errors, and damaged downloads (a truncated safetensors, a cut zip) refused then fetched again."""

import hashlib
import http.server
import io
import json
import os
import re
import threading
import zipfile

import numpy as np
import pytest

from tests.conftest import shared_path, tiny
from xlnet_tf import XLNetConfig, XLNetModel, presets

SHA = "0123456789abcdef0123456789abcdef01234567"
SHA2 = "fedcba9876543210fedcba9876543210fedcba98"
REPO = "someone/xlnet-tiny"
RELEASE = "xlnet_cased_L-12_H-768_A-12"


class Hub:
    """A local server: ``repos[(repo, sha)] = {file: bytes}``, ``refs[(repo, branch)] = sha``; ``files[path] =
    bytes`` for plain downloads (the release zip). ``requests`` counts what was asked."""

    def __init__(self):
        self.repos, self.refs, self.files, self.requests = {}, {}, {}, []
        hub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_HEAD(self):
                self.answer(body=False)

            def do_GET(self):
                self.answer(body=True)

            def answer(self, body):
                hub.requests.append((self.command, self.path))
                status, headers, data = hub.route(self.path.split("?")[0])
                self.send_response(status)
                for k, v in dict(headers, **{"Content-Length": str(len(data))}).items():
                    self.send_header(k, v)
                self.end_headers()
                if body:
                    self.wfile.write(data)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def sha(self, repo, rev):
        return rev if (repo, rev) in self.repos else self.refs.get((repo, rev))

    def route(self, path):
        m = re.fullmatch(r"/api/models/([^/]+/[^/]+)/revision/([^/]+)", path)
        if m:
            sha = self.sha(*m.groups())
            if sha is None:
                return 404, {"X-Error-Code": "RepoNotFound"}, b'{"error": "Repository not found"}'
            files = self.repos[(m.group(1), sha)]
            info = {"id": m.group(1), "sha": sha, "siblings": [{"rfilename": f} for f in files]}
            return 200, {"Content-Type": "application/json"}, json.dumps(info).encode()
        m = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
        if m:
            sha = self.sha(m.group(1), m.group(2))
            data = self.repos.get((m.group(1), sha), {}).get(m.group(3))
            if data is None:
                return 404, {"X-Error-Code": "EntryNotFound"}, b""
            etag = hashlib.sha256(data).hexdigest()
            return 200, {"ETag": f'"{etag}"', "X-Repo-Commit": sha}, data
        if path in self.files:
            return 200, {"Content-Type": "application/zip"}, self.files[path]
        return 404, {}, b""

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture()
def hub(monkeypatch):
    h = Hub()
    monkeypatch.setenv("HF_ENDPOINT", h.url)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    yield h
    h.close()


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    """A tiny backbone (random weights) and its two folders: ``hf`` (what the Hub serves) and ``own``, each with
    the shared spiece.model; plus its outputs on one batch."""
    from xlnet_tf import XLNetTokenizer

    d = tmp_path_factory.mktemp("tiny")
    model = XLNetModel(XLNetConfig.from_dict(tiny(n_layer=1, dropout=0.0, dropatt=0.0)))
    ids = np.array([[5, 17, 300, 4, 3]], np.int32)
    out = model(ids, training=False)["sequence_output"].numpy()
    tok = XLNetTokenizer(shared_path("spiece", "spiece.model"))
    model.save_pretrained(str(d / "hf"), format="huggingface", tokenizer=tok)
    model.save_pretrained(str(d / "own"), tokenizer=tok)
    return {"ids": ids, "out": out, "hf": d / "hf", "own": d / "own"}


def folder_files(folder):
    return {n: (folder / n).read_bytes() for n in os.listdir(folder)}


def release_zip(own_folder, cut=None):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for n in os.listdir(own_folder):
            if n.startswith("xlnet_model.ckpt") or n in ("xlnet_config.json", "spiece.model"):
                z.write(own_folder / n, f"{RELEASE}/{n}")
    data = buf.getvalue()
    return data[:cut] if cut else data


def outputs(model, ids):
    return model(ids, training=False)["sequence_output"].numpy()


def test_hf_repo_id_downloads_into_the_hub_cache_then_works_offline(hub, tiny_model, tmp_path):
    hub.repos[(REPO, SHA)] = dict(folder_files(tiny_model["hf"]), **{"README.md": b"x", "tf_model.h5": b"no"})
    hub.refs[(REPO, "main")] = SHA
    cache = tmp_path / "hf"
    model = XLNetModel.from_pretrained(REPO, cache_dir=str(cache))
    np.testing.assert_allclose(outputs(model, tiny_model["ids"]), tiny_model["out"], atol=1e-6)
    snapshot = cache / f"models--{REPO.replace('/', '--')}" / "snapshots" / SHA
    assert sorted(os.listdir(snapshot)) == sorted(["config.json", "model.safetensors", "spiece.model",
                                                   "special_tokens_map.json", "tokenizer_config.json",
                                                   "tokenizer.json"])
    fetched = [p for _, p in hub.requests if "/resolve/" in p]
    assert not any("tf_model.h5" in p or "README" in p for p in fetched)  # only what a model needs
    hub.requests.clear()
    assert presets.resolve(REPO, cache_dir=str(cache), local_files_only=True) == str(snapshot)
    assert hub.requests == []  # offline: the cache alone


def test_hf_revision_and_pytorch_bin_when_no_safetensors(hub, tiny_model, tmp_path):
    files = {k: v for k, v in folder_files(tiny_model["hf"]).items() if k != "model.safetensors"}
    hub.repos[(REPO, SHA2)] = dict(files, **{"pytorch_model.bin": _torch_bin(tiny_model["hf"])})
    hub.repos[(REPO, SHA)] = {"config.json": b"{}"}
    hub.refs[(REPO, "main")] = SHA
    hub.refs[(REPO, "v1")] = SHA2
    folder = presets.resolve(REPO, revision="v1", cache_dir=str(tmp_path))
    assert folder.endswith(SHA2) and os.path.isfile(os.path.join(folder, "pytorch_model.bin"))
    model = XLNetModel.from_pretrained(REPO, revision="v1", cache_dir=str(tmp_path))
    np.testing.assert_allclose(outputs(model, tiny_model["ids"]), tiny_model["out"], atol=1e-6)


def test_a_name_that_cannot_be_had_is_one_line(hub, tmp_path, monkeypatch):
    cache = str(tmp_path / "hf")
    with pytest.raises(FileNotFoundError) as e:
        presets.resolve(REPO, cache_dir=cache, local_files_only=True)
    msg = str(e.value)
    assert "\n" not in msg and REPO in msg and cache in msg and "HF_HUB_OFFLINE=0" in msg
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match="offline"):
        XLNetModel.from_pretrained(REPO, cache_dir=cache)
    with pytest.raises(FileNotFoundError, match=f"{RELEASE}: not in the cache .* offline"):
        presets.resolve(RELEASE, cache_dir=str(tmp_path / "keras"))
    monkeypatch.delenv("HF_HUB_OFFLINE")
    with pytest.raises(FileNotFoundError) as e:  # not on the Hub
        presets.resolve("nobody/nothing", cache_dir=cache)
    assert "\n" not in str(e.value) and "nobody/nothing" in str(e.value) and cache in str(e.value)
    with pytest.raises(FileNotFoundError, match="not a model name .*xlnet/xlnet-base-cased"):
        presets.resolve("xlnet_cased_L-99", cache_dir=cache)
    assert hub.requests and all("nothing" in p for _, p in hub.requests)


def test_a_local_path_wins_over_a_name(hub, tiny_model, tmp_path, monkeypatch):
    import shutil

    shutil.copytree(tiny_model["own"], tmp_path / REPO)
    monkeypatch.chdir(tmp_path)
    assert presets.resolve(REPO) == REPO
    model = XLNetModel.from_pretrained(REPO)
    np.testing.assert_allclose(outputs(model, tiny_model["ids"]), tiny_model["out"], atol=1e-6)
    assert hub.requests == []


def _torch_bin(hf_folder):
    torch = pytest.importorskip("torch")
    from xlnet_tf.hf_checkpoint import read_safetensors

    buf = io.BytesIO()
    torch.save({k: torch.from_numpy(v) for k, v in read_safetensors(str(hf_folder / "model.safetensors")).items()},
               buf)
    return buf.getvalue()


@pytest.mark.parametrize("weights", ["model.safetensors", "pytorch_model.bin"])
def test_a_truncated_weights_download_fails_in_one_line_and_is_fetched_again(hub, tiny_model, tmp_path, weights):
    files = folder_files(tiny_model["hf"])
    if weights == "pytorch_model.bin":
        files = dict({k: v for k, v in files.items() if k != "model.safetensors"}, **{weights: _torch_bin(
            tiny_model["hf"])})
    whole = files[weights]
    hub.repos[(REPO, SHA)] = dict(files, **{weights: whole[: len(whole) // 2]})
    hub.refs[(REPO, "main")] = SHA
    cache = str(tmp_path)
    with pytest.raises(FileNotFoundError) as e:
        XLNetModel.from_pretrained(REPO, cache_dir=cache)
    msg = str(e.value)
    assert "\n" not in msg and f"{weights} downloaded damaged" in msg and "call again" in msg
    hub.repos[(REPO, SHA)] = files  # the server now sends it whole: the next call fetches it again
    model = XLNetModel.from_pretrained(REPO, cache_dir=cache)
    np.testing.assert_allclose(outputs(model, tiny_model["ids"]), tiny_model["out"], atol=1e-6)


def test_release_name_through_keras_get_file_then_from_its_cache(hub, tiny_model, tmp_path, monkeypatch):
    import dataclasses

    monkeypatch.setitem(presets.PRESETS, RELEASE, dataclasses.replace(presets.PRESETS[RELEASE],
                                                                     url=hub.url + "/released/base.zip"))
    hub.files["/released/base.zip"] = release_zip(tiny_model["own"], cut=200)  # a cut archive first
    keras_home = str(tmp_path / "keras")
    with pytest.raises(FileNotFoundError) as e:
        XLNetModel.from_pretrained(RELEASE, cache_dir=keras_home)
    msg = str(e.value)
    assert "\n" not in msg and f"{RELEASE}.zip downloaded damaged" in msg and "call again" in msg
    hub.files["/released/base.zip"] = release_zip(tiny_model["own"])
    model = XLNetModel.from_pretrained(RELEASE, cache_dir=keras_home)
    np.testing.assert_allclose(outputs(model, tiny_model["ids"]), tiny_model["out"], atol=1e-6)
    hub.requests.clear()
    folder = presets.resolve(RELEASE, cache_dir=keras_home, local_files_only=True)
    assert hub.requests == [] and os.path.isfile(os.path.join(folder, "spiece.model"))
    assert folder.startswith(os.path.join(keras_home, presets.RELEASE_SUBDIR))


def test_the_known_names_say_what_each_is():
    names = presets.presets()
    assert {"xlnet/xlnet-base-cased", "xlnet/xlnet-large-cased", "xlnet_cased_L-12_H-768_A-12",
            "xlnet_cased_L-24_H-1024_A-16"} <= set(names)
    for p in names.values():
        assert p.description and p.size and (p.repo if p.source == "huggingface" else p.url.startswith("https://"))


@pytest.mark.slow
def test_the_command_line_trains_from_init_checkpoint_name_alone(hub, glue, tmp_path, monkeypatch):
    """--init_checkpoint=REPO gives the weights, the config and the SentencePiece model (no --model_config_path,
    no --spiece_model_file); a name that cannot be had is one error: line naming it."""
    from huggingface_hub import constants as hf_constants

    import run_classifier
    from tests.cli_util import refused, succeeds
    from tests.conftest import TINIEST
    from xlnet_tf import XLNetTokenizer

    model = XLNetModel(XLNetConfig.from_dict(TINIEST))
    model.save_pretrained(str(tmp_path / "src"), format="huggingface",
                          tokenizer=XLNetTokenizer(shared_path("spiece", "spiece.model")))
    hub.repos[(REPO, SHA)] = folder_files(tmp_path / "src")
    hub.refs[(REPO, "main")] = SHA
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(tmp_path / "hf"))
    args = [f"--task=SST-2", f"--data_dir={glue / 'SST-2'}", "--max_seq_length=32", "--train_batch_size=8",
            "--train_steps=2", "--save_steps=2", "--progress=false", "--do_train"]
    r = succeeds(run_classifier, *args, f"--output_dir={tmp_path / 'out'}", f"--init_checkpoint={REPO}")
    snapshot = tmp_path / "hf" / f"models--{REPO.replace('/', '--')}" / "snapshots" / SHA
    assert str(snapshot) in r.stderr  # the checkpoint read (and its config, its spiece.model)
    line = refused(run_classifier, *args, f"--output_dir={tmp_path / 'out2'}", "--init_checkpoint=nobody/nothing")
    assert "--init_checkpoint=nobody/nothing" in line and str(tmp_path / "hf") in line
