"""
The Token Statistics Transformer (ToST) in one file.

Wu, Ding, Lu, Pai, Zhang, Wang, Yu, Ma, Haeffele. "Token Statistics Transformer: Linear-Time
Attention via Variational Rate Reduction". ICLR 2025. arXiv:2412.17810.

The idea. Rate reduction scores n tokens Z of width d, split softly into K groups by memberships Pi:
    Delta R(Z, Pi) = R(Z) - R_c(Z, Pi),
the coding rate R of all the tokens together minus R_c, the pi-weighted coding rates of the groups: a good
representation expands the whole and compresses each group. Both are log-determinants of second-moment
matrices. The exact gradient step on R_c (ReduNet's compression layer) goes through each group's d x d
second moment and its inverse: O(K (n d^2 + d^3)), linear in n but heavy in d. CRATE's attention (MSSA)
descends a related term, sum_k R(Z U_k) without memberships, in a pairwise form whose n x n inverse it
replaces by a softmax of similarities: O(n^2 d). ToST replaces R_c by a variational form R^var_c that sees
the tokens only through a DIAGONAL statistic per group; one gradient step on it, Pi held fixed, is Token
Statistics Self-Attention (TSSA): O(n d) time beyond its two d x d projections (O(n d^2), as any linear
layer), O(d) extra memory. Its saving over the exact step is in d, over softmax attention in n. The MLP and
the rest are not derived from the objective, and only the compression half of rate reduction is unrolled.

Notation (the paper's). Tokens z_1 .. z_n in R^d. K heads, also called groups; p = d / K. U_k in R^{d x p}
projects onto head k: w_jk = U_k^T z_j. Memberships pi_jk >= 0, sum_k pi_jk = 1: how much token j belongs
to group k. Per group, with squares taken coordinate by coordinate:
    n_k = sum_j pi_jk                the group's size
    s_k = sum_j pi_jk w_jk^2         p numbers, its pi-weighted sum of squares
    s_k / n_k                        its pi-weighted mean square along each of its p coordinates
Tokens are ROWS, here and in every formula of this project: x and Z are (B, n, d), w is (B, K, n, p), Pi is
(B, K, n). The paper writes tokens as columns, so its Z diag(pi_k) Z^T is our M_k = Z^T diag(pi_k) Z, the same
d x d matrix; Pi[:, k] is the paper's column pi_k (its Pi is n x K). A tensor line's comment gives its
result's shape, then, where it helps, the formula.

First read, in order (lines of this file, spanning the definitions named in brackets):
  lines 58-90     the objective, the paper's equation 4 (variational_compression, compression_of_projections)
  lines 97-202    the white-box gradient step, then the practical operator (TSSA)
  lines 209-333   prefix sums, the recurrent state, what the causal step descends (TSSAState, CausalTSSA)
  lines 340-433   the block, and when it descends R^var_c of the normalised tokens (MLP, Block)
  lines 440-634   the language model, and generation with the recurrent state (GPTConfig, GPT)
The engineering starts there: the vision model (ViT), the softmax baseline, three options beyond the paper
(TokenShift, LocalPatchInteraction, softmax_layers), presets, optimizer groups, FLOP counts.
derivation.py is the lecture: each step of the derivation computed with these lines, in float64
(read with its outputs in docs/lecture.md).
tost_fast.py, tost_triton.py: fused cores for CausalTSSA's training (CPU, CUDA), same numbers to rounding.
"""

import math
from dataclasses import dataclass, fields
from typing import NamedTuple, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

import tost_fast

# -----------------------------------------------------------------------------
# 1. The objective


def variational_compression(Z, Pi, U, alpha=1.0):
    """R^var_c(Z, Pi | {U_k}), the paper's equation 4: the compression term of rate reduction,

        R_c(Z, Pi) = 1/2 sum_k (n_k / n) logdet(I + alpha / n_k  M_k),   M_k = Z^T diag(pi_k) Z,

    alpha = d / eps^2 in the paper (eps the coding precision; the practical operator has alpha = 1, absorbed
    into U). R^var_c takes each log-determinant, logdet(I + alpha/n_k M_k) = sum_i f(lambda_i(M_k / n_k))
    with f(x) = log(1 + alpha x), on the diagonal of M_k / n_k in the basis U_k, which is s_k / n_k, instead
    of on its eigenvalues:

        R^var_c = 1/2 sum_k (n_k / n) sum_i f(s_ki / n_k)

    An upper bound on R_c for square orthogonal U_k (f is concave; the diagonal is majorised by the
    eigenvalues), tight in the eigenbasis. ToST's U_k are d x p, p < d: that drops d - p terms >= 0 per
    group, and R^var_c is then no bound in general: on random tokens it falls below R_c (every one of 300
    draws in derivation.py section 5), and by the paper's corollary it is an upper bound again when U_k has
    orthonormal columns and M_k lies inside span(U_k) (all 300 draws there). It is the objective the layers
    descend.

    Z: (B, n, d) tokens as rows.  Pi: (B, K, n), summing to 1 over K.  U: (K, d, p).  Returns (B,).
    """
    w = torch.einsum('bnd,kdp->bknp', Z, U)                # (B, K, n, p)  w_jk = U_k^T z_j
    return compression_of_projections(w, Pi, alpha)


def compression_of_projections(w, Pi, alpha=1.0):
    """R^var_c from the projected tokens w (B, K, n, p) and Pi (B, K, n). Returns (B,)."""
    n = w.shape[2]
    s = torch.einsum('bkn,bknp->bkp', Pi, w * w)           # (B, K, p)  s_k = sum_j pi_jk w_jk^2
    n_k = Pi.sum(dim=2)                                    # (B, K)     n_k = sum_j pi_jk
    # A group without tokens (s_k = n_k = 0) adds its term's limit, 0, not 0 * f(0 / 0).
    logs = torch.log1p(alpha * s / n_k.clamp_min(1e-30).unsqueeze(-1))    # (B, K, p)  f(s_k / n_k)
    return 0.5 * ((n_k / n) * logs.sum(-1)).sum(-1)        # (B,)


# -----------------------------------------------------------------------------
# 2. TSSA: a gradient step on R^var_c is an attention layer


