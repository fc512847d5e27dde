"""Prototype forms of the PDN statistic's passes (docs/chunk_forms.md §5), timed against the generated kernels.

The statistic is a per-channel decayed scan with one decay per token (pgdn, pkda: gP is `token log_gate key_head`):
    A_t = e^{gP_t} A_{t-1} + βP_t k_t²,   k̃_t = k_t ⊙ exp(−ln 1.5 · softsign(ln(A_t + 1e-6) − μ)).
The shipped kernel (chunk_precond_diag_kernel) runs one program per (sequence, head, BK channels), sequential over
steps of 128 rows, each step a tuple associative scan. The prototypes here:
  seq_dot:  the same program grid, one chunk per step, the in-chunk scan as one product M X with
            M[t, s] = 2^{C_t − C_s} (s ≤ t, every factor ≤ 1) on tensor cores (tf32x3: fp32-class accuracy);
  par_dot:  chunk-parallel: a light sequential pass forms only the chunk-start carries A_n (one weighted row sum per
            chunk, no scan, no map), then a chunk-parallel pass forms M X + 2^{C} A_n, the map and k̃.
Every forward form writes k̃ (fp32) and A_n, as the training forward does; `--backward` times the backward's forms
(the same grid with both recurrences as products; three passes, two of them chunk-parallel) on the same inputs.

Measured (H100, 2026-12-06, the call after run 103 on the same machine: `python3 benchmarks/pdn_forms.py --reps 5`
and `--backward --reps 5`, B 4 T 4096 H 16 D 128, tf32x3, medians of 5 interleaved; "shipped" was then the product form
in the generated kernels, and the tuple scans' kernels had timed 0.185 / 0.381 ms in run 103): forward
seq_dot 0.430-0.583 ms, par_dot 0.283-0.487 (its carry pass alone 0.120-0.136); backward seq_dot 0.635-1.056,
par_dot 0.712-1.542. Every form is slower than the tuple scans: not shipped (compiler/plan.py, PDN_SCAN_ROWS).

    TRITON_INTERPRET=1 python benchmarks/pdn_forms.py --check          # CPU: every form against float64
    python benchmarks/pdn_forms.py --reps 7                              # GPU: interleaved medians, ms
"""

from __future__ import annotations

import argparse
import math
import os
import statistics

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634
LN15 = math.log(1.5)


@triton.jit
def _map(b_stat, b_k, mu):
    x = tl.log(b_stat + 1e-6) - mu
    return b_k * tl.exp(-0.4054651081081644 * (x / (1.0 + tl.abs(x))))


@triton.jit
def _chunk_decays(gp, bp, rows, m_r, H: tl.constexpr, i_h):
    """Per-token log2 decays (floored at −64, as the shipped kernels), their chunk-local inclusive sums, the gains."""
    b_c = tl.load(gp + rows * H + i_h, mask=m_r, other=0.)
    b_c = tl.where(m_r, tl.maximum(b_c * 1.4426950408889634, -64.0), 0.)
    b_b = tl.load(bp + rows * H + i_h, mask=m_r, other=0.)
    return tl.cumsum(b_c, 0), b_b


@triton.jit
def _seq_program(H: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr):
    """A sequential program's place (grid: sequences × heads, blocks of BK channels): its sequence, head, channels,
    and the chunk's row offsets."""
    i_nh = tl.program_id(0)
    return i_nh // H, i_nh % H, tl.program_id(1) * BK + tl.arange(0, BK), tl.arange(0, BT)


@triton.jit
def _step_tiles(k, gp, bp, i_n, i_h, i_t, o_t, o_k, T: tl.constexpr, H: tl.constexpr, D: tl.constexpr,
                BT: tl.constexpr):
    """A sequential program's chunk i_t: its rows and their mask, the cumulated log2 decays C, the gains, the keys."""
    rows = i_n * T + i_t * BT + o_t
    m_r = i_t * BT + o_t < T
    b_C, b_b = _chunk_decays(gp, bp, rows, m_r, H, i_h)
    b_k = tl.load(k + (rows[:, None] * H + i_h) * D + o_k[None, :], mask=m_r[:, None], other=0.).to(tl.float32)
    return rows, m_r, b_C, b_b, b_k


