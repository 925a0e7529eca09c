"""The Keras task models' door (tasks/keras_inputs.py, tasks/keras_task.py): each bad or unusual input a user hands
``fit`` / ``evaluate`` / ``predict`` / ``compile`` / ``export`` answered in one line naming the argument and what was
expected, or taken as the user meant it; every option honoured or refused; ``fit``'s health; ``seed``; the
registration for ``load_model``; and what a damaged ``.keras`` file says."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import REPO, TINIEST, shared_path

SPIECE = ("spiece", "spiece.model")
TEXTS = ["a fine film", "dull and long", "the best of the year", "not good", "great acting", "a mess"] * 3
LABELS = np.array([1, 0, 1, 0, 1, 0] * 3)


def _config(**overrides):
    from xlnet_tf.config import XLNetConfig

    return XLNetConfig(**dict(TINIEST, **overrides))


@pytest.fixture(scope="module")
def clf():
    from xlnet_tf.tasks import XLNetClassifier

    model = XLNetClassifier(_config(), num_classes=2, tokenizer=shared_path(*SPIECE), max_seq_length=16,
                            label_names=["neg", "pos"])
    model.compile(learning_rate=1e-3)
    return model


@pytest.fixture(scope="module")
def mc():
    from xlnet_tf.tasks import XLNetMultipleChoice

    model = XLNetMultipleChoice(_config(), tokenizer=shared_path(*SPIECE), max_seq_length=24, max_qa_length=8)
    model.compile(learning_rate=1e-3)
    return model


RACE_X = (["Tom has a red bike.", "The sea was calm."], ["What colour is the bike?", "The sea was _ ."],
          [["red", "blue", "green", "black"], ["rough", "calm", "dark", "cold"]])


def _one_line(excinfo, kind, *parts):
    message = str(excinfo.value)
    assert excinfo.type is kind, (excinfo.type, message)
    assert "\n" not in message and len(message) < 400, message
    for p in parts:
        assert p in message, (p, message)


BAD_CLASSIFIER_CALLS = [
    ("fit", (TEXTS[:16], LABELS[:10]), ValueError, ["x has 16 rows but y has 10"]),
    ("fit", ((TEXTS[:16], TEXTS[:10]), LABELS[:16]), ValueError, ["texts_a has 16 rows but texts_b has 10"]),
    ("fit", (TEXTS[:3], [0, 1, 2]), ValueError, ["y[2]", "label 2 is outside 0..1"]),
    ("fit", (TEXTS[:3], [0, -1, 1]), ValueError, ["y[1]", "label -1"]),
    ("fit", (TEXTS[:3], [0, 0.5, 1]), ValueError, ["y[1]", "0.5 is not a class index", "regression=True"]),
    ("fit", (TEXTS[:2], ["pos", "meh"]), ValueError, ["y[1]", "'meh'", "label_names"]),
    ("predict", (["a", None],), TypeError, ["x[1]", "NoneType"]),
    ("predict", (["a", 5],), TypeError, ["x[1]", "int 5"]),
    ("predict", ("one text",), TypeError, ["a list of texts is expected"]),
    ("predict", ([b"\xff\xfe"],), ValueError, ["x[0]", "not valid UTF-8"]),
    ("evaluate", (TEXTS[:2], [0, 1]), None, []),  # (accepted: a dict, below)
    ("fit", (TEXTS[:4], np.eye(2)[LABELS[:4]]), ValueError, ["y:", "shape (4, 2)", "argmax"]),
    ("evaluate", (TEXTS[:4],), ValueError, ["evaluate: y is required"]),
    ("predict", ({"sentence": TEXTS[:2]},), ValueError, ["keyed text_a / text_b", "input_ids", "['sentence']"]),
    ("predict", ({"text_b": TEXTS[:2]},), ValueError, ["keyed text_a (and optionally text_b)", "['text_b']"]),
    # options: a batch of 0 is refused, not read as the default; Keras' validation_split, and its limits
    ("fit", (TEXTS[:4], LABELS[:4], {"batch_size": 0}), ValueError, ["batch_size=0", "integer >= 1"]),
    ("predict", (TEXTS[:4], {"batch_size": 0}), ValueError, ["batch_size=0"]),
    ("fit", (TEXTS[:4], LABELS[:4], {"validation_split": 1.0}), ValueError, ["validation_split=1.0", "fraction"]),
    ("fit", (TEXTS[:1], LABELS[:1], {"validation_split": 0.5}), ValueError, ["1 examples leave no training"]),
    ("fit", (TEXTS[:4], LABELS[:4], {"epochs": 1.5}), ValueError, ["epochs=1.5", "integer >= 1"]),
    ("fit", (TEXTS[:4], LABELS[:4], {"epochs": 0}), ValueError, ["epochs=0"]),
    ("fit", (TEXTS[:4], LABELS[:4], {"steps_per_epoch": 0}), ValueError, ["steps_per_epoch=0"]),
]


@pytest.mark.parametrize("method,args,error,parts", BAD_CLASSIFIER_CALLS,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(BAD_CLASSIFIER_CALLS)])
def test_a_bad_classifier_input_is_one_line_naming_the_argument(clf, method, args, error, parts):
    kwargs = dict(args[-1], verbose=0) if isinstance(args[-1], dict) and len(args) > 1 else {"verbose": 0}
    args = args[:-1] if len(kwargs) > 1 else args
    if error is None:
        out = getattr(clf, method)(*args, **kwargs)
        if method == "evaluate":
            assert isinstance(out, dict) and {"loss", "accuracy"} <= set(out), out  # as the README shows it
        return
    with pytest.raises(Exception) as e:
        getattr(clf, method)(*args, **kwargs)
    _one_line(e, error, *parts)


def test_options_no_training_means_are_refused_at_compile(clf):
    import keras

    from xlnet_tf.tasks import XLNetClassifier

    for kw, part in ((dict(learning_rate=-1), "learning_rate=-1"), (dict(learning_rate=0.0), "learning_rate=0"),
                     (dict(warmup_steps=-5), "warmup_steps=-5"), (dict(weight_decay=-0.1), "weight_decay=-0.1"),
                     (dict(min_lr_ratio=2.0), "min_lr_ratio=2.0"), (dict(learning_rate=float("nan")), "nan")):
        with pytest.raises(ValueError) as e:
            clf.compile(**kw)
        _one_line(e, ValueError, part)
    with pytest.raises(ValueError) as e:
        clf.compile(optimizer="bogus")
    assert "bogus" in str(e.value)
    with pytest.raises(TypeError) as e:
        clf.compile(optimizer=42)
    _one_line(e, TypeError, "optimizer", "42")
    for loss in ("sparse_categorical_crossentropy", keras.losses.SparseCategoricalCrossentropy()):
        with pytest.raises(ValueError) as e:  # on logits it would train on garbage, silently
            clf.compile(loss=loss)
        _one_line(e, ValueError, "reads probabilities", "gives logits", "from_logits=True")
    clf.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    with pytest.raises(ValueError) as e:
        XLNetClassifier(_config(), num_classes=1)
    _one_line(e, ValueError, "num_classes=1", "regression=True")
    # the models' own options, as the command lines check their flags (before any model is built)
    from xlnet_tf.tasks import XLNetMultipleChoice, XLNetQuestionAnswerer

    spiece, readme = shared_path(*SPIECE), os.path.join(REPO, "README.md")
    for build, error, parts in (
            (lambda: XLNetClassifier(_config(), max_seq_length=2), ValueError, ["max_seq_length=2", "at least 3"]),
            (lambda: XLNetClassifier(_config(), max_seq_length=4, pair=True), ValueError, ["pair", "at least 5"]),
            (lambda: XLNetClassifier(_config(), max_seq_length="128"), ValueError, ["max_seq_length='128'"]),
            (lambda: XLNetClassifier(_config(), label_names=["a", "a"]), ValueError, ["'a' names two classes"]),
            (lambda: XLNetClassifier(_config(), tokenizer=readme), ValueError, [readme, "not a SentencePiece"]),
            (lambda: XLNetClassifier(_config(), tokenizer=12), TypeError, ["tokenizer", "int 12"]),
            (lambda: XLNetMultipleChoice(_config(), max_seq_length=16, max_qa_length=16), ValueError,
             ["max_qa_length <= max_seq_length - 3"]),
            (lambda: XLNetQuestionAnswerer(_config(), max_seq_length=16, max_query_length=16), ValueError,
             ["max_seq_length=16", "max_query_length=16"]),
            (lambda: XLNetQuestionAnswerer(_config(), doc_stride=0), ValueError, ["doc_stride=0"])):
        with pytest.raises(Exception) as e:
            build()
        _one_line(e, error, *parts)
    with pytest.raises(ValueError) as e:  # pairs arriving at a model too short for them
        XLNetClassifier(_config(), max_seq_length=4, tokenizer=spiece).predict((["a"], ["b"]), verbose=0)
    _one_line(e, ValueError, "max_seq_length=4", "at least 5")
    assert XLNetClassifier(_config(), regression=True, tokenizer=shared_path(*SPIECE)).regression
    clf.compile(optimizer=keras.optimizers.SGD(0.01))  # any Keras optimizer is taken
    clf.compile(learning_rate=1e-3)


@pytest.mark.slow
def test_what_a_user_means_is_taken(clf, tmp_path):
    """Pairs as a list of (a, b); UTF-8 bytes; labels by name, or as a column; texts in a dict keyed by the export's
    input names, as arrays or a dataset; an unbatched dataset; nothing to predict; texts ending in NUL characters
    keep them (the export reads them too); Keras' validation_split (the last rows, before shuffling)."""
    import tensorflow as tf

    pairs = list(zip(TEXTS[:4], TEXTS[4:8]))
    both = clf.predict((TEXTS[:4], TEXTS[4:8]), verbose=0)
    np.testing.assert_allclose(clf.predict(pairs, verbose=0), both, atol=1e-6)
    named = {"text_a": TEXTS[:4], "text_b": TEXTS[4:8]}
    np.testing.assert_allclose(clf.predict(named, verbose=0), both, atol=1e-6)
    np.testing.assert_allclose(clf.predict(tf.data.Dataset.from_tensor_slices(named), verbose=0), both, atol=1e-6)
    clf.pair = False
    as_bytes = [t.encode("utf-8") for t in ["café au lait", "naïve"]]
    np.testing.assert_allclose(clf.predict(as_bytes, verbose=0), clf.predict(["café au lait", "naïve"], verbose=0),
                               atol=1e-6)
    by_name = clf.check_labels(["pos", "neg", "pos"], 3)
    assert by_name.tolist() == [1, 0, 1]
    assert clf.check_labels(np.array([[1], [0], [1]]), 3).tolist() == [1, 0, 1]
    unbatched = tf.data.Dataset.from_tensor_slices(TEXTS[:5])
    np.testing.assert_allclose(clf.predict(unbatched, verbose=0), clf.predict(TEXTS[:5], verbose=0), atol=1e-6)
    labelled = clf.evaluate(tf.data.Dataset.from_tensor_slices((TEXTS[:8], LABELS[:8])), verbose=0)  # unbatched
    assert labelled == clf.evaluate(TEXTS[:8], LABELS[:8], verbose=0)
    assert clf.predict([], verbose=0).shape == (0, 2)
    assert clf.predict(([], []), verbose=0).shape == (0, 2)
    with_nul = clf.predict(["a fine film\x00\x00"], verbose=0)
    assert not np.allclose(with_nul, clf.predict(["a fine film"], verbose=0), atol=1e-7)
    with pytest.raises(TypeError) as e:
        clf(["a fine film"])
    _one_line(e, TypeError, "predict(texts)")
    steps = int(clf.optimizer.iterations)
    history = clf.fit(TEXTS[:8], LABELS[:8], batch_size=2, validation_split=0.25, verbose=0).history
    assert int(clf.optimizer.iterations) == steps + 3  # 6 rows trained on
    assert history["val_loss"][0] == pytest.approx(clf.evaluate(TEXTS[6:8], LABELS[6:8], verbose=0)["loss"],
                                                   rel=1e-5)


