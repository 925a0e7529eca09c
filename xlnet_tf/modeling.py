"""XLNetModel: the subclassed Keras backbone (content stream, optional query stream, memory, LM logits)."""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Dict, List, Optional, Sequence

import keras
import numpy as np
import tensorflow as tf

from xlnet_tf import checkpoint, path_choice, presets
from xlnet_tf.attention import KeyValueMemory, LayerInputs
from xlnet_tf.block import XLNetBlock
from xlnet_tf.config import XLNetConfig
from xlnet_tf.encodings import PositionalBasis, RelativePositionalEncoding
from xlnet_tf.masks import attention_masks, segment_diff
from xlnet_tf.ops import normal_init


# Keras' default SavedModel signature (``keras.Model._default_save_signature``, a ``tf.function`` over the whole
# model): TensorFlow's saver finds it on every Keras model it walks, traces it (with AutoGraph) and saves it, also
# when the model is saved inside another object with signatures of its own. Our exports give their own
# (``export.save_atomically``, inside ``own_signatures()``): there the models offer none, one trace of the model
# less per export, never called, ~9% of a small classifier's SavedModel graph (PERFORMANCE.md "Test suite"). A
# user's own ``tf.saved_model.save(model, path)`` keeps Keras' signature.
_own_signatures = False


@contextlib.contextmanager
def own_signatures():
    """Inside, the models below offer TensorFlow's saver no Keras default signature."""
    global _own_signatures
    old, _own_signatures = _own_signatures, True
    try:
        yield
    finally:
        _own_signatures = old


class _SignatureOnlyOutsideExports:
    @property
    def _default_save_signature(self):
        return None if _own_signatures else getattr(super(), "_default_save_signature", None)


class WrapsBackbone(_SignatureOnlyOutsideExports):
    """For models holding an ``XLNetModel`` as ``self.backbone`` (TaskModel, PretrainModel)."""

    @property
    def config(self) -> XLNetConfig:
        return self.backbone.config

    @property
    def n_layer(self) -> int:
        return self.backbone.n_layer

    def variable_depth(self, variable) -> int:
        """The backbone's depths; every other variable (the head) is n_layer + 1."""
        try:
            return self.backbone.variable_depth(variable)
        except KeyError:
            return self.n_layer + 1


