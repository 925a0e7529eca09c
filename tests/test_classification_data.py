"""Task readers (real GLUE / IMDB data and synthetic files), bad-input errors, feature layout, TFRecords, and the
memory of a long text's features (a pair cut to each text's budget, a line of 50 MB)."""

import json
import os
import shutil
import subprocess

import numpy as np
import pytest

from xlnet_tf.tasks.classification.features import (build_features, encode_many, encode_texts, iter_features, make_dataset,
                                 task_features, truncate_pair, write_features)
from xlnet_tf.data.tfrecord_io import read_manifest
from xlnet_tf.tasks.classification.reader import Example
from xlnet_tf.tasks.classification.registry import get_task, task_names
from xlnet_tf.tasks.errors import DataError
from xlnet_tf.tasks.classification.glue import write_glue_predictions
from xlnet_tf.tasks.classification.text import GenericTask
from tests.conftest import SHARED, needs_shared, shared_path

GLUE = os.path.join(SHARED, "glue")
SPIECE = os.path.join(SHARED, "spiece", "spiece.model")
IMDB_TAR = os.path.join(SHARED, "imdb", "aclImdb_v1.tar.gz")
needs_glue = needs_shared("glue")
needs_imdb = needs_shared("imdb", "aclImdb_v1.tar.gz")


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return str(path)


class WordIds:
    """A stand-in tokenizer: whitespace-separated integers are the ids."""

    sep_id, cls_id = 4, 3

    def encode(self, text):
        return [int(w) for w in text.split()]


@pytest.fixture(scope="module")
def spiece_tok():
    from xlnet_tf.tokenizer import XLNetTokenizer

    return XLNetTokenizer(shared_path("spiece", "spiece.model"))


# ------------------------------------------------------------------------------------------- registry
def test_registry():
    names = set(task_names())
    assert {"sst-2", "cola", "mrpc", "rte", "sts-b", "mnli", "mnli-mm", "qnli", "qqp", "wnli", "imdb", "yelp-2",
            "yelp-5", "dbpedia", "ag", "amazon-2", "amazon-5", "generic"} <= names
    assert get_task("SST-2").name == get_task("sst2").name == "sst-2"
    assert get_task("STS_B").is_regression and get_task("sts-b").main_metric == "pearson"
    assert get_task("cola").main_metric == "mcc" and get_task("mrpc").metrics == ("accuracy", "f1")
    assert get_task("mnli").labels == ("contradiction", "entailment", "neutral") and get_task("qnli").is_pair
    with pytest.raises(ValueError, match="unknown task 'nope'; known tasks: .*sst-2"):
        get_task("nope")
    with pytest.raises(ValueError, match="takes no options"):
        get_task("rte", labels=["a"])


# ------------------------------------------------------------------------------------------- real data
GLUE_COUNTS = [("SST-2", "train", 67349), ("SST-2", "dev", 872), ("SST-2", "test", 1821), ("CoLA", "train", 8551),
               ("CoLA", "dev", 1043), ("MRPC", "train", 3668), ("MRPC", "dev", 408), ("MRPC", "test", 1725),
               ("RTE", "train", 2490), ("RTE", "dev", 277), ("STS-B", "train", 5749), ("STS-B", "dev", 1500),
               ("STS-B", "test", 1379)]


@needs_glue
@pytest.mark.parametrize("task,split,count", GLUE_COUNTS)
def test_glue_counts(task, split, count):
    t = get_task(task)
    exs = t.get_examples(os.path.join(GLUE, task), split)
    assert len(exs) == count
    assert all(ex.text_a for ex in exs)
    assert all((ex.text_b is not None) == t.is_pair for ex in exs)
    if split == "test":
        assert all(ex.label is None for ex in exs)
    elif t.is_regression:
        assert all(isinstance(ex.label, float) and 0 <= ex.label <= 5 for ex in exs)
    else:
        assert {ex.label for ex in exs} == set(t.labels)


