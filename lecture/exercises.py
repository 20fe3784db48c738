"""
Exercises on ToST's derivation, each with a check that an answer must pass.

    python -m lecture.exercises               # checks your answers: the functions below marked "Your answer"
    python -m lecture.exercises 3 5           # only exercises 3 and 5
    python -m lecture.exercises --solutions   # checks lecture/solutions.py instead (try first, then look)

Each exercise is a statement (what to derive or compute, in the paper's symbols) and a function that raises
NotImplementedError until you write its body. The command runs each function on random cases in float64 and
compares it with the readable lines of tost.py, exactly or to the tolerance the statement gives; it prints
one line per exercise: pass, not attempted, or fail with what differed. The checks are in lecture/checks.py:
run them, you need not read them. Read tost.py's section 1 (variational_compression) and TSSA's white-box step
(its docstring up to "The practical operator") first; the rest of sections 2 and 3 answers exercises 5, 7
and 8, so read it after them. derivation.py is the lecture, a script to run, not to import (importing it
runs it all): write R and R_c from the formulas below.

Symbols as in tost.py: tokens are the rows of Z (B, n, d), the paper's columns z_j; memberships Pi are
(B, K, n) and sum to 1 over the K groups (heads); U is (K, d, p) and U[k] is the paper's U_k;
n_k = sum_j pi_jk, s_k = sum_j pi_jk (U_k^T z_j)^2 (p numbers), f(x) = log(1 + alpha x). The coding rates:
    R(Z)       = 1/2 logdet(I + alpha/n Z^T Z)
    R_c(Z, Pi) = 1/2 sum_k (n_k/n) logdet(I + alpha/n_k M_k),    M_k = Z^T diag(pi_k) Z   (d x d)
    R^var_c    = 1/2 sum_k (n_k/n) sum_i f(s_ki / n_k)           tost.variational_compression
"""

import os
import sys

# Also run by its path (python lecture/exercises.py): the repository's modules come from its root.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import options  # first: a mistake, a closed pipe (`| head`) or Ctrl-C ends in one line

import torch

import tost

# -----------------------------------------------------------------------------
# The exercises. Write each body; keep the names and arguments (the checks call them).


def grad_variational(Z, Pi, U, alpha):
    """Exercise 1. The gradient of R^var_c, in closed form.

    Hold Pi fixed and differentiate R^var_c(Z, Pi | U) with respect to every token z_j. Show that

        grad_{z_j} R^var_c = 1/n sum_k pi_jk U_k D_k U_k^T z_j,    D_k = diag(f'(s_k / n_k))

    and say where the 1/n comes from (which factors of the objective meet and cancel). Then compute it,
    without autograd. Z (B, n, d), Pi (B, K, n), U (K, d, p) with any p, alpha > 0 -> (B, n, d).
    Check: equal to autograd of tost.variational_compression to 1e-12.
    """
    # Your answer.
    raise NotImplementedError


def duplication_factor():
    """Exercise 2. What the 1/n means.

    Give every token a twin: Z -> [Z, Z] (2n tokens), Pi -> [Pi, Pi]. Every s_k and n_k doubles, so R^var_c
    does not change. By what factor does the gradient with respect to one copy of z_j change? Return the
    number.
    Check: equal to the ratio autograd measures, to 1e-9.
    """
    # Your answer.
    raise NotImplementedError


def projected_compression(Z, Pi, U, alpha):
    """Exercise 3. The corollary: when R^var_c with d x p blocks is an upper bound on R_c.

    Take U_k with orthonormal columns (U_k^T U_k = I_p; K p <= d lets the K subspaces be orthogonal), and
    suppose each group's second moment M_k lies inside span(U_k): every token with pi_jk > 0 is in
    span(U_k). Show R^var_c >= R_c in two steps, through each group's rate computed inside its own subspace,

        R^proj_c = 1/2 sum_k (n_k/n) logdet(I_p + alpha/n_k U_k^T M_k U_k):

    (a) under the hypothesis, R^proj_c = R_c (M_k = U_k U_k^T M_k U_k U_k^T, then Sylvester's identity
    det(I + A B) = det(I + B A)); (b) for any orthonormal U_k, R^proj_c <= R^var_c (the square case, in R^p).
    Compute R^proj_c. Z (B, n, d), Pi (B, K, n), U (K, d, p) -> (B,).
    Check: equal to R_c on random cases that satisfy the hypothesis, and to the formula above to 1e-10 on
    any orthonormal U_k with random tokens, outside it (where R^proj_c is not R_c), and never above R^var_c.
    """
    # Your answer.
    raise NotImplementedError


def causal_first_membership(temp, bias0, p):
    """Exercise 4. Why the causal pi_0 is exactly 1/K, and what moves it.

    In tost.CausalTSSA, pi_t = softmax_k(temp_k * sum_i [w_ti^2 / Q_ti + b_{k,t}]), Q_t = sum_{j<=t} w_j^2.
    Predict pi_0, the first token's memberships, for any weights and any input with every |w_0i| >= 1e-6 (Q
    is clamped at 1e-12). Explain why it is exactly 1/K at initialisation (temp_k = 1, b = 0), and which
    parameters can move it. temp (K,) the temperatures,
    bias0 (K,) the position bias b_{k,0}, p the head dimension -> (K,).
    Check: equal to the memberships a CausalTSSA with random weights, temperatures and position bias computes
    at t = 0 on random tokens, to 1e-12, and 1/K at initialisation.
    """
    # Your answer.
    raise NotImplementedError


