"""
A Triton core for tost.py's CausalTSSA training path on GPUs: the numbers of its readable forward() lines,
equal to rounding (float64: within 1e-12), in eight kernels instead of about ninety. Nothing here is new
math; read tost.py for that, and tost_fast.py for the CPU core this one mirrors.

Where it runs: CausalTSSA.forward enters here by the same one line that enters the CPU core, when
tost_fast.usable() says so: on CUDA, without a recurrent state, without active attention dropout, and only
if the environment says TOST_TRITON=1 (opt-in: it has not yet been measured on a GPU; docs/speed.md says
how to measure it). Its backward is first order only.

The design. The tokens are cut into chunks of CHUNK, and one program takes one chunk of one head of one
sequence, so a single long sequence still fills the GPU. A prefix sum over the tokens is then two passes:
one kernel sums each chunk, torch sums the chunks before each chunk (a small (B, K, chunks, p) tensor), and
the next kernel adds that to the prefix sum inside its chunk. The heads meet only in Pi's softmax over K at
each token, which runs in torch between the kernels:
    _sum_squares, _energy:      Q_t = sum_{j<=t} w_j^2 and e_t = sum_i w_ti^2 / Q_ti     -> e (B, T, K)
    (torch)                     Pi_t = softmax_k(temp_k (e_t + p b_{k,t}))
    _sum_memberships, _output:  A_t, P_t, y_t = -Pi_t w_t / (1 + A_t / (P_t + eps))     -> y (B, T, K, p)
The backward mirrors it, with suffix sums (a prefix sum's adjoint): _sum_adjoints and _grad_pi give dL/dPi
of every head; torch takes the softmax's backward across the heads (and the gradients of temp and b);
_sum_q_adjoints and _grad_w give dL/dw. Each kernel recomputes what it needs inside its chunk from the
sums of the other chunks the forward kept, so nothing of size (B, T, d) is saved but w itself.

Activations are loaded in their own dtype (bf16 under autocast) and every sum runs in float32 (float64 when
the activations are float64, for the tests). As in the CPU core, an exclusive or suffix sum is never formed
as a total minus a prefix, nor as an inclusive sum minus the token's own term (tost_fast.CausalCore says
why): the sums of the earlier or later chunks are prefix sums of the chunks' sums, and Q_{t-1} and the sum
over the later tokens t' > t of a chunk are sums of the neighbouring tokens' terms, loaded one row shifted.
"""

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

CHUNK = 32      # tokens per program (a power of two); 64 spills registers in _grad_w on an H100 (p = 64)
WARPS = 8       # warps per program (with 4, _grad_w spills registers on an H100)
TINY = tl.constexpr(1e-12)    # Q_t's clamp, as in tost.py


@triton.jit
def _tile(T, K, P, C: tl.constexpr, BP: tl.constexpr):
    """This program's chunk c of head k of sequence b: its C tokens t, the offsets of its (C, BP) tile in a
    (B, T, K, p) tensor (`at`), of its tokens in a (B, T, K) one (`tok`), of its row of p numbers in a
    (B, K, NC, BP) tensor of per-chunk sums (`sums`) and of its one number in a (B, K, NC) one (`chunk`)."""
    c = tl.program_id(0)
    k = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    rows = tl.arange(0, C)
    cols = tl.arange(0, BP)
    t = c * C + rows
    inside = t < T
    m = inside[:, None] & (cols < P)[None, :]
    at = (b * T + t[:, None]) * (K * P) + k * P + cols[None, :]
    tok = (b * T + t) * K + k
    chunk = (b * K + k) * tl.num_programs(0) + c
    return rows, t, inside, m, at, tok, chunk * BP + cols, chunk


@triton.jit
def _weights(w2, pi, ac_ptr, pc_ptr, sums, chunk, EPS: tl.constexpr, C: tl.constexpr):
    """A_t, P_t + eps and D_t = (P_t + eps) / (A_t + P_t + eps) of the chunk's tokens, from the sums of the
    earlier chunks (ac, pc)."""
    At = tl.cumsum(pi[:, None] * w2, 0) + tl.load(ac_ptr + sums)[None, :]
    Pe = tl.cumsum(pi, 0) + tl.load(pc_ptr + chunk) + tl.full([C], EPS, pi.dtype)
    D = Pe[:, None] / (At + Pe[:, None])
    return At, Pe, D


@triton.jit
def _squares(w2, qc_ptr, sums, BP: tl.constexpr):
    """Q_t of the chunk's tokens from the earlier chunks' sum Q (qc) and the chunk's own prefix sum; Q_t
    clamped at TINY, and where it is."""
    Q = tl.load(qc_ptr + sums)
    Qt = tl.cumsum(w2, 0) + Q[None, :]
    tiny = tl.full([1, BP], TINY, w2.dtype)
    return Q, Qt, tl.maximum(Qt, tiny), Qt <= tiny


