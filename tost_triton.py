"""
A Triton core for tost.py's CausalTSSA training path on GPUs: the numbers of its readable forward() lines,
equal to rounding (float64: within 1e-12), in eight kernels instead of about ninety. Nothing here is new
math; read tost.py for that, and tost_fast.py for the CPU core this one mirrors.

Where it runs: on CUDA, tost_fast.causal_tssa hands its inputs to core() below, when tost_fast.usable() says
so (tost_fast.py's docstring says when). Its backward is first order only.

The design. The tokens are cut into chunks of CHUNK, and one program takes one chunk of one head of one
sequence, so a single long sequence still fills the GPU. A prefix sum over the tokens is then two passes:
one kernel sums each chunk into a small table, one cumsum over the table gives each chunk the sum of the
chunks before it, and the next kernel adds that to the prefix sum inside its chunk. The heads meet only in
Pi's softmax over K at each token, which runs in torch between the kernels:
    _sum_squares, _energy:      Q_t = sum_{j<=t} w_j^2 and e_t = sum_i w_ti^2 / Q_ti     -> e (B, T, K)
    (torch)                     Pi_t = softmax_k(temp_k (e_t + p b_{k,t}))
    _sum_memberships, _output:  A_t, P_t, y_t = -Pi_t w_t / (1 + A_t / (P_t + eps))     -> y (B, T, K, p)
The backward mirrors it, with suffix sums (a prefix sum's adjoint): _sum_adjoints and _grad_pi give dL/dPi
of every head; torch takes the softmax's backward across the heads (and the gradients of temp and b);
_sum_q_adjoints and _grad_w give dL/dw. Each kernel recomputes what it needs inside its chunk from the
sums of the other chunks the forward kept, so nothing of size (B, T, d) is saved but w itself.

Activations are loaded in their own dtype (bf16 under autocast) and every sum runs in float32 (float64 when
the activations are float64, for the tests). As in the CPU core, an exclusive or suffix sum is never formed
as a total minus a prefix (tost_fast.CausalCore says why): the sums of the earlier or later chunks are
prefix sums of the chunks' sums, and Q_{t-1} and the sum over the later tokens t' > t of a chunk are sums of
the neighbouring tokens' terms, loaded one row shifted (not an inclusive sum minus the token's own term).
"""

import torch
import triton
import triton.language as tl

CHUNK = 32      # tokens per program (a power of two); 64 spills registers in _grad_w on an H100 (p = 64)
WARPS = 8       # warps per program (with 4, _grad_w spills registers on an H100)
TINY = tl.constexpr(1e-12)    # Q_t's clamp, as in tost.py


@triton.jit
def _tile(T, K, P, C: tl.constexpr, BP: tl.constexpr):
    """This program's chunk c of head k of sequence b: its C tokens t, the offsets of its (C, BP) tile in a
    (B, T, K, p) tensor (`at`) and of its tokens in a (B, T, K) one (`tok`). Sums over chunks are tables of
    NC + 1 slots per head, (B, K, NC + 1, BP) or (B, K, NC + 1): `head` is the head's slot 0, `before` the
    chunk's slot in a table of the sums of the chunks before it, `after` in one of the chunks after it."""
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
    head = (b * K + k) * (tl.num_programs(0) + 1)
    return rows, t, inside, m, at, tok, cols, head, head + c, head + tl.num_programs(0) - 1 - c


@triton.jit
def _weights(w2, pi, ac_ptr, pc_ptr, before, cols, EPS: tl.constexpr, C: tl.constexpr, BP: tl.constexpr):
    """A_t, P_t + eps and D_t = (P_t + eps) / (A_t + P_t + eps) of the chunk's tokens, from the sums of the
    earlier chunks (ac, pc)."""
    At = tl.cumsum(pi[:, None] * w2, 0) + tl.load(ac_ptr + before * BP + cols)[None, :]
    Pe = tl.cumsum(pi, 0) + tl.load(pc_ptr + before) + tl.full([C], EPS, pi.dtype)
    D = Pe[:, None] / (At + Pe[:, None])
    return At, Pe, D


