"""Autograd semantics of compiled functions and modules, each compared with eager PyTorch.

Every test runs the same program eagerly and compiled (strict backend: forward and backward must
be compiled, see training_util) on cloned inputs / deep-copied modules, and compares outputs,
requires_grad flags, input and parameter gradients, buffers, and the errors eager raises.
Double backward (create_graph=True) may run eagerly: it uses the plain "ember" backend.
"""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from training_util import (
    BF16_ATOL,
    BF16_RTOL,
    assert_close,
    assert_compiled,
    assert_same_grads,
    assert_same_state,
    clone_inputs,
    compile_plain,
    compile_strict,
    reset_kinds,
)


@pytest.fixture(autouse=True)
def _fresh_kinds():
    reset_kinds()
    yield


def weighted_sum(outputs) -> torch.Tensor:
    """sum(out * fixed random weight) over the floating outputs that require grad.  Weights in
    [0.5, 1.5): a small weight would shrink the gradients below atol and hide errors."""
    outputs = outputs if isinstance(outputs, (tuple, list)) else (outputs,)
    gen = torch.Generator().manual_seed(1234)
    total = 0
    for out in outputs:
        if isinstance(out, torch.Tensor) and out.requires_grad:
            total = total + (out * (torch.rand(out.shape, generator=gen, dtype=out.dtype) + 0.5)).sum()
    return total


def run_both(fn, inputs, compiled_fn=None, backward=True):
    """fn eagerly and compiled on separate clones of `inputs`; backward of weighted_sum on each.
    Returns ((outputs, inputs) eager, (outputs, inputs) compiled)."""
    compiled_fn = compiled_fn or compile_strict(fn)
    inputs_e, inputs_c = clone_inputs(inputs), clone_inputs(inputs)
    out_e = fn(*inputs_e)
    out_c = compiled_fn(*inputs_c)
    if backward:
        weighted_sum(out_e).backward()
        weighted_sum(out_c).backward()
    return (out_e, inputs_e), (out_c, inputs_c)


def check_fn(fn, inputs, **kwargs):
    """Outputs, their requires_grad, and every input's .grad equal eager's."""
    (out_e, inputs_e), (out_c, inputs_c) = run_both(fn, inputs, **kwargs)
    assert_close(out_c, out_e, "outputs")
    for i, (a, e) in enumerate(zip(inputs_c, inputs_e)):
        if isinstance(e, torch.Tensor):
            assert_close(a.grad, e.grad, f"input {i} .grad")
    return (out_e, inputs_e), (out_c, inputs_c)


def leaf(*shape, requires_grad=True):
    return torch.randn(*shape).requires_grad_(requires_grad)


class Small(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x)))


def model_pair(module: nn.Module):
    """(eager module, compiled module, the compiled module's original) on deep copies."""
    copy_ = copy.deepcopy(module)
    return module, compile_strict(copy_), copy_


# ------------------------------------------------------------------ backward, accumulation, retain_graph
def test_loss_backward():
    check_fn(lambda x, w: (torch.sigmoid(x @ w) * x.sum(1, keepdim=True)).mean(), [leaf(4, 8), leaf(8, 3)])
    assert_compiled()


def test_gradient_accumulation_over_two_calls():
    eager, compiled, orig = model_pair(Small())
    for _ in range(2):
        x = torch.randn(5, 8)
        eager(x).square().mean().backward()
        compiled(x).square().mean().backward()
    assert_same_grads(orig, eager, "accumulated")
    opt_e, opt_c = torch.optim.SGD(eager.parameters(), lr=0.1), torch.optim.SGD(orig.parameters(), lr=0.1)
    opt_e.step()
    opt_c.step()
    assert_same_state(orig, eager, "after step")
    assert_compiled()


def test_retain_graph_then_second_backward():
    (out_e, in_e), (out_c, in_c) = run_both(lambda x, w: torch.exp(x * w).sum(), [leaf(6), leaf(6)], backward=False)
    for out in (out_e, out_c):
        out.backward(retain_graph=True)
        out.backward()                      # accumulates: twice the gradient
    for i in range(2):
        assert_close(in_c[i].grad, in_e[i].grad, f"input {i} .grad")
    assert_compiled()


