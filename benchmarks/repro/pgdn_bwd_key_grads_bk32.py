"""Standalone launch of dgps's generated `chunk_bwd_grad_kernel` (spec pgdn, shape B T H D = 1 256 2 128, launch
setting "bwd_key_grads=32,64,4,1"), written by `python benchmarks/triton_repro.py pgdn chunk_bwd_grad_kernel --launch "bwd_key_grads=32,64,4,1" --shape 1 256 2 128`
with triton 3.6.0. Float buffers hold random values; index tensors hold the host's.
sm_90 (triton.compile without a GPU): 200 registers, 0 B spill, 28672 B (0x7000) of shared memory per program.

    compute-sanitizer --tool memcheck python3 {this file}        # sm_90
    TRITON_INTERPRET=1 python3 {this file} --device cpu          # the Triton interpreter
"""
import argparse

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import libdevice  # noqa: F401 - read by some kernels' maps


@triton.jit
def _rne_bf16(x):
    """fp32 -> nearest bf16 value (ties to even), kept in fp32; the interpreter's own cast truncates."""
    xi = x.to(tl.uint32, bitcast=True)
    xi = (xi + 0x7FFF + ((xi >> 16) & 1)) & 0xFFFF0000
    return xi.to(tl.float32, bitcast=True)


@triton.jit
def _round(x, DT_ID: tl.constexpr):
    """Round before a store to a 16-bit buffer (only needed under the interpreter)."""
    if DT_ID == 3:
        return _rne_bf16(x.to(tl.float32))
    else:
        return x


@triton.jit
def _cast_for(x, ptr, DT_ID: tl.constexpr):
    """fp32 `x` in the element type of `ptr`: unchanged for fp32 buffers, rounded to nearest for 16-bit ones."""
    if ptr.dtype.element_ty == tl.float32:
        return x
    else:
        return _round(x, DT_ID).to(ptr.dtype.element_ty)


@triton.jit
def _remainder_for(x, hi, ptr, DT_ID: tl.constexpr):
    """What fp32 `x` has beyond `hi` (x rounded by _cast_for), in the element type of `ptr` and rounded toward zero,
    so that hi + it rounds to hi again: a pair x ≈ hi + lo whose matmul operand (rounded to 16 bits) is the one x
    gave. Rounded to nearest, a remainder at half an ulp of hi made hi + lo a tie that rounded away from hi for
    ~0.1 % of elements (seen with PDN's k̃ as such a pair, since reverted: pdn's μ gradient 1.2e-2 → 1.6e-2, bf16,
    interpreter; with this rounding, 1.2e-2 as with the fp32 k̃)."""
    r = x - hi.to(tl.float32)
    if ptr.dtype.element_ty == tl.float32:
        return r
    else:
        lo = _cast_for(r, ptr, DT_ID)
        away = tl.abs(lo.to(tl.float32)) > tl.abs(r)
        bits = lo.to(tl.int16, bitcast=True)  # one step toward zero: the bit pattern less one, for either sign
        return tl.where(away, (bits - 1).to(ptr.dtype.element_ty, bitcast=True), lo)


@triton.jit
def _mm(a, b, DT_ID: tl.constexpr):
    """Tensor-core matmul with fp32 accumulation: operands in the input dtype; fp32 inputs use IEEE fp32.

    DT_ID: 0 fp32, 1 bf16, 2 fp16; 3 / 4 emulate bf16 / fp16 operands in fp32 (the Triton interpreter's
    16-bit dot is not usable).
    """
    if DT_ID == 0:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    elif DT_ID == 1:
        return tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16))
    elif DT_ID == 2:
        return tl.dot(a.to(tl.float16), b.to(tl.float16))
    elif DT_ID == 3:
        return tl.dot(_rne_bf16(a.to(tl.float32)), _rne_bf16(b.to(tl.float32)), input_precision="ieee")
    else:
        return tl.dot(a.to(tl.float16).to(tl.float32), b.to(tl.float16).to(tl.float32), input_precision="ieee")


@triton.jit
def _mm32(a, b):
    return tl.dot(a, b, input_precision="ieee")


@triton.jit
def _mm_tf32(a, b, DT_ID: tl.constexpr):
    """Tensor-core matmul of fp32 operands rounded to tf32 (10-bit mantissa, 8× finer than bf16) for 16-bit
    inputs; the interpreter, which has no tf32, and fp32 inputs use IEEE fp32."""
    if DT_ID == 1 or DT_ID == 2:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="tf32")
    else:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")


@triton.jit
def _decayed_sum(d1, s1, d2, s2):
    """Combine of a decayed scan s_t = d_t s_{t-1} + x_t over (d, s) pairs (associative; the same combine runs the
    reverse scan, where Triton passes the later segment first)."""
    return d1 * d2, s1 * d2 + s2


