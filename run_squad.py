"""Fine-tune XLNet on SQuAD v1.1 / v2.0, predict, score with the official scorers and export a SavedModel.

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
  ``python -m tasks.squad_eval dev.json non_null_predictions.json --na-prob-file null_odds.json``.
* ``null_odds.json`` {id: min answer-class logit over the question's windows} (higher = no answer);
  ``nbest.json`` {id: [{text, probability, start_log_prob, end_log_prob, start_char, end_char}, ...]}.
* ``eval_results.json``: the official scorer's keys (v2.0: ``exact``, ``f1``, ``total``, ``HasAns_*``,
  ``NoAns_*``, ``best_exact``, ``best_exact_thresh``, ``best_f1``, ``best_f1_thresh``; v1.1: ``exact_match``,
  ``f1``), plus ``step``, ``loss`` (mean per-window loss), ``null_score_diff_threshold``, ``version``,
  ``num_questions``, ``num_features``. v2.0's ``exact``/``f1`` are exactly ``predictions.json`` scored on its
  own (the scorer applies the same threshold to the null odds); ``best_*`` are the numbers the paper reports.
Also ``model/train_history.json`` ([[step, loss], ...], --do_train) and cached features in ``data/``.

``--export_dir``: a SavedModel answering raw ``question`` + ``context`` strings (any length: sliding windows
in-graph), see ``tasks/squad_serving.py``; ``has_answer`` uses ``--null_score_diff_threshold`` (v2.0).

Bad input files exit with code 2 and a one-line message naming the file and the json path of the bad field.
"""

from __future__ import annotations

import logging
import os
import time

from absl import app, flags

import run_common
import runner

FLAGS = flags.FLAGS
flags.DEFINE_string("train_file", None, "SQuAD json for training.")
flags.DEFINE_string("predict_file", None, "SQuAD json to predict (and score: it must carry the answers).")
flags.DEFINE_string("predict_dir", None, "Where predictions and eval_results.json go (default: OUTPUT_DIR).")
flags.DEFINE_bool("version_2_with_negative", False, "SQuAD 2.0: questions may have no answer. (Also turned on "
                  "when a file carries is_impossible fields.)")
flags.DEFINE_integer("max_query_length", 64, "Question pieces kept (the first ones).")
flags.DEFINE_integer("doc_stride", 128, "Stride between the context windows, in pieces.")
flags.DEFINE_integer("start_n_top", 5, "Beam size of answer starts.")
flags.DEFINE_integer("end_n_top", 5, "Beam size of answer ends per start.")
flags.DEFINE_integer("n_best_size", 5, "Answers kept per question in nbest.json.")
flags.DEFINE_integer("max_answer_length", 64, "Longest answer, in pieces.")
flags.DEFINE_bool("allow_last_paragraph_token", False, "Let an answer start or end on a window's last paragraph "
                  "token (the original rejects such candidates).")
flags.DEFINE_list("answer_class_hidden_sizes", [], "Hidden sizes of a deeper answer-class MLP (empty: the "
                  "original head). --head_hidden_sizes makes the start/end MLPs deeper.")
flags.DEFINE_float("null_score_diff_threshold", 0.0, "v2.0: predict no answer when the null odds (answer-class "
                   "logit) exceed this (predictions.json and the exported has_answer).")
flags.DEFINE_integer("num_workers", None, "Processes building features (default: CPU count, at most 8).")
run_common.define_common_flags(default_seq_len=512, default_lr=3e-5)

log = logging.getLogger("run_squad")


def read_file(path, name, require_answers=True):
    """(examples, version) of a SQuAD json; pure Python (bad files fail before TensorFlow is imported)."""
    from tasks import squad as squad_task

    if not path:
        raise ValueError(f"--{name} is required")
    examples, version = squad_task.read_squad_with_version(path, require_answers=require_answers)
    if not examples:
        raise ValueError(f"{path}: no questions")
    return examples, version


