"""
A Triton core for tost.py's CausalTSSA training path on GPUs: the numbers of its readable forward() lines,
equal to rounding (float64: within 1e-12), in four kernels instead of about ninety. Nothing here is new
math; read tost.py for that, and tost_fast.py for the CPU core this one mirrors.

Where it runs: CausalTSSA.forward enters here by the same one line that enters the CPU core, when
tost_fast.usable() says so: on CUDA, without a recurrent state, without active attention dropout, and only
if the environment says TOST_TRITON=1 (opt-in: it has not yet been measured on a GPU; docs/speed.md says
how to measure it). Its backward is first order only.

The design. The heads meet only in Pi's softmax over K at each token; everything else is per head. So one
program per (batch, head) walks the tokens in chunks of CHUNK, carrying the prefix sums Q, A, P from one
chunk to the next as the recurrent state carries them from token to token, and the softmax over the few
heads of each token runs in torch between two kernels:
    _energy:     Q_t = sum_{j<=t} w_j^2 and e_t = sum_i w_ti^2 / Q_ti              -> e (B, T, K)
    (torch)      Pi_t = softmax_k(temp_k (e_t + p b_{k,t}))
    _output:     A_t, P_t and y_t = -Pi_t w_t / (1 + A_t / (P_t + eps))          -> y (B, T, K, p)
The backward mirrors it: _grad_pi walks the chunks in reverse and gives dL/dPi of every head, torch takes
the softmax's backward across the heads (and the gradients of temp and b), and _grad_w walks in reverse
again for dL/dw. Each kernel recomputes the prefix sums of its chunk from the carries the forward kept at
chunk starts (2p + 1 numbers per head per chunk), so nothing of size (B, T, d) is saved but w itself.

Activations are loaded in their own dtype (bf16 under autocast) and every sum runs in float32 (float64 when
the activations are float64, for the tests). As in the CPU core, an exclusive or suffix sum is never formed
as a total minus a prefix, nor as an inclusive sum minus the token's own term (tost_fast.CausalCore says
why): Q_{t-1} and the sum over the later tokens t' > t are sums of the neighbouring tokens' terms, loaded
one row shifted.
"""

import torch
import triton
import triton.language as tl

CHUNK = 32      # tokens per chunk (a power of two); 64 spills registers in the backward on an H100 (p = 64)
WARPS = 8       # warps per program (with 4, _grad_w spills registers on an H100)
TINY = tl.constexpr(1e-12)    # Q_t's clamp, as in tost.py


@triton.jit
def _energy(w_ptr, e_ptr, qc_ptr, T, K, P, NC, C: tl.constexpr, BP: tl.constexpr):
    """e_t = sum_i w_ti^2 / max(Q_ti, TINY) for one (batch, head); keeps Q at each chunk's start."""
    b = tl.program_id(0)
    k = tl.program_id(1)
    rows = tl.arange(0, C)
    cols = tl.arange(0, BP)
    d = K * P
    dt = e_ptr.dtype.element_ty
    tiny = tl.full([1, BP], TINY, dt)
    Q = tl.zeros([BP], dt)
    for c in range(NC):
        t = c * C + rows
        inside = t < T
        m = inside[:, None] & (cols < P)[None, :]
        w = tl.load(w_ptr + b * T * d + t[:, None] * d + k * P + cols[None, :], mask=m, other=0).to(dt)
        tl.store(qc_ptr + ((b * K + k) * NC + c) * BP + cols, Q)
        w2 = w * w
        Qt = tl.cumsum(w2, 0) + Q[None, :]
        e = tl.sum(w2 / tl.maximum(Qt, tiny), 1)
        tl.store(e_ptr + (b * T + t) * K + k, e, mask=inside)
        Q += tl.sum(w2, 0)


