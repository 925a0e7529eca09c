"""The tf.data options of every dataset the library iterates (training, ``predict``, the Keras task models' fit,
evaluate and predict, held-out pretraining loss).

tf.data's autotuning is off. Its optimisation thread sleeps for periods that double up to 60 s, and deleting an
iterator waits for the thread's current sleep to end: an iterator that lived 25 s took 16 s to delete, one of
40 s took 1 s (TensorFlow 2.21, PERFORMANCE.md "Deleting a tf.data iterator"). That wait fell at the end of each
training run and evaluation, or wherever the garbage collector met an old iterator. Without autotuning, the
pipelines' ``AUTOTUNE`` values are not tuned while they run."""

import tensorflow as tf


def for_iteration(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """``dataset`` with autotuning off (the module's docstring says why)."""
    options = tf.data.Options()
    options.autotune.enabled = False
    return dataset.with_options(options)
