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