@triton.jit
def _output(w_ptr, pi_ptr, y_ptr, ac_ptr, pc_ptr, T, K, P, NC, EPS: tl.constexpr, C: tl.constexpr,
            BP: tl.constexpr):
    """y_t = -Pi_t w_t D_t, D_t = (P_t + eps) / (A_t + P_t + eps), for one (batch, head); keeps A and P at
    each chunk's start."""
    b = tl.program_id(0)
    k = tl.program_id(1)
    rows = tl.arange(0, C)
    cols = tl.arange(0, BP)
    d = K * P
    dt = pi_ptr.dtype.element_ty
    eps = tl.full([C], EPS, dt)
    A = tl.zeros([BP], dt)
    Ps = tl.sum(tl.zeros([BP], dt), 0)
    for c in range(NC):
        t = c * C + rows
        inside = t < T
        m = inside[:, None] & (cols < P)[None, :]
        at = b * T * d + t[:, None] * d + k * P + cols[None, :]
        w = tl.load(w_ptr + at, mask=m, other=0).to(dt)
        pi = tl.load(pi_ptr + (b * T + t) * K + k, mask=inside, other=0)
        tl.store(ac_ptr + ((b * K + k) * NC + c) * BP + cols, A)
        tl.store(pc_ptr + (b * K + k) * NC + c, Ps)
        pw2 = pi[:, None] * (w * w)
        At = tl.cumsum(pw2, 0) + A[None, :]
        Pe = tl.cumsum(pi, 0) + Ps + eps
        D = Pe[:, None] / (At + Pe[:, None])
        y = -pi[:, None] * w * D
        _store(y_ptr + at, y, m)
        A += tl.sum(pw2, 0)
        Ps += tl.sum(pi, 0)


@triton.jit
def _grad_pi(w_ptr, g_ptr, pi_ptr, ac_ptr, pc_ptr, gpi_ptr, T, K, P, NC, EPS: tl.constexpr,
             C: tl.constexpr, BP: tl.constexpr):
    """dL/dPi_t for one (batch, head), the chunks in reverse: via y_t directly, via A_t' and P_t' of every
    t' >= t (suffix sums of their adjoints, carried from the later chunks)."""
    b = tl.program_id(0)
    k = tl.program_id(1)
    rows = tl.arange(0, C)
    cols = tl.arange(0, BP)
    d = K * P
    dt = pi_ptr.dtype.element_ty
    eps = tl.full([C], EPS, dt)
    SA = tl.zeros([BP], dt)
    SP = tl.sum(tl.zeros([BP], dt), 0)
    for j in range(NC):
        c = NC - 1 - j
        t = c * C + rows
        inside = t < T
        m = inside[:, None] & (cols < P)[None, :]
        at = b * T * d + t[:, None] * d + k * P + cols[None, :]
        w = tl.load(w_ptr + at, mask=m, other=0).to(dt)
        g = tl.load(g_ptr + at, mask=m, other=0).to(dt)
        pi = tl.load(pi_ptr + (b * T + t) * K + k, mask=inside, other=0)
        A = tl.load(ac_ptr + ((b * K + k) * NC + c) * BP + cols)
        Ps = tl.load(pc_ptr + (b * K + k) * NC + c)
        w2 = w * w
        At = tl.cumsum(pi[:, None] * w2, 0) + A[None, :]
        Pe = tl.cumsum(pi, 0) + Ps + eps
        D = Pe[:, None] / (At + Pe[:, None])
        gwD = g * w * D
        # dL/dA_t = Pi g w D^2 / Pe_t;  dL/dPe_t = -sum_i dL/dA_t A_t / Pe_t
        GA = gwD * D * (pi / Pe)[:, None]
        GP = -tl.sum(GA * At, 1) / Pe
        RA = tl.cumsum(GA, 0, reverse=True) + SA[None, :]
        RP = tl.cumsum(GP, 0, reverse=True) + SP
        gpi = tl.sum(RA * w2, 1) + RP - tl.sum(gwD, 1)
        tl.store(gpi_ptr + (b * T + t) * K + k, gpi, mask=inside)
        SA += tl.sum(GA, 0)
        SP += tl.sum(GP, 0)


