"""
ToST's derivation as a lecture, from rate reduction to the causal recurrence, computed with tost.py.

Run it as a script, `python derivation.py [figure.png]` (under 30 seconds): every section states a claim,
computes it, prints the number and asserts it, so the script fails loudly if the code students read stops
matching the math. It draws one figure (derivation.png unless a path is given). Or open it as a notebook:
each `# %%` line starts a cell (VS Code runs them as they are; Jupyter opens the file after
`pip install jupytext`). Everything is float64 on small tensors. Symbols as in tost.py: tokens are the rows
of Z (B, n, d); memberships Pi are (B, K, n) and sum to 1 over the K groups (heads); U is (K, d, p), p = d/K.
"""

# %% 0. Setup. The lecture runs the readable lines of tost.py (the fused core is off until section 13), and
# computes everything it checks them against independently: the coding rates by log-determinants, the
# operators by their formulas written out here.
import contextlib
import os
import sys

import torch
import torch.nn.functional as F

import tost

figure = sys.argv[1] if len(sys.argv) > 1 and 'ipykernel' not in sys.modules else 'derivation.png'
if figure in ('-h', '--help'):
    with contextlib.suppress(BrokenPipeError):                # `--help | head` may close the pipe first
        print(__doc__.strip(), flush=True)
    sys.exit()
if not figure.endswith('.png') or not os.path.isdir(os.path.dirname(figure) or '.'):
    sys.exit(f'error: the figure is a PNG file in a folder that exists; give such a path, got {figure!r}')
torch.set_default_dtype(torch.float64)
tost.CausalTSSA.fast = False
torch.manual_seed(0)


def moments(Z, Pi):
    """Each group's pi-weighted second-moment matrix Z^T diag(pi_k) Z (tokens as rows): (B, K, d, d)."""
    return torch.einsum('bnd,bkn,bne->bkde', Z, Pi, Z)


def R(Z, alpha):
    """The coding rate of all n tokens: R(Z) = 1/2 logdet(I + alpha/n Z^T Z). Returns (B,)."""
    n, d = Z.shape[1:]
    return 0.5 * torch.logdet(torch.eye(d) + alpha / n * Z.transpose(1, 2) @ Z)


def R_c(Z, Pi, alpha):
    """The compression term: R_c(Z, Pi) = 1/2 sum_k (n_k/n) logdet(I + alpha/n_k Z^T diag(pi_k) Z). (B,)."""
    n, d = Z.shape[1:]
    n_k = Pi.sum(-1)                                                       # (B, K)
    return 0.5 * (n_k / n * torch.logdet(torch.eye(d) + alpha / n_k[..., None, None] * moments(Z, Pi))).sum(-1)


def subspace_mixture(n, U, scales=(3.0, 0.3), noise=0.05, rotate=False):
    """n tokens from K groups, token j in group j mod K: coordinates in its group's subspace U_k (d x p) with
    the given scales along U_k's axes (or along a random rotation of them), plus isotropic noise.
    Returns Z (1, n, d) and the one-hot memberships (1, K, n)."""
    K, d, p = U.shape
    group = torch.arange(n) % K
    c = torch.randn(n, p) * torch.tensor(scales)
    if rotate:
        c = c @ torch.linalg.qr(torch.randn(p, p))[0]
    Z = torch.einsum('ndp,np->nd', U[group], c) + noise * torch.randn(n, d)
    return Z[None], F.one_hot(group, K).T[None].double()


def orthogonal_heads(K, p):
    """K blocks U_k (d x p) of one random orthogonal d x d matrix, d = K p: (K, d, p)."""
    Q = torch.linalg.qr(torch.randn(K * p, K * p))[0]
    return Q.view(K * p, K, p).permute(1, 0, 2)


def show(v):
    return '  '.join(f'{x:8.4f}' for x in torch.as_tensor(v).flatten().tolist())


# %% 1. Rate reduction. Delta R = R(Z) - R_c(Z, Pi): expand the whole (R, all tokens together), compress each
# group (R_c, the groups apart). For tokens from a mixture of subspaces, the true partition has a larger
# Delta R than a random one, and Delta R >= 0 for any partition (log det is concave).
alpha = 4.0
U = orthogonal_heads(3, 2)                                               # K = 3 subspaces of dimension 2 in R^6
Z, Pi_true = subspace_mixture(60, U)
Pi_rand = torch.softmax(3 * torch.randn(1, 3, 60), dim=1)
dR_true = R(Z, alpha) - R_c(Z, Pi_true, alpha)
dR_rand = R(Z, alpha) - R_c(Z, Pi_rand, alpha)
print(f'1. rate reduction, 60 tokens from 3 planes in R^6: R = {R(Z, alpha).item():.3f}; R_c = '
      f'{R_c(Z, Pi_true, alpha).item():.3f} with the true groups, {R_c(Z, Pi_rand, alpha).item():.3f} with random '
      f'ones;\n   Delta R = {dR_true.item():.3f} (true groups) > {dR_rand.item():.3f} (random) >= 0')
