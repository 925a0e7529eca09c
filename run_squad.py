r"""Fine-tune XLNet on SQuAD v1.1 / v2.0, predict, score with the official scorers and export a SavedModel.

    python run_squad.py --train_file=train-v2.0.json --predict_file=dev-v2.0.json --version_2_with_negative \
      --spiece_model_file=spiece.model --init_checkpoint=xlnet_cased_L-24_H-1024_A-16 --output_dir=OUT \
      --max_seq_length=512 --max_query_length=64 --doc_stride=128 --train_batch_size=48 --train_steps=8000 \
      --warmup_steps=1000 --learning_rate=3e-5 --lr_layer_decay_rate=0.75 --do_train --do_predict \
      --export_dir=EXPORT

``--do_predict`` (``--do_eval`` is an alias) reads ``--predict_file``, predicts every question and, as the
file carries gold answers (the reader requires them), scores it. Outputs in ``--predict_dir`` (default
OUTPUT_DIR):
* ``predictions.json`` {question id: text}, usable ON ITS OWN: v1.1 the best span; v2.0 the best non-null span,
  or "" when the question's null odds exceed ``--null_score_diff_threshold`` (default 0.0: the answer-class
  logit says "no answer" with probability > 0.5; BERT's convention).
* ``non_null_predictions.json`` (v2.0): the best non-null span of every question (the original XLNet's
  ``predictions.json``); with ``null_odds.json`` the official v2 scorer finds the best threshold:
  ``python -m tasks.squad.metrics dev.json non_null_predictions.json --na-prob-file null_odds.json``.
* ``null_odds.json`` {id: min answer-class logit over the question's windows} (higher = no answer);
  ``nbest.json`` {id: [{text, probability, start_log_prob, end_log_prob, start_char, end_char}, ...]}.
* ``eval_results.json``: the official scorer's keys (v2.0: ``exact``, ``f1``, ``total``, ``HasAns_*``,
  ``NoAns_*``, ``best_exact``, ``best_exact_thresh``, ``best_f1``, ``best_f1_thresh``; v1.1: ``exact_match``,
  ``f1``), plus ``step``, ``loss`` (mean per-window loss), ``null_score_diff_threshold``, ``version``,
  ``num_questions``, ``num_features``. v2.0's ``exact``/``f1`` are exactly ``predictions.json`` scored on its
  own (the scorer applies the same threshold to the null odds); ``best_*`` are the numbers the paper reports.
Also ``model/train_history.json`` ([[step, loss], ...], --do_train) and cached features in ``data/``.

``--export_dir``: a SavedModel answering raw ``question`` + ``context`` strings (any length: sliding windows
in-graph), see ``tasks/squad/serving.py``; ``has_answer`` uses ``--null_score_diff_threshold`` (v2.0).

Bad input files exit with code 2 and a one-line message naming the file and the json path of the bad field.
"""

from __future__ import annotations

import logging

import run_common
import run_flags
import run_main
from xlnet_tf.tasks.squad import features as squad_features
from xlnet_tf.tasks.squad import reader as squad_task
from xlnet_tf.tasks.squad.run import SquadOptions  # (no TensorFlow: its defaults are the flags')
from xlnet_tf.tasks.squad.run import SquadRun


def define_flags(fv) -> None:
    d = run_flags.Definer(fv, "SQuAD")
    d.string("train_file", None, "SQuAD json for training.", input_path=True)
    d.string("predict_file", None, "SQuAD json to predict (and score: it must carry the answers).", input_path=True)
    d.string("predict_dir", None, "Where predictions and eval_results.json go (default: OUTPUT_DIR).")
    d.bool("version_2_with_negative", False, "SQuAD 2.0: questions may have no answer. (Also turned on "
           "when a file carries is_impossible fields.)")
    d.integer("max_query_length", SquadOptions.max_query_length, "Question pieces kept (the first ones).")
    d.integer("doc_stride", SquadOptions.doc_stride, "Stride between the context windows, in pieces.")
    d.integer("start_n_top", 5, "Beam size of answer starts.")
    d.integer("end_n_top", 5, "Beam size of answer ends per start.")
    d.integer("n_best_size", SquadOptions.n_best_size, "Answers kept per question in nbest.json.")
    d.integer("max_answer_length", SquadOptions.max_answer_length, "Longest answer, in pieces.")
    d.bool("allow_last_paragraph_token", SquadOptions.allow_last_paragraph_token, "Let an answer start or end on a "
           "window's last paragraph token (the original rejects such candidates).")
    d.list("answer_class_hidden_sizes", [], "Hidden sizes of a deeper answer-class MLP (empty: the "
           "original head). --head_hidden_sizes makes the start/end MLPs deeper.")
    d.float("null_score_diff_threshold", SquadOptions.null_score_diff_threshold, "v2.0: predict no answer when the "
            "null odds (answer-class logit) exceed this (predictions.json and the exported has_answer).")
    d.integer("num_workers", None, "Processes building features (default: CPU count, at most 8).")
    run_flags.define_common_flags(fv, default_seq_len=512, default_lr=3e-5)
    run_flags.define_health_flag(fv)


