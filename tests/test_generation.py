"""Generation (xlnet_tf/generation.py): greedy ids equal to HuggingFace's ``XLNetLMHeadModel.generate`` on the same
weights, sampling reproducible, the CLI ``generate.py`` (a generation that cannot fit refused before the model
loads, its memory and progress shown, Ctrl-C ends it) and the SavedModel's ``generate`` signature.

Weights: (a) a random tiny HF model (initializer 0.2, so attention and memory matter) saved as an HF directory
and read by ``from_pretrained``; (b) the session's tiny model pretrained by ``run_pretrain.py``
(``conftest.pretrained``) written into an HF model by a test-local converter (the reverse of checkpoint's HF
name map). The CLI runs through ``generate.main`` in-process (tests/cli_util.py).
Prompts: 20 WikiText-2 sentences of 3 to 60+ pieces, tokenised with the released spiece.model.
"""

from __future__ import annotations

import contextlib
import json
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import generate  # noqa: E402
from tests.cli_util import call, refused, succeeds  # noqa: E402
from tests.conftest import REPO, TINIEST, shared_path  # noqa: E402
from tests.subprocess_util import run_like_a_server  # noqa: E402
from xlnet_tf import XLNetModel, XLNetTokenizer  # noqa: E402
from xlnet_tf.attention import KeyValueMemory  # noqa: E402
from xlnet_tf.generation import GenerationOptions, Generator, left_pad, next_token_logits  # noqa: E402

N_NEW = 8


def _env():
    return dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=REPO)


def hf_greedy(hf, prompt, n_new=N_NEW, **kw):
    """HF's greedy continuation of one prompt (its ids only)."""
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), max_new_tokens=n_new, do_sample=False, **kw)
    return out[0, len(prompt):].tolist()


@pytest.fixture(scope="module")
def spm():
    return shared_path("spiece", "spiece.model")


@pytest.fixture(scope="module")
def prompts(spm):
    tok = XLNetTokenizer(spm)
    lines = [l.strip() for l in open(shared_path("text", "wikitext2-valid.tokens"), encoding="utf-8")
             if len(l.split()) > 40 and not l.strip().startswith("=")]
    texts = [" ".join(l.split()[:1 + 2 * i]) for i, l in enumerate(lines[:20])]
    return texts, [tok.encode(t) for t in texts]


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    torch.manual_seed(0)
    cfg = transformers.XLNetConfig(vocab_size=32000, d_model=32, n_layer=2, n_head=2, d_inner=64,
                                   ff_activation="gelu_new", untie_r=True, dropout=0.0, mem_len=None,
                                   initializer_range=0.2)
    d = tmp_path_factory.mktemp("hf")
    transformers.XLNetLMHeadModel(cfg).save_pretrained(str(d))
    return d


@pytest.fixture(scope="module")
def hf(hf_dir):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # HF's generate is dominated by per-op overhead: threads only contend here
    yield transformers.XLNetLMHeadModel.from_pretrained(str(hf_dir)).eval()
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def gen(hf_dir):
    return Generator(XLNetModel.from_pretrained(str(hf_dir), dropout=0.0, dropatt=0.0))


# ------------------------------------------------------------------------------------------ equality with HF
@pytest.mark.slow
def test_greedy_equals_hf_on_20_real_prompts(hf, gen, prompts):
    _, ids = prompts
    lengths = [len(p) for p in ids]
    assert len(ids) == 20 and len(set(lengths)) >= 15 and min(lengths) <= 6 and max(lengths) >= 50, lengths
    ref = [hf_greedy(hf, p) for p in ids]
    # batches of 8 prompts of mixed lengths (left-padded): each row gets the ids it gets alone in HF
    got = gen.generate(ids, GenerationOptions(max_new_tokens=N_NEW, eos_id=None), batch_size=8)
    assert got == ref
    assert len({tuple(r) for r in ref}) > 10  # the continuations depend on the prompts