@triton.jit
def _squares(w2, qc_ptr, before, cols, BP: tl.constexpr):
    """Q_t of the chunk's tokens from the earlier chunks' sum Q (qc) and the chunk's own prefix sum; Q_t
    clamped at TINY, and where it is clamped (below TINY: at it, torch's clamp_min lets the gradient
    through)."""
    Q = tl.load(qc_ptr + before * BP + cols)
    Qt = tl.cumsum(w2, 0) + Q[None, :]
    tiny = tl.full([1, BP], TINY, w2.dtype)
    return Q, Qt, tl.maximum(Qt, tiny), Qt < tiny


@triton.jit
def _sum_squares(w_ptr, tq_ptr, T, K, P, C: tl.constexpr, BP: tl.constexpr):
    """Per chunk: sum_t w_t^2, p numbers."""
    rows, t, inside, m, at, tok, cols, head, before, after = _tile(T, K, P, C, BP)
    w = tl.load(w_ptr + at, mask=m, other=0).to(tq_ptr.dtype.element_ty)
    _put(tq_ptr, tl.sum(w * w, 0), before, head, cols, BP)


@triton.jit
def _energy(w_ptr, qc_ptr, e_ptr, T, K, P, C: tl.constexpr, BP: tl.constexpr):
    """e_t = sum_i w_ti^2 / max(Q_ti, TINY)."""
    rows, t, inside, m, at, tok, cols, head, before, after = _tile(T, K, P, C, BP)
    w = tl.load(w_ptr + at, mask=m, other=0).to(e_ptr.dtype.element_ty)
    w2 = w * w
    Q, Qt, Qc, clamped = _squares(w2, qc_ptr, before, cols, BP)
    tl.store(e_ptr + tok, tl.sum(w2 / Qc, 1), mask=inside)


@triton.jit
def _sum_memberships(w_ptr, pi_ptr, ta_ptr, tp_ptr, T, K, P, C: tl.constexpr, BP: tl.constexpr):
    """Per chunk: sum_t Pi_t w_t^2 (p numbers) and sum_t Pi_t."""
    rows, t, inside, m, at, tok, cols, head, before, after = _tile(T, K, P, C, BP)
    dt = pi_ptr.dtype.element_ty
    w = tl.load(w_ptr + at, mask=m, other=0).to(dt)
    pi = tl.load(pi_ptr + tok, mask=inside, other=0)
    _put(ta_ptr, tl.sum(pi[:, None] * (w * w), 0), before, head, cols, BP)
    _put(tp_ptr, tl.sum(pi, 0), before, head, 0, 1)


@triton.jit
def _output(w_ptr, pi_ptr, ac_ptr, pc_ptr, y_ptr, T, K, P, EPS: tl.constexpr, C: tl.constexpr,
            BP: tl.constexpr):
    """y_t = -Pi_t w_t D_t."""
    rows, t, inside, m, at, tok, cols, head, before, after = _tile(T, K, P, C, BP)
    w = tl.load(w_ptr + at, mask=m, other=0).to(pi_ptr.dtype.element_ty)
    pi = tl.load(pi_ptr + tok, mask=inside, other=0)
    At, Pe, D = _weights(w * w, pi, ac_ptr, pc_ptr, before, cols, EPS, C, BP)
    _store(y_ptr + at, -pi[:, None] * w * D, m)


@triton.jit
def _adjoints(w_ptr, g_ptr, pi_ptr, ac_ptr, pc_ptr, T, K, P, EPS: tl.constexpr, C: tl.constexpr,
              BP: tl.constexpr):
    """The chunk's w, w^2, g, Pi, D and the adjoints of A_t and P_t:
    dL/dA_t = Pi_t g_t w_t D_t^2 / Pe_t (p numbers), dL/dPe_t = -sum_i dL/dA_ti A_ti / Pe_t."""
    rows, t, inside, m, at, tok, cols, head, before, after = _tile(T, K, P, C, BP)
    dt = pi_ptr.dtype.element_ty
    w = tl.load(w_ptr + at, mask=m, other=0).to(dt)
    g = tl.load(g_ptr + at, mask=m, other=0).to(dt)
    pi = tl.load(pi_ptr + tok, mask=inside, other=0)
    w2 = w * w
    At, Pe, D = _weights(w2, pi, ac_ptr, pc_ptr, before, cols, EPS, C, BP)
    GA = g * w * D * D * (pi / Pe)[:, None]
    GP = -tl.sum(GA * At, 1) / Pe
    return w, w2, g, pi, D, GA, GP