@triton.jit
def _fast_log(x, INTERPRET: tl.constexpr):
    """log x on the SFU (lg2.approx, |error| ≤ 2^-22.6 ln 2): the PDN map's log was ~32 of its kernels' ~100
    instructions per element. lg2.approx.ftz flushes subnormals, so those are scaled by 2^24 first (exact: 0 → −inf,
    x < 0 → NaN, as log). The interpreter has no libdevice: the exact log there (the GPU checks run this one)."""
    if INTERPRET:
        return tl.log(x)
    else:
        tiny = x < 1.1754943508222875e-38
        return libdevice.fast_logf(tl.where(tiny, x * 16777216.0, x)) - tl.where(tiny, 16.635532333438686, 0.0)


@triton.jit
def chunk_bwd_grad_kernel(
    p_beta, g_buf, kt_buf, h_buf, vn_buf, do_buf, dh_buf, aq_buf, ae_buf, aa_buf, abeta_buf, ag_buf, dbc_buf,
    dy_buf, dsg_buf, dlg_buf, dgs_buf, dgl_buf, pn_q, pn_k, cu_seqlens, chunk_indices, scale, TT, H: tl.constexpr,
    HV: tl.constexpr, G: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, DT_ID: tl.constexpr, NKG: tl.constexpr,
):
    i_c = tl.program_id(1)
    i_hv = tl.program_id(2)
    i_h = i_hv // G
    i_n = tl.load(chunk_indices + i_c * 2)
    i_tc = tl.load(chunk_indices + i_c * 2 + 1)
    bos = tl.load(cu_seqlens + i_n).to(tl.int64)
    eos = tl.load(cu_seqlens + i_n + 1).to(tl.int64)
    t0 = bos + i_tc * BT
    i_k = tl.program_id(0)
    o_k = i_k * BK + tl.arange(0, BK)
    m_k = o_k < DK
    o_t = tl.arange(0, BT)
    rows = t0 + o_t
    m_r = rows < eos
    m_rk = m_r[:, None] & m_k[None, :]
    _b_beta_beta = tl.load(p_beta + rows * HV + i_hv, mask=m_r, other=0.).to(tl.float32)
    b_beta = tl.where(m_r, tl.zeros([BT], dtype=tl.float32) + _b_beta_beta, 0.)
    b_dew = tl.zeros([BT, BK], dtype=tl.float32)
    b_dqh = tl.zeros([BT, BK], dtype=tl.float32)
    b_das = tl.zeros([BT, BK], dtype=tl.float32)
    b_dhc = tl.zeros([BK], dtype=tl.float32)
    p_h = (i_c.to(tl.int64) * HV + i_hv) * DK * DV
    for i_v in range(0, tl.cdiv(DV, BV)):
        o_v = i_v * BV + tl.arange(0, BV)
        m_v = o_v < DV
        m_rv = m_r[:, None] & m_v[None, :]
        m_h = m_k[:, None] & m_v[None, :]
        b_h = tl.load(h_buf + p_h + o_k[:, None] * DV + o_v[None, :], mask=m_h, other=0.).to(tl.float32)
        b_dh = tl.load(dh_buf + p_h + o_k[:, None] * DV + o_v[None, :], mask=m_h, other=0.).to(tl.float32)
        b_do = tl.load(do_buf + (rows[:, None] * HV + i_hv) * DV + o_v[None, :], mask=m_rv, other=0.).to(tl.float32)
        b_u = tl.load(vn_buf + (rows[:, None] * HV + i_hv) * DV + o_v[None, :], mask=m_rv, other=0.).to(tl.float32)
        b_dy = tl.load(dy_buf + (rows[:, None] * HV + i_hv) * DV + o_v[None, :], mask=m_rv, other=0.).to(tl.float32)
        b_dqh += _mm(b_do, tl.trans(b_h), DT_ID)
        b_das += _mm(b_u, tl.trans(b_dh), DT_ID)
        b_dhc += tl.sum(b_h * b_dh, 1)
        # dY = Aiᵀ dU is bwd_solve's or bwd_scores', in the input dtype (the product rounds it to that anyway)
        b_dew += _mm(b_dy, tl.trans(b_h), DT_ID)
    # the key-channel operands are loaded after the loop over dv, which does not read them; a plain input stays in
    # its dtype, converted where an fp32 product reads it (sm_90, gdn at dk = 128, 4 warps: 48 B spill, 88 B with fp32
    # tiles)
    _b_q_q = tl.load(pn_q + (rows[:, None] * H + i_h) * DK + o_k[None, :], mask=m_r[:, None] & m_k[None, :], other=0.).to(tl.float32)
    b_q = tl.where(m_r[:, None] & m_k[None, :], tl.zeros([BT, BK], dtype=tl.float32) + _b_q_q, 0.)
    _b_a_ktilde = tl.load(kt_buf + (rows[:, None] * H + i_h) * DK + o_k[None, :], mask=m_r[:, None] & m_k[None, :], other=0.)
    b_a = tl.where(m_r[:, None] & m_k[None, :], tl.zeros([BT, BK], dtype=tl.float32) + _b_a_ktilde, 0.)
    last = t0 + tl.minimum(eos - t0, BT) - 1
    b_g = tl.load(g_buf + rows * HV + i_hv, mask=m_r, other=0.)
    b_gl = tl.load(g_buf + last * HV + i_hv)
    b_eb = tl.exp2(b_g)[:, None]
    b_ecb = tl.exp2(tl.minimum(b_gl - b_g, 0.))[:, None]
    # Output scores Q̂ ⋆ A. The epilogue is ordered so that each [BT, BK] adjoint is stored, and its share of the
    # decay gradient taken, as soon as it is final: fewer tiles live at once, fewer registers.
    # decay: db_t = q̂ ⊙ dq̂ + e ⊙ de − a ⊙ da, plus at the last token Σ_j a_j ⊙ da^state_j + e^{b_c} ⊙ Σ_v H ⊙ dH;
    # then dg = reverse cumsum of db within the chunk.
    # Scalar decay: the score pairs' share is row sums minus column sums of dS ⊙ S and dL' ⊙ L' in fp32 (bwd_solve's,
    # counted by block 0), rather than q ⊙ dq − a ⊙ da from bf16-operand matmuls, whose rounding does not cancel.
    # the output scores' pair gradient: bwd_solve's dS ⊙ Γ (input dtype) against this block's keys
    b_dsg = tl.load(dsg_buf + (rows[:, None] * HV + i_hv) * BT + o_t[None, :], mask=m_r[:, None], other=0.)
    b_dq = _mm(b_dsg, b_a, DT_ID)
    b_dqs = b_dqh * (scale * b_eb)
    b_dq += b_dqs
    # bwd_solve's two shares, added in the fused kernel's order (dS ⊙ S first, dL' ⊙ L' after the state terms)
    b_dbl = tl.where(i_k == 0, tl.load(dgl_buf + rows * HV + i_hv, mask=m_r, other=0.), 0.)
    b_db = tl.where(i_k == 0, tl.load(dgs_buf + rows * HV + i_hv, mask=m_r, other=0.), 0.)
    b_db += tl.sum(tl.where(m_rk, b_q * b_dqs, 0.), 1)
    tl.store(aq_buf + (rows[:, None] * HV + i_hv) * DK + o_k[None, :], b_dq, mask=m_rk)
    b_das = b_das * b_ecb
    b_db -= tl.sum(tl.where(m_rk, b_a * b_das, 0.), 1)
    b_end = tl.sum(tl.sum(b_a * b_das, 1), 0) + tl.exp2(b_gl) * tl.sum(b_dhc, 0)
    b_da = _mm(tl.trans(b_dsg), b_q, DT_ID) + b_das
    # the erase key's tile is loaded where it is first read, after dq̂'s store (pgdn at dk = 128, 4 warps: 112 B spill,
    # 608 B loaded with the others)
    _b_e_k = tl.load(pn_k + (rows[:, None] * H + i_h) * DK + o_k[None, :], mask=m_r[:, None] & m_k[None, :], other=0.).to(tl.float32)
    b_e = tl.where(m_r[:, None] & m_k[None, :], tl.zeros([BT, BK], dtype=tl.float32) + _b_e_k, 0.)
    b_ef = b_e * b_eb
    # the c×c share of dβ (Σ dY ⊙ Z + Σ dM ⊙ L') came from bwd_solve
    b_dbeta = tl.where(i_k == 0, tl.load(dbc_buf + rows * HV + i_hv, mask=m_r, other=0.), 0.) - \
        tl.sum(b_ef * b_dew, 1)
    # the interaction's pair gradient: bwd_solve's dL' ⊙ Γ (input dtype) against this block's keys
    b_dlg = tl.load(dlg_buf + (rows[:, None] * HV + i_hv) * BT + o_t[None, :], mask=m_r[:, None], other=0.)
    b_de = _mm(b_dlg, b_a, DT_ID)
    b_da += _mm(tl.trans(b_dlg), b_e, DT_ID)
    b_db += b_dbl
    b_dew = b_dew * b_beta[:, None]
    b_dews = b_dew * b_eb
    b_de -= b_dews
    b_db -= tl.sum(tl.where(m_rk, b_e * b_dews, 0.), 1)
    tl.store(ae_buf + (rows[:, None] * HV + i_hv) * DK + o_k[None, :], b_de, mask=m_rk)
    tl.store(aa_buf + (rows[:, None] * HV + i_hv) * DK + o_k[None, :], b_da, mask=m_rk)
    tl.store(abeta_buf + ((i_hv * NKG + i_k) * TT + t0) + o_t, b_dbeta, mask=m_r)
    b_db = tl.where(rows == last, b_db + b_end, b_db)
    b_db = tl.where(m_r, b_db, 0.)
    b_dg = tl.sum(b_db, 0) - tl.cumsum(b_db, 0) + b_db
    tl.store(ag_buf + ((i_hv * NKG + i_k) * TT + t0) + o_t, b_dg, mask=m_r)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda")
    dev = p.parse_args().device
    torch.manual_seed(0)
    p_beta = torch.empty_strided((1, 256, 2), (512, 2, 1), dtype=torch.bfloat16, device=dev).normal_()
    g_buf = torch.empty_strided((512,), (1,), dtype=torch.float32, device=dev).normal_()
    kt_buf = torch.empty_strided((65536,), (1,), dtype=torch.float32, device=dev).normal_()
    h_buf = torch.empty_strided((131072,), (1,), dtype=torch.bfloat16, device=dev).normal_()
    vn_buf = torch.empty_strided((65536,), (1,), dtype=torch.bfloat16, device=dev).normal_()
    do_buf = torch.empty_strided((1, 256, 2, 128), (65536, 256, 128, 1), dtype=torch.bfloat16, device=dev).normal_()
    dh_buf = torch.empty_strided((131072,), (1,), dtype=torch.bfloat16, device=dev).normal_()
    aq_buf = torch.empty_strided((65536,), (1,), dtype=torch.float32, device=dev).normal_()
    ae_buf = torch.empty_strided((65536,), (1,), dtype=torch.float32, device=dev).normal_()
    aa_buf = torch.empty_strided((65536,), (1,), dtype=torch.float32, device=dev).normal_()
    abeta_buf = torch.empty_strided((2048,), (1,), dtype=torch.float32, device=dev).normal_()
    ag_buf = torch.empty_strided((2048,), (1,), dtype=torch.float32, device=dev).normal_()
    dbc_buf = torch.empty_strided((512,), (1,), dtype=torch.float32, device=dev).normal_()
    dy_buf = torch.empty_strided((65536,), (1,), dtype=torch.bfloat16, device=dev).normal_()
    dsg_buf = torch.empty_strided((32768,), (1,), dtype=torch.bfloat16, device=dev).normal_()
    dlg_buf = torch.empty_strided((32768,), (1,), dtype=torch.bfloat16, device=dev).normal_()
    dgs_buf = torch.empty_strided((512,), (1,), dtype=torch.float32, device=dev).normal_()
    dgl_buf = torch.empty_strided((512,), (1,), dtype=torch.float32, device=dev).normal_()
    pn_q = torch.empty_strided((65536,), (1,), dtype=torch.bfloat16, device=dev).normal_()
    pn_k = torch.empty_strided((65536,), (1,), dtype=torch.bfloat16, device=dev).normal_()
    cu_seqlens = torch.tensor([0, 256], dtype=torch.int32, device=dev).reshape((2,))
    chunk_indices = torch.tensor([0, 0, 0, 1, 0, 2, 0, 3], dtype=torch.int32, device=dev).reshape((8,))
    chunk_bwd_grad_kernel[(4, 4, 2)](
        scale=0.08838834764831845,
        TT=256,
        H=2,
        HV=2,
        G=1,
        DK=128,
        DV=128,
        BT=64,
        BK=32,
        BV=64,
        DT_ID=1,
        NKG=4,
        num_warps=4,
        num_stages=1,
        p_beta=p_beta,
        g_buf=g_buf,
        kt_buf=kt_buf,
        h_buf=h_buf,
        vn_buf=vn_buf,
        do_buf=do_buf,
        dh_buf=dh_buf,
        aq_buf=aq_buf,
        ae_buf=ae_buf,
        aa_buf=aa_buf,
        abeta_buf=abeta_buf,
        ag_buf=ag_buf,
        dbc_buf=dbc_buf,
        dy_buf=dy_buf,
        dsg_buf=dsg_buf,
        dlg_buf=dlg_buf,
        dgs_buf=dgs_buf,
        dgl_buf=dgl_buf,
        pn_q=pn_q,
        pn_k=pn_k,
        cu_seqlens=cu_seqlens,
        chunk_indices=chunk_indices,
    )
    if dev == "cuda":
        torch.cuda.synchronize()
    print("chunk_bwd_grad_kernel: launch completed")


if __name__ == "__main__":
    main()
