"""Bad input, third round (issue #42): damaged checkpoints, memory bounded by what a run keeps, silent surprises
made loud, fixes named in the user's own terms. Each case through the entry points' ``main`` in-process
(tests/cli_util.py) unless a process is the point; where a fix writes files, nothing earlier is lost."""

import json
import logging
import os
import shutil

import numpy as np
import pytest

import run_classifier
from tests.cli_util import refused, succeeds
from tests.conftest import TINIEST, shared_path


def clf_args(glue, out, *extra, steps=4):
    return ["--task=SST-2", f"--data_dir={glue / 'SST-2'}", f"--model_config_path={glue / 'cfg.json'}",
            f"--spiece_model_file={shared_path('spiece', 'spiece.model')}", f"--output_dir={out}",
            "--max_seq_length=32", "--train_batch_size=8", f"--train_steps={steps}", "--save_steps=2",
            "--progress=false", "--do_train", "--do_eval", *extra]


def truncate(path, keep=0.5):
    os.truncate(path, int(os.path.getsize(path) * keep))


def flip_byte(path):
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0xFF
    open(path, "wb").write(bytes(data))


def data_file(prefix):
    return f"{prefix}.data-00000-of-00001"


def saved_tensors(prefix):
    """Every tensor of a training checkpoint but the input iterator's state (as tests/test_faults.py)."""
    import tensorflow as tf

    reader = tf.train.load_checkpoint(str(prefix))
    return {n: reader.get_tensor(n) for n in reader.get_variable_to_shape_map()
            if "iterator" not in n and n != "_CHECKPOINTABLE_OBJECT_GRAPH"}


# ------------------------------------------------------------------------------------------- 1. damaged checkpoints
@pytest.fixture(scope="module")
def small_checkpoints(tmp_path_factory):
    """Three checkpoints of a few variables (ckpt-1..3) written by a CheckpointManager, as the trainer's."""
    import tensorflow as tf

    d = tmp_path_factory.mktemp("ckpts")
    v = tf.Variable(np.arange(4000, dtype=np.float32))
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(v=v), str(d), max_to_keep=5)
    for i in range(1, 4):
        v.assign_add(tf.ones_like(v))
        manager.save(checkpoint_number=i)
    return d


def test_check_readable_names_the_file_and_what_is_wrong(small_checkpoints, tmp_path):
    from xlnet_tf.tf_checkpoint import CheckpointError, check_readable

    d = tmp_path / "c"
    shutil.copytree(small_checkpoints, d)
    check_readable(str(d / "ckpt-3"))  # whole: no error
    truncate(data_file(d / "ckpt-3"))
    with pytest.raises(CheckpointError, match=r"ckpt-3\.data-00000-of-00001: damaged checkpoint: truncated"):
        check_readable(str(d / "ckpt-3"))
    flip_byte(data_file(d / "ckpt-2"))
    with pytest.raises(CheckpointError, match=r"ckpt-2\.data-00000-of-00001: damaged checkpoint: corrupted .*checksum"):
        check_readable(str(d / "ckpt-2"))
    os.remove(d / "ckpt-1.index")
    with pytest.raises(CheckpointError, match=r"ckpt-1\.index: damaged checkpoint: its index file is missing"):
        check_readable(str(d / "ckpt-1"))