@needs_glue
def test_glue_contents():
    mrpc = get_task("mrpc").get_examples(os.path.join(GLUE, "MRPC"), "dev")[0]  # BOM header, quote kept as text
    assert mrpc.label == "1" and mrpc.text_b.startswith('"The foodservice pie')
    rte = get_task("rte").get_examples(os.path.join(GLUE, "RTE"), "train")
    assert rte[2164].text_b == 'The film "WarGames" was shot in 1983.' and rte[2164].label == "not_entailment"
    cola = get_task("cola").get_examples(os.path.join(GLUE, "CoLA"), "train")[0]
    assert cola.text_a.startswith("Our friends won't buy") and cola.label == "1"


@pytest.mark.slow
@needs_imdb
def test_imdb_from_tar():
    t = get_task("imdb")
    exs = t.get_examples(os.path.dirname(IMDB_TAR), "train")  # streamed from the tar (about 3 s)
    assert len(exs) == 25000
    assert sum(ex.label == "pos" for ex in exs) == 12500
    assert not any("<br />" in ex.text_a for ex in exs[:2000])
    if shutil.which("tar"):  # test split: count its files only (GNU tar lists 4x faster than tarfile)
        names = subprocess.run(["tar", "tzf", IMDB_TAR], capture_output=True, text=True, check=True).stdout.split()
        assert sum(n.startswith(("aclImdb/test/pos/", "aclImdb/test/neg/")) and n.endswith(".txt")
                   for n in names) == 25000


def test_imdb_folder_layout(tmp_path):
    for split, lab, name, text in [("train", "pos", "0_9.txt", "Great.<br /><br />Loved it"),
                                   ("train", "neg", "1_2.txt", "Bad."), ("test", "pos", "3_8.txt", "Fine."),
                                   ("test", "neg", "4_1.txt", "Dull.")]:
        write(tmp_path / "aclImdb" / split / lab / name, text)
    t = get_task("imdb")
    exs = t.get_examples(str(tmp_path), "train")
    assert [(e.text_a, e.label) for e in exs] == [("Bad.", "neg"), ("Great.  Loved it", "pos")]
    assert [e.label for e in t.get_examples(str(tmp_path / "aclImdb"), "dev")] == ["neg", "pos"]  # dev reads test
    with pytest.raises(FileNotFoundError, match="no aclImdb folder"):
        t.get_examples(str(tmp_path / "nowhere"), "train")


# ------------------------------------------------------------------------------------------- synthetic GLUE files
_MNLI = "index\tpromptID\tpairID\tgenre\ts1b\ts2b\ts1p\ts2p\tsentence1\tsentence2"
GLUE_SYNTH = {
    "mnli": {"train.tsv": _MNLI + "\tlabel1\tgold_label\n0\t1\t1e\tfic\t(\t(\t(\t(\tA.\tB.\tneutral\tneutral\n",
             "dev_matched.tsv": _MNLI + "\tlabel1\tlabel2\tlabel3\tlabel4\tlabel5\tgold_label\n"
                                "0\t1\t1e\tfic\t(\t(\t(\t(\tA.\tB.\tneutral\tneutral\tentailment\tneutral"
                                "\tneutral\tneutral\n",
             "test_matched.tsv": _MNLI + "\n0\t1\t1e\tfic\t(\t(\t(\t(\tA.\tB.\n"},
    "qqp": {"train.tsv": "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate\n0\t1\t2\tA.\tB.\t1\n",
            "test.tsv": "id\tquestion1\tquestion2\n0\tA.\tB.\n"},
    "qnli": {"train.tsv": "index\tquestion\tsentence\tlabel\n0\tA.\tB.\tentailment\n",
             "test.tsv": "index\tquestion\tsentence\n0\tA.\tB.\n"},
    "wnli": {"train.tsv": "index\tsentence1\tsentence2\tlabel\n0\tA.\tB.\t0\n",
             "test.tsv": "index\tsentence1\tsentence2\n0\tA.\tB.\n"},
    "cola": {"test.tsv": "index\tsentence\n0\tA.\n"},
}


@pytest.mark.parametrize("name", sorted(GLUE_SYNTH))
def test_glue_layouts_synthetic(tmp_path, name):
    for fn, text in GLUE_SYNTH[name].items():
        write(tmp_path / fn, text)
    t = get_task(name)
    for fn in GLUE_SYNTH[name]:
        split = next(s for s in t.files if t.files[s] == fn)
        ex = t.get_examples(str(tmp_path), split)[0]
        assert ex.text_a == "A." and ex.text_b == ("B." if t.is_pair else None)
        assert (ex.label is None) == (split == "test") and (ex.label is None or ex.label in t.labels)