@pytest.mark.slow
def test_race_answers_as_letters_and_bad_options(mc):
    assert mc.check_labels(["A", "d", 2], 3).tolist() == [0, 3, 2]
    mc.fit(RACE_X, ["A", "B"], batch_size=2, verbose=0)
    for y, part in ((["A", "E"], "y[1]"), ([0, 4], "label 4 is outside 0..3"), ([0, -1], "y[1]")):
        with pytest.raises(ValueError) as e:
            mc.fit(RACE_X, y, verbose=0)
        _one_line(e, ValueError, part)
    ragged = (RACE_X[0], RACE_X[1], [["red", "blue", "green", "black"], ["rough", "calm", "dark"]])
    with pytest.raises(ValueError) as e:
        mc.predict(ragged, verbose=0)
    _one_line(e, ValueError, "options[1]", "4 options are expected", "got 3")
    assert mc.predict(([], [], []), verbose=0).shape == (0, 4)
    as_lists = mc.predict(RACE_X, verbose=0)  # options as an [n, 4] array, and the export's names, alike
    np.testing.assert_allclose(mc.predict((RACE_X[0], RACE_X[1], np.array(RACE_X[2])), verbose=0), as_lists,
                               atol=1e-6)
    named = dict(zip(("article", "question", "options"), RACE_X))
    np.testing.assert_allclose(mc.predict(named, verbose=0), as_lists, atol=1e-6)


