"""
ToST's derivation as a lecture: each step computed with tost.py on small tensors, in float64.

Run it as a script, `python derivation.py` (a few seconds): every claim is printed with the number that
shows it, and asserted, so the script fails loudly if the code stops matching the math. Or open it in
Jupyter or VS Code, where each `# %%` line starts a cell. Symbols as in tost.py: tokens are the rows of
Z (B, n, d), memberships Pi are (B, K, n) and sum to 1 over the K groups, projections U are (K, d, p).
"""

# %% Setup: the exact compression term R_c, computed here by log-determinants (independently of tost.py)
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import tost

torch.manual_seed(0)
f64 = torch.float64


def second_moments(Z, Pi):
    """Z^T diag(pi_k) Z per group (tokens as rows): (B, K, d, d), each group's uncentred second moment."""
    return torch.einsum('bnd,bkn,bne->bkde', Z, Pi, Z)


def R_c(Z, Pi, alpha):
    """R_c(Z, Pi) = 1/2 sum_k (n_k/n) logdet(I + alpha/n_k Z^T diag(pi_k) Z). Returns (B,)."""
    n, d = Z.shape[1:]
    n_k = Pi.sum(-1)                                                       # (B, K)
    M = torch.eye(d, dtype=Z.dtype) + alpha / n_k[..., None, None] * second_moments(Z, Pi)
    return 0.5 * (n_k / n * torch.logdet(M)).sum(-1)


def random_memberships(B, K, n):
    return torch.softmax(2 * torch.randn(B, K, n, dtype=f64), dim=1)      # (B, K, n), sums to 1 over K


def show(v):
    return '  '.join(f'{x:8.4f}' for x in v.tolist())


# %% 1. R^var_c (the paper's equation 4) with square orthogonal U_k: an upper bound on R_c, tight in the eigenbasis
B, n, d, K, alpha = 4, 24, 6, 3, 2.0
Z = torch.randn(B, n, d, dtype=f64)
Pi = random_memberships(B, K, n)
exact = R_c(Z, Pi, alpha)
U = torch.linalg.qr(torch.randn(K, d, d, dtype=f64))[0]                  # K random orthogonal d x d
above = tost.variational_compression(Z, Pi, U, alpha)
eig = [tost.variational_compression(Z[b:b + 1], Pi[b:b + 1], torch.linalg.eigh(M)[1], alpha)
       for b, M in enumerate(second_moments(Z, Pi))]                      # U_k = eigenvectors of group k's moment
tight = torch.cat(eig)
print('1. square orthogonal U_k, four draws')
print(f'   R_c                        {show(exact)}')
print(f'   R^var_c, random U_k        {show(above)}   all above R_c')
print(f'   R^var_c, U_k eigenvectors  {show(tight)}   equal: max |difference| {(tight - exact).abs().max():.1e}')
assert (above > exact).all() and (tight - exact).abs().max() < 1e-12

# %% 2. With U_k of size d x p, p < d (what ToST uses), R^var_c is a bound in neither direction
p, draws = d // K, 300
Zs, Pis = torch.randn(draws, n, d, dtype=f64), random_memberships(draws, K, n)
Us = torch.linalg.qr(torch.randn(draws, K, d, d, dtype=f64))[0][..., :p]  # (draws, K, d, p) orthonormal columns
var = tost.compression_of_projections(torch.einsum('bnd,bkdp->bknp', Zs, Us), Pis, alpha)
below = int((var < R_c(Zs, Pis, alpha)).sum())
# constructed: hard memberships, and each group's tokens lie in its own subspace, off the subspace's axes
U = Us[0]                                                                # (K, d, p)
group = torch.arange(n) % K                                              # token j belongs to group j mod K
Pi1 = torch.nn.functional.one_hot(group, K).T[None].to(f64)              # (1, K, n)
c = torch.randn(n, p, dtype=f64) * torch.tensor([3.0, 0.3], dtype=f64)  # coordinates in the subspace,
rot = torch.linalg.qr(torch.randn(p, p, dtype=f64))[0]                  # spread along a rotated axis
Z1 = torch.einsum('ndp,np->nd', U[group], c @ rot.T)[None]               # (1, n, d)  z_j = U_k c_j
var1, exact1 = tost.variational_compression(Z1, Pi1, U, alpha), R_c(Z1, Pi1, alpha)
print(f'2. U_k of size {d} x {p}: below R_c in {below} of {draws} random draws; constructed case above it: '
      f'R^var_c {var1.item():.4f} > R_c {exact1.item():.4f}')
assert below > 0 and (var1 > exact1 + 1e-3).all()