def test_backward_twice_without_retain_graph_raises_like_eager():
    (out_e, _), (out_c, _) = run_both(lambda x: (x.sin() * x.cos()).sum(), [leaf(7)], backward=False)
    out_e.backward()
    out_c.backward()
    with pytest.raises(RuntimeError) as eager_error:
        out_e.backward()
    with pytest.raises(RuntimeError) as compiled_error:
        out_c.backward()
    # the message says what eager's says (the graph was freed), not an internal failure
    assert "second time" in str(eager_error.value)
    assert "second time" in str(compiled_error.value) or "freed" in str(compiled_error.value), \
        str(compiled_error.value)
    assert_compiled()


def test_autograd_grad_wrt_inputs_and_params():
    eager, compiled, orig = model_pair(Small())
    x_e = leaf(3, 8)
    x_c = x_e.detach().clone().requires_grad_(True)
    w = torch.randn(3, 4)
    grads_e = torch.autograd.grad((eager(x_e) * w).sum(), [x_e, eager.fc1.weight, eager.fc2.bias])
    grads_c = torch.autograd.grad((compiled(x_c) * w).sum(), [x_c, orig.fc1.weight, orig.fc2.bias])
    assert_close(grads_c, grads_e, "autograd.grad")
    # autograd.grad does not accumulate into .grad
    assert all(p.grad is None for p in orig.parameters()) and x_c.grad is None
    assert_compiled()


# ------------------------------------------------------------------ hooks
def test_hook_on_parameter_modifies_grad():
    eager, compiled, orig = model_pair(Small())
    eager.fc1.weight.register_hook(lambda g: g * 3.0)
    orig.fc1.weight.register_hook(lambda g: g * 3.0)
    x = torch.randn(4, 8)
    eager(x).sum().backward()
    compiled(x).sum().backward()
    assert_same_grads(orig, eager, "hooked")
    assert_compiled()


def test_hook_on_output_tensor_modifies_grad():
    def f(x, w):
        return torch.relu(x @ w), (x * 2).sum()

    (out_e, in_e), (out_c, in_c) = run_both(f, [leaf(4, 5), leaf(5, 6)], backward=False)
    seen = {}
    for name, out in (("eager", out_e), ("ember", out_c)):
        out[0].register_hook(lambda g, name=name: seen.setdefault(name, g.clone()) * -2.0)
        (out[0].pow(2).sum() + out[1]).backward()
    assert_close(seen["ember"], seen["eager"], "grad seen by the hook")
    for i in range(2):
        assert_close(in_c[i].grad, in_e[i].grad, f"input {i} .grad")
    assert_compiled()


# ------------------------------------------------------------------ what requires grad
def test_frozen_parameters_keep_grad_none():
    eager, compiled, orig = model_pair(Small())
    for m in (eager, orig):
        m.fc1.weight.requires_grad_(False)
        m.fc2.bias.requires_grad_(False)
    x = torch.randn(4, 8)
    eager(x).square().sum().backward()
    compiled(x).square().sum().backward()
    assert orig.fc1.weight.grad is None and orig.fc2.bias.grad is None
    assert_same_grads(orig, eager, "partly frozen")
    assert_compiled()


def test_inputs_with_and_without_requires_grad_mixed():
    def f(a, b, c, d):
        return (a * b + c).tanh() @ d

    inputs = [leaf(3, 4), leaf(3, 4, requires_grad=False), leaf(3, 4), leaf(4, 2, requires_grad=False)]
    (_, in_e), (_, in_c) = check_fn(f, inputs)
    assert in_c[1].grad is None and in_c[3].grad is None
    assert_compiled()


def test_requires_grad_changes_between_calls():
    def f(x, w):
        return (x * w).sin().sum(0)

    compiled = compile_strict(f)
    for x_rg, w_rg in [(False, False), (True, False), (False, True), (True, True), (True, False)]:
        inputs = [leaf(4, 3, requires_grad=x_rg), leaf(3, requires_grad=w_rg)]
        if x_rg or w_rg:
            check_fn(f, inputs, compiled_fn=compiled)
        else:
            (out_e, _), (out_c, _) = run_both(f, inputs, compiled_fn=compiled, backward=False)
            assert_close(out_c, out_e, "no grad")
    assert_compiled()