def test_resume_point_passes_over_damaged_checkpoints_with_a_warning(small_checkpoints, tmp_path, caplog):
    from xlnet_tf.tf_checkpoint import CheckpointError
    from xlnet_tf.training import resume_point

    d = tmp_path / "c"
    shutil.copytree(small_checkpoints, d)
    assert resume_point(str(d)) == str(d / "ckpt-3")
    truncate(data_file(d / "ckpt-3"))
    flip_byte(data_file(d / "ckpt-2"))
    before = (d / "ckpt-1.index").read_bytes(), (d / data_file("ckpt-1")).read_bytes()
    with caplog.at_level(logging.WARNING):
        assert resume_point(str(d)) == str(d / "ckpt-1")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2 and "ckpt-3.data-00000-of-00001: damaged checkpoint: truncated" in warnings[0] \
        and "ckpt-2.data-00000-of-00001: damaged checkpoint: corrupted" in warnings[1], warnings
    assert all("resuming from the previous checkpoint that reads whole, ckpt-1" in w for w in warnings)
    assert ((d / "ckpt-1.index").read_bytes(), (d / data_file("ckpt-1")).read_bytes()) == before  # only read
    truncate(data_file(d / "ckpt-1"))
    with pytest.raises(CheckpointError, match=r"ckpt-3.*truncated.*\(and 2 earlier checkpoint\(s\) are damaged "
                                              r"too\); no checkpoint in .* reads whole"):
        resume_point(str(d))


@pytest.mark.slow  # trains twice
def test_rerun_over_a_damaged_latest_checkpoint_resumes_from_the_previous_and_ends_the_same(glue, tmp_path):
    whole = tmp_path / "whole"
    succeeds(run_classifier, *clf_args(glue, whole))
    reference = saved_tensors(whole / "model" / "ckpt-4")
    reference_eval = json.loads((whole / "eval_results.json").read_text())
    damaged = tmp_path / "damaged"
    shutil.copytree(whole, damaged)
    model = damaged / "model"
    truncate(data_file(model / "ckpt-4"))
    ckpt2 = {p.name: p.read_bytes() for p in model.glob("ckpt-2.*")}
    r = succeeds(run_classifier, *clf_args(glue, damaged))
    warning = [line for line in r.stderr.splitlines() if line.startswith("W") and "damaged checkpoint" in line]
    assert len(warning) == 1 and f"{model / 'ckpt-4.data-00000-of-00001'}: damaged checkpoint: truncated" in \
        warning[0] and "resuming from the previous checkpoint that reads whole, ckpt-2" in warning[0], r.stderr
    assert "resumed from" in r.stderr and "Traceback" not in r.stderr
    assert {p.name: p.read_bytes() for p in model.glob("ckpt-2.*")} == ckpt2  # the intact one is kept as it was
    tensors = saved_tensors(model / "ckpt-4")  # written again, whole
    assert tensors.keys() == reference.keys() and len(tensors) > 20
    for name, value in reference.items():
        np.testing.assert_array_equal(tensors[name], value, err_msg=name)
    assert json.loads((damaged / "eval_results.json").read_text()) == reference_eval
    history = json.loads((model / "train_history.json").read_text())
    assert [s for s, _ in history] == [1, 2, 3, 4]
    # evaluating every kept checkpoint: a damaged one is one line naming it
    truncate(data_file(model / "ckpt-2"))
    evaluate = [a for a in clf_args(glue, damaged) if a != "--do_train"] + ["--eval_all_ckpt"]
    line = refused(run_classifier, *evaluate)
    assert f"{model / 'ckpt-2.data-00000-of-00001'}: damaged checkpoint: truncated" in line, line
    # every checkpoint damaged: one line, nothing removed
    truncate(data_file(model / "ckpt-4"))
    files = sorted(p.name for p in model.iterdir())
    line = refused(run_classifier, *clf_args(glue, damaged))
    assert "ckpt-4.data-00000-of-00001: damaged checkpoint: truncated" in line and "reads whole" in line, line
    assert sorted(p.name for p in model.iterdir()) == files


@pytest.fixture(scope="module")
def own_format(tmp_path_factory):
    """A TINIEST backbone saved in our format, and a copy with its data file truncated."""
    from xlnet_tf import XLNetConfig, XLNetModel

    d = tmp_path_factory.mktemp("own")
    model = XLNetModel(XLNetConfig(**TINIEST))
    model(np.zeros((1, 4), np.int32))
    model.save_pretrained(str(d / "whole"))
    shutil.copytree(d / "whole", d / "damaged")
    truncate(d / "damaged" / "xlnet_model.ckpt.data-00000-of-00001")
    return d