class TSSA(nn.Module):
    """Token Statistics Self-Attention, non-causal (the vision operator).

    The white-box step. Hold Pi fixed. The gradient of R^var_c with respect to token z_j is

        grad_{z_j} R^var_c = 1/n sum_k pi_jk U_k D_k U_k^T z_j,    D_k = diag(f'(s_k / n_k)),
        f'(x) = alpha / (1 + alpha x),

    and one gradient-descent step of size tau is the layer  z_j <- z_j + TSSA(Z)  with

        TSSA(Z) = -tau/n sum_k diag(pi_k) Z U_k D_k U_k^T          (tokens as rows).

    whitebox=True computes exactly this: -tau grad_Z R^var_c with Pi held fixed (the layer estimates Pi from
    Z; Pi's own dependence on Z is not part of the step). Tokens interact only through the statistics of
    each head: n_k, s_k and the p column sums of squares Pi uses, 2p + 1 numbers, whatever n is (section 9 of
    derivation.py rebuilds each token's output from the token and these numbers alone).

    Which directions shrink. When the U_k together form an orthogonal d x d matrix, the step multiplies
    coordinate i of token j in head k by 1 - tau pi_jk D_ki / n, in [0, 1) for a step with tau alpha <= n.
    D_ki = alpha / (1 + alpha s_ki/n_k) is largest where the group's mean square s_ki/n_k is smallest: as a
    fraction, a group's weak directions shrink most and its strong ones least. That is the compression:
    each group is pulled towards its dominant subspace (derivation.py section 7; a larger step overshoots).

    The practical operator (the released one; the default) changes the white-box step in six ways:
      1. alpha is absorbed into the projection (U -> sqrt(alpha) U turns f' into 1/(1 + x); Pi of way 5
         ignores a head's scale, so the memberships stay as they were);
      2. the map back is a separately learned c_proj instead of U_k. It absorbs tau/n, at the n it was
         trained at only. Tied to c_attn's transpose, with no biases and nothing added to n_k (self.eps = 0),
         the layer is exactly -n grad R^var_c; with head k's block of the tie scaled by c_k > 0, exactly a
         step on the reweighted sum_k c_k R^var_c,k; a generic learned c_proj makes it a field that is the
         gradient of no function (derivation.py section 9);
      3. optional biases on both projections (the ViT has them);
      4. dropout on D (attn_dropout; the paper's models use none);
      5. Pi from each coordinate normalised over the tokens, with a learned per-head temperature
         (memberships(); whitebox=True estimates Pi the same way, and holds it fixed);
      6. 1e-8 added to n_k.
    """

    def __init__(self, n_embd, n_head, bias=False, dropout=0.0, whitebox=False, alpha=1.0, tau=1.0):
        super().__init__()
        _check_shape(n_embd, n_head, 'tssa')
        if whitebox and (bias or dropout):
            raise ValueError("white-box TSSA needs bias=False and dropout=0: it is exactly the gradient step")
        self.n_head = n_head
        self.head_dim = n_embd // n_head
        # one projection for all heads: rows k*p to (k+1)*p - 1 of the weight are U_k^T
        # (q = k = v in attention terms)
        self.c_attn = nn.Linear(n_embd, n_embd, bias=bias)
        self.temp = nn.Parameter(torch.ones(n_head, 1))        # per-head inverse temperature of Pi
        self.whitebox = whitebox
        self.alpha = alpha
        self.tau = tau
        # a guard added to n_k, not the coding precision eps of alpha = d / eps^2; the white-box step has 0
        self.eps = 0.0 if whitebox else 1e-8
        self.c_proj = None if whitebox else nn.Linear(n_embd, n_embd, bias=bias)
        self.attn_dropout = nn.Dropout(dropout)
        self.resid_dropout = nn.Dropout(dropout)

    def split_heads(self, y):                                  # (B, n, d) -> (B, K, n, p)
        B, n, _ = y.shape
        return y.view(B, n, self.n_head, self.head_dim).transpose(1, 2)

    def merge_heads(self, y):                                  # (B, K, n, p) -> (B, n, d)
        B, K, n, p = y.shape
        return y.transpose(1, 2).reshape(B, n, K * p)

    def U(self):
        """The per-head projections U_k as a (K, d, p) tensor, for variational_compression."""
        d = self.c_attn.weight.shape[1]
        return self.c_attn.weight.view(self.n_head, self.head_dim, d).transpose(1, 2)

    def memberships(self, w):
        """Pi, estimated from the tokens: a softmax over the heads, so the heads compete for each token and
        its memberships sum to 1 (rate reduction's soft partition). The derivation scores token j for group
        k by ||U_k^T z_j||^2 / (2 eta), eta the variance of the noise around each subspace, learned as one
        temperature; the released code, followed here, learns an inverse temperature temp_k per head and
        first divides each coordinate by its sum of squares over the tokens, so a head's score ignores its
        projection's scale:

            pi_jk = softmax_k( temp_k * sum_i w_jki^2 / sum_l w_lki^2 )

        Each head's scores then sum to p over the n tokens, about p/n each, so at temp_k = 1 Pi is near
        1/K when n >> p, and sharpens only where a token carries much of a head's energy (derivation.py
        section 8).
        w: (B, K, n, p) -> Pi: (B, K, n), summing to 1 over K.
        """
        w2 = w * w
        energy = w2 / w2.sum(dim=2, keepdim=True).clamp_min(1e-24)    # (B, K, n, p)  column-normalised
        return torch.softmax(self.temp * energy.sum(-1), dim=1)         # (B, K, n)

    def forward(self, x):
        B, n, d = x.shape
        w = self.split_heads(self.c_attn(x))                   # (B, K, n, p)  w_j = U_k^T z_j
        out_dtype = w.dtype
        # sums over tokens run in float32 under half-precision autocast (_stat_dtype, section 8 below)
        w = w.to(_stat_dtype(w))
        Pi = self.memberships(w).unsqueeze(-1)                 # (B, K, n, 1)  pi_jk
        n_k = Pi.sum(dim=2, keepdim=True) + self.eps           # (B, K, 1, 1)  n_k = sum_j pi_jk
        s = (Pi * w * w).sum(dim=2, keepdim=True)              # (B, K, 1, p)  s_k = sum_j pi_jk w_j^2
        D = self.alpha / (1 + self.alpha * (s / n_k))          # (B, K, 1, p)  D_k = f'(s_k / n_k)
        D = self.attn_dropout(D)
        y = -(Pi * w) * D                                      # (B, K, n, p)  minus: gradient *descent*
        y = self.merge_heads(y.to(out_dtype))                  # (B, n, d)
        if self.whitebox:
            return (self.tau / n) * (y @ self.c_attn.weight)   # (B, n, d)  sum_k U_k (...): U_k maps back
        return self.resid_dropout(self.c_proj(y))              # (B, n, d)  learned map back (absorbs tau/n)


# -----------------------------------------------------------------------------
# 3. Causal TSSA: every sum over tokens becomes a prefix sum


class TSSAState(NamedTuple):
    """Everything a causal TSSA layer remembers of the past, per head: 2p + 1 numbers, at any length. The
    released code has no such state (it runs the whole prefix again for each new token); the prefix sums
    below are what make it possible."""
    Q: torch.Tensor   # (B, K, p)  sum_{j<t} w_j^2           Pi's normaliser (Q_{t-1} in the formulas)
    A: torch.Tensor   # (B, K, p)  sum_{j<t} pi_j w_j^2      s_k of the prefix
    P: torch.Tensor   # (B, K)     sum_{j<t} pi_j            n_k of the prefix
    t: int            # tokens seen so far (the next token's position)