# ------------------------------------------------------------------------------------------- synthetic csv/tsv/jsonl
CHARCNN = {"yelp-2": (2, 1), "yelp-5": (5, 1), "dbpedia": (14, 2), "ag": (4, 2), "amazon-2": (2, 2),
           "amazon-5": (5, 2)}


@pytest.mark.parametrize("name", sorted(CHARCNN))
def test_charcnn_csv(tmp_path, name):
    n_cls, n_text = CHARCNN[name]
    if n_text == 1:
        rows = f'"1","Good food.\\nNice, ""cosy"" place."\n"{n_cls}","Line one\nline two"\n'
        want = [('Good food. Nice, "cosy" place.', "1"), ("Line one line two", str(n_cls))]
    else:
        rows = f'"1","Title, A","Body \\""quoted\\"""\n"{n_cls}","T2","multi\nline body"\n'  # Yelp escapes quotes as \\"
        want = [('Title, A Body "quoted"', "1"), ("T2 multi line body", str(n_cls))]
    write(tmp_path / "train.csv", rows)
    write(tmp_path / "test.csv", rows)
    t = get_task(name)
    assert len(t.labels) == n_cls and t.metrics == ("accuracy", "error_rate") and not t.is_pair
    for split in ("train", "dev", "test"):
        assert [(e.text_a, e.label) for e in t.get_examples(str(tmp_path), split)] == want
    bad = write(tmp_path / "bad" / "train.csv", rows + f'"{n_cls + 1}"' + ',"x"' * n_text + "\n")
    with pytest.raises(DataError, match=rf"{bad}, line 4: field 'column 0': expected a label in"):
        t.get_examples(str(tmp_path / "bad"), "train")


@pytest.mark.parametrize("fmt", ["csv", "tsv", "jsonl"])
def test_generic_formats(tmp_path, fmt):
    rows = [("the first", "one", "pos"), ("a second, with comma", "two", "neg"), ("third", "three", "pos")]
    for split in ("train", "dev", "test"):
        if fmt == "jsonl":
            lines = [json.dumps({"q": a, "p": b, **({} if split == "test" else {"y": y})}) for a, b, y in rows]
            text = "\n".join(lines) + "\n"
        else:
            sep = "," if fmt == "csv" else "\t"
            quote = (lambda s: f'"{s}"') if fmt == "csv" else (lambda s: s)
            header = ["q", "p"] + ([] if split == "test" else ["y"])
            body = [[quote(a), b] + ([] if split == "test" else [y]) for a, b, y in rows]
            text = "\n".join(sep.join(r) for r in [header] + body) + "\n"
        write(tmp_path / f"{split}.{fmt}", text)
    t = get_task("generic", text_a_column="q", text_b_column="p", label_column="y")
    exs = t.get_examples(str(tmp_path), "dev")
    assert t.labels == ("neg", "pos") and t.is_pair and t.metrics == ("accuracy",)
    assert [(e.text_a, e.text_b, e.label) for e in exs] == rows
    assert [e.label for e in t.get_examples(str(tmp_path), "test")] == [None] * 3
    given = GenericTask(text_a_column="q", label_column="y", labels=["pos", "neg"])
    assert [given.label_id(e.label) for e in given.get_examples(str(tmp_path), "train")] == [0, 1, 0]


def test_generic_regression_and_numeric_labels(tmp_path):
    write(tmp_path / "train.tsv", "text\tscore\na\t0.5\nb\t3\n")
    t = GenericTask(label_column="score", regression=True)
    assert [e.label for e in t.get_examples(str(tmp_path), "train")] == [0.5, 3.0]
    assert t.metrics == ("pearson", "spearman")
    write(tmp_path / "n" / "train.jsonl", '{"text": "a", "label": 10}\n{"text": "b", "label": 2}\n')
    t = GenericTask()
    t.get_examples(str(tmp_path / "n"), "train")
    assert t.labels == ("2", "10")  # numeric labels sorted by value


