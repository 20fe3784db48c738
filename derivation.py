"""
ToST's derivation as a lecture: from rate reduction to linear-time attention, computed with tost.py.

Run it as a script, `python derivation.py` (seconds on a laptop CPU): every cell states a claim, computes it
with the readable lines of tost.py, prints each number with what it is, and asserts it, so the script fails
loudly if the code students read stops matching the math. `python derivation.py --figures=DIR` also draws
the lecture's figures into DIR; `python tools/lecture_page.py` writes docs/lecture.md, this file with its
outputs and figures, for reading without the project. Or open it as a notebook: each `# %%` line starts a
cell (VS Code runs them as they are; Jupyter opens the file after `pip install jupytext`, and `%run
derivation.py` runs it whole). Run the cells in order from the first: later ones use what earlier ones
define. Until its last cell the lecture computes in float64 on the readable lines: a notebook that stops it
part-way has those as its defaults (torch.set_default_dtype(torch.float32) and tost.CausalTSSA.fast = True
set them back).

A 90-minute class, its in-class exercises included (lecture/README.md): 0 why (5 min); 1-2 rate reduction and
its exact step (10); 3-5 the variational form, the bridge from ReduNet and the corollary (15); 6-8 the step is
an attention layer, which directions it shrinks, its memberships (20, of them about 8 for exercise 1 at the
board); 9-12 the practical, block, causal and recurrent forms (20, of them about 8 for exercise 5 in pairs
and a vote on exercise 7 before 9's end; start `python -m lecture.recall` at 11; skim 10 and 12); 13-15 cost,
unrolled layers, results and limits (15, ending on the recall table); 5 spare. 16 lists the exercises; the
others are homework. The appendix checks the software against the math (the GPT by hand, and the fused CPU
core): reading, not class time.

Notation, as in tost.py: tokens are the ROWS of Z (B, n, d). The paper writes them as columns, Z in R^{d x n},
so its Z diag(pi_k) Z^T is our Z^T diag(pi_k) Z: the same d x d matrix. Memberships Pi are (B, K, n); Pi[:, k]
is the paper's column pi_k; they sum to 1 over the K groups (heads). U is (K, d, p), p = d/K. All float64.
"""

# %% 0. Why. Softmax attention compares every token with every other: n tokens cost n^2 scores per head and
# layer. At 1,024 tokens that is a million scores per head, at 16,384 tokens (a long document, a large image)
# 268 million: attention then sets a transformer's time and memory, and for generation a cache of keys and
# values that grows with the context. ToST's attention costs O(n) and keeps a state of fixed size.
#
# It is not guessed; it is derived. "White box": each layer is one step of an optimisation algorithm on an
# explicit objective, so every line of the layer has a meaning we can state and check. "Unrolled
# optimisation": run L steps of the algorithm and call step l the network's layer l, each with its own learned
# parameters (LISTA did this for sparse coding; ReduNet and CRATE for rate reduction). Here the objective is
# rate reduction (section 1); its exact gradient step is ReduNet's layer (2); a variational form of the
# objective (3-5) has a step that needs only per-group statistics, and that step is ToST's attention, TSSA
# (6).
import options  # first: a mistake, a closed pipe (`| head`) or Ctrl-C ends the lecture in one line
import io
import pathlib
import sys

DEFAULTS = dict(
    figures='',     # a folder for the lecture's figures (lecture-*.png), made if missing; empty: no figures
)
figures = None
in_notebook = 'ipykernel' in sys.modules
if not in_notebook:
    cfg, _ = options.parse(sys.argv[1:], DEFAULTS, __doc__, __file__)
    figures = pathlib.Path(cfg['figures']) if cfg['figures'] else None
if figures:
    figures.mkdir(parents=True, exist_ok=True)

# torch comes after the options, so that --help and a mistake are answered at once.
import torch
import torch.nn.functional as F

import tost
import tost_fast

torch.set_default_dtype(torch.float64)
tost.CausalTSSA.fast = False                     # the readable lines, until the appendix
torch.manual_seed(0)


def draw(name, fig):
    """Show a figure in a notebook, or save it as DIR/lecture-<name>.png under --figures=DIR."""
    if in_notebook:
        # As a picture: a notebook without `%matplotlib inline` shows a bare figure as its text.
        from IPython.display import Image, display
        png = io.BytesIO()
        fig.savefig(png, format='png', dpi=120)
        display(Image(png.getvalue()))
        return
    path = figures / f'lecture-{name}.png'
    fig.savefig(path, dpi=120)
    print(f'   figure: {path}')


def plots(*shape, size=(12, 3.6)):
    """A matplotlib Figure and its axes (Agg, no pyplot state), or None when no figure is wanted."""
    if figures is None and not in_notebook:
        return None, None
    from matplotlib.figure import Figure
    fig = Figure(figsize=size, layout='constrained')
    return fig, fig.subplots(*shape)


def moments(Z, Pi):
    """Each group's pi-weighted second-moment matrix M_k = Z^T diag(pi_k) Z (tokens as rows): (B, K, d, d)."""
    return torch.einsum('bnd,bkn,bne->bkde', Z, Pi, Z)


def R(Z, alpha):
    """The coding rate of all n tokens: R(Z) = 1/2 logdet(I + alpha/n Z^T Z). Returns (B,)."""
    n, d = Z.shape[1:]
    return 0.5 * torch.logdet(torch.eye(d) + alpha / n * Z.transpose(1, 2) @ Z)


def R_c(Z, Pi, alpha):
    """The compression term: R_c(Z, Pi) = 1/2 sum_k (n_k/n) logdet(I + alpha/n_k M_k). Returns (B,)."""
    n, d = Z.shape[1:]
    n_k = Pi.sum(-1)                                                       # (B, K)
    logdets = torch.logdet(torch.eye(d) + alpha / n_k[..., None, None] * moments(Z, Pi))
    return 0.5 * (n_k / n * logdets).sum(-1)


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


def grad(f, Z):
    """The gradient of f(Z).sum() with respect to Z."""
    Z = Z.detach().clone().requires_grad_()
    return torch.autograd.grad(f(Z).sum(), Z)[0]


# %% 1. Rate reduction. The coding rate R(Z) = 1/2 logdet(I + alpha/n Z^T Z) counts (up to constants) the bits
# needed to code the tokens to precision eps, alpha = d/eps^2: it is large when the tokens spread over many
# directions. Delta R = R(Z) - R_c(Z, Pi): expand the whole (R, all tokens together), compress each group
# (R_c, each group's rate weighted by its share n_k/n of the tokens):
#     R_c(Z, Pi) = 1/2 sum_k (n_k/n) logdet(I + alpha/n_k M_k),   n_k = sum_j pi_jk,   M_k = Z^T diag(pi_k) Z
# (M_k, d x d, is group k's pi-weighted second moment). Both are sums over eigenvalues:
#     logdet(I + alpha M) = sum_i f(lambda_i(M)),   f(x) = log(1 + alpha x),
# f concave. For tokens from a mixture of subspaces, the true partition has a larger Delta R than a random
# one, and Delta R >= 0 for every partition (log det is concave).
alpha = 4.0
U = orthogonal_heads(3, 2)                                               # K = 3 planes in R^6
Z, Pi_true = subspace_mixture(60, U)
Pi_rand = torch.softmax(3 * torch.randn(1, 3, 60), dim=1)
dR_true = R(Z, alpha) - R_c(Z, Pi_true, alpha)
dR_rand = R(Z, alpha) - R_c(Z, Pi_rand, alpha)
M = Z[0].T @ Z[0] / 60
spectral = torch.log1p(alpha * torch.linalg.eigvalsh(M)).sum()
err_spectral = (torch.logdet(torch.eye(6) + alpha * M) - spectral).abs()
print(f'1. rate reduction, 60 tokens from 3 planes in R^6, alpha = {alpha:g}: R = {R(Z, alpha).item():.3f}; '
      f'R_c = {R_c(Z, Pi_true, alpha).item():.3f} with the true groups,\n'
      f'   {R_c(Z, Pi_rand, alpha).item():.3f} with random ones; '
      f'Delta R = {dR_true.item():.3f} (true groups) > {dR_rand.item():.3f} (random) >= 0; '
      f'|logdet - sum f(lambda)| = {err_spectral:.1e}')
assert dR_true > dR_rand + 0.5
assert dR_rand >= 0
assert err_spectral < 1e-12

# %% 2. The exact step on R_c, and what it costs. Differentiate through each group's d x d second moment
# M_k = Z^T diag(pi_k) Z: with C_k = alpha (I + alpha/n_k M_k)^{-1},
#     grad_{z_j} R_c = 1/n sum_k pi_jk C_k z_j      (1/n: the weight n_k/n times the 1/n_k inside the log det)
# A gradient step z_j <- z_j - tau grad_{z_j} R_c is ReduNet's compression layer; C_k is its operator for
# group k. Computed this way it costs O(K (n d^2 + d^3)): M_k is n d^2 work, its inverse d^3. Linear in n,
# heavy in d. The same gradient can be written with the n x n Gram matrix instead (the push-through identity
# (I + c A^T A)^{-1} A^T = A^T (I + c A A^T)^{-1}): every pair of tokens then carries a weight, O(n^2).
# CRATE's attention (MSSA) starts from such a pairwise form, of a different compression term (sum_k
# R(Z U_k), with no memberships), and replaces the inverse by a softmax of similarities: O(n^2 d).
def exact_grad(Z, Pi, alpha):
    """grad_Z R_c in its d x d form, 1/n sum_k diag(pi_k) Z C_k with C_k = alpha (I + alpha/n_k M_k)^{-1}:
    (B, n, d)."""
    n, d = Z.shape[1:]
    n_k = Pi.sum(-1)[..., None, None]                                    # (B, K, 1, 1)
    C = alpha * torch.linalg.inv(torch.eye(d) + alpha / n_k * moments(Z, Pi))   # (B, K, d, d)  ReduNet's C_k
    return torch.einsum('bkn,bnd,bkde->bne', Pi, Z, C) / n