# ------------------------------------------------------------------ outputs
def test_non_differentiable_outputs_beside_a_differentiable_one():
    def f(x, w):
        y = x @ w
        return y.softmax(-1), y.argmax(-1), (y > 0), y.detach().floor().long(), y.sum()

    (out_e, _), (out_c, _) = check_fn(f, [leaf(5, 4), leaf(4, 6)])
    for i in (1, 2, 3):
        assert out_c[i].dtype == out_e[i].dtype and not out_c[i].requires_grad
    assert_compiled()


@pytest.mark.parametrize("alias", ["view", "select", "t", "intermediate_view", "intermediate_t"])
def test_outputs_that_alias_inputs(alias):
    def f(x):
        if alias == "view":
            return x.view(4, 3), (x * 2).sum()
        if alias == "select":
            return x[0], x.exp()
        if alias == "t":
            return x.t(), x.sum(0)
        h = x.exp()
        return (h.view(12), h) if alias == "intermediate_view" else (h.t(), h.sin())

    (out_e, in_e), (out_c, in_c) = check_fn(f, [leaf(3, 4)])
    for i, (a, e) in enumerate(zip(out_c, out_e)):
        # an output that is a view in eager shares its storage in ember too
        if e._base is not None:
            base_e = in_e[0] if e._base is in_e[0] else e._base
            shares_input_e = base_e is in_e[0]
            assert a._base is not None, f"output {i}: eager returns a view, ember a copy"
            shares_input_c = a.untyped_storage().data_ptr() == in_c[0].untyped_storage().data_ptr()
            assert shares_input_c == shares_input_e, f"output {i}: aliasing of the input differs from eager"
    assert_compiled()


def test_output_returned_twice():
    def f(x):
        y = x.sigmoid() * 3
        return y, y

    (out_e, _), (out_c, _) = check_fn(f, [leaf(5)])
    assert (out_c[0] is out_c[1]) == (out_e[0] is out_e[1])
    assert_compiled()


# ------------------------------------------------------------------ stopping gradients
def test_no_grad_block_inside():
    def f(x, w):
        h = x * w
        with torch.no_grad():
            scale = h.abs().amax() + 1.0           # constant to autograd
            h2 = h * 2
        return h / scale + h2, h2

    (out_e, _), (out_c, _) = check_fn(f, [leaf(3, 5), leaf(5)])
    assert not out_c[1].requires_grad
    assert_compiled()


def test_detach_inside():
    def f(x, w):
        h = (x @ w).tanh()
        return h * h.detach() + x.detach().sum()

    check_fn(f, [leaf(4, 4), leaf(4, 4)])
    assert_compiled()


# ------------------------------------------------------------------ in-place on intermediates
@pytest.mark.parametrize("inplace", ["relu_", "add_", "setitem", "mul_then_view"])
def test_inplace_on_intermediates(inplace):
    def f(x, w):
        h = x @ w
        if inplace == "relu_":
            h.relu_()
        elif inplace == "add_":
            h.add_(x.sum(1, keepdim=True))
        elif inplace == "setitem":
            h[:, 0] = 0
        else:
            h.view(-1).mul_(2.0)
        return h.exp().sum(1)

    check_fn(f, [leaf(4, 5), leaf(5, 5)])
    assert_compiled()


def test_inplace_on_a_leaf_that_requires_grad_raises_like_eager():
    def f(x):
        x.add_(1.0)
        return x * 2

    compiled = compile_strict(f)
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        f(leaf(4))
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        compiled(leaf(4))


def test_inplace_update_of_an_input_with_a_value_that_requires_grad():
    """buf (no grad) += w (grad): in eager buf now carries w's history, so a loss through buf read
    after the call reaches w.  ember may run this graph eagerly (it changes which tensors require
    grad): plain backend, values compared."""
    def f(buf, w):
        buf.add_(w * 3.0)
        return (buf * w).sum()

    compiled = compile_plain(f)
    inputs = [leaf(5, requires_grad=False), leaf(5)]
    results = {}
    for name, fn in (("eager", f), ("ember", compiled)):
        buf, w = clone_inputs(inputs)
        out = fn(buf, w)
        (out + (buf * buf).sum()).backward()
        results[name] = (out, buf, w.grad)
    assert_close(results["ember"][0], results["eager"][0], "output")
    assert_close(results["ember"][1], results["eager"][1], "the updated input (value and requires_grad)")
    assert_close(results["ember"][2], results["eager"][2], "w.grad through the output and the updated input")


