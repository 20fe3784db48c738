"""
The checks of lecture/exercises.py, and the command that runs them; students run them and need not read
them (they hold the answers). Run as the exercises' own command:

    python -m lecture.exercises               # checks the answers in lecture/exercises.py
    python -m lecture.exercises 3 5           # only exercises 3 and 5
    python -m lecture.exercises --solutions   # checks lecture/solutions.py instead

Each check runs the answer on random cases in float64, seeded by the exercise's number, and compares it with
the readable lines of tost.py; it raises Wrong, saying what differed, at the first difference.
"""

import os
import sys

# Also run by its path (python lecture/checks.py): the repository's modules come from its root.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import options  # first: a mistake, a closed pipe (`| head`) or Ctrl-C ends in one line
import contextlib
import functools
import importlib
import numbers
import traceback
import unittest.mock

import torch

import tost
from options import UsageError

# -----------------------------------------------------------------------------
# The checks. Each runs in float64 with torch's random state seeded, and restored afterwards.


class Wrong(AssertionError):
    """A check's verdict on a wrong answer; its message says what differed."""


EXERCISES = []   # (number, title, name of the answer, check)


def exercise(number, title, name, closed_form=False, not_calling=()):
    """Registers a check for the answer called `name`; runs it in float64, seeded by its number, and gives
    it the answer guarded (guarded below): closed_form, autograd refused; not_calling, (class, method) pairs
    the answer may not call."""
    def register(check):
        @functools.wraps(check)
        def run(answer):
            with torch.random.fork_rng(), float64():
                torch.manual_seed(number)
                return check(guarded(answer, closed_form, not_calling))
        EXERCISES.append((number, title, name, run))
        return run
    return register


# The answer running now, if any: the checks' helpers that compute answers refuse to run inside it.
ANSWERING = []


def guarded(answer, closed_form, not_calling):
    """The answer, run so that it cannot pass by calling what it is asked to compute."""
    def refuse(owner, method):
        def refused(*args, **kwargs):
            raise Wrong(f'your answer called {owner.__name__}.{method}: compute it from the formula')
        return refused

    @functools.wraps(answer)
    def run_answer(*args):
        # Copies: an answer that changes its arguments in place (Pi /= n_k) is judged on what it returns,
        # and the check's own later use of them stays right.
        args = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
        with contextlib.ExitStack() as stack:
            for owner, method in not_calling:
                stack.enter_context(unittest.mock.patch.object(owner, method, refuse(owner, method)))
            if closed_form:
                stack.enter_context(torch.no_grad())
                stack.enter_context(ClosedForm())
            ANSWERING.append(answer)
            stack.callback(ANSWERING.pop)
            return answer(*args)
    return run_answer


def checks_only(helper):
    """Marks a helper of the checks that computes (part of) an answer: an answer that calls it fails."""
    @functools.wraps(helper)
    def refusing(*args, **kwargs):
        if ANSWERING:
            raise Wrong(f'your answer called {helper.__name__}, the check\'s own helper: compute it yourself')
        return helper(*args, **kwargs)
    return refusing


class ClosedForm(torch.overrides.TorchFunctionMode):
    """Refuses autograd in an answer that runs under no_grad: any torch call with gradients turned back on
    (torch.enable_grad, torch.func), and the calls that ask for a gradient."""
    AUTOGRAD = {torch.Tensor.requires_grad_, torch.Tensor.requires_grad.__set__, torch.Tensor.backward,
                torch.autograd.grad, torch.autograd.backward}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if torch.is_grad_enabled() or func in self.AUTOGRAD:
            raise Wrong('your answer used autograd: compute it without autograd, from the formula')
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def float64():
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def expect_close(what, got, want, tol):
    """Raise Wrong unless the tensor `got` has want's shape and is within tol of it everywhere."""
    if not isinstance(got, torch.Tensor):
        raise Wrong(f'{what}: expected a tensor, got {type(got).__name__}')
    if got.shape != want.shape:
        raise Wrong(f'{what}: shape {tuple(got.shape)}, expected {tuple(want.shape)}')
    diff = (got.double() - want).abs().max().item()
    if not diff <= tol:
        # float32 rounds at about 1e-7 of the values: past the float64 tolerances of the algebra.
        rounding = 1e-5 * want.abs().max().item() if got.dtype != torch.float64 else 0.0
        # A sign flipped or a factor lost (1/n, 2) leaves the answer a multiple of the right one: say which.
        c = ((got.double() * want).sum() / want.square().sum()).item()
        multiple = (got.double() - c * want).abs().max() <= tol + rounding
        hint = f', and it is {c:.4g} times the expected' if multiple else ''
        if diff <= rounding:
            hint += f'; your answer is {got.dtype}, the check is in torch.float64'
        raise Wrong(f'{what}: max |difference| {diff:.2e}, more than {tol:.0e}{hint}')