@pytest.mark.slow  # (a few seconds: a traced model or real data read whole)
def test_memory_length_and_eos_as_hf(hf, gen, prompts):
    """HF's ``config.mem_len = m + 2`` keeps the last m positions (``mem_len=m`` here); an eos ends a row, pads
    follow."""
    _, ids = prompts
    long = [p for p in ids if len(p) > 30][:3]
    hf.transformer.mem_len = 6
    try:
        ref = [hf_greedy(hf, p, n_new=12) for p in long]
    finally:
        hf.transformer.mem_len = None
    got = gen.generate(long, GenerationOptions(max_new_tokens=12, mem_len=4, eos_id=None))
    assert got == ref
    full = gen.generate(long, GenerationOptions(max_new_tokens=12, eos_id=None))
    assert full != got  # the shorter memory changes the continuations: it is used

    # eos: the first token of the first row's continuation not seen before in it (k >= 1)
    k = next(i for i, t in enumerate(full[0]) if i > 0 and t not in full[0][:i])
    eos = full[0][k]
    ref = [hf_greedy(hf, p, n_new=12, eos_token_id=eos, pad_token_id=5) for p in long]
    raw = gen(*left_pad(long, 5), GenerationOptions(max_new_tokens=12, eos_id=eos, pad_id=5))
    assert raw[0, :k + 1].tolist() == full[0][:k + 1] and (raw[0, k + 1:] == 5).all()
    for row, r in zip(raw.tolist(), ref):  # HF stops when every row has ended; rows are padded to the longest
        assert row[:len(r)] == r and all(t == 5 for t in row[len(r):])


@pytest.mark.parametrize("path", ["kernels", "graph"])
def test_projected_positions_equal_a_steps_own(gen, prompts, path):
    """The loop multiplies each block's positional tables once (``XLNetModel.projected_positions``): a step
    given them returns exactly what a step multiplying its own returns, on the compiled attention and the graph's."""
    from xlnet_tf import accel

    model, (_, ids) = gen.model, prompts
    prompt = np.array([ids[5][:12], ids[6][:12]], np.int32)
    context = accel.portable_graph() if path == "graph" else contextlib.nullcontext()
    with context:
        _, rows = next_token_logits(model, prompt)
        mems = [KeyValueMemory(kv.k[:, :-1], kv.v[:, :-1]) for kv in rows]
        window = prompt[:, -2:]
        own, own_rows = next_token_logits(model, window, mems=mems)
        positions = model.projected_positions(3, 11 + 3)
        given, given_rows = next_token_logits(model, window, mems=mems, positions=positions)
        zeroed = positions._replace(projected=tuple((0 * s, 0 * c) for s, c in positions.projected))
        ignored, _ = next_token_logits(model, window, mems=mems, positions=zeroed)
    np.testing.assert_array_equal(given.numpy(), own.numpy())
    for a, b in zip(given_rows, own_rows):
        np.testing.assert_array_equal(a.k.numpy(), b.k.numpy())
        np.testing.assert_array_equal(a.v.numpy(), b.v.numpy())
    assert np.abs(ignored.numpy() - own.numpy()).max() > 1e-3  # the step reads the tables it is given
    with pytest.raises(ValueError, match="no dropout"):
        XLNetModel(model.config.replace(dropout=0.1))(window, positions=model.projected_positions(2, 2),
                                                      training=True)


@pytest.mark.slow
def test_sampling_is_reproducible(gen, prompts):
    _, ids = prompts
    few = ids[:4]
    greedy = gen.generate(few, GenerationOptions(max_new_tokens=N_NEW, eos_id=None))

    def sample(**kw):
        return gen.generate(few, GenerationOptions(max_new_tokens=N_NEW, eos_id=None, do_sample=True, **kw))

    a, b = sample(seed=1, temperature=2.0), sample(seed=1, temperature=2.0)
    assert a == b
    assert sample(seed=2, temperature=2.0) != a
    assert a != greedy
    assert sample(seed=3, top_k=1) == greedy  # one candidate left: the argmax
    assert sample(seed=3, top_p=1e-6) == greedy  # the smallest set reaching p: the argmax alone
    top3 = sample(seed=4, top_k=3, temperature=5.0)
    assert top3 != greedy
    # each first sampled token is among the 3 most likely after its prompt
    for p, row in zip(few, top3):
        logits, _ = next_token_logits(gen.model, np.asarray([p], np.int32))
        assert row[0] in np.argsort(-logits.numpy()[0])[:3]
    assert gen.function(True).experimental_get_tracing_count() == 1  # the options are tensors of one trace