@triton.jit
def _grad_w(w_ptr, g_ptr, pi_ptr, de_ptr, qc_ptr, ac_ptr, pc_ptr, gw_ptr, T, K, P, NC, EPS: tl.constexpr,
            C: tl.constexpr, BP: tl.constexpr):
    """dL/dw_t for one (batch, head), the chunks in reverse, given dL/de_t of every token (de)."""
    b = tl.program_id(0)
    k = tl.program_id(1)
    rows = tl.arange(0, C)
    cols = tl.arange(0, BP)
    d = K * P
    dt = pi_ptr.dtype.element_ty
    eps = tl.full([C], EPS, dt)
    tiny = tl.full([1, BP], TINY, dt)
    SA = tl.zeros([BP], dt)
    SQ = tl.zeros([BP], dt)
    for j in range(NC):
        c = NC - 1 - j
        t = c * C + rows
        inside = t < T
        m = inside[:, None] & (cols < P)[None, :]
        at = b * T * d + t[:, None] * d + k * P + cols[None, :]
        w = tl.load(w_ptr + at, mask=m, other=0).to(dt)
        g = tl.load(g_ptr + at, mask=m, other=0).to(dt)
        pi = tl.load(pi_ptr + (b * T + t) * K + k, mask=inside, other=0)
        de = tl.load(de_ptr + (b * T + t) * K + k, mask=inside, other=0)
        Q = tl.load(qc_ptr + ((b * K + k) * NC + c) * BP + cols)
        A = tl.load(ac_ptr + ((b * K + k) * NC + c) * BP + cols)
        Ps = tl.load(pc_ptr + (b * K + k) * NC + c)
        w2 = w * w
        At = tl.cumsum(pi[:, None] * w2, 0) + A[None, :]
        Pe = tl.cumsum(pi, 0) + Ps + eps
        D = Pe[:, None] / (At + Pe[:, None])
        GA = g * w * D * D * (pi / Pe)[:, None]
        RA = tl.cumsum(GA, 0, reverse=True) + SA[None, :]
        Qt = tl.cumsum(w2, 0) + Q[None, :]
        Qc = tl.maximum(Qt, tiny)
        # The token's own w_t^2 enters e_t twice, as w_t^2 / Q_t and through Q_t: together de_t Q_{t-1} / Q_t^2,
        # with Q_{t-1} summed from the previous tokens (loaded one row back), never Q_t - w_t^2.
        # Where Q_t is clamped, e_t = w_t^2 / TINY and Q_t passes nothing back.
        mp = m & (rows > 0)[:, None]
        wp = tl.load(w_ptr + at - d, mask=mp, other=0).to(dt)
        Qp = tl.cumsum(wp * wp, 0) + Q[None, :]
        own = tl.where(Qt <= tiny, Qc, Qp) / Qc / Qc
        # via Q_t' of the later tokens t' > t of this chunk: their terms -de_t' w_t'^2 / Q_t'^2, loaded one
        # row ahead and summed from the end (Q_t' = Q_t + w_t'^2 for t' = t + 1), plus the later chunks' SQ
        nxt = (t + 1 < T) & (rows < C - 1)
        mn = nxt[:, None] & (cols < P)[None, :]
        wn = tl.load(w_ptr + at + d, mask=mn, other=0).to(dt)
        den = tl.load(de_ptr + (b * T + t + 1) * K + k, mask=nxt, other=0)
        wn2 = wn * wn
        Qn = Qt + wn2
        Qnc = tl.maximum(Qn, tiny)
        gQn = tl.where(Qn <= tiny, 0, -den[:, None] * wn2 / Qnc / Qnc)
        later = tl.cumsum(gQn, 0, reverse=True) + SQ[None, :]
        gw2 = RA * pi[:, None] + de[:, None] * own + later
        gw = 2 * w * gw2 - pi[:, None] * g * D
        _store(gw_ptr + at, gw, m)
        gQ = tl.where(Qt <= tiny, 0, -de[:, None] * w2 / Qc / Qc)
        SQ += tl.sum(gQ, 0)
        SA += tl.sum(GA, 0)


@triton.jit
def _store(ptr, x, mask):
    """Store x in ptr's dtype. To bf16 (under autocast) it is rounded to nearest even by hand, so that the
    conversion is exact: the GPU rounds so too, but Triton's interpreter would truncate."""
    if ptr.dtype.element_ty == tl.bfloat16:
        bits = x.to(tl.float32).to(tl.uint32, bitcast=True)
        bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
        x = tl.where(x != x, x, bits.to(tl.float32, bitcast=True))        # NaN stays NaN
    tl.store(ptr, x, mask=mask)


def _layout(w, chunk):
    B, T, K, P = w.shape
    return B, T, K, P, triton.cdiv(T, chunk), triton.next_power_of_2(P)


def _stat_dtype(w):
    return torch.float64 if w.dtype == torch.float64 else torch.float32