@triton.jit
def _chunk_program(gp, bp, T: tl.constexpr, H: tl.constexpr, BT: tl.constexpr):
    """A chunk-parallel program's chunk (grid: chunks, sequences × heads): its rows, their mask, the cumulated log2
    decays C, the gains and the decay matrix M[t, s] = 2^{C_t − C_s} (s ≤ t)."""
    i_t = tl.program_id(0)
    i_nh = tl.program_id(1)
    i_n = i_nh // H
    i_h = i_nh % H
    o_t = tl.arange(0, BT)
    rows = i_n * T + i_t * BT + o_t
    m_r = i_t * BT + o_t < T
    b_C, b_b = _chunk_decays(gp, bp, rows, m_r, H, i_h)
    b_M = tl.where(o_t[:, None] >= o_t[None, :], tl.exp2(b_C[:, None] - b_C[None, :]), 0.)
    return i_n, i_h, i_t, o_t, rows, m_r, b_C, b_b, b_M


@triton.jit
def _chunk_statistic(k, an, rows, m_r, i_n, i_h, i_t, o_k, b_C, b_b, b_M, H: tl.constexpr, D: tl.constexpr,
                     NT: tl.constexpr, PREC: tl.constexpr):
    """A chunk's keys, increments x = βP k² and statistic 𝒜 = M X + 2^C A_n from its start carry, for channels o_k."""
    b_k = tl.load(k + (rows[:, None] * H + i_h) * D + o_k[None, :], mask=m_r[:, None], other=0.).to(tl.float32)
    b_x = b_k * b_k * b_b[:, None]
    b_A = tl.load(an + ((i_n * NT + i_t) * H + i_h) * D + o_k)
    return b_k, b_x, tl.dot(b_M, b_x, input_precision=PREC) + tl.exp2(b_C)[:, None] * b_A[None, :]


@triton.jit
def pdn_seq_dot_kernel(k, gp, bp, mu, a0, kt, an, a_out, T: tl.constexpr, H: tl.constexpr, D: tl.constexpr, BT: tl.constexpr,
                       BK: tl.constexpr, PREC: tl.constexpr):
    i_n, i_h, o_k, o_t = _seq_program(H, BT, BK)
    m_le = o_t[:, None] >= o_t[None, :]
    b_A = tl.load(a0 + (i_n * H + i_h) * D + o_k)
    b_mu = tl.load(mu + i_h)
    NT: tl.constexpr = (T + BT - 1) // BT
    for i_t in range(0, NT):
        rows, m_r, b_C, b_b, b_k = _step_tiles(k, gp, bp, i_n, i_h, i_t, o_t, o_k, T, H, D, BT)
        b_x = b_k * b_k * b_b[:, None]
        b_M = tl.where(m_le, tl.exp2(b_C[:, None] - b_C[None, :]), 0.)
        tl.store(an + ((i_n * NT + i_t) * H + i_h) * D + o_k, b_A)
        b_stat = tl.dot(b_M, b_x, input_precision=PREC) + tl.exp2(b_C)[:, None] * b_A[None, :]
        tl.store(kt + (rows[:, None] * H + i_h) * D + o_k[None, :], _map(b_stat, b_k, b_mu), mask=m_r[:, None])
        c_end = tl.sum(tl.where(o_t == tl.max(tl.where(m_r, o_t, 0), 0), b_C, 0.), 0)
        b_A = tl.exp2(c_end) * b_A + tl.sum(tl.where(m_r, tl.exp2(c_end - b_C), 0.)[:, None] * b_x, 0)
    tl.store(a_out + (i_n * H + i_h) * D + o_k, b_A)


@triton.jit
def pdn_carry_kernel(k, gp, bp, a0, an, a_out, T: tl.constexpr, H: tl.constexpr, D: tl.constexpr, BT: tl.constexpr,
                     BK: tl.constexpr):
    """Only the chunk-start carries: per chunk one weighted row sum Σ_s 2^{C_end − C_s} x_s."""
    i_n, i_h, o_k, o_t = _seq_program(H, BT, BK)
    b_A = tl.load(a0 + (i_n * H + i_h) * D + o_k)
    NT: tl.constexpr = (T + BT - 1) // BT
    for i_t in range(0, NT):
        rows, m_r, b_C, b_b, b_k = _step_tiles(k, gp, bp, i_n, i_h, i_t, o_t, o_k, T, H, D, BT)
        tl.store(an + ((i_n * NT + i_t) * H + i_h) * D + o_k, b_A)
        c_end = tl.sum(tl.where(o_t == tl.max(tl.where(m_r, o_t, 0), 0), b_C, 0.), 0)
        b_w = tl.where(m_r, tl.exp2(c_end - b_C) * b_b, 0.)
        b_A = tl.exp2(c_end) * b_A + tl.sum(b_w[:, None] * b_k * b_k, 0)
    tl.store(a_out + (i_n * H + i_h) * D + o_k, b_A)


