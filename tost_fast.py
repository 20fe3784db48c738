"""
A fused core for tost.py's CausalTSSA training path: the numbers of its readable forward() lines, equal to
rounding (float64: within 1e-12), in fewer passes over memory. Nothing here is new math; read tost.py for
that.

Where it runs: CausalTSSA.forward enters here by one line when usable() says so, that is on a CPU, in eager
mode, without a recurrent state and without active attention dropout, on at least MIN_ELEMENTS numbers, and
CausalTSSA.fast is True. Everywhere else the readable lines run: under torch.compile on a CPU (inductor fuses
them itself), on GPUs without the Triton core below, on small inputs, and under torch.func's transforms and
forward-mode AD. docs/speed.md has the measurements that chose this. Its backward is first order only: for a
gradient of a gradient, set CausalTSSA.fast = False.

On CUDA the same line enters here too, and causal_tssa hands its inputs to tost_triton.py's Triton core,
eager or compiled, where triton imports (measured faster than the readable lines there: docs/speed.md),
without a recurrent state and without active attention dropout; TOST_TRITON=0 keeps the readable lines.

Two things make the core faster than autograd over the readable lines on a CPU: a hand-written backward
(autograd keeps and re-reads about twice as many intermediate tensors), and chunks of about CHUNK elements,
so that the dozen tensors a chunk uses stay in cache instead of streaming through memory once per line.
test_tost.py proves it equal to the readable lines (values and every gradient, several chunk sizes, the
clamped case, gradcheck, float32 against float64, bf16 autocast), and derivation.py's appendix B shows it
in five chunks.
"""

import functools
import os
import sys

import torch

CHUNK = 2 ** 18      # elements per chunk (1 MB of float32 per tensor)
MIN_ELEMENTS = 2 ** 19   # smaller inputs (B x T x d) run as fast or faster on the readable lines


def _triton_devices():
    """The devices whose training path runs the Triton core: ('cuda',) where CUDA is and triton imports (a GPU
    run measured it faster than the readable lines; docs/speed.md), unless TOST_TRITON=0; TOST_TRITON=1
    insists on it. A value it cannot use stops the program here, in one line, not at the first layer."""
    flag = os.environ.get('TOST_TRITON', '')
    why = None if flag in ('', '0', '1') else f"TOST_TRITON={flag}: expected 1 (the Triton core on CUDA) or 0"
    # by default NVIDIA's CUDA only: nothing has run on ROCm's
    wanted = flag == '1' or (flag == '' and torch.cuda.is_available() and torch.version.hip is None)
    if wanted and not why:
        try:
            import tost_triton  # noqa: F401  (imported once here, so that causal_tssa only looks it up)
        except ImportError as e:
            wanted = False
            if flag == '1':
                why = f"TOST_TRITON=1 needs triton, which does not import here ({e}); pip install triton"
    if why:
        print(f"error: {why}", file=sys.stderr)
        sys.exit(2)
    return ('cuda',) if wanted else ()


TRITON = _triton_devices()


def usable(layer, x):
    """Whether CausalTSSA.forward(x) without a state may run a core (see the module docstring)."""
    if not layer.fast or (layer.training and layer.attn_dropout.p > 0):
        return False
    # torch.func's transforms (grad, vmap, jvp) and forward-mode AD need more of a Function than the cores
    # have (a setup_context, a jvp): the readable lines go through them.
    if torch._C._are_functorch_transforms_active():
        return False
    if torch.autograd.forward_ad._current_level >= 0:
        return False
    if x.device.type in TRITON:
        # compiled: no floor checked here, inductor itself refuses a GPU below compute capability 7.0
        return torch.compiler.is_compiling() or triton_on(x.device)
    return x.device.type == 'cpu' and not torch.compiler.is_compiling() and x.numel() >= MIN_ELEMENTS


def triton_on(device):
    """Whether causal TSSA's training path on `device` (a torch.device) may run the Triton core: it is in
    TRITON and, on CUDA, at or above Triton's floor."""
    return device.type in TRITON and (device.type != 'cuda' or _triton_runs_on(device.index))


@functools.cache
def _triton_runs_on(gpu):
    """Triton's floor, compute capability 7.0: an older GPU runs the readable lines."""
    return torch.cuda.get_device_capability(gpu) >= (7, 0)