def expect(condition, message):
    if not condition:
        raise Wrong(message)


def randomize(module):
    """Random parameters: matrices around 0, vectors (temperatures) around 1."""
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn_like(p) * 0.3 + (1.0 if p.dim() == 1 or p.shape[-1] == 1 else 0.0))
    return module


@checks_only
def compression(Z, Pi, alpha):
    """R_c(Z, Pi) = 1/2 sum_k (n_k/n) sum_i log(1 + alpha/n_k lambda_i(M_k)), M_k = Z^T diag(pi_k) Z: from the
    eigenvalues of M_k, not from log-determinants as derivation.py has it. (B,). One group holding every token
    (Pi all ones, (B, 1, n)) gives the coding rate R(Z) of all n tokens."""
    n = Z.shape[1]
    n_k = Pi.sum(-1)                                                       # (B, K)
    eigenvalues = torch.linalg.eigvalsh(torch.einsum('bnd,bkn,bne->bkde', Z, Pi, Z))     # (B, K, d)
    return 0.5 * (n_k / n * torch.log1p(alpha / n_k[..., None] * eigenvalues).sum(-1)).sum(-1)


@checks_only
def gradient(objective, Z):
    """Autograd of objective(Z).sum() with respect to Z."""
    Z = Z.detach().requires_grad_()
    (g,) = torch.autograd.grad(objective(Z).sum(), Z)
    return g


def random_memberships(B, K, n):
    return torch.softmax(2.0 * torch.randn(B, K, n), dim=1)


def orthonormal_heads(K, p, d):
    """K blocks U_k (d x p) of one random orthogonal d x d matrix, K p <= d: orthonormal, mutually
    orthogonal."""
    Q = torch.linalg.qr(torch.randn(d, d))[0]
    return Q[:, :K * p].reshape(d, K, p).permute(1, 0, 2)                  # (K, d, p)


class HeldMemberships(tost.TSSA):
    """The practical TSSA with Pi set from outside (self.held, (B, K, n)) instead of estimated from the
    tokens, and nothing added to n_k: a vector field on the tokens alone."""

    def __init__(self, n_embd, n_head, held):
        super().__init__(n_embd, n_head)
        self.held = held
        self.eps = 0.0

    def memberships(self, w):
        return self.held


def map_back(layer, kind, c=None):
    """Sets layer.c_proj for exercise 7's kinds: 'tied' W^T, 'rescaled' W^T with head k's block times c_k,
    'generic' random."""
    W = layer.c_attn.weight
    with torch.no_grad():
        if kind == 'generic':
            layer.c_proj.weight.copy_(torch.randn_like(W) * W.std())
        else:
            scale = torch.ones(layer.n_head) if kind == 'tied' else c
            layer.c_proj.weight.copy_(W.T * scale.repeat_interleave(layer.head_dim))
    return layer


class CountElements(torch.overrides.TorchFunctionMode):
    """Counts the elements every torch call returns: work counted, not timed, as derivation.py counts it.
    Work outside torch cannot be counted: a tensor leaving torch (to numpy, to a list) fails the check."""
    total = 0
    LEAVING = {torch.Tensor.numpy, torch.Tensor.__array__, torch.Tensor.tolist}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in self.LEAVING:
            raise Wrong('the cost check counts the work of torch calls, and your answer left torch: compute '
                        'with torch')
        out = func(*args, **(kwargs or {}))
        returned = out if isinstance(out, (tuple, list)) else [out]
        # The answer's work, not the copies of its arguments made before it runs.
        if ANSWERING:
            self.total += sum(t.numel() for t in returned if isinstance(t, torch.Tensor))
        return out


