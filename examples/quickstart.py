"""XLNet end to end on an embedded default: CPython's own documentation. No downloads, no other data.

    python examples/quickstart.py                   # about 1.5 minutes on 2 quiet cores
    python examples/quickstart.py --output_dir=DIR  # default: demo_out/

THE DATA. Every CPython installation ships the source of its standard library, docstrings included. This
script parses those files with ``ast`` (nothing is imported or executed) from ``sysconfig``'s stdlib path and
builds a real, if modest, text-classification task:

    "Which standard-library package does this docstring sentence come from?"
    labels: asyncio, email, http, tkinter, unittest, xml   (--packages=... to choose others)

Each docstring is split into paragraphs (doctest and indented code blocks dropped) and then into sentences;
sentences of 5-60 words are kept, a sentence found in more than one of the six packages is dropped, at most
600 sentences per package are kept (chosen by a hash of the text), and each sentence goes to
train / dev / test by a stable hash of its text (80/10/10: 2219 / 291 / 291 sentences on Python 3.11). The
result is identical on every machine with the same Python minor version (the stdlib files of one minor
version differ little between patch releases; compare the data fingerprint printed in step 1). The tokenizer
corpus is every docstring of the whole stdlib (not just the six packages, and without labels), one paragraph
per line. The model is trained FROM SCRATCH (no pretrained XLNet exists offline), so the numbers show that
the pipeline learns, not what a pretrained XLNet would reach.

THE STEPS (each is the project's real code path):
1. ``data/{train,dev,test}.tsv`` (columns ``text``, ``label``) for ``run_classifier.py --task=generic`` and
   ``corpus.txt`` for the tokenizer;
2. a SentencePiece model with XLNet's special symbols (``xlnet_tf.spm_train.train_spm``);
3. a small XLNet config json, then ``run_classifier.py --task=generic --do_train --do_eval --do_predict
   --export_dir=...`` in a subprocess: TFRecords, checkpoints, eval_results.json, predictions, SavedModel;
4. the SavedModel loaded in a FRESH process that imports only ``tensorflow`` and ``tensorflow_text``, asked
   about sentences that are in none of the files;
5. a summary: where everything is, dev accuracy against the majority-class baseline, timings.

Re-running reuses what is still valid (data files rewritten only when their content changes, the tokenizer
retrained only when the corpus changes, TFRecords cached by run_classifier.py, and the whole fine-tuning step
skipped when its results exist for exactly the same settings). ``--fresh`` deletes the output dir first.
"""

from __future__ import annotations

import argparse
import ast
import collections
import dataclasses
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

from xlnet_tf import XLNetTokenizer
from xlnet_tf.spm_train import train_spm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

PACKAGES = ("asyncio", "email", "http", "tkinter", "unittest", "xml")
SKIP_DIRS = {"test", "tests", "idle_test", "__pycache__", "site-packages", "dist-packages"}
DATA_VERSION = "stdlib-docstrings-v1"  # bump when the extraction rules change

# Sentences written for this demo (checked to be in none of the data files); one per package, then two that
# could belong to several.
DEMO_SENTENCES = (
    "Return the event loop for the current thread.",
    "Parse the raw bytes of a mail message and return the list of its attachments.",
    "Send a GET request to the server and read the status line of the response.",
    "Change the background colour of the button when the mouse pointer enters the widget.",
    "Fail the test unless the two lists contain the same items.",
    "Walk the element tree and collect the text of every child node.",
    "Close the connection and release every resource it holds.",
)

# The settings of the run.
MODE = dict(
    # max_seq_length 40 keeps ~95% of the sentences whole (median 16 pieces); 300 steps = ~4 epochs.
    per_label=600, vocab_size=6000, corpus="stdlib", max_seq_length=40,
    model=dict(n_layer=4, d_model=128, n_head=4, d_head=32, d_inner=512),
    train=dict(train_batch_size=32, train_steps=300, warmup_steps=30, learning_rate=1e-3, weight_decay=0.01,
               dropout=0.1, dropatt=0.1, save_steps=150, summary_type="mean", seed=1))


def log(msg: str = "") -> None:
    print(msg, flush=True)