def causal_tssa(layer, x):
    """c_proj(core(c_attn(x))): CausalTSSA.forward without a state. x: (B, T, d) -> (B, T, d). The core is
    the Triton one on a device in TRITON, else CausalCore."""
    from tost import _stat_dtype     # the readable lines' own (imported here, as tost imports this module)
    B, T, d = x.shape
    w = layer.c_attn(x).view(B, T, layer.n_head, layer.head_dim)        # (B, T, K, p), a view
    dt = _stat_dtype(w)
    temp = layer.temp.view(-1).to(dt)                                     # (K,)
    pb = (layer.head_dim * layer.pos_bias[:, :T]).t().to(dt)              # (T, K)  p * b_{k,t}
    if x.device.type in TRITON:
        import tost_triton
        y = tost_triton.core(w, temp, pb, layer.eps)                      # loads w in its own dtype
    else:
        # under half-precision autocast a float32 copy of w, which the backward keeps
        wf = w.to(dt)
        # The core keeps its intermediates for a backward only if there will be one: decided here, since
        # grad mode is always off inside a Function's forward.
        keep = torch.is_grad_enabled() and any(t.requires_grad for t in (wf, temp, pb))
        y = CausalCore.apply(wf, temp, pb, layer.eps, max(1, CHUNK // (B * d)), keep)
    return layer.resid_dropout(layer.c_proj(y.view(B, T, d).to(w.dtype)))


class CausalCore(torch.autograd.Function):
    """CausalTSSA's training path (no state, no dropout), computed chunk by chunk, with a hand-written
    backward.

    Why chunks: each readable line is a pass over a (B, T, d) tensor, and past a few thousand tokens those
    tensors outgrow the CPU's cache, so every pass runs at memory speed. Here the sequence is cut into
    chunks whose passes stay in cache. The prefix sums (Q, A, P) are carried from one chunk to the next, as
    the recurrent state carries them from token to token; the backward walks the chunks in reverse and
    carries the suffix sums of the adjoints (a prefix sum's adjoint is a suffix sum). The forward keeps Q, A,
    D, Pi, P + eps and e_t for the backward, which then needs no second pass of prefix sums.

    Suffix sums are prefix sums of the flipped chunk, never total - prefix: the adjoint through Q_t is of
    order 1/Q_t, huge at the first tokens when a coordinate starts near zero, and it cancels exactly
    (each term w_ti^2 / Q_ti of e_t is at most 1). Taken as total - prefix, that cancellation leaves an error
    of about machine epsilon / Q_0 at every later position: float32 gradients were off by up to 6% that
    way.
    """

    @staticmethod
    def forward(ctx, w, temp, pb, eps, chunk, keep):
        # w: (B, T, K, p) float32/64; temp: (K,); pb: (T, K) = p * b_{k,t}
        B, T, K, p = w.shape
        # the backward needs every chunk's Q, A, D, Pi, P + eps and e; else reuse one chunk's buffers
        L = T if keep else min(chunk, T)
        y, (Qs, As, Ds) = torch.empty_like(w), (w.new_empty(B, L, K, p) for _ in range(3))
        Pis, Pes, es = (w.new_empty(B, L, K) for _ in range(3))
        Q, A, P = w.new_zeros(B, 1, K, p), w.new_zeros(B, 1, K, p), w.new_zeros(B, 1, K)   # carries
        for a in range(0, T, chunk):
            c = slice(a, a + chunk)
            at = c if keep else slice(0, min(chunk, T - a))         # where this chunk's intermediates go
            wc = w[:, c]
            w2 = wc * wc                                             # (B, C, K, p)
            w2[:, :1] += Q                                           # carry in, then the prefix sum
            Qc = torch.cumsum(w2, 1, out=Qs[:, at])                  # Q_t (saved unclamped)
            torch.square(wc[:, :1], out=w2[:, :1])
            e = torch.sum(w2 / Qc.clamp_min(1e-12), -1, out=es[:, at])  # sum_i w_t^2 / Q_t
            Pi = torch.softmax(temp * (e + pb[c]), -1)               # (B, C, K)
            Pis[:, at] = Pi
            Pe = torch.cumsum(Pi, 1).add_(P)                         # P_t = sum_{j<=t} pi_j
            Q, P = Qc[:, -1:], Pe[:, -1:].clone()
            Pe = Pes[:, at].copy_(Pe.add_(eps)).unsqueeze(-1)
            Pi = Pi.unsqueeze(-1)
            w2.mul_(Pi)[:, :1] += A
            Ac = torch.cumsum(w2, 1, out=As[:, at])                  # A_t = sum_{j<=t} pi_j w_j^2
            A = Ac[:, -1:]
            # D_t = Pe_t / (A_t + Pe_t), Pe_t = P_t + eps: tost.py's 1 / (1 + A_t / (P_t + eps))
            D = torch.div(Pe, Ac + Pe, out=Ds[:, at])
            torch.mul(wc, D, out=y[:, c]).mul_(-Pi)                  # y_t = -Pi_t w_t D_t
        if keep:
            ctx.save_for_backward(w, temp, pb, Qs, As, Ds, Pis, Pes, es)
        ctx.chunk = chunk
        return y

    @staticmethod
    def backward(ctx, g):
        # First order only. Grad mode is on here only when a graph of this backward is asked for
        # (create_graph=True): said then, rather than a gradient of a gradient without its second-order terms.
        if torch.is_grad_enabled():
            raise RuntimeError("causal TSSA's fused core has no gradient of a gradient: set "
                               "CausalTSSA.fast = False")
        w, temp, pb, Qs, As, Ds, Pis, Pes, es = ctx.saved_tensors
        B, T, K, p = w.shape
        gw, dls = torch.empty_like(w), w.new_empty(B, T, K)
        SA, SQ, SP = w.new_zeros(B, 1, K, p), w.new_zeros(B, 1, K, p), w.new_zeros(B, 1, K)   # suffix carries
        for a in reversed(range(0, T, ctx.chunk)):
            c = slice(a, a + ctx.chunk)
            wc, Q, Ac, D, Pi, Pe = w[:, c], Qs[:, c], As[:, c], Ds[:, c], Pis[:, c], Pes[:, c]
            Pi4, Pe4 = Pi.unsqueeze(-1), Pe.unsqueeze(-1)
            gD = g[:, c] * D
            GA = gD * wc
            h = GA.sum(-1)                                           # (B, C, K)  sum_i g w D
            GA.mul_(D).mul_(Pi4 / Pe4)                               # dL/dA_t = Pi g w D^2 / Pe
            GP = (GA * Ac).sum(-1).div_(Pe).neg_()                   # dL/dPe_t = -sum_i dL/dA_t A_t / Pe_t
            RA, RP = _suffix_sum(GA, SA), _suffix_sum(GP, SP)
            SA, SP = RA[:, :1].clone(), RP[:, :1]
            w2 = wc * wc
            gPi = (RA * w2).sum(-1).add_(RP).sub_(h)                 # dL/dPi_t
            dl = Pi * (gPi - (Pi * gPi).sum(-1, keepdim=True))       # softmax over heads
            dls[:, c] = dl
            de = (dl * temp).unsqueeze(-1)                           # dL/de_t
            # e_t = sum_i w_t^2 / Q_t, Q_t = sum_{j<=t} w_j^2. The token's own w_t^2 enters both; together
            # they give de_t Q_{t-1} / Q_t^2 (de/Q_t - de w_t^2/Q_t^2 exactly, with no subtraction).
            # Where Q_t is clamped (below 1e-12: at it, clamp_min lets the gradient through), its term of e_t
            # is w_t^2 / 1e-12 and Q_t passes nothing back.
            Qc, clamped = Q.clamp_min(1e-12), Q < 1e-12
            Qprev = torch.cat([Qs[:, a - 1:a] if a else torch.zeros_like(Q[:, :1]), Q[:, :-1]], 1)
            own = torch.where(clamped, Qc, Qprev).div_(Qc).div_(Qc)
            gQ = w2.div_(Qc).div_(Qc).mul_(-de).masked_fill_(clamped, 0)   # via Q_t, for the later tokens
            gw2 = RA.mul_(Pi4).addcmul_(de.expand_as(Qc), own)       # via A, and via its own term of e_t
            SQc = _suffix_sum(gQ, SQ)
            gw2[:, :-1] += SQc[:, 1:]                                # via Q_t' of the later tokens t' > t
            gw2[:, -1:] += SQ
            SQ = SQc[:, :1]
            # direct path of y = -Pi w D, and w2 = w^2
            torch.addcmul(gD.mul_(-Pi4), wc, gw2, value=2, out=gw[:, c])
        gtemp = (dls * (es + pb)).sum((0, 1))
        gpb = (dls * temp).sum(0)
        return gw, gtemp, gpb, None, None, None


def _suffix_sum(x, carry):
    """sum_{t' >= t} x_t' over dim 1 (time) within a chunk, plus `carry`, the sum over the later chunks."""
    f = torch.flip(x, [1])
    f[:, :1] += carry
    return torch.flip(f.cumsum_(1), [1])