@pytest.mark.slow
def test_sample_and_class_weights_weigh_the_loss_as_keras_defines_them(clf):
    """evaluate: the weighted losses' mean; fit: a class weight is the sample weight of its examples (the same
    update), a dataset's (x, y, w) the same as the arrays, and weights of 0 leave the weights as they were."""
    import tensorflow as tf

    from xlnet_tf.tasks import XLNetClassifier

    x, y = TEXTS[:8], LABELS[:8]
    w = np.array([0.0, 2.0, 1.0, 3.0, 0.5, 1.0, 0.0, 4.0], np.float32)
    logits = clf.predict(x, verbose=0)
    per_example = -tf.nn.log_softmax(logits).numpy()[np.arange(8), y]
    weighted = clf.evaluate(x, y, sample_weight=w, batch_size=8, verbose=0)["loss"]
    assert weighted == pytest.approx(float(np.mean(per_example * w)), rel=1e-4)

    def trained(**fit_kwargs):
        model = XLNetClassifier(_config(), num_classes=2, tokenizer=shared_path(*SPIECE), max_seq_length=16)
        model.compile(learning_rate=1e-2, train_steps=1)
        data = fit_kwargs.pop("data", (x, y))
        model.fit(*data, batch_size=8, epochs=1, shuffle=False, verbose=0, **fit_kwargs)
        return [v.numpy() for v in model.trainable_weights]

    start = [v.numpy() for v in XLNetClassifier(_config(), num_classes=2, tokenizer=shared_path(*SPIECE),
                                                max_seq_length=16).trainable_weights]
    by_class = trained(class_weight={0: 0.5, 1: 3.0})
    by_sample = trained(sample_weight=np.where(y == 1, 3.0, 0.5))
    in_dataset = trained(data=(tf.data.Dataset.from_tensor_slices((x, y, np.where(y == 1, 3.0, 0.5))).batch(8),))
    zero = trained(class_weight={0: 0.0, 1: 0.0})  # (weights that were ignored would move these)
    for a, b, c, s, z in zip(by_class, by_sample, in_dataset, start, zero):
        np.testing.assert_allclose(a, b, atol=1e-6)
        np.testing.assert_allclose(a, c, atol=1e-6)
        np.testing.assert_array_equal(z, s)
    assert max(float(np.max(np.abs(a - s))) for a, s in zip(by_class, start)) > 1e-5
    with pytest.raises(ValueError) as e:
        clf.fit(x, y, class_weight={5: 1.0}, verbose=0)
    _one_line(e, ValueError, "class_weight", "5")
    with pytest.raises(ValueError) as e:
        clf.fit(x, y, sample_weight=[1.0] * 3, verbose=0)
    _one_line(e, ValueError, "x has 8 rows but sample_weight has 3")