def tssa_forward(x, W, W_out, temp):
    """Exercise 5. TSSA from its formula, in about ten lines.

    Write the practical operator, tost.TSSA's forward without biases or dropout, from these formulas (the
    six changes derivation.py section 9's text lists, written out; its code and tost.TSSA are the answer:
    write yours before reading them):
        w   = U_k^T z_j for every head, from one linear map W (rows k p to (k+1) p - 1 of W are U_k^T)
        Pi  = softmax over the K heads of temp_k * sum_i w_ji^2 / sum_l w_li^2
        m_k = sum_j pi_jk w_j^2 / (n_k + 1e-8),   y_j = -pi_jk w_j / (1 + m_k),   output = W_out y
    x (B, n, d), W and W_out (d, d) (nn.Linear weights: a layer computes x W^T), temp (K,) -> (B, n, d).
    temp is tost.TSSA.temp[:, 0]: the layer keeps it as (K, 1), which broadcasts over the tokens of its
    (B, K, n) scores; your (K,) broadcasts as it is against scores laid out (B, n, K), and as temp[:, None]
    against (B, K, n). Write it with torch, without calling tost.TSSA.
    Check: equal to tost.TSSA with random weights and temperatures, to 1e-12: first with W_out = I, where
    the output is y itself (Pi and y alone), then with a random W_out (the map back).
    """
    # Your answer.
    raise NotImplementedError


def grad_compression(Z, Pi, alpha):
    """Exercise 6. The exact gradient step on R_c is linear in n.

    Derive grad_Z R_c through each group's d x d statistic M_k = Z^T diag(pi_k) Z:

        grad_{z_j} R_c = alpha/n sum_k pi_jk (I + alpha/n_k M_k)^{-1} z_j

    (ReduNet's compression operator C_k = alpha (I + alpha/n_k M_k)^{-1}), and compute it with torch, without
    autograd, in O(K (n d^2 + d^3)): never form an n x n matrix. Z (B, n, d), Pi (B, K, n) -> (B, n, d).
    Check: equal to autograd of R_c to 1e-10, and the elements your torch calls return grow
    less than 6x for 4x the tokens (an n x n matrix grows 16x).
    """
    # Your answer.
    raise NotImplementedError


def untied_prediction():
    """Exercise 7. Predict what untying c_proj does to the "gradient step" claim (before reading the end of
    derivation.py's section 9, "Untied, as trained", which measures it).

    Hold Pi fixed (set, not estimated) and nothing added to n_k, so TSSA(Z) = c_proj(y(Z)) is a vector field
    on the tokens. For three choices of c_proj (W = c_attn.weight, rows k p to (k+1) p - 1 are U_k^T):
        'tied':     c_proj = W^T, U_k maps head k back;
        'rescaled': c_proj = W^T with head k's block scaled by c_k > 0, c_k U_k maps head k back;
        'generic':  c_proj a random matrix, as training leaves it;
    predict which the layer is: 'exact' (it equals -n grad R^var_c), 'reweighted' (not that, but the gradient
    of another function of Z: its Jacobian is symmetric), or 'none' (the gradient of no function).
    Return a dict {'tied': ..., 'rescaled': ..., 'generic': ...}.
    Check: the layer and its Jacobian, computed for each choice.
    """
    # Your answer.
    raise NotImplementedError


def reweighted_objective(Z, Pi, U, c):
    """Exercise 8. The objective a per-head rescaling of the tie descends.

    With c_proj = W^T and head k's block scaled by c_k (exercise 7's 'rescaled'; here any real c_k, negative
    too), the practical layer (alpha = 1, Pi held, nothing added to n_k) is -n grad_Z of some function of Z.
    Write that function.
    Z (B, n, d), Pi (B, K, n), U (K, d, p), c (K,) -> (B,).
    Check: the layer equals -n times autograd of your function to 1e-10, and with every c_k = 1 your function
    is R^var_c (tost.variational_compression) to 1e-12.
    """
    # Your answer.
    raise NotImplementedError


def reorder_change(layer, content, position, perm):
    """Exercise 9. The past is nearly a bag.

    A causal layer reads x_t = content_t + position_t. Move the earlier contents to other positions: the
    content at position s goes to position perm^{-1}(s), that is x'_s = content_{perm[s]} + position_s for
    s < T-1, the last token and every position kept. Return how much the last output moves, relative to its
    size: |y'_{T-1} - y_{T-1}| / |y_{T-1}| (Euclidean norms), as a float. layer: a tost.CausalTSSA or a causal
    tost.SoftmaxAttention; content, position (1, T, d); perm a permutation of 0 .. T-2.
    Before running the check, predict: which layer moves less, and how its change depends on T?
    Check: equal to the check's own measurement to 1e-9, then both layers quantified at T = 16, 64, 256.
    """
    # Your answer.
    raise NotImplementedError


def delta_R_through_layers(Z, layer, layers, alpha):
    """Exercise 10. Unrolled compression lowers the rate reduction Delta R = R - R_c.

    Apply a white-box TSSA layer `layers` times, Z_{l+1} = Z_l + layer(Z_l), each time with the memberships
    the layer estimates from Z_l, Pi_l = layer.memberships(layer.split_heads(layer.c_attn(Z_l))). Return
    Delta R(Z_l, Pi_l) = R(Z_l) - R_c(Z_l, Pi_l) for l = 0 .. layers, a tensor (layers + 1,). Z (1, n, d).
    (derivation.py section 14 measures Delta R with the true groups instead, so its numbers differ.)
    Before running the check, predict: does Delta R, the objective the white-box story maximises, rise or
    fall?
    Check: equal to the check's own computation to 1e-9, on tokens from three planes; a difference names the
    first layer l where it appears (l = 0 is the input, before any layer).
    """
    # Your answer.
    raise NotImplementedError


if __name__ == '__main__':
    from lecture import checks
    sys.exit(checks.main())
