"""The scaling model's formulas on tiny cases worked by hand (benchmarks/scaling_model.py), and
its per-layer bytes against the collective census's formulas (benchmarks/collective_census.py,
whose formulas matched a real traced FSDP2 + TP step). No device, no distributed run: < 1 s."""

import math
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
import scaling_model as sm  # noqa: E402


def test_ring_formulas_by_hand():
    # 4 ranks, 8 bytes, 2 bytes/s, latency 1 s: (3/4) * 8 / 2 + 3 * 1 = 6
    assert sm.ring_all_gather(4, 8, 2, 1) == pytest.approx(6.0)
    assert sm.ring_reduce_scatter(4, 8, 2, 1) == pytest.approx(6.0)
    # all_reduce = reduce_scatter + all_gather: 2 * (3/4) * 8 / 2 + 2 * 3 = 12
    assert sm.ring_all_reduce(4, 8, 2, 1) == pytest.approx(12.0)
    # tree: 2 * 8 / 2 + 2 * log2(4) * 1 = 12; min picks either
    assert sm.tree_all_reduce(4, 8, 2, 1) == pytest.approx(12.0)
    assert sm.all_reduce(1024, 8, 2, 1) == pytest.approx(8 + 2 * 10)  # tree wins at 1024
    assert sm.ring_all_reduce(1, 8, 2, 1) == 0.0


def test_hierarchical_by_hand():
    # 8 ranks, 4 per domain: ring of 4 on X (fast), ring of 2 on X/4 (slow)
    t = sm.hierarchical("all_gather", 8, 4, 16, 4, 1, 0, 0)
    assert t == pytest.approx(3 / 4 * 16 / 4 + 1 / 2 * 4 / 1)


def test_torus_hops_by_hand():
    assert sm.torus_hops(64, 3) == 3 * 3        # 4 x 4 x 4: 3 per axis
    assert sm.torus_hops(256, 2) == 2 * 15      # 16 x 16
    assert sm.torus_hops(8, 0) == 7             # flat ring
    # latency only: 64 chips on a 3-axis torus, 1 s per hop -> 9 s (bandwidth term 0 bytes)
    assert sm.hierarchical("all_gather", 64, 64, 0, 1, 1, 1.0, 0, axes=3) == pytest.approx(9)


def test_llama3_8b_dims():
    m = sm.Model()
    assert m.params() == pytest.approx(8.03e9, rel=1e-3)
    # 6N + 12 L h s, N = matmul params
    assert m.flops_per_token(8192) == 6 * m.matmul_params() + 12 * 32 * 4096 * 8192


def test_layer_bytes_match_census_formulas():
    """The census model (2 layers, hidden 64, ...; dp=2, tp=2, batch 2 x 32 tokens) through the
    scaling model's per-layer bytes gives the census formula's per-step input bytes."""
    import collective_census as cc

    d = cc.DIMS
    m = sm.Model("census", d["layers"], d["hidden"], d["intermediate"], d["heads"],
                 d["kv_heads"], d["vocab"])
    r = sm.Recipe(seq=cc.SEQ)
    tokens = cc.BATCH_PER_DP * cc.SEQ
    cb = sm.layer_comm_bytes(m, r, cc.TP, cc.DP, tokens)
    rb = sm.root_comm_bytes(m, r, cc.DP)
    exp = cc.expected_per_step(**d, seq=cc.SEQ, batch_per_dp=cc.BATCH_PER_DP, dp=cc.DP,
                               tp=cc.TP)
    L = d["layers"]
    assert exp[("forward", "all_gather", "dp")] == (L + 1, L * cb["ag_in"] + rb["ag_in"])
    assert exp[("backward", "all_gather", "dp")] == (L, L * cb["ag_in"])
    assert exp[("backward", "reduce_scatter", "dp")] == (L + 1, L * cb["rs_in"] + rb["rs_in"])
    assert exp[("forward", "all_reduce", "tp")] == (r.tp_ar_fwd * L, r.tp_ar_fwd * L * cb["tp_ar"])
    assert exp[("backward", "all_reduce", "tp")] == (r.tp_ar_bwd * L, r.tp_ar_bwd * L * cb["tp_ar"])


def test_single_chip_is_compute_only():
    s = sm.step(sm.Model(), sm.CHIPS["v5p"], 1)
    assert s.tp == 1 and s.dp == 1
    assert s.tp_s == 0 and s.fsdp_exposed_s == 0
    flops = 8192 * sm.Model().flops_per_token(8192)
    assert s.step_s == pytest.approx(flops / (459e12 * 0.5))
    assert math.isclose(sm.sweep(sm.Model(), sm.CHIPS["v5p"], (1, 8))[0].efficiency, 1.0)
