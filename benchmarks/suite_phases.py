"""Sums the phase samples of benchmarks/suite_phases/sitecustomize.py (its docstring says how to take them):
CPU-s per phase over every sampled process, the first and later tf.function calls, and the phases per kind of
process. Usage: PHASE_PROF_DIR=/tmp/p PYTHONPATH=benchmarks/suite_phases .venv/bin/python -m pytest ... ;
python benchmarks/suite_phases.py /tmp/p"""
import json, glob, sys, collections
tot = collections.Counter(); wall = collections.Counter(); n = collections.Counter()
kcpu = collections.defaultdict(collections.Counter); fn = collections.defaultdict(lambda: [0, 0.0, 0.0])
for d in sys.argv[1:]:
  for p in glob.glob(d + "/*.json"):
    j = json.load(open(p))
    a0 = j["argv"][0]
    if a0 == "-c":
        a1 = j["argv"][1] if len(j["argv"]) > 1 else ""
        k = "xdist worker" if len(j["argv"]) == 1 else ("serving host" if "xlnet_tf" in a1 else "python -c child")
    elif "pytest/__main__" in a0:
        k = "pytest main"
    else:
        k = a0.split("/")[-1]
    n[k] += 1
    for ph, c in j["cpu"].items():
        tot[ph] += c; kcpu[k][ph] += c
    for ph, c in j["wall"].items():
        wall[ph] += c
    for kind, v in j.get("fn", {}).items():
        for i in range(3): fn[kind][i] += v[i]
T = sum(tot.values())
print(f"total CPU-s {T:.0f}")
for ph, c in tot.most_common():
    print(f"  {ph:28s} {c:7.1f} CPU-s {100*c/T:5.1f}%   wall {wall[ph]:7.1f}")
print("tf.function calls:", {k: [v[0], round(v[1], 1), round(v[2], 1)] for k, v in fn.items()})
for k in sorted(kcpu, key=lambda k: -sum(kcpu[k].values())):
    s = sum(kcpu[k].values())
    print(f"{k:28s} procs {n[k]:3d} CPU {s:7.1f}: " + ", ".join(f"{ph} {c:.1f}" for ph, c in kcpu[k].most_common(7)))
