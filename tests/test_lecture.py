"""The lecture's exercises and its recall experiment (lecture/): every check passes the solutions and fails a
wrong answer of the kinds a student writes (a sign flipped, a 1/n lost, a matrix transposed, an n x n
shortcut), the runner reports each exercise in one line, and the recall experiment runs and prints its
table."""

import errno
import fractions
import os
import re
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch

import options
import tost
from lecture import checks
from lecture import exercises
from lecture import handout
from lecture import recall
from lecture import solutions as sol
from conftest import REPO, ended, one_line, python

CHECKS = {number: check for number, _, _, check in checks.EXERCISES}
NAMES = {number: name for number, _, name, _ in checks.EXERCISES}


def test_the_students_file_holds_the_exercises_and_nothing_else():
    """No check and no helper in the file a student edits: they would show the answers."""
    defined = [name for name, value in vars(exercises).items()
               if callable(value) and getattr(value, '__module__', None) == exercises.__name__]
    assert sorted(defined) == sorted(NAMES.values())


@pytest.mark.parametrize('number', list(CHECKS))
def test_the_solution_passes(number):
    verdict, note = checks.run(CHECKS[number], getattr(sol, NAMES[number]))
    assert verdict == 'pass', note


# Wrong answers, each close to the solution: what a student plausibly writes.

def grad_1_over_n_k(Z, Pi, U, alpha):
    # 1/n_k in place of 1/n, group by group: the weight n_k/n forgotten.
    n = Z.shape[1]
    parts = [n / Pi[:, k].sum(-1)[:, None, None] * sol.grad_variational(Z, Pi[:, k:k + 1], U[k:k + 1], alpha)
             for k in range(U.shape[0])]
    return sum(parts)


def projected_without_group_weights(Z, Pi, U, alpha):
    n_k = Pi.sum(-1)
    w = torch.einsum('bnd,kdp->bknp', Z, U)
    M = torch.einsum('bknp,bkn,bknq->bkpq', w, Pi, w)
    return 0.5 * torch.logdet(torch.eye(U.shape[-1]) + alpha / n_k[..., None, None] * M).sum(-1)


def grad_with_eps(Z, Pi, U, alpha):
    # the layer's + 1e-8 on n_k, which the objective does not have: 5e-10 off, just past the tolerance
    w = torch.einsum('bnd,kdp->bknp', Z, U)
    n_k = Pi.sum(-1)[..., None] + 1e-8
    D = alpha / (1 + alpha * torch.einsum('bkn,bknp->bkp', Pi, w * w) / n_k)
    return torch.einsum('bknp,kdp->bnd', Pi[..., None] * D[:, :, None] * w, U) / Z.shape[1]


def tssa_without_eps(x, W, W_out, temp):
    # the layer's + 1e-8 on n_k left out
    B, n, d = x.shape
    w = (x @ W.T).view(B, n, temp.shape[0], -1)
    Pi = torch.softmax(temp * (w * w / (w * w).sum(1, keepdim=True)).sum(-1), dim=-1)[..., None]
    m = (Pi * w * w).sum(1, keepdim=True) / Pi.sum(1, keepdim=True)
    return (-Pi * w / (1 + m)).reshape(B, n, d) @ W_out.T