@exercise(1, 'grad R^var_c in closed form', 'grad_variational', closed_form=True)
def check_grad_variational(answer):
    # Several n, d, K, p and alpha, and U_k of any shape: a 1/n_k for 1/n, or a lost alpha, cannot pass by
    # luck.
    for n, d, K, p, alpha in ((7, 6, 3, 2, 1.0), (12, 6, 2, 3, 3.5), (5, 8, 4, 3, 0.5)):
        Z = torch.randn(2, n, d)
        Pi = random_memberships(2, K, n)
        U = torch.randn(K, d, p)
        want = gradient(lambda Z: tost.variational_compression(Z, Pi, U, alpha), Z)
        # 1e-12: a closed form is good to 1e-15 here; differences of the objective, to 1e-10 at best.
        expect_close(f'grad at n = {n}, K = {K}, alpha = {alpha}', answer(Z, Pi, U, alpha), want, 1e-12)
    return 'equal to autograd of tost.variational_compression'


@exercise(2, 'what the 1/n means', 'duplication_factor')
def check_duplication_factor(answer):
    Z = torch.randn(1, 9, 6)
    Pi = random_memberships(1, 3, 9)
    U = torch.randn(3, 6, 2)
    once = gradient(lambda Z: tost.variational_compression(Z, Pi, U), Z)
    Pi_twice = torch.cat([Pi, Pi], -1)
    twice = gradient(lambda Z: tost.variational_compression(Z, Pi_twice, U), torch.cat([Z, Z], 1))
    ratio = (twice[:, :9] / once).mean().item()
    expect(torch.allclose(twice[:, :9], ratio * once, atol=1e-12), 'the check: the ratio is not one number')
    got = answer()
    # A number of any kind (a Fraction, numpy's), or a tensor holding one.
    if isinstance(got, torch.Tensor) and got.numel() == 1:
        got = got.item()
    expect(isinstance(got, numbers.Real), f'expected a number, got {type(got).__name__}')
    expect(abs(got - ratio) <= 1e-9, f'the factor is not {got!r}')
    return f'measured {ratio:.6f}'


@exercise(3, 'the corollary: R^var_c >= R_c in span(U_k)', 'projected_compression')
def check_projected_compression(answer):
    above = 0
    for case in range(40):
        K, p = (2, 2) if case % 2 else (3, 2)
        d = K * p + case % 3                                               # K p = d, and K p < d
        n, alpha = 12, 0.5 + case / 10
        U = orthonormal_heads(K, p, d)
        # Any orthonormal U_k, any tokens and memberships: the formula, and never above R^var_c.
        Z = torch.randn(2, n, d)
        Pi = random_memberships(2, K, n)
        W = torch.einsum('bnd,kdp->bknp', Z, U)                            # (B, K, n, p)  U_k^T z_j
        M = torch.einsum('bknp,bkn,bknq->bkpq', W, Pi, W)                  # (B, K, p, p)  U_k^T M_k U_k
        n_k = Pi.sum(-1)
        want = 0.5 * (n_k / n * torch.logdet(torch.eye(p) + alpha / n_k[..., None, None] * M)).sum(-1)
        bound = tost.variational_compression(Z, Pi, U, alpha)
        expect((want <= bound + 1e-12).all(), 'the check: R^proj_c above R^var_c')
        # The hypothesis: hard groups, each token in its group's subspace, with a random covariance there.
        group = torch.randint(0, K, (n,))
        coefficients = torch.randn(1, n, p) @ torch.randn(p, p)
        Z_in = torch.einsum('ndp,bnp->bnd', U[group], coefficients)
        Pi_in = torch.nn.functional.one_hot(group, K).T[None].double()
        exact = compression(Z_in, Pi_in, alpha)
        # Under the hypothesis first: an answer right there and wrong only on the random tokens is told that
        # these lie outside it. R_c itself is the likeliest such answer, as the statement says they are equal.
        inside = answer(Z_in, Pi_in, U, alpha)
        expect_close('R^proj_c under the hypothesis, against R_c', inside, exact, 1e-10)
        got = answer(Z, Pi, U, alpha)
        what = 'R^proj_c on random tokens, not in span(U_k): outside the hypothesis, where it is not R_c'
        if isinstance(got, torch.Tensor) and got.shape == want.shape:
            if ((got.double() - compression(Z, Pi, alpha)).abs() <= 1e-10).all():
                what += '; your answer is R_c, equal to it only under the hypothesis'
        expect_close(what, got, want, 1e-10)
        above += int((tost.variational_compression(Z_in, Pi_in, U, alpha) >= exact - 1e-12).all())
    expect(above == 40, f'the check: the corollary held in only {above} of 40 cases')
    return 'R^var_c >= R^proj_c = R_c in 40 of 40 random cases'