def test_a_damaged_init_checkpoint_or_conversion_is_one_line(glue, own_format, tmp_path, capsys):
    from xlnet_tf import convert

    damaged = own_format / "damaged"
    want = f"{damaged / 'xlnet_model.ckpt.data-00000-of-00001'}: damaged checkpoint: truncated"
    line = refused(run_classifier, *clf_args(glue, tmp_path / "run"), f"--init_checkpoint={damaged}")
    assert want in line, line
    out = tmp_path / "converted"
    out.mkdir()
    (out / "kept.txt").write_text("an earlier output")
    capsys.readouterr()
    assert convert.main([f"--input={damaged}", f"--output={out}"]) == 2
    err = capsys.readouterr().err
    assert [e for e in err.splitlines() if e.startswith("error:")] == [err.strip().splitlines()[-1]] and want in err
    assert "Traceback" not in err and sorted(os.listdir(out)) == ["kept.txt"]


# ------------------------------------------------------------------------------------------- 4. fixes in the user's terms
@pytest.fixture(scope="module")
def bare_prefix(own_format, tmp_path_factory):
    """An original-named checkpoint prefix with no config beside it."""
    d = tmp_path_factory.mktemp("bare")
    for p in (own_format / "whole").glob("xlnet_model.ckpt.*"):
        shutil.copy(p, d / p.name)
    return d / "xlnet_model.ckpt"


def test_a_missing_config_names_the_flag_of_the_command(glue, bare_prefix, tmp_path, capsys):
    from xlnet_tf import XLNetModel, convert
    from xlnet_tf.tf_checkpoint import CheckpointError

    assert convert.main([f"--input={bare_prefix}", f"--output={tmp_path / 'out'}"]) == 2
    err = capsys.readouterr().err
    assert "no xlnet_config.json or config.json next to the checkpoint; pass --config=" in err
    assert "XLNetConfig(" not in err
    args = [a for a in clf_args(glue, tmp_path / "run") if not a.startswith("--model_config_path")]
    line = refused(run_classifier, *args, f"--init_checkpoint={bare_prefix}")
    assert "pass --model_config_path" in line and "XLNetConfig(" not in line, line
    with pytest.raises(CheckpointError, match=r"pass config=XLNetConfig\(\.\.\.\)"):  # the Python API's own
        XLNetModel.from_pretrained(str(bare_prefix))


@pytest.mark.slow  # trains two steps
def test_model_config_path_is_honoured_for_a_prefix_without_config(glue, bare_prefix, tmp_path):
    r = succeeds(run_classifier, *clf_args(glue, tmp_path / "run", steps=2), f"--init_checkpoint={bare_prefix}")
    assert "initialised from" in r.stderr


# ------------------------------------------------------------------------------------------- 2. memory: what is kept
@pytest.fixture(scope="module")
def sp_tok():
    from xlnet_tf.tokenizer import XLNetTokenizer

    return XLNetTokenizer(shared_path("spiece", "spiece.model"))


@pytest.fixture(scope="module")
def imdb_reviews():
    """The first 600 training reviews of the real IMDB archive (streamed, <br /> as a space)."""
    import tarfile

    reviews = []
    with tarfile.open(shared_path("imdb", "aclImdb_v1.tar.gz"), "r:*") as tar:
        for m in tar:
            if m.isfile() and "/train/" in m.name and m.name.endswith(".txt") and "/unsup/" not in m.name:
                reviews.append(tar.extractfile(m).read().decode("utf-8").replace("<br />", " "))
                if len(reviews) == 600:
                    break
    return reviews


def word_groups(pieces):
    """Consecutive pieces by word (a new word at each piece starting with ▁)."""
    groups = []
    for p in pieces:
        if p.startswith("\u2581") or not groups:
            groups.append([])
        groups[-1].append(p)
    return groups


