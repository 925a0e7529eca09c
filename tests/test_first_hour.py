"""What a user meets in the first hour (issue #41): HF-made checkpoints compute HF's function, every CLI's --help
and its one error line, input paths named by their flag, a finished run's outputs (per-class scores, confusion
matrix, the training curve, the overfitting note), --fail_if_unhealthy, and the smaller points (no empty run
folders after a refused start, the generation export's recorded options, a cut prompt logged, the package's
version, convert's usage)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.cli_util import call, refused, succeeds
from tests.conftest import REPO, shared_path

# ------------------------------------------------------------------------------------------ 1. HF's GELU
V = 32000


@pytest.fixture(scope="module")
def hf_default_dir(tmp_path_factory):
    """A tiny model made by transformers with its DEFAULT activation (``ff_activation="gelu"``, the erf form),
    initializer 0.5 so the activation's form matters, saved as an HF directory."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.XLNetConfig(vocab_size=V, d_model=32, n_layer=2, n_head=2, d_inner=64, initializer_range=0.5)
    assert cfg.ff_activation == "gelu"  # transformers' default: what this test is about
    d = tmp_path_factory.mktemp("hf_default")
    transformers.XLNetLMHeadModel(cfg).save_pretrained(str(d))
    return d


def _hf_lm(d):
    import torch
    import transformers

    torch.set_num_threads(1)
    return transformers.XLNetLMHeadModel.from_pretrained(str(d)).eval()


@pytest.mark.slow
def test_hf_default_config_computes_hfs_function(hf_default_dir, caplog):
    import torch

    from xlnet_tf import XLNetModel

    rng = np.random.default_rng(0)
    ids = rng.integers(10, V, (2, 13)).astype(np.int32)
    mask = np.ones_like(ids)
    mask[0, :4] = 0
    seg = np.zeros_like(ids)
    seg[:, 7:] = 1
    with torch.no_grad():
        ref = _hf_lm(hf_default_dir)(torch.tensor(ids, dtype=torch.long), attention_mask=torch.tensor(mask),
                                     token_type_ids=torch.tensor(seg, dtype=torch.long)).logits.numpy()
    with caplog.at_level(logging.INFO, logger="xlnet_tf.checkpoint"):
        ours = XLNetModel.from_pretrained(str(hf_default_dir), dropout=0.0, dropatt=0.0)
    assert ours.config.ff_activation == "gelu_exact"
    lines = [r.getMessage() for r in caplog.records if "feed-forward activation" in r.getMessage()]
    assert len(lines) == 1 and "exact erf GELU" in lines[0] and "ff_activation='gelu' selects" in lines[0], lines

    def logits(model):
        out = model(ids, segment_ids=seg, padding_mask=mask)["sequence_output"]
        return model.lm_logits(out).numpy()

    real = mask.astype(bool)
    got = logits(ours)
    rel = np.abs(got - ref)[real].max() / np.abs(ref[real]).max()
    assert rel < 1e-5, rel
    # the comparison can tell the two GELUs apart: the tanh form is far off on the same weights
    tanh = XLNetModel.from_pretrained(str(hf_default_dir), dropout=0.0, dropatt=0.0, ff_activation="gelu")
    assert np.abs(logits(tanh) - ref)[real].max() / np.abs(ref[real]).max() > 1e-4

    # the export writes the name that keeps the function, and it reads back as the same function
    from xlnet_tf.config import HF_ACTIVATIONS, TO_HF_ACTIVATION

    assert all(HF_ACTIVATIONS[TO_HF_ACTIVATION[name]] == name for name in TO_HF_ACTIVATION)


@pytest.mark.slow
def test_hf_default_config_greedy_generation_equals_hfs(hf_default_dir):
    import torch

    from xlnet_tf import XLNetModel
    from xlnet_tf.generation import GenerationOptions, Generator

    hf = _hf_lm(hf_default_dir)
    rng = np.random.default_rng(1)
    prompts = [rng.integers(10, V, n).tolist() for n in (5, 17, 40)]
    n_new = 24  # the reported divergence was at token 19
    with torch.no_grad():
        ref = [hf.generate(torch.tensor([p]), max_new_tokens=n_new, do_sample=False)[0, len(p):].tolist()
               for p in prompts]
    options = GenerationOptions(max_new_tokens=n_new, eos_id=None)
    gen = Generator(XLNetModel.from_pretrained(str(hf_default_dir), dropout=0.0, dropatt=0.0))
    assert gen.generate(prompts, options) == ref
    # read as the tanh form (what it was before), the third prompt's continuation leaves HF's at token 17
    tanh = Generator(XLNetModel.from_pretrained(str(hf_default_dir), dropout=0.0, dropatt=0.0, ff_activation="gelu"))
    assert tanh.generate(prompts, options) != ref


# ------------------------------------------------------------------------------------------ 2-3. --help, one line
CLIS = ("run_classifier", "run_squad", "run_race", "run_pretrain", "extract_features", "generate")


