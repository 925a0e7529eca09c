"""The pretraining room's runner (plain arguments; ``run_pretrain.py`` turns flags into a ``PretrainSpec`` and a
``PretrainPlan``): SentencePiece model, records, the one training loop on ``PretrainModel`` (objective ``plm``,
the paper's permutation LM, or ``mlm``, BERT's masked LM on the same backbone and records), held-out loss, the
saved backbone.

Order: the SentencePiece model (given, or trained and cached), the batch layout (global update batch -> k
micro-steps of ``num_streams`` rows -> one group per replica), the training records (written from the corpus or
reused) and the held-out records, then training in chunks of ``heldout_every`` steps with a held-out
evaluation after each, ``MODEL_DIR/pretrain_results.json`` rewritten after each chunk, and at the end the
backbone in ``output_dir`` (with ``spiece.model``), the training curve ``MODEL_DIR/training_curve.png``
(``tasks/report.py``) and the health check (``tasks/health.py``: the loss trend, overfitting against the
held-out loss); ``PretrainPlan.fail_if_unhealthy`` raises ``health.NotLearning`` after the results are written.

``pretrain_results.json`` (also in ``output_dir``, without the per-step history): ``train_loss_final`` (the mean
loss of the last ``log_steps`` steps, the window the log reports), ``train_loss_best`` and its step (the lowest
such window), ``heldout_loss_start`` / ``_end`` / ``_best`` (and its step), ``unigram_loss``, ``health``.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import logging
import math
import os
import shutil
import time
from typing import Dict, List, Optional, Sequence

import numpy as np

from xlnet_tf.data import pretrain_records as records
from xlnet_tf.data import pretrain_sampling as sampling
from xlnet_tf.data.pretrain_sampling import mlm_num_predict
from xlnet_tf.tasks import health, report
from xlnet_tf.tasks.runner import Plan
from xlnet_tf import checkpoint, spm_train
from xlnet_tf.fileutil import stat_identity, write_json
from xlnet_tf.train_config import TrainConfig

log = logging.getLogger("run_pretrain")


def expand_inputs(spec: Optional[str], flag: Optional[str] = None) -> List[str]:
    """Comma-separated paths and globs -> sorted-per-glob list of existing files (``flag``: named in the error)."""
    out = []
    where = f"--{flag}: " if flag else ""
    for part in [p.strip() for p in (spec or "").split(",") if p.strip()]:
        matches = sorted(glob.glob(part)) if any(c in part for c in "*?[") else [part]
        if not matches:
            raise FileNotFoundError(f"{where}no file matches {part!r}")
        for p in matches:
            if not os.path.isfile(p):
                raise FileNotFoundError(f"{where}{p}: no such file")
            out.append(p)
    return out


@dataclasses.dataclass
class PretrainSpec:
    """What is learnt from what: the data layout, the target sampler and the held-out evaluation."""
    seq_len: int
    objective: str = "plm"
    reuse_len: int = 256
    mem_len: int = 384
    perm_size: Optional[int] = None
    num_predict: Optional[int] = None
    mask_alpha: float = 6
    mask_beta: float = 1
    max_span: int = 5
    bi_data: bool = True
    use_eod: bool = True
    use_eop: bool = False
    data_seed: int = 0
    uncased: bool = False
    heldout_batch_size: int = 8
    heldout_steps: int = 50
    heldout_every: int = 0
    heldout_seed: int = 1234

    def check(self) -> None:
        if self.objective not in ("plm", "mlm"):
            raise ValueError(f"--objective must be plm or mlm, got {self.objective!r}")
        if not 0 <= self.reuse_len <= self.seq_len - 5:
            raise ValueError(f"--reuse_len must be in [0, seq_len - 5], got {self.reuse_len} "
                             f"(seq_len {self.seq_len})")

    def data_settings(self) -> Dict:
        """What the manifest records as the run's data settings (``objective`` only when not the default, so a
        permutation-LM run's manifest reads as before it existed)."""
        keys = (("objective",) if self.objective != "plm" else ()) + (
            "seq_len", "reuse_len", "perm_size", "mask_alpha", "mask_beta", "num_predict", "bi_data", "max_span",
            "use_eod", "use_eop", "data_seed", "uncased")
        return {k: getattr(self, k) for k in keys}

    def sampler(self, tokenizer) -> Dict:
        out = dict(num_predict=self.num_predict, perm_size=self.perm_size, mask_alpha=self.mask_alpha,
                   mask_beta=self.mask_beta, bi_data=self.bi_data, max_span=self.max_span,
                   sep_id=tokenizer.sep_id, cls_id=tokenizer.cls_id)
        if self.objective == "mlm":
            out.update(objective="mlm", vocab_size=tokenizer.vocab_size, mask_id=tokenizer.mask_id)
        return out

    def predictions_per_sequence(self) -> int:
        if self.num_predict:
            return self.num_predict
        if self.objective == "mlm":
            return mlm_num_predict(self.seq_len)
        return int(round(self.seq_len * self.mask_beta / self.mask_alpha))