def pairwise_grad(Z, Pi, alpha):
    """The same gradient through n x n matrices:
    1/n sum_k diag(pi_k) alpha (I + alpha/n_k Z Z^T diag(pi_k))^{-1} Z, and those matrices' inverses."""
    n = Z.shape[1]
    n_k = Pi.sum(-1)[..., None, None]
    gram = Z @ Z.transpose(1, 2)                                         # (B, n, n)  every pair of tokens
    A = torch.linalg.inv(torch.eye(n) + alpha / n_k * gram[:, None] * Pi[:, :, None, :])   # (B, K, n, n)
    return alpha / n * torch.einsum('bkn,bknm,bmd->bnd', Pi, A, Z), A


B, n, d, K = 2, 12, 6, 3
Z = torch.randn(B, n, d)
Pi = torch.softmax(torch.randn(B, K, n), dim=1)
g_auto = grad(lambda z: R_c(z, Pi, alpha), Z)
err_exact = (exact_grad(Z, Pi, alpha) - g_auto).abs().max()
g_pairs, weights = pairwise_grad(Z, Pi, alpha)
err_pairs = (g_pairs - g_auto).abs().max()
coupled = int((weights.abs() > 1e-12).sum(-1).sum(-1).min())
print(f'2. grad R_c against autograd: d x d form (ReduNet) max |difference| {err_exact:.1e}, n x n form '
      f'{err_pairs:.1e};\n   the n x n form couples {coupled} of {n * n} pairs of tokens in every group')
assert all(e < 1e-12 for e in (err_exact, err_pairs))
assert coupled == n * n

# %% 3. The variational form (the paper's theorem and its equation 4). For f concave with f(0) = 0, a
# symmetric PSD matrix M and any orthogonal U: sum_i f(lambda_i(M)) <= sum_i f((U^T M U)_ii), with equality
# when U diagonalises M (the diagonal of U^T M U is majorised by the eigenvalues). So, one U_k per group,
#     R^var_c(Z, Pi | U) = 1/2 sum_k (n_k/n) sum_i f(s_ki / n_k),   s_ki = sum_j pi_jk (u_ki^T z_j)^2,
# puts each group's DIAGONAL in the basis U_k where R_c has its eigenvalues: with square orthogonal U_k,
# R^var_c >= R_c, equal in each group's eigenbasis. The batch's four draws are the four columns.
B, n, d, K = 4, 24, 6, 3
Z = torch.randn(B, n, d)
Pi = torch.softmax(2 * torch.randn(B, K, n), dim=1)
exact = R_c(Z, Pi, alpha)
U_sq = torch.linalg.qr(torch.randn(K, d, d))[0]                         # K random orthogonal d x d
above = tost.variational_compression(Z, Pi, U_sq, alpha)
eigenbases = torch.linalg.eigh(moments(Z, Pi))[1]                        # (B, K, d, d)  eigenvectors of M_k
tight = torch.cat([tost.variational_compression(Z[b:b + 1], Pi[b:b + 1], eigenbases[b], alpha)
                   for b in range(B)])
print(f'3. square orthogonal U_k, four draws (columns)\n   R_c                        {show(exact)}\n'
      f'   R^var_c, random U_k        {show(above)}   all above R_c\n'
      f'   R^var_c, U_k eigenvectors  {show(tight)}   equal: '
      f'max |difference| {(tight - exact).abs().max():.1e}')
assert (above > exact).all()
assert (tight - exact).abs().max() < 1e-12