@triton.jit
def _sum_squares(w_ptr, tq_ptr, T, K, P, C: tl.constexpr, BP: tl.constexpr):
    """Per chunk: sum_t w_t^2, p numbers."""
    rows, t, inside, m, at, tok, sums, chunk = _tile(T, K, P, C, BP)
    w = tl.load(w_ptr + at, mask=m, other=0).to(tq_ptr.dtype.element_ty)
    tl.store(tq_ptr + sums, tl.sum(w * w, 0))


@triton.jit
def _energy(w_ptr, qc_ptr, e_ptr, T, K, P, C: tl.constexpr, BP: tl.constexpr):
    """e_t = sum_i w_ti^2 / max(Q_ti, TINY)."""
    rows, t, inside, m, at, tok, sums, chunk = _tile(T, K, P, C, BP)
    w = tl.load(w_ptr + at, mask=m, other=0).to(e_ptr.dtype.element_ty)
    w2 = w * w
    Q, Qt, Qc, clamped = _squares(w2, qc_ptr, sums, BP)
    tl.store(e_ptr + tok, tl.sum(w2 / Qc, 1), mask=inside)


@triton.jit
def _sum_memberships(w_ptr, pi_ptr, ta_ptr, tp_ptr, T, K, P, C: tl.constexpr, BP: tl.constexpr):
    """Per chunk: sum_t Pi_t w_t^2 (p numbers) and sum_t Pi_t."""
    rows, t, inside, m, at, tok, sums, chunk = _tile(T, K, P, C, BP)
    dt = pi_ptr.dtype.element_ty
    w = tl.load(w_ptr + at, mask=m, other=0).to(dt)
    pi = tl.load(pi_ptr + tok, mask=inside, other=0)
    tl.store(ta_ptr + sums, tl.sum(pi[:, None] * (w * w), 0))
    tl.store(tp_ptr + chunk, tl.sum(pi, 0))


@triton.jit
def _output(w_ptr, pi_ptr, ac_ptr, pc_ptr, y_ptr, T, K, P, EPS: tl.constexpr, C: tl.constexpr,
            BP: tl.constexpr):
    """y_t = -Pi_t w_t D_t."""
    rows, t, inside, m, at, tok, sums, chunk = _tile(T, K, P, C, BP)
    w = tl.load(w_ptr + at, mask=m, other=0).to(pi_ptr.dtype.element_ty)
    pi = tl.load(pi_ptr + tok, mask=inside, other=0)
    At, Pe, D = _weights(w * w, pi, ac_ptr, pc_ptr, sums, chunk, EPS, C)
    _store(y_ptr + at, -pi[:, None] * w * D, m)


@triton.jit
def _adjoints(w_ptr, g_ptr, pi_ptr, ac_ptr, pc_ptr, T, K, P, EPS: tl.constexpr, C: tl.constexpr,
              BP: tl.constexpr):
    """The chunk's w, w^2, g, Pi, D and the adjoints of A_t and P_t:
    dL/dA_t = Pi_t g_t w_t D_t^2 / Pe_t (p numbers), dL/dPe_t = -sum_i dL/dA_ti A_ti / Pe_t."""
    rows, t, inside, m, at, tok, sums, chunk = _tile(T, K, P, C, BP)
    dt = pi_ptr.dtype.element_ty
    w = tl.load(w_ptr + at, mask=m, other=0).to(dt)
    g = tl.load(g_ptr + at, mask=m, other=0).to(dt)
    pi = tl.load(pi_ptr + tok, mask=inside, other=0)
    w2 = w * w
    At, Pe, D = _weights(w2, pi, ac_ptr, pc_ptr, sums, chunk, EPS, C)
    GA = g * w * D * D * (pi / Pe)[:, None]
    GP = -tl.sum(GA * At, 1) / Pe
    return w, w2, g, pi, D, GA, GP


@triton.jit
def _sum_adjoints(w_ptr, g_ptr, pi_ptr, ac_ptr, pc_ptr, tA_ptr, tP_ptr, T, K, P, EPS: tl.constexpr,
                  C: tl.constexpr, BP: tl.constexpr):
    """Per chunk: sum_t dL/dA_t (p numbers) and sum_t dL/dPe_t."""
    rows, t, inside, m, at, tok, sums, chunk = _tile(T, K, P, C, BP)
    w, w2, g, pi, D, GA, GP = _adjoints(w_ptr, g_ptr, pi_ptr, ac_ptr, pc_ptr, T, K, P, EPS, C, BP)
    tl.store(tA_ptr + sums, tl.sum(GA, 0))
    tl.store(tP_ptr + chunk, tl.sum(GP, 0))