def assert_ties_only(tok, got_pieces, whole_pieces):
    """``got`` (parts encoded on their own) is the whole text's segmentation word for word, but where the whole
    text's float32 sums broke a tie the other way: such a word is the same text, split into pieces that score at
    least as well (float64) as the whole's. Returns how many words differ."""
    score = lambda ps: sum(float(tok.sp.GetScore(tok.sp.PieceToId(p))) for p in ps)  # noqa: E731
    got, whole = word_groups(got_pieces), word_groups(whole_pieces)
    assert len(got) == len(whole)
    differ = [(g, w) for g, w in zip(got, whole) if g != w]
    for g, w in differ:
        assert "".join(g) == "".join(w) and score(g) >= score(w) - 1e-4, (g, w)
    return len(differ)


def test_first_ids_equal_the_whole_texts_at_every_budget(sp_tok, imdb_reviews, monkeypatch):
    """``encode(first=n)`` == ``encode()[:n]`` exactly, on real reviews (alone and joined into texts of ~80,000
    characters) at budgets from 1 to beyond the text, with the default prefixes and with prefixes of 50
    characters (many cuts)."""
    import xlnet_tf.tokenizer as tokenizer_module

    texts = [" ".join(imdb_reviews[i:i + 60]) for i in range(0, 180, 60)] + imdb_reviews[:30]
    wholes = [sp_tok.encode(t) for t in texts]
    assert min(len(w) for w in wholes[:3]) > 15000
    for size in (None, 50):
        if size:
            monkeypatch.setattr(tokenizer_module, "part_chars", lambda n: size)
        for text, whole in zip(texts, wholes):
            for n in (1, 2, 7, 62, 126, 510, 4094, 9000, len(whole) - 1, len(whole), len(whole) + 5):
                assert sp_tok.encode(text, first=n) == whole[:n], (size, n, text[:60])


TRICKY_PARTS = ["the", "cat", "1,000,", "12,", "3,4", "``quoted''", "\u00a8", "e\u0301t\u00e9", "\u00a0", "\t", "\n",
                "  ", "\U0001F600", "\U0001F600\U0001F600", "\u0391\u03a3", "\u03a3",
                "\u1f48\u0394\u03a5\u03a3\u03a3\u0395\u038e\u03a3", "stra\u00dfe", "\ufb01ne", "\u3000",
                "\u4e2d\u6587\u5b57\u7b26", "\u0308b", "\x1c", "<sep>", "don't",
                "U.S.A.", "\u2014", "\u00bd", "x\u200by", "\u0130stanbul", "\u01c5", " \u00a8"]


@pytest.mark.parametrize("lower, keep_accents", [(False, False), (True, False), (False, True), (True, True)])
def test_parts_are_exact_on_tricky_text(lower, keep_accents, monkeypatch):
    """Random texts of whitespace runs of every kind, marks that become spaces ("¨"), ligatures, a final sigma,
    digit commas, emoji (<unk>, merged when adjacent) and CJK, cut into parts of 1 to 40 characters: ``first``
    ids and SQuAD's pieces with their spans are the whole text's, exactly."""
    import random

    import xlnet_tf.tokenizer as tokenizer_module
    from xlnet_tf.tasks.squad import features as squad_features
    from xlnet_tf.tokenizer import XLNetTokenizer

    tok = XLNetTokenizer(shared_path("spiece", "spiece.model"), lower=lower, keep_accents=keep_accents)
    assert tok.whitespace_local
    rng = random.Random(42)
    for _ in range(35):
        text = "".join(rng.choice(TRICKY_PARTS) + rng.choice(["", " ", "  ", "\n", " \u00a8"])
                       for _ in range(rng.randint(1, 50)))
        whole_ids = tok.encode(text)
        whole = squad_features.tokenize_with_offsets(tok, text, part_chars=len(text) + 1)
        for size in (1, 3, 8, 40):
            monkeypatch.setattr(tokenizer_module, "part_chars", lambda n, size=size: size)
            for n in range(len(whole_ids) + 2):
                assert tok.encode(text, first=n) == whole_ids[:n], (size, n, text)
            got = squad_features.tokenize_with_offsets(tok, text, part_chars=size)
            assert (got.pieces, got.ids, got.starts, got.ends) == (whole.pieces, whole.ids, whole.starts,
                                                                   whole.ends), (size, text)