@triton.jit
def pdn_map_kernel(k, gp, bp, mu, kt, an, T: tl.constexpr, H: tl.constexpr, D: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
                   PREC: tl.constexpr):
    """Chunk-parallel: the chunk's statistic M X + 2^C A_n, the map, k̃."""
    NT: tl.constexpr = (T + BT - 1) // BT
    i_n, i_h, i_t, o_t, rows, m_r, b_C, b_b, b_M = _chunk_program(gp, bp, T, H, BT)
    b_mu = tl.load(mu + i_h)
    for i_k in range(0, D // BK):
        o_k = i_k * BK + tl.arange(0, BK)
        b_k, b_x, b_stat = _chunk_statistic(k, an, rows, m_r, i_n, i_h, i_t, o_k, b_C, b_b, b_M, H, D, NT, PREC)
        tl.store(kt + (rows[:, None] * H + i_h) * D + o_k[None, :], _map(b_stat, b_k, b_mu), mask=m_r[:, None])


@triton.jit
def _map_adjoint(b_stat, b_k, b_dkt, mu):
    """k̃ = m(A) ⊙ k: the map m, the statistic's adjoint d𝒜 = m'(A) k dk̃, and dk̃ k ∂m/∂μ (summed over channels later)."""
    u = tl.log(b_stat + 1e-6) - mu
    den = 1.0 + tl.abs(u)
    m = tl.exp(-0.4054651081081644 * (u / den))
    dm_du = m * (-0.4054651081081644) / (den * den)
    b_kd = b_k * b_dkt
    return m, dm_du / (b_stat + 1e-6) * b_kd, -dm_du * b_kd


@triton.jit
def pdn_bwd_seq_dot_kernel(k, gp, bp, mu, an, dkt, da_fin, da0, dk_out, dbp_out, dgp_out, dmu_out, T: tl.constexpr,
                           H: tl.constexpr, D: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, PREC: tl.constexpr):
    """The shipped grid, one chunk per reverse step; both scans (𝒜 and the reverse Ā) as products with one M."""
    i_n, i_h, o_k, o_t = _seq_program(H, BT, BK)
    i_kb = tl.program_id(1)
    NK: tl.constexpr = D // BK
    m_le = o_t[:, None] >= o_t[None, :]
    b_mu = tl.load(mu + i_h)
    b_carry = tl.load(da_fin + (i_n * H + i_h) * D + o_k)
    NT: tl.constexpr = (T + BT - 1) // BT
    for i_rev in range(0, NT):
        i_t = NT - 1 - i_rev
        rows, m_r, b_C, b_b, b_k = _step_tiles(k, gp, bp, i_n, i_h, i_t, o_t, o_k, T, H, D, BT)
        c_end = tl.sum(tl.where(o_t == tl.max(tl.where(m_r, o_t, 0), 0), b_C, 0.), 0)
        b_x = b_k * b_k * b_b[:, None]
        b_M = tl.where(m_le, tl.exp2(b_C[:, None] - b_C[None, :]), 0.)
        b_A = tl.load(an + ((i_n * NT + i_t) * H + i_h) * D + o_k)
        b_stat = tl.dot(b_M, b_x, input_precision=PREC) + tl.exp2(b_C)[:, None] * b_A[None, :]
        b_dkt = tl.load(dkt + (rows[:, None] * H + i_h) * D + o_k[None, :], mask=m_r[:, None], other=0.)
        b_m, b_dst, b_dmu = _map_adjoint(b_stat, b_k, b_dkt, b_mu)
        b_ab = tl.dot(tl.trans(b_M), b_dst, input_precision=PREC) + tl.exp2(c_end - b_C)[:, None] * b_carry[None, :]
        b_carry = tl.sum(tl.where(m_r, tl.exp2(b_C), 0.)[:, None] * b_dst, 0) + tl.exp2(c_end) * b_carry
        tl.store(dk_out + (rows[:, None] * H + i_h) * D + o_k[None, :], b_m * b_dkt + 2.0 * b_b[:, None] * b_k * b_ab,
                 mask=m_r[:, None])
        p_part = (i_h * NK + i_kb) * (tl.num_programs(0) // H * T) + rows
        tl.store(dbp_out + p_part, tl.sum(b_k * b_k * b_ab, 1), mask=m_r)
        tl.store(dgp_out + p_part, tl.sum(b_ab * (b_stat - b_x), 1), mask=m_r)
        tl.store(dmu_out + p_part, tl.sum(b_dmu, 1), mask=m_r)
    tl.store(da0 + (i_n * H + i_h) * D + o_k, b_carry)


@triton.jit
def pdn_bwd_local_kernel(k, gp, bp, mu, an, dkt, r_out, T: tl.constexpr, H: tl.constexpr, D: tl.constexpr,
                         BT: tl.constexpr, BK: tl.constexpr, PREC: tl.constexpr):
    """Chunk-parallel, first of three: each chunk's own reverse sum r_c = Σ_s 2^{C_s} d𝒜_s (no carry)."""
    NT: tl.constexpr = (T + BT - 1) // BT
    i_n, i_h, i_t, o_t, rows, m_r, b_C, b_b, b_M = _chunk_program(gp, bp, T, H, BT)
    b_w = tl.where(m_r, tl.exp2(b_C), 0.)
    b_mu = tl.load(mu + i_h)
    for i_k in range(0, D // BK):
        o_k = i_k * BK + tl.arange(0, BK)
        b_k, b_x, b_stat = _chunk_statistic(k, an, rows, m_r, i_n, i_h, i_t, o_k, b_C, b_b, b_M, H, D, NT, PREC)
        b_dkt = tl.load(dkt + (rows[:, None] * H + i_h) * D + o_k[None, :], mask=m_r[:, None], other=0.)
        _, b_dst, _ = _map_adjoint(b_stat, b_k, b_dkt, b_mu)
        tl.store(r_out + ((i_n * NT + i_t) * H + i_h) * D + o_k, tl.sum(b_w[:, None] * b_dst, 0))


@triton.jit
def pdn_bwd_carry_kernel(gp, r, da_fin, cin, da0, T: tl.constexpr, H: tl.constexpr, D: tl.constexpr,
                         BT: tl.constexpr, BK: tl.constexpr):
    """Second of three, sequential and light: the carry into each chunk from the chunks after it."""
    i_n, i_h, o_k, o_t = _seq_program(H, BT, BK)
    NT: tl.constexpr = (T + BT - 1) // BT
    b_carry = tl.load(da_fin + (i_n * H + i_h) * D + o_k)
    for i_rev in range(0, NT):
        i_t = NT - 1 - i_rev
        m_r = i_t * BT + o_t < T
        b_c = tl.load(gp + (i_n * T + i_t * BT + o_t) * H + i_h, mask=m_r, other=0.)
        gam = tl.sum(tl.where(m_r, tl.maximum(b_c * 1.4426950408889634, -64.0), 0.), 0)
        tl.store(cin + ((i_n * NT + i_t) * H + i_h) * D + o_k, b_carry)
        b_carry = tl.load(r + ((i_n * NT + i_t) * H + i_h) * D + o_k) + tl.exp2(gam) * b_carry
    tl.store(da0 + (i_n * H + i_h) * D + o_k, b_carry)


@triton.jit
def pdn_bwd_apply_kernel(k, gp, bp, mu, an, dkt, cin, dk_out, dbp_out, dgp_out, dmu_out, T: tl.constexpr,
                         H: tl.constexpr, D: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, PREC: tl.constexpr):
    """Third of three, chunk-parallel: Ā = Mᵀ d𝒜 + 2^{C_end − C} carry, every input's share."""
    NT: tl.constexpr = (T + BT - 1) // BT
    i_n, i_h, i_t, o_t, rows, m_r, b_C, b_b, b_M = _chunk_program(gp, bp, T, H, BT)
    c_end = tl.sum(tl.where(o_t == tl.max(tl.where(m_r, o_t, 0), 0), b_C, 0.), 0)
    b_mu = tl.load(mu + i_h)
    b_dbp = tl.zeros([BT], dtype=tl.float32)
    b_dgp = tl.zeros([BT], dtype=tl.float32)
    b_dmu = tl.zeros([BT], dtype=tl.float32)
    for i_k in range(0, D // BK):
        o_k = i_k * BK + tl.arange(0, BK)
        b_k, b_x, b_stat = _chunk_statistic(k, an, rows, m_r, i_n, i_h, i_t, o_k, b_C, b_b, b_M, H, D, NT, PREC)
        b_dkt = tl.load(dkt + (rows[:, None] * H + i_h) * D + o_k[None, :], mask=m_r[:, None], other=0.)
        b_m, b_dst, b_dmu_e = _map_adjoint(b_stat, b_k, b_dkt, b_mu)
        b_cin = tl.load(cin + ((i_n * NT + i_t) * H + i_h) * D + o_k)
        b_ab = tl.dot(tl.trans(b_M), b_dst, input_precision=PREC) + tl.exp2(c_end - b_C)[:, None] * b_cin[None, :]
        tl.store(dk_out + (rows[:, None] * H + i_h) * D + o_k[None, :], b_m * b_dkt + 2.0 * b_b[:, None] * b_k * b_ab,
                 mask=m_r[:, None])
        b_dbp += tl.sum(b_k * b_k * b_ab, 1)
        b_dgp += tl.sum(b_ab * (b_stat - b_x), 1)
        b_dmu += tl.sum(b_dmu_e, 1)
    tl.store(dbp_out + i_h * (tl.num_programs(1) // H * T) + rows, b_dbp, mask=m_r)
    tl.store(dgp_out + i_h * (tl.num_programs(1) // H * T) + rows, b_dgp, mask=m_r)
    tl.store(dmu_out + i_h * (tl.num_programs(1) // H * T) + rows, b_dmu, mask=m_r)


def reference(k, gp, bp, mu, a0):
    """float64, token by token."""
    B, T, H, D = k.shape
    A = a0.double()
    kd, g, b = k.double(), gp.double().clamp_min(-64 / LOG2E), bp.double()
    kts = []
    for t in range(T):
        A = torch.exp(g[:, t])[..., None] * A + b[:, t][..., None] * kd[:, t] ** 2
        x = torch.log(A + 1e-6) - mu.double()[None, :, None]
        kts.append(kd[:, t] * torch.exp(-LN15 * x / (1 + x.abs())))
    return torch.stack(kts, 1), A


def shipped(k, gp, bp, mu, a0, kt, an, a_out, BK=16, warps=4, stages=2):
    """The generated package's kernel (generated/pgdn: the tuple scans), called with the layout its host gives it."""
    from dgps.generated.pgdn import chunk as pg

    B, T, H, D = k.shape
    cu = torch.arange(0, B + 1, device=k.device, dtype=torch.int32) * T
    offs = torch.arange(0, B + 1, device=k.device, dtype=torch.int32) * triton.cdiv(T, 64)
    grid = (B * H, triton.cdiv(D, BK))
    pg.chunk_precond_diag_kernel[grid](gp, bp, mu, kt, a0, a_out, an, k, cu, offs, H=H, HP=H, G=1, DK=D, BT=64,
                                       BTS=pg.BTS, BK=BK, INTERPRET=os.environ.get("TRITON_INTERPRET") == "1", KEEP=True,
                                       num_warps=warps, num_stages=stages)


def shipped_bwd(k, gp, bp, mu, an, dkt, da_fin, BK=8, warps=4, stages=2):
    from dgps.generated.pgdn import chunk as pg

    B, T, H, D = k.shape
    cu = torch.arange(0, B + 1, device=k.device, dtype=torch.int32) * T
    offs = torch.arange(0, B + 1, device=k.device, dtype=torch.int32) * triton.cdiv(T, 64)
    NK = triton.cdiv(D, BK)
    dk, da0 = torch.empty(B, T, H, D, device=k.device), torch.empty(B, H, D, device=k.device)
    parts = [torch.empty(H, NK, B * T, device=k.device) for _ in range(3)]
    pg.chunk_bwd_precond_diag_kernel[(B * H, NK)](
        gp, bp, mu, an, da_fin, da0, dkt, parts[1], k, parts[0], dk, parts[2], cu, offs, B * T, H=H, HV=H, HP=H, G=1,
        DK=D, BT=64, BTS=pg.BTS, BK=BK, INTERPRET=os.environ.get("TRITON_INTERPRET") == "1", NKP=NK, num_warps=warps,
        num_stages=stages)
    return dk, *(x.sum(1).view(H, B, T).permute(1, 2, 0) for x in parts), da0


def backward_forms(k, gp, bp, mu, an, dkt, da_fin, prec):
    """Each returns dk (k's direct share), dβP, dgP, dμ per token [B, T, H], dA0."""
    B, T, H, D = k.shape
    NT = triton.cdiv(T, 64)
    out = {"shipped": lambda: shipped_bwd(k, gp, bp, mu, an, dkt, da_fin)}

    def outputs(NK):
        return (torch.empty(B, T, H, D, device=k.device), *(torch.empty(H, NK, B * T, device=k.device) for _ in range(3)),
                torch.empty(B, H, D, device=k.device))

    def finish(dk, dbp, dgp, dmu, da0):
        return dk, *(x.sum(1).view(H, B, T).permute(1, 2, 0) for x in (dbp, dgp, dmu)), da0

    for BK, w in ((8, 4), (16, 4)):
        def run_seq(BK=BK, w=w):
            o = outputs(D // BK)
            pdn_bwd_seq_dot_kernel[(B * H, D // BK)](k, gp, bp, mu, an, dkt, da_fin, o[4], o[0], o[1], o[2], o[3], T,
                                                     H, D, 64, BK, prec, num_warps=w, num_stages=2)
            return finish(*o)
        out[f"seq_dot BK{BK} {w}w"] = run_seq
    for BK, w in ((32, 4), (32, 8)):
        def run_par(BK=BK, w=w):
            o = outputs(1)
            r, cin = torch.empty(B, NT, H, D, device=k.device), torch.empty(B, NT, H, D, device=k.device)
            pdn_bwd_local_kernel[(NT, B * H)](k, gp, bp, mu, an, dkt, r, T, H, D, 64, BK, prec, num_warps=w,
                                              num_stages=2)
            pdn_bwd_carry_kernel[(B * H, D // 16)](gp, r, da_fin, cin, o[4], T, H, D, 64, 16, num_warps=4, num_stages=2)
            pdn_bwd_apply_kernel[(NT, B * H)](k, gp, bp, mu, an, dkt, cin, o[0], o[1], o[2], o[3], T, H, D, 64, BK,
                                              prec, num_warps=w, num_stages=2)
            return finish(*o)
        out[f"par_dot BK{BK} {w}w"] = run_par
    return out


def reference_bwd(k, gp, bp, mu, a0, dkt, da_fin):
    """float64 autograd through `reference`: the same shares the kernels write (k's direct one, before the norm)."""
    xs = [x.double().requires_grad_(True) for x in (k, gp, bp, mu, a0)]
    kt, A = reference(*xs)
    torch.autograd.backward([kt, A], [dkt.double(), da_fin.double()])
    return xs[0].grad, xs[2].grad, xs[1].grad, xs[3].grad, xs[4].grad


def forms(k, gp, bp, mu, a0, prec):
    B, T, H, D = k.shape
    NT = triton.cdiv(T, 64)
    out = {}

    def buffers():
        return (torch.empty(B, T, H, D, device=k.device), torch.empty(B, NT, H, D, device=k.device),
                torch.empty(B, H, D, device=k.device))

    def run_shipped():
        kt, an, af = buffers()
        shipped(k, gp, bp, mu, a0, kt, an, af)
        return kt, af

    out["shipped"] = run_shipped
    # settings without a spill (sm_90 compile report at dk = 128, tf32x3)
    for BK, w in ((16, 4), (32, 8), (64, 8)):
        def run_seq(BK=BK, w=w):
            kt, an, af = buffers()
            pdn_seq_dot_kernel[(B * H, D // BK)](k, gp, bp, mu, a0, kt, an, af, T, H, D, 64, BK, prec, num_warps=w,
                                                 num_stages=2)
            return kt, af
        out[f"seq_dot BK{BK} {w}w"] = run_seq
    for BKc, BKm, wm in ((16, 32, 4), (8, 32, 4), (16, 128, 8), (8, 128, 8)):
        def run_par(BKc=BKc, BKm=BKm, wm=wm):
            kt, an, af = buffers()
            pdn_carry_kernel[(B * H, D // BKc)](k, gp, bp, a0, an, af, T, H, D, 64, BKc, num_warps=4, num_stages=2)
            pdn_map_kernel[(NT, B * H)](k, gp, bp, mu, kt, an, T, H, D, 64, BKm, prec, num_warps=wm, num_stages=2)
            return kt, af
        out[f"par_dot carry BK{BKc} map BK{BKm} {wm}w"] = run_par
        if BKm == 32:
            def run_carry(BKc=BKc):
                kt, an, af = buffers()
                pdn_carry_kernel[(B * H, D // BKc)](k, gp, bp, a0, an, af, T, H, D, 64, BKc, num_warps=4, num_stages=2)
                return kt, af
            out[f"  (its carry pass alone, BK{BKc})"] = run_carry
    return out


def inputs(B, T, H, D, device, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    k = torch.nn.functional.normalize(torch.randn(B, T, H, D, generator=g), dim=-1).to(torch.bfloat16)
    gp = torch.nn.functional.logsigmoid(torch.randn(B, T, H, generator=g) + 2.0)
    bp = torch.sigmoid(torch.randn(B, T, H, generator=g))
    mu = torch.full((H,), -0.2)
    a0 = torch.rand(B, H, D, generator=g)
    return [x.to(device) for x in (k, gp, bp, mu, a0)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="compare every form with the float64 reference")
    p.add_argument("--shape", nargs=4, type=int, default=None, metavar=("B", "T", "H", "D"))
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--prec", default="tf32x3", choices=["tf32", "tf32x3", "ieee"])
    p.add_argument("--backward", action="store_true", help="the backward pass's forms instead of the forward's")
    a = p.parse_args()
    device = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"
    B, T, H, D = a.shape or ((1, 200, 2, 64) if a.check else (4, 4096, 16, 128))
    k, gp, bp, mu, a0 = inputs(B, T, H, D, device)
    if a.backward:
        return main_backward(a, device, k, gp, bp, mu, a0, B, T, H, D)
    ref_kt, ref_a = reference(*(x.cpu() for x in (k, gp, bp, mu, a0)))
    runs = forms(k, gp, bp, mu, a0, a.prec)
    for name, fn in runs.items():
        if name.startswith("  "):
            continue
        kt, af = fn()
        e_kt = ((kt.cpu().double() - ref_kt).norm() / ref_kt.norm()).item()
        e_a = ((af.cpu().double() - ref_a).norm() / ref_a.norm()).item()
        print(f"{name:32s} k̃ rel err {e_kt:.2e}  A_final {e_a:.2e}", flush=True)
    if a.check:
        return
    timed(runs, a.reps)


def timed(runs, reps):
    times = {name: [] for name in runs}
    for _ in range(reps):  # interleaved
        for name, fn in runs.items():
            times[name].append(triton.testing.do_bench(fn, warmup=5, rep=40))
    for name, ts in times.items():
        print(f"{name:32s} {statistics.median(ts):.4f} ms  (min {min(ts):.4f})", flush=True)


def main_backward(a, device, k, gp, bp, mu, a0, B, T, H, D) -> None:
    g = torch.Generator(device="cpu").manual_seed(1)
    dkt = (torch.randn(B, T, H, D, generator=g) * 0.1).to(device)
    da_fin = torch.randn(B, H, D, generator=g).to(device)
    NT = triton.cdiv(T, 64)
    an, kt, af = torch.empty(B, NT, H, D, device=device), torch.empty(B, T, H, D, device=device), torch.empty_like(a0)
    shipped(k, gp, bp, mu, a0, kt, an, af)  # the forward's chunk-start carries
    runs = backward_forms(k, gp, bp, mu, an, dkt, da_fin, a.prec)
    names = ("dk", "dβP", "dgP", "dμ", "dA0")
    if a.check:
        ref = reference_bwd(*(x.cpu() for x in (k, gp, bp, mu, a0, dkt, da_fin)))
        ref = (*ref[:3], ref[3], ref[4])
    else:
        ref = [x.double() for x in runs["shipped"]()]
    for name, fn in runs.items():
        got = fn()
        errs = []
        for n, x, r in zip(names, got, ref, strict=True):
            x = x.double().cpu()
            r = r.cpu()
            if n == "dμ":
                x = x.sum((0, 1)) if a.check else x
            errs.append(f"{n} {((x - r).norm() / r.norm()).item():.1e}")
        print(f"{name:22s} " + "  ".join(errs) + ("" if a.check else "  (against shipped)"), flush=True)
    if not a.check:
        timed(runs, a.reps)


if __name__ == "__main__":
    main()