@triton.jit
def _sum_adjoints(w_ptr, g_ptr, pi_ptr, ac_ptr, pc_ptr, tA_ptr, tP_ptr, T, K, P, EPS: tl.constexpr,
                  C: tl.constexpr, BP: tl.constexpr):
    """Per chunk: sum_t dL/dA_t (p numbers) and sum_t dL/dPe_t."""
    rows, t, inside, m, at, tok, cols, head, before, after = _tile(T, K, P, C, BP)
    w, w2, g, pi, D, GA, GP = _adjoints(w_ptr, g_ptr, pi_ptr, ac_ptr, pc_ptr, T, K, P, EPS, C, BP)
    _put(tA_ptr, tl.sum(GA, 0), after, head, cols, BP)
    _put(tP_ptr, tl.sum(GP, 0), after, head, 0, 1)


@triton.jit
def _grad_pi(w_ptr, g_ptr, pi_ptr, ac_ptr, pc_ptr, sa_ptr, sp_ptr, gpi_ptr, T, K, P, EPS: tl.constexpr,
             C: tl.constexpr, BP: tl.constexpr):
    """dL/dPi_t: via y_t directly, and via A_t' and P_t' of every t' >= t (suffix sums of their adjoints:
    this chunk's from its end, plus the later chunks' sums sa, sp)."""
    rows, t, inside, m, at, tok, cols, head, before, after = _tile(T, K, P, C, BP)
    w, w2, g, pi, D, GA, GP = _adjoints(w_ptr, g_ptr, pi_ptr, ac_ptr, pc_ptr, T, K, P, EPS, C, BP)
    RA = tl.cumsum(GA, 0, reverse=True) + tl.load(sa_ptr + after * BP + cols)[None, :]
    RP = tl.cumsum(GP, 0, reverse=True) + tl.load(sp_ptr + after)
    gpi = tl.sum(RA * w2, 1) + RP - tl.sum(g * w * D, 1)
    tl.store(gpi_ptr + tok, gpi, mask=inside)


@triton.jit
def _sum_q_adjoints(w_ptr, de_ptr, qc_ptr, tq_ptr, T, K, P, C: tl.constexpr, BP: tl.constexpr):
    """Per chunk: the sum of the adjoints of Q_t, -de_t w_t^2 / Q_t^2 (0 where clamped), p numbers."""
    rows, t, inside, m, at, tok, cols, head, before, after = _tile(T, K, P, C, BP)
    w = tl.load(w_ptr + at, mask=m, other=0).to(de_ptr.dtype.element_ty)
    de = tl.load(de_ptr + tok, mask=inside, other=0)
    w2 = w * w
    Q, Qt, Qc, clamped = _squares(w2, qc_ptr, before, cols, BP)
    gQ = tl.where(clamped, 0, -de[:, None] * w2 / Qc / Qc)
    _put(tq_ptr, tl.sum(gQ, 0), after, head, cols, BP)


@triton.jit
def _grad_w(w_ptr, g_ptr, pi_ptr, de_ptr, qc_ptr, ac_ptr, pc_ptr, sa_ptr, sq_ptr, gw_ptr, T, K, P,
            EPS: tl.constexpr, C: tl.constexpr, BP: tl.constexpr):
    """dL/dw_t, given dL/de_t of every token (de) and the later chunks' sums of the adjoints (sa, sq)."""
    rows, t, inside, m, at, tok, cols, head, before, after = _tile(T, K, P, C, BP)
    w, w2, g, pi, D, GA, GP = _adjoints(w_ptr, g_ptr, pi_ptr, ac_ptr, pc_ptr, T, K, P, EPS, C, BP)
    RA = tl.cumsum(GA, 0, reverse=True) + tl.load(sa_ptr + after * BP + cols)[None, :]
    Q, Qt, Qc, clamped = _squares(w2, qc_ptr, before, cols, BP)
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
    later = tl.cumsum(tl.where(Qn < tiny, 0, -den[:, None] * wn2 / Qnc / Qnc), 0, reverse=True)
    gw2 = RA * pi[:, None] + de[:, None] * own + later + tl.load(sq_ptr + after * BP + cols)[None, :]
    _store(gw_ptr + at, 2 * w * gw2 - pi[:, None] * g * D, m)


