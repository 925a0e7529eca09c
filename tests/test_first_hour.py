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


def test_the_checkpoint_format_decides_the_activation_names(tmp_path, caplog):
    """The same ``"gelu"`` is the erf form in an HF directory's config and the tanh form beside an original
    checkpoint, even in an HF-style config.json there; our own format keeps ours; an override wins."""
    from xlnet_tf import checkpoint
    from xlnet_tf.config import XLNetConfig

    hf_style = {"model_type": "xlnet", "vocab_size": 100, "d_model": 16, "n_layer": 1, "n_head": 2, "d_head": 8,
                "d_inner": 32, "ff_activation": "gelu", "untie_r": True}
    (tmp_path / "config.json").write_text(json.dumps(hf_style))
    with caplog.at_level(logging.INFO, logger="xlnet_tf.checkpoint"):
        assert checkpoint.resolve_config(str(tmp_path), "hf", None, {}).ff_activation == "gelu_exact"
        assert checkpoint.resolve_config(str(tmp_path), "original", None, {}).ff_activation == "gelu"
        forced = checkpoint.resolve_config(str(tmp_path), "hf", None, {"ff_activation": "gelu"})
    assert forced.ff_activation == "gelu"
    said = [r.getMessage() for r in caplog.records]
    assert "config.json read as transformers reads it" in said[0] and "exact erf GELU" in said[0]
    assert "config.json read as the original XLNet reads it" in said[1] and "tanh-approximation GELU" in said[1]
    assert "ff_activation='gelu', as given" in said[2]
    bare = {k: v for k, v in hf_style.items() if k not in ("model_type", "vocab_size")}
    (tmp_path / "config.json").write_text(json.dumps(dict(bare, n_token=100)))  # no HF keys: the format decides
    assert checkpoint.resolve_config(str(tmp_path), "hf", None, {}).ff_activation == "gelu_exact"
    assert XLNetConfig.from_dict(dict(bare, n_token=100)).ff_activation == "gelu"  # by layout: ours


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


# ------------------------------------------------------------------------------------------ 4. a finished run
ANIMALS = {"cats": ("cat", "kitten", "tabby"), "dogs": ("dog", "puppy", "terrier"), "birds": ("bird", "sparrow", "owl")}


