"""torch.nn modules created inside the compiled frame, as Hugging Face models create their loss
(``loss_fct = CrossEntropyLoss(); loss = loss_fct(logits.view(-1, V), labels.view(-1))``).

A module without parameters, buffers or submodules, from torch.nn and from Python constants, is
made at capture and called like any module: one graph, where it used to break the graph at every
such line.  Every other creation still breaks the graph (a user's module class, whose constructor
may do anything; parameters, which eager initializes randomly at each call; tensor arguments).
A module that escapes the frame is a new object per call, as in eager.  Values, gradients and
graph counts against eager."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import ember

CREATED = {
    "CrossEntropyLoss": lambda x, t: nn.CrossEntropyLoss(ignore_index=-100)(x, t),
    "CrossEntropyLoss_smoothing_sum": lambda x, t: nn.CrossEntropyLoss(label_smoothing=0.1, reduction="sum")(x, t),
    "NLLLoss": lambda x, t: nn.NLLLoss()(x.log_softmax(-1), t),
    "MSELoss": lambda x, t: nn.MSELoss()(x, x.tanh()),
    "L1Loss_sum": lambda x, t: nn.L1Loss(reduction="sum")(x, x * 0.5),
    "SmoothL1Loss": lambda x, t: nn.SmoothL1Loss(beta=0.5)(x, x.sin()),
    "BCEWithLogitsLoss": lambda x, t: nn.BCEWithLogitsLoss()(x, x.sigmoid()),
    "KLDivLoss": lambda x, t: nn.KLDivLoss(reduction="batchmean")(x.log_softmax(-1), x.softmax(-1)),
    "ReLU": lambda x, t: nn.ReLU()(x),
    "GELU_tanh": lambda x, t: nn.GELU(approximate="tanh")(x),
    "SiLU": lambda x, t: nn.SiLU()(x),
    "LeakyReLU": lambda x, t: nn.LeakyReLU(0.2)(x),
    "Softmax": lambda x, t: nn.Softmax(dim=-1)(x),
    "LogSoftmax": lambda x, t: nn.LogSoftmax(dim=1)(x),
    "Hardtanh": lambda x, t: nn.Hardtanh(-0.5, 0.5)(x),
    "Identity": lambda x, t: nn.Identity()(x) * 2,
    "Flatten": lambda x, t: nn.Flatten(0)(x),
    "Dropout_0": lambda x, t: nn.Dropout(0.0)(x),
}


@pytest.mark.parametrize("name", list(CREATED))
def test_created_module_is_one_graph_with_eagers_values_and_gradients(name):
    fn = CREATED[name]
    for call in range(2):
        torch.manual_seed(call)
        x = torch.randn(6, 5)
        target = torch.randint(0, 5, (6,))
        target[1] = -100 if name == "CrossEntropyLoss" else target[1]
        xe, xc = x.clone().requires_grad_(), x.clone().requires_grad_()
        expected = fn(xe, target)
        report = ember.explain(fn, xc.detach(), target)
        assert report.graph_count == 1 and report.break_count == 0, str(report)
        actual = ember.compile(fn, options={"fallback": "error"})(xc, target)
        torch.testing.assert_close(actual, expected)
        weight = torch.rand(expected.shape)
        (expected * weight).sum().backward()
        (actual * weight).sum().backward()
        torch.testing.assert_close(xc.grad, xe.grad)


def test_a_created_dropout_is_in_training_mode_inside_an_eval_model():
    """A fresh module trains whatever its caller's mode: p=1 zeroes everything in eager."""
    class Model(nn.Module):
        def forward(self, x):
            return nn.Dropout(p=1.0)(x) + 1
    model = Model().eval()
    x = torch.randn(4, 3)
    report = ember.explain(model, x)        # compiled: eager would also give ones
    assert report.graph_count == 1 and report.break_count == 0, str(report)
    torch.testing.assert_close(ember.compile(model)(x), model(x))
    assert torch.equal(ember.compile(model)(x), torch.ones(4, 3))