# ------------------------------------------------------------------------------------------- bad input
BAD_TSV = [
    # (file text, task, split, regex the message must match)
    ("sentence\tlabel\ngood\t1\nno label here\n", "sst-2", "train", r"line 3: expected 2 tab-separated fields, got 1"),
    ("sentence\tlabel\ngood\t1\na\tb\t1\n", "sst-2", "train", r"line 3: expected 2 tab-separated fields, got 3"),
    ("sentence\tlabel\ngood\t2\n", "sst-2", "train", r"line 2: field 'label': expected a label in \['0', '1'\], got '2'"),
    ("text\tlabel\ngood\t1\n", "sst-2", "train", r"line 1: field 'sentence': missing column; the header has \['text', 'label'\]"),
    ("", "sst-2", "train", r"empty file"),
    ("sentence\tlabel\n", "sst-2", "train", r"empty file; expected examples after the header"),
    ("index\tsentence1\tsentence2\tscore\n0\ta\tb\thigh\n", "sts-b", "train",
     r"line 2: field 'score': expected a numeric score, got 'high'"),
    ("index\tsentence1\tsentence2\tscore\n0\ta\tb\tnan\n", "sts-b", "train", r"line 2: field 'score': expected a finite"),
    ("src\t1\t\tok\nsrc\t7\t\tbad\n", "cola", "train", r"line 2: field 'column 1': expected a label in"),
    ("src\t1\tok\n", "cola", "train", r"line 1: expected 4 tab-separated fields, got 3"),
    ("index\tsentence1\tsentence2\tlabel\n0\ta\tb\tentailment\n", "rte", "train", None),  # valid control
    ("index\tsentence1\tsentence2\tlabel\n0\ta\tb\t\tentailment\n", "rte", "train", None),  # stray empty field
    ("index\tsentence1\tsentence2\tlabel\n0\ta\tb\tx\tentailment\n", "rte", "train", r"expected 4 tab-separated"),
]


@pytest.mark.parametrize("text,task,split,pattern", BAD_TSV)
def test_bad_tsv(tmp_path, text, task, split, pattern):
    path = write(tmp_path / f"{split}.tsv", text)
    t = get_task(task)
    if pattern is None:
        assert t.get_examples(str(tmp_path), split)[0].text_b == "b"
        return
    with pytest.raises(DataError, match=pattern) as e:
        t.get_examples(str(tmp_path), split)
    assert str(e.value).startswith(path)


def test_bad_generic(tmp_path):
    p = write(tmp_path / "train.jsonl", '{"text": "a", "label": "x"}\n{"text": "b"}\n')
    with pytest.raises(DataError, match=rf"^{p}, line 2: field 'label': missing field"):
        GenericTask().get_examples(str(tmp_path), "train")
    p = write(tmp_path / "j2" / "train.jsonl", '{"text": "a", "label": "x"}\n{"text": 3, "label": "x"}\n')
    with pytest.raises(DataError, match=rf"^{p}, line 2: field 'text': expected a string, got int"):
        GenericTask().get_examples(str(tmp_path / "j2"), "train")
    p = write(tmp_path / "j3" / "train.jsonl", '{"text": "a", "label": "x"}\n{"text": "a",\n')
    with pytest.raises(DataError, match=rf"^{p}, line 2: expected a JSON object"):
        GenericTask().get_examples(str(tmp_path / "j3"), "train")
    p = write(tmp_path / "c" / "train.csv", 'text,label\n"a, b",x\n"multi\nline",y\nc\n')
    with pytest.raises(DataError, match=rf"^{p}, line 5: expected 2 comma-separated fields, got 1"):
        GenericTask().get_examples(str(tmp_path / "c"), "train")
    write(tmp_path / "d" / "train.csv", "text,label\na,x\n")
    p = write(tmp_path / "d" / "dev.csv", "text,label\na,z\n")
    with pytest.raises(DataError, match=rf"^{p}, line 2: field 'label': expected a label in \['x'\], got 'z'"):
        GenericTask().get_examples(str(tmp_path / "d"), "dev")
    p = write(tmp_path / "e" / "train.tsv", "text\tscore\na\t1,5\n")
    with pytest.raises(DataError, match=rf"^{p}, line 2: field 'score': expected a numeric score, got '1,5'"):
        GenericTask(label_column="score", regression=True).get_examples(str(tmp_path / "e"), "train")
    with open(tmp_path / "e" / "dev.tsv", "wb") as f:
        f.write(b"text\tscore\n\xff\t1\n")
    with pytest.raises(DataError, match=r"dev.tsv, line 2: not valid UTF-8"):
        GenericTask(label_column="score", regression=True).get_examples(str(tmp_path / "e"), "dev")
    with pytest.raises(FileNotFoundError, match="train.tsv"):
        get_task("sst-2").get_examples(str(tmp_path / "missing"), "train")


