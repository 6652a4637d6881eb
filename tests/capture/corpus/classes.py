"""User classes: methods, properties, classmethods, staticmethods, dataclasses, inheritance and super(),
operator overloading, __call__, objects in and out, objects mutated."""
import dataclasses

import torch

from . import call, program, randn


class Affine:
    def __init__(self, scale, shift):
        self.scale = scale
        self.shift = shift

    def __call__(self, x):
        return x * self.scale + self.shift

    @property
    def inverse_scale(self):
        return 1.0 / self.scale

    @classmethod
    def identity(cls):
        return cls(1.0, 0.0)

    @staticmethod
    def clamp(x):
        return x.clamp(-1, 1)


@program(call(randn(3), 2.0), call(randn(3), -1.0), call(randn(5), 0.5), graphs=1, breaks=0)
def methods_property_classmethod_staticmethod(x, s):
    a = Affine(s, 1.0)
    b = Affine.identity()
    return Affine.clamp(a(x)) * a.inverse_scale + b(x), a.scale


@dataclasses.dataclass
class Stats:
    mean: torch.Tensor
    std: torch.Tensor
    count: int = 0
    tags: list = dataclasses.field(default_factory=list)


@program(call(randn(4, 3)), call(randn(2, 3)), call(randn(6, 2)), graphs=1, breaks=0)
def dataclass_built_and_returned(x):
    stats = Stats(x.mean(0), x.std(0), count=x.shape[0])
    stats.tags.append("rows")
    normalized = (x - stats.mean) / (stats.std + 1e-5)
    return stats, normalized


@program(call(Stats(randn(3), randn(3).abs(), 2)), call(Stats(randn(2), randn(2).abs(), 0, ["a"])),
         call(Stats(randn(1), randn(1).abs(), 5)), graphs=1, breaks=0)
def dataclass_input_mutated(stats):
    stats.count += 1
    stats.tags.append(stats.count)
    stats.mean = stats.mean * 2
    stats.std.add_(1)
    return dataclasses.replace(stats, count=0).count, stats.mean.sum()


class Base:
    factor = 2

    def __init__(self, x):
        self.x = x

    def forward(self):
        return self.x * self.factor

    def describe(self):
        return type(self).__name__


class Child(Base):
    factor = 3

    def __init__(self, x, bias):
        super().__init__(x)
        self.bias = bias

    def forward(self):
        return super().forward() + self.bias


@program(call(randn(3), True), call(randn(3), False), call(randn(2), True), graphs=1, breaks=0)
def inheritance_and_super(x, child):
    obj = Child(x, 1.0) if child else Base(x)
    return obj.forward(), obj.describe(), isinstance(obj, Base), type(obj) is Child


class Vec:
    def __init__(self, data):
        self.data = data

    def __add__(self, other):
        return Vec(self.data + (other.data if isinstance(other, Vec) else other))

    def __radd__(self, other):
        return self + other

    def __mul__(self, k):
        return Vec(self.data * k)

    def __neg__(self):
        return Vec(-self.data)

    def __matmul__(self, other):
        return (self.data * other.data).sum()

    def __len__(self):
        return self.data.shape[0]

    def __getitem__(self, i):
        return self.data[i]

    def __eq__(self, other):
        return isinstance(other, Vec) and self.data.shape == other.data.shape


@program(call(randn(3), randn(3)), call(randn(4), randn(4)), call(randn(2), randn(2)), graphs=1, breaks=0)
def operator_overloading(a, b):
    u, v = Vec(a), Vec(b)
    w = -(u + v) * 2 + 1.0
    w = 3 + w
    return w.data, u @ v, len(w), w[0], u == v


class Money:
    def __init__(self, amount):
        self.amount = amount

    def __add__(self, other):
        if isinstance(other, Money):
            return Money(self.amount + other.amount)
        return NotImplemented

    def __radd__(self, other):
        return Money(self.amount + other) if other == 0 else NotImplemented

    def __iadd__(self, other):
        self.amount = self.amount + (other.amount if isinstance(other, Money) else other)
        return self

    def __lt__(self, other):
        return self.amount.sum() < other.amount.sum() if isinstance(other, Money) else NotImplemented

    def __abs__(self):
        return Money(self.amount.abs())

    def __invert__(self):
        return "inverted"


class Euro(Money):
    def __radd__(self, other):  # a subclass overriding the reflected method: tried before Money.__add__
        return Euro(self.amount * 10 + (other.amount if isinstance(other, Money) else other))

    def __gt__(self, other):
        return "Euro.__gt__"


@dataclasses.dataclass
class Pair:
    first: int
    second: int


@dataclasses.dataclass
class OtherPair:
    first: int
    second: int