def sha1(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8")).hexdigest()


# =============================================================================================== 1. the data
def stdlib_dir() -> str:
    return sysconfig.get_paths()["stdlib"]


def package_files(root: str, name: str) -> List[str]:
    """The .py files of stdlib package/module ``name`` (tests excluded), sorted."""
    path = os.path.join(root, name)
    if os.path.isfile(path + ".py"):
        return [path + ".py"]
    if not os.path.isdir(path):
        return []
    files = []
    for d, dirs, names in os.walk(path):
        dirs[:] = sorted(x for x in dirs if x not in SKIP_DIRS)
        files += [os.path.join(d, f) for f in sorted(names) if f.endswith(".py")]
    return files


def top_level_names(root: str) -> List[str]:
    out = []
    for name in sorted(os.listdir(root)):
        if name in SKIP_DIRS or name.startswith("."):
            continue
        if name.endswith(".py"):
            out.append(name[:-3])
        elif os.path.isdir(os.path.join(root, name)) and os.path.isfile(os.path.join(root, name, "__init__.py")):
            out.append(name)
    return out


def docstrings(path: str) -> Iterator[str]:
    """Module, class and function docstrings of one source file (cleaned by ``ast.get_docstring``)."""
    try:
        with open(path, "rb") as f:
            tree = ast.parse(f.read(), filename=path)
    except (SyntaxError, ValueError, UnicodeDecodeError, OSError):
        return  # lib2to3 test fixtures and the like: not documentation
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=True)
            if doc and doc.strip():
                yield doc


_CODE_LINE = re.compile(r"^\s*(>>>|\.\.\.\s|\$ |%|#)")


def paragraphs(doc: str) -> Iterator[str]:
    """Prose paragraphs of a docstring, each on one line (doctest and indented code blocks dropped)."""
    for block in re.split(r"\n\s*\n", doc):
        lines = block.split("\n")
        if any(_CODE_LINE.match(ln) for ln in lines):
            continue
        if lines and lines[0].startswith((" ", "\t")):  # indented (literal) block
            continue
        text = " ".join(block.split())
        if text:
            yield text


_SENT_SPLIT = re.compile(r"(?<=[.!?])\s+(?=[A-Z(\"'])")
_WORD = re.compile(r"^[A-Za-z][A-Za-z'-]*[.,;:!?)]*$")


_ABBREV = re.compile(r"(\b(e\.g|i\.e|etc|vs|cf|Mr|Dr|No)\.|\b[A-Za-z]\.)$")


def split_sentences(paragraph: str) -> List[str]:
    out: List[str] = []
    for piece in _SENT_SPLIT.split(paragraph):
        if out and _ABBREV.search(out[-1]):  # "e.g. Foo", "i.e. Bar", "J. Smith": not a sentence end
            out[-1] += " " + piece
        else:
            out.append(piece)
    return out


def sentences(paragraph: str) -> Iterator[str]:
    """Prose sentences: 5-60 words, ending with . ! or ?, mostly plain words (not code or tables)."""
    for s in split_sentences(paragraph):
        words = s.split()
        if not 5 <= len(words) <= 60 or not s.endswith((".", "!", "?")) or not s[0].isupper():
            continue
        if sum(1 for w in words if _WORD.match(w)) < 0.6 * len(words):
            continue
        yield s


