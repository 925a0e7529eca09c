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
    import numpy as np

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
    import numpy as np
    import tensorflow as tf

    from xlnet_tf.pretrain_model import PretrainModel, evaluate_plm
    from xlnet_tf.training import Trainer, write_scalar

    train_config = plan.train
    layout = BatchLayout.of(strategy, plan.train_batch_size, train_config.grad_accum_steps, spec.bi_data)
    sampler = spec.sampler(tokenizer)
    files, index = training_records(spec, plan, tokenizer, layout)
    log.info("model: %s", config.to_dict())
    heldout_files, uni_logp = heldout_records(spec, plan, tokenizer, config.n_token)

    def model_fn():
        model = PretrainModel(config, layout.per_replica, seed=train_config.seed, objective=spec.objective)
        if plan.init_checkpoint:
            checkpoint.load_backbone_weights(model.backbone, plan.init_checkpoint)
            log.info("initialised the backbone from %s", plan.init_checkpoint)
        return model

    dataset_fn = sampling.make_train_dataset_fn(files, spec.seq_len, spec.reuse_len, layout.per_replica,
                                       train_config.grad_accum_steps, seed=spec.data_seed, **sampler)
    trainer = Trainer(model_fn, dataset_fn, train_config, strategy)
    if trainer.restored_from:
        log.info("resumed from %s", trainer.restored_from)
    model = trainer.model
    model_dir, out_dir = plan.model_dir, os.path.abspath(plan.output_dir)

    def dump(path, obj):
        write_json(path, obj, indent=2, sort_keys=True, ensure_ascii=False)

    is_chief = trainer.is_chief
    heldout_writer = tf.summary.create_file_writer(os.path.join(model_dir, "heldout")) if is_chief else None
    extra_writer = tf.summary.create_file_writer(os.path.join(model_dir, "train")) if is_chief else None
    results_path = os.path.join(model_dir, "pretrain_results.json")
    previous = {}
    if trainer.restored_from and os.path.isfile(results_path):
        with open(results_path, encoding="utf-8") as f:
            previous = json.load(f)
    heldout_log = list(previous.get("heldout", []))
    history = [tuple(x) for x in previous.get("train_history", [])]

    def evaluate(step):
        if not heldout_files:
            return None
        t0 = time.time()
        ds = sampling.make_pretrain_dataset(heldout_files, spec.seq_len, spec.reuse_len, spec.heldout_batch_size,
                                     repeat=False, **dict(sampler, seed=spec.heldout_seed))
        res = evaluate_plm(model, ds, spec.heldout_steps if spec.heldout_steps > 0 else None, uni_logp)
        res["step"] = int(step)
        heldout_log.append(res)
        log.info("held-out step %d: loss %.4f ppl %.1f over %d targets%s (%.1fs)", step, res["loss"],
                 res["perplexity"], res["tokens"],
                 f"; unigram {res['unigram_loss']:.4f}" if "unigram_loss" in res else "", time.time() - t0)
        if heldout_writer:
            with heldout_writer.as_default():
                write_scalar("loss", res["loss"], step)
                write_scalar("perplexity", res["perplexity"], step)
                if "unigram_loss" in res:
                    write_scalar("unigram_loss", res["unigram_loss"], step)
            heldout_writer.flush()
        return res

    def write_results(done: bool):
        out = {
            "step": int(trainer.step.numpy()), "done": done, "objective": spec.objective,
            "config": config.to_dict(),
            "spiece_model_file": os.path.abspath(spiece), "uncased": bool(spec.uncased),
            "seq_len": spec.seq_len, "reuse_len": spec.reuse_len, "mem_len": spec.mem_len, "bi_data": spec.bi_data,
            "num_predict": spec.predictions_per_sequence(),
            "train_batch_size": plan.train_batch_size, "per_replica_batch": layout.per_replica,
            "replicas": layout.replicas, "train_tokens": index["num_tokens"], "heldout": heldout_log,
            "train_history": history, "backbone_dir": out_dir if done else None,
        }
        out.update(loss_summary(history, train_config.log_steps))
        if heldout_log:
            best = min(heldout_log, key=lambda h: h["loss"])
            out["heldout_loss_start"] = heldout_log[0]["loss"]
            out["heldout_loss_end"] = heldout_log[-1]["loss"]
            out["heldout_loss_best"], out["heldout_loss_best_step"] = best["loss"], best["step"]
            if "unigram_loss" in heldout_log[-1]:
                out["unigram_loss"] = heldout_log[-1]["unigram_loss"]
        out["health"] = health.assess(None, health.loss_trend(history), {"train_steps": train_config.train_steps,
                                      "warmup_steps": train_config.warmup_steps},
                                      eval_loss=heldout_log[-1]["loss"] if heldout_log else None)
        if is_chief:
            dump(results_path, out)
        return out

    step = int(trainer.step.numpy())
    if not heldout_log or heldout_log[-1]["step"] != step:
        evaluate(step)
    every = spec.heldout_every if spec.heldout_every > 0 else train_config.train_steps
    log_steps = max(train_config.log_steps, 1)
    while step < train_config.train_steps:
        stop = min((step // every + 1) * every, train_config.train_steps)
        result = trainer.train(stop_at=stop)
        history.extend((int(s), float(l)) for s, l in result.history)
        if extra_writer:  # perplexity of the same windows the loop logs its loss over
            with extra_writer.as_default():
                window = []
                for s, l in result.history:
                    window.append(l)
                    if s % log_steps == 0 or s == stop:
                        write_scalar("perplexity", math.exp(min(float(np.mean(window)), 700.0)), s)
                        window = []
            extra_writer.flush()
        step = int(trainer.step.numpy())
        evaluate(step)
        write_results(done=False)
    trainer.close()  # its input files close now

    if is_chief:
        model.save_backbone(out_dir)
        shutil.copyfile(spiece, os.path.join(out_dir, "spiece.model"))
        log.info("saved the pretrained backbone to %s (with spiece.model)", out_dir)
    out = write_results(done=True)
    if is_chief:
        dump(os.path.join(out_dir, "pretrain_results.json"), {k: v for k, v in out.items() if k != "train_history"})
        rates = report.learning_rates(train_config, [h[0] for h in history]) if history else None
        report.write_curve(os.path.join(model_dir, report.CURVE_FILE), history, rates, heldout_log,
                           title=f"pretraining ({spec.objective})", eval_name="held-out")
    health.report(out["health"], "pretraining")
    failure = health.failure(out["health"], "pretraining") if plan.fail_if_unhealthy else None
    if failure:
        raise failure
    return {k: out[k] for k in ("step", "heldout_loss_start", "heldout_loss_end", "unigram_loss", "train_loss_final",
                                "train_loss_best") if k in out}