def test_whitespace_runs_are_found_as_python_splits_them():
    from xlnet_tf.tokenizer import _RUN

    assert all(bool(_RUN.match("x" + chr(c), 1)) == chr(c).isspace()
               for c in range(0x110000) if not 0xD800 <= c < 0xE000)


def test_last_ids_and_long_squad_contexts_differ_from_the_whole_only_by_float32_ties(sp_tok, imdb_reviews,
                                                                                      monkeypatch):
    """Up to ``WHOLE_CHARS`` characters ``last`` is the whole text's ids exactly (real reviews). A longer text (here
    forced: parts of 200 characters, and SQuAD contexts of ~80,000 characters in parts of 5,000) is encoded part by
    part: word for word the whole text's segmentation, but where SentencePiece's float32 sums over the whole text
    broke a tie the other way, and there the part's pieces score at least as well; SQuAD's spans of every word
    that is split the same way are the whole's."""
    import xlnet_tf.tokenizer as tokenizer_module
    from xlnet_tf.tasks.squad import features as squad_features

    for review in imdb_reviews[:100]:
        whole = sp_tok.encode(review)
        for n in (1, 5, 62, 300, len(whole) + 1):
            assert sp_tok.encode(review, last=n) == whole[-n:]
    texts = [" ".join(imdb_reviews[i:i + 60]) for i in range(0, 240, 60)]
    monkeypatch.setattr(tokenizer_module, "WHOLE_CHARS", 0)
    monkeypatch.setattr(tokenizer_module, "part_chars", lambda n: 200)
    differ = 0
    for text in texts:
        whole = sp_tok.encode(text)
        got = sp_tok.encode(text, last=len(whole) + 10)
        differ += assert_ties_only(sp_tok, sp_tok.convert_ids_to_tokens(got), sp_tok.convert_ids_to_tokens(whole))
        ctx, parts = (squad_features.tokenize_with_offsets(sp_tok, text, part_chars=size) for size in (10 ** 9, 5000))
        assert_ties_only(sp_tok, parts.pieces, ctx.pieces)
        i = j = 0
        for g, w in zip(word_groups(parts.pieces), word_groups(ctx.pieces)):
            if g == w:
                assert (parts.starts[i:i + len(g)], parts.ends[i:i + len(g)]) == (ctx.starts[j:j + len(w)],
                                                                                  ctx.ends[j:j + len(w)])
            else:  # the same characters
                assert (parts.starts[i], parts.ends[i + len(g) - 1]) == (ctx.starts[j], ctx.ends[j + len(w) - 1])
            i, j = i + len(g), j + len(w)
    assert differ < 0.01 * sum(len(t.split()) for t in texts)


def test_a_model_that_is_not_whitespace_local_is_encoded_whole(tmp_path, imdb_reviews):
    """A SentencePiece model trained with pieces across words (split_by_whitespace=false) holds ▁ inside pieces:
    its texts are encoded whole, then cut (exact, not bounded)."""
    import sentencepiece as spm

    from xlnet_tf.tokenizer import SPECIAL_PIECES, XLNetTokenizer

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(imdb_reviews[:60]), encoding="utf-8")
    spm.SentencePieceTrainer.Train(input=str(corpus), model_prefix=str(tmp_path / "m"), vocab_size=300,
                                   split_by_whitespace=False, user_defined_symbols=list(SPECIAL_PIECES.values())[3:],
                                   control_symbols=[], unk_id=0, bos_id=1, eos_id=2, pad_id=-1, minloglevel=2)
    tok = XLNetTokenizer(str(tmp_path / "m.model"))
    assert not tok.whitespace_local
    text = " ".join(imdb_reviews[:40])
    whole = tok.encode(text)
    for n in (1, 62, 4000):
        assert tok.encode(text, first=n) == whole[:n] and tok.encode(text, last=n) == whole[-n:]


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