def tssa_softmax_over_tokens(x, W, W_out, temp):
    B, n, d = x.shape
    K = temp.shape[0]
    w = (x @ W.T).view(B, n, K, d // K)
    energy = (w * w / (w * w).sum(1, keepdim=True)).sum(-1)
    Pi = torch.softmax(temp * energy, dim=1)[..., None]                    # over the tokens: wrong
    s = (Pi * w * w).sum(1, keepdim=True) / (Pi.sum(1, keepdim=True) + 1e-8)
    return (-Pi * w / (1 + s)).reshape(B, n, d) @ W_out.T


def grad_rc_through_n_by_n(Z, Pi, alpha):
    # The right numbers by the push-through identity, through an n x n matrix per group: quadratic in n.
    n = Z.shape[1]
    G = Z @ Z.transpose(1, 2)                                              # (B, n, n)
    out = torch.zeros_like(Z)
    for k in range(Pi.shape[1]):
        pi = Pi[:, k]                                                      # (B, n)
        c = alpha / pi.sum(-1)[:, None, None]
        A = torch.linalg.inv(torch.eye(n) + c * G * pi[:, None, :])
        out = out + alpha / n * pi[..., None] * (A @ Z)
    return out


def grad_rc_in_numpy(Z, Pi, alpha):
    # The right values, computed in numpy: work the cost check cannot count.
    Z = Z.numpy()
    Pi = Pi.numpy()
    n, d = Z.shape[1:]
    n_k = Pi.sum(-1)
    M = np.einsum('bnd,bkn,bne->bkde', Z, Pi, Z)
    C = np.linalg.inv(np.eye(d) + alpha / n_k[..., None, None] * M)
    return torch.from_numpy(alpha / n * np.einsum('bkn,bnd,bkde->bne', Pi, Z, C))


def grad_rc_without_memberships(Z, Pi, alpha):
    # every token stepped by every group's operator, the weight pi_jk forgotten
    n, d = Z.shape[1:]
    n_k = Pi.sum(-1)
    M = torch.einsum('bnd,bkn,bne->bkde', Z, Pi, Z)
    C = torch.linalg.inv(torch.eye(d) + alpha / n_k[..., None, None] * M)
    return alpha / n * torch.einsum('bnd,bkde->bne', Z, C)


# Answers that pass by calling what they are asked to compute.

def grad_by_autograd(Z, Pi, U, alpha):
    Z = Z.detach().requires_grad_()
    with torch.enable_grad():
        (g,) = torch.autograd.grad(tost.variational_compression(Z, Pi, U, alpha).sum(), Z)
    return g


def grad_by_finite_differences(Z, Pi, U, alpha, h=1e-5):
    grad = torch.zeros_like(Z)
    for i in range(Z.numel()):
        step = torch.zeros_like(Z).view(-1)
        step[i] = h
        step = step.view_as(Z)
        up = tost.variational_compression(Z + step, Pi, U, alpha)
        down = tost.variational_compression(Z - step, Pi, U, alpha)
        grad.view(-1)[i] = (up - down).sum() / (2 * h)
    return grad


def pi0_from_the_layer(temp, bias0, p):
    K = temp.shape[0]
    layer = tost.CausalTSSA(K * p, K, block_size=1)
    with torch.no_grad():
        layer.temp.copy_(temp[:, None])
        layer.pos_bias[:, 0] = bias0
        _, state = layer(torch.randn(1, 1, K * p), layer.empty_state(1, dtype=temp.dtype))
    return state.P[0]


def grad_by_the_checks_helper(Z, Pi, U, alpha):
    return checks.gradient(lambda Z: tost.variational_compression(Z, Pi, U, alpha), Z)


def tssa_by_calling_the_layer(x, W, W_out, temp):
    layer = tost.TSSA(x.shape[-1], temp.shape[0])
    with torch.no_grad():
        layer.c_attn.weight.copy_(W)
        layer.c_proj.weight.copy_(W_out)
        layer.temp.copy_(temp[:, None])
    return layer(x).detach()


def grad_rc_by_backward(Z, Pi, alpha):
    # Told it used autograd: it failed in the cost check, under no_grad, with torch's own error.
    Z = Z.detach().requires_grad_()
    sol.compression(Z, Pi, alpha).sum().backward()
    return Z.grad


def grad_rc_by_torch_func(Z, Pi, alpha):
    return torch.func.grad(lambda Z: sol.compression(Z, Pi, alpha).sum())(Z)


def reorder_absolute(layer, content, position, perm):
    moved = torch.cat([content[:, perm], content[:, -1:]], 1)
    with torch.no_grad():
        return (layer(moved + position)[0, -1] - layer(content + position)[0, -1]).norm().item()


def delta_R_with_the_first_memberships(Z, layer, layers, alpha):
    # Pi estimated once, from the input, and held through every layer
    with torch.no_grad():
        Pi = layer.memberships(layer.split_heads(layer.c_attn(Z)))
        values = []
        for _ in range(layers + 1):
            values.append(sol.coding_rate(Z, alpha) - sol.compression(Z, Pi, alpha))
            Z = Z + layer(Z)
    return torch.cat(values)


def delta_R_with_R_over_alpha(Z, layer, layers, alpha):
    # R with alpha in place of alpha/n: wrong already at the input
    n = Z.shape[1]
    values = []
    with torch.no_grad():
        for _ in range(layers + 1):
            Pi = layer.memberships(layer.split_heads(layer.c_attn(Z)))
            values.append(sol.coding_rate(Z, alpha * n) - sol.compression(Z, Pi, alpha))
            Z = Z + layer(Z)
    return torch.cat(values)


# (exercise, name, answer): a short wrong answer written in place.
WRONG = [
    (1, 'grad_sign_flipped', lambda *a: -sol.grad_variational(*a)),
    (1, 'grad_without_1_over_n', lambda Z, *a: Z.shape[1] * sol.grad_variational(Z, *a)),
    (1, 'grad_1_over_n_k', grad_1_over_n_k),
    (1, 'grad_alpha_forgotten', lambda Z, Pi, U, alpha: sol.grad_variational(Z, Pi, U, 1.0)),
    (1, 'grad_by_autograd', grad_by_autograd),
    (1, 'grad_by_the_checks_helper', grad_by_the_checks_helper),
    (1, 'grad_by_finite_differences', grad_by_finite_differences),
    (1, 'grad_as_a_list', lambda *a: sol.grad_variational(*a).tolist()),
    (1, 'grad_with_eps', grad_with_eps),
    # each U_k cut to d // K columns, as in a TSSA layer: right only where K p = d
    (1, 'grad_with_p_as_d_over_K',
     lambda Z, Pi, U, alpha: sol.grad_variational(Z, Pi, U[..., :U.shape[1] // len(U)], alpha)),
    (1, 'grad_flattened', lambda *a: sol.grad_variational(*a).flatten()),
    (1, 'grad_nan', lambda Z, *a: torch.full_like(Z, float('nan'))),
    (2, 'factor_one', lambda: 1.0),
    (2, 'factor_two', lambda: 2.0),
    (2, 'factor_a_quarter', lambda: 0.25),
    (3, 'projected_in_all_of_R_d', lambda Z, Pi, U, alpha: sol.compression(Z, Pi, alpha)),
    (3, 'projected_without_group_weights', projected_without_group_weights),
    (4, 'pi0_always_uniform', lambda temp, bias0, p: torch.full_like(temp, 1 / temp.shape[0])),
    (4, 'pi0_without_p', lambda temp, bias0, p: torch.softmax(temp * (1 + bias0), dim=0)),
    (4, 'pi0_by_running_the_layer', pi0_from_the_layer),
    (4, 'pi0_bias_outside_temperature', lambda temp, bias0, p: torch.softmax(p * temp + p * bias0, dim=0)),
    (5, 'tssa_W_transposed', lambda x, W, W_out, temp: sol.tssa_forward(x, W.T, W_out, temp)),
    (5, 'tssa_W_out_transposed', lambda x, W, W_out, temp: sol.tssa_forward(x, W, W_out.T, temp)),
    (5, 'tssa_softmax_over_tokens', tssa_softmax_over_tokens),
    (5, 'tssa_without_eps', tssa_without_eps),
    (5, 'tssa_by_calling_the_layer', tssa_by_calling_the_layer),
    (6, 'grad_rc_through_n_by_n', grad_rc_through_n_by_n),
    (6, 'grad_rc_sign_flipped', lambda *a: -sol.grad_compression(*a)),
    (6, 'grad_rc_without_memberships', grad_rc_without_memberships),
    (6, 'grad_rc_by_torch_func', grad_rc_by_torch_func),
    (6, 'grad_rc_by_backward', grad_rc_by_backward),
    (6, 'grad_rc_in_numpy', grad_rc_in_numpy),
    (7, 'predict_generic_reweights', lambda: dict(tied='exact', rescaled='reweighted', generic='reweighted')),
    (7, 'predict_rescaled_exact', lambda: dict(tied='exact', rescaled='exact', generic='none')),
    (8, 'objective_ignoring_c', lambda Z, Pi, U, c: sol.reweighted_objective(Z, Pi, U, torch.ones_like(c))),
    (8, 'objective_dividing_by_c', lambda Z, Pi, U, c: sol.reweighted_objective(Z, Pi, U, 1 / c)),
    (8, 'objective_of_c_s_size', lambda Z, Pi, U, c: sol.reweighted_objective(Z, Pi, U, c.abs())),
    # The right gradient everywhere; the function is pinned down only by its value at c = 1.
    (8, 'objective_plus_a_constant', lambda *a: sol.reweighted_objective(*a) + 1.0),
    # whole tokens moved, their positions with them
    (9, 'reorder_with_positions', lambda layer, x, p, perm: sol.reorder_change(layer, x + p, 0 * p, perm)),
    (9, 'reorder_absolute', reorder_absolute),
    (9, 'reorder_by_the_checks_helper', lambda *a: checks.measure_reorder(*a)),
    (10, 'delta_R_sign_flipped', lambda *a: -sol.delta_R_through_layers(*a)),
    (10, 'delta_R_with_the_first_memberships', delta_R_with_the_first_memberships),
    (10, 'delta_R_with_R_over_alpha', delta_R_with_R_over_alpha),
]


@pytest.mark.parametrize('number, name, wrong', WRONG, ids=[name for _, name, _ in WRONG])
def test_a_wrong_answer_fails_its_check(number, name, wrong):
    with pytest.raises(checks.Wrong):
        CHECKS[number](wrong)


def test_there_are_at_least_eight_exercises_numbered_in_order_each_with_a_wrong_answer_that_fails():
    assert list(CHECKS) == list(range(1, len(CHECKS) + 1)) and len(CHECKS) >= 8
    assert {number for number, _, _ in WRONG} == set(CHECKS)


def test_the_predictions_are_measured_in_the_teachers_note_and_not_given_to_students():
    """Exercises 9 and 10 ask for a prediction before the check runs: the numbers their checks print are in
    solutions.py's docstring, and not in what a student reads first."""
    printed = CHECKS[9](sol.reorder_change) + ' ' + CHECKS[10](sol.delta_R_through_layers)
    numbers = [f'{float(v):.2f}' for v in re.findall(r'\d+\.\d+', printed)]
    assert len(numbers) == 8
    student = ''.join(open(os.path.join(REPO, 'lecture', f)).read() for f in ('README.md', 'exercises.py'))
    for v in numbers:
        assert not re.search(rf'(?<![\d.]){re.escape(v)}(?!\d)', student), v
        assert re.search(rf'(?<![\d.]){re.escape(v)}(?!\d)', sol.__doc__), v


def test_the_class_plan_follows_the_lectures_order_and_the_quick_run_is_one_command():
    readme = open(os.path.join(REPO, 'lecture', 'README.md')).read()
    plan = readme[readme.index('### In class'):readme.index("### The recall experiment's result")]
    sections = [int(n) for n in re.findall(r'^\d\. .*?\(section (\d+)', plan, re.M)]
    assert len(sections) == 4 and sections == sorted(sections)
    command = r'python -m lecture\.recall --steps=\d+'
    quick = {re.findall(command, text)[0] for text in (readme, recall.__doc__)}
    assert len(quick) == 1


def test_a_wrong_prediction_is_not_told_the_right_one():
    with pytest.raises(checks.Wrong) as e:
        CHECKS[7](lambda: dict(tied='exact', rescaled='exact', generic='exact'))
    assert 'rescaled' in str(e.value) and 'generic' in str(e.value) and 'tied' not in str(e.value)
    assert 'reweighted' not in str(e.value) and 'none' not in str(e.value)


def test_the_n_by_n_gradient_has_the_right_values():
    # So exercise 6's check rejects it for its cost alone.
    with checks.float64():
        Z = torch.randn(2, 11, 4)
        Pi = checks.random_memberships(2, 3, 11)
        torch.testing.assert_close(grad_rc_through_n_by_n(Z, Pi, 1.5), sol.grad_compression(Z, Pi, 1.5))


def test_the_runner_reports_each_exercise_in_one_line_and_exits_1_on_a_wrong_answer(monkeypatch, capsys):
    # Unwritten answers are not failures: a student runs this before writing any.
    assert checks.main([]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(CHECKS) + 1 and all('not attempted' in line for line in lines[:-1])
    assert checks.main(['--solutions', '2', '4']) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split('.')[0].strip() for line in lines[:-1]] == ['2', '4']
    assert all(' pass' in line for line in lines[:-1])
    monkeypatch.setattr(sol, 'duplication_factor', lambda: 1.0)
    assert checks.main(['--solutions', '2']) == 1
    assert ' fail: ' in capsys.readouterr().out
    # an answer renamed or deleted fails in its line, and the next exercise is still checked
    monkeypatch.delattr(sol, 'duplication_factor')
    assert checks.main(['--solutions', '2', '4']) == 1
    lines = capsys.readouterr().out.splitlines()
    assert 'duplication_factor' in lines[0] and ' pass' in lines[1]


def test_a_tost_py_edited_since_is_said_before_it_fails_right_answers(monkeypatch, capsys):
    """A student who explores tost.py and breaks TSSA sees why exercise 5's right answer fails."""
    assert checks.main(['--solutions', '5']) == 0 and capsys.readouterr().err == ''
    forward = tost.TSSA.forward
    monkeypatch.setattr(tost.TSSA, 'forward', lambda self, x: 1.01 * forward(self, x))
    assert checks.main(['--solutions', '5']) == 1
    one_line(capsys.readouterr().err, 'tost.py', 'derivation.py')
    # one that no longer runs: said too, and the exercises that do not use it still pass
    monkeypatch.setattr(tost.TSSA, 'forward', lambda self, x: 1 / 0)
    assert checks.main(['--solutions', '2']) == 0
    one_line(capsys.readouterr().err, 'tost.py')


def test_a_float32_answer_is_told_its_dtype_and_one_that_keeps_its_graph_passes_without_a_warning():
    verdict, note = checks.run(CHECKS[1], lambda *a: sol.grad_variational(*a).float())
    assert verdict == 'fail' and 'torch.float32' in note
    # not where it is wrong beyond rounding; a factor lost is said in float32 too
    verdict, note = checks.run(CHECKS[1], lambda *a: (sol.grad_variational(*a) + 1).float())
    assert verdict == 'fail' and 'torch.float32' not in note
    verdict, note = checks.run(CHECKS[1], lambda *a: (2 * sol.grad_variational(*a)).float())
    assert verdict == 'fail' and ' 2 times' in note and 'torch.float32' not in note

    def with_graph(layer, *a):
        return sol.reorder_change(layer, *a) + 0 * next(layer.parameters()).sum()
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        assert checks.run(CHECKS[9], with_graph)[0] == 'pass'


def test_an_answer_that_crashes_is_a_failure_in_one_line_naming_its_line():
    def crashes(Z, Pi, alpha):
        return Z @ Z                                                       # shapes that do not match
    verdict, note = checks.run(CHECKS[6], crashes)
    assert verdict == 'fail' and '\n' not in note
    assert f'test_lecture.py:{crashes.__code__.co_firstlineno + 1}' in note


def test_a_written_answer_that_raises_torchs_not_implemented_error_fails_and_is_not_unattempted():
    def uniform(temp, bias0, p):
        return torch.softmax(torch.full((len(temp),), p), 0)              # an int p: a Long tensor
    verdict, note = checks.run(CHECKS[4], uniform)
    assert verdict == 'fail' and 'NotImplementedError' in note and '\n' not in note
    assert f'test_lecture.py:{uniform.__code__.co_firstlineno + 1}' in note


def test_an_answer_that_calls_the_stub_of_another_exercise_fails_naming_the_stub_s_line():
    def stub(Z, Pi, U, alpha):
        raise NotImplementedError

    def reweighted(Z, Pi, U, c):
        return stub(Z, Pi, U, 1.0) * c.sum()
    verdict, note = checks.run(CHECKS[8], reweighted)
    assert verdict == 'fail' and f'test_lecture.py:{stub.__code__.co_firstlineno + 1}' in note
    assert checks.run(CHECKS[3], stub) == ('not attempted', '')


def test_the_cost_check_counts_the_answer_s_work_not_the_copies_of_its_arguments():
    """Work the count cannot see (here all of it) is refused, whatever the check did around it."""
    def unseen(Z, Pi, alpha):
        with torch._C.DisableTorchFunction():
            return sol.grad_compression(Z, Pi, alpha)
    assert checks.run(CHECKS[6], unseen)[0] == 'fail'


def test_an_answer_that_changes_its_arguments_in_place_is_judged_on_what_it_returns():
    def projected_in_place(Z, Pi, U, alpha):
        n_k = Pi.sum(-1)
        Pi /= n_k[..., None]
        return sol.projected_compression(Z, Pi * n_k[..., None], U, alpha)

    def reweighted_in_place(Z, Pi, U, c):
        n_k = Pi.sum(-1)
        Pi /= n_k[..., None]
        return sol.reweighted_objective(Z, Pi * n_k[..., None], U, c)
    for number, answer in ((3, projected_in_place), (8, reweighted_in_place)):
        verdict, note = checks.run(CHECKS[number], answer)
        assert verdict == 'pass', note


def test_the_factor_may_be_any_kind_of_number_or_a_tensor_of_one():
    for kind in (torch.tensor, lambda v: torch.tensor([v]), fractions.Fraction, np.float64):
        verdict, note = checks.run(CHECKS[2], lambda: kind(sol.duplication_factor()))
        assert verdict == 'pass', note


def test_a_wrong_answer_that_is_a_multiple_of_the_right_one_is_told_the_factor():
    cases = [(6, lambda *a: -sol.grad_compression(*a), ' -1 '),
             (1, lambda *a: 3 * sol.grad_variational(*a), ' 3 ')]
    for number, wrong, factor in cases:
        verdict, note = checks.run(CHECKS[number], wrong)
        assert verdict == 'fail' and factor in note
    verdict, note = checks.run(CHECKS[5], lambda x, W, W_out, temp: sol.tssa_forward(x, W.T, W_out, temp))
    assert verdict == 'fail' and 'times' not in note


def test_exercise_5_says_whether_the_mistake_is_in_pi_and_y_or_in_the_map_back():
    """A softmax over the tokens and a W_out not transposed fail with messages that differ, each naming its
    part: the check tries the map back as the identity first."""
    tokens = checks.run(CHECKS[5], tssa_softmax_over_tokens)
    back = checks.run(CHECKS[5], lambda x, W, W_out, temp: sol.tssa_forward(x, W, W_out.T, temp))
    assert tokens[0] == back[0] == 'fail' and tokens[1] != back[1]
    assert 'Pi' in tokens[1] and 'map back' not in tokens[1]
    assert 'map back' in back[1] and 'Pi' not in back[1]


def test_exercise_3_tells_r_c_itself_that_the_failing_tokens_lie_outside_the_hypothesis():
    """R_c in all of R^d equals R^proj_c under the hypothesis: it fails only on random tokens, and is told
    that they are not in span(U_k); an answer wrong under the hypothesis too fails there first."""
    verdict, note = checks.run(CHECKS[3], lambda Z, Pi, U, alpha: sol.compression(Z, Pi, alpha))
    assert verdict == 'fail' and 'outside' in note and 'span(U_k)' in note
    verdict, note = checks.run(CHECKS[3], projected_without_group_weights)
    assert verdict == 'fail' and 'outside' not in note


def test_exercise_10_names_the_first_layer_that_differs():
    """Pi held from the input is right at layer 0 and wrong after: a layer past 0; a wrong R: layer 0."""
    layers = {}
    for wrong in (delta_R_with_the_first_memberships, delta_R_with_R_over_alpha):
        verdict, note = checks.run(CHECKS[10], wrong)
        assert verdict == 'fail'
        layers[wrong] = int(re.search(r'layer (\d+)', note).group(1))
    assert layers[delta_R_with_the_first_memberships] > 0 and layers[delta_R_with_R_over_alpha] == 0


def test_a_prediction_not_among_the_labels_is_told_the_labels_not_judged():
    with pytest.raises(checks.Wrong) as e:
        CHECKS[7](lambda: dict(sol.untied_prediction(), tied='Exact'))
    assert all(label in str(e.value) for label in ('exact', 'reweighted', 'none'))


def test_the_command_runs_the_solutions_from_the_repository_root_and_exits_1_on_a_wrong_answer():
    out = python('-m', 'lecture.exercises', '--solutions', '2')
    assert out.returncode == 0 and ' pass' in out.stdout
    # the solution of exercise 2 made wrong
    wrong = ("import runpy, sys\nimport lecture.solutions as s\ns.duplication_factor = lambda: 1.0\n"
             "sys.argv = ['exercises', '--solutions', '2']\n"
             "runpy.run_module('lecture.exercises', run_name='__main__')")
    out = python('-c', wrong)
    assert out.returncode == 1 and ' fail' in out.stdout


@pytest.mark.slow
def test_the_hand_out_has_no_answers_and_runs_the_students_commands(tmp_path):
    """The hand-out: no solutions, no tests that hold them, no history; in the copy the exercises
    run (every one not attempted), --solutions is one line and exit 2, the test suite collects, and the docs
    name no test the copy leaves out."""
    out = tmp_path / 'class'
    # (run by its path from another folder: it copies its own repository, not the current folder)
    r = subprocess.run([sys.executable, os.path.join(REPO, 'lecture', 'handout.py'), '--out=class'],
                       cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert (out / 'lecture' / 'exercises.py').is_file() and (out / 'tost.py').is_file()
    assert not (out / 'lecture' / 'solutions.py').exists()
    assert not (out / 'tests' / 'test_lecture.py').exists()
    assert not (out / '.git').exists()
    r = subprocess.run([sys.executable, '-m', 'lecture.exercises'], cwd=out, capture_output=True, text=True)
    lines = r.stdout.splitlines()
    assert r.returncode == 0 and len(lines) == len(CHECKS) + 1
    assert all('not attempted' in line for line in lines[:-1])
    r = subprocess.run([sys.executable, '-m', 'lecture.exercises', '--solutions'], cwd=out,
                       capture_output=True, text=True)
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1
    r = subprocess.run([sys.executable, '-m', 'pytest', '--collect-only', '-q', '-p', 'no:cacheprovider'],
                       cwd=out, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:]
    # The docs name tests by their function, none of them in a file left out.
    r = subprocess.run([sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider',
                        'tests/test_commands.py', '-k', 'docs_tests_md'],
                       cwd=out, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:]


def test_the_hand_out_names_the_files_git_does_not_track(tmp_path, monkeypatch, capsys, fails):
    """A teacher's own answers in a file not committed go out with the copy: the note names each such file."""
    clone = tmp_path / 'clone'
    subprocess.run(['git', 'clone', '-q', REPO, str(clone)], check=True)
    (clone / 'my_answers.py').write_text('answer = 1\n')
    (clone / 'notes').mkdir()
    (clone / 'notes' / 'ex5.md').write_text('the answer\n')
    # answers written into the exercises and not committed, only staged; what git ignores (a compiled
    # solutions.py); a tracked file deleted from the working tree
    with open(clone / 'lecture' / 'exercises.py', 'a') as f:
        f.write('# the answer\n')
    subprocess.run(['git', 'add', 'lecture/exercises.py'], cwd=clone, check=True)
    os.remove(clone / 'LICENSE')
    (clone / 'lecture' / '__pycache__').mkdir(exist_ok=True)
    (clone / 'lecture' / '__pycache__' / 'solutions.cpython-312.pyc').write_bytes(b'answers')
    monkeypatch.setattr(handout, 'ROOT', str(clone))
    assert handout.main([f'--out={tmp_path / "class"}']) == 0
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith('note:')]
    assert len(notes) == 2 and 'lecture/exercises.py' in notes[0]
    assert 'my_answers.py' in notes[1] and 'notes/ex5.md' in notes[1] and 'tost.py' not in notes[1]
    assert (tmp_path / 'class' / 'my_answers.py').is_file() and not (tmp_path / 'class' / 'LICENSE').exists()
    # the students' lecture/README.md: the page up to its part for the teacher
    readme = (clone / 'lecture' / 'README.md').read_text(encoding='utf-8')
    students = (tmp_path / 'class' / 'lecture' / 'README.md').read_text(encoding='utf-8')
    assert students == readme[:readme.index('\n## For the teacher\n')] and '## The exercises' in students
    copied = {os.path.relpath(os.path.join(d, f), tmp_path / 'class')
              for d, _, names in os.walk(tmp_path / 'class') for f in names}
    assert not copied & {'lecture/solutions.py', 'tests/test_lecture.py', 'tests/test_model_unchanged.py',
                         'lecture/__pycache__/solutions.cpython-312.pyc'}
    # the copy again, over the first
    with pytest.raises(options.UsageError, match='class'):
        handout.main([f'--out={tmp_path / "class"}'])
    # A full disk, as shutil's copy says it (the source named first): one line naming the file written, and
    # no part of the copy left to refuse the command again.
    def full(src, dst):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), src, None, dst)
    monkeypatch.setattr(handout.shutil, 'copy2', full)
    fails(handout.main, [f'--out={tmp_path / "full"}'], str(tmp_path / 'full'))
    assert os.listdir(tmp_path / 'full') == []


BAD = [(checks.main, '99'), (checks.main, 'x'), (checks.main, '--solutions'), (recall.main, '--steps=0'),
       (recall.main, '--batch=0'), (recall.main, '--seconds=-1'), (recall.main, '--steps=x'),
       (handout.main, '--out='), (handout.main, f'--out={REPO}/README.md')]


@pytest.mark.parametrize('main, arg', BAD)
def test_bad_input_exits_2_with_one_line(main, arg, monkeypatch, fails):
    """An unknown exercise, the solutions file missing, a recall option out of range, a hand-out with no
    folder or into a file."""
    def missing(name):
        raise ModuleNotFoundError(f'No module named {name!r}', name=name)
    monkeypatch.setattr(checks.importlib, 'import_module', missing)
    # the line names the option given a value
    fails(main, [arg], *[arg.partition('=')[0]] * ('=' in arg))


def test_a_batch_past_memory_is_refused_before_any_work(monkeypatch, fails):
    """--batch=100000000 was the OOM killer's (exit 137, nothing said): one line naming --batch, exit 2."""
    monkeypatch.setattr(recall, 'batch', lambda *args: pytest.fail('the run began'))
    fails(recall.main, ['--batch=100000000', '--steps=1'], '--batch')


def test_recall_keeps_a_notebook_kernels_thread_count(monkeypatch):
    """(whose later cells would keep one thread)"""
    class Began(Exception):
        pass

    def began(*args):
        raise Began
    monkeypatch.setattr(recall.options, 'kernel', True)
    monkeypatch.setattr(recall, 'batch', began)
    torch.set_num_threads(2)
    with pytest.raises(Began):
        recall.main(['--steps=1'])
    assert torch.get_num_threads() == 2
    torch.set_num_threads(1)


def test_the_lecture_ends_in_one_line_on_a_mistake_and_quietly_on_a_closed_pipe():
    """A --figures that is a file: refused at once, exit 2, one line naming it. A reader that leaves after the
    first line (`| head -1`): exit 141, nothing on stderr."""
    r = python('derivation.py', '--figures=README.md')
    assert r.stdout == ''
    ended(r, 2, '--figures')
    # Unbuffered, so that the lecture is still writing when the reader leaves.
    p = subprocess.Popen([sys.executable, 'derivation.py'], cwd=REPO, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONUNBUFFERED='1'))
    p.stdout.readline()
    p.stdout.close()
    assert p.wait(timeout=120) == 141 and p.stderr.read() == ''


def test_the_page_writer_runs_each_cell_at_its_own_lines(tmp_path, monkeypatch, capsys):
    """A claim that fails while the page is written is named by its line in derivation.py (each cell compiled
    alone counted its lines from 1), after what its cell printed."""
    from tools import lecture_page
    source = lecture_page.LECTURE.read_text(encoding='utf-8')
    lines = source.splitlines()
    found = [(line, code) for _, _, code, line in lecture_page.cells(source) if code]
    assert len(found) > 17 and all(lines[line - 1] == code.splitlines()[0] for line, code in found)
    # a cell whose code starts after a blank line, and fails at its line 7
    lecture = tmp_path / 'lecture.py'
    lecture.write_text('"""A lecture."""\nx = 1\n# %% 1. One. Its text.\n# more text\n\n'
                       'print(x)\nassert x == 2\n')
    monkeypatch.setattr(lecture_page, 'LECTURE', lecture)
    monkeypatch.setattr(sys, 'argv', ['lecture_page.py', f'--out={tmp_path}'])
    with pytest.raises(AssertionError) as e:
        lecture_page.main()
    assert (e.traceback[-1].path, e.traceback[-1].lineno + 1) == (lecture, 7)
    assert capsys.readouterr().err.endswith(' s\n1\n')               # what the cell printed, last
    # right, and without --out: the page goes to the repository's docs/, whatever the current folder
    lecture.write_text(lecture.read_text().replace('x == 2', 'x == 1'))
    monkeypatch.setattr(lecture_page, 'ROOT', tmp_path / 'repo')
    monkeypatch.setattr(sys, 'argv', ['lecture_page.py'])
    monkeypatch.chdir(tmp_path)
    lecture_page.main()
    assert '## 1. One' in (tmp_path / 'repo' / 'docs' / 'lecture.md').read_text()


def test_the_page_writer_takes_its_options_as_every_script():
    """tools/lecture_page.py: --help shows its one option, exit 0; a mistyped one is one line naming it."""
    page = os.path.join('tools', 'lecture_page.py')
    r = python(page, '--help')
    assert r.returncode == 0 and '--out=docs' in r.stdout
    ended(python(page, '--ot=x'), 2, '--ot')


def rows(out):
    """The recall table's model rows, as lists of columns without the seconds."""
    lines = [line.split() for line in out.splitlines()]
    table = [cols for cols in lines if cols and cols[0] in ('ToST', 'softmax')]
    return [cols[:-3] + cols[-2:] for cols in table]


def test_recall_runs_and_prints_its_table_deterministically(capsys):
    recall.main(['--steps=2', '--batch=4'])
    out = capsys.readouterr().out
    assert 'accuracy' in out and 'chance' in out
    # two steps are too few to show the gap, and it says so
    assert '4000' in out.splitlines()[-1]
    first = rows(out)
    assert [cols[0] for cols in first] == ['ToST', 'ToST', 'softmax']
    assert all(cols[-3] == '2' for cols in first)                          # the steps column
    # the models the lecture's README table shows, by their parameters
    with open(os.path.join(REPO, 'lecture', 'README.md')) as f:
        readme = [line.split('|')[3].strip() for line in f if line.startswith(('| ToST', '| softmax'))]
    assert [cols[-4] for cols in first] == readme
    recall.main(['--steps=2', '--batch=4'])
    # Seeded: the same models, data and result (all but the seconds).
    assert rows(capsys.readouterr().out) == first


def test_recall_trains_each_model_on_the_answer_at_the_query(monkeypatch):
    """The loss of a step is the cross-entropy of the value logits at the query against the value asked."""
    seen = []
    real = recall.F.cross_entropy
    monkeypatch.setattr(recall.F, 'cross_entropy', lambda *a: seen.append(a) or real(*a))
    recall.train(recall.make_model('softmax', 1, 0), 1, 0, 4, 0)
    idx, answer = recall.batch(4, torch.Generator().manual_seed(0))
    logits, target = seen[0]
    assert torch.equal(target, answer - recall.ANSWER0)
    torch.testing.assert_close(logits, recall.answer_logits(recall.make_model('softmax', 1, 0), idx))


def test_recall_stops_by_the_clock():
    model = recall.make_model('tssa', 1, 0)
    steps, seconds = recall.train(model, 10**9, 0.2, 4, 0)
    assert 1 <= steps < 10**9 and seconds >= 0.2


def test_recall_sequences_hold_distinct_keys_and_the_query_names_one_of_them():
    idx, answer = recall.batch(256, torch.Generator().manual_seed(0))
    keys = idx[:, :-1] // recall.VALUES
    values = idx[:, :-1] % recall.VALUES
    asked = idx[:, -1] - recall.QUERY0
    assert all(len(set(k.tolist())) == recall.PAIRS for k in keys)
    assert all(len(set(v.tolist())) == recall.PAIRS for v in values)
    where = (keys == asked[:, None]).float().argmax(1)
    assert ((keys == asked[:, None]).sum(1) == 1).all()
    assert torch.equal(values[torch.arange(256), where], answer - recall.ANSWER0)
    assert set(where.tolist()) == set(range(recall.PAIRS))


def test_recall_accuracy_is_the_share_of_queries_answered_at_the_query():
    """A stand-in model that names, at the last position, the answer for a quarter of the sequences and
    another value for the rest."""
    idx, answer = recall.batch(64, torch.Generator().manual_seed(0))
    named = answer.clone()
    named[16:] = recall.ANSWER0 + (answer[16:] - recall.ANSWER0 + 1) % recall.VALUES

    def model(ids):
        logits = torch.zeros(len(ids), ids.shape[1], recall.VOCAB)
        logits[torch.arange(len(ids)), -1, named] = 1
        return logits, None
    assert recall.accuracy(model, (idx, answer)) == 0.25
