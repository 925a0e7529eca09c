"""Peak memory (max RSS) of loading a HuggingFace XLNet directory, XLNet-Large-shaped by default (1.34 GiB of
float32 safetensors), each step in a fresh process: building the model alone, reading every tensor
(``hf_checkpoint.read_safetensors``) and ``XLNetModel.from_pretrained``. ``--roots`` compares checkouts (e.g. one
before a change to the reader): each row runs with that checkout's ``xlnet_tf``.

    nice python benchmarks/hf_load_memory.py                       # -> benchmarks/results/hf_load_memory.json
    nice python benchmarks/hf_load_memory.py --roots OLD_CHECKOUT,. --dir /tmp/xlnet_large_hf
    python benchmarks/hf_load_memory.py --n-layer 2                # quick

Memory-bound (not CPU-bound): run it once, niced. The directory (written with this checkout's
``save_pretrained(format="huggingface")``) is deleted afterwards unless ``--keep``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

STEPS = {
    "build only": "from xlnet_tf import XLNetConfig, XLNetModel; XLNetModel(XLNetConfig.load(D))",
    "read tensors": "from xlnet_tf.hf_checkpoint import read_safetensors; read_safetensors(D + '/model.safetensors')",
    "from_pretrained": "from xlnet_tf import XLNetModel; XLNetModel.from_pretrained(D)",
}
CHILD = "import resource, sys; D = sys.argv[1]; exec(sys.argv[2]); print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"
WRITE = ("import sys; from xlnet_tf import XLNetConfig, XLNetModel; "
         "XLNetModel(XLNetConfig.large().replace(n_layer=int(sys.argv[2])), seed=0).save_pretrained(sys.argv[1], format='huggingface')")


def run(root: str, code: str, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.path.abspath(root), TF_CPP_MIN_LOG_LEVEL="2")
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, cwd="/")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", default="/tmp/xlnet_large_hf", help="where the HF directory is written")
    p.add_argument("--n-layer", type=int, default=24, help="layers of the Large-shaped model (24)")
    p.add_argument("--roots", default=ROOT, help="comma list of checkouts whose xlnet_tf loads (default: this one)")
    p.add_argument("--keep", action="store_true", help="keep the directory")
    p.add_argument("--out", default=os.path.join(HERE, "results", "hf_load_memory.json"))
    args = p.parse_args(argv)
    sys.path.insert(0, HERE)
    from bench_util import write_json

    r = run(ROOT, WRITE, args.dir, str(args.n_layer))
    if r.returncode != 0:
        raise SystemExit(f"writing {args.dir} failed:\n{r.stderr[-2000:]}")
    size = os.path.getsize(os.path.join(args.dir, "model.safetensors")) / 2 ** 30
    rows = []
    try:
        print(f"{args.dir}: {size:.2f} GiB ({args.n_layer} layers)")
        for step, code in STEPS.items():
            for root in args.roots.split(","):
                r = run(root, CHILD, args.dir, code)
                if r.returncode != 0:
                    raise SystemExit(f"{step} with {root} failed:\n{r.stderr[-2000:]}")
                gib = int(r.stdout.split()[-1]) / 2 ** 20
                rows.append({"step": step, "root": os.path.abspath(root), "peak_rss_gib": round(gib, 3)})
                print(f"{step:16s} {os.path.abspath(root):40s} peak RSS {gib:.2f} GiB", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(args.dir, ignore_errors=True)
    write_json(args.out, {"file_gib": round(size, 3), "n_layer": args.n_layer, "rows": rows})


if __name__ == "__main__":
    main()