@pytest.mark.slow
def test_fit_says_when_it_is_not_learning(caplog):
    """A non-finite loss stops fit in one line; a finite divergence, a collapse on the validation data and a run
    that learns nothing at compile()'s defaults from random weights are warned of with the command lines' rules."""
    import logging

    from xlnet_tf.tasks import XLNetClassifier
    from xlnet_tf.training import Diverged

    x, y = TEXTS * 2, np.concatenate([LABELS, LABELS])

    def model():
        return XLNetClassifier(_config(), num_classes=2, tokenizer=shared_path(*SPIECE), max_seq_length=16)

    m = model()
    m.compile(learning_rate=1e30, clip_norm=0)
    with pytest.raises(Diverged) as e:
        m.fit(x, y, batch_size=4, epochs=3, verbose=0)
    _one_line(e, Diverged, "training diverged", "learning_rate")

    caplog.set_level(logging.WARNING, logger="health")
    m = model()
    m.compile(learning_rate=1e3, clip_norm=0)
    m.fit(x, y, batch_size=2, epochs=2, verbose=0, validation_data=(x, y))
    status = m.fit_health["status"]
    assert status in ("diverging", "not learning") and not m.fit_health["healthy"], m.fit_health
    assert any("DIVERGING" in r.message or "NOT LEARNING" in r.message for r in caplog.records)

    caplog.clear()
    m = model()
    m.compile()  # the recipe's 1e-5, a fine-tuning rate, on random weights
    m.fit(x, y, batch_size=2, epochs=2, verbose=0)
    assert not m.fit_health["healthy"], m.fit_health
    assert any("fine-tuning rate" in c for c in m.fit_health["causes"]), m.fit_health
    assert any("NOT LEARNING" in r.message for r in caplog.records)