def check_dirs(model_dir: Optional[str], output_dir: str, record_dir: Optional[str] = None) -> str:
    """The run's directories checked before any work (the saved backbone replaces ``output_dir``, so it must hold
    neither of the others); returns the record directory (``model_dir/data`` by default)."""
    if not model_dir:
        raise ValueError("--model_dir is required (training checkpoints, TensorBoard, records by default)")
    record_dir = record_dir or os.path.join(model_dir, "data")
    out_dir = os.path.abspath(output_dir)
    for p in (model_dir, record_dir):
        ap = os.path.abspath(p)
        if ap == out_dir or ap.startswith(out_dir + os.sep):
            raise ValueError(f"--output_dir ({output_dir}) is replaced by the saved backbone: it must not "
                             f"contain {p}")
    return record_dir


@dataclasses.dataclass
class PretrainPlan:
    """Where a run reads and writes, and how it trains: ``train`` the loop's ``TrainConfig`` (steps,
    micro-batches, log interval, seed, progress, the schedule; its ``model_dir`` the checkpoints and TensorBoard).
    ``record_dir``: the training records (written there from ``train_paths``, or read from there when
    ``train_paths`` is empty; default ``model_dir/data``). Checked when made (``check_dirs``)."""
    train: TrainConfig
    output_dir: str
    record_dir: Optional[str] = None
    train_paths: Sequence[str] = ()
    heldout_paths: Sequence[str] = ()
    train_batch_size: int = Plan.train_batch_size
    init_checkpoint: Optional[str] = None
    fail_if_unhealthy: bool = False

    def __post_init__(self):
        self.record_dir = check_dirs(self.train.model_dir, self.output_dir, self.record_dir)

    @property
    def model_dir(self) -> str:
        return self.train.model_dir

    def make_dirs(self) -> None:
        os.makedirs(self.model_dir, exist_ok=True)
        os.makedirs(self.record_dir, exist_ok=True)


def spiece_model(model_dir: str, train_paths: Sequence[str], spiece_model_file: Optional[str], train_spm: bool,
                 vocab_size: int, uncased: bool) -> str:
    """The SentencePiece model path: given, or trained (and cached while its inputs are unchanged)."""
    if not train_spm:
        if not spiece_model_file:
            raise ValueError("pass --spiece_model_file, or --train_spm (with --train_input) to train one")
        if not os.path.isfile(spiece_model_file):
            raise FileNotFoundError(f"--spiece_model_file not found: {spiece_model_file}")
        return spiece_model_file
    if not train_paths:
        raise ValueError("--train_spm needs --train_input")

    path = spiece_model_file or os.path.join(model_dir, "spiece.model")
    if not path.endswith(".model"):
        raise ValueError(f"--spiece_model_file must end with .model when training one, got {path}")
    meta = {"inputs": [stat_identity(p) for p in train_paths], "vocab_size": vocab_size, "lower": bool(uncased)}
    meta_path = path[:-len(".model")] + ".train.json"
    try:
        with open(meta_path, encoding="utf-8") as f:
            cached = json.load(f)
    except (OSError, ValueError):
        cached = None
    if cached == meta and os.path.isfile(path):
        log.info("reusing SentencePiece model %s", path)
        return path
    t0 = time.time()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    spm_train.train_spm(train_paths, path[:-len(".model")], vocab_size=vocab_size, lower=uncased, quiet=True)
    write_json(meta_path, meta, indent=2, sort_keys=True, ensure_ascii=False)
    log.info("trained SentencePiece model %s (%d pieces) in %.1fs", path, vocab_size, time.time() - t0)
    return path


