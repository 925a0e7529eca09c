"""Pretraining batches: the records of ``data/pretrain_records.py`` -> tf.data batches with permutation-LM (or
masked-LM) targets, the training loop's input.

Reading (``make_pretrain_dataset``): targets and permutations are sampled in the tf.data map, with
stateless random ops seeded by ``(seed, record index)`` (deterministic, and different at every epoch):

* Targets (``_span_targets``), separately in the reuse part and the rest with goals
  ``num_predict - num_predict*(L-R)//L`` and ``num_predict*(L-R)//L`` (the original's 43/42 of 85): spans of
  n = 1..``max_span`` **words** with p ∝ 1/n, each placed at a random offset inside a context of
  ``n * mask_alpha // mask_beta`` words, contexts following each other left to right; spans are kept while the
  running target count stays <= goal (the span that crosses the goal keeps its words that fit). The original
  counted n in pieces (its word test looked at the wrong index): we count words, the paper's intent. The
  remaining budget is filled with random whole words, shortest first (the original filled with random single
  pieces), so the goal is met exactly unless no word fits. SEP/CLS are never targets.
* Factorisation order (``_block_order``; the mask from it: ``local_perm_mask``): drawn independently in the
  reuse part and in the rest, in blocks of ``perm_size`` (blocks in order, a random order inside each block;
  the original used ONE within-block permutation for all blocks, here each block draws its own). Non-target non-functional tokens get order -1.
  ``perm_mask[i, j] = (self_order[i] <= order[j]) and (j is a target or SEP/CLS)``, self_order = order for
  targets, order + 1 otherwise; the reuse part never sees the rest, the rest sees all of the reuse part.
  So a target's query stream sees the non-targets and the targets/functional tokens earlier in the order (not
  itself); its content stream (perm_mask without the diagonal) also sees itself.

Masked LM (``objective="mlm"``, ``sample_mlm_features``): the same records, BERT's targets instead: 15% of
the pieces (never SEP/CLS) selected, 80% of them masked (the content stream reads ``mask_emb`` there:
``mask_emb_positions``), 10% replaced by a random piece, 10% kept; no ``perm_mask`` (full attention on the
content stream).

Batch features (BUILD.md): ``input_ids``, ``segment_ids`` [L] int32; ``perm_mask`` [L, L] float32
(1 = may NOT attend); ``target_mapping`` [P, L] float32 one-hot rows (zero rows for padding); ``target`` [P]
int32 (the ids at the target positions); ``target_mask`` [P] float32; ``input_q`` [L] float32 (1 = target: its
query stream starts from mask_emb; the content stream always gets the real ids, as the original).
"""

from __future__ import annotations

import glob
import os
from typing import Dict, Optional

from xlnet_tf.data import tfrecord_io
from xlnet_tf.data.pretrain_records import pretrain_record_spec

def _split_goal(num_predict: int, seq_len: int, reuse_len: int):
    rest = num_predict * (seq_len - reuse_len) // seq_len
    return num_predict - rest, rest