@triton.jit
def _grad_pi(w_ptr, g_ptr, pi_ptr, ac_ptr, pc_ptr, sa_ptr, sp_ptr, gpi_ptr, T, K, P, EPS: tl.constexpr,
             C: tl.constexpr, BP: tl.constexpr):
    """dL/dPi_t: via y_t directly, and via A_t' and P_t' of every t' >= t (suffix sums of their adjoints:
    this chunk's from its end, plus the later chunks' sums sa, sp)."""
    rows, t, inside, m, at, tok, sums, chunk = _tile(T, K, P, C, BP)
    w, w2, g, pi, D, GA, GP = _adjoints(w_ptr, g_ptr, pi_ptr, ac_ptr, pc_ptr, T, K, P, EPS, C, BP)
    RA = tl.cumsum(GA, 0, reverse=True) + tl.load(sa_ptr + sums)[None, :]
    RP = tl.cumsum(GP, 0, reverse=True) + tl.load(sp_ptr + chunk)
    gpi = tl.sum(RA * w2, 1) + RP - tl.sum(g * w * D, 1)
    tl.store(gpi_ptr + tok, gpi, mask=inside)


@triton.jit
def _sum_q_adjoints(w_ptr, de_ptr, qc_ptr, tq_ptr, T, K, P, C: tl.constexpr, BP: tl.constexpr):
    """Per chunk: the sum of the adjoints of Q_t, -de_t w_t^2 / Q_t^2 (0 where clamped), p numbers."""
    rows, t, inside, m, at, tok, sums, chunk = _tile(T, K, P, C, BP)
    w = tl.load(w_ptr + at, mask=m, other=0).to(de_ptr.dtype.element_ty)
    de = tl.load(de_ptr + tok, mask=inside, other=0)
    w2 = w * w
    Q, Qt, Qc, clamped = _squares(w2, qc_ptr, sums, BP)
    tl.store(tq_ptr + sums, tl.sum(tl.where(clamped, 0, -de[:, None] * w2 / Qc / Qc), 0))


@triton.jit
def _grad_w(w_ptr, g_ptr, pi_ptr, de_ptr, qc_ptr, ac_ptr, pc_ptr, sa_ptr, sq_ptr, gw_ptr, T, K, P,
            EPS: tl.constexpr, C: tl.constexpr, BP: tl.constexpr):
    """dL/dw_t, given dL/de_t of every token (de) and the later chunks' sums of the adjoints (sa, sq)."""
    rows, t, inside, m, at, tok, sums, chunk = _tile(T, K, P, C, BP)
    w, w2, g, pi, D, GA, GP = _adjoints(w_ptr, g_ptr, pi_ptr, ac_ptr, pc_ptr, T, K, P, EPS, C, BP)
    RA = tl.cumsum(GA, 0, reverse=True) + tl.load(sa_ptr + sums)[None, :]
    Q, Qt, Qc, clamped = _squares(w2, qc_ptr, sums, BP)
    de = tl.load(de_ptr + tok, mask=inside, other=0)
    dt = pi_ptr.dtype.element_ty
    d = K * P
    # The token's own w_t^2 enters e_t twice, as w_t^2 / Q_t and through Q_t: together de_t Q_{t-1} / Q_t^2,
    # Q_{t-1} summed from the previous tokens (loaded one row back), never Q_t - w_t^2. Where Q_t is
    # clamped, e_t = w_t^2 / TINY and Q_t passes nothing back.
    wp = tl.load(w_ptr + at - d, mask=m & (rows > 0)[:, None], other=0).to(dt)
    Qp = tl.cumsum(wp * wp, 0) + Q[None, :]
    own = tl.where(clamped, Qc, Qp) / Qc / Qc
    # Via Q_t' of the later tokens t' > t: this chunk's terms loaded one row ahead (Q_{t+1} = Q_t + w_{t+1}^2)
    # and summed from its end, plus the later chunks' sum sq.
    ahead = (rows < C - 1) & (t + 1 < T)
    wn = tl.load(w_ptr + at + d, mask=m & ahead[:, None], other=0).to(dt)
    den = tl.load(de_ptr + tok + K, mask=ahead, other=0)
    wn2 = wn * wn
    Qn = Qt + wn2
    tiny = tl.full([1, BP], TINY, dt)
    Qnc = tl.maximum(Qn, tiny)
    later = tl.cumsum(tl.where(Qn <= tiny, 0, -den[:, None] * wn2 / Qnc / Qnc), 0, reverse=True)
    gw2 = RA * pi[:, None] + de[:, None] * own + later + tl.load(sq_ptr + sums)[None, :]
    _store(gw_ptr + at, 2 * w * gw2 - pi[:, None] * g * D, m)


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