@exercise(4, 'the causal pi_0', 'causal_first_membership',
          not_calling=((tost.CausalTSSA, 'forward'), (tost.CausalTSSA, 'step'),
                       (tost.CausalTSSA, 'prefix_memberships')))
def check_causal_first_membership(answer):
    K, p = 4, 3
    cases = (('initialisation', torch.ones(K), torch.zeros(K)),
             ('equal temperatures', torch.full((K,), 2.5), torch.zeros(K)),
             ('unequal temperatures', 0.5 + torch.rand(K), torch.zeros(K)),
             ('a position bias', 0.5 + torch.rand(K), torch.randn(K)))
    for name, temp, bias0 in cases:
        layer = randomize(tost.CausalTSSA(K * p, K, block_size=5))
        with torch.no_grad():
            layer.temp.copy_(temp[:, None])
            layer.pos_bias[:, 0] = bias0
        x = torch.randn(3, 1, K * p)
        # After one token the state's P, the prefix sum of the memberships, is pi_0 itself.
        _, state = layer(x, layer.empty_state(3, dtype=x.dtype))
        pi0 = state.P.detach()                                             # (B, K)
        got = answer(layer.temp.detach()[:, 0], layer.pos_bias.detach()[:, 0], p)
        for b in range(3):
            expect_close(f'pi_0 ({name}), sequence {b}', got, pi0[b], 1e-12)
        if name in ('initialisation', 'equal temperatures'):
            expect_close(f'pi_0 ({name}), against 1/K', got, torch.full((K,), 1 / K), 1e-15)
    return 'pi_0 equals the layer\'s for any weights and tokens'


@exercise(5, 'TSSA from its formula', 'tssa_forward',
          not_calling=((tost.TSSA, 'forward'), (tost.TSSA, 'memberships')))
def check_tssa_forward(answer):
    for B, n, d, K in ((2, 9, 12, 3), (1, 20, 8, 4)):
        layer = randomize(tost.TSSA(d, K))
        x = torch.randn(B, n, d)
        W = layer.c_attn.weight.detach()
        W_out = layer.c_proj.weight.detach().clone()
        temp = layer.temp.detach()[:, 0]
        want = layer(x).detach()
        # The map back as the identity first: the output is then y itself, so a difference there is in Pi or
        # y, and one that appears only with a random W_out is in the map back.
        with torch.no_grad():
            layer.c_proj.weight.copy_(torch.eye(d))
        y = layer(x).detach()
        where = f'n = {n}, K = {K}'
        expect_close(f'Pi and y, {where}, with W_out = I (the output is y itself)',
                     answer(x, W, torch.eye(d), temp), y, 1e-12)
        expect_close(f'the map back W_out y, {where}, with a random W_out (right with W_out = I)',
                     answer(x, W, W_out, temp), want, 1e-12)
    return 'equal to tost.TSSA'