assert dR_true > dR_rand + 0.5 and dR_rand >= 0

# %% 2. CRATE's step descends R_c, and its gradient is pairwise attention. By the push-through identity
# (I + c Z^T D Z)^{-1} Z^T = Z^T (I + c D Z Z^T)^{-1}, the gradient at token i is a weighted sum over all tokens:
#     grad_{z_i} R_c = alpha/n sum_k pi_ik sum_j [(I + alpha/n_k Z Z^T diag(pi_k))^{-1}]_ij z_j,
# weights from the n x n similarities Z Z^T: every pair of tokens is coupled, O(n^2) (CRATE approximates this
# by softmax attention, MSSA). The variational form R^var_c (section 3) couples tokens only through per-group
# statistics: move the other tokens so that every s_k stays the same, and its gradient at token i does not move.
B, n, d, K = 1, 12, 6, 3
Z = torch.randn(B, n, d, requires_grad=True)
Pi = torch.softmax(torch.randn(B, K, n), dim=1)
(g_exact,) = torch.autograd.grad(R_c(Z, Pi, alpha).sum(), Z)
Z0, g_pairs, weights = Z.detach()[0], 0, []
for k in range(K):
    A = torch.linalg.inv(torch.eye(n) + alpha / Pi[0, k].sum() * (Z0 @ Z0.T) * Pi[0, k])      # (n, n)
    weights.append(A)
    g_pairs = g_pairs + alpha / n * Pi[0, k, :, None] * (A @ Z0)