# ------------------------------------------------------------------ modules: BatchNorm, eval, inference
class ConvBN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        return self.drop(F.relu(self.bn(self.conv(x)))).mean((2, 3))


def test_batchnorm_running_stats_in_train_mode():
    eager, compiled, orig = model_pair(ConvBN())
    for m in (eager, orig):
        m.drop.p = 0.0
    for step in range(2):
        x = torch.randn(3, 3, 6, 6)
        eager(x).square().sum().backward()
        compiled(x).square().sum().backward()
        assert_same_state(orig, eager, f"call {step}")
        assert_same_grads(orig, eager, f"call {step}")
    assert orig.bn.num_batches_tracked.item() == 2
    assert_compiled()


def test_eval_mode_under_grad():
    eager, compiled, orig = model_pair(ConvBN())
    eager.train()(torch.randn(2, 3, 5, 5))            # non-trivial running stats, copied to ember's module
    orig.load_state_dict(eager.state_dict())
    eager.eval()
    compiled.eval()
    x = torch.randn(2, 3, 5, 5)
    out_e, out_c = eager(x), compiled(x)
    assert_close(out_c, out_e, "eval output")
    weighted_sum(out_e).backward()
    weighted_sum(out_c).backward()
    assert_same_grads(orig, eager, "eval")
    assert_same_state(orig, eager, "eval: running stats unchanged")
    assert_compiled()


@pytest.mark.parametrize("op", ["native_batch_norm", "_native_batch_norm_legit"])
def test_aten_batch_norm_in_eval_mode_returns_empty_saved_stats_on_cpu(op):
    # the CPU kernel returns (0,)-shaped saved statistics outside training; the meta kernel (C,)
    def f(x, w, b, running_mean, running_var):
        return getattr(torch, op)(x, w, b, running_mean, running_var, False, 0.1, 1e-5)

    stats = [torch.rand(3), torch.rand(3) + 0.5]
    (out_e, _), (out_c, _) = check_fn(f, [leaf(4, 3, 5), leaf(3), leaf(3)] + stats)
    assert [tuple(o.shape) for o in out_c] == [tuple(o.shape) for o in out_e] == [(4, 3, 5), (0,), (0,)]
    assert_compiled()


def test_inference_outside_no_grad_without_backward():
    eager, compiled, orig = model_pair(Small())
    for _ in range(3):
        x = torch.randn(4, 8)
        out_e, out_c = eager(x), compiled(x)
        assert_close(out_c, out_e, "inference output")    # includes requires_grad=True, as eager
    assert all(p.grad is None for p in orig.parameters())
    assert_compiled()


# ------------------------------------------------------------------ mixed precision
def test_autocast_bf16_training_step():
    eager, compiled, orig = model_pair(nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32),
                                                     nn.Linear(32, 4)))
    x, target = torch.randn(8, 16), torch.randint(0, 4, (8,))
    results = {}
    for name, model in (("eager", eager), ("ember", compiled)):
        with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
            out = model(x)
            loss = F.cross_entropy(out.float(), target)
        loss.backward()
        results[name] = (out, loss)
    assert results["ember"][0].dtype == results["eager"][0].dtype == torch.bfloat16
    assert_close(results["ember"], results["eager"], "autocast outputs", BF16_RTOL, BF16_ATOL)
    assert_same_grads(orig, eager, "autocast", BF16_RTOL, BF16_ATOL)
    for p in orig.parameters():
        assert p.grad.dtype == torch.float32
    assert_compiled()


def test_autocast_fp16_with_grad_scaler():
    """fp16 autocast with GradScaler: scaled gradients, unscale + step + update, two steps."""
    eager, compiled, orig = model_pair(nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4)))
    setups = {name: (model, params, torch.optim.SGD(params.parameters(), lr=0.1),
                     torch.amp.GradScaler("cpu", init_scale=2.0 ** 8))
              for name, model, params in (("eager", eager, eager), ("ember", compiled, orig))}
    for step in range(2):
        x, target = torch.randn(8, 16), torch.randint(0, 4, (8,))
        losses = {}
        for name, (model, params, opt, scaler) in setups.items():
            opt.zero_grad(set_to_none=True)
            with torch.autocast(device_type="cpu", dtype=torch.float16):
                out = model(x)
                assert out.dtype == torch.float16
                loss = F.cross_entropy(out.float(), target)
            scaler.scale(loss).backward()
            losses[name] = loss
        assert_close(losses["ember"], losses["eager"], f"step {step}: loss", BF16_RTOL, BF16_ATOL)
        assert_same_grads(orig, eager, f"step {step}: scaled grads", BF16_RTOL, BF16_ATOL * 2.0 ** 8)
        for name, (model, params, opt, scaler) in setups.items():
            scaler.step(opt)
            scaler.update()
        assert setups["ember"][3].get_scale() == setups["eager"][3].get_scale()
        assert_same_state(orig, eager, f"step {step}: after step", BF16_RTOL, BF16_ATOL)
    assert_compiled()