@exercise(6, 'the exact grad R_c in O(n d^2)', 'grad_compression', closed_form=True)
def check_grad_compression(answer):
    for n, d, K, alpha in ((9, 4, 2, 2.0), (16, 6, 3, 0.7)):
        Z = torch.randn(2, n, d)
        Pi = random_memberships(2, K, n)
        want = gradient(lambda Z: compression(Z, Pi, alpha), Z)
        expect_close(f'grad R_c at n = {n}, K = {K}', answer(Z, Pi, alpha), want, 1e-10)
    counts = []
    for n in (64, 256):
        Z = torch.randn(1, n, 4)
        Pi = random_memberships(1, 2, n)
        with torch.no_grad(), CountElements() as counter:
            answer(Z, Pi, 1.0)
        counts.append(counter.total)
    expect(counts[0] > 0, 'the cost check counts the work of torch calls, and your answer made none: compute '
           'with torch')
    growth = counts[1] / counts[0]
    expect(growth < 6, f'4x the tokens, {growth:.1f}x the elements: not linear in n')
    return f'equal to autograd; 4x the tokens, {growth:.2f}x the elements'


@exercise(7, 'untying c_proj: predict', 'untied_prediction')
def check_untied_prediction(answer):
    n, d, K = 4, 6, 3
    Pi = random_memberships(1, K, n)
    Z = torch.randn(1, n, d)
    truth = {}
    asymmetry = {}
    for kind in ('tied', 'rescaled', 'generic'):
        layer = map_back(randomize(HeldMemberships(d, K, Pi)), kind, 0.5 + 1.5 * torch.rand(K))
        step = layer(Z).detach()
        grad = gradient(lambda Z: tost.variational_compression(Z, Pi, layer.U()), Z)
        J = torch.autograd.functional.jacobian(lambda z: layer(z.view(1, n, d)).flatten(), Z.flatten())
        asymmetry[kind] = ((J - J.T).abs().max() / J.abs().max()).item()
        if (step + n * grad).abs().max() < 1e-10:
            truth[kind] = 'exact'
        else:
            truth[kind] = 'reweighted' if asymmetry[kind] < 1e-10 else 'none'
    # The tied layer must come out exact, or the check itself no longer holds Pi as it means to.
    expect(truth['tied'] == 'exact', 'the check: the tied layer is not -n grad R^var_c (tost.TSSA changed?)')
    got = answer()
    expect(isinstance(got, dict) and set(got) == set(truth), f'expected a dict with the keys {sorted(truth)}')
    labels = ('exact', 'reweighted', 'none')
    expect(all(got[kind] in labels for kind in truth), f'each prediction is one of {", ".join(labels)}')
    # Which predictions are wrong, not what they should be.
    wrong = [kind for kind in truth if got[kind] != truth[kind]]
    expect(not wrong, 'wrong: ' + ', '.join(wrong))
    return 'Jacobian asymmetry ' + ', '.join(f'{kind} {a:.0e}' for kind, a in asymmetry.items())


@exercise(8, 'the reweighted objective', 'reweighted_objective')
def check_reweighted_objective(answer):
    n, d, K = 10, 12, 4
    for c in (0.5 + 1.5 * torch.rand(K), torch.tensor([2.0, -0.5, 1.0, 0.25])):
        Pi = random_memberships(2, K, n)
        layer = map_back(randomize(HeldMemberships(d, K, Pi)), 'rescaled', c)
        Z = torch.randn(2, n, d)
        U = layer.U().detach()
        grad = gradient(lambda Z: answer(Z, Pi, U, c), Z)
        what = 'the layer against -n grad of your objective, c = ' + ', '.join(f'{v:.2f}' for v in c.tolist())
        expect_close(what, -n * grad, layer(Z).detach(), 1e-10)
    expect_close('your objective with every c_k = 1, against R^var_c', answer(Z, Pi, U, torch.ones(K)),
                 tost.variational_compression(Z, Pi, U), 1e-12)
    return 'the layer is -n grad of it, and it is R^var_c at c = 1'