# ------------------------------------------------------------------------------------------- features
def test_layout_exact_ids():
    f = build_features([11, 12, 13], [21, 22], 10, sep_id=4, cls_id=3)
    assert f["input_ids"] == [0, 0, 11, 12, 13, 4, 21, 22, 4, 3]
    assert f["segment_ids"] == [4, 4, 0, 0, 0, 0, 1, 1, 1, 2]
    assert f["padding_mask"] == [0, 0, 1, 1, 1, 1, 1, 1, 1, 1]
    f = build_features([11, 12], None, 6, sep_id=4, cls_id=3)
    assert f == {"input_ids": [0, 0, 11, 12, 4, 3], "segment_ids": [4, 4, 0, 0, 0, 2],
                 "padding_mask": [0, 0, 1, 1, 1, 1]}
    assert build_features([11, 12], [], 6, 4, 3) == f  # empty B -> single layout, as the original


def test_truncation():
    a, b = list(range(10)), [50, 51, 52]
    truncate_pair(a, b, 7)
    assert a == [0, 1, 2, 3] and b == [50, 51, 52]  # only the longer side shrinks, from its end
    a, b = [1, 2, 3, 4, 5], [6, 7, 8, 9, 10]
    truncate_pair(a, b, 7)  # ties drop from B first
    assert a == [1, 2, 3, 4] and b == [6, 7, 8]
    f = build_features(list(range(100, 110)), [200, 201, 202], 10, 4, 3)
    assert f["input_ids"] == [100, 101, 102, 103, 4, 200, 201, 202, 4, 3] and min(f["padding_mask"]) == 1
    assert build_features(list(range(100, 110)), None, 5, 4, 3)["input_ids"] == [100, 101, 102, 4, 3]


def test_encode_matches_python_tokenizer(spiece_tok):
    texts = ["Hello world!", "It cost $1,000,000, roughly.", "Café déjà vu — ½ price", "", "  a\tb  ",
             "1,2,3 go", "``quoted''"]
    assert encode_many(spiece_tok, texts) == [spiece_tok.encode(t) for t in texts]
    f = encode_texts(spiece_tok, "The cat sat.", "A dog ran.", max_seq_length=16)
    a, b = spiece_tok.encode("The cat sat."), spiece_tok.encode("A dog ran.")
    real = a + [spiece_tok.sep_id] + b + [spiece_tok.sep_id, spiece_tok.cls_id]
    assert f["input_ids"].tolist() == [0] * (16 - len(real)) + real and f["input_ids"].dtype == np.int32
    batch = encode_texts(spiece_tok, ["The cat sat.", "x"], ["A dog ran.", "y"], max_seq_length=16)
    assert batch["input_ids"].shape == (2, 16) and batch["input_ids"][0].tolist() == f["input_ids"].tolist()
    ex = Example("g", "The cat sat.", "A dog ran.", "1")
    feat = next(iter_features([ex], spiece_tok, get_task("mrpc"), 16))
    assert all(feat[k] == f[k].tolist() for k in ("input_ids", "segment_ids", "padding_mask")) and feat["label"] == 1


def _read_all(path, **kw):
    ds = make_dataset(path, batch_size=3, is_training=False, **kw)
    out = {}
    for batch in ds:
        for k, v in batch.items():
            out.setdefault(k, []).extend(v.numpy().tolist())
    return out