log = logging.getLogger("run_squad")


def read_file(path, name, require_answers=True):
    """(examples, version) of a SQuAD json; pure Python (bad files fail before TensorFlow is imported)."""
    if not path:
        raise ValueError(f"--{name} is required")
    examples, version = squad_task.read_squad_with_version(path, require_answers=require_answers)
    if not examples:
        raise ValueError(f"{path}: no questions")
    return examples, version


def job(F):
    predict = F.do_predict or F.do_eval
    # SQuAD's predictions come with its evaluation (scored when the predict file has answers)
    plan = run_common.plan(F, do_eval=predict, do_predict=False, results_dir=F.predict_dir or F.output_dir)
    L, Q = F.max_seq_length, F.max_query_length
    squad_features.check_lengths(L, Q, F.doc_stride, flags=True)
    if F.start_n_top < 1 or F.end_n_top < 1 or F.start_n_top > L or F.end_n_top > L:
        raise ValueError("--start_n_top and --end_n_top must be in [1, max_seq_length]")
    if F.n_best_size < 1 or F.max_answer_length < 1:
        raise ValueError("--n_best_size and --max_answer_length must be >= 1")
    head_options = dict(start_n_top=F.start_n_top, end_n_top=F.end_n_top, dropout=F.dropout,
                        hidden_sizes=run_common.head_hidden_sizes(F),
                        answer_class_hidden_sizes=run_common.int_list(F, "answer_class_hidden_sizes"))
    # read the inputs first: a bad file fails in a second, before TensorFlow is imported
    train_examples = read_file(F.train_file, "train_file")[0] if F.do_train else None
    predict_examples, predict_version = read_file(F.predict_file, "predict_file", False) if predict else (None, None)
    v2 = bool(F.version_2_with_negative)
    if predict and predict_version == "2.0" and not v2:
        log.warning("%s has is_impossible questions: scoring it as SQuAD 2.0", F.predict_file)
        v2 = True
    if train_examples is not None and not v2 and any(e.is_impossible for e in train_examples):
        log.warning("%s has impossible questions: training the answer class on them (SQuAD 2.0)", F.train_file)
        v2 = True

    paths = run_common.output_paths(F)
    strategy = run_common.strategy(F)
    tokenizer = run_common.tokenizer(F)
    config = run_common.model_config(F)
    squad = SquadOptions(max_query_length=Q, doc_stride=F.doc_stride, n_best_size=F.n_best_size,
                         max_answer_length=F.max_answer_length,
                         allow_last_paragraph_token=F.allow_last_paragraph_token,
                         null_score_diff_threshold=F.null_score_diff_threshold)
    spec = SquadRun(train=(train_examples, F.train_file) if F.do_train else None,
                    predict=(predict_examples, F.predict_file) if predict else None, v2=v2, squad=squad,
                    options=run_common.task_options(F, tokenizer, config, paths["cache_dir"], head_options))
    run_common.check_export(F, spec)
    run_common.start_run(F, paths["output_dir"], "run_squad", "squad", config, tokenizer, F.do_train,
                         train_sources=[F.train_file] if F.do_train else (),
                         data={"max_seq_length": L, "max_query_length": Q, "doc_stride": F.doc_stride, "v2": v2},
                         work_dirs=[paths["model_dir"], paths["cache_dir"]], memory={"head": spec.head_size()})
    run_common.run_task(F, spec, plan, config, strategy)


def main(argv=None) -> run_main.Exit:
    return run_main.main(argv, define_flags, job, __doc__)


if __name__ == "__main__":
    run_main.exit(main())