def test_the_validation_collapse_check_counts_the_predicted_classes(clf):
    clf.health_counts().reset_state()
    clf.evaluate(TEXTS, LABELS, verbose=0)
    predicted, gold = np.asarray(clf.health_counts().result())
    assert gold.tolist() == [9, 9] and predicted.sum() == 18


def test_a_cut_keras_file_is_one_line_and_saves_replace_whole(clf, tmp_path):
    import keras

    from xlnet_tf.tasks import load_model

    path = tmp_path / "m.keras"
    clf.save(path)
    assert [p.name for p in tmp_path.iterdir()] == ["m.keras"]  # no temporary left
    assert isinstance(load_model(str(path)), type(clf))
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError) as e:
        load_model(str(path))
    _one_line(e, ValueError, str(path), "not a complete .keras file")
    assert keras.saving.get_registered_object("xlnet_tf>XLNetMultipleChoice") is not None
    with pytest.raises(ValueError) as e:  # Keras' legacy .h5 would be written and never load back
        clf.save(tmp_path / "m.h5")
    _one_line(e, ValueError, "m.h5", "ending in .keras", "save_pretrained")
    assert not (tmp_path / "m.h5").exists()


@pytest.fixture(scope="module")
def single_export(clf, tmp_path_factory):
    """``clf`` (single texts) exported once for the module: read by the NUL test, copied by the replace test."""
    clf.pair = False
    path = tmp_path_factory.mktemp("single_export") / "export"
    clf.export(str(path))
    return path


@pytest.mark.slow
def test_export_refuses_an_unknown_format_and_a_directory_it_did_not_write(clf, single_export, tmp_path):
    with pytest.raises(ValueError) as e:
        clf.export(str(tmp_path / "m"), format="bogus")
    _one_line(e, ValueError, "bogus", "tf_saved_model")
    assert not (tmp_path / "m").exists()
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    (mine / "sub").mkdir()
    (mine / "sub" / "other.bin").write_bytes(b"\0" * 10)
    with pytest.raises(ValueError) as e:
        clf.export(str(mine))
    _one_line(e, ValueError, str(mine), "notes.txt")
    assert (mine / "notes.txt").read_text() == "keep me" and (mine / "sub" / "other.bin").exists()
    export = tmp_path / "export"
    shutil.copytree(single_export, export)  # an earlier export of ours (the module's) ...
    clf.export(str(export))  # ... is replaced
    assert (export / "saved_model.pb").exists()
    (export / "notes.txt").write_text("mine")
    with pytest.raises(ValueError):
        clf.export(str(export))
    assert (export / "notes.txt").exists()
    with pytest.raises(ValueError) as e:
        clf.save_pretrained(str(mine))
    _one_line(e, ValueError, "notes.txt")
    assert (mine / "notes.txt").read_text() == "keep me"


