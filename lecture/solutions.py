"""
Solutions to lecture/exercises.py, each with a short explanation. Try the exercises first:

    python -m lecture.exercises --solutions    # these answers pass every check

Symbols as in the exercises: tokens are the rows of Z (B, n, d), Pi (B, K, n), U (K, d, p),
n_k = sum_j pi_jk, s_k = sum_j pi_jk (U_k^T z_j)^2, f(x) = log(1 + alpha x), f'(x) = alpha / (1 + alpha x).

For the teacher, what the checks of the two predictions print (seeded, so every run prints the same):
exercise 9, the median relative change of the last output when the earlier contents move, TSSA 0.29, 0.14,
0.10 at T = 16, 64, 256 (falling roughly like 1/sqrt(T)), softmax attention 0.91, 1.07, 0.67; exercise 10,
Delta R falling from 0.97 to 0.05 over 12 layers (150 tokens, Delta R with the memberships each layer
estimates; derivation.py's section 14 has 300 tokens and the true groups, hence its other numbers).
"""

import torch


def grad_variational(Z, Pi, U, alpha):
    """1. R^var_c = 1/2 sum_k (n_k/n) sum_i f(s_ki / n_k), and s_ki depends on z_j through the term
    pi_jk (u_ki^T z_j)^2, so d s_ki / d z_j = 2 pi_jk (u_ki^T z_j) u_ki. The chain rule gives, per group and
    coordinate,

        1/2 (n_k/n) f'(s_ki/n_k) (1/n_k) 2 pi_jk (u_ki^T z_j) u_ki
            =  1/n pi_jk f'(s_ki/n_k) (u_ki^T z_j) u_ki

    The 1/2 meets the 2 of the square; the group's weight n_k/n meets the 1/n_k inside f: what is left is 1/n.
    Summed over i and k: 1/n sum_k pi_jk U_k D_k U_k^T z_j, D_k = diag(f'(s_k/n_k)).
    """
    n = Z.shape[1]
    w = torch.einsum('bnd,kdp->bknp', Z, U)                                # (B, K, n, p)  U_k^T z_j
    n_k = Pi.sum(-1)[..., None]                                            # (B, K, 1)
    s = torch.einsum('bkn,bknp->bkp', Pi, w * w)                           # (B, K, p)     s_k
    D = alpha / (1 + alpha * s / n_k)                                      # (B, K, p)     f'(s_k / n_k)
    scaled = Pi[..., None] * D[:, :, None] * w                             # (B, K, n, p)  pi_jk D_k U_k^T z_j
    return torch.einsum('bknp,kdp->bnd', scaled, U) / n                    # (B, n, d)


def duplication_factor():
    """2. One half. With every token twice, s_k/n_k and n_k/n are unchanged, so D_k is too, and the formula of
    exercise 1 at z_j is the same except for its 1/n, now 1/(2n). Each token's share of the statistics is 1/n:
    a token moves the objective only by its part in the averages, and the more tokens, the smaller that part.
    This is also why the practical operator, which has no 1/n, is -n times the gradient when tied: a c_proj
    trained at one n absorbs tau/n at that n only."""
    return 0.5


def projected_compression(Z, Pi, U, alpha):
    """3. (a) If every token of group k is in span(U_k), then M_k = U_k U_k^T M_k U_k U_k^T, and Sylvester's
    det(I_d + A B) = det(I_p + B A) with A = U_k, B = alpha/n_k U_k^T M_k U_k U_k^T gives
    logdet(I_d + alpha/n_k M_k) = logdet(I_p + alpha/n_k U_k^T M_k U_k), since U_k^T U_k = I_p. So
    R^proj_c = R_c. (b) U_k^T M_k U_k is p x p; in the basis I_p its diagonal is the p numbers s_k, and the
    square case (concave f, the diagonal majorised by the eigenvalues) gives
    logdet(I_p + alpha/n_k U_k^T M_k U_k) <= sum_i f(s_ki/n_k). Together: R_c = R^proj_c <= R^var_c.
    Without the hypothesis (a) fails: M_k has energy outside span(U_k), which R_c counts and R^proj_c does
    not, so R^var_c may fall below R_c (as it usually does for random tokens).
    K p <= d is the paper's setting (K mutually orthogonal p-dimensional spans fit in R^d only then, as the
    blocks of ToST's one d x d projection do); the proof uses it nowhere: each group needs only
    U_k^T U_k = I_p and its tokens in span(U_k).
    """
    n, p = Z.shape[1], U.shape[-1]
    w = torch.einsum('bnd,kdp->bknp', Z, U)                                # (B, K, n, p)
    M = torch.einsum('bknp,bkn,bknq->bkpq', w, Pi, w)                      # (B, K, p, p)  U_k^T M_k U_k
    n_k = Pi.sum(-1)                                                       # (B, K)
    logdets = torch.logdet(torch.eye(p) + alpha / n_k[..., None, None] * M)
    return 0.5 * (n_k / n * logdets).sum(-1)