@pytest.fixture(scope="module")
def long_text(imdb_reviews, sp_tok):
    """About two million characters of real reviews (longer than ``WHOLE_CHARS``) and their whole ids."""
    from xlnet_tf.tokenizer import WHOLE_CHARS

    text = " ".join(imdb_reviews * 3)
    assert len(text) > 1.5 * WHOLE_CHARS
    return text, sp_tok.encode(text)


@pytest.fixture
def longest_encoded(sp_tok, monkeypatch):
    """Records the longest text ``sp_tok`` hands to SentencePiece while the test runs (``[n]``)."""
    seen, sp = [0], sp_tok.sp

    class Spy:
        def __getattr__(self, name):
            fn = getattr(sp, name)
            if name not in ("Encode", "EncodeAsPieces", "EncodeAsIds", "encode"):
                return fn

            def encode(text, *args, **kwargs):
                seen[0] = max([seen[0]] + [len(t) for t in (text if isinstance(text, list) else [text])])
                return fn(text, *args, **kwargs)
            return encode

    monkeypatch.setattr(sp_tok, "sp", Spy())
    return seen


def test_every_reader_of_a_long_text_encodes_what_it_keeps(sp_tok, long_text, longest_encoded):
    """Classification (one text, a pair, windows), extract_features' texts, RACE articles and SQuAD questions give
    the features of the whole text's ids, and hand SentencePiece a few ten thousand characters of a text of two
    million."""
    from xlnet_tf.tasks.classification.features import build_features, build_windows, encode_texts, iter_features, right_align
    from xlnet_tf.tasks.classification.reader import Example
    from xlnet_tf.tasks.classification.registry import get_task
    from xlnet_tf.tasks.race.features import document_features, encode_choices
    from xlnet_tf.tasks.race.reader import RaceDocument, RaceExample
    from xlnet_tf.tasks.squad.features import build_squad_features
    from xlnet_tf.tasks.squad.reader import SquadExample

    text, ids = long_text
    sep, cls, L = sp_tok.sep_id, sp_tok.cls_id, 64
    short = "A short second text."
    short_ids = sp_tok.encode(short)
    task = get_task("mrpc")
    got = list(iter_features([Example("0", text, None, "1"), Example("1", short, text, "0")], sp_tok, task, L))
    assert got[0]["input_ids"] == build_features(ids, None, L, sep, cls)["input_ids"]
    assert got[1]["input_ids"] == build_features(short_ids, ids, L, sep, cls)["input_ids"]
    windows = list(iter_features([Example("0", text, None, "1")], sp_tok, get_task("sst-2"), L, max_segments=3))
    assert windows[0]["input_ids"] == right_align(build_windows(ids, L, sep, cls, 3), 3)["input_ids"]
    feats = encode_texts(sp_tok, [text, short], [short, None], max_seq_length=L)
    assert feats["input_ids"][0].tolist() == build_features(ids, short_ids, L, sep, cls)["input_ids"]
    options = ("yes", "no", "maybe", "never")
    doc = RaceDocument("f.txt", "high", text, (RaceExample("r0", "high", text, "Is it good?", options, 1),))
    race = document_features(sp_tok, doc, L, 16)[0]
    want = encode_choices(ids, [sp_tok.encode(f"Is it good? {o}") for o in options], L, 16, sep, cls)
    assert race["truncated"] and all(np.array_equal(race[k], want[k]) for k in want)
    records, index = build_squad_features([SquadExample("q0", text, "A short context.", 0, is_impossible=True)],
                                          sp_tok, max_seq_length=L, max_query_length=24)
    n = records[0]["cls_index"] - 24 - 2  # paragraph pieces: the question sits between two <sep>
    assert records[0]["input_ids"][n + 1:n + 25].tolist() == ids[:24] and index.stats["truncated_questions"] == 1
    assert 0 < longest_encoded[0] < 40_000, longest_encoded


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