def build_data(data_dir: str, packages: Sequence[str], per_label: int, corpus: str) -> dict:
    """Writes ``train/dev/test.tsv`` and ``corpus.txt`` into ``data_dir``; returns a description."""
    root = stdlib_dir()
    missing = [p for p in packages if not package_files(root, p)]
    if missing:
        raise SystemExit(f"no source files for stdlib package(s) {missing} under {root}. This demo reads the "
                         "stdlib's .py files (some Linux distributions split packages off, e.g. Debian/Ubuntu "
                         "ship tkinter in python3-tk); choose other packages with --packages=a,b,c,...")
    by_label: Dict[str, Dict[str, None]] = {p: {} for p in packages}  # insertion-ordered sets
    owners: Dict[str, set] = collections.defaultdict(set)
    corpus_lines: List[str] = []
    names = top_level_names(root) if corpus == "stdlib" else list(packages)
    n_files = 0
    for name in names:
        for path in package_files(root, name):
            n_files += 1
            for doc in docstrings(path):
                for para in paragraphs(doc):
                    corpus_lines.append(para)
                    if name in by_label:
                        for s in sentences(para):
                            by_label[name][s] = None
                            owners[s].add(name)
    rows: Dict[str, List[Tuple[str, str]]] = {"train": [], "dev": [], "test": []}
    available = {}
    for label in packages:
        unique = [s for s in by_label[label] if len(owners[s]) == 1]
        available[label] = len(unique)
        unique.sort(key=lambda s: sha1("select:" + s))
        for s in unique[:per_label]:
            bucket = int(sha1("split:" + s)[:8], 16) % 10
            split = "test" if bucket == 0 else "dev" if bucket == 1 else "train"
            rows[split].append((s, label))
    os.makedirs(data_dir, exist_ok=True)
    digest = hashlib.sha1()
    counts = {}
    for split, items in rows.items():
        items.sort(key=lambda r: sha1("order:" + r[0]))  # stable, label-mixed order
        text = "text\tlabel\n" + "".join(f"{s}\t{lab}\n" for s, lab in items)
        digest.update(text.encode("utf-8"))
        write_if_changed(os.path.join(data_dir, f"{split}.tsv"), text)
        counts[split] = collections.Counter(lab for _, lab in items)
    write_if_changed(os.path.join(data_dir, "corpus.txt"), "".join(line + "\n" for line in corpus_lines))
    info = {"version": DATA_VERSION, "python": f"{sys.version_info.major}.{sys.version_info.minor}",
            "stdlib": root, "labels": list(packages), "per_label": per_label, "available": available,
            "counts": {k: dict(sorted(v.items())) for k, v in counts.items()}, "corpus": corpus,
            "corpus_files": n_files, "corpus_paragraphs": len(corpus_lines),
            "fingerprint": digest.hexdigest()[:12]}
    write_if_changed(os.path.join(data_dir, "info.json"), json.dumps(info, indent=2, sort_keys=True) + "\n")
    return info


def write_if_changed(path: str, text: str) -> bool:
    """Atomic write, skipped when the file already holds ``text`` (keeps mtimes, so caches stay valid)."""
    data = text.encode("utf-8")
    if os.path.isfile(path) and os.path.getsize(path) == len(data):
        with open(path, "rb") as f:
            if f.read() == data:
                return False
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
    return True


def data_step(data_dir: str, packages: Sequence[str], per_label: int, corpus: str) -> Tuple[dict, bool]:
    """``build_data`` unless ``data_dir`` already holds the output of the same extraction (returns reused)."""
    key = {"version": DATA_VERSION, "python": sys.version, "stdlib": stdlib_dir(), "labels": list(packages),
           "per_label": per_label, "corpus": corpus}
    info_path = os.path.join(data_dir, "info.json")
    files = [os.path.join(data_dir, f) for f in ("train.tsv", "dev.tsv", "test.tsv", "corpus.txt")]
    if os.path.isfile(info_path) and all(os.path.isfile(f) for f in files):
        with open(info_path, encoding="utf-8") as f:
            info = json.load(f)
        if info.get("key") == key:
            return info, True
    info = build_data(data_dir, packages, per_label, corpus)
    info["key"] = key
    write_if_changed(info_path, json.dumps(info, indent=2, sort_keys=True) + "\n")
    return info, False


# =============================================================================================== 2. tokenizer
def file_sha1(path: str) -> str:
    h = hashlib.sha1()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def tokenizer_step(corpus_path: str, tok_dir: str, vocab_size: int) -> Tuple[str, bool]:
    """Trains ``tok_dir/spiece.model`` unless it was trained on the same corpus with the same vocab size."""
    model = os.path.join(tok_dir, "spiece.model")
    key_path = os.path.join(tok_dir, "trained_on.json")
    key = {"corpus_sha1": file_sha1(corpus_path), "vocab_size": vocab_size}
    if os.path.isfile(model) and os.path.isfile(key_path):
        with open(key_path, encoding="utf-8") as f:
            if json.load(f) == key:
                return model, True
    os.makedirs(tok_dir, exist_ok=True)
    if os.path.exists(key_path):
        os.remove(key_path)
    # One thread per core we were given is plenty for a 1.5 MB corpus (and friendlier on a shared machine).
    train_spm([corpus_path], os.path.join(tok_dir, "spiece"), vocab_size=vocab_size, quiet=True,
              num_threads=max(1, min(4, os.cpu_count() or 1)))
    write_if_changed(key_path, json.dumps(key, indent=2, sort_keys=True) + "\n")
    return model, False


