"""Label sets a generic task cannot learn from (issue #52): a train file of one class is refused by default
(``--allow_single_class`` trains anyway), the dev/test labels are checked before any feature is written, and two
label strings of one number ("1" and "1.0"), a label column of mixed JSON kinds and an empty label cell are refused
naming their lines. Through run_classifier's ``main``."""

import json
import os
import shutil

import pytest

import run_classifier
from tests.cli_util import refused, succeeds
from tests.conftest import glue_args, records, shared_path


def write_tsv(path, rows):
    path.write_text("sentence\tlabel\n" + "".join(f"{t}\t{y}\n" for t, y in rows), encoding="utf-8")


def args(glue, data, out, *extra):
    return ["--task=generic", f"--data_dir={data}", "--text_a_column=sentence",
            f"--model_config_path={glue / 'cfg.json'}", f"--spiece_model_file={shared_path('spiece', 'spiece.model')}",
            f"--output_dir={out}", "--max_seq_length=16", "--train_batch_size=4", "--train_steps=1",
            "--progress=false", "--do_train", "--do_eval", *extra]


SENTENCES = ["a fine film", "a dull film", "the best", "the worst", "good fun", "a bore"]


def test_a_train_file_of_one_class_is_refused_before_anything_is_written(glue, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    write_tsv(data / "train.tsv", [(s, 1) for s in SENTENCES])
    write_tsv(data / "dev.tsv", [(s, i % 2) for i, s in enumerate(SENTENCES)])
    line = refused(run_classifier, *args(glue, data, tmp_path / "out"))
    assert line == (f"error: {data / 'train.tsv'}: one class only ('1' on every line): a classifier learns nothing "
                    f"from it (loss 0 from the first step); add examples of the other classes, or pass "
                    f"--allow_single_class to train anyway"), line
    line = refused(run_classifier, *args(glue, data, tmp_path / "out", "--labels=0,1"))
    assert "one class only ('1' on every line)" in line  # the label set given: still one class in the data
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_allow_single_class_trains_anyway(glue, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    write_tsv(data / "train.tsv", [(s, 1) for s in SENTENCES])
    write_tsv(data / "dev.tsv", [(s, 1) for s in SENTENCES])
    succeeds(run_classifier, *args(glue, data, tmp_path / "out", "--allow_single_class"))


def test_a_dev_label_outside_the_set_is_refused_before_any_feature_is_written(glue, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    write_tsv(data / "train.tsv", [(s, i % 2) for i, s in enumerate(SENTENCES)])
    write_tsv(data / "dev.tsv", [("fine", 0), ("dull", 1), ("meh", 2)])
    line = refused(run_classifier, *args(glue, data, tmp_path / "out"))
    assert line == (f"error: {data / 'dev.tsv'}, line 4: field 'label': expected a label in ['0', '1'], got '2'"), line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("fmt", ["tsv", "jsonl"])
def test_labels_of_one_number_are_refused_naming_the_lines(glue, tmp_path, fmt):
    import json

    data = tmp_path / "data"
    data.mkdir()
    rows = [("a fine film", "1"), ("a dull film", "0"), ("the best", "1.0"), ("the worst", "0")]
    if fmt == "tsv":
        write_tsv(data / "train.tsv", rows)
        where = f"{data / 'train.tsv'}, line 4: field 'label'"
    else:
        (data / "train.jsonl").write_text("".join(json.dumps({"sentence": t, "label": y}) + "\n" for t, y in rows))
        where = f"{data / 'train.jsonl'}, line 3: field 'label'"
    line = refused(run_classifier, *args(glue, data, tmp_path / "out"))
    assert line == (f"error: {where}: label '1.0' is the same number as label '1' on line {2 if fmt == 'tsv' else 1}"
                    f": they would be two classes; write each label one way, or pass --labels (the label set, in "
                    f"order)"), line
    assert not (tmp_path / "out").exists()


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


def test_generic_task_refuses_an_empty_label_cell(glue, tmp_path):
    data = tmp_path / "mine"
    shutil.copytree(glue / "SST-2", data)
    lines = (data / "train.tsv").read_text(encoding="utf-8").splitlines()
    text, _ = lines[5].rsplit("\t", 1)
    lines[5] = text + "\t"  # line 6 of the file: an empty label cell
    (data / "train.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "out"
    line = refused(run_classifier, *glue_args(glue, "generic", out), f"--data_dir={data}", "--text_a_column=sentence")
    assert f"{data / 'train.tsv'}, line 6: field 'label': expected a label, got an empty cell" in line, line
    assert records(out) == []


@pytest.mark.slow
def test_a_thousand_classes_of_two_examples_are_said_in_one_line_and_the_log_stays_small(glue, tmp_path):
    """1,000 classes with 2 training examples each: one WARNING line says so; the evaluation log shows the 20 most
    frequent classes (a line points to eval_results.json, which keeps every class and the whole matrix)."""
    data = tmp_path / "data"
    data.mkdir()
    write_tsv(data / "train.tsv", [(f"{SENTENCES[i % 6]} {i}", f"c{i // 2}") for i in range(2000)])
    write_tsv(data / "dev.tsv", [(f"{SENTENCES[i % 6]} {i}", f"c{i}") for i in range(40)])
    r = succeeds(run_classifier, *args(glue, data, tmp_path / "out"))
    said = [line for line in r.stderr.splitlines() if "classes with 2.0 training examples each" in line]
    assert len(said) == 1 and "1,000 classes" in said[0], r.stderr[-3000:]
    assert len(r.stderr) < 60_000, len(r.stderr)
    assert "the 20 most frequent gold classes below" in r.stderr
    results = json.loads((tmp_path / "out" / "eval_results.json").read_text())
    assert len(results["confusion_matrix"]["counts"]) == 1000
