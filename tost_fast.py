"""
The fast cores of tost.py's TSSA and CausalTSSA: the same numbers as their readable forward() lines, in
fewer passes over memory. Nothing here is new math; read tost.py for that.

Each readable forward() enters here by one line, when usable(layer) says so. Two things make these cores
faster than autograd over the readable lines:
  * a hand-written backward: autograd keeps and re-reads about twice as many intermediate tensors;
  * on a CPU, chunks: the work is cut into pieces of about CHUNK elements, so that the dozen tensors a
    piece uses stay in cache instead of streaming through memory once per line.
test_tost.py proves them equal to the readable lines (values and every gradient, several chunk sizes,
the clamped case, gradcheck, float32 against float64, bf16 autocast).

Layout: w is the input projection's output viewed per head, (B, n, K, p), no copy. temp is (K,).
"""

import torch

# A core on a CPU works on chunks of about this many elements (1 MB of float32 per tensor). On a GPU it
# takes everything at once: there, kernel launches cost more than memory passes.
CHUNK = 2 ** 18


def _chunk(x, whole, unit):
    """How many units (images, or tokens) a core takes at a time: `whole` off the CPU, else about CHUNK
    elements' worth, at least one; a unit holds `unit` elements."""
    return whole if x.device.type != 'cpu' else max(1, CHUNK // unit)


def _stat_dtype(t):
    # as in tost.py: statistics (sums over tokens) in float32 when the activations are half precision
    return torch.float32 if t.dtype in (torch.float16, torch.bfloat16) else t.dtype


def usable(layer):
    """Whether layer.forward may run a core: TSSA.fast is on, the layer is the practical operator with
    alpha = 1 (the cores absorb alpha), no attention dropout is active in training, and torch.compile is
    not tracing (inductor fuses the readable lines itself). Otherwise the readable lines run."""
    return layer.fast and not layer.whitebox and layer.alpha == 1 and not torch.compiler.is_compiling() \
        and not (layer.training and layer.attn_dropout.p > 0)


def _run(layer, x, core, *args):
    """c_proj(core(c_attn(x))), the core seeing w as (B, n, K, p). The core keeps its intermediates for the
    backward only if there will be one: decided here, since grad mode is always off inside a Function's
    forward, and its needs_input_grad says yes under no_grad too (a view of a parameter requires grad)."""
    B, n, d = x.shape
    w = layer.c_attn(x)
    wf = w.to(_stat_dtype(w)).view(B, n, layer.n_head, layer.head_dim)
    args = [a.to(wf.dtype) if torch.is_tensor(a) else a for a in args]
    temp = layer.temp.view(-1).to(wf.dtype)
    keep = torch.is_grad_enabled() and any(torch.is_tensor(a) and a.requires_grad for a in (wf, temp, *args))
    y = core.apply(wf, temp, *args, keep)
    return layer.resid_dropout(layer.c_proj(y.view(B, n, d).to(w.dtype)))


def tssa(layer, x):
    """TSSA.forward (practical operator, no attention dropout). x: (B, n, d) -> (B, n, d)."""
    B, n, d = x.shape
    return _run(layer, x, TSSACore, layer.eps, _chunk(x, B, n * d))


def causal_tssa(layer, x):
    """CausalTSSA.forward without a state (the training path). x: (B, T, d) -> (B, T, d)."""
    B, T, d = x.shape
    pb = (layer.head_dim * layer.pos_bias[:, :T]).t()                     # (T, K)  p * b_{k,t}
    return _run(layer, x, CausalCore, pb, layer.eps, _chunk(x, T, B * d))


class TSSACore(torch.autograd.Function):
    """TSSA's practical operator with a hand-written backward, a chunk of images at a time (each image's
    statistics are its own). About half the passes over memory of autograd's version. w: (B, n, K, p)."""

    @staticmethod
    def forward(ctx, w, temp, eps, chunk, keep):
        y = torch.empty_like(w)
        stats = []                                               # for the backward, if keep
        for a in range(0, w.shape[0], chunk):
            wc = w[a:a + chunk]
            w2 = wc * wc
            col = w2.sum(1, keepdim=True).clamp_min_(1e-24)     # (b, 1, K, p)  sum_j w_j^2 per coordinate
            e = (w2 / col).sum(-1)                               # (b, n, K)
            Pi = torch.softmax(temp * e, -1)                     # (b, n, K)     pi_jk
            n_k = Pi.sum(1, keepdim=True) + eps                  # (b, 1, K)
            S = w2.mul_(Pi.unsqueeze(-1)).sum(1, keepdim=True)   # (b, 1, K, p)  s_k
            D = 1 / (1 + S / n_k.unsqueeze(-1))                  # (b, 1, K, p)  D_k
            torch.mul(wc, D, out=y[a:a + chunk]).mul_(-Pi.unsqueeze(-1))   # y = -pi w D
            if keep:
                stats.append((col, e, Pi, n_k, S))
        if keep:
            ctx.save_for_backward(w, temp, *(torch.cat(s) for s in zip(*stats)))
        ctx.chunk = chunk
        return y

    @staticmethod
    def backward(ctx, g):
        w, temp, cols, es, Pis, n_ks, Ss = ctx.saved_tensors
        g = g.to(w.dtype)
        gw, gtemp = torch.empty_like(w), torch.zeros_like(temp)
        for a in range(0, w.shape[0], ctx.chunk):
            c = slice(a, a + ctx.chunk)
            wc, gc, col, e, Pi, n_k, S = w[c], g[c], cols[c], es[c], Pis[c], n_ks[c], Ss[c]
            Pi4, n_k4 = Pi.unsqueeze(-1), n_k.unsqueeze(-1)
            D = 1 / (1 + S / n_k4)
            gww = gc * wc
            gD = -(gww * Pi4).sum(1, keepdim=True)               # y = -pi w D
            gPi = -gww.mul_(D).sum(-1)
            gs = -gD * D * D                                     # D = 1 / (1 + m), m = S / n_k
            gS = gs / n_k4
            w2 = wc * wc
            gPi += (w2 * gS).sum(-1) - (gs * S).sum(-1) / (n_k * n_k)   # via S = sum pi w^2, n_k = sum pi
            dl = Pi * (gPi - (Pi * gPi).sum(-1, keepdim=True))   # softmax over heads
            gtemp += (dl * e).sum((0, 1))
            de = (dl * temp).unsqueeze(-1)                       # e = sum_i w^2 / col
            gcol = (w2 * de).sum(1, keepdim=True).div_(col * col).neg_().masked_fill_(col <= 1e-24, 0)
            gw2 = torch.addcdiv(gcol, de.expand_as(w2), col).addcmul_(Pi4, gS)
            torch.mul(gc, D, out=gw[c]).mul_(-Pi4).addcmul_(wc, gw2, value=2)
        return gw, gtemp, None, None, None


class CausalCore(torch.autograd.Function):
    """CausalTSSA's training path (no state, no dropout), computed chunk by chunk, with a hand-written
    backward.

    Why chunks: each readable line is a pass over a (B, T, d) tensor, and past a few thousand tokens those
    tensors outgrow the CPU's cache, so every pass runs at memory speed. Here the sequence is cut into
    chunks whose passes stay in cache. The prefix sums (Q, A, P) are carried from one chunk to the next, as
    the recurrent state carries them from token to token; the backward walks the chunks in reverse and
    carries the suffix sums of the adjoints (a prefix sum's adjoint is a suffix sum). The forward keeps Q
    and A for the backward, which then needs no second pass of prefix sums.

    Suffix sums are prefix sums of the flipped chunk, never total - prefix: the adjoint through Q_t is of
    order 1/Q_t, huge at the first tokens when a coordinate starts near zero, and it cancels exactly
    (R_t = w_t^2 / Q_t stays below 1). Taken as total - prefix, that cancellation leaves an error of
    about eps / Q_0 at every later position: float32 gradients were off by up to 6% that way.
    """

    @staticmethod
    def forward(ctx, w, temp, pb, eps, chunk, keep):
        # w: (B, T, K, p) float32/64; temp: (K,); pb: (T, K) = p * b_{k,t}
        B, T, K, p = w.shape
        L = T if keep else min(chunk, T)         # the backward needs every chunk's Q, A, D, Pi; else reuse one
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
            D = torch.div(Pe, Ac + Pe, out=Ds[:, at])                # D_t = 1 / (1 + A_t / Pe_t)
            torch.mul(wc, D, out=y[:, c]).mul_(-Pi)                  # y_t = -Pi_t w_t D_t
        if keep:
            ctx.save_for_backward(w, temp, pb, Qs, As, Ds, Pis, Pes, es)
        ctx.chunk = chunk
        return y

    @staticmethod
    def backward(ctx, g):
        w, temp, pb, Qs, As, Ds, Pis, Pes, es = ctx.saved_tensors
        B, T, K, p = w.shape
        g = g.to(w.dtype)
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
            # they give de_t Q_{t-1} / Q_t^2 (as de/Q_t - de w_t^2/Q_t^2 it would cancel at the first tokens).
            # Where Q_t is clamped, R_t = w_t^2 / 1e-12 and Q_t passes nothing back.
            Qc, clamped = Q.clamp_min(1e-12), Q <= 1e-12
            Qprev = torch.cat([Qs[:, a - 1:a] if a else torch.zeros_like(Q[:, :1]), Q[:, :-1]], 1)
            own = torch.where(clamped, Qc, Qprev).div_(Qc).div_(Qc)
            gQ = w2.div_(Qc).div_(Qc).mul_(-de).masked_fill_(clamped, 0)   # via Q_t, for the later tokens
            gw2 = RA.mul_(Pi4).addcmul_(de.expand_as(Qc), own)       # via A, and via the token's own R_t
            SQc = _suffix_sum(gQ, SQ)
            gw2[:, :-1] += SQc[:, 1:]                                # via Q_t' of the later tokens t' > t
            gw2[:, -1:] += SQ
            SQ = SQc[:, :1]
            torch.addcmul(gD.mul_(-Pi4), wc, gw2, value=2, out=gw[:, c])   # direct path of y = -Pi w D, and w2 = w^2
        gtemp = (dls * (es + pb)).sum((0, 1))
        gpb = (dls * temp).sum(0)
        return gw, gtemp, gpb, None, None, None


def _suffix_sum(x, carry):
    """sum_{t' >= t} x_t' over dim 1 (time) within a chunk, plus `carry`, the sum over the later chunks."""
    f = torch.flip(x, [1])
    f[:, :1] += carry
    return torch.flip(f.cumsum_(1), [1])