@checks_only
def measure_reorder(layer, content, position, perm):
    """The check's own measurement for exercise 9."""
    moved = torch.cat([content[:, perm], content[:, -1:]], 1)
    with torch.no_grad():
        y = layer(content + position)[0, -1]
        y_moved = layer(moved + position)[0, -1]
    return ((y_moved - y).norm() / y.norm()).item()


@exercise(9, 'the past is nearly a bag', 'reorder_change')
def check_reorder_change(answer):
    d, K, draws = 16, 4, 7
    medians = {}
    for kind in ('TSSA', 'softmax'):
        for T in (16, 64, 256):
            changes = []
            for _ in range(draws):
                if kind == 'TSSA':
                    layer = randomize(tost.CausalTSSA(d, K, block_size=T))
                else:
                    layer = randomize(tost.SoftmaxAttention(d, K, causal=True))
                content = torch.randn(1, T, d)
                position = torch.randn(1, T, d)
                perm = torch.randperm(T - 1)
                want = measure_reorder(layer, content, position, perm)
                got = answer(layer, content, position, perm)
                # A tensor that keeps its graph is a number too (float() of it would warn).
                got = float(got.detach() if isinstance(got, torch.Tensor) else got)
                expect(abs(got - want) <= 1e-9,
                       f'{kind}, T = {T}: your change {got:.6f}, measured {want:.6f}')
                changes.append(want)
            medians[kind, T] = torch.tensor(changes).median().item()
    expect(medians['TSSA', 256] < medians['softmax', 256] / 4, 'the check: TSSA is not nearly a bag here')
    rows = []
    for kind in ('TSSA', 'softmax'):
        rows.append(kind + ' ' + ', '.join(f'{medians[kind, T]:.3f}' for T in (16, 64, 256)))
    return 'median relative change at T = 16, 64, 256: ' + '; '.join(rows)


@exercise(10, 'Delta R through unrolled layers', 'delta_R_through_layers')
def check_delta_R_through_layers(answer):
    n, alpha, layers = 150, 10.0, 12
    # n tokens in R^6, token j in plane j mod 3 (U_k: orthonormal, mutually orthogonal), with a little noise.
    U = orthonormal_heads(3, 2, 6)                                         # (K, d, p)
    coefficients = torch.randn(n, 2) * torch.tensor([1.0, 0.5])
    Z = torch.einsum('ndp,np->nd', U[torch.arange(n) % 3], coefficients)[None] + 0.1 * torch.randn(1, n, 6)
    layer = tost.TSSA(6, 3, whitebox=True, alpha=alpha, tau=0.05 * n)
    with torch.no_grad():
        layer.c_attn.weight.copy_(U.permute(0, 2, 1).reshape(6, 6))        # rows k p to (k+1) p - 1: U_k^T
        # Sharp memberships, as derivation.py's section 14 has them (at temp 1 they would be nearly uniform).
        layer.temp.fill_(100.0)
        want = []
        Zl = Z
        for _ in range(layers + 1):
            Pi = layer.memberships(layer.split_heads(layer.c_attn(Zl)))
            want.append(compression(Zl, torch.ones(1, 1, n), alpha) - compression(Zl, Pi, alpha))
            Zl = Zl + layer(Zl)
        want = torch.cat(want)
        got = answer(Z, layer, layers, alpha)
    # Name the first layer that differs: at l = 0 no layer has run yet, so R or R_c itself is wrong; past it,
    # the loop (the step, or the memberships each layer estimates).
    what = 'Delta R by layer'
    if isinstance(got, torch.Tensor) and got.shape == want.shape:
        # (a NaN differs too: compared as not within the tolerance)
        differs = (~((got.double() - want).abs() <= 1e-9)).nonzero()
        first = differs[0, 0].item() if len(differs) else None
        if first == 0:
            what += ', first at layer 0, the input before any layer: R or R_c itself is wrong, not the loop'
        elif first is not None:
            what += f', first at layer {first} (layer 0 is right, so R and R_c are: the loop is wrong)'
    expect_close(what, got, want, 1e-9)
    expect(want[-1] < want[0], 'the check: Delta R did not fall')
    return f'Delta R {want[0]:.3f} before the layers, {want[-1]:.3f} after {layers}'