def _span_targets(word_start, eligible, goal: int, seeds, mask_alpha, mask_beta, max_span: int,
                  fill: bool = True):
    """bool [m]: whole-word span targets of one part (module docstring), ``goal`` tokens when possible."""
    import tensorflow as tf

    m = int(word_start.shape[0])
    if m == 0 or goal <= 0:
        return tf.zeros([m], tf.bool)
    ws = tf.concat([[True], word_start[1:]], 0)
    wid = tf.cumsum(tf.cast(ws, tf.int32)) - 1                                   # word index of every token
    cnt = tf.math.unsorted_segment_sum(tf.cast(eligible, tf.int32), wid, m)     # eligible tokens per word
    # Spans in word units: length n ~ 1/n, inside a context of n*alpha/beta words, contexts back to back.
    logits = tf.math.log(1.0 / tf.range(1, max_span + 1, dtype=tf.float32))[None]
    n = tf.cast(tf.random.stateless_categorical(logits, m, seeds[0])[0], tf.int32) + 1
    ctx = tf.maximum(tf.cast(tf.floor(tf.cast(n, tf.float32) * (mask_alpha / mask_beta)), tf.int32), n)
    left = tf.cast(tf.floor(tf.random.stateless_uniform([m], seeds[1]) * tf.cast(ctx - n + 1, tf.float32)),
                   tf.int32)
    start = tf.cumsum(ctx, exclusive=True) + left
    ones = tf.ones([m], tf.int32)
    delta = (tf.math.unsorted_segment_sum(ones, tf.minimum(start, m), m + 1)
             - tf.math.unsorted_segment_sum(ones, tf.minimum(start + n, m), m + 1))
    covered = tf.cumsum(delta)[:m] > 0
    keep = covered & (cnt > 0) & (tf.cumsum(tf.where(covered, cnt, 0)) <= goal)
    if not fill:
        return tf.gather(keep, wid) & eligible
    # Fill the remaining budget with random whole words, shortest first.
    rem = goal - tf.reduce_sum(tf.where(keep, cnt, 0))
    cand = tf.logical_not(keep) & (cnt > 0)
    key = tf.where(cand, tf.cast(cnt, tf.float32) + tf.random.stateless_uniform([m], seeds[2]), float(m + 2))
    order = tf.argsort(key, stable=True)
    c_sorted = tf.gather(tf.where(cand, cnt, 0), order)
    take = tf.gather(cand, order) & (tf.cumsum(c_sorted) <= rem)
    fill = tf.scatter_nd(order[:, None], tf.cast(take, tf.int32), [m]) > 0
    return tf.gather(keep | fill, wid) & eligible