@program(call(randn(3), randn(3)), call(randn(2), randn(2)), call(randn(4), randn(4)), graphs=1, breaks=0)
def operator_protocol_reflected_inplace_compare(a, b):
    m, e = Money(a), Euro(b)
    total = sum([m, Money(b)])            # 0 + m: int gives NotImplemented, Money.__radd__ runs
    mixed = m + e                         # Euro overrides __radd__: it runs first
    acc = Money(a)
    alias = acc
    acc += 1.0                            # __iadd__ mutates in place: alias sees it
    flags = (m < Money(a * 2), e < m, m == m, m != Money(a), Pair(1, 2) == Pair(1, 2), Pair(1, 2) != Pair(2, 1),
             (1, m) == (1, m), [m] == [Money(a)], {"k": m} == {"k": m}, Pair(1, 2) == OtherPair(1, 2),
             Pair(1, 2).__class__ is Pair)
    return total.amount, type(mixed).__name__, mixed.amount, alias.amount, flags, abs(m).amount, ~m


class Accumulator:
    def __init__(self):
        self.total = None
        self.steps = 0

    def add(self, t):
        self.total = t if self.total is None else self.total + t
        self.steps += 1
        return self


@program(call(randn(3), 3), call(randn(3), 1), call(randn(2), 4), graphs=1, breaks=0)
def object_returned_with_state(x, n):
    acc = Accumulator()
    for i in range(n):
        acc.add(x * i)
    return acc


class Holder:
    def __init__(self, value, history):
        self.value = value
        self.history = history


@program(call(Holder(randn(3), [])), call(Holder(randn(3), [1])), call(Holder(randn(4), [])), graphs=1, breaks=0)
def object_input_attributes_mutated(holder):
    holder.history.append(len(holder.history))
    old = holder.value
    holder.value = old * 2
    holder.extra = old.sum()
    return old + 1


class Shape:
    sides = 0

    def area(self, x):
        raise NotImplementedError

    def __repr__(self):
        return f"{type(self).__name__}({self.sides})"


class Square(Shape):
    sides = 4

    def area(self, x):
        return x * x


class Triangle(Shape):
    sides = 3

    def area(self, x):
        return x * x * 0.5


@program(call(randn(3), "square"), call(randn(3), "triangle"), call(randn(2), "square"), graphs=1, breaks=0)
def polymorphic_dispatch(x, kind):
    shape = {"square": Square, "triangle": Triangle}[kind]()
    return shape.area(x), shape.sides, repr(shape), getattr(shape, "missing", None)


class Label:
    def __init__(self, name, size):
        self.name = name
        self.size = size

    def __repr__(self):
        return f"Label({self.name!r}, {self.size})"

    def __str__(self):
        return f"{self.name}[{self.size}]"


class Tag(Label):
    __str__ = object.__str__  # falls back to __repr__, as object.__str__ does

    def __format__(self, spec):
        return f"<{self.name}:{spec or 'plain'}>"


@program(call(randn(3), "w"), call(randn(5), "bias"), call(randn(1), "x"), graphs=1, breaks=0)
def str_repr_format_of_user_objects(x, name):
    label, tag = Label(name, x.shape[0]), Tag(name, x.dim())
    text = f"{label} {label!r} {label!s:>12} {tag} {tag:wide} {tag!s} {tag!r:.6}"
    return x * len(text), text, str(label), repr(tag), str(tag), format(tag, "z"), format(label, ""), [str(1.5)]


class Config:
    def __init__(self, **values):
        for key, value in values.items():
            setattr(self, key, value)

    def get(self, key, default=None):
        return getattr(self, key, default)


@program(call(randn(3), {"scale": 2.0, "act": "relu"}), call(randn(3), {"act": "gelu"}),
         call(randn(4), {"scale": 0.5}), graphs=1, breaks=0)
def config_object_with_setattr_getattr(x, options):
    cfg = Config(**options)
    out = x * cfg.get("scale", 1.0)
    act = cfg.get("act", "none")
    if act == "relu":
        out = torch.relu(out)
    elif act == "gelu":
        out = torch.nn.functional.gelu(out)
    return out, hasattr(cfg, "scale"), vars(cfg)


@dataclasses.dataclass
class Point:
    x: torch.Tensor
    y: int = 0


@program(call(randn(3), 2), call(randn(2), 0), call(randn(4), -1), graphs=1, breaks=0)
def vars_of_objects_read_and_written(x, k):
    cfg = Config(scale=k, name="c")
    attrs = vars(cfg)
    attrs["shift"] = 1.0                  # the object's own __dict__: the write shows as an attribute
    cfg.extra = k * 2                     # and an attribute set later shows in the dict
    point = Point(x, k)
    fields = vars(point)
    fields["y"] = fields["y"] + 1
    return x * cfg.scale + cfg.shift, sorted(attrs), attrs["extra"], point.y, point.x is fields["x"], len(fields)


@dataclasses.dataclass
class Batch:
    data: torch.Tensor
    notes: list = dataclasses.field(default_factory=list)
    meta: dict = dataclasses.field(default_factory=lambda: {"seen": 0})


@program(call(randn(3)), call(randn(2)), call(randn(4)), graphs=1, breaks=0)
def dataclass_default_factories_are_fresh_per_instance(x):
    first, second = Batch(x), Batch(x * 2, ["given"])
    third = Batch(x + 1)
    first.notes.append("a")
    first.meta["seen"] += 1
    return first, second, third.notes, third.meta, first.notes is third.notes