# -----------------------------------------------------------------------------
# The runner.


def the_book_holds():
    """Whether tost.TSSA is still the step the lecture derives (tied, Pi held: -n grad R^var_c): exercises 5,
    7, 8 and 10 compare answers with it, so a tost.py edited since fails right answers."""
    n, d, K = 4, 6, 3
    # (a TSSA that no longer runs at all is no longer it either)
    with torch.random.fork_rng(), float64(), contextlib.suppress(Exception):
        torch.manual_seed(0)
        Pi = random_memberships(1, K, n)
        Z = torch.randn(1, n, d)
        layer = map_back(randomize(HeldMemberships(d, K, Pi)), 'tied')
        grad = gradient(lambda Z: tost.variational_compression(Z, Pi, layer.U()), Z)
        return bool((layer(Z).detach() + n * grad).abs().max() < 1e-10)
    return False


def run(check, answer):
    """One line's verdict: ('pass', note), ('not attempted', ''), or ('fail', what differed)."""
    code = getattr(answer, '__code__', None)
    try:
        note = check(answer)
    except Wrong as e:
        return 'fail', str(e)
    # An answer that crashes is wrong too: its error in one line, and the line of the answer it came from.
    except Exception as e:
        frames = traceback.extract_tb(e.__traceback__)
        mine = [f for f in frames if code and f.filename == code.co_filename]
        # Not attempted only at the answer's own `raise NotImplementedError`, the stub's: torch's ("not
        # implemented for 'Long'"), or another exercise's stub that a written answer calls, is a crash.
        last = frames[-1]
        stub = code and (last.filename, last.name) == (code.co_filename, code.co_name)
        stub = stub and (last.line or '').startswith('raise NotImplementedError')
        if isinstance(e, NotImplementedError) and stub:
            return 'not attempted', ''
        error = f'{type(e).__name__}: {e}'.splitlines()[0]
        if mine:
            error += f' (at {os.path.relpath(mine[-1].filename)}:{mine[-1].lineno}, in {mine[-1].name})'
        return 'fail', error
    return 'pass', note


DEFAULTS = dict(
    numbers=[],         # the exercises to check, as bare words (3 5); none: all of them
    solutions=False,    # check lecture/solutions.py instead of the answers in lecture/exercises.py
)


def main(argv=None):
    cfg, _ = options.parse(argv, DEFAULTS, __doc__, __file__, positional='numbers')
    known = [number for number, *_ in EXERCISES]
    numbers = [int(n) if n.isdigit() else n for n in cfg['numbers']]
    unknown = [n for n in numbers if n not in known]
    if unknown:
        raise UsageError(f'no exercise {unknown[0]}; they are numbered {known[0]} to {known[-1]}')
    name = 'lecture.solutions' if cfg['solutions'] else 'lecture.exercises'
    try:
        answers = importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name != 'lecture.solutions':
            raise
        missing = 'lecture/solutions.py is not here: try the exercises first, or ask your teacher'
        raise UsageError(missing) from None
    if not the_book_holds():
        print("note: tost.py's TSSA is no longer the step the lecture derives (python derivation.py says "
              "where): the checks that compare with it (5, 7, 8, 10) fail right answers", file=sys.stderr)
    verdicts = []
    for number, title, name, check in EXERCISES:
        if numbers and number not in numbers:
            continue
        answer = getattr(answers, name, None)
        # (an answer renamed or deleted: the other exercises are still checked)
        missing = ('fail', f'no function {name} in {answers.__name__}')
        verdict, note = run(check, answer) if answer else missing
        verdicts.append(verdict)
        print(f'{number:2d}. {title:45s} {verdict}{": " + note if note else ""}', flush=True)
    counts = {v: verdicts.count(v) for v in ('pass', 'not attempted', 'fail')}
    print(', '.join(f'{count} {v}' for v, count in counts.items()))
    # A student's unwritten answers are not failures; the solutions must all be written.
    failed = counts['fail'] or (cfg['solutions'] and counts['not attempted'])
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