def _block_order(m: int, perm_size: int, seed):
    """int32 [m]: the rank of every position in a factorisation order drawn in blocks of ``perm_size``."""
    import tensorflow as tf

    block = tf.cast(tf.range(m) // perm_size, tf.float32)
    keys = block + tf.random.stateless_uniform([m], seed)
    return tf.math.invert_permutation(tf.argsort(keys, stable=True))


def local_perm_mask(is_target, is_func, order):
    """float32 [m, m] perm_mask of one part (1 = i may NOT attend j), from a rank ``order`` [m]."""
    import tensorflow as tf

    tgt_or_func = is_target | is_func
    rev = tf.where(tgt_or_func, order, -1)
    self_rev = tf.where(is_target, rev, rev + 1)
    blocked = (self_rev[:, None] <= rev[None, :]) & tgt_or_func[None, :]
    return tf.cast(blocked, tf.float32)


def sample_pretrain_features(input_ids, segment_ids, word_start, seed, *, reuse_len: int, num_predict: int,
                             perm_size: Optional[int] = None, mask_alpha: float = 6, mask_beta: float = 1,
                             max_span: int = 5, sep_id: int = 4, cls_id: int = 3,
                             return_order: bool = False) -> Dict[str, object]:
    """One raw sequence [L] -> the pretraining features (module docstring); ``seed``: int [2] (stateless).

    ``perm_size`` None = each part's full length. ``return_order`` adds ``perm_order`` [L] (rank inside its
    part; -1 for visible tokens) for tests/inspection.
    """
    import tensorflow as tf

    if mask_alpha < mask_beta:
        raise ValueError(f"mask_alpha ({mask_alpha}) must be >= mask_beta ({mask_beta})")
    seq_len = int(input_ids.shape[0])
    input_ids = tf.cast(input_ids, tf.int32)
    is_func = tf.equal(input_ids, sep_id) | tf.equal(input_ids, cls_id)
    after_func = tf.concat([[False], is_func[:-1]], 0)
    ws = tf.cast(word_start, tf.bool) | is_func | after_func
    seeds = tf.random.experimental.stateless_split(tf.cast(seed, tf.int64), num=8)
    goals = _split_goal(num_predict, seq_len, reuse_len)
    targets, masks, orders = [], [], []
    for part, (lo, hi) in enumerate(((0, reuse_len), (reuse_len, seq_len))):
        m = hi - lo
        if m == 0:
            continue
        tgt = _span_targets(ws[lo:hi], tf.logical_not(is_func[lo:hi]), goals[part], seeds[4 * part:4 * part + 3],
                            mask_alpha, mask_beta, max_span)
        order = _block_order(m, perm_size or m, seeds[4 * part + 3])
        targets.append(tgt)
        masks.append(local_perm_mask(tgt, is_func[lo:hi], order))
        orders.append(tf.where(tgt | is_func[lo:hi], order, -1))
    if len(masks) == 2:
        r, n = reuse_len, seq_len - reuse_len
        perm_mask = tf.concat([tf.concat([masks[0], tf.ones([r, n])], 1),
                               tf.concat([tf.zeros([n, r]), masks[1]], 1)], 0)
    else:
        perm_mask = masks[0]
    is_target = tf.concat(targets, 0)
    idx = tf.cast(tf.where(is_target)[:, 0], tf.int32)
    count = tf.shape(idx)[0]
    out = {
        "input_ids": input_ids,
        "segment_ids": tf.cast(segment_ids, tf.int32),
        "perm_mask": tf.ensure_shape(perm_mask, [seq_len, seq_len]),
        **_target_features(input_ids, idx, count, num_predict, seq_len),
        "input_q": tf.cast(is_target, tf.float32),
    }
    if return_order:
        out["perm_order"] = tf.concat(orders, 0)
    return out


MLM_MASK_PROB = 0.15
NUM_SPECIAL_PIECES = 9  # <unk> <s> </s> <cls> <sep> <pad> <mask> <eod> <eop>: never drawn as random replacements


def mlm_num_predict(seq_len: int, mask_prob: float = MLM_MASK_PROB) -> int:
    return max(1, int(round(seq_len * mask_prob)))


def _target_features(input_ids, idx, count, num_predict: int, seq_len: int) -> Dict[str, object]:
    """The prediction targets at positions ``idx`` (``count`` of them, in order) padded to ``num_predict``:
    ``target_mapping`` [P, L] one-hot rows (zero rows for padding), ``target`` [P] (the original ids),
    ``target_mask`` [P] (1 = a real target)."""
    import tensorflow as tf

    pad = num_predict - count
    return {
        "target_mapping": tf.ensure_shape(
            tf.concat([tf.one_hot(idx, seq_len, dtype=tf.float32), tf.zeros([pad, seq_len])], 0),
            [num_predict, seq_len]),
        "target": tf.ensure_shape(tf.concat([tf.gather(input_ids, idx), tf.zeros([pad], tf.int32)], 0),
                                  [num_predict]),
        "target_mask": tf.ensure_shape(tf.concat([tf.ones([count]), tf.zeros([pad])], 0), [num_predict]),
    }


def sample_mlm_features(input_ids, segment_ids, seed, *, num_predict: int, vocab_size: int, mask_id: int = 6,
                        sep_id: int = 4, cls_id: int = 3, replace_probs=(0.8, 0.1, 0.1),
                        return_kind: bool = False) -> Dict[str, object]:
    """One raw sequence [L] -> BERT-style masked-LM features (content stream only); ``seed``: int [2].

    Selection: exactly ``min(num_predict, eligible)`` positions drawn uniformly without replacement among the
    non-SEP/CLS tokens (``num_predict`` = 15% of ``seq_len`` by default: ``mlm_num_predict``), single pieces as
    BERT's original recipe. Each selected input is masked (``replace_probs[0]``: id ``mask_id``, and
    ``mask_emb_positions`` [L] float32 is 1 there, so the content stream reads ``mask_emb`` instead of an
    embedding row), replaced by a random ordinary piece (ids >= ``NUM_SPECIAL_PIECES``, ``replace_probs[1]``)
    or kept (the rest). Features: ``input_ids`` (the corrupted input), ``mask_emb_positions``, ``segment_ids``, ``target_mapping`` [P, L] (selected positions in
    order), ``target`` [P] (the original ids), ``target_mask`` [P]. ``return_kind`` adds ``mlm_kind`` [L]
    int32: 0 not selected, 1 masked, 2 random, 3 kept.
    """
    import tensorflow as tf

    seq_len = int(input_ids.shape[0])
    input_ids = tf.cast(input_ids, tf.int32)
    eligible = tf.logical_not(tf.equal(input_ids, sep_id) | tf.equal(input_ids, cls_id))
    seeds = tf.random.experimental.stateless_split(tf.cast(seed, tf.int64), num=3)
    scores = tf.random.stateless_uniform([seq_len], seeds[0])
    scores = tf.where(eligible, scores, -1.0)
    count = tf.minimum(num_predict, tf.reduce_sum(tf.cast(eligible, tf.int32)))
    idx = tf.sort(tf.math.top_k(scores, k=num_predict).indices[:count])
    selected = tf.scatter_nd(idx[:, None], tf.ones_like(idx, tf.bool), [seq_len])
    u = tf.random.stateless_uniform([seq_len], seeds[1])
    p_mask, p_random = float(replace_probs[0]), float(replace_probs[0] + replace_probs[1])
    random_ids = tf.random.stateless_uniform([seq_len], seeds[2], minval=NUM_SPECIAL_PIECES, maxval=vocab_size,
                                             dtype=tf.int32)
    kind = tf.where(selected, tf.where(u < p_mask, 1, tf.where(u < p_random, 2, 3)), 0)
    corrupted = tf.where(kind == 1, mask_id, tf.where(kind == 2, random_ids, input_ids))
    out = {
        "input_ids": corrupted,
        "mask_emb_positions": tf.cast(kind == 1, tf.float32),
        "segment_ids": tf.cast(segment_ids, tf.int32),
        **_target_features(input_ids, idx, count, num_predict, seq_len),
    }
    if return_kind:
        out["mlm_kind"] = tf.cast(kind, tf.int32)
    return out


def _files_and_meta(files):
    if isinstance(files, str):
        files = sorted(glob.glob(files)) or [files]
    files = list(files)
    for p in files:
        if not os.path.isfile(p):
            raise FileNotFoundError(f"TFRecord file not found: {p}")
    metas = [(tfrecord_io.read_manifest(p) or {}).get("meta") for p in files]
    return files, metas


def make_pretrain_dataset(files, seq_len: int, reuse_len: int, batch_size: int, num_predict: Optional[int] = None,
                          perm_size: Optional[int] = None, mask_alpha: float = 6, mask_beta: float = 1,
                          bi_data: bool = False, seed: int = 0, repeat: bool = True, max_span: int = 5,
                          sep_id: int = 4, cls_id: int = 3, objective: str = "plm", vocab_size: Optional[int] = None,
                          mask_id: int = 6):
    """Pretraining TFRecords -> tf.data of per-replica batches (module docstring), in record order.

    ``files``: shard paths (read in the given order) or a glob (sorted). ``batch_size``: ``num_streams /
    num_groups`` of the files (per-replica batches) or ``num_streams`` (global batches), checked against the
    manifests, so that row b of every batch is the same stream. ``num_predict`` None =
    ``round(seq_len * mask_beta / mask_alpha)``.
    ``objective="mlm"``: BERT-style masked-LM features instead (``sample_mlm_features``; ``num_predict`` None =
    15% of ``seq_len``; ``vocab_size`` and ``mask_id`` required/used; the span and permutation settings unused).
    Batches are never shuffled; ``repeat`` restarts the streams after the last step.
    """
    import tensorflow as tf

    files, metas = _files_and_meta(files)
    for p, meta in zip(files, metas):
        if meta is None:
            continue
        want = {"seq_len": seq_len, "reuse_len": reuse_len, "bi_data": bool(bi_data)}
        got = {k: meta.get(k) for k in want}
        if got != want:
            raise ValueError(f"{p}: written with {got}, asked for {want}")
        group = meta["num_streams"] // meta["num_groups"]
        if meta["num_streams"] % batch_size or batch_size % group:
            raise ValueError(f"{p}: {meta['num_streams']} streams in {meta['num_groups']} group(s) need a batch "
                             f"of {group} (per replica) or a multiple of it dividing {meta['num_streams']}, "
                             f"got {batch_size}")
    if objective not in ("plm", "mlm"):
        raise ValueError(f"objective must be plm or mlm, got {objective!r}")
    if objective == "mlm" and not vocab_size:
        raise ValueError("objective mlm needs vocab_size (random replacements)")
    if num_predict is None:
        num_predict = (mlm_num_predict(seq_len) if objective == "mlm"
                       else int(round(seq_len * mask_beta / mask_alpha)))
    spec = tfrecord_io.parse_spec(pretrain_record_spec(seq_len))
    base_seed = tf.constant(seed, tf.int64)

    def _map(index, serialized):
        ex = tf.io.parse_single_example(serialized, spec)
        if objective == "mlm":
            return sample_mlm_features(ex["input_ids"], ex["segment_ids"], tf.stack([base_seed, index]),
                                       num_predict=num_predict, vocab_size=vocab_size, mask_id=mask_id,
                                       sep_id=sep_id, cls_id=cls_id)
        return sample_pretrain_features(
            ex["input_ids"], ex["segment_ids"], ex["word_start"], tf.stack([base_seed, index]),
            reuse_len=reuse_len, num_predict=num_predict, perm_size=perm_size, mask_alpha=mask_alpha,
            mask_beta=mask_beta, max_span=max_span, sep_id=sep_id, cls_id=cls_id)

    ds = tf.data.TFRecordDataset(files)
    if repeat:
        ds = ds.repeat()
    ds = ds.enumerate().map(tf.autograph.experimental.do_not_convert(_map), num_parallel_calls=tf.data.AUTOTUNE,
                            deterministic=True)
    return ds.batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


# ---------------------------------------------------------------------------------------------- the loop's input
def regroup_for_accumulation(ds: tf.data.Dataset, num_replicas: int, grad_accum_steps: int) -> tf.data.Dataset:
    """Reorders per-replica batches so that memory rows stay aligned with gradient accumulation.

    ``make_pretrain_dataset`` yields, per step s, one batch per replica: ``(s, g0), (s, g1), ...``. One pipeline of
    ``distribute_datasets_from_function`` hands successive elements to the local replicas in turn and the
    loop stacks ``k`` consecutive elements per replica, so each group of ``R*k`` batches is reordered to
    ``(s, g0), (s+1, g0), ..., (s+k-1, g0), (s, g1), ...``: replica r then gets its own streams at k
    consecutive steps, as its memory needs. Identity when ``R == 1`` or ``k == 1``.
    """
    import tensorflow as tf

    r, k = int(num_replicas), int(grad_accum_steps)
    if r == 1 or k == 1:
        return ds

    def reorder(batch):
        def one(x):
            shape = tf.shape(x)
            x = tf.reshape(x, tf.concat([[k, r], shape[1:]], 0))
            x = tf.transpose(x, tf.concat([[1, 0], tf.range(2, tf.rank(x))], 0))
            return tf.reshape(x, shape)

        return tf.nest.map_structure(one, batch)

    return ds.batch(r * k, drop_remainder=True).map(tf.autograph.experimental.do_not_convert(reorder)).unbatch()


def make_train_dataset_fn(files, seq_len: int, reuse_len: int, per_replica_batch: int, grad_accum_steps: int = 1,
                          **sampler):
    """``dataset_fn(input_context)`` for ``Trainer``: per-replica batches in stream order (never shuffled).

    ``sampler``: ``num_predict, perm_size, mask_alpha, mask_beta, bi_data, seed, max_span, sep_id, cls_id``
    (and ``objective, vocab_size, mask_id``) of ``make_pretrain_dataset``.
    """
    def dataset_fn(ctx: tf.distribute.InputContext):
        ds = make_pretrain_dataset(files, seq_len, reuse_len, per_replica_batch, repeat=True, **sampler)
        local = max(ctx.num_replicas_in_sync // max(ctx.num_input_pipelines, 1), 1)
        return regroup_for_accumulation(ds, local, grad_accum_steps)

    return dataset_fn