def causal_first_membership(temp, bias0, p):
    """4. At t = 0 the prefix is the token itself: Q_0 = w_0^2, so w_0i^2 / Q_0i = 1 for each of the p
    coordinates (whatever the token and the weights, provided every |w_0i| >= 1e-6: Q is clamped at 1e-12,
    so a smaller coordinate scores w_0i^2 / 1e-12 < 1, and a zero row of weights 0). Every head scores
    temp_k (p + p b_{k,0}), and pi_0 = softmax_k(p temp_k (1 + b_{k,0})). At initialisation temp_k = 1 and
    b = 0, every head scores p, and pi_0 = 1/K exactly. Only the parameters move it: unequal temperatures,
    or the position bias b_{k,0}; the first token's content never does.
    """
    return torch.softmax(p * temp * (1 + bias0), dim=0)


def tssa_forward(x, W, W_out, temp):
    """5. The formula line by line; each head's coordinates are normalised over the tokens before Pi."""
    B, n, d = x.shape
    K = temp.shape[0]
    w = (x @ W.T).view(B, n, K, d // K)                                    # (B, n, K, p)  w_j = U_k^T z_j
    energy = (w * w / (w * w).sum(1, keepdim=True)).sum(-1)               # (B, n, K)     column-normalised
    Pi = torch.softmax(temp * energy, dim=-1)[..., None]                   # (B, n, K, 1)  softmax over heads
    m = (Pi * w * w).sum(1, keepdim=True) / (Pi.sum(1, keepdim=True) + 1e-8)   # (B, 1, K, p)  s_k / n_k
    y = -Pi * w / (1 + m)                                                  # (B, n, K, p)
    return y.reshape(B, n, d) @ W_out.T


def grad_compression(Z, Pi, alpha):
    """6. d/dZ logdet(I + c Z^T diag(pi) Z) = 2 c diag(pi) Z (I + c Z^T diag(pi) Z)^{-1} (tokens as rows).
    With c = alpha/n_k and the weight 1/2 n_k/n, group k contributes
    alpha/n diag(pi_k) Z (I + alpha/n_k M_k)^{-1}.
    Work: M_k costs n d^2, its inverse d^3, applying it to every token n d^2; nothing is n x n. The
    quadratic cost of CRATE's attention comes from writing the inverse through the n x n Gram matrix
    (push-through identity) and approximating that by a softmax, not from the step itself.
    """
    n, d = Z.shape[1:]
    n_k = Pi.sum(-1)                                                       # (B, K)
    M = torch.einsum('bnd,bkn,bne->bkde', Z, Pi, Z)                        # (B, K, d, d)  M_k
    C = torch.linalg.inv(torch.eye(d) + alpha / n_k[..., None, None] * M)  # (B, K, d, d)  C_k / alpha
    return alpha / n * torch.einsum('bkn,bnd,bkde->bne', Pi, Z, C)         # (B, n, d)


def untied_prediction():
    """7. Tied: the layer is -n grad R^var_c exactly (exercise 1 with alpha = 1: U_k maps back). Rescaled:
    head k's part of the field is c_k times the gradient of group k's term, so the whole is the gradient of
    the sum of the terms weighted by c_k (exercise 8): a step, but on a reweighted objective. Generic: the
    field is C g(Z) for a matrix C that does not map heads back onto their own U_k; its Jacobian C Dg is not
    symmetric, and a field whose Jacobian is not symmetric is the gradient of no function. What the paper
    measures for trained models is that R^var_c still falls layer by layer, not that each layer is a step on
    it.
    """
    return {'tied': 'exact', 'rescaled': 'reweighted', 'generic': 'none'}


def reweighted_objective(Z, Pi, U, c):
    """8. 1/2 sum_k c_k (n_k/n) sum_i log(1 + s_ki/n_k): R^var_c with group k's term weighted by c_k. The
    layer maps head k back by c_k U_k, so head k's part is c_k times -n grad of group k's term (exercise
    1). The gradient fixes the function up to a constant; at c_k = 1 it must be R^var_c itself."""
    n = Z.shape[1]
    w = torch.einsum('bnd,kdp->bknp', Z, U)                                # (B, K, n, p)
    n_k = Pi.sum(-1)                                                       # (B, K)
    s = torch.einsum('bkn,bknp->bkp', Pi, w * w)                           # (B, K, p)
    terms = 0.5 * n_k / n * torch.log1p(s / n_k[..., None]).sum(-1)        # (B, K)  each group's term
    return (c * terms).sum(-1)


def reorder_change(layer, content, position, perm):
    """9. Prediction: TSSA moves less, and less as T grows. Its y_t sees the past only through the prefix
    sums Q, A and P. Were whole tokens moved (content and position together), Q would not change at all, and
    A and P only through each pi_s, computed from its own prefix. Here the contents move and the positions
    stay, so the sums change through the cross terms 2 (U^T content_s)(U^T position_s) inside each w_s^2:
    T - 1 terms of random sign, whose sum grows like sqrt(T) while the sums grow like T, so the relative
    change falls roughly like 1/sqrt(T). Softmax attention keeps each token whole and weighs
    content_s + position_s by its match with the query, so moving contents moves its output by a fraction
    several times TSSA's that does not fall like 1/sqrt(T). (Without positions, softmax attention is exactly
    order-blind too: a bag of whole tokens, from which a query can pick one. TSSA's bag holds only sums of
    squares: it cannot recall, lecture/recall.py.)
    """
    moved = torch.cat([content[:, perm], content[:, -1:]], 1)              # the last token stays where it was
    with torch.no_grad():
        y = layer(content + position)[0, -1]
        y_moved = layer(moved + position)[0, -1]
    return ((y_moved - y).norm() / y.norm()).item()


def coding_rate(Z, alpha):
    """R(Z) = 1/2 logdet(I + alpha/n Z^T Z), tokens as rows. (B,)."""
    n, d = Z.shape[1:]
    return 0.5 * torch.logdet(torch.eye(d) + alpha / n * Z.transpose(1, 2) @ Z)


def compression(Z, Pi, alpha):
    """R_c(Z, Pi) = 1/2 sum_k (n_k/n) logdet(I + alpha/n_k Z^T diag(pi_k) Z). (B,)."""
    n, d = Z.shape[1:]
    n_k = Pi.sum(-1)
    M = torch.einsum('bnd,bkn,bne->bkde', Z, Pi, Z)
    return 0.5 * (n_k / n * torch.logdet(torch.eye(d) + alpha / n_k[..., None, None] * M)).sum(-1)


def delta_R_through_layers(Z, layer, layers, alpha):
    """10. Prediction: it falls. Each white-box layer descends R^var_c, squeezing every group towards its
    strong directions, and nothing in the stack expands the whole: the steps shrink the groups and with them
    the whole, and R falls faster than R_c. ToST unrolls only the compression half of rate reduction; in a
    real model the LayerNorm (which restores each token's scale), the residual and the MLP stand where the
    expansion term was.
    """
    values = []
    with torch.no_grad():
        for _ in range(layers + 1):
            Pi = layer.memberships(layer.split_heads(layer.c_attn(Z)))
            values.append(coding_rate(Z, alpha) - compression(Z, Pi, alpha))
            Z = Z + layer(Z)
    return torch.cat(values)