# %% 3. The white-box layer is -tau times the gradient of R^var_c, with Pi held fixed
B, n, d, K, alpha, tau = 2, 16, 12, 3, 2.0, 0.5
layer = tost.TSSA(d, K, whitebox=True, alpha=alpha, tau=tau).double()
Z = torch.randn(B, n, d, dtype=f64, requires_grad=True)
step = layer(Z)
Pi = layer.memberships(layer.split_heads(layer.c_attn(Z)))               # (B, K, n), computed from Z
(g,) = torch.autograd.grad(tost.variational_compression(Z, Pi.detach(), layer.U(), alpha).sum(), Z)
(g_all,) = torch.autograd.grad(tost.variational_compression(Z, Pi, layer.U(), alpha).sum(), Z)
err, err_all = (step + tau * g).abs().max(), (step + tau * g_all).abs().max()
print(f'3. white-box step, max |step|: {step.abs().max():.3f}; max |step + tau grad|: {err:.1e} with Pi held '
      f'fixed, {err_all:.3f} if the gradient also runs through Pi')
assert err < 1e-12 and err_all > 1e-3

# %% 4. A small step lowers R^var_c (Pi fixed at the memberships of the input)
layer.tau = 0.1
with torch.no_grad():
    Pi = layer.memberships(layer.split_heads(layer.c_attn(Z)))
    before = tost.variational_compression(Z, Pi, layer.U(), alpha)
    after = tost.variational_compression(Z + layer(Z), Pi, layer.U(), alpha)
print(f'4. one step of tau = {layer.tau}: R^var_c {show(before)}  ->  {show(after)}')
assert (after < before).all()