# =============================================================================================== 3. fine-tuning
def run_dir_is_current(run_dir: str, settings: dict) -> bool:
    """True when ``run_dir`` was made with ``settings``; a run dir made with other settings is deleted."""
    path = os.path.join(run_dir, "settings.json")
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            if json.load(f) == settings:
                return True
        log(f"  settings changed since the last run: deleting {run_dir}")
        shutil.rmtree(run_dir)
    os.makedirs(run_dir, exist_ok=True)
    write_if_changed(path, json.dumps(settings, indent=2, sort_keys=True) + "\n")
    return False


def classifier_command(data_dir: str, spiece: str, config_path: str, run_dir: str, labels: Sequence[str],
                       mode: dict, jit: str) -> List[str]:
    t = mode["train"]
    return [sys.executable, os.path.join(ROOT, "run_classifier.py"), "--task=generic", f"--data_dir={data_dir}",
            "--text_a_column=text", "--label_column=label", f"--labels={','.join(labels)}",
            f"--spiece_model_file={spiece}", f"--model_config_path={config_path}", f"--output_dir={run_dir}",
            f"--max_seq_length={mode['max_seq_length']}", f"--train_batch_size={t['train_batch_size']}",
            f"--train_steps={t['train_steps']}", f"--warmup_steps={t['warmup_steps']}",
            f"--learning_rate={t['learning_rate']}", f"--weight_decay={t['weight_decay']}",
            f"--dropout={t['dropout']}", f"--dropatt={t['dropatt']}", f"--save_steps={t['save_steps']}",
            f"--summary_type={t['summary_type']}", f"--seed={t['seed']}",
            "--eval_batch_size=64", f"--iterations={max(5, t['train_steps'] // 10)}", f"--jit={jit}",
            "--do_train", "--do_eval", "--do_predict", f"--export_dir={os.path.join(run_dir, 'export')}"]


_ECHO = re.compile(r"^step\s+\d+/\d+ | (runner|health)\] |^error: |Traceback|Error")


