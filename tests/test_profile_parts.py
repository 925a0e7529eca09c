"""``benchmarks/profile_parts.py``'s reading of a profiler trace: an op's own time is its duration less the op
events nested in it, ops running at once share each instant, XLA's launch-and-wait is not counted twice, and
every op lands in its part by type and name scope. A synthetic trace (XSpace proto) with known intervals."""

from __future__ import annotations

import os
import sys

import pytest

from tests.conftest import REPO, tiny

sys.path.insert(0, os.path.join(REPO, "benchmarks"))

import profile_parts  # noqa: E402

xplane_pb2 = pytest.importorskip("tensorflow.tsl.profiler.protobuf.xplane_pb2")

US = 1_000_000  # picoseconds in a microsecond


def trace(tmp_path, lines):
    """An XSpace with a host plane whose lines hold (name, start_us, duration_us) events."""
    space = xplane_pb2.XSpace()
    plane = space.planes.add(name="/host:CPU")
    ids = {}
    for events in lines:
        line = plane.lines.add(timestamp_ns=0)
        for name, start, duration in events:
            if name not in ids:
                ids[name] = len(ids) + 1
                plane.event_metadata[ids[name]].name = name
            line.events.add(metadata_id=ids[name], offset_ps=start * US, duration_ps=duration * US)
    path = tmp_path / "t.xplane.pb"
    path.write_bytes(space.SerializeToString())
    return str(path)


def test_own_time_shared_instants_and_parts(tmp_path):
    path = trace(tmp_path, [
        # thread 1: a function call op [0, 100) holding a matmul [10, 50) and a LayerNorm op [60, 80)
        [("model/PartitionedCall:PartitionedCall", 0, 100), ("layer_0/ff/MatMul:_MklMatMul", 10, 40),
         ("layer_0/layer_norm/Mean:Mean", 60, 20), ("ExecutorState::Process", 0, 100)],
        # thread 2: a dropout mask [30, 50) beside the matmul; an XLA launch [120, 130) whose wait is not work
        [("layer_0/dropout/StatelessRandomUniformV2:StatelessRandomUniformV2", 30, 20),
         ("CpuExecutable::ExecuteAsyncOnStream", 120, 10), ("BlockUntilReady", 130, 50)],
    ])
    parts, types, busy = profile_parts.op_times(path)
    us = {k: round(v * 1e6, 6) for k, v in parts.items()}
    assert us == {"control, variables, function calls": 40.0,  # [0,10) + [50,60) + [80,100)
                  "matmul": 30.0,  # [10,30) alone, [30,50) shared with the dropout
                  "dropout (random numbers, masks)": 10.0,
                  "LayerNorm": 20.0,
                  "XLA clusters (fused elementwise, update)": 10.0}
    assert round(busy * 1e6, 6) == 110.0  # [0, 100) and [120, 130): the wait is no op's work
    assert round(types["_MklMatMul"] * 1e6, 6) == 30.0


def test_flops_of_a_forward():
    cfg = tiny(n_layer=1, d_model=4, d_inner=8)
    f = profile_parts.forward_flops(cfg, B=2, T=3)
    # projections: 4 of [6, 4] x [4, 4] and the positions [2, 6 rows] x [4, 4]; attention: AC and PV over 3
    # keys, BD over 6 relative positions; feed-forward: [6, 4] x [4, 8] and back
    assert f == {"projections": 2 * 6 * 16 * 4 + 2 * 2 * 6 * 16, "attention": 2 * 2 * 3 * 3 * 4 * 2 + 2 * 2 * 3 * 6 * 4,
                 "feed_forward": 2 * 2 * 6 * 4 * 8}