class XLNetModel(_SignatureOnlyOutsideExports, keras.Model):
    """XLNet backbone.

    ``model(input_ids, segment_ids=None, padding_mask=None, mems=None, perm_mask=None, target_mapping=None,
    training=False)`` returns a dict with ``sequence_output`` [b, q, d] (content stream), ``query_output``
    [b, num_predict, d] when ``target_mapping`` is given, and ``new_mems`` (list of n_layer [b, mem_len, d])
    when ``config.mem_len > 0`` (``mem_padding_mask`` [b, mlen], 1 = real, hides padded memory positions: see
    ``masks.py``; ``mems`` may also be each layer's ``attention.KeyValueMemory``, generation's cache, which its
    owner keeps: no ``new_mems`` then, but ``own_kv``, each layer's keys and values of the call's positions, the
    cache's next rows); with ``output_hidden_states=True`` also ``hidden_states``: the content stream
    entering block 0 (the embeddings) and leaving each block, n_layer + 1 tensors [b, q, d] (before the output
    dropout). Mask conventions: see ``xlnet_tf/masks.py``. The run option ``config.accelerate`` names the speed
    paths; ``path_choice.choose`` hands in, once per call, what applies (``xlnet_tf/paths.py``).
    """

    def __init__(self, config: XLNetConfig, seed: int = 0, name: str = "xlnet", **kwargs):
        super().__init__(name=name, **kwargs)
        if isinstance(config, dict):
            config = XLNetConfig.from_dict(config)
        self.config = config
        c = config
        self.word_embedding = self.add_weight(name="lookup_table", shape=(c.n_token, c.d_model),
                                              initializer=normal_init(c.initializer_range))
        self.mask_emb = self.add_weight(name="mask_emb", shape=(1, 1, c.d_model),
                                        initializer=keras.initializers.GlorotUniform())
        self.lm_bias = self.add_weight(name="lm_bias", shape=(c.n_token,), initializer="zeros")
        shared = None
        if not c.untie_r:
            shared = {n: self.add_weight(name=n, shape=(c.n_head, c.d_head),
                                         initializer=normal_init(c.initializer_range))
                      for n in ("r_w_bias", "r_r_bias", "r_s_bias")}
        self.shared_biases = shared
        self.positional_encoding = RelativePositionalEncoding(config, dtype=self.dtype_policy)
        with keras.name_scope(self.name):
            self.blocks = [XLNetBlock(config, i, shared_biases=shared, dtype=self.dtype_policy)
                           for i in range(c.n_layer)]
        # tf.train.Checkpoint does not see layers inside Keras-tracked lists: name each block too.
        for i, block in enumerate(self.blocks):
            setattr(self, f"layer_{i}", block)
        # Dropout seed state [seed, counter]: a weight so checkpoints (and resumed runs) carry it.
        # ON_READ: each replica keeps its own counter, so advancing it needs no cross-replica merge (which is
        # not allowed inside the training loop's gradient-accumulation while_loop); replica 0's is saved.
        self.dropout_seed = keras.Variable(
            keras.initializers.Constant([int(seed), 0]), shape=(2,), dtype="int64", trainable=False,
            name="dropout_seed", aggregation="only_first_replica", synchronization="on_read")
        self.built = True

    # ------------------------------------------------------------------ helpers
    @property
    def n_layer(self) -> int:
        return self.config.n_layer

    def get_config(self):
        return {"config": self.config.to_dict(), "name": self.name}

    @classmethod
    def from_config(cls, cfg):
        return cls(XLNetConfig.from_dict(cfg["config"]), name=cfg.get("name", "xlnet"))

    def weight_roles(self):
        """(variable, role) for the backbone's own weights (the blocks declare theirs)."""
        shared = [(w, "attention_bias") for w in (self.shared_biases or {}).values()]
        return [(self.word_embedding, "embedding"), (self.mask_emb, "embedding"), (self.lm_bias, "bias")] + shared

    def variable_depth(self, variable) -> int:
        """0 = embeddings, l + 1 = block l, n_layer + 1 = LM bias (head-level); shared biases: top block."""
        if not hasattr(self, "_depths"):
            depths = {id(self.word_embedding): 0, id(self.mask_emb): 0, id(self.lm_bias): self.n_layer + 1}
            for v in (self.shared_biases or {}).values():
                depths[id(v)] = self.n_layer
            for i, block in enumerate(self.blocks):
                for v in block.weights:
                    depths.setdefault(id(v), i + 1)
            self._depths = depths
        key = id(variable)
        if key not in self._depths:
            raise KeyError(f"variable {getattr(variable, 'path', variable)} is not part of this backbone")
        return self._depths[key]

    def _next_seed(self) -> tf.Tensor:
        seed = tf.identity(self.dropout_seed.value)
        self.dropout_seed.assign_add(tf.constant([0, 1], tf.int64))
        ctx = tf.distribute.get_replica_context()
        if ctx is not None and ctx.num_replicas_in_sync > 1:  # each replica draws its own masks
            seed = tf.random.experimental.stateless_fold_in(seed, ctx.replica_id_in_sync_group)
        return seed

    def _cache_mem(self, curr, prev):
        c = self.config
        if c.reuse_len > 0:
            curr = curr[:, :c.reuse_len]
        new = curr if prev is None else tf.concat([tf.cast(prev, curr.dtype), curr], axis=1)
        return tf.stop_gradient(new[:, -c.mem_len:])

    # ------------------------------------------------------------------ forward
    def __call__(self, *args, **kwargs):
        """Keras' call, its token inputs checked first (``_check_inputs``), so a wrong one is one line."""
        named = dict(zip(("input_ids", "segment_ids", "padding_mask"), args), **kwargs)
        _check_inputs(named.get("input_ids"), named.get("segment_ids"), named.get("padding_mask"),
                      self.config.n_token)
        return super().__call__(*args, **kwargs)

    def call(self, input_ids, segment_ids=None, padding_mask=None, mems: Optional[Sequence] = None,
             perm_mask=None, target_mapping=None, training=False,
             output_hidden_states: bool = False, mem_padding_mask=None,
             mask_emb_positions=None, positions: Optional[PositionalBasis] = None,
             last_position_only: bool = False) -> Dict[str, object]:
        """``mask_emb_positions`` [b, L] (1 = the content stream reads ``mask_emb`` there instead of the word
        embedding): the masked-LM objective's masked inputs; the query stream always starts from ``mask_emb``.
        ``positions``: this call's relative positions with every block's tables already projected
        (``projected_positions`` of the same query and key lengths; no dropout on them): what a loop of steps
        of one shape computes once (generation); None: computed here. ``last_position_only``: ``sequence_output``
        is the last position's alone, [b, 1, d], and the last block computes only it (its queries, output
        projection and feed-forward on one row; its keys and values over every position): the same numbers as
        the whole output's last row, for a head that reads only the ``<cls>`` at the end (summary "last"), ~1/n_layer
        of the call's matmuls fewer (dropout in training draws the row's masks on its own shape)."""
        c = self.config
        if last_position_only and (target_mapping is not None or output_hidden_states):
            raise ValueError("last_position_only: not with target_mapping (the query stream) or "
                             "output_hidden_states (every position's states are asked for)")
        input_ids = tf.cast(input_ids, tf.int32)
        shape = tf.shape(input_ids)
        bsz, qlen = shape[0], shape[1]
        if mems is not None and len(mems) == 0:
            mems = None
        if mems is not None and len(mems) != c.n_layer:
            raise ValueError(f"mems: expected a list of {c.n_layer} tensors (one per layer), got {len(mems)}")
        projected = mems is not None and isinstance(mems[0], KeyValueMemory)  # generation's cache
        mlen = tf.shape(mems[0].k if projected else mems[0])[1] if mems is not None else 0
        klen = mlen + qlen
        training = bool(training)
        seed = self._next_seed() if training and (c.dropout > 0 or c.dropatt > 0) else None
        if c.bi_data:
            tf.debugging.assert_equal(bsz % 2, 0, message="bi_data needs an even batch size")

        dtype = self.compute_dtype
        pos_dropout = seed is not None and c.dropout > 0
        chosen = path_choice.choose(c, dtype, training, pos_dropout and c.pos_dropout == "per_example")
        query_blocked, content_blocked = attention_masks(qlen, mlen, bsz, padding_mask, perm_mask,
                                                         c.attn_type, c.same_length,
                                                         mem_padding_mask if mems is not None else None)
        if target_mapping is not None:
            target_mapping = tf.cast(target_mapping, dtype)
        if positions is not None and pos_dropout:
            raise ValueError("positions: precomputed positions carry no dropout (call with training=False)")
        inputs = LayerInputs(
            pos_emb=positions if positions is not None else self.positional_encoding(qlen, klen, bsz, seed=seed,
                                                                                     ops=chosen.ops),
            ef_diff=segment_diff(segment_ids, mlen) if segment_ids is not None else None,
            content_blocked=content_blocked, query_blocked=query_blocked, target_mapping=target_mapping,
            seed=seed, training=training, paths=chosen)

        h = tf.gather(tf.cast(self.word_embedding, dtype), input_ids)
        if mask_emb_positions is not None:
            h = tf.where(tf.cast(mask_emb_positions, tf.bool)[..., None], tf.cast(self.mask_emb, dtype), h)
        h = chosen.ops.dropout(h, c.dropout, seed, 1)
        g = None
        if target_mapping is not None:
            num_predict = tf.shape(target_mapping)[1]
            g = tf.tile(tf.cast(self.mask_emb, dtype), tf.stack([bsz, num_predict, 1]))
            g = chosen.ops.dropout(g, c.dropout, seed, 2)

        h, g, hidden, new_mems, own_kv = self._blocks(h, g, mems, inputs, projected, training, last_position_only)
        out = {"sequence_output": chosen.ops.dropout(h, c.dropout, seed, 4)}
        if output_hidden_states:
            out["hidden_states"] = hidden
        if g is not None:
            out["query_output"] = chosen.ops.dropout(g, c.dropout, seed, 5)
        if c.mem_len > 0 and not projected:
            out["new_mems"] = new_mems
        if projected:
            out["own_kv"] = own_kv
        return out

    def _blocks(self, h, g, mems, inputs: LayerInputs, projected: bool, training: bool, last_position_only: bool):
        """The blocks in turn -> (h, g, the content stream entering and leaving each block, the next memory,
        each block's keys and values of the call's positions with a projected memory)."""
        c = self.config
        new_mems: List[tf.Tensor] = []
        hidden, own_kv = [h], []
        for i, block in enumerate(self.blocks):
            mem = mems[i] if mems is not None else None
            if projected:  # this call's keys and values, projected once: the block's and the caller's
                mem = mem._replace(own=block.rel_attn.memory_kv(h))
                own_kv.append(mem.own)
            if c.mem_len > 0 and not projected:
                new_mems.append(self._cache_mem(h, mem))
            block_inputs = inputs.for_block(i)
            if last_position_only and i == c.n_layer - 1:
                block_inputs = dataclasses.replace(block_inputs, last_query=True)
            if c.recompute and training:
                h, g = self._recomputed(block, h, g, mem, block_inputs)
            else:
                h, g = block(h, g, mem, inputs=block_inputs)
            hidden.append(h)
        return h, g, hidden, new_mems, own_kv

    @staticmethod
    def _recomputed(block, h, g, mem, inputs):
        """``block`` with its activations recomputed in the backward pass; dropout is stateless, so the replay
        is exact."""
        if g is None:
            return tf.recompute_grad(lambda h_: block(h_, None, mem, inputs=inputs)[0])(h), None
        return tuple(tf.recompute_grad(lambda h_, g_: block(h_, g_, mem, inputs=inputs))(h, g))

    def projected_positions(self, qlen, klen) -> PositionalBasis:
        """The relative positions of a call of ``qlen`` queries over ``klen`` keys (memory + queries), without
        dropout, with every block's projected tables (``PositionalBasis.projected``): pass them as ``positions``
        to each of a loop's calls of that shape, so the loop multiplies the tables once."""
        basis = self.positional_encoding(*(tf.convert_to_tensor(n, tf.int32) for n in (qlen, klen, 1)))
        return basis._replace(projected=tuple(b.rel_attn.positional_tables(basis, self.compute_dtype)
                                              for b in self.blocks))

    def position_tables(self, max_len: int):
        """Every block's projected positional tables (``PositionalBasis.projected``) for the distances of a call of
        up to ``max_len`` positions without memory, |d| = 0 .. max_len: what a serving export computes once
        (``positions_from_tables`` picks a request's rows), instead of two matmuls per block per request."""
        return self.projected_positions(max_len, max_len).projected

    def positions_from_tables(self, tables, qlen, klen) -> PositionalBasis:
        """The ``positions`` of a call of ``qlen`` queries over ``klen`` keys (``klen`` <= the tables' max_len)
        from ``position_tables``: the rows |d| = 0 .. max |d| of each block's tables."""
        basis = self.positional_encoding(*(tf.convert_to_tensor(n, tf.int32) for n in (qlen, klen, 1)))
        rows = tf.shape(basis.sin)[0]
        return basis._replace(projected=tuple((tf.slice(s, [0, 0], tf.stack([rows, -1])),
                                               tf.slice(c, [0, 0], tf.stack([rows, -1]))) for s, c in tables))

    def lm_logits(self, hidden) -> tf.Tensor:
        """[..., d_model] -> [..., n_token] float32: tied to the word embedding plus the checkpoint's lm bias.

        ``tensordot`` (one 2-D matmul), not ``einsum("...d,vd->...v")``: TF's gradient of that ellipsis einsum
        w.r.t. the embedding runs ~60x slower on CPU (1.0 s vs 0.017 s for [16, 11, 128] x [8000, 128]).
        """
        hidden = tf.cast(hidden, self.compute_dtype)
        logits = tf.tensordot(hidden, tf.cast(self.word_embedding, self.compute_dtype), [[-1], [1]])
        return tf.cast(logits, tf.float32) + tf.cast(self.lm_bias, tf.float32)

    # ------------------------------------------------------------------ checkpoints
    @classmethod
    def from_pretrained(cls, name_or_path: str, config: Optional[XLNetConfig] = None, *, revision=None, token=None,
                        cache_dir=None, local_files_only=None, **overrides) -> "XLNetModel":
        """Loads an original TF1 checkpoint, a HuggingFace directory or our own format (see checkpoint.py), from a
        path or a model name (``xlnet/xlnet-base-cased``, ``xlnet_cased_L-12_H-768_A-12``: ``xlnet_tf.presets``,
        which takes ``revision``, ``token``, ``cache_dir`` and ``local_files_only``)."""
        path = presets.resolve(name_or_path, revision=revision, token=token, cache_dir=cache_dir,
                               local_files_only=local_files_only)
        return checkpoint.load_pretrained(cls, path, config=config, **overrides)

    def save_pretrained(self, directory: str, format: str = "own", tokenizer=None) -> None:
        """Our format (``"own"``), or ``"huggingface"``: config.json + model.safetensors for transformers'
        ``XLNetLMHeadModel`` / ``XLNetModel`` (see checkpoint.py); ``tokenizer`` (an ``XLNetTokenizer``): its
        ``spiece.model`` and, in the HF format, transformers' tokenizer files beside the weights."""
        checkpoint.save_pretrained(self, directory, format=format, tokenizer=tokenizer)