class SquadRun(runner.TaskSpec):
    """SQuAD v1.1 / v2.0 for the runner (plain arguments). Evaluation predicts the predict file (scoring it when
    it has answers) and writes the best checkpoint's predictions; ``options``: see ``main``."""
    name = "squad"

    def __init__(self, tokenizer, config, cache_dir, train, predict, v2, options, head_options,
                 num_workers=None, progress=True, overwrite_data=False, seed=42):
        self.tokenizer, self.config, self.cache_dir = tokenizer, config, cache_dir
        self.sources = {"train": train, "predict": predict}  # split -> (examples, file) or None
        self.v2, self.o, self.head_options, self.seed = v2, options, head_options, seed
        self.num_workers, self.progress, self.overwrite_data = num_workers, progress, overwrite_data
        self.main_metric = "best_f1" if v2 else "f1"
        self.null_threshold = options["null_score_diff_threshold"] if v2 else None
        self._features, self._kept = {}, {}

    def features(self, split):
        """(TFRecord path, feature index) of "train" or "predict", built once per run."""
        from data import squad as squad_data

        if split in self._features:
            return self._features[split]
        examples, source = self.sources[split]
        o = self.o
        base = os.path.splitext(os.path.basename(source))[0]
        path = os.path.join(self.cache_dir, f"{base}-{split}-L{o['max_seq_length']}-q{o['max_query_length']}-"
                                            f"s{o['doc_stride']}.tfrecord")
        if self.overwrite_data:
            for p in (path, path + ".json", squad_data.index_path(path)):
                if os.path.exists(p):
                    os.remove(p)
        t0 = time.time()
        index = squad_data.write_squad_features(examples, path, self.tokenizer, o["max_seq_length"], o["doc_stride"],
                                                o["max_query_length"], is_training=split == "train",
                                                num_workers=self.num_workers, progress=self.progress)
        stats = index.stats
        log.info("%s: %d questions -> %d windows in %s (%.1fs; %d with >1 window, %d truncated questions, "
                 "%d answers not mappable to pieces)", split, len(examples), len(index.features), path,
                 time.time() - t0, stats.get("multi_window", 0), stats.get("truncated_questions", 0),
                 len(stats.get("unmappable", [])))
        if not index.features:
            raise ValueError(f"{source}: no {split} features")
        self._features[split] = path, index
        return self._features[split]

    def head(self):
        from heads.squad import SquadHead

        return SquadHead(self.config.d_model, **self.head_options)

    def feature_spec(self):
        from data import squad as squad_data

        return squad_data.squad_feature_spec(self.o["max_seq_length"])

    def prepare(self, splits):
        for split in splits:
            self.features("train" if split == "train" else "predict")

    def train_dataset(self, batch_size, input_context):
        from data import squad as squad_data

        return squad_data.squad_dataset(self.features("train")[0], self.o["max_seq_length"], batch_size,
                                        is_training=True, seed=self.seed, input_context=input_context)

    @property
    def labelled(self):
        """An unlabelled predict file (a test set) gets predictions but no scores."""
        return any(ex.answers or ex.is_impossible for ex in self.sources["predict"][0])

    def evaluate(self, model, step):
        import tensorflow as tf

        from data import squad as squad_data
        from tasks import squad_eval
        from tasks.squad_postprocess import concat_results, postprocess
        from xlnet_tf.training import predict as run_predict

        o = self.o
        path, index = self.features("predict")
        examples = self.sources["predict"][0]
        version = "2.0" if self.v2 else "1.1"

        def output_fn(feats, outputs):
            out = dict(model.head.predictions(outputs))
            out["unique_id"] = feats["unique_id"]
            out["loss"] = tf.cast(model.per_example_loss(feats, outputs), tf.float32)
            return out

        ds = squad_data.squad_dataset(path, o["max_seq_length"], o["predict_batch_size"], is_training=False)
        t0 = time.time()
        out = run_predict(model, ds, self.finetuner.strategy, output_fn=output_fn)
        preds = postprocess(index, concat_results([out]), n_best_size=o["n_best_size"],
                            max_answer_length=o["max_answer_length"],
                            allow_last_paragraph_token=o["allow_last_paragraph_token"])
        dataset = squad_eval.examples_to_dataset(examples, version)
        if not self.labelled:
            metrics = {}
        elif self.v2:
            metrics = squad_eval.evaluate(dataset, preds.predictions, preds.null_odds, version,
                                          na_prob_thresh=self.null_threshold)
            metrics.update(squad_eval.span_scores(dataset, preds.predictions))
        else:
            metrics = squad_eval.evaluate(dataset, preds.predictions, None, version)
        metrics.update(step=int(step), loss=float(out["loss"].mean()), version=version,
                       num_questions=len(examples), num_features=len(index.features),
                       predict_seconds=round(time.time() - t0, 2))
        if self.v2:
            metrics["null_score_diff_threshold"] = self.null_threshold
        self._kept[int(step)] = preds
        return metrics

    def finish_evaluation(self, results, results_dir):
        """Writes the scored checkpoint's predictions (v2: "" where the null odds exceed the threshold, and the
        non-null answers beside), and ``eval_results.json`` when the predict file has answers."""
        from tasks.squad_postprocess import SquadPredictions, write_predictions
        from xlnet_tf.fileutil import write_json

        preds = self._kept[int(results["step"])]
        if self.v2:
            non_null = dict(preds.predictions)
            final = SquadPredictions(
                predictions={q: ("" if preds.null_odds[q] > self.null_threshold else t) for q, t in non_null.items()},
                null_odds=preds.null_odds, nbest=preds.nbest)
            write_predictions(final, results_dir)
            write_json(os.path.join(results_dir, "non_null_predictions.json"), non_null)
        else:
            write_predictions(preds, results_dir)
        if self.labelled:
            super().finish_evaluation(results, results_dir)
        else:
            log.info("%s has no gold answers: predictions written to %s, nothing scored", self.sources["predict"][1],
                     results_dir)

    def export(self, model, export_dir):
        from tasks.squad_serving import SquadServing

        o = self.o
        SquadServing(model, self.tokenizer, o["max_seq_length"], o["max_query_length"], o["doc_stride"],
                     o["max_answer_length"], null_threshold=self.null_threshold,
                     allow_last_paragraph_token=o["allow_last_paragraph_token"]).export(export_dir)
        log.info("exported SavedModel to %s (signatures: serving_default(question, context), serve_ids)",
                 export_dir)