# ------------------------------------------------------------------------------------------- 3. silent surprises
def test_a_label_column_of_mixed_json_kinds_is_refused_unless_labels_say(glue, tmp_path):
    from xlnet_tf.tasks.classification.text import GenericTask

    data = tmp_path / "data"
    data.mkdir()
    rows = [{"text": "a fine film", "label": "pos"}, {"text": "a dull film", "label": "neg"},
            {"text": "fine", "label": 1}, {"text": "dull", "label": "neg"}]
    (data / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = ["--task=generic", f"--data_dir={data}", f"--model_config_path={glue / 'cfg.json'}",
            f"--spiece_model_file={shared_path('spiece', 'spiece.model')}", f"--output_dir={tmp_path / 'run'}",
            "--max_seq_length=16", "--train_steps=1", "--do_train", "--progress=false"]
    line = refused(run_classifier, *args)
    assert "train.jsonl, line 3: field 'label': label 1 is a JSON integer, the labels before it are JSON strings " \
           "(['neg', 'pos']): the task would have 3 classes ['1', 'neg', 'pos']" in line and "--labels" in line, line
    assert "expected a label in ['neg', 'pos'], got '1'" in refused(run_classifier, *args, "--labels=neg,pos")
    task = GenericTask(labels=["neg", "pos", "1"])  # --labels=neg,pos,1: followed
    assert [e.label for e in task.get_examples(str(data), "train")] == ["pos", "neg", "1", "neg"]
    (data / "train.jsonl").write_text(json.dumps({"text": "a", "label": 1}) + "\n" +
                                      json.dumps({"text": "b", "label": 1.0}) + "\n")
    with pytest.raises(ValueError, match=r"line 2: .*label 1\.0 is a JSON number with a fraction or exponent, the "
                                         r"labels before it are JSON integers \(\['1'\]\)"):
        GenericTask().discover_labels(str(data))
    assert sorted(os.listdir(data)) == ["train.jsonl"]  # the refused runs wrote nothing beside the data


def test_impossible_questions_with_answers_are_counted(tmp_path, caplog):
    from xlnet_tf.tasks.squad.reader import read_squad_with_version

    context = "The cat sat on the mat."
    qas = [{"id": "a", "question": "Who sat?", "is_impossible": False, "answers": [{"text": "cat", "answer_start": 4}]},
           {"id": "b", "question": "Who ran?", "is_impossible": True, "answers": [{"text": "cat", "answer_start": 4}]},
           {"id": "c", "question": "Who flew?", "is_impossible": True, "answers": []},
           {"id": "d", "question": "Who swam?", "is_impossible": True, "answers": [{"text": "mat", "answer_start": 19}]}]
    path = tmp_path / "v2.json"
    path.write_text(json.dumps({"version": "v2.0", "data": [{"title": "t", "paragraphs": [
        {"context": context, "qas": qas}]}]}))
    with caplog.at_level(logging.WARNING):
        examples, version = read_squad_with_version(str(path))
    assert version == "2.0" and [e.is_impossible for e in examples] == [False, True, True, True]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "2 question(s) have is_impossible: true and answers too (the first: " \
        "data[0].paragraphs[0].qas[1] (id 'b'))" in warnings[0] and "trained as impossible" in warnings[0], warnings


@pytest.fixture(scope="module")
def tiny_generator_dir(tmp_path_factory):
    """A TINIEST backbone (random weights, no bi_data) in our format: what generate.py loads in a second."""
    from xlnet_tf import XLNetConfig, XLNetModel

    d = tmp_path_factory.mktemp("gen") / "model"
    model = XLNetModel(XLNetConfig(**TINIEST))
    model(np.zeros((1, 4), np.int32))
    model.save_pretrained(str(d))
    return d


def test_a_generation_that_cannot_fit_is_refused_before_the_model_loads(tiny_generator_dir, tmp_path):
    import generate

    out = tmp_path / "out.jsonl"
    out.write_text("earlier\n")
    line = refused(generate, f"--init_checkpoint={tiny_generator_dir}",
                   f"--spiece_model_file={shared_path('spiece', 'spiece.model')}", "--prompt=The cat sat",
                   "--max_new_tokens=1000000000", f"--output_file={out}")
    assert "--max_new_tokens=1000000000 with --batch_size=8: generating is estimated to need" in line and \
        "each layer keeps 1,000,000,00" in line and "--mem_len" in line and "--nocheck_memory" in line, line
    assert out.read_text() == "earlier\n"


@pytest.mark.slow  # generates 200 tokens through the CLI
def test_generation_warns_of_unknown_prompts_and_shows_memory_and_progress(tiny_generator_dir, tmp_path,
                                                                           monkeypatch):
    import generate

    monkeypatch.setattr(generate, "PROGRESS_SECONDS", 0.0)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("The cat sat on the mat\n\U0001F600\U0001F600 \U0001F389\n", encoding="utf-8")
    r = succeeds(generate, f"--init_checkpoint={tiny_generator_dir}",
                 f"--spiece_model_file={shared_path('spiece', 'spiece.model')}", f"--input_file={prompts}",
                 "--max_new_tokens=200", "--batch_size=1")
    err = r.stderr.splitlines()
    unk = [e for e in err if e.startswith("W") and "<unk>" in e]
    assert len(unk) == 1 and "1 of 2 prompt(s) are <unk> pieces only (the first: prompt 2" in unk[0], r.stderr
    memory = [e for e in err if "generation memory:" in e]
    assert len(memory) == 1 and "keeps the keys and values of 206 positions (the prompt and every new token)" in \
        memory[0], memory
    progress = [e for e in err if "generating:" in e]
    assert progress and all("/200 new tokens of batch" in p for p in progress), r.stderr[-2000:]
    assert {p.split("of batch ")[1].split(",")[0] for p in progress} == {"1/2", "2/2"}
    r = succeeds(generate, f"--init_checkpoint={tiny_generator_dir}",
                 f"--spiece_model_file={shared_path('spiece', 'spiece.model')}", "--prompt=The cat",
                 "--max_new_tokens=200", "--mem_len=50", "--noprogress")
    assert "keeps the keys and values of 50 positions (the last ones: --mem_len=50)" in r.stderr
    assert "generating:" not in r.stderr


@pytest.mark.slow  # Ctrl-C reaches a process
def test_ctrl_c_stops_a_long_generation(tiny_generator_dir):
    """The loop runs in TensorFlow's threads, where Python sees no signal: its report reads SIGINT and ends it;
    the run ends with one line and exit code 130 (it ran on for the whole generation before)."""
    import signal
    import subprocess
    import sys
    import time

    from tests.conftest import REPO
    from tests.subprocess_util import ctrl_c_reaches_it

    p = subprocess.Popen([sys.executable, "generate.py", f"--init_checkpoint={tiny_generator_dir}",
                          f"--spiece_model_file={shared_path('spiece', 'spiece.model')}", "--prompt=The cat",
                          "--max_new_tokens=100000"], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         text=True, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"), preexec_fn=ctrl_c_reaches_it)
    try:
        for line in p.stderr:
            if "generation memory:" in line:
                break
        time.sleep(4)  # into the trace or the loop: either way the loop's first report ends it
        t0 = time.time()
        p.send_signal(signal.SIGINT)
        err = p.stderr.read()
        p.wait(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 130 and time.time() - t0 < 30, err[-2000:]
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith("error: interrupted"), err[-2000:]
