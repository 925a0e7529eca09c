"""Where the suite's CPU time goes, by phase (PERFORMANCE.md "Test suite"): put this folder on PYTHONPATH and set
PHASE_PROF_DIR; every Python process then started (pytest, its workers, the CLIs and serving hosts they start:
the environment is inherited) samples its main thread's stack every 20 ms and gives the process's CPU time (all
threads, ``os.times``) since the last sample to the phase that stack is in (``classify``). Each process writes
PHASE_PROF_DIR/<pid>.json every 2 s and at exit; ``benchmarks/suite_phases.py DIR`` sums them. The first call of
each tf.function (graph set-up, Grappler, XLA compiles) and the later calls are timed apart (``Context.call_function``
wrapped). A rough tool: a process killed within its first 2 s is lost, the sampler costs a few percent."""
import os

_DIR = os.environ.get("PHASE_PROF_DIR")
if _DIR:
    import atexit
    import json
    import sys
    import threading
    import time

    _real_sleep = time.sleep

    def _phase_sleep(s):
        return _real_sleep(s)

    time.sleep = _phase_sleep

    _main = threading.main_thread().ident
    _cpu = {}
    _wall = {}
    _start = time.time()
    _argv = None

    def classify(frame):
        names = []
        f = frame
        while f is not None:
            c = f.f_code
            names.append((c.co_filename, c.co_name))
            f = f.f_back
        names.reverse()  # outermost first
        inner = names[-1] if names else ("", "")
        has = lambda s: any(s in fn for fn, _ in names)
        hasf = lambda s, n: any(s in fn and n == fu for fn, fu in names)
        if any(fu == "_phase_sleep" for _, fu in names):
            return "sleep"
        if hasf("subprocess.py", "communicate") or hasf("subprocess.py", "wait") or hasf("subprocess.py", "run"):
            return "wait:child"
        if has("subprocess_util.py") and ("select" in inner[1] or "readline" in inner[1] or inner[0].endswith("subprocess_util.py")):
            return "wait:serving-host"
        if any(fn.startswith("<frozen importlib") for fn, _ in names):
            return "import"
        if has("saved_model/load.py") or has("saved_model/load_v1") or hasf("keras", "load_model"):
            return "savedmodel:load"
        if has("saved_model/save.py") or has("export_formats.py"):
            if has("func_graph.py"):
                return "savedmodel:save-trace"
            return "savedmodel:save-write"
        if has("func_graph.py"):
            if has("structured_function.py"):
                return "trace:tf.data"
            if has("xlnet_tf/export.py") or has("/serving.py") or has("generation.py"):
                return "trace:export-signatures"
            return "trace:model/step"
        if has("tfrecord_io.py") or has("features.py") or has("reader.py") or has("sentencepiece") or \
                has("tokenizer.py") or has("pretrain_records.py") or has("spm_train.py"):
            return "data-prep"
        if any("checkpoint" in fn for fn, _ in names[-8:]):
            return "checkpoint-io"
        if has("eager/execute.py") or has("iterator_ops.py") or inner[1] in ("_call_flat", "call_flat", "__call__") \
                or has("eager/context.py") or has("polymorphic_function"):
            return "execute"
        if has("torch") or has("transformers"):
            return "torch/transformers"
        if has("_pytest") or has("pluggy") or has("xdist") or has("execnet"):
            if inner[0].endswith(("execnet/gateway_base.py", "threading.py")):
                return "idle:xdist"
            return "python:other"
        return "python:other"

    def _dump():
        try:
            with open(os.path.join(_DIR, f"{os.getpid()}.json.tmp"), "w") as f:
                json.dump({"argv": sys.argv[:6], "cpu": _cpu, "wall": _wall, "fn": _fn, "life": time.time() - _start,
                           "worker": os.environ.get("PYTEST_XDIST_WORKER")}, f)
            os.replace(os.path.join(_DIR, f"{os.getpid()}.json.tmp"), os.path.join(_DIR, f"{os.getpid()}.json"))
        except Exception:
            pass

    _fn = {}  # "first"/"later" -> [calls, cpu, wall]
    _seen = set()
    _patched = [False]

    def _patch():
        ctxmod = sys.modules.get("tensorflow.python.eager.context")
        if ctxmod is None or not hasattr(ctxmod, "Context"):
            return
        orig = ctxmod.Context.call_function

        def call_function(self, name, tensor_inputs, num_outputs):
            c0, w0 = time.process_time(), time.time()
            try:
                return orig(self, name, tensor_inputs, num_outputs)
            finally:
                kind = "later" if name in _seen else "first"
                _seen.add(name)
                e = _fn.setdefault(kind, [0, 0.0, 0.0])
                e[0] += 1; e[1] += time.process_time() - c0; e[2] += time.time() - w0
        ctxmod.Context.call_function = call_function
        _patched[0] = True

    def _loop():
        last_cpu = sum(os.times()[:2])
        last_wall = time.time()
        last_dump = last_wall
        while True:
            _real_sleep(0.02)
            if not _patched[0]:
                try:
                    _patch()
                except Exception:
                    _patched[0] = True
            fr = sys._current_frames().get(_main)
            ph = classify(fr) if fr is not None else "no-main"
            c = sum(os.times()[:2])
            w = time.time()
            _cpu[ph] = _cpu.get(ph, 0.0) + (c - last_cpu)
            _wall[ph] = _wall.get(ph, 0.0) + (w - last_wall)
            last_cpu, last_wall = c, w
            if w - last_dump > 2:
                _dump()
                last_dump = w

    threading.Thread(target=_loop, daemon=True, name="phaseprof").start()
    atexit.register(_dump)