@triton.jit
def _put(ptr, x, slot, head, cols, W: tl.constexpr):
    """A chunk's sum x (W numbers at offsets cols, or one: W = 1, cols = 0) into the slot after the chunk's
    own, `slot`, of a table of chunk sums, and 0 into its head's slot 0 if `slot` is that one (the chunk is
    the first to be summed): a cumsum over the slots then leaves each chunk's slot with the sum of the
    chunks before (or after) it."""
    zero = tl.zeros_like(x)
    tl.store(ptr + (slot + 1) * W + cols, x)
    # a mask of x's shape: Triton's interpreter does not broadcast a scalar mask
    tl.store(ptr + head * W + cols, zero, mask=zero + (slot - head) == 0)


@triton.jit
def _store(ptr, x, mask):
    """Store x in ptr's dtype. To bf16 (under autocast) it is rounded to nearest even by hand, so that the
    conversion is exact: the GPU rounds so too, but Triton's interpreter would truncate."""
    if ptr.dtype.element_ty == tl.bfloat16:
        bits = x.to(tl.float32).to(tl.uint32, bitcast=True)
        bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
        # NaN stays NaN: a quiet one, whose bits bf16 keeps
        x = tl.where(x != x, 0x7FC00000, bits).to(tl.float32, bitcast=True)
    tl.store(ptr, x, mask=mask)


def _layout(w, chunk):
    B, T, K, P = w.shape
    return B, T, K, P, triton.cdiv(T, chunk), triton.next_power_of_2(P)


def _launcher(w, chunk):
    """launch(kernel, *tensors, **constants): a kernel over w's chunks, one program a chunk of a head of a
    sequence, its arguments the tensors, then T, K and p."""
    B, T, K, P, NC, BP = _layout(w, chunk)

    def launch(kernel, *tensors, **constants):
        kernel[NC, K, B](*tensors, T, K, P, C=chunk, BP=BP, num_warps=WARPS, **constants)
    return launch


def _forward(w: torch.Tensor, temp: torch.Tensor, pb: torch.Tensor, eps: float,
             chunk: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                  torch.Tensor]:
    """w: (B, T, K, p) contiguous, any float dtype; temp: (K,), pb: (T, K) = p b_{k,t}, in the statistics'
    dtype -> y (B, T, K, p) in w's dtype, and for the backward Pi and e (B, T, K) and the sums of the chunks
    before each chunk: of w^2 (qc) and Pi w^2 (ac), (B, K, NC + 1, BP), and of Pi (pc), (B, K, NC + 1),
    each a cumsum of the chunks' own sums (_put says how): never a total minus a prefix."""
    B, T, K, P, NC, BP = _layout(w, chunk)
    dt = temp.dtype
    launch = _launcher(w, chunk)
    qc = w.new_empty(B, K, NC + 1, BP, dtype=dt)
    launch(_sum_squares, w, qc)
    qc.cumsum_(2)
    e = w.new_empty(B, T, K, dtype=dt)
    launch(_energy, w, qc, e)
    # the softmax over the heads: the only step that needs every head's e_t at a token
    pi = torch.softmax(temp * (e + pb), -1).contiguous()
    ac = torch.empty_like(qc)
    pc = w.new_empty(B, K, NC + 1, dtype=dt)
    launch(_sum_memberships, w, pi, ac, pc)
    ac.cumsum_(2)
    pc.cumsum_(2)
    y = torch.empty_like(w)
    launch(_output, w, pi, ac, pc, y, EPS=eps)
    return y, pi, e, qc, ac, pc