def _check_inputs(input_ids, segment_ids, padding_mask, n_token: int) -> None:
    """The call's token inputs, refused in one line naming the argument: ids that are text, ids not of rank 2, the
    segments and the padding mask of another shape than the ids (what is known when a graph is traced: nothing
    added to it); called eagerly, also ids that are not integers or not in [0, n_token) (Keras' own traces, an
    export's signature, may hand in float specs)."""
    if isinstance(input_ids, (str, bytes)) or (isinstance(input_ids, (list, tuple)) and input_ids
                                               and isinstance(input_ids[0], (str, bytes))):
        raise TypeError("input_ids: token ids are expected, got text (XLNetTokenizer.encode gives the ids; the task "
                        "models in xlnet_tf.tasks read text)")
    shape = tf.TensorShape(getattr(input_ids, "shape", None))
    if shape.rank is not None and shape.rank != 2:
        raise ValueError(f"input_ids: [batch, length] token ids are expected, got shape {shape.as_list()}")
    for name, other in (("segment_ids", segment_ids), ("padding_mask", padding_mask)):
        if other is not None and not tf.TensorShape(getattr(other, "shape", None)).is_compatible_with(shape):
            raise ValueError(f"{name}: the shape of input_ids {shape.as_list()} is expected, got "
                             f"{tf.TensorShape(other.shape).as_list()}")
    if not tf.executing_eagerly() or isinstance(input_ids, keras.KerasTensor) or not hasattr(input_ids, "dtype"):
        return
    if not tf.as_dtype(input_ids.dtype).is_integer:
        raise TypeError(f"input_ids: integer token ids are expected, got {tf.as_dtype(input_ids.dtype).name} "
                        f"(XLNetTokenizer.encode gives them)")
    ids = np.asarray(input_ids)
    bad = np.argwhere((ids < 0) | (ids >= n_token))
    if bad.size:
        where = tuple(int(i) for i in bad[0])
        raise ValueError(f"input_ids{list(where)}: {int(ids[where])} is not a token id of this model "
                         f"(0..{n_token - 1})")
