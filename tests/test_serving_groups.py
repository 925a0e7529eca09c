"""Serving in length groups (``xlnet_tf.export.run_in_groups``): a request of mixed lengths runs group by group,
each group padded to its own longest, and gives the answers of the request padded as one batch, in its order.

Tiny random-init models, plain ops (no XLA compilation per shape); every served function is traced once per
module. A counting hook (``Counting``) sums the positions the model is given, so grouping that silently stopped
(one call padded to the longest) fails the tests.
"""

import numpy as np
import pytest

from tests.conftest import shared_path, tiny
from tests.subprocess_util import run_like_a_server

L = 32
SHAPE = tiny(n_layer=1, d_model=32, d_head=16, d_inner=64)
MIXED = ["", "Fine.", "A very long review that goes on and on about nothing at all. " * 8,
         "Dull and slow, the plot goes nowhere.", "Fine.", "An okay film with good actors and a thin story.", "x",
         "Dull and slow, the plot goes nowhere."]
TOL = 1e-6


@pytest.fixture(scope="module")
def tok():
    from xlnet_tf import XLNetTokenizer

    return XLNetTokenizer(shared_path("spiece", "spiece.model"))


def make_model(head_fn, features, mem_len=0):
    from xlnet_tf import XLNetConfig
    from xlnet_tf.task_model import TaskModel

    cfg = XLNetConfig(**SHAPE, dropout=0.0, dropatt=0.0, accelerate=False, mem_len=mem_len)
    model = TaskModel(cfg, head_fn(cfg), seed=1)
    model.build_with(features)
    return model


def counting(cls):
    """``cls`` whose model calls add the positions they are given to ``positions`` (a variable in the graph)."""
    import tensorflow as tf

    class Counting(cls):
        def __init__(self, *args, max_groups, **kw):
            super().__init__(*args, **kw)
            self.max_groups = max_groups
            self.positions = tf.Variable(0, dtype=tf.int64, trainable=False)

        def count(self, features):
            return self.positions.assign_add(tf.size(features["input_ids"], out_type=tf.int64))

        def _outputs(self, features):
            with tf.control_dependencies([self.count(features)]):
                return super()._outputs(features)

        def _head_outputs(self, features):
            with tf.control_dependencies([self.count(features)]):
                return super()._head_outputs(features)

        def served(self, fn, *args):
            """(fn(*args) as numpy, positions the model was given)."""
            self.positions.assign(0)
            out = fn(*args)
            return {k: v.numpy() for k, v in out.items()}, int(self.positions.numpy())

    return Counting


def assert_same(got, want):
    assert got.keys() == want.keys()
    for k in want:
        if want[k].dtype.kind == "f":
            np.testing.assert_allclose(got[k], want[k], atol=TOL, rtol=TOL, err_msg=k)  # (float32 sums of other
            # padded lengths and row counts: the embeddings, up to ~3, differ in their last bits)
        else:
            np.testing.assert_array_equal(got[k], want[k], err_msg=k)


def planned_positions(lengths, max_groups, unit=1, max_len=L, multiple=8):
    """The positions ``group_plan`` gives the model for rows of ``lengths``."""
    from xlnet_tf.export import GROUP_COST_TOKENS, group_plan

    plan = group_plan(np.asarray(lengths, np.int32), max_len, multiple, max_groups, GROUP_COST_TOKENS / unit)
    return int(np.sum(np.diff(plan["bounds"].numpy()) * plan["lengths"].numpy()))


@pytest.fixture(scope="module")
def classifier(tok):
    """``classifier(kind)`` -> {max_groups: (serving module, its traced and warmed-up function)} for kind
    "single", "pair" or "embed", over one model (each kind traced on first use)."""
    import tensorflow as tf

    from xlnet_tf.heads.classification import ClassificationHead
    from xlnet_tf.tasks.classification.serving import ClassifierServing

    model = make_model(lambda c: ClassificationHead(c.d_model, 3, n_head=c.n_head, d_head=c.d_head),
                       {k: np.zeros([1, 8], np.int32) for k in ("input_ids", "segment_ids", "padding_mask")})
    modules = {g: counting(ClassifierServing)(model, tok, L, label_names=["a", "b", "c"], max_groups=g)
               for g in (1, 4)}
    make = {"single": lambda sv: sv.text_fn(False), "pair": lambda sv: sv.text_fn(True),
            "embed": lambda sv: sv.embed_fn(False)}
    cache = {}

    def get(kind):
        if kind not in cache:
            cache[kind] = {g: (sv, make[kind](sv)) for g, sv in modules.items()}
            for _, fn in cache[kind].values():  # traced and run once here: the tests time only their calls
                fn(*[tf.constant(["warm up"])] * (2 if kind == "pair" else 1))
        return cache[kind]

    get("single")  # the fast tests' functions: built in the fixture
    return get