class CausalTSSA(TSSA):
    """TSSA with every sum over tokens j replaced by the sum over j <= t (the released language operator):

        Q_t  = sum_{j<=t} w_j^2                                         (clamped at >= 1e-12)
        pi_t = softmax_k( temp_k * sum_i [ w_ti^2 / Q_ti + b_{k,t} ] )  b: learned bias per head and position
        A_t  = sum_{j<=t} pi_j w_j^2,   P_t = sum_{j<=t} pi_j           the prefix's s_k and n_k
        y_t  = -pi_t w_t / (1 + A_t / (P_t + 1e-8)),   then c_proj

    y_t depends on tokens <= t only; each token j entered A_t with the membership it had at its own time.

    What it descends. Tie c_proj to c_attn's transpose (U_k maps back), no biases, add nothing to n_k, and
    hold the memberships pi_0 .. pi_t fixed as the layer computed them. Then at every position t, with y_tk
    head k's part of y_t before c_proj,

        sum_k U_k y_tk = -(t+1) grad_{z_t} R^var_c(Z_{<=t}, Pi_{<=t}):

    each token takes a unit gradient step, with respect to itself, on (t+1) R^var_c of its own prefix, as
    the non-causal layer tied is a unit step on n R^var_c. temp and b enter only Pi, so this holds for any.
    On R^var_c itself, a late token takes a larger step than an early one, and no learned c_proj absorbs the
    t+1 as it absorbs n: the factor changes along the sequence.

    prefix_memberships() is TSSA.memberships() with the sums over tokens taken over the prefix (its own
    arguments: the squares and their prefix sums, not w). forward() computes all positions at once with
    cumsum; step() advances one token from a TSSAState in O(p) per head: the same numbers. Sums run in
    float32 under bf16/fp16 autocast (float16 overflows past 65504; a running bf16 sum stalls). On large
    inputs forward() runs a fused core with these numbers to rounding (tost_fast.py says when; fast = False
    keeps these lines, as a gradient of a gradient needs); a subclass with its own prefix_memberships() or
    forward() runs its own lines, unless its class says fast = True (docs/models.md).
    """

    fast = True

    def __init_subclass__(cls, **kwargs):
        # the fused cores compute these memberships and this forward: a subclass with others (its own, a
        # mixin's) runs its readable lines
        super().__init_subclass__(**kwargs)
        for name in ('prefix_memberships', 'forward'):
            if getattr(cls, name) is not getattr(CausalTSSA, name) and 'fast' not in cls.__dict__:
                cls.fast = False

    def __init__(self, n_embd, n_head, block_size, bias=False, dropout=0.0):
        super().__init__(n_embd, n_head, bias=bias, dropout=dropout)
        if not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"causal TSSA needs block_size, its number of positions; got {block_size!r}")
        self.block_size = block_size
        self.pos_bias = nn.Parameter(torch.zeros(n_head, block_size))   # b_{k,t}, init 0 (no weight decay)

    def empty_state(self, batch_size, device=None, dtype=torch.float32):
        Q = torch.zeros(batch_size, self.n_head, self.head_dim, device=device, dtype=dtype)
        P = torch.zeros(batch_size, self.n_head, device=device, dtype=dtype)
        return TSSAState(Q, torch.zeros_like(Q), P, 0)

    def check_state(self, state, tokens, batch):
        """Raises if the tokens would run past block_size (b_{k,t} has an entry per position), or if the state
        holds another batch size (its sums would broadcast)."""
        end = (0 if state is None else state.t) + tokens
        if end > self.block_size:
            raise ValueError(f"position {end - 1} is past block_size ({self.block_size})")
        if state is not None and state.P.shape[0] != batch:
            raise ValueError(f"a state of {state.P.shape[0]} sequences for a batch of {batch}")

    def prefix_memberships(self, w2, Q, t0=0):
        """pi_t from the tokens up to t: TSSA.memberships with each sum over all tokens replaced by the prefix
        sum Q_t. w2 = w^2 and Q: (B, K, T, p) at positions t0 .. t0+T-1 -> Pi: (B, K, T)."""
        energy = (w2 / Q.clamp_min(1e-12)).sum(-1)            # (B, K, T)     sum_i w_ti^2 / Q_ti
        # b_{k,t} is added to each of the p coordinates before the sum over i, hence p * b
        logits = self.temp * (energy + self.head_dim * self.pos_bias[:, t0:t0 + w2.shape[2]])
        return torch.softmax(logits, dim=1)                    # (B, K, T)     softmax over heads

    def forward(self, x, state: Optional[TSSAState] = None):
        """Parallel form. x: (B, T, d). Without a state: returns y (B, T, d), the training path.
        With a state (from empty_state() or an earlier call): continues after it, returns (y, new_state)."""
        self.check_state(state, x.shape[1], x.shape[0])
        # large inputs on a CPU, and CUDA: the same numbers from a fused core; the readable lines follow
        if state is None and tost_fast.usable(self, x):
            return tost_fast.causal_tssa(self, x)
        w = self.split_heads(self.c_attn(x))                   # (B, K, T, p)  w_t = U_k^T z_t
        dt = _stat_dtype(w)
        w2 = w.to(dt).square()                                 # (B, K, T, p)
        # prefix_sum(x, dim) is torch.cumsum(x, dim), laid out for a fast scan (section 8 below)
        Q = prefix_sum(w2, dim=2)                              # (B, K, T, p)  Q_t
        if state is not None:
            Q = Q + state.Q.unsqueeze(2)
        Pi = self.prefix_memberships(w2, Q, 0 if state is None else state.t)   # (B, K, T)  pi_t
        A = prefix_sum(Pi.unsqueeze(-1) * w2, dim=2)           # (B, K, T, p)  A_t: s_k of tokens <= t
        P = prefix_sum(Pi, dim=2)                              # (B, K, T)     P_t: n_k of tokens <= t
        if state is not None:
            A = A + state.A.unsqueeze(2)
            P = P + state.P.unsqueeze(2)
        D = self.attn_dropout(1 / (1 + A / (P.unsqueeze(-1) + self.eps)))   # (B, K, T, p)  f'(A_t / P_t)
        y = -(Pi.unsqueeze(-1) * w.to(dt)) * D                 # (B, K, T, p)  descent step, weighted by pi_t
        y = self.resid_dropout(self.c_proj(self.merge_heads(y.to(w.dtype))))   # (B, T, d)
        if state is None:
            return y
        # the last position's sums, copied: a view would keep the prefix sums of every position alive
        return y, TSSAState(Q[:, :, -1].clone(), A[:, :, -1].clone(), P[:, :, -1].clone(),
                            state.t + x.shape[1])

    def step(self, x, state: TSSAState):
        """Recurrent form: one token x (B, d) and the state after t tokens -> (y (B, d), state after t+1).
        The same formulas as forward() without dropout (generation runs in eval mode), each prefix sum
        advanced by one term, the token's own included before pi_t: O(p) work per head."""
        B, d = x.shape
        p = self.head_dim
        self.check_state(state, 1, B)
        w = self.c_attn(x).view(B, self.n_head, p)             # (B, K, p)
        dt = _stat_dtype(w)
        w2 = w.to(dt).square()
        Q = state.Q + w2                                       # (B, K, p)
        Pi = self.prefix_memberships(w2[:, :, None], Q[:, :, None], state.t)[:, :, 0]   # (B, K)  pi_t
        A = state.A + Pi.unsqueeze(-1) * w2                    # (B, K, p)
        P = state.P + Pi                                       # (B, K)
        y = -(Pi.unsqueeze(-1) * w.to(dt)) / (1 + A / (P.unsqueeze(-1) + self.eps))   # (B, K, p)
        y = self.c_proj(y.to(w.dtype).reshape(B, d))           # (B, d)
        return y, TSSAState(Q, A, P, state.t + 1)