# %% 5. Which directions a step shrinks: the weak ones. With [U_1 .. U_K] orthogonal, coordinate i of token j
# is multiplied by 1 - tau pi_jk D_ki / n, and D_ki = alpha / (1 + alpha s_ki/n_k) is largest where the
# group's second moment s_ki/n_k is smallest.
B, n, d, K, alpha, tau = 1, 64, 12, 3, 1.0, 4.0
layer = tost.TSSA(d, K, whitebox=True, alpha=alpha, tau=tau).double()
with torch.no_grad():
    layer.c_attn.weight.copy_(torch.linalg.qr(torch.randn(d, d, dtype=f64))[0])
    scale = torch.logspace(-1, 1, d // K, dtype=f64).repeat(K)          # in each group, weak to strong
    Z = (torch.randn(B, n, d, dtype=f64) * scale) @ layer.c_attn.weight  # tokens with those scales along U
    w = layer.split_heads(layer.c_attn(Z))                               # (B, K, n, p)
    Pi = layer.memberships(w)                                            # (B, K, n)
    w_after = layer.split_heads(layer.c_attn(Z + layer(Z)))
moment = lambda w: (Pi[..., None] * w * w).sum(2) / Pi.sum(2)[..., None]  # (B, K, p)  s_k / n_k
m, m_after = moment(w), moment(w_after)
D = alpha / (1 + alpha * m)
err = (w_after - w * (1 - tau / n * Pi[..., None] * D[:, :, None])).abs().max()
assert err < 1e-12
factor = w_after / w                                                     # what the step did, token by token
order = m.argsort(-1)
assert (factor.gather(-1, order[:, :, None].expand_as(factor)).diff(dim=-1) > 0).all()   # weakest shrunk most
kept = m_after / m
o = order[0, 0]
print(f'5. one white-box step: max |w_after - w (1 - tau pi D / n)| = {err:.1e}, and on every token the factor')
print('   grows from the weakest coordinate of a group to the strongest. Group 0, weakest to strongest:')
print(f'   second moment s/n_k  {show(m[0, 0, o])}\n   D                    {show(D[0, 0, o])}\n'
      f'   fraction kept        {show(kept[0, 0, o])}')
weak, strong = kept.gather(-1, order[..., :1]), kept.gather(-1, order[..., -1:])
print(f'   each group\'s weakest coordinate keeps {show(weak.flatten())} of its second moment,\n'
      f'               its strongest keeps {show(strong.flatten())}')
assert (weak < strong).all()

# %% 6. The causal step: sum_k U_k y_tk = -(t+1) grad_{z_t} R^var_c(Z_{<=t}, Pi_{<=t}). Output tied to the input
# projection (c_proj = c_attn^T), alpha = 1, nothing added to n_k; Pi_{<=t} = pi_0 .. pi_t, each as the layer
# computed it at its own time, held fixed. Temperatures and position biases are random: they enter only Pi.
B, T, d, K = 2, 10, 12, 3
layer = tost.CausalTSSA(d, K, block_size=T).double()
with torch.no_grad():
    layer.temp.uniform_(0.5, 2.0)
    layer.pos_bias.normal_(0, 0.5)
    layer.c_proj.weight.copy_(layer.c_attn.weight.T)
layer.eps = 0.0
Z = torch.randn(B, T, d, dtype=f64, requires_grad=True)
y = layer(Z)                                                             # (B, T, d)  sum_k U_k y_tk
w2 = layer.split_heads(layer.c_attn(Z)).square()                         # (B, K, T, p)
Q = torch.cumsum(w2, 2)
Pi = layer.memberships(w2, Q).detach()                                   # (B, K, T)  pi_t from tokens <= t
errs, sizes, errs_now = [], [], []
for t in range(T):
    (g,) = torch.autograd.grad(tost.variational_compression(Z[:, :t + 1], Pi[..., :t + 1], layer.U()).sum(), Z)
    errs.append((y[:, t] + (t + 1) * g[:, t]).abs().max().item())
    sizes.append((-(y[:, t] * g[:, t]).sum() / (g[:, t] * g[:, t]).sum()).item())   # the step, fitted
    # the same with every membership re-estimated at time t (from Q_t): not what the layer computes
    Pi_now = layer.memberships(w2[:, :, :t + 1], Q[:, :, t:t + 1].expand(-1, -1, t + 1, -1)).detach()
    (g,) = torch.autograd.grad(tost.variational_compression(Z[:, :t + 1], Pi_now, layer.U()).sum(), Z)
    errs_now.append((y[:, t] + (t + 1) * g[:, t]).abs().max().item())
print(f'6. causal step at t = 0 .. {T - 1}: fitted step size {show(torch.tensor(sizes))}\n'
      f'   max |y_t + (t+1) grad_z_t R^var_c(Z_<=t, Pi_<=t)| = {max(errs):.1e}; with the memberships '
      f're-estimated at time t instead: {max(errs_now):.3f}')
assert max(errs) < 1e-12 and max(errs_now) > 1e-3
assert all(abs(s - (t + 1)) < 1e-9 for t, s in enumerate(sizes))

# %% 7. The recurrent state gives the parallel outputs: 2p + 1 numbers per head, at any length
B, T, d, K = 2, 40, 16, 4
layer = tost.CausalTSSA(d, K, block_size=T).double()
with torch.no_grad():
    layer.temp.uniform_(0.5, 2.0)
    layer.pos_bias.normal_(0, 0.5)
    Z = torch.randn(B, T, d, dtype=f64)
    y_par = layer(Z)
    state, ys = layer.empty_state(B, dtype=f64), []
    for t in range(T):
        y_t, state = layer.step(Z[:, t], state)
        ys.append(y_t)
err = (torch.stack(ys, 1) - y_par).abs().max()
per_head = (state.Q[0, 0].numel() + state.A[0, 0].numel() + state.P[0, 0].numel())
print(f'7. {T} recurrent steps vs the parallel form: max |difference| {err:.1e}; the state holds '
      f'{per_head} numbers per head (p = {d // K}) after any number of tokens')
assert err < 1e-12 and per_head == 2 * (d // K) + 1


# %% 8. The cost is linear in the number of tokens: elements written by every operation, counted (not timed)
class CountElements(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.total = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.total += sum(t.numel() for t in (out if isinstance(out, (tuple, list)) else [out])
                          if isinstance(t, torch.Tensor))
        return out


def count(f, n, d=32):
    x = torch.randn(1, n, d)
    with torch.no_grad(), CountElements() as c:
        f(x)
    return c.total


def softmax_attention(x):                                              # written out: an (n x n) matrix
    return torch.softmax(x @ x.transpose(-2, -1), dim=-1) @ x


tost.TSSA.fast = False                                                   # count the readable lines
ops = {'TSSA': tost.TSSA(32, 4), 'CausalTSSA': tost.CausalTSSA(32, 4, block_size=4096),
       'softmax attention': softmax_attention}
print('8. elements written, 4x the tokens:')
for name, f in ops.items():
    a, b = count(f, 1024), count(f, 4096)
    print(f'   {name:18s} n = 1024: {a:>10,}   n = 4096: {b:>11,}   ratio {b / a:5.2f}')
    assert (3.8 < b / a < 4.2) if name != 'softmax attention' else b / a > 12
tost.TSSA.fast = True
per_token = {n: tost.attention_core_flops('tssa', 1, 768, n, True) for n in (1024, 4096)}
soft = {n: tost.attention_core_flops('softmax', 1, 768, n, True) for n in (1024, 4096)}
print(f'   FLOPs per token of one layer\'s core at width 768, 1024 and 4096 tokens: TSSA {per_token[1024]:,} and '
      f'{per_token[4096]:,}; softmax {soft[1024]:,.0f} and {soft[4096]:,.0f}')
assert per_token[1024] == per_token[4096] and soft[4096] == 4 * soft[1024]