# ---------------------------------------------------------------------------------------------- the plan
def _best_padded_tokens(lengths, max_groups, cost, max_len=L, multiple=8):
    """Brute force: the cheapest split of the sorted rows into <= max_groups contiguous groups."""
    import itertools

    p = sorted(min(max_len, max(1, -(-n // multiple)) * multiple) for n in lengths)
    best = float("inf")
    for k in range(max_groups):
        for cuts in itertools.combinations(range(1, len(p)), k):
            b = (0,) + cuts + (len(p),)
            best = min(best, sum((b[i + 1] - b[i]) * p[b[i + 1] - 1] + cost for i in range(len(b) - 1)))
    return best


def test_group_plan_cuts_between_padded_lengths_at_least_cost():
    from xlnet_tf.export import group_plan

    def plan(lengths, **kw):
        return {k: v.numpy().tolist() for k, v in group_plan(np.asarray(lengths, np.int32), **kw).items()}

    lengths = [3, 40, 7, 9, 60, 3, 18, 128, 200]
    p = plan(lengths, max_len=128, group_cost=16.0)
    assert p["order"] == [0, 5, 2, 3, 6, 1, 4, 7, 8]                   # by length, stable
    assert p == dict(p, bounds=[0, 3, 5, 7, 9], lengths=[8, 24, 64, 128])  # 4 groups at most, 200 capped at 128
    assert plan(lengths, max_len=128, max_groups=9)["lengths"] == [8, 16, 24, 40, 64, 128]  # one per length
    assert plan([17], max_len=128) == {"order": [0], "bounds": [0, 1], "lengths": [24]}  # batch 1: the request
    assert plan([9, 10, 16, 12], max_len=128)["bounds"] == [0, 4]     # one padded length: one group
    assert plan([], max_len=128) == {"order": [], "bounds": [0, 0], "lengths": [8]}
    # a call is split off only when it saves more padded tokens than it costs
    assert plan([16, 24], max_len=128, group_cost=16.0)["lengths"] == [24]
    assert plan([16, 24], max_len=128, group_cost=0.0)["lengths"] == [16, 24]
    assert plan([8] * 31 + [16], max_len=128, group_cost=16.0)["lengths"] == [8, 16]
    assert plan([1, 2, 3], max_len=None, multiple=1)["lengths"] == [1, 2, 3]  # window counts (memory mode)
    rng = np.random.default_rng(0)
    for _ in range(12):  # the cheapest plan, against brute force
        lengths, groups, cost = rng.integers(0, 40, rng.integers(1, 9)).tolist(), int(rng.integers(1, 5)), 16.0
        p = plan(lengths, max_len=L, max_groups=groups, group_cost=cost)
        got = sum((b - a) * n + cost for a, b, n in zip(p["bounds"], p["bounds"][1:], p["lengths"]))
        assert got == _best_padded_tokens(lengths, groups, cost), (lengths, groups, p)


def test_the_groups_call_one_trace_of_the_model():
    """``run`` is traced once for every group's shape (an export traces the model once per grouped signature);
    each row's answer comes back in the request's order."""
    import tensorflow as tf

    from xlnet_tf.export import run_in_groups

    traces = []

    def run(features):
        traces.append(1)
        return {"tokens": tf.reduce_sum(features["x"], 1)}

    lengths = [3, 30, 7, 1, 16, 30, 9]  # left-padded rows of ones, to the longest (30): several groups
    x = np.array([[0] * (30 - n) + [1] * n for n in lengths], np.int32)
    grouped = tf.function(lambda x, n: run_in_groups(run, {"x": x}, n, max_len=L, max_groups=4), autograph=False)
    np.testing.assert_array_equal(grouped(tf.constant(x), tf.constant(lengths)).get("tokens"), lengths)
    assert len(traces) == 1


# ---------------------------------------------------------------------------------------------- classifier
@pytest.mark.slow  # (a few seconds: a traced model or real data read whole)
def test_mixed_lengths_give_the_one_batch_answers_in_order_with_fewer_positions(classifier, tok):
    import tensorflow as tf

    (one, f1), (grp, fg) = classifier("single").values()
    texts = tf.constant(MIXED)
    want, full = one.served(f1, texts)
    got, grouped = grp.served(fg, texts)
    assert_same(got, want)
    assert want["label_name"].tolist() == [b"abc"[i:i + 1] for i in want["label"]]
    np.testing.assert_array_equal(got["logits"][1], got["logits"][4])  # duplicates: the same answer
    lengths = [min(len(tok.encode(t)), L - 2) + 2 for t in MIXED]      # the long review is cut at L
    assert max(lengths) == L and full == len(MIXED) * L
    assert grouped == planned_positions(lengths, 4) <= 0.6 * full


@pytest.mark.slow  # (a few seconds: a traced model or real data read whole)
def test_batch_one_and_equal_lengths_are_one_call(classifier):
    import tensorflow as tf

    (one, f1), (grp, fg) = classifier("single").values()
    # one text runs at its own length (4 pieces, <sep>, <cls>: ClassifierServing.exact_single_row); more texts
    # are padded to their longest, rounded up to a multiple of 8
    for texts, per_text in ((["An okay film."], 6), (["Fine.", "Good.", "Bad!", "Fine."], 8)):
        want, full = one.served(f1, tf.constant(texts))
        got, grouped = grp.served(fg, tf.constant(texts))
        assert_same(got, want)
        assert grouped == full == len(texts) * per_text


@pytest.mark.slow  # (a few seconds: a traced model or real data read whole)
def test_classes_without_names_are_named_by_their_index(classifier, tok):
    """A serving module built without label names names each class by its index (every class, not just 0)."""
    import tensorflow as tf

    from xlnet_tf.tasks.classification.serving import ClassifierServing

    (one, _), _ = classifier("single").values()
    unnamed = ClassifierServing(one.model, tok, L)
    assert unnamed.label_names.numpy().tolist() == [b"0", b"1", b"2"]  # what _outputs gathers by label
    assert tf.gather(unnamed.label_names, [2, 0]).numpy().tolist() == [b"2", b"0"]


@pytest.mark.slow  # (traces four more served functions)
def test_pair_and_embed_signatures_are_grouped(classifier):
    import tensorflow as tf

    a, b = tf.constant(MIXED), tf.constant(MIXED[::-1][:3] + [""] * (len(MIXED) - 3))
    for name, args in (("pair", (a, b)), ("embed", (a,))):
        (one, f1), (grp, fg) = classifier(name).values()
        want, full = one.served(f1, *args)
        got, grouped = grp.served(fg, *args)
        assert_same(got, want)
        if name == "pair":  # (the embed function's encoder is not counted)
            assert grouped < full, (grouped, full)


@pytest.mark.slow  # (a memory model's served functions: seconds to trace)
def test_memory_mode_groups_documents_by_window_count(tok):
    import tensorflow as tf

    from xlnet_tf.heads.classification import ClassificationHead
    from xlnet_tf.tasks.classification import features as F
    from xlnet_tf.tasks.classification.serving import ClassifierServing

    docs = ["Fine.", "A long document that needs windows. " * 20, "Dull.", "Another one, a bit longer. " * 6, ""]
    model = make_model(lambda c: ClassificationHead(c.d_model, 2, n_head=c.n_head, d_head=c.d_head),
                       F.encode_documents(tok, docs[:2], L), mem_len=2 * L)
    runs = {}
    for groups in (1, 4):
        sv = counting(ClassifierServing)(model, tok, L, label_names=["neg", "pos"], memory=True,
                                        max_groups=groups)
        runs[groups] = sv.served(sv.text_fn(False), tf.constant(docs))
    windows = F.encode_documents(tok, docs, L)["num_segments"]
    assert windows.tolist() == [1, 5, 1, 2, 1]
    assert_same(runs[4][0], runs[1][0])
    assert runs[1][1] == len(docs) * 5 * L  # every document in 5 windows
    assert runs[4][1] == planned_positions(windows, 4, unit=L, max_len=None, multiple=1) * L == (3 + 2 + 5) * L


# ---------------------------------------------------------------------------------------------- RACE, SQuAD
@pytest.mark.slow  # (four served functions, SQuAD's in-graph alignment: seconds to trace)
def test_race_and_squad_answers_equal_the_one_batch_answers(tok):
    import tensorflow as tf

    from xlnet_tf.heads.multiple_choice import MultipleChoiceHead
    from xlnet_tf.heads.squad import SquadHead
    from xlnet_tf.tasks.race.serving import RaceServing
    from xlnet_tf.tasks.squad.serving import SquadServing

    z = lambda *shape: np.zeros(shape, np.int32)  # noqa: E731
    race = make_model(lambda c: MultipleChoiceHead(c.d_model, n_head=c.n_head, d_head=c.d_head, dropout=0.0),
                      {k: z(1, 4, 8) for k in ("input_ids", "segment_ids", "padding_mask")})
    squad = make_model(lambda c: SquadHead(c.d_model, dropout=0.0),
                       {"input_ids": z(1, 8), "segment_ids": z(1, 8), "padding_mask": z(1, 8) + 1,
                        "p_mask": z(1, 8), "cls_index": z(1) + 7})
    article = ["Tom went to the market. " * 6, "It rained.", "Tom went to the market. " * 6]
    question = ["Where did Tom go?", "What happened _ ?", "Where did Tom go?"]
    options = [["home", "to the market", "away", "nowhere"], ["sun", "rain", "snow", "wind"],
               ["home", "to the market", "away", "nowhere"]]
    asked = ["Where was it shot?", "What?", "Where?", "When?"]
    context = ["The film was shot in Paris in 1998 by a small crew. " * 4, "Short.", "It was shot in Paris.", "1998."]
    runs = {}
    for groups in (1, 4):
        rv = counting(RaceServing)(race, tok, L, 12, max_groups=groups)
        sv = counting(SquadServing)(squad, tok, L, 8, 8, max_groups=groups)
        runs[groups] = (rv.served(rv.text_fn(), tf.constant(article), tf.constant(question), tf.constant(options)),
                        sv.served(sv.text_fn(), tf.constant(asked), tf.constant(context)))
    for (got, grouped), (want, full) in zip(runs[4], runs[1]):
        assert_same(got, want)
        assert grouped < full, (grouped, full)


# ---------------------------------------------------------------------------------------------- SavedModel
@pytest.mark.slow
def test_grouped_export_answers_in_a_fresh_process(classifier, tmp_path):
    import json

    import tensorflow as tf

    (one, f1), (grp, _) = classifier("single").values()
    texts = MIXED + ["A fine film."]
    cases = {"mixed": texts, "one": texts[-1:], "equal": ["Fine.", "Good.", "Fine."]}
    for name, batch in cases.items():
        np.savez(tmp_path / f"{name}.npz", **{k: v for k, v in one.served(f1, tf.constant(batch))[0].items()
                                              if k != "label_name"})
    grp.export(str(tmp_path / "export"))
    (tmp_path / "cases.json").write_text(json.dumps(cases))
    run_like_a_server(
        f"serve = tf.saved_model.load({str(tmp_path / 'export')!r}).signatures['serving_default']\n"
        f"for name, texts in json.load(open({str(tmp_path / 'cases.json')!r})).items():\n"
        "    out = serve(text_a=tf.constant(texts))\n"
        f"    want = np.load({str(tmp_path)!r} + '/' + name + '.npz')\n"
        "    np.testing.assert_array_equal(out['label'].numpy(), want['label'])\n"
        "    for k in ('logits', 'probabilities'):\n"
        f"        np.testing.assert_allclose(out[k].numpy(), want[k], atol={TOL}, rtol=0, err_msg=name + k)\n",
        tmp_path)