@torch.library.custom_op('tost::causal_tssa_forward', mutates_args=())
def forward(w: torch.Tensor, temp: torch.Tensor, pb: torch.Tensor, eps: float,
            chunk: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                 torch.Tensor]:
    """w: (B, T, K, p) contiguous, any float dtype; temp: (K,), pb: (T, K) = p b_{k,t}, in the statistics'
    dtype -> y (B, T, K, p) in w's dtype, and for the backward Pi and e (B, T, K) and the carries."""
    B, T, K, P, NC, BP = _layout(w, chunk)
    dt = _stat_dtype(w)
    e = w.new_empty(B, T, K, dtype=dt)
    qc = w.new_empty(B, K, NC, BP, dtype=dt)
    _energy[(B, K)](w, e, qc, T, K, P, NC, C=chunk, BP=BP, num_warps=WARPS)
    pi = torch.softmax(temp * (e + pb), -1).contiguous()
    y = torch.empty_like(w)
    ac = torch.empty_like(qc)
    pc = w.new_empty(B, K, NC, dtype=dt)
    _output[(B, K)](w, pi, y, ac, pc, T, K, P, NC, EPS=eps, C=chunk, BP=BP, num_warps=WARPS)
    return y, pi, e, qc, ac, pc


@forward.register_fake
def _(w, temp, pb, eps, chunk):
    B, T, K, P, NC, BP = _layout(w, chunk)
    dt = _stat_dtype(w)
    stats = w.new_empty(B, K, NC, BP, dtype=dt)
    return (torch.empty_like(w), w.new_empty(B, T, K, dtype=dt), w.new_empty(B, T, K, dtype=dt), stats,
            torch.empty_like(stats), w.new_empty(B, K, NC, dtype=dt))


@torch.library.custom_op('tost::causal_tssa_backward', mutates_args=())
def backward(g: torch.Tensor, w: torch.Tensor, temp: torch.Tensor, pb: torch.Tensor, pi: torch.Tensor,
             e: torch.Tensor, qc: torch.Tensor, ac: torch.Tensor, pc: torch.Tensor, eps: float,
             chunk: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dL/dy -> dL/dw, dL/dtemp, dL/dpb."""
    B, T, K, P, NC, BP = _layout(w, chunk)
    g = g.contiguous()
    gpi = torch.empty_like(e)
    _grad_pi[(B, K)](w, g, pi, ac, pc, gpi, T, K, P, NC, EPS=eps, C=chunk, BP=BP, num_warps=WARPS)
    # the softmax over the heads, backward: the only step that needs every head's dL/dPi at a token
    dl = pi * (gpi - (pi * gpi).sum(-1, keepdim=True))
    de = (dl * temp).contiguous()
    gw = torch.empty_like(w)
    _grad_w[(B, K)](w, g, pi, de, qc, ac, pc, gw, T, K, P, NC, EPS=eps, C=chunk, BP=BP, num_warps=WARPS)
    return gw, (dl * (e + pb)).sum((0, 1)), de.sum(0)


@backward.register_fake
def _(g, w, temp, pb, pi, e, qc, ac, pc, eps, chunk):
    return torch.empty_like(w), torch.empty_like(temp), torch.empty_like(pb)


def _setup_context(ctx, inputs, output):
    w, temp, pb, eps, chunk = inputs
    ctx.save_for_backward(w, temp, pb, *output[1:])
    ctx.eps = eps
    ctx.chunk = chunk


def _backward(ctx, gy, *unused):
    # the other outputs are kept for this backward only: causal_tssa() returns y alone
    gw, gtemp, gpb = backward(gy, *ctx.saved_tensors, ctx.eps, ctx.chunk)
    return gw, gtemp, gpb, None, None


forward.register_autograd(_backward, setup_context=_setup_context)


def causal_tssa(layer, x):
    """c_proj(core(c_attn(x))): CausalTSSA.forward without a state, on the Triton core. x: (B, T, d)."""
    B, T, d = x.shape
    w = layer.c_attn(x).view(B, T, layer.n_head, layer.head_dim)          # (B, T, K, p), no copy
    dt = _stat_dtype(w)
    temp = layer.temp.view(-1).to(dt)                                      # (K,)
    pb = (layer.head_dim * layer.pos_bias[:, :T]).t().to(dt).contiguous()  # (T, K)  p * b_{k,t}
    y = forward(w.contiguous(), temp, pb, layer.eps, CHUNK)[0]
    return layer.resid_dropout(layer.c_proj(y.view(B, T, d)))