# One fresh process for both checks below (a process start with TensorFlow is ~5 s): importing xlnet_tf.tasks
# registers the models for Keras' load_model (without loading TensorFlow), then a model of seed 7 is built.
FRESH = """
import json, sys
import xlnet_tf.tasks
assert "XLNetClassifier" in dir(xlnet_tf.tasks) and "tensorflow" not in sys.modules
import keras
model = keras.saving.load_model(sys.argv[1])
print(type(model).__name__)
import numpy as np
from xlnet_tf.config import XLNetConfig
from xlnet_tf.tasks import XLNetClassifier
m = XLNetClassifier(XLNetConfig(**json.loads(sys.argv[2])), num_classes=3, seed=7)
print(json.dumps([float(np.sum(np.abs(v.numpy()))) for v in m.weights]))
"""


@pytest.fixture(scope="module")
def fresh_process(clf, tmp_path_factory):
    """FRESH's two output lines: the type ``keras.saving.load_model`` gave for ``clf`` saved as .keras, and the
    seed-7 classifier's weight sums."""
    path = tmp_path_factory.mktemp("fresh") / "m.keras"
    clf.save(path)
    r = subprocess.run([sys.executable, "-c", FRESH, str(path), json.dumps(TINIEST)],
                       cwd=str(path.parent), capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, PYTHONPATH=REPO))
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout.strip().splitlines()[-2:]


@pytest.mark.slow
def test_seed_gives_the_same_initial_weights_in_every_process(fresh_process):
    from xlnet_tf.tasks import XLNetClassifier

    def sums(seed):
        return [float(np.sum(np.abs(v.numpy()))) for v in XLNetClassifier(_config(), num_classes=3,
                                                                             seed=seed).weights]

    there = json.loads(fresh_process[1])
    here = sums(7)
    np.testing.assert_allclose(here, there, rtol=1e-6)  # the head's weights included
    assert not np.allclose(here, sums(8))


@pytest.mark.slow
def test_importing_the_tasks_package_registers_the_models_for_load_model(fresh_process):
    assert fresh_process[0] == "XLNetClassifier"