err = (g_pairs - g_exact[0]).abs().max()
coupled = min(int((w.abs() > 1e-12).sum()) for w in weights)
# the same tokens but the others reflected along head axes: w_jk changes sign, every square (so s_k, n_k, Pi) stays
U = orthogonal_heads(K, d // K)
axes = U.permute(0, 2, 1).reshape(d, d)                                  # rows: the d head axes
signs = torch.where(torch.rand(n, d) < 0.5, -1.0, 1.0)
signs[0] = 1                                                             # token 0 stays where it is
Z2 = (((Z0 @ axes.T) * signs) @ axes)[None]
grad = lambda f, Z: torch.autograd.grad(f(Z).sum(), Z)[0][0, 0]         # the gradient at token 0
Zr, Z2r = Z.detach().clone().requires_grad_(), Z2.clone().requires_grad_()
var_move = (grad(lambda z: tost.variational_compression(z, Pi, U, alpha), Zr) -
            grad(lambda z: tost.variational_compression(z, Pi, U, alpha), Z2r)).abs().max()
exact_move = (grad(lambda z: R_c(z, Pi, alpha), Zr) - grad(lambda z: R_c(z, Pi, alpha), Z2r)).abs().max()
print(f'2. grad R_c as attention over pairs: max |difference from autograd| {err:.1e}; nonzero weights '
      f'{coupled} of {n * n} pairs.\n   Other tokens reflected, statistics kept: token 0\'s gradient moves by '
      f'{var_move:.1e} for R^var_c, by {exact_move:.3f} for R_c')
assert err < 1e-12 and coupled == n * n and var_move < 1e-12 and exact_move > 1e-3

# %% 3. The variational form (the paper's equation 4). log det M = sum_i f(lambda_i(M)), f(x) = log(1 + alpha x);
# R^var_c puts in each group's diagonal in the basis U_k instead of its eigenvalues. f is concave and the
# diagonal is majorised by the eigenvalues, so with square orthogonal U_k: R^var_c >= R_c, equal in the eigenbasis.
B, n, d, K = 4, 24, 6, 3
Z, Pi = torch.randn(B, n, d), torch.softmax(2 * torch.randn(B, K, n), dim=1)
exact = R_c(Z, Pi, alpha)
U_sq = torch.linalg.qr(torch.randn(K, d, d))[0]                         # K random orthogonal d x d
above = tost.variational_compression(Z, Pi, U_sq, alpha)
tight = torch.cat([tost.variational_compression(Z[b:b + 1], Pi[b:b + 1], torch.linalg.eigh(M)[1], alpha)
                   for b, M in enumerate(moments(Z, Pi))])               # U_k: eigenvectors of group k's moment
print(f'3. square orthogonal U_k, four draws\n   R_c                        {show(exact)}\n'
      f'   R^var_c, random U_k        {show(above)}   all above R_c\n'
      f'   R^var_c, U_k eigenvectors  {show(tight)}   equal: max |difference| {(tight - exact).abs().max():.1e}')
assert (above > exact).all() and (tight - exact).abs().max() < 1e-12

# ToST's U_k are d x p, p < d: R^var_c keeps p of the d terms of each group's sum, drops d - p terms that are
# each >= 0, and so usually falls below R_c; it is a bound in neither direction: the objective the layers descend.
p, draws = d // K, 300
dropped = tost.variational_compression(Z, Pi, U_sq, alpha) - tost.variational_compression(Z, Pi, U_sq[..., :p], alpha)
terms = 0.5 * torch.einsum('bk,bkp->bkp', Pi.sum(-1) / n, torch.log1p(
    alpha * torch.einsum('bkn,bknp->bkp', Pi, torch.einsum('bnd,kdp->bknp', Z, U_sq[..., p:]) ** 2) /
    Pi.sum(-1)[..., None]))
Zs, Pis = torch.randn(draws, n, d), torch.softmax(2 * torch.randn(draws, K, n), dim=1)
Us = torch.linalg.qr(torch.randn(draws, K, d, d))[0][..., :p]           # (draws, K, d, p)
below = int((tost.compression_of_projections(torch.einsum('bnd,bkdp->bknp', Zs, Us), Pis, alpha) <
             R_c(Zs, Pis, alpha)).sum())
U = orthogonal_heads(K, p)                                               # constructed: tokens in their groups'
Z1, Pi1 = subspace_mixture(n, U, noise=0.0, rotate=True)                 # subspaces, off the subspaces' axes
var1, exact1 = tost.variational_compression(Z1, Pi1, U, alpha), R_c(Z1, Pi1, alpha)
print(f'   U_k of size {d} x {p}: the dropped terms sum to {show(terms.sum((1, 2)))} (all >= 0, max |error| '
      f'{(terms.sum((1, 2)) - dropped).abs().max():.1e});\n   below R_c in {below} of {draws} random draws; '
      f'tokens in their subspaces: R^var_c {var1.item():.4f} > R_c {exact1.item():.4f}')
assert (terms >= 0).all() and (terms.sum((1, 2)) - dropped).abs().max() < 1e-12
assert below == draws and (var1 > exact1 + 1e-3).all()

# %% 4. The white-box layer is one gradient step. Hold Pi fixed; then
#     grad_{z_j} R^var_c = 1/n sum_k pi_jk U_k D_k U_k^T z_j,   D_k = diag(alpha / (1 + alpha s_k/n_k)),
# and TSSA(Z) = -tau grad_Z R^var_c. The gradient through Pi (Pi is estimated from Z) is not part of the step.
B, n, d, K, alpha, tau = 2, 16, 12, 3, 2.0, 0.5
layer = tost.TSSA(d, K, whitebox=True, alpha=alpha, tau=tau)
Z = torch.randn(B, n, d, requires_grad=True)
step = layer(Z)
Pi = layer.memberships(layer.split_heads(layer.c_attn(Z)))               # (B, K, n), computed from Z
(g,) = torch.autograd.grad(tost.variational_compression(Z, Pi.detach(), layer.U(), alpha).sum(), Z)
(g_all,) = torch.autograd.grad(tost.variational_compression(Z, Pi, layer.U(), alpha).sum(), Z)
err, err_all = (step + tau * g).abs().max(), (step + tau * g_all).abs().max()
layer.tau = 0.1
with torch.no_grad():
    before = tost.variational_compression(Z, Pi, layer.U(), alpha)
    after = tost.variational_compression(Z + layer(Z), Pi, layer.U(), alpha)
print(f'4. white-box step: max |step + tau grad| {err:.1e} with Pi held fixed ({err_all:.3f} if the gradient also '
      f'ran through Pi);\n   one step of tau = 0.1 lowers R^var_c: {show(before)}  ->  {show(after)}')
assert err < 1e-12 and err_all > 1e-3 and (after < before).all()

# %% 5. Which directions a step shrinks. With [U_1 .. U_K] orthogonal, the step multiplies coordinate i of
# token j in head k by 1 - tau pi_jk D_ki / n, and D_ki is largest where the group's mean square s_ki/n_k is
# smallest: as a fraction the weak directions shrink most. In absolute terms the strong ones lose more.
B, n, d, K, alpha, tau = 1, 64, 12, 3, 1.0, 4.0
layer = tost.TSSA(d, K, whitebox=True, alpha=alpha, tau=tau)
with torch.no_grad():
    layer.c_attn.weight.copy_(torch.linalg.qr(torch.randn(d, d))[0])
    scale = torch.logspace(-1, 1, d // K).repeat(K)                      # in each group, weak to strong
    Z = (torch.randn(B, n, d) * scale) @ layer.c_attn.weight             # tokens with those scales along U
    w = layer.split_heads(layer.c_attn(Z))                               # (B, K, n, p)
    Pi = layer.memberships(w)                                            # (B, K, n)
    w_after = layer.split_heads(layer.c_attn(Z + layer(Z)))
ms = lambda w: (Pi[..., None] * w * w).sum(2) / Pi.sum(2)[..., None]     # (B, K, p)  s_k / n_k
m, m_after = ms(w), ms(w_after)
D = alpha / (1 + alpha * m)
err = (w_after - w * (1 - tau / n * Pi[..., None] * D[:, :, None])).abs().max()
order = m.argsort(-1)                                                    # each group's coordinates, weakest first
factor = (w_after / w).gather(-1, order[:, :, None].expand_as(w))
kept, lost = (m_after / m).gather(-1, order), (m - m_after).gather(-1, order)
print(f'5. max |w_after - w (1 - tau pi D / n)| = {err:.1e}. Group 0, weakest coordinate to strongest:\n'
      f'   mean square s/n_k  {show(m[0, 0, order[0, 0]])}\n   D                  {show(D[0, 0, order[0, 0]])}\n'
      f'   fraction kept      {show(kept[0, 0])}\n   amount lost        {show(lost[0, 0])}')
assert err < 1e-12 and (factor.diff(dim=-1) > 0).all()                  # on every token, weakest shrunk most
assert (kept.diff(dim=-1) > 0).all() and (lost[..., -1] > lost[..., 0]).all()

# %% 6. The memberships Pi: rate reduction's soft partition, estimated from the tokens. A softmax over the heads,
# so the heads compete for each token and its memberships sum to 1. Each coordinate is first divided by its sum
# of squares over the tokens, so each head's scores sum to p over the n tokens: about p/n each. At
# initialisation Pi is therefore close to uniform, flatter as n grows (and, causally, as t grows).
def flatness(d, K, n, causal):
    layer = tost.CausalTSSA(d, K, block_size=n) if causal else tost.TSSA(d, K)
    torch.nn.init.normal_(layer.c_attn.weight, std=0.02)                 # the models' initialisation
    with torch.no_grad():
        w = layer.split_heads(layer.c_attn(F.layer_norm(torch.randn(1, n, d), (d,))))
        Pi = layer.memberships(w * w, torch.cumsum(w * w, 2)) if causal else layer.memberships(w)
    return Pi


Pi_vit = {n: flatness(192, 4, n, False) for n in (16, 64, 196)}          # ViT-T: 192 wide, 4 heads
Pi_gpt = flatness(768, 12, 1024, True)                                   # ToST-Base: 768 wide, 12 heads
dev = {t: (Pi_gpt[0, :, t] - 1 / 12).abs().max().item() for t in (0, 10, 100, 1023)}
print('6. Pi at initialisation (heads: ViT-T 4, ToST-Base 12): sums over heads to 1 within '
      f'{max((P.sum(1) - 1).abs().max() for P in [*Pi_vit.values(), Pi_gpt]):.1e}\n'
      + ''.join(f'   ViT-T, {n:3d} patches: Pi in [{P.min():.3f}, {P.max():.3f}] around 1/K = 0.25\n'
                for n, P in Pi_vit.items())
      + '   ToST-Base, causal: max |pi_t - 1/12| ' + ', '.join(f'{v:.4f} at t = {t}' for t, v in dev.items()))
assert all((P.sum(1) - 1).abs().max() < 1e-12 for P in [*Pi_vit.values(), Pi_gpt])
spread = [(P.max() - P.min()).item() for P in Pi_vit.values()]
assert spread[0] > spread[1] > spread[2] and dev[0] == 0 and dev[10] > dev[100] > dev[1023]


# %% 7. The practical operator (what the models train). It keeps the step's form and changes it in five ways
# (tost.TSSA's docstring lists them): alpha absorbed into U; a learned map back c_proj instead of U_k; optional
# biases; dropout on D; a learned per-head temperature in Pi, and 1e-8 added to n_k. First, its values: the
# formulas written out here against the layer, random parameters, biases on (as the ViT has them).
def practical_tssa(x, layer):
    """The released non-causal operator, from its formulas (see tost.TSSA)."""
    K = layer.n_head
    w = (x @ layer.c_attn.weight.T + layer.c_attn.bias).unflatten(-1, (K, -1))       # (B, n, K, p)
    score = layer.temp[:, 0] * (w * w / (w * w).sum(1, keepdim=True)).sum(-1)        # (B, n, K)
    pi = torch.exp(score) / torch.exp(score).sum(-1, keepdim=True)                   # softmax over heads
    s = torch.einsum('bnk,bnkp->bkp', pi, w * w) / (pi.sum(1)[..., None] + 1e-8)     # (B, K, p)  s_k / n_k
    y = -pi[..., None] * w / (1 + s[:, None])                                        # (B, n, K, p)
    return y.flatten(2) @ layer.c_proj.weight.T + layer.c_proj.bias


def randomize(module, scale=0.3):
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn_like(p) * scale + (1.0 if p.dim() == 1 else 0.0))
    return module


B, n, d, K = 2, 9, 12, 3
vit_layer = randomize(tost.TSSA(d, K, bias=True))
x = torch.randn(B, n, d)
err_values = (vit_layer(x) - practical_tssa(x, vit_layer)).abs().max()
# alpha into U: the white-box step with alpha and U equals the one with alpha = 1 and sqrt(alpha) U
wb, wb1 = tost.TSSA(d, K, whitebox=True, alpha=3.0), tost.TSSA(d, K, whitebox=True, alpha=1.0)
with torch.no_grad():
    wb1.c_attn.weight.copy_(3.0 ** 0.5 * wb.c_attn.weight)
err_alpha = (wb(x) - wb1(x)).abs().max()
# c_proj tied to c_attn's transpose (no biases, nothing added to n_k): exactly -n grad R^var_c
tied = tost.TSSA(d, K)
tied.eps = 0.0
with torch.no_grad():
    tied.c_proj.weight.copy_(tied.c_attn.weight.T)
Z = torch.randn(B, n, d, requires_grad=True)
Pi = tied.memberships(tied.split_heads(tied.c_attn(Z))).detach()
objective = lambda Z: tost.variational_compression(Z, Pi, tied.U())
(g,) = torch.autograd.grad(objective(Z).sum(), Z)
err_tied = (tied(Z) + n * g).abs().max()
# untied, c_proj is any learned matrix: -c_attn's transpose is one, and then the layer climbs the objective
with torch.no_grad():
    tied.c_proj.weight.neg_()
    up = objective(Z + 1e-3 * tied(Z)) - objective(Z)
print(f'7. practical TSSA against its formulas: max |difference| {err_values:.1e}; alpha = 3 into U: {err_alpha:.1e};\n'
      f'   c_proj tied: max |y + n grad R^var_c| {err_tied:.1e}; with c_proj = -c_attn^T a small step raises '
      f'R^var_c by {show(up)}')
assert err_values < 1e-12 and err_alpha < 1e-12 and err_tied < 1e-12 and (up > 0).all()


# %% 8. The block. x = x + g1 * attn(LN(x)); x = x + g2 * MLP(LN(x)). The white-box step is exact on R^var_c of
# its input LN(x); added to x through g1 (coordinate-wise scales) it is an approximate step on R^var_c(LN(x)):
# measured here with the attention tied as in section 7 (so it is -n grad on LN(x)) and random positive g1. The
# MLP is the transformer's, not derived from the objective. First, the block's values against the two lines.
def block_formula(x, b):
    ln = lambda x, m: F.layer_norm(x, (x.shape[-1],), m.weight, m.bias)
    x = x + b.gamma_1 * b.attn(ln(x, b.ln_1))
    h = ln(x, b.ln_2)
    mlp = F.linear(F.gelu(F.linear(h, b.mlp.c_fc.weight, b.mlp.c_fc.bias)), b.mlp.c_proj.weight, b.mlp.c_proj.bias)
    return x + b.gamma_2 * mlp


block = randomize(tost.Block(d, K, causal=False, bias=True))
err_block = (block(x) - block_formula(x, block)).abs().max()
block = tost.Block(d, K, causal=False)
block.attn.eps = 0.0
with torch.no_grad():
    block.attn.c_proj.weight.copy_(block.attn.c_attn.weight.T)
    block.gamma_1.copy_(torch.rand(d) * 0.02)                            # layer scale: small, unequal
    block.gamma_2.copy_(torch.rand(d) * 0.02)
x = torch.randn(B, n, d, requires_grad=True)
Pi = block.attn.memberships(block.attn.split_heads(block.attn.c_attn(block.ln_1(x)))).detach()
objective = lambda x: tost.variational_compression(block.ln_1(x), Pi, block.attn.U())
(g,) = torch.autograd.grad(objective(x).sum(), x)
with torch.no_grad():
    update = block.gamma_1 * block.attn(block.ln_1(x))                   # the block's first line, x -> x + update
    cos = F.cosine_similarity(update.flatten(1), -g.flatten(1)).min()
    drop = objective(x) - objective(x + update)
    full = F.cosine_similarity((block(x) - x).flatten(1), -g.flatten(1))
    radial = F.cosine_similarity(update, block.ln_1(x), dim=-1).abs().mean()
print(f'8. the block against its two lines: max |difference| {err_block:.1e}. Its attention line against '
      f'-grad_x R^var_c(LN(x)):\n   cosine >= {cos:.3f}; it lowers R^var_c(LN(x)) by {show(drop)}. Much of the '
      f'update points along the token itself\n   (mean |cosine| with LN(x): {radial:.2f}), a change of scale the '
      f'LayerNorm removes. Not asserted: with the MLP, cosine {show(full)}')
assert err_block < 1e-12 and cos > 0.3 and (drop > 0).all()


# %% 9. The causal step: every sum over tokens becomes a prefix sum (tost.CausalTSSA). Its values against the
# formulas, token by token; then what it descends: with c_proj tied and nothing added to n_k, and the
# memberships pi_0 .. pi_t held as the layer computed them, each at its own time,
#     sum_k U_k y_tk = -(t+1) grad_{z_t} R^var_c(Z_{<=t}, Pi_{<=t}):
# each token takes a unit step on (t+1) R^var_c of its own prefix, as section 7's tied layer is a unit step on
# n R^var_c. The growth with t is the objective's normalisation, not a different kind of step.
def causal_tssa(x, layer):
    """The released causal operator from its formulas, one position at a time."""
    B, T, d = x.shape
    K, p = layer.n_head, layer.head_dim
    w = (x @ layer.c_attn.weight.T).view(B, T, K, p)
    y, pis = torch.zeros(B, T, K, p), []
    for t in range(T):
        Q = (w[:, :t + 1] ** 2).sum(1).clamp_min(1e-12)                              # (B, K, p)
        score = layer.temp[:, 0] * ((w[:, t] ** 2 / Q).sum(-1) + p * layer.pos_bias[:, t])
        pis.append(torch.exp(score) / torch.exp(score).sum(-1, keepdim=True))        # (B, K)
        pi = torch.stack(pis, 1)                                                     # (B, t+1, K)
        s = torch.einsum('btk,btkp->bkp', pi, w[:, :t + 1] ** 2) / (pi.sum(1)[..., None] + layer.eps)
        y[:, t] = -pis[t][..., None] * w[:, t] / (1 + s)
    return y.flatten(2) @ layer.c_proj.weight.T


B, T, d, K = 2, 10, 12, 3
layer = randomize(tost.CausalTSSA(d, K, block_size=T))
x = torch.randn(B, T, d)
err_values = (layer(x) - causal_tssa(x, layer)).abs().max()
layer.eps = 0.0
with torch.no_grad():
    layer.c_proj.weight.copy_(layer.c_attn.weight.T)
Z = torch.randn(B, T, d, requires_grad=True)
y = layer(Z)                                                             # (B, T, d)  sum_k U_k y_tk
w2 = layer.split_heads(layer.c_attn(Z)).square()                         # (B, K, T, p)
Q = torch.cumsum(w2, 2)
Pi = layer.memberships(w2, Q).detach()                                   # (B, K, T)  pi_t from tokens <= t
errs, sizes, errs_now = [], [], []
for t in range(T):
    (g,) = torch.autograd.grad(tost.variational_compression(Z[:, :t + 1], Pi[..., :t + 1], layer.U()).sum(), Z)
    errs.append((y[:, t] + (t + 1) * g[:, t]).abs().max().item())
    sizes.append((-(y[:, t] * g[:, t]).sum() / (g[:, t] * g[:, t]).sum()).item())   # the step, fitted
    # every membership re-estimated at time t (from Q_t): not what the layer computes
    Pi_now = layer.memberships(w2[:, :, :t + 1], Q[:, :, t:t + 1].expand(-1, -1, t + 1, -1)).detach()
    (g,) = torch.autograd.grad(tost.variational_compression(Z[:, :t + 1], Pi_now, layer.U()).sum(), Z)
    errs_now.append((y[:, t] + (t + 1) * g[:, t]).abs().max().item())
print(f'9. causal TSSA against its formulas: max |difference| {err_values:.1e}. Tied, at t = 0 .. {T - 1}: fitted '
      f'step size\n   {show(sizes)}\n   max |y_t + (t+1) grad_z_t R^var_c(Z_<=t, Pi_<=t)| = {max(errs):.1e}; with the '
      f'memberships re-estimated at time t instead: {max(errs_now):.3f}')
assert err_values < 1e-12 and max(errs) < 1e-12 and max(errs_now) > 1e-3
assert all(abs(s - (t + 1)) < 1e-9 for t, s in enumerate(sizes))

# %% 10. The recurrent state. Prefix sums advance one token at a time: the state (Q, A, P) holds 2p + 1 numbers
# per head at any length. Steps from the state give the parallel outputs, and so does a forward split in two
# with the state carried; in a whole model (checked against its lines by hand: embeddings, blocks, LN, head), a
# prefill and then steps give the full forward's logits.
layer = randomize(tost.CausalTSSA(16, 4, block_size=40))
x = torch.randn(2, 40, 16)
with torch.no_grad():
    y_par = layer(x)
    state, ys = layer.empty_state(2, dtype=x.dtype), []
    for t in range(40):
        y_t, state = layer.step(x[:, t], state)
        ys.append(y_t)
    y_a, st = layer(x[:, :15], layer.empty_state(2, dtype=x.dtype))
    y_b, st = layer(x[:, 15:], st)
    model = randomize(tost.GPT(tost.GPTConfig(block_size=24, vocab_size=30, n_layer=2, n_head=2, n_embd=8)), 0.5)
    idx = torch.randint(0, 30, (2, 24))
    logits, states = model.prefill(idx[:, :10])
    steps = [logits]
    for t in range(10, 23):
        logits, states = model.step(idx[:, t], states)
        steps.append(logits)
    full = model.logits(idx)[:, 9:23]
    x = model.transformer.wte.weight[idx] + model.transformer.wpe.weight[:24]  # the model by hand: embeddings,
    for b in model.transformer.h:                                        # the blocks' two lines, LN, tied head
        x = block_formula(x, b)
    ln_f = model.transformer.ln_f
    by_hand = F.layer_norm(x, (8,), ln_f.weight, ln_f.bias) @ model.transformer.wte.weight.T
err_steps = (torch.stack(ys, 1) - y_par).abs().max()
err_split = (torch.cat([y_a, y_b], 1) - y_par).abs().max()
err_model = max((torch.stack(steps, 1) - full).abs().max(), (by_hand[:, 9:23] - full).abs().max())
numbers = sum(v[0, 0].numel() for v in state[:3])
print(f'10. 40 recurrent steps vs the parallel form: max |difference| {err_steps:.1e}; split at 15 with the state '
      f'carried: {err_split:.1e};\n    a GPT prefilled with 10 tokens then stepped, and by hand: {err_model:.1e}; '
      f'the state holds {numbers} numbers per head (p = 4) after any number of tokens')
assert max(err_steps, err_split, err_model) < 1e-12 and numbers == 2 * 4 + 1 and state.t == 40


# %% 11. Linear cost. Count the elements every torch call of a layer's forward returns (a machine-independent
# proxy for time and memory traffic; counted, not timed): 4x the tokens gives 4x the elements for TSSA, and
# about 16x for softmax attention written out with its n x n matrix.
class CountElements(torch.overrides.TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.total = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.total += sum(t.numel() for t in (out if isinstance(out, (tuple, list)) else [out])
                          if isinstance(t, torch.Tensor))
        return out


def count(f, n, d=32):
    x = torch.randn(1, n, d)
    with torch.no_grad(), CountElements() as c:
        f(x)
    return c.total


ops = {'TSSA': tost.TSSA(32, 4), 'CausalTSSA': tost.CausalTSSA(32, 4, block_size=4096),
       'softmax attention': lambda x: torch.softmax(x @ x.transpose(-2, -1), dim=-1) @ x}
print('11. elements returned by the calls of one forward, 4x the tokens:')
for name, f in ops.items():
    a, b = count(f, 1024), count(f, 4096)
    print(f'    {name:18s} n = 1024: {a:>10,}   n = 4096: {b:>11,}   ratio {b / a:5.2f}')
    assert (3.9 < b / a < 4.1) if name != 'softmax attention' else b / a > 15

# %% 12. Layers unrolled. The paper's reading: a stack of layers, each a step on the objective, compresses the
# tokens layer after layer. Twelve white-box layers (alpha = 10, tau = 0.05 n) sharing the true subspaces U_k,
# on 300 tokens from three planes in R^6, each group spread 1.0 along one axis of its plane and 0.5 along the
# other, with noise 0.1; memberships re-estimated by each layer (temp 100: at temp 1, Pi of 300 tokens would
# be nearly uniform, section 6). R^var_c falls at every layer, and in its own plane each group is squeezed
# onto its strong axis: the weak axis loses far more.
import matplotlib                                                        # noqa: E402 (figures only from here)

in_notebook = 'ipykernel' in sys.modules
if not in_notebook:
    matplotlib.use('Agg')
import matplotlib.pyplot as plt                                          # noqa: E402

n, K, p, alpha = 300, 3, 2, 10.0
U = orthogonal_heads(K, p)
Z, _ = subspace_mixture(n, U, scales=(1.0, 0.5), noise=0.1)
layer = tost.TSSA(K * p, K, whitebox=True, alpha=alpha, tau=0.05 * n)
group = torch.arange(n) % K
with torch.no_grad():
    layer.c_attn.weight.copy_(U.permute(0, 2, 1).reshape(K * p, K * p))  # rows k*p .. (k+1)*p: U_k^T
    layer.temp.fill_(100.0)
    history = [Z]
    for _ in range(12):
        history.append(history[-1] + layer(history[-1]))
    objective = torch.cat([tost.compression_of_projections(w, layer.memberships(w), alpha) for w in
                           (layer.split_heads(layer.c_attn(Zl)) for Zl in history)])
    own = [torch.einsum('nd,ndp->np', Zl[0], U[group]) for Zl in history]     # (n, p) each token in its own plane
kept = own[-1].square().sum(0) / own[0].square().sum(0)                  # (strong axis, weak axis)
print(f'12. 12 white-box layers: R^var_c after layers 0, 3, 6, 9, 12: {show(objective[::3])};\n'
      f'    in its own plane, each group keeps {kept[0]:.3f} of its energy along the strong axis, {kept[1]:.4f} '
      f'along the weak one')
assert (objective.diff() < 0).all() and kept[1] < 0.1 * kept[0]

fig, (ax0, ax1, ax2) = plt.subplots(1, 3, figsize=(13, 4))
ax0.plot(objective, 'o-')
ax0.set(title='R^var_c, layer by layer', xlabel='layer', ylabel=f'R^var_c (alpha = {alpha:g})')
for ax, v, title in ((ax1, own[0], 'tokens before'), (ax2, own[-1], 'after 12 layers')):
    for k in range(K):
        ax.scatter(v[group == k, 0], v[group == k, 1], s=6, label=f'group {k}')
    ax.set(title=f'{title}, each in its own plane', xlabel='strong axis', ylabel='weak axis', aspect='equal')
ax1.legend(loc='upper right')
ax2.set(xlim=ax1.get_xlim(), ylim=ax1.get_ylim())                       # the same scale before and after
fig.tight_layout()
if in_notebook:
    plt.show()
else:
    fig.savefig(figure, dpi=90)
    print(f'    figure: {figure}')

# %% 13. The fused core. On a CPU the causal layer's training path runs tost_fast.CausalCore on large inputs
# unless CausalTSSA.fast is False: chunked, with a hand-written backward. It gives the readable lines' numbers: float64
# to 1e-12 (values and every gradient), float32 to rounding.
def outputs_and_grads(layer, x, g, fast):
    tost.CausalTSSA.fast = fast
    layer.zero_grad()
    x = x.clone().requires_grad_()
    y = layer(x)
    (y * g).sum().backward()
    tost.CausalTSSA.fast = False
    return [y.detach(), x.grad] + [p.grad.clone() for p in layer.parameters()]


import tost_fast                                                         # noqa: E402

min_elements = tost_fast.MIN_ELEMENTS          # it runs from 2^19 numbers up by default; these are 9,600
tost_fast.MIN_ELEMENTS = 0
layer = randomize(tost.CausalTSSA(16, 4, block_size=300))
x, g = torch.randn(2, 300, 16), torch.randn(2, 300, 16)
err64 = max((a - b).abs().max() for a, b in zip(outputs_and_grads(layer, x, g, True),
                                                 outputs_and_grads(layer, x, g, False)))
layer.float()
ref = outputs_and_grads(layer.double(), x, g, False)
layer.float()
rel = lambda a, b: ((a.double() - b).norm() / b.norm()).item()
err32 = max(rel(a, b) for a, b in zip(outputs_and_grads(layer, x.float(), g.float(), True), ref))
print(f'13. fused core against the readable lines: float64 max |difference| {err64:.1e}; float32 against float64, '
      f'largest relative error {err32:.1e}')
assert err64 < 1e-12 and err32 < 1e-6
tost.CausalTSSA.fast = True                     # the library's defaults again, for whatever runs next
tost_fast.MIN_ELEMENTS = min_elements