def run_logged(cmd: Sequence[str], log_path: str, verbose: bool, cwd: str = ROOT) -> int:
    """Runs ``cmd``; everything goes to ``log_path``, progress and results lines (or all, verbose) to stdout."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL=os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"),
               PYTHONUNBUFFERED="1")
    with open(log_path, "w", encoding="utf-8") as logf:
        logf.write(" ".join(cmd) + "\n\n")
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, encoding="utf-8", errors="replace", bufsize=1)
        for line in proc.stdout:
            logf.write(line)
            if verbose or _ECHO.search(line):
                log("    " + re.sub(r"^[IWE]\d{4} [\d:.]+ ", "", line.rstrip()))
        return proc.wait()


def read_tsv_labels(path: str) -> List[str]:
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\n").split("\t")[-1] for line in f.readlines()[1:] if line.strip()]


def majority(train_labels: Sequence[str], eval_labels: Sequence[str]) -> Tuple[str, float]:
    """The most frequent train label and its share of ``eval_labels`` (the majority-class baseline)."""
    top = collections.Counter(train_labels).most_common(1)[0][0]
    return top, sum(1 for x in eval_labels if x == top) / max(1, len(eval_labels))


# =============================================================================================== 4. fresh process
# Runs in a new interpreter: only tensorflow and tensorflow_text (which registers the SentencePiece op), no
# project code on sys.path. Prints one JSON line.
SERVE_SCRIPT = r"""
import json, sys, time
t0 = time.time()
import tensorflow as tf
import tensorflow_text  # noqa: F401  (registers the SentencePiece ops the exported graph uses)
export_dir, labels, sentences = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
t1 = time.time()
model = tf.saved_model.load(export_dir)
serve = model.signatures["serving_default"]
t2 = time.time()
out = serve(text_a=tf.constant(sentences))
t3 = time.time()
project = sorted(m for m in sys.modules if m.split(".")[0] in ("xlnet_tf", "heads", "data", "tasks", "run_common"))
print("RESULT " + json.dumps({
    "sentences": sentences,
    "label_name": [x.decode("utf-8") for x in out["label_name"].numpy()],
    "probabilities": out["probabilities"].numpy().round(4).tolist(),
    "labels": labels,
    "signature_outputs": sorted(out),
    "project_modules_loaded": project,
    "seconds": {"import": round(t1 - t0, 2), "load": round(t2 - t1, 2), "predict": round(t3 - t2, 2)},
}))
"""


def serve_check(export_dir: str, labels: Sequence[str], sentences: Sequence[str], log_path: str) -> dict:
    cmd = [sys.executable, "-c", SERVE_SCRIPT, export_dir, json.dumps(list(labels)), json.dumps(list(sentences))]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("PYTHONPATH", None)
    proc = subprocess.run(cmd, cwd=os.path.dirname(os.path.abspath(export_dir)), env=env, capture_output=True,
                          text=True)
    with open(log_path, "w", encoding="utf-8") as f:
        f.write(proc.stdout + proc.stderr)
    results = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode or not results:
        raise SystemExit(f"the fresh-process SavedModel check failed (exit {proc.returncode}); see {log_path}:\n"
                         + proc.stderr[-3000:])
    return json.loads(results[-1][len("RESULT "):])


# =============================================================================================== main
def rel(path: str) -> str:
    r = os.path.relpath(path)
    return path if r.startswith("..") else r


def main(argv: Optional[Sequence[str]] = None) -> int:
    args, packages = parse_args(argv)
    mode, jit = run_mode(args), args.jit or "auto"
    out = output_dir(args)
    data_dir, tok_dir, run_dir = (os.path.join(out, d) for d in ("data", "tokenizer", "run"))
    timings: Dict[str, float] = {}
    t_start = time.time()

    log(f"XLNet quickstart -> {rel(out)}")
    info = data_stage(data_dir, packages, mode, timings)
    spiece, n_token = tokenizer_stage(data_dir, tok_dir, mode, timings)
    run = FineTuneRun.inside(out, run_dir)
    code = fine_tune_stage(run, data_dir, spiece, n_token, info, packages, mode, jit, args, timings)
    if code:
        return code
    scores = score_stage(run, data_dir, timings)
    serving_stage(out, data_dir, run.export_dir, packages, timings)
    timings["total"] = time.time() - t_start

    summary = write_summary(out, data_dir, run_dir, spiece, run, scores, info, timings)
    show_summary(out, summary, packages, scores, timings)
    return 0


def parse_args(argv: Optional[Sequence[str]]) -> Tuple[argparse.Namespace, Tuple[str, ...]]:
    """The command line, and its ``--packages`` (at least two distinct names, or argparse's error)."""
    ap = argparse.ArgumentParser(description=__doc__.split("THE STEPS")[0].rstrip(),
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--output_dir", default=None, help="default: demo_out/")
    ap.add_argument("--train_steps", type=int, default=None, help="override the mode's number of updates")
    ap.add_argument("--seed", type=int, default=None, help="random seed of the training run (default: 1)")
    ap.add_argument("--packages", default=",".join(PACKAGES),
                    help="comma-separated stdlib packages/modules to use as labels (default: %(default)s)")
    ap.add_argument("--fresh", action="store_true", help="delete the output dir first (no caches)")
    ap.add_argument("--rerun", action="store_true",
                    help="re-run run_classifier.py even when its results exist for the same settings")
    ap.add_argument("--jit", default=None, choices=("auto", "true", "update", "false"),
                    help="XLA for run_classifier.py (default: auto)")
    ap.add_argument("--verbose", action="store_true", help="echo run_classifier.py's whole log")
    args = ap.parse_args(argv)

    packages = tuple(p.strip() for p in args.packages.split(",") if p.strip())
    if len(set(packages)) < 2 or len(set(packages)) != len(packages):
        ap.error(f"--packages: need at least two distinct names, got {args.packages!r}")
    return args, packages


def run_mode(args: argparse.Namespace) -> dict:
    """A copy of ``MODE`` with the command line's ``--train_steps`` and ``--seed``."""
    mode = json.loads(json.dumps(MODE))
    if args.train_steps:
        mode["train"]["train_steps"] = args.train_steps
        mode["train"]["warmup_steps"] = min(mode["train"]["warmup_steps"], args.train_steps // 10)
    if args.seed is not None:
        mode["train"]["seed"] = args.seed
    return mode


def output_dir(args: argparse.Namespace) -> str:
    """The output directory, made (``--fresh``: emptied first, if it looks like one of ours)."""
    out = os.path.abspath(args.output_dir or os.path.join(ROOT, "demo_out"))
    if args.fresh and os.path.isdir(out):
        ours = any(os.path.exists(os.path.join(out, p)) for p in ("summary.json", "data/info.json", "run"))
        if os.listdir(out) and not ours:
            raise SystemExit(f"--fresh: {out} does not look like a quickstart output dir; not deleting it")
        shutil.rmtree(out)
    os.makedirs(out, exist_ok=True)
    return out


def data_stage(data_dir: str, packages: Sequence[str], mode: dict, timings: Dict[str, float]) -> dict:
    """Step 1: the data files (``data_step``), their counts and fingerprint logged; returns their info."""
    log(f"[1/4] data: sentences of CPython {sys.version_info.major}.{sys.version_info.minor}'s own stdlib "
        f"docstrings, labelled with their package ({', '.join(packages)})")
    t = time.time()
    info, reused = data_step(data_dir, packages, mode["per_label"], mode["corpus"])
    timings["data"] = time.time() - t
    for split in ("train", "dev", "test"):
        c = info["counts"][split]
        log(f"  {split:5s} {sum(c.values()):5d} sentences  " + "  ".join(f"{k} {v}" for k, v in c.items()))
    log(f"  tokenizer corpus: {info['corpus_paragraphs']} docstring paragraphs from {info['corpus_files']} files "
        f"({'whole stdlib' if info['corpus'] == 'stdlib' else 'the six packages'}); source {info['stdlib']}")
    log(f"  data fingerprint {info['fingerprint']}{' (reused)' if reused else ''}  [{timings['data']:.1f}s]")
    return info


def tokenizer_stage(data_dir: str, tok_dir: str, mode: dict, timings: Dict[str, float]) -> Tuple[str, int]:
    """Step 2: the SentencePiece model (``tokenizer_step``) and one sentence in its pieces; returns (its path,
    its vocabulary size)."""
    log(f"[2/4] SentencePiece tokenizer ({mode['vocab_size']} pieces, XLNet's special symbols)")
    t = time.time()
    spiece, reused = tokenizer_step(os.path.join(data_dir, "corpus.txt"), tok_dir, mode["vocab_size"])
    timings["tokenizer"] = time.time() - t

    tok = XLNetTokenizer(spiece)
    example = DEMO_SENTENCES[0]
    log(f"  {rel(spiece)}{' (reused)' if reused else ''}  [{timings['tokenizer']:.1f}s]")
    log(f"  {example!r} -> {tok.tokenize(example)}")
    return spiece, tok.vocab_size


@dataclasses.dataclass(frozen=True)
class FineTuneRun:
    """Where step 3 writes: the model config, run_classifier.py's results, predictions, export and log."""
    run_dir: str
    config_path: str
    eval_path: str
    pred_path: str
    export_dir: str
    log_path: str

    @classmethod
    def inside(cls, out: str, run_dir: str) -> "FineTuneRun":
        return cls(run_dir, os.path.join(out, "model_config.json"), os.path.join(run_dir, "eval_results.json"),
                   os.path.join(run_dir, "predict", "GENERIC.tsv"), os.path.join(run_dir, "export"),
                   os.path.join(run_dir, "run_classifier.log"))


def fine_tune_stage(run: FineTuneRun, data_dir: str, spiece: str, n_token: int, info: dict,
                    packages: Sequence[str], mode: dict, jit: str, args: argparse.Namespace,
                    timings: Dict[str, float]) -> int:
    """Step 3: the model config, then run_classifier.py in a subprocess (skipped when its results exist for
    exactly these settings); returns its exit code."""
    config = dict(mode["model"], n_token=n_token, ff_activation="gelu", untie_r=True)
    write_if_changed(run.config_path, json.dumps(config, indent=2, sort_keys=True) + "\n")
    settings = {"data": info["fingerprint"], "spiece_sha1": file_sha1(spiece), "config": config, "mode": mode,
                "jit": jit}
    cmd = classifier_command(data_dir, spiece, run.config_path, run.run_dir, packages, mode, jit)
    m = mode["model"]
    log(f"[3/4] fine-tune a {m['n_layer']}-layer XLNet (d_model {m['d_model']}, {m['n_head']} heads, "
        f"d_inner {m['d_inner']}) from scratch: {mode['train']['train_steps']} steps of "
        f"{mode['train']['train_batch_size']}, max_seq_length {mode['max_seq_length']}")
    log("  " + " ".join(c if c != sys.executable else "python" for c in cmd).replace(ROOT + os.sep, ""))
    t = time.time()
    current = run_dir_is_current(run.run_dir, settings)
    done = all(os.path.exists(p) for p in (run.eval_path, run.pred_path,
                                           os.path.join(run.export_dir, "saved_model.pb")))
    if current and done and not args.rerun:
        log("  results for exactly these settings exist: skipped (pass --rerun to run it again)")
    else:
        code = run_logged(cmd, run.log_path, args.verbose)
        if code:
            log(f"run_classifier.py failed (exit {code}); its log: {run.log_path}")
            return code
    timings["fine-tune"] = time.time() - t
    return 0


@dataclasses.dataclass(frozen=True)
class Scores:
    """Step 3's outcome: run_classifier.py's eval results, the test accuracy of its predictions, the majority
    class and its baselines."""
    results: dict
    test_accuracy: float
    majority_label: str
    dev_baseline: float
    test_baseline: float
    dev_count: int

    @property
    def health(self) -> dict:
        return self.results.get("health", {})


def score_stage(run: FineTuneRun, data_dir: str, timings: Dict[str, float]) -> Scores:
    """Step 3's outcome logged: dev and test accuracy against the majority class, the health check's words."""
    with open(run.eval_path, encoding="utf-8") as f:
        results = json.load(f)
    train_labels = read_tsv_labels(os.path.join(data_dir, "train.tsv"))
    dev_labels = read_tsv_labels(os.path.join(data_dir, "dev.tsv"))
    test_labels = read_tsv_labels(os.path.join(data_dir, "test.tsv"))
    top, dev_base = majority(train_labels, dev_labels)
    _, test_base = majority(train_labels, test_labels)
    preds = read_tsv_labels(run.pred_path)
    test_acc = sum(p == y for p, y in zip(preds, test_labels)) / max(1, len(test_labels))
    log(f"  dev accuracy {results['accuracy']:.3f} (majority class '{top}': {dev_base:.3f}), "
        f"test accuracy {test_acc:.3f} (majority {test_base:.3f})  [{timings['fine-tune']:.0f}s]")
    health = results.get("health", {})
    for warning in health.get("warnings", []):
        log(f"  WARNING: the model is not learning? {warning}")
    if health.get("causes"):
        log("  likely causes: " + "; ".join(health["causes"]))
    for note in health.get("notes", []):
        log(f"  note: {note}")
    return Scores(results, test_acc, top, dev_base, test_base, len(dev_labels))


def serving_stage(out: str, data_dir: str, export_dir: str, packages: Sequence[str],
                  timings: Dict[str, float]) -> None:
    """Step 4: the SavedModel asked in a fresh process (``serve_check``) about ``DEMO_SENTENCES``; the answers
    logged and written to ``serving_check.json``."""
    log("[4/4] the exported SavedModel in a fresh process (imports only tensorflow + tensorflow_text)")
    seen = {line.split("\t")[0] for s in ("train", "dev", "test")
            for line in open(os.path.join(data_dir, f"{s}.tsv"), encoding="utf-8")}
    t = time.time()
    answer = serve_check(export_dir, packages, DEMO_SENTENCES, os.path.join(out, "serving_check.log"))
    timings["serving check"] = time.time() - t
    answer["in_data_files"] = [s in seen for s in DEMO_SENTENCES]
    write_if_changed(os.path.join(out, "serving_check.json"), json.dumps(answer, indent=2) + "\n")
    width = max(len(x) for x in packages)
    for s, name, probs, was_seen in zip(answer["sentences"], answer["label_name"], answer["probabilities"],
                                        answer["in_data_files"]):
        ranked = sorted(zip(packages, probs), key=lambda kv: -kv[1])
        log(f"  {s!r}{'  (in the data!)' if was_seen else ''}")
        log(f"    -> {name:{width}s}  " + "  ".join(f"{k} {p:.2f}" for k, p in ranked))
    if answer["project_modules_loaded"]:
        log(f"  note: project modules were imported in the fresh process: {answer['project_modules_loaded']}")
    sec = answer["seconds"]
    log(f"  [{timings['serving check']:.0f}s: TF import {sec['import']}s, load {sec['load']}s, "
        f"predict {sec['predict']}s]")


def write_summary(out: str, data_dir: str, run_dir: str, spiece: str, run: FineTuneRun, scores: Scores,
                  info: dict, timings: Dict[str, float]) -> dict:
    """``summary.json``: the scores, the data's info, the timings and where every artefact is; returns it."""
    summary = {"output_dir": out, "dev_accuracy": scores.results["accuracy"],
               "dev_majority_baseline": scores.dev_baseline, "majority_label": scores.majority_label,
               "test_accuracy": scores.test_accuracy,
               "test_majority_baseline": scores.test_baseline, "eval_results": scores.results, "data": info,
               "timings_seconds": {k: round(v, 1) for k, v in timings.items()},
               "artefacts": {"data": data_dir, "tokenizer": spiece, "model_config": run.config_path,
                             "tfrecords": os.path.join(run_dir, "data"), "checkpoints": os.path.join(run_dir, "model"),
                             "eval_results": run.eval_path, "predictions": run.pred_path,
                             "saved_model": run.export_dir,
                             "training_curve": os.path.join(run_dir, "training_curve.png"),
                             "run_classifier_log": run.log_path}}
    run_common_json(os.path.join(out, "summary.json"), summary)
    return summary


def show_summary(out: str, summary: dict, packages: Sequence[str], scores: Scores,
                 timings: Dict[str, float]) -> None:
    """Step 5: where everything is, the scores against the baselines, the health check's verdict, timings."""
    log("")
    log("Summary")
    log(f"  task        which of {', '.join(packages)} a CPython docstring sentence comes from")
    a = summary["artefacts"]
    for name, path in (("data", a["data"] + "/{train,dev,test}.tsv, corpus.txt"), ("tokenizer", a["tokenizer"]),
                       ("config", a["model_config"]), ("TFRecords", a["tfrecords"]),
                       ("checkpoints", a["checkpoints"]), ("eval", a["eval_results"]),
                       ("curve", a["training_curve"]),
                       ("predictions", a["predictions"]), ("SavedModel", a["saved_model"]),
                       ("logs", a["run_classifier_log"]), ("summary", os.path.join(out, "summary.json"))):
        log(f"  {name:11s} {rel(path)}")
    log(f"  dev         accuracy {scores.results['accuracy']:.3f} vs majority baseline {scores.dev_baseline:.3f} "
        f"({scores.dev_count} sentences); test {scores.test_accuracy:.3f} vs {scores.test_baseline:.3f}")
    health = scores.health
    if health:
        verdict = "learning" if health.get("healthy") else "NOT LEARNING: " + "; ".join(health["warnings"])
        trend = health.get("loss_trend") or {}
        log(f"  health      {verdict}" + (f" (train loss {trend['first_steps_mean']:.3f} -> "
                                           f"{trend['last_steps_mean']:.3f})" if trend else ""))
        fit = health.get("fit") or {}
        if fit.get("overfitting"):
            log(f"              overfits: train loss {fit['train_loss']:.4f}, dev loss {fit['eval_loss']:.4f}")
    log("  timings     " + ", ".join(f"{k} {v:.0f}s" for k, v in timings.items()))


def run_common_json(path: str, obj) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(main())