# What each objective sees of the other tokens: R_c sees each group's whole d x d second moment, R^var_c only
# its diagonal in the basis U_k. Reflect the other tokens along the head axes (w_jki changes sign, so every
# s_k and n_k stays the same, Pi held fixed; so would the memberships section 8 estimates from the squares
# w_jki^2): token 0's gradient does not move for R^var_c, and moves for R_c.
U = orthogonal_heads(K, d // K)
axes = U.permute(0, 2, 1).reshape(d, d)                                  # rows: the d head axes
signs = torch.where(torch.rand(n, d) < 0.5, -1.0, 1.0)
signs[0] = 1                                                             # token 0 stays where it is
Z1 = Z[:1]
Z2 = ((Z1 @ axes.T) * signs) @ axes
var_grads = [grad(lambda z: tost.variational_compression(z, Pi[:1], U, alpha), z)[0, 0] for z in (Z1, Z2)]
exact_grads = [grad(lambda z: R_c(z, Pi[:1], alpha), z)[0, 0] for z in (Z1, Z2)]
var_move = (var_grads[0] - var_grads[1]).abs().max()
exact_move = (exact_grads[0] - exact_grads[1]).abs().max()
print(f'   the other tokens reflected, statistics kept: token 0\'s gradient (largest entry '
      f'{exact_grads[0].abs().max():.3f}) moves by {var_move:.1e} for R^var_c, by {exact_move:.3f} for R_c')
assert var_move < 1e-12
assert exact_move > 1e-3

# %% 4. The bridge from ReduNet to ToST. (a) Put U_k at group k's eigenbasis: U_k D_k U_k^T, with the diagonal
# D_k = diag(f'(s_k/n_k)), IS ReduNet's C_k (in that basis s_k/n_k are the eigenvalues lambda of M_k/n_k, and
# f'(lambda) = alpha/(1 + alpha lambda) is C_k's eigenvalue), so the step on R^var_c is exactly the step on
# R_c. (b) Rotate the tokens instead of the basis: an orthogonal Q applied to every token (z -> Q z, rows
# Z Q^T) leaves R_c unchanged and gives R^var_c(Z Q^T | U) = R^var_c(Z | Q^T U):
# rotating a group's tokens onto fixed axes U_k tightens the bound exactly as rotating U_k onto the tokens
# would. With hard groups (each token in one group), group k's terms see its own tokens only, so each group
# may take its own Q_k: below, Q_k = U_k V_k^T turns group k's eigenbasis V_k onto U_k. Finding the
# eigenbasis anew for every input costs d^3 per group; ToST freezes U_k into learned parameters and lets the
# layers move the tokens towards them. That is the textbook's phrase: rather than rotate U_k towards the
# data, rotate the data towards U_k.
Zb, Pib = Z[:1], Pi[:1]
V = eigenbases[0]                                                        # (K, d, d)
s = torch.einsum('kdi,bnd->bkni', V, Zb).square().mul(Pib[..., None]).sum(2)   # (1, K, d)  s_k, eigenbasis
D = alpha / (1 + alpha * s / Pib.sum(-1)[..., None])                    # (1, K, d)  D_k = f'(s_k/n_k)
C = alpha * torch.linalg.inv(torch.eye(d) + alpha / Pib.sum(-1)[0, :, None, None] * moments(Zb, Pib)[0])
err_operator = (V @ torch.diag_embed(D[0]) @ V.transpose(1, 2) - C).abs().max()
g_var = grad(lambda z: tost.variational_compression(z, Pib, V, alpha), Zb)
err_step = (g_var - exact_grad(Zb, Pib, alpha)).abs().max()
# (b) with hard groups, rotate each group's tokens by Q_k = U_k V_k^T onto the fixed axes U_k (square here)
Zm, Pim = subspace_mixture(60, orthogonal_heads(3, 2), noise=0.3)       # three noisy planes in R^6
Vm = torch.linalg.eigh(moments(Zm, Pim))[1][0]                            # (K, d, d)
U_fixed = torch.linalg.qr(torch.randn(3, 6, 6))[0]                      # any fixed orthogonal axes
group = torch.arange(60) % 3
rotated = torch.einsum('nde,ne->nd', U_fixed[group] @ Vm[group].transpose(1, 2), Zm[0])[None]
before = tost.variational_compression(Zm, Pim, U_fixed, alpha)
after = tost.variational_compression(rotated, Pim, U_fixed, alpha)
err_rotated = (after - R_c(Zm, Pim, alpha)).abs().max()
err_invariant = (R_c(rotated, Pim, alpha) - R_c(Zm, Pim, alpha)).abs().max()
print(f'4. (a) U_k = eigenbasis: max |U_k D_k U_k^T - C_k| {err_operator:.1e}; '
      f'max |grad R^var_c - grad R_c| {err_step:.1e}\n'
      f'   (b) fixed U_k, each group\'s tokens rotated onto them: R^var_c {before.item():.4f} -> '
      f'{after.item():.4f} = R_c {R_c(Zm, Pim, alpha).item():.4f}\n'
      f'       (|difference| {err_rotated:.1e}; R_c moved by {err_invariant:.1e})')
assert all(e < 1e-12 for e in (err_operator, err_step, err_rotated, err_invariant))
assert before > after + 0.1

# The picture: one group in R^2, one orthogonal U(theta) = the rotation by theta. R^var_c >= R_c at every
# angle, touching it where U(theta) is the eigenbasis; with U's first column alone (d x p, p = 1 < d) it falls
# below R_c everywhere: section 5.
Z2d = torch.randn(1, 40, 2) * torch.tensor([2.0, 0.5]) @ torch.linalg.qr(torch.randn(2, 2))[0]
ones = torch.ones(1, 1, 40)
theta = torch.linspace(0, torch.pi, 181)
first = torch.stack([theta.cos(), theta.sin()], -1)                      # (181, 2)  U(theta)'s first column
second = torch.stack([-theta.sin(), theta.cos()], -1)
rotations = torch.stack([first, second], -1)                              # (181, 2, 2)
square = torch.cat([tost.variational_compression(Z2d, ones, Q[None], alpha) for Q in rotations])
column = torch.cat([tost.variational_compression(Z2d, ones, Q[None, :, :1], alpha) for Q in rotations])
rc = R_c(Z2d, ones, alpha).item()
print(f'   one group in R^2, U rotated through 180 degrees: R^var_c in [{square.min():.4f}, '
      f'{square.max():.4f}] >= R_c {rc:.4f};\n   one column of U: at most {column.max():.4f} < R_c')
assert square.min() >= rc - 1e-12
assert square.min() < rc + 1e-3
assert column.max() < rc
fig, ax = plots(1, 1, size=(6, 3.6))
if fig:
    ax.plot(theta.rad2deg(), square, label='R^var_c, U square (d x d)')
    ax.plot(theta.rad2deg(), column, label='R^var_c, U one column (d x 1)')
    ax.axhline(rc, color='k', ls='--', label='R_c')
    ax.set(xlabel='rotation of U (degrees)', ylabel=f'compression (alpha = {alpha:g})',
           title='the bound, tight where U is the eigenbasis')
    ax.legend(fontsize=8)
    draw('bound', fig)

# %% 5. ToST's U_k are d x p, p = d/K < d. Then R^var_c keeps p of the d terms of each group's sum and drops
# d - p terms >= 0; on random tokens it then falls below R_c (measured below): in general a bound in neither
# direction. The paper's corollary gives the case that matters: if U_k has orthonormal columns and group k's
# second moment lies inside span(U_k) (the group's tokens live in that subspace), R^var_c >= R_c again, equal
# when U_k diagonalises the group inside its subspace. With orthogonal subspaces that asks for hard
# memberships (a softmax gives every token some of every group). Below: the dropped terms, random draws
# (hypothesis false), and draws where each group lies in its own U_k's span (hypothesis true, the memberships
# one-hot), then with U_k turned within that span onto the group's eigenbasis.
p, draws = d // K, 300
kept_p = tost.variational_compression(Z, Pi, U_sq[..., :p], alpha)   # each U_k's first p columns
dropped = tost.variational_compression(Z, Pi, U_sq, alpha) - kept_p
s_rest = torch.einsum('bkn,bknp->bkp', Pi, torch.einsum('bnd,kdp->bknp', Z, U_sq[..., p:]) ** 2)
terms = 0.5 * (Pi.sum(-1) / n)[..., None] * torch.log1p(alpha * s_rest / Pi.sum(-1)[..., None])
Zs = torch.randn(draws, n, d)
Pis = torch.softmax(2 * torch.randn(draws, K, n), dim=1)
Us = torch.linalg.qr(torch.randn(draws, K, d, d))[0][..., :p]           # (draws, K, d, p)
below = int((tost.compression_of_projections(torch.einsum('bnd,bkdp->bknp', Zs, Us), Pis, alpha) <
             R_c(Zs, Pis, alpha)).sum())
# each group inside span(U_k): token j of group j mod K is U_k c_j, its coordinates c_j along a random basis
group = torch.arange(n) % K
Us = torch.linalg.qr(torch.randn(draws, d, d))[0].view(draws, d, K, p).permute(0, 2, 1, 3)   # (., K, d, p)
spread = torch.randn(draws, n, p) * torch.tensor([3.0, 0.3]) @ torch.linalg.qr(torch.randn(draws, p, p))[0]
Zs = torch.einsum('bndp,bnp->bnd', Us[:, group], spread)
Pis = F.one_hot(group, K).T.double().expand(draws, K, n)
w = torch.einsum('bnd,bkdp->bknp', Zs, Us)                               # (draws, K, n, p)
above = int((tost.compression_of_projections(w, Pis, alpha) >= R_c(Zs, Pis, alpha) - 1e-12).sum())
V = torch.linalg.eigh(torch.einsum('bknp,bkn,bknq->bkpq', w, Pis, w))[1]    # eigenbasis of U_k^T M_k U_k
turned = tost.compression_of_projections(w @ V, Pis, alpha)               # U_k V_k in place of U_k
err_turned = (turned - R_c(Zs, Pis, alpha)).abs().max()
print(f'5. U_k of size {d} x {p}, section 3\'s four draws: the dropped terms, summed '
      f'{show(terms.sum((1, 2)))}\n'
      f'   (each >= 0; they equal R^var_c with U_k square minus R^var_c with its first {p} columns, to '
      f'{(terms.sum((1, 2)) - dropped).abs().max():.1e});\n'
      f'   random tokens: R^var_c < R_c in {below} of {draws} draws; '
      f'each group inside span(U_k) (the corollary): R^var_c >= R_c in {above} of {draws};\n'
      f'   and U_k turned onto the group\'s eigenbasis in its span: max |R^var_c - R_c| {err_turned:.1e}')
assert (terms >= 0).all()
assert (terms.sum((1, 2)) - dropped).abs().max() < 1e-12
assert below == draws
assert above == draws
assert err_turned < 1e-12

# %% 6. The white-box layer is one gradient step (the paper's TSSA). Hold Pi fixed; then
#     grad_{z_j} R^var_c = 1/n sum_k pi_jk U_k D_k U_k^T z_j,   D_k = diag(f'(s_k/n_k)),
#     f'(x) = alpha/(1 + alpha x),
# and one gradient-descent step of size tau is TSSA(Z) = -tau grad_Z R^var_c, the layer z_j <- z_j +
# TSSA(Z)_j. Read it as data flow: project each token into each head (w = U_k^T z_j), take each head's
# pi-weighted mean square s_k/n_k (p numbers), turn it into the gains D_k = f'(s_k/n_k), scale w by D_k and by
# the token's membership pi_jk, map back with U_k, times -tau/n. No token is compared with another: what they
# share is per-head statistics: n_k and s_k, and for Pi, which the layer estimates (section 8), each
# coordinate's sum of squares over the tokens, p more numbers: 2p + 1 in all. The gradient through Pi is not
# part of the step.
B, n, d, K, alpha, tau = 2, 16, 12, 3, 2.0, 0.5
layer = tost.TSSA(d, K, whitebox=True, alpha=alpha, tau=tau)
Z = torch.randn(B, n, d, requires_grad=True)
step = layer(Z)
Pi = layer.memberships(layer.split_heads(layer.c_attn(Z)))               # (B, K, n), computed from Z
(g,) = torch.autograd.grad(tost.variational_compression(Z, Pi.detach(), layer.U(), alpha).sum(), Z)
(g_all,) = torch.autograd.grad(tost.variational_compression(Z, Pi, layer.U(), alpha).sum(), Z)
err = (step + tau * g).abs().max()
err_all = (step + tau * g_all).abs().max()
layer.tau = 0.1
with torch.no_grad():
    before = tost.variational_compression(Z, Pi, layer.U(), alpha)
    after = tost.variational_compression(Z + layer(Z), Pi, layer.U(), alpha)
print(f'6. white-box step (entries up to {step.abs().max():.2f}): max |step + tau grad| {err:.1e} with Pi '
      f'held fixed ({err_all:.3f} if the gradient also ran through Pi);\n'
      f'   one step of tau = 0.1 lowers R^var_c, two inputs (columns): {show(before)}  ->  {show(after)}')
assert err < 1e-12
assert err_all > 1e-3
assert (after < before).all()
fig, ax = plots(1, 1, size=(11, 2.6))
if fig:
    boxes = [('Z\n(n, d)', 'tokens'),
             ('w = U_k^T z_j\n(K, n, p)', 'project into each head'),
             ('s_k / n_k\n(K, p)', 'pi-weighted mean square'),
             ('D_k = f\'(s_k/n_k)\n(K, p)', 'gain per coordinate'),
             ('pi_jk D_k w\n(K, n, p)', 'scale each token'),
             ('-tau/n sum_k U_k (.)\n(n, d)', 'map back, add to Z')]
    for i, (box, note) in enumerate(boxes):
        style = dict(boxstyle='round', fc='#e8eef8')
        ax.text(i * 1.8, 0, box, ha='center', va='center', fontsize=9, bbox=style)
        ax.text(i * 1.8, -0.55, note, ha='center', va='top', fontsize=8, color='#444')
        if i:
            ax.annotate('', xy=(i * 1.8 - 0.75, 0), xytext=(i * 1.8 - 1.05, 0),
                        arrowprops=dict(arrowstyle='->'))
    ax.annotate('', xy=(4 * 1.8, 0.35), xytext=(1.8, 0.35),
                arrowprops=dict(arrowstyle='->', connectionstyle='arc3,rad=-0.25', color='#888'))
    ax.text(2.5 * 1.8, 1.15, 'w itself, token by token', ha='center', fontsize=8, color='#666')
    ax.set(xlim=(-0.9, 9.9), ylim=(-1.1, 1.3),
           title='TSSA: tokens meet only through 2p + 1 numbers per head (n_k, s_k, and the p column sums of '
                 'squares of w that Pi uses)')
    ax.axis('off')
    draw('dataflow', fig)

# %% 7. Which directions a step shrinks. With [U_1 .. U_K] orthogonal, the step multiplies coordinate i of
# token j in head k by 1 - tau pi_jk D_ki / n. For a step with tau alpha <= n every multiplier is in [0, 1)
# (pi_jk <= 1, D_ki <= alpha): a shrinkage; a larger step can overshoot and grow a direction (below). D_ki is
# largest where the group's mean square m_ki = s_ki/n_k is smallest: as a FRACTION the weak directions shrink
# most, the strong ones least. In mean square
# the strong ones lose more; in root-mean-square amplitude the loss goes as sqrt(m)/(1 + alpha m), largest
# near m = 1/alpha, so neither the weakest nor the strongest loses the most amplitude. Each group is squeezed
# towards its dominant directions: that is the compression.
B, n, d, K, alpha, tau = 1, 64, 12, 3, 1.0, 4.0
layer = tost.TSSA(d, K, whitebox=True, alpha=alpha, tau=tau)
with torch.no_grad():
    layer.c_attn.weight.copy_(torch.linalg.qr(torch.randn(d, d))[0])
    scale = torch.logspace(-1, 1, d // K).repeat(K)                      # in each group, weak to strong
    Z = (torch.randn(B, n, d) * scale) @ layer.c_attn.weight             # tokens with those scales along U
    w = layer.split_heads(layer.c_attn(Z))                               # (B, K, n, p)
    Pi = layer.memberships(w)                                            # (B, K, n)
    w_after = layer.split_heads(layer.c_attn(Z + layer(Z)))


def mean_square(w):
    """Each head's pi-weighted mean square along each coordinate, s_k / n_k: (B, K, p)."""
    return (Pi[..., None] * w * w).sum(2) / Pi.sum(2)[..., None]


m = mean_square(w)
m_after = mean_square(w_after)
D = alpha / (1 + alpha * m)
err = (w_after - w * (1 - tau / n * Pi[..., None] * D[:, :, None])).abs().max()
order = m.argsort(-1)                                                    # each group's axes, weak first
factor = (w_after / w).gather(-1, order[:, :, None].expand_as(w))
kept = (m_after / m).gather(-1, order)
lost = (m - m_after).gather(-1, order)
rms_lost = (m.sqrt() - m_after.sqrt()).gather(-1, order)
print(f'7. max |w_after - w (1 - tau pi D / n)| = {err:.1e}. Group 0, its axes, weakest to strongest:\n'
      f'   mean square m = s/n_k  {show(m[0, 0, order[0, 0]])}\n'
      f'   gain D = f\'(m)         {show(D[0, 0, order[0, 0]])}\n'
      f'   fraction of m kept     {show(kept[0, 0])}\n   mean square lost       {show(lost[0, 0])}\n'
      f'   rms amplitude lost     {show(rms_lost[0, 0])}')
assert err < 1e-12
assert (factor.diff(dim=-1) > 0).all()                                # on every token, weakest shrunk most
assert (kept.diff(dim=-1) > 0).all()
assert (lost[..., -1] > lost[..., 0]).all()
peak = rms_lost.argmax(-1)
assert ((peak > 0) & (peak < d // K - 1)).all()                          # the amplitude lost peaks inside
assert tau * alpha <= n
assert (factor >= 0).all()
assert (factor < 1).all()
layer.tau = 1000.0                                                       # tau alpha > n
with torch.no_grad():
    overshoot = (mean_square(layer.split_heads(layer.c_attn(Z + layer(Z)))) / m).gather(-1, order)
print(f'   every multiplier in [{factor.min():.4f}, {factor.max():.4f}] '
      f'(tau alpha = {tau * alpha:g} <= n = {n}); with tau = 1000 (tau alpha > n):\n'
      f'   fraction of m kept     {show(overshoot[0, 0])}')
assert (overshoot > 1).any()

# %% 8. The memberships Pi: rate reduction's soft partition, estimated from the tokens. A softmax over the
# heads, so the heads compete for each token and its memberships sum to 1. The released code first divides
# each projected coordinate by its sum of squares over the tokens (a column normalisation), so each head's
# scores sum to p over the n tokens, about p/n each: at initialisation (temperature 1) Pi is close to uniform
# when n >> p, and spread out when n is near p or below it.
# Causally (section 11) every sum over the tokens runs over the prefix j <= t, Q_t = sum_{j<=t} w_j^2, so a
# token's share w_t^2 / Q_t of each coordinate is about 1/(t+1) and pi_t flattens as t grows; a learned
# position bias b_{k,t} (0 at initialisation) gives each head a prior per position on top. At t = 0 it is
# exactly 1/K while b is 0 and the heads' temperatures are equal, as at initialisation, provided every
# |w_0i| >= 1e-6 (the prefix sums are clamped at 1e-12; an exercise says why).
def at_initialisation(d, K, n, causal):
    layer = tost.CausalTSSA(d, K, block_size=n) if causal else tost.TSSA(d, K)
    torch.nn.init.normal_(layer.c_attn.weight, std=0.02)                 # the models' initialisation
    with torch.no_grad():
        w = layer.split_heads(layer.c_attn(F.layer_norm(torch.randn(1, n, d), (d,))))
        if causal:
            return layer.prefix_memberships(w * w, torch.cumsum(w * w, 2))
        return layer.memberships(w)


Pi_vit = {n: at_initialisation(192, 4, n, False) for n in (16, 64, 196)}     # ViT-T: d = 192, K = 4, p = 48
Pi_gpt = at_initialisation(768, 12, 1024, True)                               # ToST-Base: 768 wide, 12 heads
dev = {t: (Pi_gpt[0, :, t] - 1 / 12).abs().max().item() for t in (0, 10, 100, 1023)}
sums = max((P.sum(1) - 1).abs().max() for P in [*Pi_vit.values(), Pi_gpt])
spread = {n: (P.min().item(), P.max().item()) for n, P in Pi_vit.items()}
print(f'8. Pi at initialisation: each token\'s memberships sum to 1 within {sums:.1e}\n'
      + ''.join(f'   ViT-T (p = 48), n = {n:3d} patches: Pi in [{a:.3f}, {b:.3f}] around 1/K = 0.25\n'
                for n, (a, b) in spread.items())
      + '   ToST-Base, causal: max |pi_t - 1/12| ' + ', '.join(f'{v:.4f} at t = {t}' for t, v in dev.items()))
assert sums < 1e-12
assert dev[0] == 0
assert dev[10] > dev[100] > dev[1023]
# Bounds past what 300 draws of the weights and tokens gave (n = 16: max 0.43 to 0.80; 196: 0.28 to 0.31).
assert spread[16][0] < 0.12
assert spread[16][1] > 0.4                                            # n close to p: far from uniform
assert 0.13 < spread[64][0]
assert spread[64][1] < 0.46
assert 0.19 < spread[196][0]
assert spread[196][1] < 0.33
# Below 1e-6: a row of head 0's weight that makes the first coordinate of w_0 1e-7 scores (1e-7)^2 / 1e-12
# = 0.01, not 1 (a zero row would score 0 / 1e-12 = 0). Head 0 then scores 3.01 (p = 4), head 1 scores 4.
with torch.random.fork_rng():                                            # the draws after this one unmoved
    small_row = tost.CausalTSSA(8, 2, block_size=1).double()
    x0 = torch.randn(1, 1, 8, dtype=torch.float64)
    with torch.no_grad():
        small_row.c_attn.weight[0] = 0
        small_row.c_attn.weight[0, 0] = 1e-7 / x0[0, 0, 0]
        w = small_row.split_heads(small_row.c_attn(x0))
        pi_0 = small_row.prefix_memberships(w * w, w * w)[0, :, 0]
print(f'   a CausalTSSA(8, 2) whose w_0 has a coordinate of 1e-7 in head 0: pi_0 = {show(pi_0)}')
assert (pi_0 - torch.softmax(torch.tensor([3.01, 4.0], dtype=torch.float64), 0)).abs().max() < 1e-12

# What training would have to find: U_k the groups' subspaces, and a larger temp_k, which multiplies the
# scores (an inverse temperature: larger is sharper; set by hand here, nothing below is a trained layer). With
# U_k the true planes of a mixture, temp_k = 1 leaves Pi nearly uniform; temp_k = 100 recovers the groups.
U = orthogonal_heads(3, 2)
Zm, Pim = subspace_mixture(90, U, scales=(1.0, 0.5), noise=0.1)
layer = tost.TSSA(6, 3)
with torch.no_grad():
    layer.c_attn.weight.copy_(U.permute(0, 2, 1).reshape(6, 6))          # rows k*p to (k+1)*p - 1: U_k^T
    w = layer.split_heads(layer.c_attn(Zm))
    Pi_1 = layer.memberships(w)
    layer.temp.fill_(100.0)
    Pi_100 = layer.memberships(w)
right = (Pi_100.argmax(1) == Pim.argmax(1)).double().mean()
print(f'   true planes as U_k, 90 tokens: Pi in [{Pi_1.min():.3f}, {Pi_1.max():.3f}] at temp_k = 1; '
      f'at 100 the largest membership names the true group for {right:.0%} of tokens')
assert 0.25 < Pi_1.min()
assert Pi_1.max() < 0.5
assert right > 0.9
fig, axes = plots(1, 2, size=(12, 2.6))
if fig:
    by_group = Pim[0].argmax(0).argsort()                                # tokens sorted by true group
    for ax, P, title in ((axes[0], Pi_1, 'temp_k = 1'), (axes[1], Pi_100, 'temp_k = 100')):
        image = ax.imshow(P[0][:, by_group], aspect='auto', vmin=0, vmax=1, interpolation='nearest')
        ax.set(title=f'Pi, {title}', xlabel='token (sorted by true group)', ylabel='head k', yticks=range(3))
    fig.colorbar(image, ax=axes, label='pi_jk')
    draw('memberships', fig)


# %% 9. The practical operator (what the models train). It keeps the step's form and changes it in six ways
# (tost.TSSA's docstring lists them): alpha absorbed into U; a learned map back c_proj instead of U_k, which
# also absorbs tau/n (at one n only, below); optional biases; dropout on D; Pi with its column normalisation
# and a learned per-head temperature; 1e-8 added to n_k. First, its values: the formulas written out here
# against the layer, random parameters, biases on (as the ViT has them).
def practical_tssa(x, layer):
    """The released non-causal operator, from its formulas (see tost.TSSA)."""
    K = layer.n_head
    w = (x @ layer.c_attn.weight.T + layer.c_attn.bias).unflatten(-1, (K, -1))       # (B, n, K, p)
    score = layer.temp[:, 0] * (w * w / (w * w).sum(1, keepdim=True)).sum(-1)        # (B, n, K)
    pi = torch.exp(score) / torch.exp(score).sum(-1, keepdim=True)                   # softmax over heads
    m = torch.einsum('bnk,bnkp->bkp', pi, w * w) / (pi.sum(1)[..., None] + 1e-8)     # (B, K, p)  s_k / n_k
    y = -pi[..., None] * w / (1 + m[:, None])                                        # (B, n, K, p)
    return y.flatten(2) @ layer.c_proj.weight.T + layer.c_proj.bias


def randomize(module, scale=0.3):
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn_like(p) * scale + (1.0 if p.dim() == 1 else 0.0))
    return module


def tie(layer, head_scales=None):
    """c_proj := c_attn's transpose (U_k maps back), head k's block times head_scales[k]; nothing added to
    n_k."""
    layer.eps = 0.0
    scales = torch.ones(layer.n_head) if head_scales is None else head_scales
    with torch.no_grad():
        layer.c_proj.weight.copy_(layer.c_attn.weight.T * scales.repeat_interleave(layer.head_dim))
    return layer


B, n, d, K = 2, 9, 12, 3
vit_layer = randomize(tost.TSSA(d, K, bias=True))
x = torch.randn(B, n, d)
err_values = (vit_layer(x) - practical_tssa(x, vit_layer)).abs().max()
# alpha into U: the white-box step with alpha and U equals the one with alpha = 1 and sqrt(alpha) U (the
# memberships too: the released Pi ignores a head's scale; the paper's temp ||U_k^T z||^2 would not)
wb = tost.TSSA(d, K, whitebox=True, alpha=3.0)
wb1 = tost.TSSA(d, K, whitebox=True, alpha=1.0)
with torch.no_grad():
    wb1.c_attn.weight.copy_(3.0 ** 0.5 * wb.c_attn.weight)
err_alpha = (wb(x) - wb1(x)).abs().max()
# tied: exactly -n grad R^var_c, at every n, so the step on R^var_c is n: tau/n is absorbed at one n only
tied = tie(tost.TSSA(d, K))
err_tied = 0
for n_tokens in (n, 4 * n):
    Z = torch.randn(B, n_tokens, d)
    Pi = tied.memberships(tied.split_heads(tied.c_attn(Z)))
    g = grad(lambda z: tost.variational_compression(z, Pi, tied.U()), Z)
    err_tied = max(err_tied, (tied(Z) + n_tokens * g).abs().max())
print(f'9. practical TSSA against its formulas: max |difference| {err_values:.1e}; '
      f'alpha = 3 moved into U, max |difference| {err_alpha:.1e};\n'
      f'   c_proj tied: max |y + n grad R^var_c| {err_tied:.1e} at n = {n} and n = {4 * n}: '
      f'the step size is n, so a c_proj trained at one n takes other steps at another')
assert all(e < 1e-12 for e in (err_values, err_alpha, err_tied))

# Tokens meet only through 2p + 1 numbers per head: n_k, s_k, and q_k (each coordinate's sum of squares over
# the tokens, for Pi). The layer's output again, each token's from that token and those numbers alone.
def one_token(z, n_k, s, q, layer):
    """A token's output (d,) from the token z (d,) and its sequence's n_k (K,), s_k and q_k (K, p)."""
    w = layer.c_attn(z).view(layer.n_head, -1)                           # (K, p)
    pi = torch.softmax(layer.temp[:, 0] * (w * w / q).sum(-1), dim=0)   # (K,)
    return layer.c_proj((-pi[:, None] * w / (1 + s / (n_k[:, None] + 1e-8))).flatten())


with torch.no_grad():
    w = vit_layer.split_heads(vit_layer.c_attn(x))                       # (B, K, n, p)
    Pi = vit_layer.memberships(w)
    stats = [(Pi[b].sum(-1), torch.einsum('kn,knp->kp', Pi[b], w[b] ** 2), (w[b] ** 2).sum(1))
             for b in range(B)]                                          # n_k, s_k, q_k of each sequence
    by_token = torch.stack([torch.stack([one_token(x[b, j], *stats[b], vit_layer) for j in range(n)])
                            for b in range(B)])
    err_tokens = (by_token - vit_layer(x)).abs().max()
numbers = sum(t[0].numel() for t in stats[0])
print(f'   each token\'s output from itself and its sequence\'s {numbers} numbers per head (n_k, s_k, q_k; '
      f'p = {d // K}): max |difference| {err_tokens:.1e}')
assert err_tokens < 1e-12
assert numbers == 2 * (d // K) + 1

# Untied, as trained. Head k's block of c_proj scaled by c_k > 0 is still exactly a step: on the reweighted
# objective sum_k c_k R^var_c,k (head k's own term). A generic c_proj is not a step on any function: were the
# layer (Pi held fixed) a gradient field, its Jacobian would be a Hessian, symmetric, and it is not. What the
# paper measures instead is that R^var_c still falls through a trained model's layers.
scales = torch.tensor([0.5, 1.0, 2.0])
rescaled = tost.TSSA(d, K)
rescaled.load_state_dict(tied.state_dict())
tie(rescaled, scales)
Z = torch.randn(1, n, d)
Pi = rescaled.memberships(rescaled.split_heads(rescaled.c_attn(Z)))


def reweighted(z):
    U = rescaled.U()
    return sum(scales[k] * tost.variational_compression(z, Pi[:, k:k + 1], U[k:k + 1]) for k in range(K))


err_rescaled = (rescaled(Z) + n * grad(reweighted, Z)).abs().max()


def asymmetry(layer):
    """||J - J^T|| / ||J|| of the layer's map Z -> y, its memberships held at Pi."""
    def held(w):
        return Pi
    layer.memberships = held
    J = torch.autograd.functional.jacobian(lambda z: layer(z.view(1, n, d)).flatten(), Z.flatten())
    del layer.memberships
    return ((J - J.T).norm() / J.norm()).item()


generic = randomize(tost.TSSA(d, K))
generic.c_attn.weight.data.copy_(tied.c_attn.weight)
asymmetries = [asymmetry(tied), asymmetry(rescaled), asymmetry(generic)]
print(f'   per-head scales {scales.tolist()} on the tie: '
      f'max |y + n grad sum_k c_k R^var_c,k| {err_rescaled:.1e};\n'
      f'   Jacobian asymmetry ||J - J^T||/||J||: tied {asymmetries[0]:.1e}, rescaled {asymmetries[1]:.1e}, '
      f'generic c_proj {asymmetries[2]:.2f} (a gradient field has 0)')
assert err_rescaled < 1e-12
assert all(e < 1e-12 for e in asymmetries[:2])
assert asymmetries[2] > 0.3


# %% 10. The block. x = x + gamma_1 * attn(LN(x)); x = x + gamma_2 * MLP(LN(x)). The attention, tied as in
# section 9, is exactly a step on R^var_c of its input LN(x); in the block its output is scaled coordinate by
# coordinate by the layer scale gamma_1 and added to x, not to LN(x). It is then no longer a gradient step on
# anything we wrote down. Is it still a descent direction for R^var_c(LN(x))? Write LN(x) = gain * x^ + bias
# with x^ = (x - mean) / sigma, and g_j for token j's gradient with respect to LN(x) (the attention's output
# is -n g_j). To first order the update changes R^var_c(LN(x)) by
#     -n sum_j g_j^T diag(gain) (P_j / sigma_j) diag(gamma_1) g_j,   P_j = I - 1 1^T / d - x^_j x^_j^T / d,
# P_j the Jacobian of the normalisation times sigma_j, positive semi-definite (a projector, but for
# LayerNorm's eps). With gamma_1 = s 1 and gain = a 1, s, a > 0 (gamma_1 as at initialisation, a constant
# gain), that is -n s a sum_j g_j^T P_j g_j / sigma_j <= 0: a DESCENT DIRECTION. With unequal gamma_1
# (trained layer scales) or an unequal gain, diag(gain) P_j diag(gamma_1) is in general not positive
# semi-definite and nothing fixes the sign: measured below, the update still descends while the scales spread
# little, and can ascend when they spread over decades. The MLP is the transformer's, not derived from the
# objective. First, the block's values against its two lines.
def block_formula(x, b):
    def ln(x, m):
        return F.layer_norm(x, (x.shape[-1],), m.weight, m.bias)
    x = x + b.gamma_1 * b.attn(ln(x, b.ln_1))
    h = ln(x, b.ln_2)
    hidden = F.gelu(F.linear(h, b.mlp.c_fc.weight, b.mlp.c_fc.bias))
    return x + b.gamma_2 * F.linear(hidden, b.mlp.c_proj.weight, b.mlp.c_proj.bias)


block = randomize(tost.Block(d, K, causal=False, bias=True))
err_block = (block(x) - block_formula(x, block)).abs().max()
block = tost.Block(d, K, causal=False)
tie(block.attn)
with torch.no_grad():
    block.gamma_1.copy_(torch.rand(d) * 0.02)                            # layer scale: small, unequal
    block.gamma_2.copy_(torch.rand(d) * 0.02)
x = torch.randn(B, n, d)
Pi = block.attn.memberships(block.attn.split_heads(block.attn.c_attn(block.ln_1(x)))).detach()


def objective(x):
    return tost.variational_compression(block.ln_1(x), Pi, block.attn.U())


g = grad(objective, x)
with torch.no_grad():
    update = block.gamma_1 * block.attn(block.ln_1(x))                   # the first line: x -> x + update
    cos = F.cosine_similarity(update.flatten(1), -g.flatten(1)).min()
    value = objective(x)
    drop = value - objective(x + update)
    full = F.cosine_similarity((block(x) - x).flatten(1), -g.flatten(1))
    radial = F.cosine_similarity(update, block.ln_1(x), dim=-1).abs().mean()
print(f'10. the block against its two lines: max |difference| {err_block:.1e}. Its attention line against '
      f'-grad_x R^var_c(LN(x)), gamma_1 ~ U(0, 0.02),\n    two inputs: cosine >= {cos:.3f} (1 would be a '
      f'gradient step); it lowers R^var_c(LN(x)) from {show(value)} by {show(drop)}.\n'
      f'    Much of the update points along the token itself (mean |cosine| with LN(x): {radial:.2f}), '
      f'a change of scale LayerNorm removes.\n'
      f'    The whole block, its small MLP update included, has cosine {show(full)} with -grad (the MLP '
      f'is no step on R^var_c: on some draws, not these, the sum points uphill)')
assert err_block < 1e-12
assert 0.3 < cos < 0.95
assert (drop > 0).all()
assert radial > 0.3


# Many draws: 40 random tied blocks, 10 random inputs through each (400 in all), gamma_1 and the gain drawn
# three ways. For each input, the first-order change of R^var_c(LN(x)) along the update (by autograd) against
# the formula above.
def first_order(block, x):
    """Per sequence of x (S, n, d): the first-order change of R^var_c(LN(x)) along the block's attention
    update, Pi held; the cosine of the update with -grad; and the change by the formula. Returns (3, S)."""
    h = block.ln_1(x)
    Pi = block.attn.memberships(block.attn.split_heads(block.attn.c_attn(h))).detach()
    U = block.attn.U()
    g_x = grad(lambda z: tost.variational_compression(block.ln_1(z), Pi, U), x)
    g_h = grad(lambda z: tost.variational_compression(z, Pi, U), h)
    with torch.no_grad():
        update = block.gamma_1 * block.attn(h)
        sigma = (x.var(-1, unbiased=False, keepdim=True) + block.ln_1.eps).sqrt()   # (S, n, 1)
        x_hat = (x - x.mean(-1, keepdim=True)) / sigma
        v = block.gamma_1 * g_h
        P_v = v - v.mean(-1, keepdim=True) - x_hat * (x_hat * v).sum(-1, keepdim=True) / d     # P_j v_j
        formula = -x.shape[1] * ((block.ln_1.weight * g_h * P_v).sum(-1, keepdim=True) / sigma).sum((1, 2))
    cosine = F.cosine_similarity(update.flatten(1), -g_x.flatten(1))
    return torch.stack([(g_x * update).sum((1, 2)), cosine, formula])


def scales(kind):
    """The layer scale gamma_1 and the LayerNorm gain (d,) of one block."""
    if kind == 'equal':                                                  # s 1 and a 1, s over 6 decades
        return torch.full((d,), 10 ** (-6 * torch.rand(()))), torch.full((d,), 10 ** (-2 * torch.rand(())))
    if kind == 'small':
        return 0.02 * torch.rand(d), torch.ones(d)
    return 10 ** (-8 * torch.rand(d)), 10 ** (-2 * torch.rand(d))      # over 8 and 2 decades


blocks = 40
inputs = 10
rows = {}
with torch.random.fork_rng():                                            # the draws after this one unmoved
    probe = tost.Block(d, K, causal=False)
    for kind in ('equal', 'small', 'spread'):
        results = []
        for _ in range(blocks):
            with torch.no_grad():
                probe.attn.c_attn.weight.copy_(torch.randn(d, d) / d ** 0.5)
                gamma_1, gain = scales(kind)
                probe.gamma_1.copy_(gamma_1)
                probe.ln_1.weight.copy_(gain)
            tie(probe.attn)
            results.append(first_order(probe, torch.randn(inputs, n, d)))
        rows[kind] = torch.cat(results, 1)                               # (3, blocks * inputs)
draws = blocks * inputs
print(f'    first-order change of R^var_c(LN(x)) along the attention update, attention tied, {draws} random '
      f'inputs ({blocks} blocks) each:')
names = {'equal': 'gamma_1 = s 1, gain = a 1 (s, a > 0)',
         'small': 'gamma_1 ~ U(0, 0.02) per coordinate, gain 1',
         'spread': 'gamma_1 over 8 decades, gain over 2'}
for kind, (change, cosine, formula) in rows.items():
    err = ((change - formula).abs() / formula.abs()).max()
    print(f'    {names[kind]:45s} ascents {int((change > 0).sum()):3d} of {draws}, cosine with -grad >= '
          f'{cosine.min():6.3f}; against the formula, largest relative difference {err:.1e}')
    assert err < 1e-9
assert (rows['equal'][0] < 0).all()
assert (rows['small'][0] < 0).all()
assert (rows['spread'][0] > 0).any()


# %% 11. The causal step: every sum over tokens becomes a prefix sum (tost.CausalTSSA). Its values against the
# formulas, token by token; then what it descends: with c_proj tied and nothing added to n_k, and the
# memberships pi_0 .. pi_t held as the layer computed them, each at its own time,
#     sum_k U_k y_tk = -(t+1) grad_{z_t} R^var_c(Z_{<=t}, Pi_{<=t}),
# with y_tk = -pi_tk w_tk / (1 + A_tk / P_tk) head k's output at t before c_proj, A_tk = sum_{j<=t} pi_jk
# w_jk^2 and P_tk = sum_{j<=t} pi_jk its prefix's s_k and n_k (section 12 computes them one token at a time):
# each token takes a unit step on (t+1) R^var_c of its own prefix, as section 9's tied layer is a unit step on
# n R^var_c. The growth with t is the objective's normalisation, not a different kind of step; but measured on
# R^var_c itself, a late token takes a larger step than an early one, and no learned c_proj can absorb t + 1
# as it absorbs n (section 9): the factor changes along the sequence. What the layer keeps of the past is
# prefix sums of squares: nearly a bag of tokens, its order seen only through the memberships and the position
# bias (an exercise measures how much, and the recall experiment shows what that costs).
def causal_tssa(x, layer):
    """The released causal operator from its formulas, one position at a time."""
    B, T, d = x.shape
    K, p = layer.n_head, layer.head_dim
    w = (x @ layer.c_attn.weight.T).view(B, T, K, p)
    y = torch.zeros(B, T, K, p)
    pis = []
    for t in range(T):
        Q = (w[:, :t + 1] ** 2).sum(1).clamp_min(1e-12)                              # (B, K, p)
        score = layer.temp[:, 0] * ((w[:, t] ** 2 / Q).sum(-1) + p * layer.pos_bias[:, t])
        pis.append(torch.exp(score) / torch.exp(score).sum(-1, keepdim=True))        # (B, K)
        pi = torch.stack(pis, 1)                                                     # (B, t+1, K)
        m = torch.einsum('btk,btkp->bkp', pi, w[:, :t + 1] ** 2) / (pi.sum(1)[..., None] + 1e-8)
        y[:, t] = -pis[t][..., None] * w[:, t] / (1 + m)                              # m: A_t / P_t
    return y.flatten(2) @ layer.c_proj.weight.T


B, T, d, K = 2, 10, 12, 3
layer = randomize(tost.CausalTSSA(d, K, block_size=T))
x = torch.randn(B, T, d)
err_values = (layer(x) - causal_tssa(x, layer)).abs().max()
tie(layer)
Z = torch.randn(B, T, d)
y = layer(Z)                                                             # (B, T, d)  sum_k U_k y_tk
w2 = layer.split_heads(layer.c_attn(Z)).square()                         # (B, K, T, p)
Q = torch.cumsum(w2, 2)
Pi = layer.prefix_memberships(w2, Q)                                     # (B, K, T)  pi_t from tokens <= t
errs, sizes, errs_now = [], [], []
for t in range(T):
    g = grad(lambda z: tost.variational_compression(z[:, :t + 1], Pi[..., :t + 1], layer.U()), Z)
    errs.append((y[:, t] + (t + 1) * g[:, t]).abs().max().item())
    sizes.append((-(y[:, t] * g[:, t]).sum() / (g[:, t] * g[:, t]).sum()).item())   # the step, fitted
    # every membership re-estimated at time t (from Q_t): not what the layer computes
    Pi_now = layer.prefix_memberships(w2[:, :, :t + 1], Q[:, :, t:t + 1].expand(-1, -1, t + 1, -1))
    g = grad(lambda z: tost.variational_compression(z[:, :t + 1], Pi_now, layer.U()), Z)
    errs_now.append((y[:, t] + (t + 1) * g[:, t]).abs().max().item())
print(f'11. causal TSSA against its formulas: max |difference| {err_values:.1e}. Tied, at t = 0 .. {T - 1}: '
      f'the step size fitted along the gradient\n    {show(sizes)}\n'
      f'    max |y_t + (t+1) grad_z_t R^var_c(Z_<=t, Pi_<=t)| = {max(errs):.1e}; '
      f'with the memberships re-estimated at time t instead: {max(errs_now):.3f}')
assert err_values < 1e-12
assert all(e < 1e-12 for e in errs)
assert max(errs_now) > 1e-3
assert all(abs(s - (t + 1)) < 1e-9 for t, s in enumerate(sizes))

# %% 12. The recurrent state. Prefix sums advance one token at a time: the state (Q, A, P) holds 2p + 1
# numbers per head at any length, so generating a token costs the same at any context length and no cache
# grows (the released code has no state: it runs the whole prefix again for each new token). One step, with
# (Q, A, P) the sums over the t tokens before and w the new token's projection, in order:
#     Q <- Q + w^2,   pi_t from w^2 / Q,   A <- A + pi_t w^2,   P <- P + pi_t,   y_t = -pi_t w / (1 + A / P):
# the token counts in its own statistics, so at t = 0 A / P = w_0^2 whatever pi_0 is (the 1e-8 added to P
# aside), and the first token's gain D is 1 / (1 + w_0^2). Steps from the state give the parallel outputs, and
# so does a forward split in two with the state carried.
layer = randomize(tost.CausalTSSA(16, 4, block_size=40))
x = torch.randn(2, 40, 16)
with torch.no_grad():
    y_par = layer(x)
    state = layer.empty_state(2, dtype=x.dtype)
    ys = []
    for t in range(40):
        y_t, state = layer.step(x[:, t], state)
        ys.append(y_t)
    y_a, st = layer(x[:, :15], layer.empty_state(2, dtype=x.dtype))
    y_b, st = layer(x[:, 15:], st)
err_steps = (torch.stack(ys, 1) - y_par).abs().max()
err_split = (torch.cat([y_a, y_b], 1) - y_par).abs().max()
err_state = max((a - b).abs().max() for a, b in zip(state[:3], st[:3]))
numbers = sum(v[0, 0].numel() for v in state[:3])
print(f'12. 40 recurrent steps against the parallel form: max |difference| {err_steps:.1e}; '
      f'split at 15 with the state carried: {err_split:.1e},\n'
      f'    final states differ by at most {err_state:.1e}; the state holds {numbers} '
      f'numbers per head (p = 4) after any number of tokens')
assert all(e < 1e-12 for e in (err_steps, err_split, err_state))
assert numbers == 2 * 4 + 1
assert state.t == 40


# %% 13. Cost. Count the elements every torch call of a forward returns (a machine-independent proxy for
# memory traffic, not for the arithmetic inside a call; counted, not timed), at 4x the tokens and at 2x the
# width. The exact step in its d x d form (section 2) does O(K(n d^2 + d^3)) arithmetic: linear in n,
# superlinear in d; its count grows less than 4x with the tokens (its d x d statistics do not grow with n) and
# more than 2x with the width. Softmax attention is O(n^2 d): 16x for 4x the tokens (its n x n matrix
# dominates the count, so 2x the width barely moves it, though its arithmetic doubles). TSSA is O(n d) beyond
# its two d x d projections (w = U^T z and the map back, O(n d^2) arithmetic as for any linear layer, n d
# elements each): 4x and 2x, counted. ToST's saving over the exact step is in d (a diagonal statistic instead
# of K covariances and their inverses: n d^2 once for the projections, where the exact step pays K n d^2 + K
# d^3); over softmax attention, in n. Read the figure's slopes, not its heights: the exact step's line sits
# lowest because its n d^2 work per group happens inside calls that return only d x d results.
class CountElements(torch.overrides.TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.total = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.total += sum(t.numel() for t in (out if isinstance(out, (tuple, list)) else [out])
                          if isinstance(t, torch.Tensor))
        return out


def count(make, n, d):
    """Elements returned by the calls of one forward of make(n, d): the layer is built before counting."""
    f = make(n, d)
    x = torch.randn(1, n, d)
    with torch.no_grad(), CountElements() as c:
        f(x)
    return c.total


def exact_step(n, d, K=4):
    Pi = torch.full((1, K, n), 1 / K)
    return lambda x: exact_grad(x, Pi, 1.0)


def softmax_attention(n, d):
    return lambda x: torch.softmax(x @ x.transpose(-2, -1), dim=-1) @ x


def tssa(n, d):
    return tost.TSSA(d, 4)


def causal(n, d):
    return tost.CausalTSSA(d, 4, block_size=n)


ops = {'exact step (d x d)': exact_step, 'softmax attention': softmax_attention, 'TSSA': tssa,
       'CausalTSSA': causal}
print('13. elements returned by the calls of one forward at width d = 32, and their ratios for 4x the tokens '
      'and for 2x the width:')
curves = {}
sizes = (256, 1024, 4096)
for name, f in ops.items():
    curves[name] = [count(f, n, 32) for n in sizes]
    by_n = curves[name][2] / curves[name][1]
    by_d = count(f, 1024, 64) / curves[name][1]
    print(f'    {name:19s} n = 1024: {curves[name][1]:>11,}   n = 4096: {curves[name][2]:>11,}   '
          f'ratio {by_n:5.2f};   d = 64: ratio {by_d:5.2f}')
    if name == 'softmax attention':
        assert by_n > 14 and by_d < 2.2
    elif name == 'exact step (d x d)':
        assert 2 < by_n < 3.9 and by_d > 2.2
    else:
        assert 3.9 < by_n < 4.1 and 1.9 < by_d < 2.1
fig, ax = plots(1, 1, size=(6, 3.6))
if fig:
    # Softmax red and ToST blue, as in the other pages' figures.
    for (name, counts), color in zip(curves.items(), ('#7f7f7f', '#d62728', '#17becf', '#1f77b4')):
        ax.loglog(sizes, counts, 'o-', label=name, color=color)
    ax.set(xlabel='tokens n (log scale)', ylabel='elements returned (d = 32)',
           title='elements one forward returns: the slopes, not the heights')
    ax.set_xticks(sizes, [str(n) for n in sizes])
    ax.minorticks_off()
    ax.legend(fontsize=8)
    draw('cost', fig)

# %% 14. Layers unrolled. A stack of white-box layers, each a step on the objective, compresses the tokens
# layer after layer. Twelve layers (alpha = 10, tau = 0.05 n) sharing the true subspaces U_k, on 300 tokens
# from three planes in R^6, each group spread 1.0 along one axis of its plane and 0.5 along the other, with
# noise 0.1; memberships re-estimated by each layer at temp_k = 100 (at temp_k = 1 they would be nearly
# uniform, section 8). R^var_c falls at every layer, and within its plane each group loses far more along its
# weak axis. But ToST unrolls only the compression half of rate reduction: nothing here expands, so Delta R =
# R - R_c (R_c with the true groups), the objective of section 1, falls too, and sixty layers shrink the
# tokens towards zero. In a real model what keeps the tokens apart is not derived from the objective:
# LayerNorm (each token rescaled before every layer), the residual stream, the MLP, and training. Rescaling
# the tokens after each layer (LayerNorm without its gains) slows the fall of Delta R but does not stop it.
n, K, p, alpha = 300, 3, 2, 10.0
U = orthogonal_heads(K, p)
Z, Pi_true = subspace_mixture(n, U, scales=(1.0, 0.5), noise=0.1)
layer = tost.TSSA(K * p, K, whitebox=True, alpha=alpha, tau=0.05 * n)
group = torch.arange(n) % K


def unroll(Z, layers, normalise=False):
    history = [Z]
    for _ in range(layers):
        Z = Z + layer(Z)
        if normalise:
            Z = F.layer_norm(Z, (K * p,))
        history.append(Z)
    return history


def variational(Zl):
    w = layer.split_heads(layer.c_attn(Zl))
    return tost.compression_of_projections(w, layer.memberships(w), alpha).item()


def delta_R(Zl):
    return (R(Zl, alpha) - R_c(Zl, Pi_true, alpha)).item()


with torch.no_grad():
    layer.c_attn.weight.copy_(U.permute(0, 2, 1).reshape(K * p, K * p))  # rows k*p to (k+1)*p - 1: U_k^T
    layer.temp.fill_(100.0)
    history = unroll(Z, 12)
    normalised = unroll(F.layer_norm(Z, (K * p,)), 12, normalise=True)
    sixty = unroll(Z, 60)[-1]
r_var = torch.tensor([variational(Zl) for Zl in history])
dR = torch.tensor([delta_R(Zl) for Zl in history])
dR_norm = torch.tensor([delta_R(Zl) for Zl in normalised])
own = [torch.einsum('nd,ndp->np', Zl[0], U[group]) for Zl in history]  # (n, p) each token in its own plane
kept = own[-1].square().sum(0) / own[0].square().sum(0)                  # (strong axis, weak axis)
energy = sixty.square().sum(-1).mean()
print(f'14. 12 white-box layers; the input (layer 0) and after layers 3, 6, 9, 12:\n'
      f'    R^var_c, Pi as estimated   {show(r_var[::3])}\n'
      f'    Delta R, true groups       {show(dR[::3])}\n'
      f'    Delta R, tokens rescaled   {show(dR_norm[::3])}\n'
      f'    within its plane each group keeps {kept[0]:.3f} of its energy along the strong axis, '
      f'{kept[1]:.4f} along the weak one;\n'
      f'    after 60 layers the mean |z|^2 is {energy:.1e} (it was {Z.square().sum(-1).mean():.2f})')
assert (r_var.diff() < 0).all()
assert kept[1] < 0.1 * kept[0]
assert dR[-1] < 0.5 * dR[0]
assert energy < 1e-6
assert dR_norm[-1] < dR_norm[0]
assert dR_norm[-1] - dR_norm[0] > dR[-1] - dR[0]
fig, axes = plots(1, 3, size=(13, 4))
if fig:
    axes[0].plot(r_var, 'o-', label='R^var_c')
    axes[0].plot(dR, 's-', label='Delta R = R - R_c, true groups')
    axes[0].plot(dR_norm, '^--', label='Delta R, tokens rescaled')
    axes[0].set(title='objectives, layer by layer', xlabel='layer', ylabel=f'objective (alpha = {alpha:g})')
    axes[0].legend(fontsize=8)
    for ax, v, title in ((axes[1], own[0], 'tokens before'), (axes[2], own[-1], 'after 12 layers')):
        for k in range(K):
            ax.scatter(v[group == k, 0], v[group == k, 1], s=6, label=f'group {k}')
        ax.set(title=f'{title}, each in its own plane', xlabel='strong axis', ylabel='weak axis',
               aspect='equal')
    axes[1].legend(loc='upper right', fontsize=8)
    axes[2].set(xlim=axes[1].get_xlim(), ylim=axes[1].get_ylim())     # the same scale before and after
    draw('unrolled', fig)

# %% 15. Results and limitations. As the paper reports them (Wu et al., ICLR 2025, arXiv 2412.17810; quoted,
# not computed here). Vision, ImageNet-1k top-1: ToST-T 67.3, ToST-S 77.9, ToST-M 80.3 (ViT-S 79.8, XCiT-S
# 80.5). Language, OpenWebText validation cross-entropy: ToST-Base (110M) 3.20 against GPT-2 Base (124M) 2.84;
# ToST-Medium (304M) reaches 2.88 and ToST-Large (655M) 2.72. Long Range Arena: 59.90 on average (Transformer
# 59.24). Cost: at 4k tokens ToST-Base takes 0.60x GPT-2's time and 0.41x its memory. The R^var_c of a trained
# ToST's layers falls with depth: the layers do compress.
#
# Limitations. The past enters a causal layer only as prefix sums of squares, nearly a bag that keeps no
# earlier token whole, so a task that looks one earlier token up (associative recall, even with each key and
# its value in one token) fails where one softmax layer succeeds; `python -m lecture.recall` shows it in a
# few minutes on a CPU. The memberships are nearly uniform at initialisation (section 8). The language
# model trails GPT-2 at equal size. Unrolled, the objective only compresses (section 14). This
# repository's own measurements are in docs/quality.md and docs/capabilities.md.
print('15. results and limitations: quoted from the paper in this cell\'s text (nothing to compute)')

# %% 16. Exercises. In lecture/exercises.py (each has a check your answer must pass, and the solutions are
# kept apart in lecture/solutions.py, which the students' copy leaves out): 1 derive grad R^var_c and say
# where its 1/n comes from (sections 2, 6); 2 what that 1/n means, every token given a twin (section 6); 3
# prove the corollary, each group inside span(U_k) (section 5); 4 say why the causal pi_0 is exactly 1/K
# (section 8); 5 write TSSA from its formula in ten lines and check it against tost.TSSA (section 9); 6
# compute the exact R_c gradient in O(n d^2) (section 2); 7 predict what untying c_proj does, and 8 find the
# objective a per-head rescaling of the tie descends (section 9); 9 show that the past is nearly a bag
# (section 11); 10 track Delta R through the layers (section 14).
# In class: start `python -m lecture.recall` at section 11, and read its table at section 15.
print('16. exercises: lecture/exercises.py, checked by python -m lecture.exercises; '
      'the experiment: python -m lecture.recall')


# %% A. Appendix: the GPT by hand. The whole language model written out from its lines (embeddings, each
# block's two lines, the final LayerNorm, the head tied to the embedding), against GPT.forward's loss and its
# last-position logits, GPT.logits, and a prefill followed by recurrent steps.
model = randomize(tost.GPT(tost.GPTConfig(block_size=24, vocab_size=30, n_layer=2, n_head=2, n_embd=8)), 0.5)
idx = torch.randint(0, 30, (2, 24))
targets = torch.randint(0, 30, (2, 24))
with torch.no_grad():
    x = model.transformer.wte.weight[idx] + model.transformer.wpe.weight[:24]
    for b in model.transformer.h:
        x = block_formula(x, b)
    ln_f = model.transformer.ln_f
    by_hand = F.layer_norm(x, (8,), ln_f.weight, ln_f.bias) @ model.transformer.wte.weight.T   # (2, 24, 30)
    loss_by_hand = F.cross_entropy(by_hand.flatten(0, 1), targets.flatten())
    logits, loss = model(idx, targets)
    last, no_loss = model(idx)
    first, states = model.prefill(idx[:, :10])
    steps = [first]
    for t in range(10, 23):
        logits_t, states = model.step(idx[:, t], states)
        steps.append(logits_t)
err_forward = max((logits - by_hand).abs().max(), (loss - loss_by_hand).abs(),
                  (last[:, 0] - by_hand[:, -1]).abs().max())
err_logits = (model.logits(idx) - by_hand).abs().max()
err_steps = (torch.stack(steps, 1) - by_hand[:, 9:23]).abs().max()
print(f'A. GPT by hand (loss {loss_by_hand:.4f}): GPT.forward logits, loss and last-position logits '
      f'max |difference| {err_forward:.1e};\n   GPT.logits {err_logits:.1e}; '
      f'prefill of 10 tokens, then 13 steps: {err_steps:.1e}')
assert all(e < 1e-12 for e in (err_forward, err_logits, err_steps))
assert no_loss is None
assert last.shape == (2, 1, 30)


# %% B. Appendix: the fused core. On a CPU the causal layer's training path runs tost_fast.CausalCore on large
# inputs unless CausalTSSA.fast is False: the sequence cut into chunks, the prefix sums carried from chunk to
# chunk (and the suffix sums of the backward carried back), with a hand-written backward. Here with five
# chunks, so every carry runs: it gives the readable lines' numbers, float64 to 1e-12 (values and every
# gradient; and without autograd), float32 to rounding.
def outputs_and_grads(layer, x, g, fast):
    tost.CausalTSSA.fast = fast
    assert tost_fast.usable(layer, x) == fast                # CausalTSSA.forward's dispatch: the core, or not
    layer.zero_grad()
    x = x.clone().requires_grad_()
    y = layer(x)
    (y * g).sum().backward()
    with torch.no_grad():
        y_no_grad = layer(x)
    tost.CausalTSSA.fast = False
    return [y.detach(), y_no_grad, x.grad] + [p.grad.clone() for p in layer.parameters()]


min_elements = tost_fast.MIN_ELEMENTS            # it runs from 2^19 numbers up by default; these are 9,600
chunk = tost_fast.CHUNK
tost_fast.MIN_ELEMENTS = 0
tost_fast.CHUNK = 2 * 16 * 64                    # 64 positions a chunk: 300 positions in 5 chunks
layer = randomize(tost.CausalTSSA(16, 4, block_size=300))
x = torch.randn(2, 300, 16)
g = torch.randn(2, 300, 16)
err64 = max((a - b).abs().max() for a, b in zip(outputs_and_grads(layer, x, g, True),
                                                 outputs_and_grads(layer, x, g, False)))
ref = outputs_and_grads(layer, x, g, False)
layer.float()


def relative(a, b):
    return ((a.double() - b).norm() / b.norm()).item()


err32 = max(relative(a, b) for a, b in zip(outputs_and_grads(layer, x.float(), g.float(), True), ref))
print(f'B. fused core in 5 chunks against the readable lines: float64 max |difference| {err64:.1e} '
      f'(values, values without autograd, every gradient);\n'
      f'   float32 against float64, largest relative error {err32:.1e}')
assert err64 < 1e-12
assert err32 < 1e-6
tost.CausalTSSA.fast = True                      # the library's defaults again, for whatever runs next
tost_fast.MIN_ELEMENTS = min_elements
tost_fast.CHUNK = chunk
torch.set_default_dtype(torch.float32)           # (a notebook's next cell would build float64 models)