def test_tfrecord_roundtrip_and_cache(tmp_path):
    tok = WordIds()
    exs = [Example(str(i), " ".join(str(10 + j) for j in range(i + 1)), "7 8", "1" if i % 2 else "0")
           for i in range(5)]
    task = get_task("mrpc")
    path = str(tmp_path / "f.tfrecord")
    assert write_features(exs, tok, task, 8, path, progress=False, pad_to_multiple=4) == 8
    got = _read_all(path)
    want = list(iter_features(exs, tok, task, 8, pad_to_multiple=4))
    for k in want[0]:
        assert got[k] == [w[k] for w in want], k
    assert got["is_real_example"] == [1] * 5 + [0] * 3 and got["label"][:5] == [0, 1, 0, 1, 0]
    # a cache hit does not rebuild; another max_seq_length does
    calls = []
    src = write(tmp_path / "src.tsv", "x")
    lazy = lambda: calls.append(1) or exs  # noqa: E731
    write_features(lazy, tok, task, 8, str(tmp_path / "g.tfrecord"), source_files=[src], progress=False)
    write_features(lazy, tok, task, 8, str(tmp_path / "g.tfrecord"), source_files=[src], progress=False)
    assert len(calls) == 1
    write_features(lazy, tok, task, 9, str(tmp_path / "g.tfrecord"), source_files=[src], progress=False)
    assert len(calls) == 2
    # training files are written in a seeded order (a label-sorted source, as IMDB's archive, gets mixed); the
    # seed is part of the cache identity
    sorted_exs = [Example(str(i), str(10 + i), "7", "0" if i < 20 else "1") for i in range(40)]
    spath = str(tmp_path / "s.tfrecord")
    write_features(sorted_exs, tok, task, 8, spath, progress=False, shuffle_seed=3)
    mixed = _read_all(spath)
    assert sorted(mixed["label"]) == [0] * 20 + [1] * 20 and mixed["label"][:20].count(1) >= 5
    assert sorted(mixed["input_ids"]) == sorted(f["input_ids"] for f in iter_features(sorted_exs, tok, task, 8))
    assert read_manifest(spath)["meta"]["shuffle_seed"] == 3
    write_features(sorted_exs, tok, task, 8, spath, progress=False, shuffle_seed=3)
    assert _read_all(spath) == mixed  # reused: the same seeded order
    # regression labels are float32
    reg = [Example("0", "5 6", "7", 2.5), Example("1", "5", "6", None)]
    rpath = str(tmp_path / "r.tfrecord")
    write_features(reg, tok, get_task("sts-b"), 6, rpath, progress=False)
    assert _read_all(rpath)["label"] == [2.5, 0.0]


def test_interrupted_writer_leaves_no_trusted_file(tmp_path):
    tok, task = WordIds(), get_task("sst-2")
    good = [Example(str(i), "11 12", None, "1") for i in range(10)]
    path = str(tmp_path / "f.tfrecord")

    def failing():  # a reader that dies halfway through
        for i, ex in enumerate(good):
            if i == 5:
                raise KeyboardInterrupt("simulated interruption")
            yield ex

    with pytest.raises(KeyboardInterrupt):
        write_features(lambda: list(failing()), tok, task, 8, path, source_files=[__file__], progress=False)
    bad_label = good[:5] + [Example("x", "11", None, "7")] + good[5:]  # fails while writing, not before
    with pytest.raises(ValueError, match="label '7' not in"):
        write_features(bad_label, tok, task, 8, path, progress=False)
    assert os.listdir(tmp_path) == []
    write_features(good, tok, task, 8, path, progress=False)
    before = {n: open(tmp_path / n, "rb").read() for n in os.listdir(tmp_path)}
    assert sorted(before) == ["f.tfrecord", "f.tfrecord.json"]
    with pytest.raises(ValueError, match="label '7' not in"):
        write_features(bad_label, tok, task, 16, path, progress=False)
    assert {n: open(tmp_path / n, "rb").read() for n in os.listdir(tmp_path)} == before


@needs_glue
def test_task_features_real(tmp_path, spiece_tok):
    path, n = task_features(get_task("rte"), os.path.join(GLUE, "RTE"), "dev", spiece_tok, 128, str(tmp_path),
                            progress=False)
    assert n == 277
    got = _read_all(path)
    assert np.asarray(got["input_ids"]).shape == (277, 128) and set(got["label"]) == {0, 1}
    assert all(row[-1] == 2 for row in got["segment_ids"])
    meta = json.load(open(path + ".json"))["meta"]
    assert meta["max_seq_length"] == 128 and meta["sources"][0]["path"].endswith("RTE/dev.tsv")
    assert meta["tokenizer"]["size"] == os.path.getsize(SPIECE)