# Under torch.compile the core is two custom ops in the graph. Inductor's on-disk caches know a custom op by
# its name, not its code: an op whose outputs change shape needs a new name, or a compiled graph from before
# is reused with the old shapes.
forward = torch.library.custom_op('tost::causal_tssa_forward', _forward, mutates_args=())


@forward.register_fake
def _(w, temp, pb, eps, chunk):
    B, T, K, P, NC, BP = _layout(w, chunk)
    dt = temp.dtype
    sums = w.new_empty(B, K, NC + 1, BP, dtype=dt)
    return (torch.empty_like(w), w.new_empty(B, T, K, dtype=dt), w.new_empty(B, T, K, dtype=dt), sums,
            torch.empty_like(sums), w.new_empty(B, K, NC + 1, dtype=dt))


def _backward_kernels(g: torch.Tensor, w: torch.Tensor, temp: torch.Tensor, pb: torch.Tensor,
                      pi: torch.Tensor, e: torch.Tensor, qc: torch.Tensor, ac: torch.Tensor, pc: torch.Tensor,
                      eps: float, chunk: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dL/dy -> dL/dw, dL/dtemp, dL/dpb. The tables of the sums of the chunks after each chunk (sa, sp, sq)
    are made as the forward's, with the chunks in reverse order."""
    launch = _launcher(w, chunk)
    g = g.contiguous()
    sa = torch.empty_like(qc)
    sp = torch.empty_like(pc)
    launch(_sum_adjoints, w, g, pi, ac, pc, sa, sp, EPS=eps)
    sa.cumsum_(2)
    sp.cumsum_(2)
    gpi = torch.empty_like(e)
    launch(_grad_pi, w, g, pi, ac, pc, sa, sp, gpi, EPS=eps)
    # the softmax over the heads, backward: the only step that needs every head's dL/dPi at a token
    dl = pi * (gpi - (pi * gpi).sum(-1, keepdim=True))
    de = (dl * temp).contiguous()
    sq = torch.empty_like(qc)
    launch(_sum_q_adjoints, w, de, qc, sq)
    sq.cumsum_(2)
    gw = torch.empty_like(w)
    launch(_grad_w, w, g, pi, de, qc, ac, pc, sa, sq, gw, EPS=eps)
    return gw, (dl * (e + pb)).sum((0, 1)), de.sum(0)


backward = torch.library.custom_op('tost::causal_tssa_backward', _backward_kernels, mutates_args=())


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
    return *backward(gy, *ctx.saved_tensors, ctx.eps, ctx.chunk), None, None


forward.register_autograd(_backward, setup_context=_setup_context)


class Core(torch.autograd.Function):
    """Eager mode: the same two functions, called directly. Through the custom ops the layer's
    forward+backward took 1.4x to 1.6x as long (torch 2.11, an H100; docs/speed.md)."""

    @staticmethod
    def forward(ctx, w, temp, pb, eps, chunk):
        out = _forward(w, temp, pb, eps, chunk)
        _setup_context(ctx, (w, temp, pb, eps, chunk), out)
        return out[0]

    @staticmethod
    def backward(ctx, gy):
        # first order only: asked for a graph of this backward (create_graph=True), it says so, as tost_fast's
        if torch.is_grad_enabled():
            raise RuntimeError("causal TSSA's Triton core has no gradient of a gradient: set "
                               "CausalTSSA.fast = False")
        return *_backward_kernels(gy, *ctx.saved_tensors, ctx.eps, ctx.chunk), None, None


def core(w, temp, pb, eps):
    """tost_fast.causal_tssa's core on CUDA: w (B, T, K, p) in the activations' dtype, temp (K,) and
    pb (T, K) in the statistics' -> y (B, T, K, p) in w's dtype."""
    args = (w.contiguous(), temp, pb.contiguous(), eps, CHUNK)
    if torch.compiler.is_compiling():
        return forward(*args)[0]
    # Triton launches on the current GPU: make it w's (autograd runs the backward on w's device already)
    with torch.cuda.device(w.device.index if w.is_cuda else -1):
        return Core.apply(*args)
