"""Standalone launch of dgps's generated `chunk_bwd_curvature_query_kernel` (spec ccq_gdn, shape B T H D = 1 4096 4 128, launch
setting "bwd_curvature_query=64,32,4,1"), written by `python benchmarks/triton_repro.py ccq_gdn chunk_bwd_curvature_query_kernel --launch "bwd_curvature_query=64,32,4,1" --shape 1 4096 4 128`
with triton 3.6.0. Float buffers hold random values; index tensors hold the host's.
sm_90 (triton.compile without a GPU): 222 registers, 0 B spill, 24576 B (0x6000) of shared memory per program.

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
def _hi(x, DT_ID: tl.constexpr):
    """fp32 `x` rounded to the input dtype (to nearest), kept in fp32: x = _hi(x) + a remainder of 2^-8 |x| or less."""
    if DT_ID == 0:
        return x
    elif DT_ID == 1:
        return x.to(tl.bfloat16).to(tl.float32)
    elif DT_ID == 3:
        return _rne_bf16(x)
    else:
        return x.to(tl.float16).to(tl.float32)


@triton.jit
def _mm_split_b(a, b, DT_ID: tl.constexpr):
    """a @ b for an fp32 `b` (a carried sum) and `a` in the input dtype: with bf16 inputs b = hi + lo, both rounded to
    bf16, in two tensor-core products (about 16 mantissa bits of b, against 8 when b is rounded once). fp16 keeps
    one product (10 bits; its range would not hold every remainder), fp32 one IEEE product."""
    if DT_ID == 1 or DT_ID == 3:
        b_hi = _hi(b, DT_ID)
        return _mm(a, b_hi, DT_ID) + _mm(a, b - b_hi, DT_ID)
    else:
        return _mm(a, b, DT_ID)


@triton.jit
def _mm_split_a(a, b, DT_ID: tl.constexpr):
    """a @ b for an fp32 `a` and `b` in the input dtype: `a` split as in _mm_split_b."""
    if DT_ID == 1 or DT_ID == 3:
        a_hi = _hi(a, DT_ID)
        return _mm(a_hi, b, DT_ID) + _mm(a - a_hi, b, DT_ID)
    else:
        return _mm(a, b, DT_ID)


@triton.jit
def _mm_hilo(a, b, a_lo, b_lo, DT_ID: tl.constexpr):
    """a @ b plus, with bf16 inputs, the remainder's product a_lo @ b_lo: an fp32 operand kept as its two input-dtype
    halves (hi + lo) in memory, so that it reaches the products without an fp32 tile."""
    if DT_ID == 1 or DT_ID == 3:
        return _mm(a, b, DT_ID) + _mm(a_lo, b_lo, DT_ID)
    else:
        return _mm(a, b, DT_ID)


@triton.jit
def chunk_bwd_curvature_query_kernel(
    p_lam, n0, aqc_buf, mn_buf, ms_buf, sh_buf, sl_buf, corr_buf, cn_buf, aq_buf, alam_buf, pn_k, cu_seqlens,
    chunk_indices, TT, H: tl.constexpr, HV: tl.constexpr, G: tl.constexpr, DK: tl.constexpr, BT: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, DT_ID: tl.constexpr, NKC: tl.constexpr,
):
    tl.static_assert(DK <= 2 * BK, "the curvature pass holds at most 2 key blocks: BK too small for dk")
    i_cb = tl.program_id(0)
    i_c = tl.program_id(1)
    i_h = tl.program_id(2)
    i_n = tl.load(chunk_indices + i_c * 2)
    i_tc = tl.load(chunk_indices + i_c * 2 + 1)
    bos = tl.load(cu_seqlens + i_n).to(tl.int64)
    eos = tl.load(cu_seqlens + i_n + 1).to(tl.int64)
    t0 = bos + i_tc * BT
    o_t = tl.arange(0, BT)
    rows = t0 + o_t
    m_r = rows < eos
    o_kb = tl.arange(0, BK)
    o_c = i_cb * BV + tl.arange(0, BV)
    m_c = o_c < DK
    m_rc = m_r[:, None] & m_c[None, :]
    p_cn = cn_buf + (((i_c - i_tc + i_n) // 2 + i_tc // 2) * H + i_h).to(tl.int64) * DK * DK
    odd = i_tc % 2 == 1
    rows_p = rows - BT
    m_p = o_t + (i_tc % 2) * BT >= BT  # all rows of an odd chunk's predecessor, none of an even one's
    m_le = o_t[:, None] >= o_t[None, :]
    p_mn = mn_buf + (i_c * H + i_h) * DK
    _b_kc_k = tl.load(pn_k + (rows[:, None] * H + i_h) * DK + o_c[None, :], mask=m_r[:, None] & m_c[None, :], other=0.)
    b_kc = _b_kc_k
    _b_kpc_k = tl.load(pn_k + (rows_p[:, None] * H + i_h) * DK + o_c[None, :], mask=m_p[:, None] & m_c[None, :], other=0.)
    b_kpc = _b_kpc_k
    b_tau = tl.load(n0 + i_n) + (i_tc * BT + o_t + 1).to(tl.float32)
    # corr as the forward formed it (kept for a training step: compiler/plan.py, rule_curvature_query)
    b_corr = tl.load(corr_buf + (rows[:, None] * H + i_h) * DK + o_c[None, :], mask=m_rc, other=0.)
    # dλ's partial sum over these columns, and S[:, cols]
    b_Sc = tl.zeros([BT, BV], dtype=tl.float32)
    for i_g in tl.static_range(G):
        i_hv = i_h * G + i_g
        _b_lam_lam = tl.load(p_lam + rows * HV + i_hv, mask=m_r, other=0.).to(tl.float32)
        b_lam = _b_lam_lam
        b_gc = tl.load(aq_buf + (rows[:, None] * HV + i_hv) * DK + o_c[None, :], mask=m_rc, other=0.)
        b_Sc += tl.where(m_r, b_lam / b_tau, 0.)[:, None] * b_gc
        tl.store(alam_buf + ((i_hv * NKC + i_cb) * TT + t0) + o_t, -tl.sum(b_gc * b_corr, 1), mask=m_r)
    # S[:, cols] for the later passes as two input-dtype halves, hi + lo (about 16 mantissa bits with bf16)
    b_sh = _hi(b_Sc, DT_ID)
    tl.store(sh_buf + (rows[:, None] * H + i_h) * DK + o_c[None, :], _cast_for(b_sh, sh_buf, DT_ID), mask=m_rc)
    tl.store(sl_buf + (rows[:, None] * H + i_h) * DK + o_c[None, :], _cast_for(b_Sc - b_sh, sl_buf, DT_ID), mask=m_rc)
    # S = Σ_hv (λ_hv/τ) G_hv one key block at a time: its share of S C_n, tril(S Kᵀ) and mᵀS (whole key rows)
    o_k = o_kb
    m_k = o_k < DK
    b_S = tl.zeros([BT, BK], dtype=tl.float32)
    for i_g in tl.static_range(G):
        i_hv = i_h * G + i_g
        _b_lam_lam = tl.load(p_lam + rows * HV + i_hv, mask=m_r, other=0.).to(tl.float32)
        b_lam = _b_lam_lam
        b_g = tl.load(aq_buf + (rows[:, None] * HV + i_hv) * DK + o_k[None, :], mask=m_r[:, None] & m_k[None, :], other=0.)
        b_S += tl.where(m_r, b_lam / b_tau, 0.)[:, None] * b_g
    _b_k_k = tl.load(pn_k + (rows[:, None] * H + i_h) * DK + o_k[None, :], mask=m_r[:, None] & m_k[None, :], other=0.)
    b_k = _b_k_k
    b_C = tl.load(p_cn + o_k[:, None] * DK + o_c[None, :], mask=m_k[:, None] & m_c[None, :], other=0.)
    if odd:  # C_n = C_{n-1} + K_{n-1}ᵀ K_{n-1}
        _b_kp_k = tl.load(pn_k + (rows_p[:, None] * H + i_h) * DK + o_k[None, :], mask=m_p[:, None] & m_k[None, :], other=0.)
        b_kp = _b_kp_k
        b_C += _mm(tl.trans(b_kp), b_kpc, DT_ID)
    b_PS = _mm(b_S, tl.trans(b_k), DT_ID)
    b_SC = _mm(b_S, b_C, DT_ID)
    b_ms = tl.sum(b_S * tl.load(p_mn + o_k, mask=m_k, other=0.)[None, :], 1)

    if DK > 1 * BK:
        o_k = 1 * BK + o_kb
        m_k = o_k < DK
        b_S = tl.zeros([BT, BK], dtype=tl.float32)
        for i_g in tl.static_range(G):
            i_hv = i_h * G + i_g
            _b_lam_lam = tl.load(p_lam + rows * HV + i_hv, mask=m_r, other=0.).to(tl.float32)
            b_lam = _b_lam_lam
            b_g = tl.load(aq_buf + (rows[:, None] * HV + i_hv) * DK + o_k[None, :], mask=m_r[:, None] & m_k[None, :], other=0.)
            b_S += tl.where(m_r, b_lam / b_tau, 0.)[:, None] * b_g
        _b_k_k = tl.load(pn_k + (rows[:, None] * H + i_h) * DK + o_k[None, :], mask=m_r[:, None] & m_k[None, :], other=0.)
        b_k = _b_k_k
        b_C = tl.load(p_cn + o_k[:, None] * DK + o_c[None, :], mask=m_k[:, None] & m_c[None, :], other=0.)
        if odd:  # C_n = C_{n-1} + K_{n-1}ᵀ K_{n-1}
            _b_kp_k = tl.load(pn_k + (rows_p[:, None] * H + i_h) * DK + o_k[None, :], mask=m_p[:, None] & m_k[None, :], other=0.)
            b_kp = _b_kp_k
            b_C += _mm(tl.trans(b_kp), b_kpc, DT_ID)
        b_PS += _mm(b_S, tl.trans(b_k), DT_ID)
        b_SC += _mm(b_S, b_C, DT_ID)
        b_ms += tl.sum(b_S * tl.load(p_mn + o_k, mask=m_k, other=0.)[None, :], 1)

    b_PS = tl.where(m_le, b_PS, 0.)
    b_dq = -(b_SC + _mm(b_PS, b_kc, DT_ID))
    b_ms += tl.sum(b_PS, 1)
    b_M = tl.load(p_mn + o_c, mask=m_c, other=0.)[None, :] + tl.cumsum(b_kc.to(tl.float32), axis=0)
    b_dq += (b_ms / b_tau)[:, None] * b_M
    if i_cb == 0:
        tl.store(ms_buf + rows * H + i_h, b_ms, mask=m_r)
    tl.store(aqc_buf + (rows[:, None] * H + i_h) * DK + o_c[None, :], b_dq, mask=m_rc)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda")
    dev = p.parse_args().device
    torch.manual_seed(0)
    p_lam = torch.empty_strided((1, 4096, 4), (16384, 4, 1), dtype=torch.bfloat16, device=dev).normal_()
    n0 = torch.empty_strided((1,), (1,), dtype=torch.float32, device=dev).normal_()
    aqc_buf = torch.empty_strided((2097152,), (1,), dtype=torch.float32, device=dev).normal_()
    mn_buf = torch.empty_strided((32768,), (1,), dtype=torch.float32, device=dev).normal_()
    ms_buf = torch.empty_strided((16384,), (1,), dtype=torch.float32, device=dev).normal_()
    sh_buf = torch.empty_strided((2097152,), (1,), dtype=torch.bfloat16, device=dev).normal_()
    sl_buf = torch.empty_strided((2097152,), (1,), dtype=torch.bfloat16, device=dev).normal_()
    corr_buf = torch.empty_strided((2097152,), (1,), dtype=torch.float32, device=dev).normal_()
    cn_buf = torch.empty_strided((2162688,), (1,), dtype=torch.float32, device=dev).normal_()
    aq_buf = torch.empty_strided((2097152,), (1,), dtype=torch.float32, device=dev).normal_()
    alam_buf = torch.empty_strided((65536,), (1,), dtype=torch.float32, device=dev).normal_()
    pn_k = torch.empty_strided((2097152,), (1,), dtype=torch.bfloat16, device=dev).normal_()
    cu_seqlens = torch.tensor([0, 4096], dtype=torch.int32, device=dev).reshape((2,))
    chunk_indices = torch.tensor([0, 0, 0, 1, 0, 2, 0, 3, 0, 4, 0, 5, 0, 6, 0, 7, 0, 8, 0, 9, 0, 10, 0, 11, 0, 12, 0, 13, 0, 14, 0, 15, 0, 16, 0, 17, 0, 18, 0, 19, 0, 20, 0, 21, 0, 22, 0, 23, 0, 24, 0, 25, 0, 26, 0, 27, 0, 28, 0, 29, 0, 30, 0, 31, 0, 32, 0, 33, 0, 34, 0, 35, 0, 36, 0, 37, 0, 38, 0, 39, 0, 40, 0, 41, 0, 42, 0, 43, 0, 44, 0, 45, 0, 46, 0, 47, 0, 48, 0, 49, 0, 50, 0, 51, 0, 52, 0, 53, 0, 54, 0, 55, 0, 56, 0, 57, 0, 58, 0, 59, 0, 60, 0, 61, 0, 62, 0, 63], dtype=torch.int32, device=dev).reshape((128,))
    chunk_bwd_curvature_query_kernel[(4, 64, 4)](
        TT=4096,
        H=4,
        HV=4,
        G=1,
        DK=128,
        BT=64,
        BK=64,
        BV=32,
        DT_ID=1,
        NKC=4,
        num_warps=4,
        num_stages=1,
        p_lam=p_lam,
        n0=n0,
        aqc_buf=aqc_buf,
        mn_buf=mn_buf,
        ms_buf=ms_buf,
        sh_buf=sh_buf,
        sl_buf=sl_buf,
        corr_buf=corr_buf,
        cn_buf=cn_buf,
        aq_buf=aq_buf,
        alam_buf=alam_buf,
        pn_k=pn_k,
        cu_seqlens=cu_seqlens,
        chunk_indices=chunk_indices,
    )
    if dev == "cuda":
        torch.cuda.synchronize()
    print("chunk_bwd_curvature_query_kernel: launch completed")


if __name__ == "__main__":
    main()
