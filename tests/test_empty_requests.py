"""An empty request to a served model (issue #52: ``serving_default(text_a=tf.constant([], tf.string))`` raised
``InvalidArgumentError: Reduction axis 0 is empty``) gets an empty answer of the shapes a one-row request gets,
in every export: the classifier (single text, pair, embedding, memory mode), RACE, SQuAD and generation, in one
call and in length groups. Tiny random-init models (tests/test_serving_groups.py's), the modules' own traced
functions; one classifier export through a written SavedModel."""

import numpy as np
import pytest

from tests.conftest import shared_path
from tests.test_serving_groups import SHAPE, L, make_model

@pytest.fixture(scope="module")
def tok():
    from xlnet_tf import XLNetTokenizer

    return XLNetTokenizer(shared_path("spiece", "spiece.model"))


def answers(fn, one, n_rows_of):
    """``fn(*one)`` and ``fn`` on the same inputs with no rows: the empty answer has 0 rows and the one-row
    answer's other dimensions and dtypes."""
    import tensorflow as tf

    full = fn(*one)
    empty = fn(*[tf.zeros([0] + list(t.shape[1:]), t.dtype) for t in one])
    assert full.keys() == empty.keys()
    for k in full:
        assert empty[k].dtype == full[k].dtype, k
        assert empty[k].shape.as_list() == [0] + full[k].shape.as_list()[1:], (k, empty[k].shape, full[k].shape)
    assert all(full[k].shape[0] == n_rows_of for k in full)
    return empty


def with_groups(cls, *args, max_groups, **kw):
    sv = cls(*args, **kw)
    sv.max_groups = max_groups
    return sv


def test_the_utf8_check_passes_an_empty_request():
    """The cause: the check's "first bad row" (an argmax) of no rows."""
    import tensorflow as tf

    from xlnet_tf.tf_tokenizer import assert_utf8

    assert assert_utf8(tf.constant([], tf.string)).shape == [0]
    with pytest.raises(tf.errors.InvalidArgumentError, match="input is not valid UTF-8: row 1"):
        assert_utf8(tf.constant([b"ok", b"\xff"]))


@pytest.mark.slow
def test_classifier_signatures_answer_an_empty_request(tok):
    import tensorflow as tf

    from xlnet_tf.heads.classification import ClassificationHead
    from xlnet_tf.tasks.classification.serving import ClassifierServing

    model = make_model(lambda c: ClassificationHead(c.d_model, 3, n_head=c.n_head, d_head=c.d_head),
                       {k: np.zeros([1, 8], np.int32) for k in ("input_ids", "segment_ids", "padding_mask")})
    text = tf.constant(["A fine film."])
    for groups in (1, 4):
        sv = with_groups(ClassifierServing, model, tok, L, label_names=["a", "b", "c"], max_groups=groups)
        answers(sv.text_fn(False), [text], 1)
    answers(sv.text_fn(True), [text, text], 1)
    answers(sv.embed_fn(False), [text], 1)


@pytest.mark.slow
def test_memory_race_squad_and_generation_answer_an_empty_request(tok):
    import tensorflow as tf

    from xlnet_tf import XLNetConfig, XLNetModel
    from xlnet_tf.generation import GenerationModule, GenerationOptions
    from xlnet_tf.heads.classification import ClassificationHead
    from xlnet_tf.heads.multiple_choice import MultipleChoiceHead
    from xlnet_tf.heads.squad import SquadHead
    from xlnet_tf.tasks.classification import features as F
    from xlnet_tf.tasks.classification.serving import ClassifierServing
    from xlnet_tf.tasks.race.serving import RaceServing
    from xlnet_tf.tasks.squad.serving import SquadServing

    z = lambda *shape: np.zeros(shape, np.int32)  # noqa: E731
    memory = make_model(lambda c: ClassificationHead(c.d_model, 2, n_head=c.n_head, d_head=c.d_head),
                        F.encode_documents(tok, ["Fine.", "A long document. " * 20], L), mem_len=2 * L)
    race = make_model(lambda c: MultipleChoiceHead(c.d_model, n_head=c.n_head, d_head=c.d_head, dropout=0.0),
                      {k: z(1, 4, 8) for k in ("input_ids", "segment_ids", "padding_mask")})
    squad = make_model(lambda c: SquadHead(c.d_model, dropout=0.0),
                       {"input_ids": z(1, 8), "segment_ids": z(1, 8), "padding_mask": z(1, 8) + 1,
                        "p_mask": z(1, 8), "cls_index": z(1) + 7})
    for groups in (4,):  # (one call: the classifier test above)
        sv = with_groups(ClassifierServing, memory, tok, L, label_names=["neg", "pos"], memory=True,
                         max_groups=groups)
        answers(sv.text_fn(False), [tf.constant(["A long document. " * 20])], 1)
        rv = with_groups(RaceServing, race, tok, L, 12, max_groups=groups)
        answers(rv.text_fn(), [tf.constant(["It rained."]), tf.constant(["What?"]),
                               tf.constant([["sun", "rain", "snow", "wind"]])], 1)
        qv = with_groups(SquadServing, squad, tok, L, 8, 8, max_groups=groups)
        empty = answers(qv.text_fn(), [tf.constant(["Where?"]), tf.constant(["It was shot in Paris."])], 1)
        assert empty["answer_text"].shape == [0]
    lm = XLNetModel(XLNetConfig(**SHAPE, dropout=0.0, dropatt=0.0, accelerate=False))
    lm(tf.zeros([1, 8], tf.int32), padding_mask=tf.ones([1, 8], tf.int32))
    sig = GenerationModule(lm, shared_path("spiece", "spiece.model"), GenerationOptions(max_new_tokens=3)).signatures()
    empty = answers(sig["generate"], [tf.constant(["Once upon a time"])], 1)
    assert empty["ids"].shape == [0, 3]
    controls = [tf.constant(1, tf.int64), tf.constant(1.0), tf.constant(0, tf.int32), tf.constant(1.0)]
    sample = lambda text: sig["sample"](text, *controls)  # noqa: E731
    assert sample(tf.constant([], tf.string))["ids"].shape == [0, 3]


@pytest.mark.slow
def test_a_saved_classifier_export_answers_an_empty_request(tok, tmp_path):
    import tensorflow as tf

    from xlnet_tf.heads.classification import ClassificationHead
    from xlnet_tf.tasks.classification.serving import ClassifierServing

    model = make_model(lambda c: ClassificationHead(c.d_model, 2, n_head=c.n_head, d_head=c.d_head),
                       {k: np.zeros([1, 8], np.int32) for k in ("input_ids", "segment_ids", "padding_mask")})
    ClassifierServing(model, tok, L, label_names=["neg", "pos"]).export(str(tmp_path / "export"))
    served = tf.saved_model.load(str(tmp_path / "export")).signatures["serving_default"]
    out = served(text_a=tf.constant([], tf.string))
    assert {k: v.shape.as_list() for k, v in out.items()} == {
        "logits": [0, 2], "probabilities": [0, 2], "label": [0], "label_name": [0]}