@pytest.mark.slow
def test_the_command_lines_run_from_a_checkout_without_the_install():
    """``pip install -r requirements.txt`` then ``python run_classifier.py`` in the checkout (the original's way):
    ``python -S`` skips the site directory's .pth files (the editable install's finder), the requirements stay
    importable on PYTHONPATH."""
    import sysconfig

    env = dict(os.environ, PYTHONPATH=sysconfig.get_paths()["purelib"])
    for script in ("run_classifier.py", "run_squad.py", "run_race.py", "run_pretrain.py", "extract_features.py",
                   "generate.py"):
        r = subprocess.run([sys.executable, "-S", script, "--help"], cwd=REPO, capture_output=True, text=True,
                           timeout=120, env=env)
        assert r.returncode == 0 and "ModuleNotFoundError" not in r.stderr, (script, r.stderr[-2000:])
    r = subprocess.run([sys.executable, "-S", "-c", "import xlnet_tf.tasks.runner as r, sys; print(r.__file__); "
                        "print(any('__editable__' in repr(f) for f in sys.meta_path))"], cwd=REPO,
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == [os.path.join(REPO, "tasks", "runner.py"), "False"]


MULTI_WORKER_FIT = """
import json, os, sys
os.environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": [f"127.0.0.1:{sys.argv[1]}", f"127.0.0.1:{sys.argv[2]}"]},
                                      "task": {"type": "worker", "index": int(sys.argv[3])}})
sys.path.insert(0, ".")
import numpy as np, tensorflow as tf
from tests.test_keras_door import multi_worker_model, _sst2
x, y = _sst2(64)
strategy = tf.distribute.MultiWorkerMirroredStrategy()
with strategy.scope():
    model = multi_worker_model()
history = model.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0).history
np.savez(sys.argv[4], *[v.numpy() for v in model.weights])
print("REPORT " + json.dumps({"replicas": strategy.num_replicas_in_sync, "loss": float(np.ravel(history["loss"])[0]),
                              "steps": int(model.optimizer.iterations.numpy())}), flush=True)
os._exit(0)  # (tf.data's teardown can stall a loaded machine; not under test)
"""


def _sst2(n):
    lines = open(shared_path("glue", "SST-2", "train.tsv"), encoding="utf-8").read().splitlines()[1:n + 1]
    rows = [line.split("\t") for line in lines]
    return [r[0] for r in rows], np.array([int(r[1]) for r in rows])


def multi_worker_model():
    from xlnet_tf.tasks import XLNetClassifier

    model = XLNetClassifier(_config(dropout=0.0, dropatt=0.0), num_classes=2, max_seq_length=32,
                            tokenizer=shared_path(*SPIECE), head_options={"dropout": 0.0})
    model.compile(learning_rate=1e-3)
    return model


@pytest.mark.slow
def test_fit_under_multi_worker_mirrored_strategy_equals_one_device(tmp_path):
    """Two local workers (TF_CONFIG on 127.0.0.1), one replica each: fit trains the global batch split over the
    workers, as the command lines' MultiWorker runs do: both end with the one-device fit's weights."""
    from tests.test_training import _free_ports

    try:
        ports = _free_ports(2)
    except OSError as err:
        pytest.skip(f"cannot bind loopback ports: {err}")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    procs = [subprocess.Popen([sys.executable, "-c", MULTI_WORKER_FIT, str(ports[0]), str(ports[1]), str(i),
                               str(tmp_path / f"w{i}.npz")], cwd=REPO, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for i in range(2)]
    reports = []
    for p in procs:
        out, err = p.communicate(timeout=400)
        assert p.returncode == 0, err[-4000:]
        reports.append(json.loads(out.split("REPORT ")[-1]))
    assert [r["replicas"] for r in reports] == [2, 2] and [r["steps"] for r in reports] == [2, 2], reports
    x, y = _sst2(64)
    one = multi_worker_model()
    loss = one.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0).history["loss"][0]
    assert reports[0]["loss"] == pytest.approx(loss, rel=1e-4), (reports, loss)
    for i in range(2):
        with np.load(tmp_path / f"w{i}.npz") as saved:
            theirs = [saved[f"arr_{k}"] for k in range(len(saved.files))]
        worst = max(float(np.max(np.abs(a - b.numpy()))) for a, b in zip(theirs, one.weights))
        assert worst < 1e-4, (i, worst)


@pytest.mark.slow
def test_predict_and_the_export_read_texts_ending_in_nul_alike(clf, single_export, tmp_path):
    """numpy's fixed-width strings drop trailing NUL characters; the door keeps them, as the export's string
    tensor does: predict and the SavedModel give the same logits."""
    from tests.subprocess_util import run_like_a_server

    texts = ["a fine film\x00\x00", "\x00dull\x00", "plain"]
    clf.pair = False  # (the export's layout)
    (tmp_path / "texts.json").write_text(json.dumps(texts))
    run_like_a_server(
        f"m = tf.saved_model.load({str(single_export)!r})\n"
        f"texts = json.load(open({str(tmp_path / 'texts.json')!r}))\n"
        "out = m.signatures['serving_default'](text_a=tf.constant(texts))\n"
        f"np.save({str(tmp_path / 'logits.npy')!r}, out['logits'].numpy())\n", tmp_path)
    np.testing.assert_allclose(clf.predict(texts, verbose=0), np.load(tmp_path / "logits.npy"), atol=1e-5)
