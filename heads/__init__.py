"""Task heads on the backbone. The sequence summaries a classification or multiple-choice head can use, and its
default, are written here once (light: the command lines read them without TensorFlow)."""

SUMMARY_TYPES = ("last", "first", "mean", "attn")
DEFAULT_SUMMARY = "last"  # the <cls> at the end of the left-padded layout, as the original