# ------------------------------------------------------------------------------------------- GLUE submission
def test_write_glue_predictions(tmp_path):
    p = write_glue_predictions(get_task("rte"), [1, 0, 1], str(tmp_path / "RTE.tsv"))
    assert open(p).read() == "index\tprediction\n0\tnot_entailment\n1\tentailment\n2\tnot_entailment\n"
    p = write_glue_predictions(get_task("sts-b"), np.array([[4.25], [0.5]]), str(tmp_path / "STS-B.tsv"))
    assert open(p).read() == "index\tprediction\n0\t4.25\n1\t0.5\n"
    p = write_glue_predictions(get_task("mnli"), np.array([[0.1, 2.0, 0.3]]), str(tmp_path / "MNLI-m.tsv"))
    assert open(p).read().splitlines()[1] == "0\tentailment"
    with pytest.raises(ValueError, match="not a label id"):
        write_glue_predictions(get_task("sst-2"), [0, 2], str(tmp_path / "SST-2.tsv"))
    assert sorted(os.listdir(tmp_path)) == ["MNLI-m.tsv", "RTE.tsv", "STS-B.tsv"]
    assert get_task("mnli-mm").submission == "MNLI-mm"


# ---------------------------------------------------------------------------- long texts: a pair's budget, a 50 MB line
def test_a_pair_cut_to_each_texts_budget_truncates_the_same():
    """``truncate_pair`` only shortens: each text cut to a single text's budget plus one first gives the same
    features (what ``iter_features`` and ``encode_texts`` rely on)."""
    from xlnet_tf.tasks.classification.features import build_features, text_budget

    for L in (4, 5, 8, 11):
        keep = text_budget(L, pair=False) + 1
        for na in range(0, 2 * L):
            for nb in range(0, 2 * L):
                a, b = list(range(10, 10 + na)), list(range(100, 100 + nb))
                assert build_features(a[:keep], b[:keep], L, 4, 3) == build_features(a, b, L, 4, 3), (L, na, nb)


@pytest.mark.slow  # a process of its own: its peak RSS is the point
def test_a_50_mb_line_costs_what_its_features_keep(tmp_path):
    """A generic jsonl with one line of 50 MB (before issue #42: ~70x the line in RSS, 18.6 GB for 200 MB) builds
    its features in a fresh process whose peak RSS (TensorFlow's import included) stays under 1 GiB."""
    import subprocess
    import sys

    from tests.conftest import REPO

    src = open(shared_path("text", "tinyshakespeare.txt"), encoding="utf-8").read()
    big = (src * (50_000_000 // len(src) + 1))[:50_000_000]
    data = tmp_path / "data"
    data.mkdir()
    with open(data / "train.jsonl", "w", encoding="utf-8") as f:
        for i in range(20):
            f.write(json.dumps({"text": f"review {i}", "label": "pos" if i % 2 else "neg"}) + "\n")
        f.write(json.dumps({"text": big, "label": "pos"}) + "\n")
    del big
    # the peak of this process's own memory (VmHWM): ru_maxrss would count the parent's RSS at the fork
    script = ("from tasks.classification.features import task_features\n"
              "from tasks.classification.text import GenericTask\n"
              "from xlnet_tf.tokenizer import XLNetTokenizer\n"
              f"path, n = task_features(GenericTask(), {str(data)!r}, 'train', "
              f"XLNetTokenizer({shared_path('spiece', 'spiece.model')!r}), 64, {str(tmp_path / 'out')!r}, "
              "progress=False)\n"
              "hwm = [l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM:')][0]\n"
              "print(n, hwm)\n")
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True,
                         env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    assert out.returncode == 0, out.stderr[-3000:]
    records, peak_kib = map(int, out.stdout.split()[-2:])
    assert records == 21 and peak_kib < 1024 * 1024, f"peak RSS {peak_kib / 1024:.0f} MiB"