def test_options_are_checked():
    for bad in (dict(max_new_tokens=0), dict(temperature=0.0), dict(top_p=0.0), dict(top_p=1.5), dict(top_k=-1),
                dict(mem_len=0)):
        with pytest.raises(ValueError, match=next(iter(bad))):
            GenerationOptions(**bad)


# ------------------------------------------------------------------------------------------ a pretrained model
def own_to_hf_state_dict(model):
    """Our backbone as an HF ``XLNetLMHeadModel`` state dict (the reverse of hf_checkpoint.hf_key_map)."""
    from xlnet_tf.checkpoint import backbone_tensors
    from xlnet_tf.hf_checkpoint import hf_key_map

    keys, state = hf_key_map(model.config), {}
    for name, value in backbone_tensors(model).items():
        hf_keys = keys[name]
        if len(hf_keys) > 1:  # per-layer biases / seg_embed: stacked in ours, or shared (untie_r=False)
            parts = value if value.ndim == 4 or (value.ndim == 3 and model.config.untie_r) else [value] * len(hf_keys)
            for k, v in zip(hf_keys, parts):
                state[k] = v
            continue
        if "/ff/layer_" in name and name.endswith("/kernel"):
            value = value.T
        state[hf_keys[0]] = value
    state = {(k if k.startswith("lm_loss") else "transformer." + k): torch.from_numpy(np.ascontiguousarray(v))
             for k, v in state.items()}
    state["lm_loss.weight"] = state["transformer.word_embedding.weight"]
    return state


@pytest.mark.slow
def test_greedy_equals_hf_on_a_pretrained_model(pretrained):
    d = pretrained["dir"]
    ours = XLNetModel.from_pretrained(d, dropout=0.0, dropatt=0.0, bi_data=False)
    c = ours.config
    hf_cfg = transformers.XLNetConfig(vocab_size=c.n_token, d_model=c.d_model, n_layer=c.n_layer, n_head=c.n_head,
                                      d_head=c.d_head, d_inner=c.d_inner, ff_activation="gelu_new",
                                      untie_r=c.untie_r, dropout=0.0, mem_len=None, reuse_len=None)
    hf = transformers.XLNetLMHeadModel(hf_cfg).eval()
    missing, unexpected = hf.load_state_dict(own_to_hf_state_dict(ours), strict=False)
    assert not unexpected and not missing, (missing, unexpected)
    tok = XLNetTokenizer(os.path.join(d, "spiece.model"))
    lines = [l.strip() for l in open(pretrained["corpus"], encoding="utf-8") if l.strip()]
    ids = [tok.encode(" ".join(l.split()[:n])) for n, l in zip((1, 2, 3, 5, 7, 9), lines)]
    got = Generator(ours).generate(ids, GenerationOptions(max_new_tokens=N_NEW, eos_id=None))
    assert got == [hf_greedy(hf, p) for p in ids]


# ------------------------------------------------------------------------------------------ CLI
def cli(args):
    """generate.py's ``main`` in-process."""
    return call(generate, *args)