def write_three_class_task(folder, n_train=120, n_dev=30, seed=0):
    """A generic tsv task of three labels (which animal a sentence is about), learnable by the tiny model."""
    rng = np.random.default_rng(seed)
    labels = sorted(ANIMALS)
    folder.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", n_train), ("dev", n_dev)):
        rows = ["text\tlabel"]
        for i in range(n):
            label = labels[i % 3]
            noun = rng.choice(ANIMALS[label])
            rows.append(f"the {rng.choice(['big', 'small', 'old', 'young'])} {noun} "
                        f"{rng.choice(['sat', 'ran', 'slept', 'waited'])} {rng.choice(['here', 'there', 'outside'])}"
                        f"\t{label}")
        (folder / f"{split}.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    return labels


@pytest.fixture(scope="module")
def three_class_run(glue, tmp_path_factory):
    """run_classifier.py --task=generic on the three-label task: 60 steps of the tiniest model, evaluated."""
    import run_classifier
    from tests.conftest import classifier_args

    root = tmp_path_factory.mktemp("three")
    labels = write_three_class_task(root / "data")
    out = root / "run"
    r = succeeds(run_classifier, *classifier_args("generic", root / "data", glue / "cfg.json", out, L=16, steps=80,
                                                  extra=["--do_train", "--do_eval", "--train_batch_size=16",
                                                         "--learning_rate=3e-3"]))
    return out, labels, r


@pytest.mark.slow
def test_a_three_class_run_writes_per_class_scores_a_confusion_matrix_and_a_curve(three_class_run):
    out, labels, r = three_class_run
    res = json.loads((out / "eval_results.json").read_text())
    assert set(res["per_class"]) == set(labels)
    for scores in res["per_class"].values():
        assert set(scores) == {"precision", "recall", "f1", "support"} and scores["support"] == 10
        assert all(0.0 <= scores[k] <= 1.0 for k in ("precision", "recall", "f1"))
    assert 0.0 <= res["macro_f1"] <= 1.0
    assert res["macro_f1"] == pytest.approx(np.mean([s["f1"] for s in res["per_class"].values()]), abs=1e-4)
    matrix = res["confusion_matrix"]
    counts = np.asarray(matrix["counts"])
    assert matrix["labels"] == labels and counts.shape == (3, 3) and counts.sum() == res["num_examples"] == 30
    assert np.trace(counts) / counts.sum() == pytest.approx(res["accuracy"])
    assert counts.sum(axis=1).tolist() == [10, 10, 10]  # rows: gold
    # the log shows them as a table
    assert "confusion matrix (rows: gold, columns: predicted)" in r.stderr and "macro-F1" in r.stderr
    # the curve: a real PNG with three panels (loss, learning rate, dev accuracy)
    png = out / "training_curve.png"
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert (width, height) == (800, round((2.4 * 3 + 0.6) * 100))
    assert f"training curve: {png}" in r.stderr
    # health: the fit of training and evaluation losses is reported
    fit = res["health"]["fit"]
    assert fit["eval_loss"] == pytest.approx(res["loss"], abs=1e-4) and fit["train_loss"] > 0


def test_class_scores_by_hand():
    from xlnet_tf.tasks.report import class_scores, class_table

    gold = [0, 0, 0, 1, 1, 2, 2, 2, 2, 2]
    pred = [0, 0, 1, 1, 1, 2, 2, 0, 0, 0]  # label 1 never wrong as gold; class "c" recall 2/5
    out = class_scores(gold, pred, ["a", "b", "c"])
    assert out["confusion_matrix"]["counts"] == [[2, 1, 0], [0, 2, 0], [3, 0, 2]]
    a, b, c = (out["per_class"][k] for k in "abc")
    assert (a["precision"], a["recall"], a["support"]) == (0.4, round(2 / 3, 4), 3)
    assert (b["precision"], b["recall"], c["precision"], c["recall"]) == (round(2 / 3, 4), 1.0, 1.0, 0.4)
    f1 = [2 * p * r / (p + r) for p, r in ((0.4, 2 / 3), (2 / 3, 1.0), (1.0, 0.4))]
    assert out["macro_f1"] == pytest.approx(np.mean(f1), abs=1e-4)
    # a class neither in the gold nor predicted scores 0 and is left out of the macro mean (sklearn's rule)
    out = class_scores([0, 1], [0, 1], ["a", "b", "never"])
    assert out["per_class"]["never"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 0}
    assert out["macro_f1"] == 1.0
    table = class_table(out)
    assert table[0].split() == ["class", "precision", "recall", "f1", "support"] and len(table) == 1 + 3 + 1 + 2 + 3


def test_a_curve_that_cannot_be_drawn_is_a_warning_not_a_failure(tmp_path, caplog, monkeypatch):
    from xlnet_tf.tasks import report

    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # as if matplotlib were not installed
    with caplog.at_level(logging.WARNING, logger="report"):
        assert report.write_curve(str(tmp_path / "c.png"), [(1, 2.0), (2, 1.5)], [1e-3, 1e-3]) is None
    assert not (tmp_path / "c.png").exists()
    assert "the training curve was not drawn (ModuleNotFoundError" in caplog.text


# ------------------------------------------------------------------------------------------ 5. --fail_if_unhealthy
@pytest.mark.slow
def test_fail_if_unhealthy_exits_3_with_the_warning_after_writing_the_results(glue, tmp_path):
    """A learning rate of 1e-9: the loss cannot fall in 20 steps. Without the flag the run succeeds (and warns);
    with it the exit code is 3, the one error line is the health warning, eval_results.json and the curve are
    written and nothing after them (the export)."""
    import run_classifier
    from tests.conftest import classifier_args

    def args(out, *extra):
        return classifier_args("SST-2", glue / "SST-2", glue / "cfg.json", out, L=32, steps=20,
                               extra=["--do_train", "--do_eval", "--train_batch_size=8", "--learning_rate=1e-9",
                                      f"--export_dir={out}/export", *extra])

    r = call(run_classifier, *args(tmp_path / "a", "--fail_if_unhealthy"))
    assert r.code == 3, r.stderr[-3000:]
    lines = [line for line in r.stderr.splitlines() if line.startswith("error: ")]
    assert lines == [f"error: {r.error}"] and "Traceback" not in r.stderr
    assert r.error.startswith("sst-2: not learning (--fail_if_unhealthy): ") and "loss did not fall" in r.error
    res = json.loads((tmp_path / "a" / "eval_results.json").read_text())
    assert not res["health"]["healthy"] and all(w in r.error for w in res["health"]["warnings"])
    assert (tmp_path / "a" / "training_curve.png").is_file() and not (tmp_path / "a" / "export").exists()
    ok = succeeds(run_classifier, *args(tmp_path / "b"))
    assert "NOT LEARNING? the training loss did not fall" in ok.stderr and (tmp_path / "b" / "export").is_dir()


@pytest.mark.slow
def test_pretraining_fail_if_unhealthy_and_its_final_and_best_losses(tiny_corpus, tmp_path):
    import run_pretrain
    from tests.conftest import PRETRAIN_MEM, PRETRAIN_PREDICT, PRETRAIN_REUSE, PRETRAIN_SEQ, tiny_pretrain_config

    tiny_pretrain_config().to_json_file(str(tmp_path / "config.json"))
    r = call(run_pretrain, f"--train_input={tiny_corpus['corpus']}", f"--spiece_model_file={tiny_corpus['spm']}",
             f"--model_config_path={tmp_path / 'config.json'}", f"--seq_len={PRETRAIN_SEQ}",
             f"--reuse_len={PRETRAIN_REUSE}", f"--mem_len={PRETRAIN_MEM}", f"--num_predict={PRETRAIN_PREDICT}",
             "--perm_size=8", "--train_batch_size=4", "--train_steps=20", "--learning_rate=1e-9",
             "--iterations=5", "--jit=false", f"--model_dir={tmp_path}/train", f"--output_dir={tmp_path}/out",
             "--progress=false", "--fail_if_unhealthy")
    assert r.code == 3 and r.error.startswith("pretraining: not learning (--fail_if_unhealthy): the training loss "
                                              "did not fall"), r.stderr[-3000:]
    res = json.loads((tmp_path / "train" / "pretrain_results.json").read_text())
    losses = [l for _, l in res["train_history"]]
    assert res["train_loss_window"] == 5 and res["train_loss_final"] == pytest.approx(np.mean(losses[-5:]), abs=1e-4)
    windows = [np.mean(losses[i:i + 5]) for i in range(16)]
    assert res["train_loss_best"] == pytest.approx(min(windows), abs=1e-4)
    assert res["train_loss_best_step"] == 5 + int(np.argmin(windows))
    assert not res["health"]["healthy"]
    assert (tmp_path / "train" / "training_curve.png").is_file()
    assert json.loads((tmp_path / "out" / "pretrain_results.json").read_text())["train_loss_final"] == \
        res["train_loss_final"]


# ------------------------------------------------------------------------------------------ 6. smaller points
@pytest.mark.slow
def test_generation_logs_a_cut_prompt_and_its_export_records_its_fixed_options(hf_default_dir, tmp_path):
    import generate

    words = open(shared_path("text", "wikitext2-valid.tokens"), encoding="utf-8").read().split()[:5000]
    export = tmp_path / "gen_export"
    r = succeeds(generate, f"--init_checkpoint={hf_default_dir}",
                 f"--spiece_model_file={shared_path('spiece', 'spiece.model')}", f"--prompt={' '.join(words)}",
                 "--max_new_tokens=3", f"--export_dir={export}")
    cut = [line for line in r.stderr.splitlines() if "--max_prompt_length" in line]
    assert len(cut) == 1 and "1 prompt(s) longer than --max_prompt_length=512 pieces keep their last 512 (prompt 1)" \
        in cut[0], r.stderr[-3000:]
    info = json.loads((export / "serving_info.json").read_text())
    assert info["generation"] == {"max_new_tokens": 3, "eos_id": 2, "pad_id": 5, "mem_len": None,
                                  "max_prompt_length": 512, "fixed_at_export": True}
    assert info["precision"] == "float32"
    assert "generates 3 new tokens per prompt" in r.stderr and "fixed at export" in r.stderr


def test_version_is_defined_once_and_convert_names_its_command():
    import tomllib

    import xlnet_tf
    from xlnet_tf import convert

    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)
    assert "version" in project["project"]["dynamic"] and "version" not in project["project"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "xlnet_tf.__version__"}
    assert isinstance(xlnet_tf.__version__, str) and xlnet_tf.__version__.count(".") == 2
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        convert.main(["--help"])
    assert out.getvalue().startswith("usage: python -m xlnet_tf.convert "), out.getvalue()[:200]