def local_replicas(strategy) -> int:
    """Replicas fed by this host's input pipeline."""
    try:
        return len(strategy.extended.worker_devices)
    except (RuntimeError, AttributeError, NotImplementedError):  # the default strategy
        return strategy.num_replicas_in_sync


@dataclasses.dataclass
class BatchLayout:
    """The global update batch split into ``grad_accum_steps`` micro-steps of ``num_streams`` rows on this host,
    ``per_replica`` rows on each of its ``replicas``."""
    num_streams: int
    replicas: int
    per_replica: int

    @classmethod
    def of(cls, strategy, train_batch_size: int, grad_accum_steps: int, bi_data: bool) -> "BatchLayout":
        replicas = local_replicas(strategy)
        workers = max(strategy.num_replicas_in_sync // replicas, 1)
        k = grad_accum_steps
        if train_batch_size % (k * workers):
            raise ValueError(f"--train_batch_size={train_batch_size} must divide into {k} micro-steps x {workers} "
                             "worker(s)")
        num_streams = train_batch_size // (k * workers)
        if num_streams % replicas:
            raise ValueError(f"{num_streams} streams per micro-step do not split over {replicas} replicas")
        per_replica = num_streams // replicas
        if bi_data and per_replica % 2:
            raise ValueError(f"--bi_data needs an even per-replica batch, got {per_replica}")
        return cls(num_streams, replicas, per_replica)


def training_records(spec: PretrainSpec, plan: PretrainPlan, tokenizer, layout: BatchLayout):
    """(files, index) of the training records: written from ``plan.train_paths`` (cached) or reused."""
    prefix = os.path.join(plan.record_dir, "train")
    if plan.train_paths:
        files = records.create_pretrain_tfrecords(plan.train_paths, prefix, tokenizer, spec.seq_len, spec.reuse_len,
                                            layout.num_streams, bi_data=spec.bi_data, num_groups=layout.replicas,
                                            use_eod=spec.use_eod, use_eop=spec.use_eop, seed=spec.data_seed,
                                            progress=plan.train.progress)
    else:
        files = records.pretrain_files(prefix)
    with open(prefix + ".index.json", encoding="utf-8") as f:
        index = json.load(f)
    log.info("training records: %d file(s), %d steps of %d streams (%d tokens) in %s", len(files), index["steps"],
             layout.num_streams, index["num_tokens"], plan.record_dir)
    meta = index["meta"]
    if meta["num_groups"] != layout.replicas or meta["num_streams"] != layout.num_streams:
        raise ValueError(f"{prefix}: records were written for {meta['num_streams']} streams in "
                         f"{meta['num_groups']} group(s); this run needs {layout.num_streams} in {layout.replicas} "
                         "(pass --train_input to rewrite them)")
    return files, index


def heldout_records(spec: PretrainSpec, plan: PretrainPlan, tokenizer, n_token: int):
    """(files, unigram log-probs of the training corpus or None); (None, None) without held-out text."""
    if not plan.heldout_paths:
        return None, None
    from xlnet_tf.pretrain_model import unigram_log_probs

    files = records.create_pretrain_tfrecords(
        plan.heldout_paths, os.path.join(plan.record_dir, "heldout"), tokenizer, spec.seq_len, spec.reuse_len,
        spec.heldout_batch_size, bi_data=spec.bi_data, num_groups=1, use_eod=spec.use_eod, use_eop=spec.use_eop,
        seed=spec.heldout_seed, progress=plan.train.progress)
    uni_logp = None
    if plan.train_paths:
        stream = records.encode_corpus(plan.train_paths, tokenizer, use_eod=spec.use_eod, use_eop=spec.use_eop,
                                 progress=False)
        uni_logp = unigram_log_probs(stream.ids, n_token)
    return files, uni_logp


def loss_summary(history: Sequence, window: int) -> Dict:
    """``train_loss_final`` (mean of the last ``window`` steps), ``train_loss_best`` and ``train_loss_best_step``
    (the lowest mean over ``window`` consecutive steps, and that window's last step) of [(step, loss)]."""
    if not history:
        return {}
    losses = np.asarray([h[1] for h in history], np.float64)
    w = max(1, min(int(window), losses.size))
    means = np.convolve(losses, np.ones(w) / w, mode="valid")
    best = int(np.nanargmin(means)) if np.isfinite(means).any() else len(means) - 1
    return {"train_loss_final": round(float(means[-1]), 4), "train_loss_best": round(float(means[best]), 4),
            "train_loss_best_step": int(history[best + w - 1][0]), "train_loss_window": w}


def run(spec: PretrainSpec, plan: PretrainPlan, config, tokenizer, spiece: str, strategy) -> Dict:
    """Pretrains by ``plan`` (its ``train``: the loop's ``TrainConfig``); returns the summary (``step``,
    ``heldout_loss_start`` / ``_end``, ``unigram_loss``)."""
    pretraining = Pretraining(spec, plan, config, tokenizer, spiece, strategy)
    pretraining.train()
    out = pretraining.finish()
    check_health(out, plan)
    return {k: out[k] for k in ("step", "heldout_loss_start", "heldout_loss_end", "unigram_loss", "train_loss_final",
                                "train_loss_best") if k in out}


class Pretraining:
    """One pretraining run under way: its records, the trainer on ``PretrainModel``, the held-out evaluations and
    the loss history (both read back from ``pretrain_results.json`` when the run resumes)."""

    def __init__(self, spec: PretrainSpec, plan: PretrainPlan, config, tokenizer, spiece: str, strategy):
        self.spec, self.plan, self.config, self.spiece = spec, plan, config, spiece
        self.train_config = plan.train
        self.layout = BatchLayout.of(strategy, plan.train_batch_size, self.train_config.grad_accum_steps,
                                     spec.bi_data)
        self.sampler = spec.sampler(tokenizer)
        files, self.index = training_records(spec, plan, tokenizer, self.layout)
        log.info("model: %s", config.to_dict())
        self.heldout_files, self.uni_logp = heldout_records(spec, plan, tokenizer, config.n_token)
        self.trainer = self.make_trainer(files, strategy)
        self.model = self.trainer.model
        self.model_dir, self.out_dir = plan.model_dir, os.path.abspath(plan.output_dir)
        self.is_chief = self.trainer.is_chief
        self.heldout_writer, self.extra_writer = self.summary_writers()
        self.results_path = os.path.join(self.model_dir, "pretrain_results.json")
        self.heldout_log, self.history = self.previous_results()

    def make_trainer(self, files: Sequence[str], strategy):
        """The loop's ``Trainer`` on a ``PretrainModel`` (its backbone from ``plan.init_checkpoint`` if given)
        and the training records' sampled batches; resumed from the newest checkpoint if there is one."""
        from xlnet_tf.pretrain_model import PretrainModel  # heavy: TensorFlow
        from xlnet_tf.training import Trainer  # heavy: TensorFlow

        spec, plan, train_config = self.spec, self.plan, self.train_config

        def model_fn():
            model = PretrainModel(self.config, self.layout.per_replica, seed=train_config.seed,
                                  objective=spec.objective)
            if plan.init_checkpoint:
                checkpoint.load_backbone_weights(model.backbone, plan.init_checkpoint)
                log.info("initialised the backbone from %s", plan.init_checkpoint)
            return model

        dataset_fn = sampling.make_train_dataset_fn(files, spec.seq_len, spec.reuse_len, self.layout.per_replica,
                                                    train_config.grad_accum_steps, seed=spec.data_seed,
                                                    **self.sampler)
        trainer = Trainer(model_fn, dataset_fn, train_config, strategy)
        if trainer.restored_from:
            log.info("resumed from %s", trainer.restored_from)
        return trainer

    def summary_writers(self):
        """TensorBoard writers (the chief's only): the held-out evaluations', the training perplexity's."""
        import tensorflow as tf  # heavy

        if not self.is_chief:
            return None, None
        return (tf.summary.create_file_writer(os.path.join(self.model_dir, "heldout")),
                tf.summary.create_file_writer(os.path.join(self.model_dir, "train")))

    def previous_results(self):
        """(held-out evaluations, [(step, loss)]) of the run this one resumes (empty for a new run)."""
        previous = {}
        if self.trainer.restored_from and os.path.isfile(self.results_path):
            with open(self.results_path, encoding="utf-8") as f:
                previous = json.load(f)
        return list(previous.get("heldout", [])), [tuple(x) for x in previous.get("train_history", [])]

    def train(self) -> None:
        """Trains to ``train_steps`` in chunks of ``heldout_every`` steps, each followed by a held-out evaluation
        and the results file (an evaluation first, unless the resumed run's last one was at this step)."""
        train_config = self.train_config
        step = int(self.trainer.step.numpy())
        if not self.heldout_log or self.heldout_log[-1]["step"] != step:
            self.evaluate(step)
        every = self.spec.heldout_every if self.spec.heldout_every > 0 else train_config.train_steps
        while step < train_config.train_steps:
            stop = min((step // every + 1) * every, train_config.train_steps)
            result = self.trainer.train(stop_at=stop)
            self.history.extend((int(s), float(l)) for s, l in result.history)
            self.write_perplexity(result.history, stop)
            step = int(self.trainer.step.numpy())
            self.evaluate(step)
            self.results(done=False)
        self.trainer.close()  # its input files close now

    def write_perplexity(self, history: Sequence, stop: int) -> None:
        """The training perplexity to TensorBoard, over the same windows the loop logs its loss over."""
        from xlnet_tf.training import write_scalar  # heavy: TensorFlow

        if not self.extra_writer:
            return
        log_steps = max(self.train_config.log_steps, 1)
        with self.extra_writer.as_default():
            window = []
            for s, l in history:
                window.append(l)
                if s % log_steps == 0 or s == stop:
                    write_scalar("perplexity", math.exp(min(float(np.mean(window)), 700.0)), s)
                    window = []
        self.extra_writer.flush()

    def evaluate(self, step: int) -> Optional[Dict]:
        """The held-out loss at ``step`` (None without held-out text): logged, kept, written to TensorBoard."""
        from xlnet_tf.pretrain_model import evaluate_plm  # heavy: TensorFlow
        from xlnet_tf.training import write_scalar  # heavy: TensorFlow

        spec = self.spec
        if not self.heldout_files:
            return None
        t0 = time.time()
        ds = sampling.make_pretrain_dataset(self.heldout_files, spec.seq_len, spec.reuse_len,
                                            spec.heldout_batch_size, repeat=False,
                                            **dict(self.sampler, seed=spec.heldout_seed))
        res = evaluate_plm(self.model, ds, spec.heldout_steps if spec.heldout_steps > 0 else None, self.uni_logp)
        res["step"] = int(step)
        self.heldout_log.append(res)
        log.info("held-out step %d: loss %.4f ppl %.1f over %d targets%s (%.1fs)", step, res["loss"],
                 res["perplexity"], res["tokens"],
                 f"; unigram {res['unigram_loss']:.4f}" if "unigram_loss" in res else "", time.time() - t0)
        if self.heldout_writer:
            with self.heldout_writer.as_default():
                write_scalar("loss", res["loss"], step)
                write_scalar("perplexity", res["perplexity"], step)
                if "unigram_loss" in res:
                    write_scalar("unigram_loss", res["unigram_loss"], step)
            self.heldout_writer.flush()
        return res

    def results(self, done: bool) -> Dict:
        """The run's results (this module's docstring), written to ``MODEL_DIR/pretrain_results.json`` by the
        chief."""
        spec, plan, layout, heldout_log = self.spec, self.plan, self.layout, self.heldout_log
        out = {
            "step": int(self.trainer.step.numpy()), "done": done, "objective": spec.objective,
            "config": self.config.to_dict(),
            "spiece_model_file": os.path.abspath(self.spiece), "uncased": bool(spec.uncased),
            "seq_len": spec.seq_len, "reuse_len": spec.reuse_len, "mem_len": spec.mem_len, "bi_data": spec.bi_data,
            "num_predict": spec.predictions_per_sequence(),
            "train_batch_size": plan.train_batch_size, "per_replica_batch": layout.per_replica,
            "replicas": layout.replicas, "train_tokens": self.index["num_tokens"], "heldout": heldout_log,
            "train_history": self.history, "backbone_dir": self.out_dir if done else None,
        }
        out.update(loss_summary(self.history, self.train_config.log_steps))
        out.update(heldout_summary(heldout_log))
        out["health"] = health.assess(None, health.loss_trend(self.history),
                                      {"train_steps": self.train_config.train_steps,
                                       "warmup_steps": self.train_config.warmup_steps},
                                      eval_loss=heldout_log[-1]["loss"] if heldout_log else None)
        if self.is_chief:
            _dump(self.results_path, out)
        return out

    def finish(self) -> Dict:
        """The saved backbone (with ``spiece.model``), the final results (in ``output_dir`` too, without the
        history) and the training curve; returns the results."""
        if self.is_chief:
            self.model.save_backbone(self.out_dir)
            shutil.copyfile(self.spiece, os.path.join(self.out_dir, "spiece.model"))
            log.info("saved the pretrained backbone to %s (with spiece.model)", self.out_dir)
        out = self.results(done=True)
        if self.is_chief:
            _dump(os.path.join(self.out_dir, "pretrain_results.json"),
                  {k: v for k, v in out.items() if k != "train_history"})
            history = self.history
            rates = report.learning_rates(self.train_config, [h[0] for h in history]) if history else None
            report.write_curve(os.path.join(self.model_dir, report.CURVE_FILE), history, rates, self.heldout_log,
                               title=f"pretraining ({self.spec.objective})", eval_name="held-out")
        return out


def heldout_summary(heldout_log: Sequence[Dict]) -> Dict:
    """``heldout_loss_start`` / ``_end`` / ``_best`` (and its step), ``unigram_loss`` of the held-out evaluations
    (empty without any)."""
    out = {}
    if heldout_log:
        best = min(heldout_log, key=lambda h: h["loss"])
        out["heldout_loss_start"] = heldout_log[0]["loss"]
        out["heldout_loss_end"] = heldout_log[-1]["loss"]
        out["heldout_loss_best"], out["heldout_loss_best_step"] = best["loss"], best["step"]
        if "unigram_loss" in heldout_log[-1]:
            out["unigram_loss"] = heldout_log[-1]["unigram_loss"]
    return out


def check_health(out: Dict, plan: PretrainPlan) -> None:
    """Logs the health check; raises ``health.NotLearning`` when unhealthy under ``plan.fail_if_unhealthy``."""
    health.report(out["health"], "pretraining")
    failure = health.failure(out["health"], "pretraining") if plan.fail_if_unhealthy else None
    if failure:
        raise failure


def _dump(path: str, obj) -> None:
    write_json(path, obj, indent=2, sort_keys=True, ensure_ascii=False)