def _before(x):
    """Per chunk (dim 2 of (B, K, NC, BP)), the sum of the earlier chunks' x: a prefix sum of the chunks
    before, never a total minus a prefix."""
    return F.pad(x[:, :, :-1].cumsum(2), (0, 0, 1, 0))


def _after(x):
    """Per chunk (dim 2), the sum of the later chunks' x, summed from the end."""
    return F.pad(x[:, :, 1:].flip(2).cumsum(2).flip(2), (0, 0, 0, 1))


@torch.library.custom_op('tost::causal_tssa_forward', mutates_args=())
def forward(w: torch.Tensor, temp: torch.Tensor, pb: torch.Tensor, eps: float,
            chunk: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                 torch.Tensor]:
    """w: (B, T, K, p) contiguous, any float dtype; temp: (K,), pb: (T, K) = p b_{k,t}, in the statistics'
    dtype -> y (B, T, K, p) in w's dtype, and for the backward Pi and e (B, T, K) and the sums of the chunks
    before each chunk: of w^2 (qc) and Pi w^2 (ac), (B, K, NC, BP), and of Pi (pc), (B, K, NC)."""
    B, T, K, P, NC, BP = _layout(w, chunk)
    dt = _stat_dtype(w)
    grid = (NC, K, B)
    shape = dict(C=chunk, BP=BP, num_warps=WARPS)
    sums = w.new_empty(B, K, NC, BP, dtype=dt)
    _sum_squares[grid](w, sums, T, K, P, **shape)
    qc = _before(sums)
    e = w.new_empty(B, T, K, dtype=dt)
    _energy[grid](w, qc, e, T, K, P, **shape)
    # the softmax over the heads: the only step that needs every head's e_t at a token
    pi = torch.softmax(temp * (e + pb), -1).contiguous()
    sum_pi = w.new_empty(B, K, NC, dtype=dt)
    _sum_memberships[grid](w, pi, sums, sum_pi, T, K, P, **shape)
    ac = _before(sums)
    pc = _before(sum_pi.unsqueeze(-1)).squeeze(-1).contiguous()
    y = torch.empty_like(w)
    _output[grid](w, pi, ac, pc, y, T, K, P, EPS=eps, **shape)
    return y, pi, e, qc, ac, pc


@forward.register_fake
def _(w, temp, pb, eps, chunk):
    B, T, K, P, NC, BP = _layout(w, chunk)
    dt = _stat_dtype(w)
    sums = w.new_empty(B, K, NC, BP, dtype=dt)
    return (torch.empty_like(w), w.new_empty(B, T, K, dtype=dt), w.new_empty(B, T, K, dtype=dt), sums,
            torch.empty_like(sums), w.new_empty(B, K, NC, dtype=dt))


@torch.library.custom_op('tost::causal_tssa_backward', mutates_args=())
def backward(g: torch.Tensor, w: torch.Tensor, temp: torch.Tensor, pb: torch.Tensor, pi: torch.Tensor,
             e: torch.Tensor, qc: torch.Tensor, ac: torch.Tensor, pc: torch.Tensor, eps: float,
             chunk: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dL/dy -> dL/dw, dL/dtemp, dL/dpb."""
    B, T, K, P, NC, BP = _layout(w, chunk)
    grid = (NC, K, B)
    shape = dict(C=chunk, BP=BP, num_warps=WARPS)
    g = g.contiguous()
    sums = torch.empty_like(qc)
    sum_p = torch.empty_like(pc)
    _sum_adjoints[grid](w, g, pi, ac, pc, sums, sum_p, T, K, P, EPS=eps, **shape)
    sa = _after(sums)
    sp = _after(sum_p.unsqueeze(-1)).squeeze(-1).contiguous()
    gpi = torch.empty_like(e)
    _grad_pi[grid](w, g, pi, ac, pc, sa, sp, gpi, T, K, P, EPS=eps, **shape)
    # the softmax over the heads, backward: the only step that needs every head's dL/dPi at a token
    dl = pi * (gpi - (pi * gpi).sum(-1, keepdim=True))
    de = (dl * temp).contiguous()
    _sum_q_adjoints[grid](w, de, qc, sums, T, K, P, **shape)
    sq = _after(sums)
    gw = torch.empty_like(w)
    _grad_w[grid](w, g, pi, de, qc, ac, pc, sa, sq, gw, T, K, P, EPS=eps, **shape)
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