def main(_):
    F = FLAGS
    predict = F.do_predict or F.do_eval
    plan = run_common.plan(F, do_eval=predict, results_dir=F.predict_dir or F.output_dir)
    plan.do_predict = False  # SQuAD's predictions come with its evaluation (scored when the file has answers)
    L, Q = F.max_seq_length, F.max_query_length
    if Q < 1 or F.doc_stride < 1 or L < Q + 4:
        raise ValueError(f"need --max_query_length >= 1, --doc_stride >= 1 and --max_seq_length > "
                         f"--max_query_length + 3 (got {L}, {Q}, {F.doc_stride})")
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
    run_common.start_run(F, paths["output_dir"], "run_squad", "squad", config, tokenizer, F.do_train,
                         train_sources=[F.train_file] if F.do_train else (),
                         data={"max_seq_length": L, "max_query_length": Q, "doc_stride": F.doc_stride, "v2": v2},
                         work_dirs=[paths["model_dir"], paths["cache_dir"]])
    options = dict(max_seq_length=L, max_query_length=Q, doc_stride=F.doc_stride, n_best_size=F.n_best_size,
                   max_answer_length=F.max_answer_length, allow_last_paragraph_token=F.allow_last_paragraph_token,
                   null_score_diff_threshold=F.null_score_diff_threshold,
                   predict_batch_size=F.predict_batch_size or F.eval_batch_size)
    spec = SquadRun(tokenizer, config, paths["cache_dir"],
                    (train_examples, F.train_file) if F.do_train else None,
                    (predict_examples, F.predict_file) if predict else None, v2, options, head_options,
                    num_workers=F.num_workers, progress=F.progress, overwrite_data=F.overwrite_data, seed=F.seed)
    run_common.run_task(F, spec, plan, config, strategy)


if __name__ == "__main__":
    flags.mark_flag_as_required("output_dir")
    app.run(run_common.main_wrapper(main))