# ------------------------------------------------------------------ double backward
# each input reaches some outputs (x: a and b; y: b; z: c and, through detach, d; w: nothing)
def _three_outputs(x, y, z, w):
    t = x * 2
    return t.sin(), t * y, z.exp(), (z * 3).detach()


@pytest.mark.parametrize("chosen", [(0,), (1,), (2,), (0, 1), (0, 2), (1, 2), (0, 1, 2), (3,)])
@pytest.mark.parametrize("how", ["backward", "autograd.grad"])
def test_gradients_of_inputs_not_reached_stay_none(chosen, how):
    """Backward from every subset of the outputs: an input that no chosen output depends on keeps
    .grad None (an optimizer then skips it), as eager; the others get eager's gradients."""
    inputs = [leaf(3), leaf(3), leaf(3), leaf(3)]
    compiled = compile_strict(_three_outputs)
    grads = {}
    for name, fn in (("eager", _three_outputs), ("ember", compiled)):
        args = clone_inputs(inputs)
        outputs = fn(*args)
        picked = [outputs[i] for i in chosen if outputs[i].requires_grad]
        if not picked:      # only the detached output: nothing to differentiate, in both
            assert name == "eager" or grads["eager"] is None
            grads[name] = None
            continue
        loss = sum((o * (k + 1)).sum() for k, o in enumerate(picked))
        if how == "backward":
            loss.backward()
            grads[name] = [a.grad for a in args]
        else:
            grads[name] = list(torch.autograd.grad(loss, args, allow_unused=True))
    assert_compiled()
    if grads["eager"] is not None:
        assert [g is None for g in grads["ember"]] == [g is None for g in grads["eager"]]
        assert_close(grads["ember"], grads["eager"], "gradients")


def test_second_backward_through_other_outputs_accumulates_like_eager():
    """retain_graph, then backward through another output: each input accumulates only what reaches it."""
    inputs = [leaf(3), leaf(3), leaf(3), leaf(3)]
    results = {}
    for name, fn in (("eager", _three_outputs), ("ember", compile_strict(_three_outputs))):
        args = clone_inputs(inputs)
        a, b, c, _ = fn(*args)
        c.sum().backward(retain_graph=True)
        after_first = [None if t.grad is None else t.grad.clone() for t in args]
        (a.sum() + b.sum()).backward()
        results[name] = (after_first, [t.grad for t in args])
    assert_close(results["ember"], results["eager"], "gradients after each backward")


def test_double_backward_create_graph():
    """grad(create_graph=True) then a second grad: equal to eager, or a clear error, never wrong.
    Plain "ember" backend: running this graph eagerly is acceptable."""
    def f(x, w):
        return (torch.tanh(x @ w) ** 2).sum()

    compiled = compile_plain(f)
    x, w = leaf(3, 4), leaf(4, 2)
    results = {}
    for name, fn in (("eager", f), ("ember", compiled)):
        xi, wi = clone_inputs([x, w])
        try:
            out = fn(xi, wi)
            (gx,) = torch.autograd.grad(out, xi, create_graph=True)
            (gw2,) = torch.autograd.grad(gx.pow(2).sum(), wi)
        except RuntimeError as exc:
            assert name == "ember", f"eager itself failed: {exc}"
            message = str(exc)
            assert "double backward" in message or "create_graph" in message or "twice" in message, \
                f"ember's error for double backward is not clear: {message}"
            return
        results[name] = (out, gx, gw2)
    assert_close(results["ember"], results["eager"], "double backward")