@pytest.mark.slow
def test_cli_writes_jsonl_equal_to_the_library(hf_dir, gen, spm, prompts, tmp_path):
    texts, ids = prompts
    inp = tmp_path / "prompts.txt"
    inp.write_text("\n".join(texts[:3]) + "\n\n", encoding="utf-8")  # a blank line is skipped
    out = tmp_path / "out.jsonl"
    r = cli([f"--init_checkpoint={hf_dir}", f"--spiece_model_file={spm}", f"--input_file={inp}",
             "--max_new_tokens=5", f"--output_file={out}"])
    assert r.code == 0, r.stderr[-3000:]
    rows = [json.loads(l) for l in out.read_text(encoding="utf-8").splitlines()]
    tok = XLNetTokenizer(spm)
    expect = gen.generate(ids[:3], GenerationOptions(max_new_tokens=5))
    assert [row["prompt"] for row in rows] == texts[:3]
    assert [row["generated_ids"] for row in rows] == expect
    assert [row["generated_text"] for row in rows] == [tok.decode(e) for e in expect]
    for row in rows:
        assert row["generated_text"] in r.stdout

    # sampled with a seed: the library's draw for that seed (another process, the same ids)
    sampled = dict(max_new_tokens=6, do_sample=True, temperature=3.0, top_k=50, top_p=0.9, seed=7)
    r = cli([f"--init_checkpoint={hf_dir}", f"--spiece_model_file={spm}", f"--prompt={texts[5]}",
             f"--output_file={out}"] + [f"--{k}" if v is True else f"--{k}={v}" for k, v in sampled.items()])
    assert r.code == 0, r.stderr[-3000:]
    row = json.loads(out.read_text(encoding="utf-8"))
    assert row["generated_ids"] == gen.generate([ids[5]], GenerationOptions(**sampled))[0]
    assert row["generated_ids"] != gen.generate([ids[5]], GenerationOptions(**dict(sampled, seed=8)))[0]


@pytest.mark.slow  # (a few seconds: a traced model or real data read whole)
def test_cli_refuses_bad_input(hf_dir, spm, tmp_path):
    base = [f"--init_checkpoint={hf_dir}", f"--spiece_model_file={spm}", "--max_new_tokens=2"]
    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n", encoding="utf-8")
    out = tmp_path / "keep.jsonl"
    out.write_text("old\n")
    cases = [
        ([], "--prompt or --input_file"),
        (["--prompt=a", f"--input_file={empty}"], "not both"),
        ([f"--input_file={empty}"], "no prompts"),
        ([f"--input_file={tmp_path / 'missing.txt'}"], "missing.txt"),
        (["--prompt=a", f"--output_file={out}", "--top_p=1.5"], "--top_p"),
        (["--prompt=a", "--init_checkpoint=" + str(tmp_path)], "no checkpoint"),
    ]
    for extra, expected in cases:
        line = refused(generate, *(base + extra))
        assert expected in line, (extra, line)
    assert out.read_text() == "old\n"  # nothing written over


# ------------------------------------------------------------------------------------------ SavedModel
SERVE = """
loaded = tf.saved_model.load(EXPORT)
out = loaded.signatures["generate"](text=tf.constant(TEXTS))
drawn = loaded.signatures["sample"](text=tf.constant(TEXTS), seed=tf.constant(7, tf.int64),
                                    temperature=tf.constant(3.0), top_k=tf.constant(50), top_p=tf.constant(0.9))
json.dump({"text": [t.decode("utf-8") for t in out["text"].numpy()], "ids": out["ids"].numpy().tolist(),
           "sampled": drawn["ids"].numpy().tolist()}, open("served.json", "w"))
"""


@pytest.mark.slow
def test_export_answers_text_in_a_fresh_process(gen, spm, prompts, tmp_path):
    from xlnet_tf.generation import export_generator

    texts, ids = prompts
    export_dir = str(tmp_path / "export")
    export_generator(gen.model, spm, export_dir, GenerationOptions(max_new_tokens=5))
    pick = [texts[0], texts[7], texts[12]]
    run_like_a_server(f"EXPORT, TEXTS = {export_dir!r}, {pick!r}\n" + SERVE, tmp_path)  # (torch, ... never imported)
    served = json.loads((tmp_path / "served.json").read_text())
    tok = XLNetTokenizer(spm)
    expect = gen.generate([ids[0], ids[7], ids[12]], GenerationOptions(max_new_tokens=5))
    assert [row[:len(e)] for row, e in zip(served["ids"], expect)] == expect
    assert served["text"] == [tok.decode(e) for e in expect]
    sampled = gen.generate([ids[0], ids[7], ids[12]], GenerationOptions(max_new_tokens=5, do_sample=True, seed=7,
                                                                       temperature=3.0, top_k=50, top_p=0.9))
    assert [row[:len(e)] for row, e in zip(served["sampled"], sampled)] == sampled != expect