# -----------------------------------------------------------------------------
# 4. MLP and block


class MLP(nn.Module):
    """Linear(d, 4d), GELU, Linear(4d, d): the transformer's MLP, kept as is. It is not derived from the
    objective (CRATE's block has a sparse-coding step there; ToST does not use it)."""

    def __init__(self, n_embd, bias=False, dropout=0.0, ratio=4):
        super().__init__()
        self.c_fc = nn.Linear(n_embd, ratio * n_embd, bias=bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(ratio * n_embd, n_embd, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    """The paper's block: pre-LayerNorm, with layer-scale vectors gamma_1, gamma_2.

        x = x + gamma_1 * attn(LN(x))
        x = x + gamma_2 * MLP(LN(x))

    attn is chosen per block: 'tssa' (CausalTSSA if causal, else TSSA) or 'softmax' (the baseline). TSSA
    tied (c_proj = c_attn^T, no biases, nothing added to n_k) is an exact step of size n on R^var_c of its
    input, Pi held fixed (causal: token t's step has size t + 1, on its prefix); here its input is LN(x) and
    its output is scaled coordinate by coordinate by gamma_1 before it is added to x, not to LN(x). That is
    no longer a gradient step. Non-causal and tied, with gamma_1 = s 1 (its coordinates equal, as they are
    at initialisation) and LayerNorm's gain a 1, s and a > 0, it is a descent direction for R^var_c(LN(x)):
    to first order each token j changes it by -(n s a / sigma_j) g_j^T P_j g_j <= 0 (g_j its gradient with
    respect to LN(x), P_j the normalisation's projector, sigma_j the token's std). For unequal gamma_1
    (trained layer scales) it is not guaranteed; derivation.py section 10 measures how often it holds. The
    softmax baseline and the options beyond the paper (token_shift, lpi, drop_path), and
    forward_with_options() that runs them, are in section 7 below.
    """

    def __init__(self, n_embd, n_head, attn='tssa', causal=True, block_size=None, bias=False, dropout=0.0,
                 layerscale_init=1e-5, drop_path=0.0, token_shift=False, lpi=False):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd, bias=bias)
        self.shift = TokenShift(n_embd) if token_shift else None
        if attn == 'softmax':
            self.attn = SoftmaxAttention(n_embd, n_head, causal, bias=bias, dropout=dropout)
        elif attn != 'tssa':
            raise ValueError(f"unknown attn {attn!r}")
        elif causal:
            self.attn = CausalTSSA(n_embd, n_head, block_size, bias=bias, dropout=dropout)
        else:
            self.attn = TSSA(n_embd, n_head, bias=bias, dropout=dropout)
        self.lpi = None
        if lpi:
            self.ln_3 = nn.LayerNorm(n_embd, bias=bias)
            self.lpi = LocalPatchInteraction(n_embd)
            self.gamma_3 = nn.Parameter(torch.full((n_embd,), float(layerscale_init)))
        self.ln_2 = nn.LayerNorm(n_embd, bias=bias)
        self.mlp = MLP(n_embd, bias, dropout)
        self.gamma_1 = nn.Parameter(torch.full((n_embd,), float(layerscale_init)))
        self.gamma_2 = nn.Parameter(torch.full((n_embd,), float(layerscale_init)))
        self.drop_path = drop_path

    def forward(self, x, grid=None):
        if self.shift is not None or self.lpi is not None or self.drop_path:
            return forward_with_options(self, x, grid)
        x = x + self.gamma_1 * self.attn(self.ln_1(x))
        x = x + self.gamma_2 * self.mlp(self.ln_2(x))
        return x

    # generation: the same two lines with the attention's recurrent state carried (TokenShift's too)

    def prefill(self, x, state):                             # x: (B, T, d) after `state` -> (x, new state)
        h = self.ln_1(x)
        if self.shift is None:
            a, state = self.attn(h, state)
        else:
            h, last = self.shift(h, state.last.to(h.dtype))
            a, st = self.attn(h, state.attn)
            state = ShiftState(st, last)
        x = x + self.gamma_1 * a
        return x + self.gamma_2 * self.mlp(self.ln_2(x)), state

    def step(self, x, state):                                # x: (B, d), one token -> (x, new state)
        h = self.ln_1(x)
        if self.shift is None:
            a, state = self.attn.step(h, state)
        else:
            # TokenShift's formula for one token (the module's call would cost more than the formula); the
            # token's own h becomes the next one's h_{t-1}
            a, st = self.attn.step(h + self.shift.mu * (state.last.to(h.dtype) - h), state.attn)
            state = ShiftState(st, h)
        x = x + self.gamma_1 * a
        return x + self.gamma_2 * self.mlp(self.ln_2(x)), state

    def empty_state(self, batch_size, device=None):
        st = self.attn.empty_state(batch_size, device)
        return st if self.shift is None else ShiftState(st, torch.zeros(batch_size, self.ln_1.weight.numel(),
                                                                         device=device))


# -----------------------------------------------------------------------------
# 5. The language model


@dataclass
class GPTConfig:
    block_size: int = 1024
    vocab_size: int = 50304     # GPT-2's 50257 padded up to a multiple of 64
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = False
    attn: str = 'tssa'          # 'tssa' or 'softmax' (everything else equal)
    layerscale_init: float = 1e-5
    token_shift: bool = False   # not in the paper: mix each token with the previous one before attention
    # not in the paper: these blocks (-1: the last) get softmax attention (section 7 below)
    softmax_layers: tuple = ()

    def __post_init__(self):
        _check_positive(self, 'block_size', 'vocab_size', 'n_layer', 'n_head', 'n_embd')
        _check_shape(self.n_embd, self.n_head, self.attn)
        n = self.n_layer
        layers = self.softmax_layers
        if isinstance(layers, int):                             # -1 as on the command line
            layers = (layers,)
        if any(not isinstance(i, int) or not -n <= i < n for i in layers):
            raise ValueError(f"softmax_layers {list(layers)} must be block indices from {-n} to {n - 1}")
        if layers and self.attn != 'tssa':
            raise ValueError("softmax_layers makes chosen blocks of a ToST model softmax; "
                             "with attn='softmax' every block is already")
        self.softmax_layers = tuple(sorted({i % n for i in layers}))   # -1 -> n-1: one name per model


class GPT(nn.Module):
    """nanoGPT's GPT-2 with causal TSSA in place of attention, as in the paper: learned absolute
    positions, tied token embedding and LM head, GPT-2 init, pre-LN blocks with layer-scale."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = c = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(c.vocab_size, c.n_embd),
            wpe=nn.Embedding(c.block_size, c.n_embd),
            drop=nn.Dropout(c.dropout),
            h=nn.ModuleList([Block(c.n_embd, c.n_head, 'softmax' if i in c.softmax_layers else c.attn,
                                   block_size=c.block_size, bias=c.bias, dropout=c.dropout,
                                   layerscale_init=c.layerscale_init, token_shift=c.token_shift)
                             for i in range(c.n_layer)]),
            ln_f=nn.LayerNorm(c.n_embd, bias=c.bias),
        ))
        self.lm_head = nn.Linear(c.n_embd, c.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight      # weight tying
        self.apply(self._init_weights)
        for name, p in self.named_parameters():                # GPT-2: scaled init of residual projections
            if name.endswith('c_proj.weight'):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * c.n_layer))

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            torch.nn.init.zeros_(module.bias)

    def get_num_params(self, non_embedding=True):
        """Parameter count; like nanoGPT, without the position embedding (the token embedding is the
        LM head's weight, so it is counted)."""
        n = sum(p.numel() for p in self.parameters())
        return n - self.transformer.wpe.weight.numel() if non_embedding else n

    def _embed(self, idx, t0=0):
        if idx.dim() != 2 or idx.shape[1] == 0:
            raise ValueError(f"expected token ids of shape (B, T), T >= 1; got {tuple(idx.shape)}")
        T = idx.shape[1]
        if t0 + T > self.config.block_size:
            raise ValueError(f"sequence of {t0 + T} tokens is longer than block_size "
                             f"({self.config.block_size})")
        pos = torch.arange(t0, t0 + T, dtype=torch.long, device=idx.device)
        return self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))   # (B, T, d)

    def forward(self, idx, targets=None):
        """idx (B, T) -> (logits, loss). Logits for every position when targets are given, else only for
        the last position (B, 1, vocab), as nanoGPT. targets == -1 are ignored."""
        x = self._hidden(idx)
        if targets is None:
            return self.lm_head(x[:, [-1], :]), None
        logits = self.lm_head(x)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1)
        return logits, loss

    def logits(self, idx):
        """idx (B, T) -> the logits at every position (B, T, vocab), no loss: for scoring each token apart."""
        return self.lm_head(self._hidden(idx))

    def _hidden(self, idx):
        x = self._embed(idx)
        for block in self.transformer.h:
            x = block(x)
        return self.transformer.ln_f(x)

    # --- generation with the recurrent state -------------------------------------------------------

    def empty_state(self, batch_size, device=None):
        return [block.empty_state(batch_size, device) for block in self.transformer.h]

    def _checked(self, states):
        if len(states) != len(self.transformer.h):             # another model's states
            raise ValueError(f"{len(states)} states for a model of {len(self.transformer.h)} blocks")
        return states

    def prefill(self, idx, states=None):
        """Run a chunk of tokens in parallel after `states` (None: from the start).
        Returns logits of the last position (B, vocab) and the states after the chunk."""
        states = self.empty_state(idx.shape[0], idx.device) if states is None else self._checked(states)
        x = self._embed(idx, states[0].t)
        new_states = []
        for block, st in zip(self.transformer.h, states):
            x, st = block.prefill(x, st)
            new_states.append(st)
        return self.lm_head(self.transformer.ln_f(x[:, -1])), new_states

    def step(self, idx, states):
        """One token per sequence, idx (B,), in O(1) time per token with TSSA (a growing KV cache in
        softmax blocks). states: one per block, its own kind (TSSAState, KVCache, ShiftState around either).
        Returns logits (B, vocab) and the new states. Stream under torch.no_grad(), as generate() does: with
        autograd on, every step's graph is kept."""
        x = self._embed(idx[:, None], self._checked(states)[0].t)[:, 0]
        new_states = []
        for block, st in zip(self.transformer.h, states):
            x, st = block.step(x, st)
            new_states.append(st)
        return self.lm_head(self.transformer.ln_f(x)), new_states

    @torch.no_grad()
    def generate_stream(self, idx, max_new_tokens, temperature=1.0, top_k=None, generator=None):
        """Yield new tokens (B,) one at a time: the prompt prefilled in parallel, then one step per token at
        the same cost at any context length (TSSA's state does not grow; a softmax block's KV cache does).
        The model sees at most block_size tokens: a longer prompt is cropped to its last block_size, and a
        full window restarts from its last half. temperature=0 is greedy; top_k None or 0 samples from
        every token. Runs in eval mode (dropout would make the prefill and the steps disagree)."""
        if idx.dim() != 2 or idx.shape[1] == 0:
            raise ValueError(f"generate needs a prompt of shape (B, T) with T >= 1, got {tuple(idx.shape)}")
        if not temperature >= 0 or (top_k or 0) < 0:
            raise ValueError(f"generate needs temperature >= 0 and top_k >= 0, got {temperature} and {top_k}")
        was_training = self.training
        bs = self.config.block_size
        self.eval()
        try:
            ctx = idx[:, -bs:]
            logits, states = self.prefill(ctx)
            for _ in range(max_new_tokens):
                if temperature < torch.finfo(torch.float32).tiny:   # 0, or below the smallest normal: greedy
                    nxt = logits.argmax(dim=-1)
                else:
                    # in float32 (float16 overflows at a low temperature), less the largest first (so that
                    # at a tiny one the rest go to -inf, not every one to inf)
                    logits = logits.float()
                    logits = (logits - logits.amax(-1, keepdim=True)) / temperature
                    if top_k:                                   # None or 0: sample from every token
                        v, i = torch.topk(logits, min(top_k, logits.size(-1)))
                        logits = torch.full_like(logits, -float('inf')).scatter(-1, i, v)   # k, ties or not
                    probs = F.softmax(logits, dim=-1)
                    nxt = torch.multinomial(probs, num_samples=1, generator=generator).squeeze(1)
                yield nxt
                ctx = torch.cat([ctx, nxt[:, None]], dim=1)
                if ctx.shape[1] > bs:                           # window full: restart from its last half
                    ctx = ctx[:, -max(1, bs // 2):]
                    logits, states = self.prefill(ctx)
                else:
                    logits, states = self.step(nxt, states)
        finally:
            self.train(was_training)

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, generator=None):
        """idx (B, T) -> (B, T + max_new_tokens), sampling with the recurrent state (see generate_stream)."""
        new = list(self.generate_stream(idx, max_new_tokens, temperature, top_k, generator))
        return torch.cat([idx] + [t[:, None] for t in new], dim=1)

    # --- training helpers --------------------------------------------------------------------------

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        return make_optimizer(self, weight_decay, learning_rate, betas, device_type)

    def flops_per_token(self, T=None):
        """Training FLOPs per token (forward + backward = 3x forward): 6N for the weight matmuls plus the
        attention cores. A TSSA core does 11 elementwise operations per coordinate and token (w^2, cumsum Q,
        w^2/Q, sum over i, pi w^2, cumsum A, A/P, 1 + ., 1/., pi w, times D): no T. A softmax core does
        q k^T and att @ v, 2 x 2 d T per token, half of it masked."""
        c = self.config
        T = c.block_size if T is None else T
        soft = c.n_layer if c.attn == 'softmax' else len(c.softmax_layers)
        cores = (c.n_layer - soft) * 11 * c.n_embd + soft * 2 * c.n_embd * T
        return 6 * self.get_num_params() + 3 * cores

    def estimate_mfu(self, fwdbwd_per_iter, dt, T=None, peak_flops=312e12):
        """Model FLOPs utilisation: achieved FLOP/s over peak_flops (default A100 bf16, 312 TFLOP/s)."""
        T = self.config.block_size if T is None else T
        return self.flops_per_token(T) * T * fwdbwd_per_iter / dt / peak_flops


# -----------------------------------------------------------------------------
# 6. The vision model


@dataclass
class ViTConfig:
    img_size: int = 224
    patch_size: int = 16        # a power of 2: log2(patch_size) stride-2 convolutions
    in_chans: int = 3
    num_classes: int = 1000
    n_layer: int = 12
    n_head: int = 4
    n_embd: int = 192
    n_cls_layer: int = 2        # XCiT's class-attention blocks after the TSSA blocks
    dropout: float = 0.0
    drop_path: float = 0.0
    bias: bool = True
    attn: str = 'tssa'
    layerscale_init: float = 1.0
    lpi: bool = False           # not in the paper: XCiT's local patch interaction in every block

    def __post_init__(self):
        # n_cls_layer >= 1: the head reads the class token, which only class attention writes into
        _check_positive(self, 'img_size', 'patch_size', 'in_chans', 'num_classes', 'n_layer', 'n_head',
                        'n_embd', 'n_cls_layer')
        _check_shape(self.n_embd, self.n_head, self.attn)
        p = self.patch_size
        if p < 2 or p & (p - 1):
            raise ValueError(f"patch_size must be a power of 2 >= 2, got {p}")
        if self.img_size % p:
            raise ValueError(f"image size {self.img_size} is not divisible by patch_size {p}")
        if self.n_embd % (p // 2):
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by patch_size/2 ({p // 2})")


class ConvPatchEmbed(nn.Module):
    """XCiT's patch embedding: log2(patch) 3x3 stride-2 convolutions with BatchNorm (GELU between),
    widening to n_embd. (B, in_chans, H, W) -> (B, H/patch * W/patch, d) and the grid size."""

    def __init__(self, in_chans, n_embd, patch_size):
        super().__init__()
        k = int(math.log2(patch_size))
        widths = [in_chans] + [n_embd // 2 ** (k - 1 - i) for i in range(k)]   # e.g. 3, d/8, d/4, d/2, d
        layers = []
        for i in range(k):
            layers += [nn.Conv2d(widths[i], widths[i + 1], 3, stride=2, padding=1, bias=False),
                       nn.BatchNorm2d(widths[i + 1])]
            if i < k - 1:
                layers.append(nn.GELU())
        self.proj = nn.Sequential(*layers)

    def forward(self, x):
        x = self.proj(x)                                        # (B, d, Hp, Wp)
        return x.flatten(2).transpose(1, 2), x.shape[-2:]


class FourierPositions(nn.Module):
    """2-D sinusoidal positional encoding of the patch grid, mapped to n_embd by a learned 1x1 conv."""

    def __init__(self, n_embd, hidden=32, temperature=10000.0):
        super().__init__()
        self.hidden = hidden
        self.temperature = temperature
        self.proj = nn.Conv2d(2 * hidden, n_embd, kernel_size=1)

    def forward(self, B, H, W, device):
        # angles in (0, 2pi)
        ys = torch.arange(1, H + 1, device=device, dtype=torch.float32) / (H + 1e-6) * 2 * math.pi
        xs = torch.arange(1, W + 1, device=device, dtype=torch.float32) / (W + 1e-6) * 2 * math.pi
        j = torch.arange(self.hidden, device=device)
        freq = self.temperature ** (2 * (j // 2) / self.hidden)                           # (hidden,)
        def enc(c):                                            # (L,) -> (L, hidden): sin on even, cos on odd
            a = c[:, None] / freq
            return torch.where(j % 2 == 0, a.sin(), a.cos())
        pe = torch.cat([enc(ys)[:, None, :].expand(H, W, -1), enc(xs)[None, :, :].expand(H, W, -1)], dim=-1)
        pe = pe.permute(2, 0, 1).unsqueeze(0).to(self.proj.weight.dtype)                 # (1, 2h, H, W)
        return self.proj(pe).flatten(2).transpose(1, 2).expand(B, -1, -1)                # (B, HW, d)


class ClassAttention(nn.Module):
    """CaiT class attention: only the CLS token queries; keys/values are all tokens. O(n)."""

    def __init__(self, n_embd, n_head, bias=True, dropout=0.0):
        super().__init__()
        self.n_head = n_head
        self.head_dim = n_embd // n_head
        self.q = nn.Linear(n_embd, n_embd, bias=bias)
        self.kv = nn.Linear(n_embd, 2 * n_embd, bias=bias)
        self.c_proj = nn.Linear(n_embd, n_embd, bias=bias)
        self.resid_dropout = nn.Dropout(dropout)

    def forward(self, x):                                       # x: (B, 1+n, d), CLS first
        B, N, d = x.shape
        q = self.q(x[:, :1]).view(B, 1, self.n_head, self.head_dim).transpose(1, 2)    # (B, H, 1, p)
        k, v = (t.view(B, N, self.n_head, self.head_dim).transpose(1, 2) for t in self.kv(x).split(d, 2))
        att = torch.softmax((q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim), dim=-1)  # (B, H, 1, N)
        y = (att @ v).transpose(1, 2).reshape(B, 1, d)
        return self.resid_dropout(self.c_proj(y)), att[:, :, 0]  # (B, 1, d), (B, H, N)


class ClassBlock(nn.Module):
    """XCiT's class-attention block, as the released models run it (tokens_norm): the attention passes the
    normalised patch tokens through, and the second LayerNorm normalises every token, so the patch tokens
    change too (they are the next block's keys and values), and the CLS token's residual is its normalised
    self:

        cls, x   <-  cls + g1 * attn(LN1(cls, x)),  x + g1 * LN1(x)
        cls, x   <-  LN2(cls, x)
        cls, x   <-  cls + g2 * MLP(cls),  2 x

    The 2 x is XCiT's: its residual adds the MLP branch to the CLS token and the patch tokens to themselves.
    The next block's attention reads them through LN1, which removes the factor."""

    def __init__(self, n_embd, n_head, bias=True, layerscale_init=1.0, dropout=0.0):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd, bias=bias)
        self.attn = ClassAttention(n_embd, n_head, bias, dropout)
        self.ln_2 = nn.LayerNorm(n_embd, bias=bias)
        self.mlp = MLP(n_embd, bias, dropout)
        self.gamma_1 = nn.Parameter(torch.full((n_embd,), float(layerscale_init)))
        self.gamma_2 = nn.Parameter(torch.full((n_embd,), float(layerscale_init)))

    def forward(self, cls, tokens):                             # cls (B, 1, d), tokens (B, n, d)
        h = self.ln_1(torch.cat([cls, tokens], dim=1))          # (B, 1+n, d)
        a, att = self.attn(h)
        h = self.ln_2(torch.cat([cls + self.gamma_1 * a, tokens + self.gamma_1 * h[:, 1:]], dim=1))
        cls, tokens = h[:, :1], h[:, 1:]
        return cls + self.gamma_2 * self.mlp(cls), 2 * tokens, att     # (B, 1, d), (B, n, d), (B, H, 1+n)


class ViT(nn.Module):
    """ToST vision model (XCiT's backbone, as in the paper): conv patch embedding, 2-D sinusoidal positions,
    TSSA blocks on the patch tokens, then a CLS token with class-attention blocks, LayerNorm, linear head."""

    def __init__(self, config: ViTConfig):
        super().__init__()
        self.config = c = config
        self.patch_embed = ConvPatchEmbed(c.in_chans, c.n_embd, c.patch_size)
        self.pos_embed = FourierPositions(c.n_embd)
        self.drop = nn.Dropout(c.dropout)
        # one drop-path rate in every block
        self.blocks = nn.ModuleList([Block(c.n_embd, c.n_head, c.attn, causal=False, bias=c.bias,
                                           dropout=c.dropout, layerscale_init=c.layerscale_init,
                                           drop_path=c.drop_path, lpi=c.lpi)
                                     for _ in range(c.n_layer)])
        self.cls_token = nn.Parameter(torch.zeros(1, 1, c.n_embd))
        self.cls_blocks = nn.ModuleList([ClassBlock(c.n_embd, c.n_head, c.bias, c.layerscale_init, c.dropout)
                                         for _ in range(c.n_cls_layer)])
        self.norm = nn.LayerNorm(c.n_embd, bias=c.bias)
        self.head = nn.Linear(c.n_embd, c.num_classes)
        nn.init.trunc_normal_(self.cls_token, std=0.02)
        self.apply(self._init_weights)
        for m in self.modules():
            if isinstance(m, nn.LayerNorm):
                # the released vision models' (the GPT keeps 1e-5)
                m.eps = 1e-6

    def _init_weights(self, m):
        if isinstance(m, nn.Linear):
            nn.init.trunc_normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)

    def get_num_params(self):
        return sum(p.numel() for p in self.parameters())

    def _tokens(self, x):
        c = self.config
        if x.dim() != 4 or x.shape[1] != c.in_chans:
            raise ValueError(f"expected images of shape (B, {c.in_chans}, H, W), got {tuple(x.shape)}")
        H, W = x.shape[-2:]
        if H % c.patch_size or W % c.patch_size:
            raise ValueError(f"image size {H}x{W} is not divisible by patch_size {c.patch_size}")
        x, (Hp, Wp) = self.patch_embed(x)
        x = x + self.pos_embed(x.shape[0], Hp, Wp, x.device)
        # The residual stream in the weights' dtype, as the GPT's embeddings are: autocast's convolutions give
        # bf16, and a CPU's LayerNorm of bf16 input sums its weight's and bias's gradients in bf16, far off at
        # a training batch's size.
        return self.drop(x.to(self.cls_token.dtype)), (Hp, Wp)

    def forward(self, x):
        """images (B, in_chans, H, W) -> class logits (B, num_classes). H, W need not equal img_size."""
        x, grid = self._tokens(x)
        for block in self.blocks:
            x = block(x, grid=grid)
        cls = self.cls_token.expand(x.shape[0], -1, -1)
        for block in self.cls_blocks:
            cls, x, _ = block(cls, x)
        return self.head(self.norm(cls[:, 0]))

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        return make_optimizer(self, weight_decay, learning_rate, betas, device_type)


# -----------------------------------------------------------------------------
# 7. The softmax baseline, and three options beyond the paper


class KVCache(NamedTuple):
    k: torch.Tensor   # (B, H, t, p)
    v: torch.Tensor   # (B, H, t, p)
    t: int


class SoftmaxAttention(nn.Module):
    """Ordinary multi-head softmax attention through PyTorch SDPA (FlashAttention where available).
    O(n^2) time, and for generation a KV cache that grows with the context."""

    def __init__(self, n_embd, n_head, causal, bias=False, dropout=0.0):
        super().__init__()
        _check_shape(n_embd, n_head, 'softmax')
        self.n_head = n_head
        self.head_dim = n_embd // n_head
        self.causal = causal
        self.dropout = dropout
        self.c_attn = nn.Linear(n_embd, 3 * n_embd, bias=bias)
        self.c_proj = nn.Linear(n_embd, n_embd, bias=bias)
        self.resid_dropout = nn.Dropout(dropout)

    def empty_state(self, batch_size, device=None, dtype=torch.float32):
        z = torch.zeros(batch_size, self.n_head, 0, self.head_dim, device=device, dtype=dtype)
        return KVCache(z, z, 0)

    def forward(self, x, state: Optional[KVCache] = None):
        B, T, d = x.shape
        q, k, v = (t.view(B, T, self.n_head, self.head_dim).transpose(1, 2)
                   for t in self.c_attn(x).split(d, dim=2))    # (B, H, T, p) each
        drop = self.dropout if self.training else 0.0
        if state is None:
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=drop, is_causal=self.causal)
        else:
            k = torch.cat([state.k.to(k.dtype), k], dim=2)   # (B, H, t0+T, p)
            v = torch.cat([state.v.to(v.dtype), v], dim=2)
            mask = None
            if self.causal and T > 1 and state.t:   # query i sits at position t0+i and sees keys 0 .. t0+i
                mask = torch.ones(T, state.t + T, dtype=torch.bool, device=x.device).tril(diagonal=state.t)
            # After an empty cache (a prompt's prefill) causal as above: no (T, T) mask held in memory.
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=drop,
                                               is_causal=self.causal and not state.t)
        y = self.resid_dropout(self.c_proj(y.transpose(1, 2).reshape(B, T, d)))
        return y if state is None else (y, KVCache(k, v, state.t + T))

    def step(self, x, state: KVCache):
        y, state = self.forward(x.unsqueeze(1), state)
        return y.squeeze(1), state


# A hybrid (GPTConfig.softmax_layers, off by default): the blocks it names get SoftmaxAttention. A TSSA
# layer keeps of the past only prefix sums of squares, nearly a bag, so it cannot tie a key to the value
# after it (recall); one softmax layer can look up any earlier token. The price: that layer costs O(T) per
# token, and its KV cache grows with the context (docs/speed.md measures both).


def forward_with_options(block, x, grid=None):
    """Block.forward with the options beyond the paper: x = x + g1 * attn(shift(LN(x))) (token_shift),
    x = x + g3 * LPI(LN(x)) between the paper's two lines (lpi, as XCiT places it; needs the patch grid),
    and stochastic depth on every branch (drop_path)."""
    h = block.ln_1(x)
    if block.shift is not None:
        h, _ = block.shift(h)
    x = x + drop_path(block.gamma_1 * block.attn(h), block.drop_path, block.training)
    if block.lpi is not None:
        x = x + drop_path(block.gamma_3 * block.lpi(block.ln_3(x), grid), block.drop_path, block.training)
    return x + drop_path(block.gamma_2 * block.mlp(block.ln_2(x)), block.drop_path, block.training)


class TokenShift(nn.Module):
    """Not part of ToST's derivation; an option (GPTConfig.token_shift), off for the paper's model.

        h_t <- h_t + mu * (h_{t-1} - h_t)        mu learned per channel, init 0.5; h_{-1} = 0

    Causal TSSA's prefix sums have no recency: a layer cannot tell which token came just before. Mixing
    each channel with the previous token's (RWKV's token shift) gives that back at O(1) cost: the
    recurrent state grows by one vector per layer, h_{t-1}."""

    def __init__(self, n_embd):
        super().__init__()
        self.mu = nn.Parameter(torch.full((n_embd,), 0.5))

    def forward(self, h, last=None):        # h (B, T, d); last (B, d): h of the token before h[:, 0], or None
        prev = torch.cat([torch.zeros_like(h[:, :1]) if last is None else last[:, None], h[:, :-1]], 1)
        return h + self.mu * (prev - h), h[:, -1]


class LocalPatchInteraction(nn.Module):
    """XCiT's local patch interaction (ViTConfig.lpi, off by default; not part of ToST's derivation):
    depthwise 3x3 convolution, GELU, BatchNorm, depthwise 3x3 convolution over the patch grid, so each
    patch mixes with the 24 nearest."""

    def __init__(self, n_embd):
        super().__init__()
        self.conv1 = nn.Conv2d(n_embd, n_embd, 3, padding=1, groups=n_embd)
        self.act = nn.GELU()
        self.bn = nn.BatchNorm2d(n_embd)
        self.conv2 = nn.Conv2d(n_embd, n_embd, 3, padding=1, groups=n_embd)

    def forward(self, x, grid):             # x (B, H*W, d), grid (H, W)
        B, n, d = x.shape
        x = x.transpose(1, 2).reshape(B, d, *grid)
        x = self.conv2(self.bn(self.act(self.conv1(x))))
        return x.reshape(B, d, n).transpose(1, 2)


class ShiftState(NamedTuple):
    """A block's recurrent state when it has a TokenShift: the attention's state and the last h."""
    attn: object              # TSSAState or KVCache
    last: torch.Tensor        # (B, d)

    @property
    def t(self):
        return self.attn.t


# -----------------------------------------------------------------------------
# 8. Utilities: presets, optimizer groups, FLOP counts, checks

ATTN_KINDS = ('tssa', 'softmax')

PRESETS = {
    # language (the paper's ToST-Base/Medium/Large): GPT-2 shapes, context 1024, vocab 50304
    'tost-base':   dict(kind='gpt', n_layer=12, n_head=12, n_embd=768),
    'tost-medium': dict(kind='gpt', n_layer=24, n_head=16, n_embd=1024),
    'tost-large':  dict(kind='gpt', n_layer=36, n_head=20, n_embd=1280),
    # a byte-level model that trains in minutes on a laptop CPU
    'tost-demo':   dict(kind='gpt', n_layer=4, n_head=4, n_embd=128, block_size=256, vocab_size=256),
    # vision at 224px, patch 16 (XCiT-T/S/M shapes). ToST-M: the paper gives width 512, 24 layers, 8 heads;
    # the rest (MLP ratio 4, 2 class-attention blocks, layer-scale 1e-5) is XCiT-M's, and gives 71.5M
    # (paper 68.1M).
    'tost-t':      dict(kind='vit', n_layer=12, n_head=4, n_embd=192, drop_path=0.0),
    'tost-s':      dict(kind='vit', n_layer=12, n_head=8, n_embd=384, drop_path=0.05),
    'tost-m':      dict(kind='vit', n_layer=24, n_head=8, n_embd=512, drop_path=0.15, layerscale_init=1e-5),
    # CIFAR-sized (32px): an 8 x 8 grid of 4 x 4-pixel patches
    'tost-cifar': dict(kind='vit', img_size=32, patch_size=4, num_classes=10, n_layer=6, n_head=4,
                       n_embd=192),
    'tost-cifar-tiny': dict(kind='vit', img_size=32, patch_size=4, num_classes=10, n_layer=4, n_head=4,
                            n_embd=96),
}


def preset(name, **overrides):
    """The config (GPTConfig or ViTConfig) of a named preset, with field overrides."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
    spec = dict(PRESETS[name])
    cls = GPTConfig if spec.pop('kind') == 'gpt' else ViTConfig
    valid = {f.name for f in fields(cls)}
    bad = set(overrides) - valid
    if bad:
        raise ValueError(f"{name} has no field(s) {', '.join(sorted(bad))}; "
                         f"valid: {', '.join(sorted(valid))}")
    spec.update(overrides)
    return cls(**spec)


def param_groups(model, weight_decay):
    """AdamW groups: the weight matrices (of the linear maps, embeddings, convolutions) decay; biases, norms,
    layer-scale, temperatures, position biases, the class token, any parameter not named weight, do not."""
    params = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    exempt = [p.dim() < 2 or not name.endswith('.weight') for name, p in params]
    return [{'params': [p for (_, p), e in zip(params, exempt) if not e], 'weight_decay': weight_decay},
            {'params': [p for (_, p), e in zip(params, exempt) if e], 'weight_decay': 0.0}]


def make_optimizer(model, weight_decay, learning_rate, betas, device_type):
    # one kernel for all parameters (3-5x faster steps on a CPU too)
    fused = device_type in ('cuda', 'cpu')
    return torch.optim.AdamW(param_groups(model, weight_decay), lr=learning_rate, betas=betas, fused=fused)


def drop_path(x, p, training):
    """Stochastic depth: drop a whole residual branch for a random subset of the batch."""
    if p == 0.0 or not training:
        return x
    keep = x.new_empty(x.shape[0], *([1] * (x.dim() - 1))).bernoulli_(1 - p)
    return x * keep / (1 - p)


def prefix_sum(x, dim):
    """torch.cumsum(x, dim), computed with dim laid out innermost in memory: a GPU scans the innermost
    dimension in parallel, an outer one serially in each column (measured in docs/speed.md)."""
    return torch.cumsum(x.transpose(dim, -1).contiguous(), -1).transpose(dim, -1)


def _stat_dtype(t):
    # statistics (sums over tokens) are taken in float32 when the activations are half precision
    return torch.float32 if t.dtype in (torch.float16, torch.bfloat16) else t.dtype


def _check_positive(config, *names):
    for name in names:
        value = getattr(config, name)
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{type(config).__name__}.{name} must be a positive integer, got {value!r}")


def _check_shape(n_embd, n_head, attn):
    # LayerNorm of one number is 0, whatever it is: a model of width 1 computes the same for every input.
    if n_embd < 2:
        raise ValueError(f"n_embd ({n_embd}) must be at least 2: LayerNorm of one number is always 0")
    if n_head <= 0 or n_embd % n_head != 0:
        raise ValueError(f"n_embd ({n_embd}) must be divisible by n_head ({n_head})")
    if attn not in ATTN_KINDS:
        raise ValueError(f"unknown attn {attn!r}; choose one of {', '.join(ATTN_KINDS)}")