def _failing_backward_compile(monkeypatch):
    """compile_prim_graph raises for backward graphs (their placeholders are saved values and
    tangents), as a Triton or g++ failure at the first backward would."""
    import ember.backend
    from ember.errors import CompileError
    real = ember.backend.compile_prim_graph

    def compile_prim_graph(graph, specs, options, **kwargs):
        if any(p.name.startswith("tangent") for p in graph.placeholders):
            raise CompileError("the kernel compiler failed", stage="runtime")
        return real(graph, specs, options, **kwargs)
    monkeypatch.setattr(ember.backend, "compile_prim_graph", compile_prim_graph)


def test_backward_that_fails_to_compile_runs_its_graph_uncompiled(monkeypatch):
    _failing_backward_compile(monkeypatch)

    def f(x, w):
        return torch.nn.functional.gelu(x @ w).softmax(-1) * x.sum()

    with pytest.warns(UserWarning, match="cannot compile this graph's backward .*kernel compiler failed"):
        check_fn(f, [leaf(5, 4), leaf(4, 4)], compiled_fn=compile_plain(f))


def test_backward_that_fails_to_compile_raises_with_fallback_error(monkeypatch):
    _failing_backward_compile(monkeypatch)
    compiled = compile_strict(lambda x: (x.sin() * 2).sum())
    loss = compiled(leaf(6))
    with pytest.raises(Exception, match="kernel compiler failed"):
        loss.backward()


@pytest.mark.parametrize("kwargs", [{}, {"padding_idx": 0}, {"padding_idx": -2}, {"scale_grad_by_freq": True},
                                    {"padding_idx": 3, "scale_grad_by_freq": True}],
                         ids=["plain", "padding", "negative_padding", "by_freq", "padding_by_freq"])
def test_embedding_gradients(kwargs):
    # padding_idx and scale_grad_by_freq change only the gradient: the padding row gets none
    def f(indices, weight):
        return F.embedding(indices, weight, **kwargs) * 2

    indices = torch.tensor([[0, 1, 3, 0], [4, 3, 3, 0]])
    check_fn(f, [indices, leaf(5, 3)])
    assert_compiled()


def test_rows_of_a_table_by_negative_and_repeated_indices():
    def f(table, rows):
        return table[rows].sin(), table[rows[:2]] * 3

    check_fn(f, [leaf(6, 4), torch.tensor([-1, 2, 2, -6, 0])])
    assert_compiled()


# ------------------------------------------------------------------ ties in max/min over a dim
@pytest.mark.parametrize("op", ["max", "min"])
@pytest.mark.parametrize("keepdim", [False, True])
def test_max_over_a_dim_sends_the_gradient_to_the_returned_index(op, keepdim):
    """torch.max(x, dim) gives each row's gradient to the index it returns; amax shares it among
    ties.  With tied rows (an expanded input) the compiled step shared it: the fuzzer found it."""
    x = torch.randn(1, 5).expand(3, 5).clone().requires_grad_(True)

    def fn(x):
        values, indices = getattr(torch, op)(x, 0, keepdim=keepdim)
        return values * 2, indices, x.amax(0) if op == "max" else x.amin(0)

    check_fn(fn, (x,))


@pytest.mark.parametrize("op", ["max", "min"])
def test_max_of_a_computed_value_sends_the_gradient_to_the_returned_index(op):
    """The same for a value computed inside the graph (prim Values never carry requires_grad:
    the rule asks whether the call is differentiated).  x and x**3 tie at 1: eager gives the
    gradient to the first, the shared rule gave 0.5 * 1 + 0.5 * 3."""
    x = torch.ones(3, 1).requires_grad_(True)

    def fn(x):
        return getattr(torch, op)(torch.cat([x, x.pow(3)], 1), 1).values * 2

    check_fn(fn, (x,))


@pytest.mark.parametrize("option", ["padding_idx", "scale_grad_by_freq"])
def test_embedding_of_a_computed_weight_keeps_eagers_gradient_rules(option):
    """padding_idx (no gradient for that row) and scale_grad_by_freq hold for a weight computed
    in the graph too, not only for a parameter."""
    weight = leaf(6, 4)
    ids = torch.tensor([[0, 2, 2], [5, 0, 1]])
    kwargs = {"padding_idx": 0} if option == "padding_idx" else {"scale_grad_by_freq": True}

    def fn(w, i):
        return F.embedding(i, w * 3, **kwargs).sin()

    check_fn(fn, [weight, ids])