# ------------------------------------------------------------------- the CLI: memory, progress, unknown prompts, Ctrl-C
@pytest.fixture(scope="module")
def tiny_generator_dir(tmp_path_factory):
    """A TINIEST backbone (random weights, no bi_data) in our format: what generate.py loads in a second."""
    from xlnet_tf import XLNetConfig, XLNetModel

    d = tmp_path_factory.mktemp("gen") / "model"
    model = XLNetModel(XLNetConfig(**TINIEST))
    model(np.zeros((1, 4), np.int32))
    model.save_pretrained(str(d))
    return d


def test_a_generation_that_cannot_fit_is_refused_before_the_model_loads(tiny_generator_dir, tmp_path):
    import generate

    out = tmp_path / "out.jsonl"
    out.write_text("earlier\n")
    line = refused(generate, f"--init_checkpoint={tiny_generator_dir}",
                   f"--spiece_model_file={shared_path('spiece', 'spiece.model')}", "--prompt=The cat sat",
                   "--max_new_tokens=1000000000", f"--output_file={out}")
    assert "--max_new_tokens=1000000000 with --batch_size=8: generating is estimated to need" in line and \
        "each layer keeps 1,000,000,00" in line and "--mem_len" in line and "--nocheck_memory" in line, line
    assert out.read_text() == "earlier\n"


@pytest.mark.slow  # generates 200 tokens through the CLI
def test_generation_warns_of_unknown_prompts_and_shows_memory_and_progress(tiny_generator_dir, tmp_path,
                                                                           monkeypatch):
    import generate

    monkeypatch.setattr(generate, "PROGRESS_SECONDS", 0.0)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("The cat sat on the mat\n\U0001F600\U0001F600 \U0001F389\n", encoding="utf-8")
    r = succeeds(generate, f"--init_checkpoint={tiny_generator_dir}",
                 f"--spiece_model_file={shared_path('spiece', 'spiece.model')}", f"--input_file={prompts}",
                 "--max_new_tokens=200", "--batch_size=1")
    err = r.stderr.splitlines()
    unk = [e for e in err if e.startswith("W") and "<unk>" in e]
    assert len(unk) == 1 and "1 of 2 prompt(s) are <unk> pieces only (the first: prompt 2" in unk[0], r.stderr
    memory = [e for e in err if "generation memory:" in e]
    assert len(memory) == 1 and "keeps the keys and values of 206 positions (the prompt and every new token)" in \
        memory[0], memory
    progress = [e for e in err if "generating:" in e]
    assert progress and all("/200 new tokens of batch" in p for p in progress), r.stderr[-2000:]
    assert {p.split("of batch ")[1].split(",")[0] for p in progress} == {"1/2", "2/2"}
    r = succeeds(generate, f"--init_checkpoint={tiny_generator_dir}",
                 f"--spiece_model_file={shared_path('spiece', 'spiece.model')}", "--prompt=The cat",
                 "--max_new_tokens=200", "--mem_len=50", "--noprogress")
    assert "keeps the keys and values of 50 positions (the last ones: --mem_len=50)" in r.stderr
    assert "generating:" not in r.stderr


@pytest.mark.slow  # Ctrl-C reaches a process
def test_ctrl_c_stops_a_long_generation(tiny_generator_dir):
    """The loop runs in TensorFlow's threads, where Python sees no signal: its report reads SIGINT and ends it;
    the run ends with one line and exit code 130 (it ran on for the whole generation before)."""
    import signal
    import subprocess
    import sys
    import time

    from tests.conftest import REPO
    from tests.subprocess_util import ctrl_c_reaches_it

    p = subprocess.Popen([sys.executable, "generate.py", f"--init_checkpoint={tiny_generator_dir}",
                          f"--spiece_model_file={shared_path('spiece', 'spiece.model')}", "--prompt=The cat",
                          "--max_new_tokens=100000"], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         text=True, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"), preexec_fn=ctrl_c_reaches_it)
    try:
        for line in p.stderr:
            if "generation memory:" in line:
                break
        time.sleep(4)  # into the trace or the loop: either way the loop's first report ends it
        t0 = time.time()
        p.send_signal(signal.SIGINT)
        err = p.stderr.read()
        p.wait(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 130 and time.time() - t0 < 30, err[-2000:]
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith("error: interrupted"), err[-2000:]