@pytest.mark.slow
def test_dev_sh_installs_the_library_editable_without_network(tmp_path):
    """dev.sh's editable install of the checkout, run as written (no build isolation, no dependencies) with pip
    kept off every index and into a temporary target: a script outside the checkout then imports ``xlnet_tf``
    from the checkout, and nothing of the application (``tasks``)."""
    import shlex

    lines = [line.strip() for line in open(os.path.join(REPO, "dev.sh"), encoding="utf-8")
             if "pip install" in line and line.strip().endswith("-e .")]
    assert len(lines) == 1, lines
    args = shlex.split(lines[0])
    assert args[:4] == [".venv/bin/python", "-m", "pip", "install"] and {"--no-build-isolation", "--no-deps"} <= set(args)
    target = tmp_path / "site"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    assert args[-2:] == ["-e", "."]
    r = subprocess.run([sys.executable] + args[1:-2] + ["--no-index", "--target", str(target), "-e", REPO],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    code = ("import importlib.util, site, sys; site.addsitedir(sys.argv[1]); import xlnet_tf; "
            "print(xlnet_tf.__file__, xlnet_tf.__version__, importlib.util.find_spec('tasks'))")
    r = subprocess.run([sys.executable, "-c", code, str(target)], capture_output=True, text=True, env=env,
                       cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    import xlnet_tf

    assert r.stdout.split() == [os.path.join(REPO, "xlnet_tf", "__init__.py"), xlnet_tf.__version__, "None"]