def test_an_escaping_module_is_new_at_every_call():
    def fn(x):
        m = nn.Softmax(dim=0)
        return m(x), m
    report = ember.explain(fn, torch.randn(3))    # compiled: the epilogue makes the module
    assert report.graph_count == 1 and report.break_count == 0, str(report)
    compiled = ember.compile(fn)
    (y1, m1), (y2, m2) = compiled(torch.randn(3)), compiled(torch.randn(3))
    assert type(m1) is nn.Softmax and m1.dim == 0 and m1 is not m2
    x = torch.randn(3)
    torch.testing.assert_close(compiled(x)[0], fn(x)[0])


class UserModule(nn.Module):
    created = 0

    def __init__(self):
        super().__init__()
        UserModule.created += 1         # a side effect each eager call makes

    def forward(self, x):
        return x * 2


BREAKING = {
    "parameters": lambda x: nn.Linear(5, 5)(x),                        # random weights at every call
    "tensor_argument": lambda x: nn.CrossEntropyLoss(weight=torch.ones(5))(x, torch.zeros(6, dtype=torch.long)),
    "user_class": lambda x: UserModule()(x),
    "container": lambda x: nn.Sequential()(x),
}


@pytest.mark.parametrize("name", list(BREAKING))
def test_other_creations_break_the_graph_and_match_eager(name):
    fn = BREAKING[name]
    x = torch.randn(6, 5)
    report = ember.explain(fn, x)
    assert report.break_count >= 1, str(report)
    if name == "parameters":
        assert ember.compile(fn)(x).shape == (6, 5)
        return
    before = UserModule.created
    torch.testing.assert_close(ember.compile(fn)(x), fn(x))
    if name == "user_class":
        assert UserModule.created - before == 2       # eager and compiled each made one


def test_hugging_face_style_loss_inside_the_model_is_one_graph():
    class Head(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(8, 11)

        def forward(self, hidden, labels=None):
            logits = self.proj(hidden)
            loss = None
            if labels is not None:
                loss_fct = nn.CrossEntropyLoss()
                loss = loss_fct(logits.view(-1, 11), labels.view(-1))
            return loss, logits
    torch.manual_seed(0)
    eager, compiled_model = Head(), Head()
    compiled_model.load_state_dict(eager.state_dict())
    hidden, labels = torch.randn(2, 4, 8), torch.randint(0, 11, (2, 4))
    report = ember.explain(compiled_model, hidden, labels)
    assert report.graph_count == 1 and report.break_count == 0, str(report)
    loss_e, _ = eager(hidden, labels)
    loss_c, _ = ember.compile(compiled_model, options={"fallback": "error"})(hidden, labels)
    loss_e.backward()
    loss_c.backward()
    torch.testing.assert_close(loss_c, loss_e)
    torch.testing.assert_close(compiled_model.proj.weight.grad, eager.proj.weight.grad)


def test_super_in_a_classmethod_and_a_custom_function_apply():
    """``super().name`` inside a classmethod looks along the class's own MRO (it raised an internal
    ValueError, so a whole BLOOM forward ran eagerly); a custom autograd.Function's ``apply``
    (super().apply, a C classmethod) breaks the graph, and the results are eager's."""
    class Base:
        @classmethod
        def scale(cls):
            return 2.0

    class Derived(Base):
        @classmethod
        def scale(cls):
            return super().scale() * 3

    class Square(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        def backward(ctx, grad):
            (x,) = ctx.saved_tensors
            return grad * 2 * x

    def fn(x):
        return Square.apply(x * Derived.scale()) + 1
    x = torch.randn(5)
    xe, xc = x.clone().requires_grad_(), x.clone().requires_grad_()
    expected = fn(xe)
    actual = ember.compile(fn)(xc)
    torch.testing.assert_close(actual, expected)
    expected.sum().backward()
    actual.sum().backward()
    torch.testing.assert_close(xc.grad, xe.grad)
    report = ember.explain(lambda x: x * Derived.scale(), x)
    assert report.graph_count == 1 and report.break_count == 0, str(report)
