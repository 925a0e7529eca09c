"""Text generation with XLNet's LM head: greedy or sampled, one query-stream prediction per step, with memory.

Each new token is predicted as XLNet predicts in pretraining: a placeholder ("dummy", id 0) is appended after the
last token, ``perm_mask`` hides it from every position and ``target_mapping`` selects it, so the query stream
at that position (``mask_emb`` and the position only) reads the tokens before it and the LM head gives the next
token's logits. The conventions are HuggingFace's ``XLNetLMHeadModel.generate`` (transformers 4.x), so the
greedy ids are the same on the same weights (``tests/test_generation.py``):

* step 0 runs the whole prompt plus the placeholder; the content-stream inputs of every layer (the memory) are
  kept for all prompt tokens but the last;
* every later step runs a window of three positions: the previous token, the newest token and the placeholder
  (HF's ``offset = 2``: the previous token is recomputed once it can see the newest one), with the memory; the
  window's first position then joins the memory. A step is a forward pass over 3 positions, not the prefix:
  each layer keeps its memory as keys and values (``attention.KeyValueMemory``; HF keeps hidden states and
  projects the whole memory again in every step), so a step projects only its new positions, and the keys and
  values it projected for the window's first position are the ones that join the memory (``own_kv``). Every
  step has the same shape, so each block's positional tables are multiplied once, before the loop
  (``XLNetModel.projected_positions``).
* ``mem_len=m`` keeps the last m positions of memory, as ``XLNetConfig.mem_len`` means everywhere here; HF
  keeps the same with ``config.mem_len = m + 2`` (its last ``mem_len - 2``). ``None`` keeps everything (HF's
  ``mem_len=None``, its released configs).

The memory is a fixed-size buffer per layer, right-aligned (the newest position last, so relative distances are
those of the unpadded sequence) with a ``mem_padding_mask`` hiding its empty slots and the prompts' left padding:
the loop is one ``tf.while_loop`` inside one ``tf.function`` with shapes fixed for the whole generation.
Prompts of different lengths are left-padded (``padding_mask`` 1 = real), which gives each row the ids it gets
alone. After ``eos_id`` a row continues with ``pad_id`` (as HF); the loop stops when every row has ended.

Intended differences from HF: a prompt is its pieces alone (HF's tokenizer appends ``<sep> <cls>`` and its
pipeline prepends a filler text; ``generate.py`` does neither); sampling defaults to no top-k (HF's default is
50) and draws from a stateless seed (same seed, same ids; not HF's random stream); an empty prompt is refused by
the CLI and read as ``<eod>`` by the SavedModel.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import threading
import time
from typing import Optional, Sequence

import numpy as np
import tensorflow as tf

from xlnet_tf.attention import KeyValueMemory
from xlnet_tf.export import batch_length, keep_last, pad_rows, save_atomically
from xlnet_tf.generation_options import BATCH_SIZE, MAX_PROMPT_LENGTH, GenerationOptions
from xlnet_tf.lengths import SERVING_MULTIPLE
from xlnet_tf.tokenizer import XLNetTokenizer

log = logging.getLogger("generation")

DUMMY_ID = 0  # HF's placeholder id; nothing reads its content (perm_mask hides it), so its value does not matter


def left_pad(prompts: Sequence[Sequence[int]], pad_id: int, multiple: int = SERVING_MULTIPLE):
    """Id lists -> (input_ids, padding_mask) int32 [b, L], left-padded to a multiple of ``multiple`` (a bounded set
    of shapes). Empty prompts are refused: a prediction needs at least one token before it."""
    for i, p in enumerate(prompts):
        if len(p) == 0:
            raise ValueError(f"prompt {i}: empty (expected at least one token)")
    if not prompts:
        raise ValueError("no prompts")
    longest = max(len(p) for p in prompts)
    length = -(-longest // multiple) * multiple
    ids = np.full((len(prompts), length), pad_id, np.int32)
    mask = np.zeros((len(prompts), length), np.int32)
    for i, p in enumerate(prompts):
        ids[i, length - len(p):] = p
        mask[i, length - len(p):] = 1
    return ids, mask


def next_token_logits(model, input_ids, padding_mask=None, mems=None, mem_padding_mask=None, positions=None):
    """One prediction step: a placeholder appended to ``input_ids`` [b, q], hidden by ``perm_mask``, selected by
    ``target_mapping``; returns (logits [b, V] float32 of the token at the placeholder, each layer's keys and
    values of the given positions, a ``KeyValueMemory`` [b, q, n*h]: what they contribute to the memory; with a
    memory, the ones the step's attention projected). ``positions``: the step's relative positions, projected
    once for the loop (``XLNetModel.projected_positions``)."""
    bsz, qlen = tf.shape(input_ids)[0], tf.shape(input_ids)[1]
    ids = tf.concat([tf.cast(input_ids, tf.int32), tf.fill([bsz, 1], DUMMY_ID)], axis=1)
    if padding_mask is not None:
        padding_mask = tf.concat([tf.cast(padding_mask, tf.int32), tf.ones([bsz, 1], tf.int32)], axis=1)
    last = tf.one_hot(qlen, qlen + 1, dtype=tf.float32)  # [q + 1]: the placeholder
    perm_mask = tf.tile(last[None, None, :], [bsz, qlen + 1, 1])  # nobody sees the placeholder
    target_mapping = tf.tile(last[None, None, :], [bsz, 1, 1])
    out = model(ids, padding_mask=padding_mask, mems=mems, mem_padding_mask=mem_padding_mask,
                perm_mask=perm_mask, target_mapping=target_mapping, output_hidden_states=True, training=False,
                positions=positions)
    logits = model.lm_logits(out["query_output"][:, 0])
    if "own_kv" in out:
        return logits, [KeyValueMemory(kv.k[:, :qlen], kv.v[:, :qlen]) for kv in out["own_kv"]]
    return logits, [b.rel_attn.memory_kv(h[:, :qlen]) for b, h in zip(model.blocks, out["hidden_states"])]


# The options the compiled loop reads as tensors (one trace serves every value): name -> dtype.
CONTROLS = {"max_new_tokens": tf.int32, "temperature": tf.float32, "top_k": tf.int32, "top_p": tf.float32,
            "seed": tf.int64, "eos_id": tf.int32, "pad_id": tf.int32, "mem_len": tf.int32}
CONTROL_SPECS = {k: tf.TensorSpec([], d, name=k) for k, d in CONTROLS.items()}


def controls(options: GenerationOptions) -> dict:
    """The options as the loop's scalar tensors (``eos_id`` -1 = none, ``mem_len`` 0 = keep all)."""
    values = dataclasses.asdict(options)
    values["eos_id"] = -1 if options.eos_id is None else options.eos_id
    values["mem_len"] = options.mem_len or 0
    return {k: tf.constant(values[k], d) for k, d in CONTROLS.items()}


def choose(logits, step, do_sample: bool, c: dict):
    """The next ids [b] from logits [b, V]: argmax, or a draw after temperature, top-k and top-p (HF's order)."""
    if not do_sample:
        return tf.argmax(logits, axis=-1, output_type=tf.int32)
    minus_inf = tf.constant(-np.inf, logits.dtype)
    logits = logits / tf.cast(c["temperature"], logits.dtype)
    vocab = tf.shape(logits)[-1]
    ordered = tf.sort(logits, axis=-1, direction="DESCENDING")
    k = tf.where(c["top_k"] > 0, tf.minimum(c["top_k"], vocab), vocab)
    kth = tf.gather(ordered, k - 1, axis=-1)[:, None]  # ties with the k-th are kept, as HF
    logits = tf.where(logits < kth, minus_inf, logits)
    ordered = tf.where(ordered < kth, minus_inf, ordered)
    # top-p: the most likely tokens whose mass before them is < p (at least one)
    before = tf.cumsum(tf.nn.softmax(ordered, axis=-1), axis=-1, exclusive=True)
    kept = tf.reduce_sum(tf.cast(before < tf.cast(c["top_p"], before.dtype), tf.int32), axis=-1)
    cutoff = tf.gather(ordered, tf.maximum(kept, 1) - 1, batch_dims=1)[:, None]
    cutoff = tf.where(c["top_p"] < 1.0, cutoff, minus_inf)
    logits = tf.where(logits < cutoff, minus_inf, logits)
    step_seed = tf.stack([tf.cast(c["seed"], tf.int64), tf.cast(step, tf.int64)])
    return tf.cast(tf.random.stateless_categorical(logits, 1, seed=step_seed)[:, 0], tf.int32)


REPORT_STEPS = 16  # a ``report`` callback of the loop is called every this many new tokens


def generate_graph(model, input_ids, padding_mask, do_sample: bool, c: dict, report=None):
    """The whole generation as graph ops (call it inside a ``tf.function``): input_ids, padding_mask [b, P]
    (left-padded), the ``controls`` c -> new ids int32 [b, max_new_tokens] (``pad_id`` after a row's
    ``eos_id``). ``report``: a Python function of the number of new tokens so far, called from the loop every
    ``REPORT_STEPS`` tokens (progress; never in an exported graph)."""
    input_ids = tf.cast(input_ids, tf.int32)
    padding_mask = tf.cast(padding_mask, tf.int32)
    bsz, plen = tf.shape(input_ids)[0], tf.shape(input_ids)[1]
    n_new, pad_id = c["max_new_tokens"], c["pad_id"]
    # Memory slots: every position that ever joins it (the prompt but its last token, then one per later step).
    capacity = tf.maximum(plen - 1 + n_new - 1, 1)
    capacity = tf.where(c["mem_len"] > 0, tf.minimum(capacity, c["mem_len"]), capacity)

    def fit(x, fill):
        """[b, n, ...] -> its last ``capacity`` positions, ``fill`` on the left where it has fewer."""
        x = x[:, tf.maximum(tf.shape(x)[1] - capacity, 0):]
        pad = [[0, 0], [capacity - tf.shape(x)[1], 0]] + [[0, 0]] * (len(x.shape) - 2)
        return tf.pad(x, pad, constant_values=fill)

    def pick(logits, step, finished):
        ids = tf.where(finished, pad_id, choose(logits, step, do_sample, c))
        return ids, finished | tf.equal(ids, c["eos_id"])

    logits, rows = next_token_logits(model, input_ids, padding_mask)
    first, finished = pick(logits, 0, tf.zeros([bsz], tf.bool))
    n_layer = len(rows)
    # Each layer's memory is kept as its keys and values (a step then projects only its new positions).
    mems = [fit(t[:, :-1], 0.0) for kv in rows for t in (kv.k, kv.v)]
    mem_mask = fit(padding_mask[:, :-1], 0)
    columns = tf.range(n_new)[None, :]
    # Every step has the same shape (2 window positions + the placeholder over the memory's fixed slots): its
    # positional tables are multiplied once, here, not in each step.
    positions = model.projected_positions(3, capacity + 3)
    out = tf.where(tf.equal(columns, 0), first[:, None], tf.fill(tf.stack([bsz, n_new]), pad_id))  # [b, n_new]

    def cond(step, prev, cur, finished, out, mem_mask, *mems):
        return (step < n_new) & tf.logical_not(tf.reduce_all(finished))

    def body(step, prev, cur, finished, out, mem_mask, *mems):
        if report is not None:
            tick = tf.cond(tf.equal(step % REPORT_STEPS, 0),
                           lambda: tf.reshape(tf.numpy_function(report, [step], tf.int32, stateful=True), []),
                           lambda: tf.constant(0))
            with tf.control_dependencies([tick]):
                step = tf.identity(step)
        window = tf.stack([prev, cur], axis=1)
        kv = [KeyValueMemory(*mems[2 * i:2 * i + 2]) for i in range(n_layer)]
        logits, rows = next_token_logits(model, window, mems=kv, mem_padding_mask=mem_mask, positions=positions)
        new, finished = pick(logits, step, finished)
        mems = [tf.concat([m[:, 1:], n[:, :1]], axis=1)  # the oldest position out, ``prev`` in
                for old, own in zip(kv, rows) for m, n in ((old.k, own.k), (old.v, own.v))]
        mem_mask = tf.concat([mem_mask[:, 1:], tf.ones([bsz, 1], tf.int32)], axis=1)
        out = tf.where(tf.equal(columns, step), new[:, None], out)
        return (step + 1, cur, new, finished, out, mem_mask, *mems)

    state = (tf.constant(1), input_ids[:, -1], first, finished, out, mem_mask, *mems)
    return tf.while_loop(cond, body, state)[4]


class _Interrupted(Exception):
    """Raised in the loop's report to end a generation on Ctrl-C."""


class Generator:
    """Compiled generation for one model: ``Generator(model)(input_ids, padding_mask, options)`` -> int32
    [b, max_new_tokens] numpy. One ``tf.function`` trace for greedy and one for sampling: prompts' shapes and
    every other option are tensors of the trace. ``progress_every``: log how far a generation is (new tokens,
    tokens per second, time left) at most every this many seconds (``inf``: never); with it, Ctrl-C also stops the
    compiled loop (the loop runs in TensorFlow's threads, where Python sees no signal: the report, called every
    ``REPORT_STEPS`` tokens, reads SIGINT from ``signal.set_wakeup_fd`` and ends the loop; the main thread then
    raises KeyboardInterrupt). None: neither (the library's default)."""

    def __init__(self, model, progress_every: Optional[float] = None):
        if model.config.bi_data:
            raise ValueError("generation needs bi_data=False (a pretraining option: load the model with "
                             "bi_data=False)")
        self.model = model
        self.progress_every = progress_every
        self._functions = {}
        self._run = dict(first=None, shown=0.0, total=0, batch=(1, 1), wakeup=None)

    def _report(self, step) -> np.int32:
        """Called from the loop every ``REPORT_STEPS`` new tokens: a progress line at most every
        ``progress_every`` seconds."""
        now, run, step = time.time(), self._run, int(step)
        if run["wakeup"] is not None:
            try:
                signals = os.read(run["wakeup"], 64)
            except BlockingIOError:
                signals = b""
            if bytes([signal.SIGINT]) in signals:  # Ctrl-C: Python raises its KeyboardInterrupt once the loop ends
                raise _Interrupted("generation interrupted")
        if run["first"] is None:  # the rate counts from here: the trace and the prompt's pass are behind
            run["first"] = (now, step)
        elif now - run["shown"] >= self.progress_every:
            run["shown"] = now
            rate = (step - run["first"][1]) / max(now - run["first"][0], 1e-9)
            left = time.strftime("%H:%M:%S", time.gmtime((run["total"] - step) / max(rate, 1e-9)))
            batch = "" if run["batch"][1] == 1 else f" of batch {run['batch'][0]}/{run['batch'][1]}"
            log.info("generating: %d/%d new tokens%s, %.1f tokens/s, about %s left in this batch", step,
                     run["total"], batch, rate, left)
        return np.int32(0)

    def function(self, do_sample: bool):
        if do_sample not in self._functions:
            spec = tf.TensorSpec([None, None], tf.int32)
            report = self._report if self.progress_every is not None else None

            @tf.function(input_signature=[spec, spec, CONTROL_SPECS], autograph=False)
            def run(input_ids, padding_mask, c):
                return generate_graph(self.model, input_ids, padding_mask, do_sample, c, report)

            self._functions[do_sample] = run
        return self._functions[do_sample]

    def __call__(self, input_ids, padding_mask=None, options: Optional[GenerationOptions] = None) -> np.ndarray:
        options = options or GenerationOptions()
        input_ids = np.asarray(input_ids, np.int32)
        if padding_mask is None:
            padding_mask = np.ones_like(input_ids)
        padding_mask = np.asarray(padding_mask, np.int32)
        if input_ids.ndim != 2 or input_ids.shape != padding_mask.shape or input_ids.shape[1] == 0:
            raise ValueError(f"input_ids and padding_mask: expected the same shape [batch, length >= 1], got "
                             f"{input_ids.shape} and {padding_mask.shape}")
        if not padding_mask[:, -1].all():
            raise ValueError("padding_mask: prompts must be left-padded (every row's last position real)")
        self._run.update(first=None, shown=time.time(), total=options.max_new_tokens)
        with self._signals() as interrupted:
            try:
                out = self.function(options.do_sample)(input_ids, padding_mask, controls(options)).numpy()
            except tf.errors.OpError as e:
                if "generation interrupted" not in str(e):
                    raise
                out = None
        if interrupted or out is None:
            raise KeyboardInterrupt
        return out

    @contextlib.contextmanager
    def _signals(self):
        """While the loop runs (with a report, in the main thread): SIGINT is noted (the list yielded gets an
        item) instead of raised (a KeyboardInterrupt pending while TensorFlow's error unwinds would garble it), and
        also written to a pipe the report reads (``signal.set_wakeup_fd``), which ends the loop."""
        noted: list = []
        if self.progress_every is None or threading.current_thread() is not threading.main_thread():
            yield noted
            return
        read, write = os.pipe()
        os.set_blocking(read, False)
        os.set_blocking(write, False)
        handler = signal.signal(signal.SIGINT, lambda signum, frame: noted.append(signum))
        previous = signal.set_wakeup_fd(write)
        self._run["wakeup"] = read
        try:
            yield noted
        finally:
            signal.set_wakeup_fd(previous)
            signal.signal(signal.SIGINT, handler)
            self._run["wakeup"] = None
            os.close(read)
            os.close(write)

    def generate(self, prompts: Sequence[Sequence[int]], options: Optional[GenerationOptions] = None,
                 batch_size: int = BATCH_SIZE):
        """Id lists of any lengths -> one list of new ids per prompt (cut after eos), ``batch_size`` at a time."""
        options = options or GenerationOptions()
        results = []
        for start in range(0, len(prompts), batch_size):
            self._run["batch"] = (start // batch_size + 1, -(-len(prompts) // batch_size))
            ids, mask = left_pad(prompts[start:start + batch_size], options.pad_id)
            for row in self(ids, mask, options):
                row = [int(t) for t in row]
                if options.eos_id is not None and options.eos_id in row:
                    row = row[:row.index(options.eos_id) + 1]
                results.append(row)
        return results


# ---------------------------------------------------------------------------------------------- SavedModel
class GenerationModule(tf.Module):
    """A SavedModel over raw text (needs only tensorflow + tensorflow_text to serve):

    * ``generate(text)``: tf.string [b] -> ``text`` tf.string [b] (the continuations, special pieces dropped) and
      ``ids`` int32 [b, max_new_tokens]; greedy.
    * ``sample(text, seed, temperature, top_k, top_p)``: the same, sampled.

    Prompts are tokenised in-graph (``TFXLNetTokenizer``, the ids of ``XLNetTokenizer.encode``), their last
    ``max_prompt_length`` pieces kept, left-padded to a multiple of 8; an empty prompt is read as one ``<eod>``
    (the start of a document). The ``options`` (``max_new_tokens``, eos/pad, ``mem_len``) and
    ``max_prompt_length`` are fixed at export: ``serving_info.json`` records them under ``generation``
    (``extra_serving_info``).
    """

    def __init__(self, model, spiece_model_file: str, options: GenerationOptions, lower: bool = False,
                 max_prompt_length: int = MAX_PROMPT_LENGTH):
        super().__init__(name="xlnet_generation")

        python_tokenizer = XLNetTokenizer(spiece_model_file, lower=lower)
        self.model = model
        self.tokenizer = python_tokenizer.tf_tokenizer()
        self.eod_id = python_tokenizer.eod_id
        self.options = options
        self.max_prompt_length = int(max_prompt_length)

    def extra_serving_info(self) -> dict:
        """What ``serving_info.json`` records besides the precision: the options the signatures cannot change."""
        o = self.options
        return {"generation": {"max_new_tokens": o.max_new_tokens, "eos_id": o.eos_id, "pad_id": o.pad_id,
                               "mem_len": o.mem_len, "max_prompt_length": self.max_prompt_length,
                               "fixed_at_export": True}}

    def _run(self, text, do_sample: bool, c: dict):
        rows = keep_last(self.tokenizer.tokenize(text), self.max_prompt_length)
        empty = tf.cast(tf.equal(rows.row_lengths(), 0), tf.int64)  # such rows get one <eod>
        eod = tf.RaggedTensor.from_row_lengths(tf.fill([tf.reduce_sum(empty)], self.eod_id), empty)
        rows = tf.concat([tf.cast(eod, rows.dtype), rows], axis=1)
        length = batch_length(rows, self.max_prompt_length)
        ids = pad_rows(rows, length, self.options.pad_id, left=True)
        mask = pad_rows(tf.ones_like(rows), length, 0, left=True)
        new = generate_graph(self.model, ids, mask, do_sample, c)
        return {"text": self.tokenizer.detokenize(new), "ids": new}

    def signatures(self):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="text")], autograph=False)
        def generate(text):
            return self._run(text, False, controls(self.options))

        sampled = ("seed", "temperature", "top_k", "top_p")

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="text")]
                     + [CONTROL_SPECS[k] for k in sampled], autograph=False)
        def sample(text, seed, temperature, top_k, top_p):
            c = dict(controls(self.options), seed=seed, temperature=temperature, top_k=top_k, top_p=top_p)
            return self._run(text, True, c)

        self.generate, self.sample = generate, sample
        return {"generate": generate, "sample": sample}


def export_generator(model, spiece_model_file: str, export_dir: str, options: GenerationOptions,
                     lower: bool = False, max_prompt_length: int = MAX_PROMPT_LENGTH) -> str:
    """Writes the ``GenerationModule`` SavedModel atomically (``export.save_atomically``)."""
    Generator(model)  # the same checks as in-process generation
    module = GenerationModule(model, spiece_model_file, options, lower=lower, max_prompt_length=max_prompt_length)
    save_atomically(module, export_dir, module.signatures())
    logging.getLogger(__name__).info(
        "%s generates %d new tokens per prompt (eos %s) from the last %d pieces of a prompt: fixed at export, "
        "recorded in serving_info.json", export_dir, options.max_new_tokens, options.eos_id, max_prompt_length)
    return export_dir