@pytest.mark.parametrize("name", CLIS)
def test_help_lists_every_flag_of_the_job_by_section_with_its_default(name):
    import importlib

    from absl import flags

    module = importlib.import_module(name)
    r = call(module, "--help")
    assert r.code == 0 and r.error is None and r.stderr == "", r.stderr
    text = r.stdout
    assert text.startswith(module.__doc__.strip().splitlines()[0]) and f"Flags of {name}.py" in text
    fv = flags.FlagValues()
    module.define_flags(fv)
    lines = text.splitlines()
    heads = {line.strip(): i for i, line in enumerate(lines) if line.startswith("  --")}
    sections = [(i, line[:-1]) for i, line in enumerate(lines) if line and not line.startswith(" ")
                and line.endswith(":") and i > 2]
    names = [n for n in fv if fv[n].name == n]
    assert len(names) >= 5 and len(heads) == len(names), (len(heads), len(names))
    for n in names:
        flag = fv[n]
        head = f"--[no]{n}" if flag.boolean else f"--{n}"
        assert head in heads, (name, head)
        at = heads[head]
        section = [title for i, title in sections if i < at][-1]  # the section it is listed under
        assert section == flag.section, (n, section, flag.section)
        described = " ".join(line.strip() for line in lines[at + 1:at + 8] if line.startswith("      "))
        assert "(default: " in described, (n, described)
    assert len({t for _, t in sections}) >= 2


def test_a_bad_flag_value_is_one_error_line_from_a_process_before_tensorflow():
    """A real process: exit code 2 and exactly one stderr line, fast because the flags are parsed before
    TensorFlow is imported."""
    import time

    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    t0 = time.time()
    r = subprocess.run([sys.executable, "run_classifier.py", "--train_steps=many", "--output_dir=/tmp/x"],
                       cwd=REPO, capture_output=True, text=True, timeout=120, env=env)
    seconds = time.time() - t0
    assert r.returncode == 2, r.stderr[-2000:]
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("error: ") and "train_steps" in r.stderr, r.stderr
    assert r.stdout == ""
    assert seconds < 15, seconds  # no TensorFlow import (which alone takes several seconds here)


def test_missing_input_paths_are_refused_naming_the_flag(tmp_path):
    import extract_features
    import generate
    import run_classifier
    import run_pretrain
    import run_race
    import run_squad

    out = tmp_path / "out"
    missing = tmp_path / "missing"
    common = [f"--output_dir={out}", "--model_config_path=tiny", "--do_train"]
    cases = [(run_classifier, ["--task=sst-2", f"--data_dir={missing}"], "data_dir"),
             (run_race, [f"--data_dir={missing}"], "data_dir"),
             (run_squad, [f"--train_file={missing}"], "train_file"),
             (run_squad, [f"--predict_file={missing}"], "predict_file"),
             (run_classifier, ["--task=sst-2", f"--data_dir={tmp_path}", f"--spiece_model_file={missing}"],
              "spiece_model_file"),
             (run_classifier, ["--task=sst-2", f"--data_dir={tmp_path}", f"--model_config_path={missing}.json"],
              "model_config_path"),
             (extract_features, [f"--input_file={missing}", "--output_file=x.npz"], "input_file"),
             (generate, [f"--input_file={missing}"], "input_file")]
    for module, args, flag in cases:
        line = refused(module, *(args if module is generate else common + args))
        value = f"{missing}.json" if flag == "model_config_path" else str(missing)
        assert line == f"error: --{flag}={value}: no such file or directory", (module.__name__, line)
    assert not out.exists()  # refused before any work: no folder made
    # run_pretrain --train_spm: --spiece_model_file is the model to WRITE, not an input
    line = refused(run_pretrain, f"--output_dir={out}", f"--model_dir={tmp_path / 'train'}", "--train_spm",
                   f"--spiece_model_file={tmp_path / 'new' / 'sp.model'}")
    assert "--train_spm needs --train_input" in line, line
    line = refused(run_pretrain, f"--output_dir={out}", f"--model_dir={tmp_path / 'train'}",
                   f"--spiece_model_file={missing}")
    assert line == f"error: --spiece_model_file={missing}: no such file or directory", line
    line = refused(run_pretrain, f"--output_dir={out}", f"--model_dir={tmp_path / 'train'}", "--train_spm",
                   f"--train_input={missing}")
    assert line == f"error: --train_input: {missing}: no such file", line
    assert not (tmp_path / "train").exists() and not (tmp_path / "new").exists()


def test_a_refused_start_leaves_no_empty_run_folders(glue, tmp_path):
    """A run refused after its flags parse (here: a vocabulary larger than the model's n_token) creates neither
    OUTPUT_DIR/model nor OUTPUT_DIR/data; a run that starts creates both."""
    import run_classifier
    from tests.conftest import TINIEST, classifier_args

    (tmp_path / "small.json").write_text(json.dumps(dict(TINIEST, n_token=1000)))
    out = tmp_path / "out"
    args = classifier_args("SST-2", glue / "SST-2", tmp_path / "small.json", out, L=32, steps=2)
    line = refused(run_classifier, *args, "--do_train")
    assert "n_token=1000" in line
    assert not (out / "model").exists() and not (out / "data").exists()
