"""export_stablehlo (torch_pjrt/compile/export.py): torch.export programs as one StableHLO
program, run through the captured plan and compared against CPU eager: the tiny GPT and an MLP in
both weight modes (two input batches each), the description of @main's arguments and outputs
(read from the plan: params/results; Python numbers are program constants), weights replaced
per call, buffer mutations and keyword inputs, programs with large ops and many inputs (a
64-way cat, a 40-layer MLP), and what is refused (random ops, dynamic shapes, bad inputs).
weights="inline": the text holds the weights as stablehlo.constant literals (decoded back and
compared bit for bit with the weights; every dtype's literal through the runtime's parser), its
arguments are the user inputs and capture constants, and the text itself, compiled and executed
by the runtime (run_text), matches CPU eager: the tiny GPT, the MLP (f32 and bf16), int64/bool
buffers with an f16 weight, a mutated buffer that stays an argument."""
from __future__ import annotations

import copy
import re

import pytest
import torch

from torch_pjrt import _models
from torch_pjrt.compile.export import (StableHLOModule, _inline_arguments, _TextProgram,
                                       _TORCH_OF_MLIR, export_stablehlo)

MODES = ("arguments", "constants")
RTOL = ATOL = 1e-5


def close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.device.type == "tpu"
    torch.testing.assert_close(actual.cpu(), expected, rtol=RTOL, atol=ATOL)


def main_argument_types(text: str) -> list[str]:
    header = text[text.index("func.func @main("):]
    header = header[:header.index(") ->")]
    return re.findall(r"%[\w.]+: (tensor<[^>]*(?:<[^>]*>)?[^>]*>)", header)


def check_description(mod: StableHLOModule, ep, mode: str) -> None:
    """@main's arguments are described one for one, with consistent types and sources."""
    assert "func.func @main" in mod.text
    types = main_argument_types(mod.text)
    assert [i.mlir_type for i in mod.inputs] == types
    assert [i.index for i in mod.inputs] == list(range(len(types)))
    stats = mod.stats
    assert len(types) == stats["params"] + stats["scalars"]
    assert sum(i.kind == "scalar" for i in mod.inputs) == stats["scalars"]
    elem = {torch.float32: "f32", torch.int64: "i64", torch.bool: "i1"}
    targets = set(ep.state_dict) | set(ep.constants)
    for i in mod.inputs:
        if i.kind in ("parameter", "buffer", "constant", "user_input"):
            numel = 1
            for d in i.shape:
                numel *= d
            assert i.mlir_type == f"tensor<{numel}x{elem[i.dtype]}>", i
        if i.kind == "user_input":
            assert i.source == "caller" and i.target is None
        elif i.kind in ("parameter", "buffer", "constant"):
            assert i.target in targets
            assert i.source == ("module" if mode == "arguments" else "plan")
        else:
            assert i.source == "plan"
        if i.kind == "scalar":  # the recorded value, of the argument's element type
            want = {"i1": bool, "i64": int, "i32": int, "f64": float, "f32": float}
            assert type(i.value) is want[i.mlir_type[len("tensor<"):-1]], i
        else:
            assert i.value is None
        if i.aliased_result is not None:  # only the capture constants are written back
            assert i.kind == "capture_constant"
    assert mod.scalars == [i.value for i in mod.inputs if i.kind == "scalar"]
    assert len(mod.scalars) == stats["scalars"]
    results = [o.result for o in mod.outputs if o.result is not None]
    aliased = [i.aliased_result for i in mod.inputs if i.aliased_result is not None]
    assert sorted(set(results) | set(aliased)) == list(range(stats["results"]))
    assert not set(results) & set(aliased)
    placeholders = [n.name for n in mod.exported_program.graph.nodes if n.op == "placeholder"]
    named = [i.name for i in mod.inputs if i.name is not None]
    assert len(set(named)) == len(named)
    assert sorted(named + mod.unused) == sorted(placeholders)


# ---- the tiny GPT -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gpt():
    ds = _models.CharDataset(_models.zen_corpus(), block=32)
    model = _models.init_weights(_models.TinyGPT(ds.vocab, tie_head=True), seed=3).eval()
    gen = torch.Generator().manual_seed(0)
    batches = [ds.batch(4, gen)[0] for _ in range(3)]
    ep = torch.export.export(model, (batches[0],))
    return model, ep, batches, ds.vocab


@pytest.fixture(scope="module")
def gpt_exports(gpt):
    _, ep, _, _ = gpt
    return {mode: export_stablehlo(ep, weights=mode) for mode in MODES + ("inline",)}


@pytest.mark.parametrize("mode", MODES)
def test_tiny_gpt_round_trip(gpt, gpt_exports, mode):
    model, ep, batches, vocab = gpt
    mod = gpt_exports[mode]
    assert "func.func @main" in mod.text
    with torch.no_grad():
        for x in batches:  # the export's own example batch, then two others
            close(mod.run(x), model(x))
    check_description(mod, ep, mode)
    (user,) = mod.user_inputs
    assert (user.name, user.shape, user.dtype) == ("idx", (4, 32), torch.int64)
    (out,) = mod.outputs
    assert (out.kind, out.shape, out.dtype) == ("user_output", (4, 32, vocab), torch.float32)
    assert out.result is not None
    # tie_head: the exported graph reads the shared weight through one placeholder
    assert len(mod.unused) == 1


def test_tiny_gpt_text_is_the_same_in_both_modes(gpt_exports):
    a, c = gpt_exports["arguments"], gpt_exports["constants"]
    assert a.text == c.text
    assert [(i.kind, i.name) for i in a.inputs] == [(i.kind, i.name) for i in c.inputs]


def test_tiny_gpt_inputs_on_the_device(gpt, gpt_exports):
    model, _, batches, _ = gpt
    x = batches[1]
    with torch.no_grad():
        close(gpt_exports["constants"].run(x.to("tpu")), model(x))


# ---- the MLP -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mlp():
    model = _models.init_weights(_models.MLP(), seed=3).eval()
    gen = torch.Generator().manual_seed(1)
    batches = [torch.randn(8, 32, generator=gen) for _ in range(3)]
    return model, torch.export.export(model, (batches[0],)), batches


@pytest.mark.parametrize("mode", MODES)
def test_mlp_round_trip(mlp, mode):
    model, ep, batches = mlp
    mod = export_stablehlo(ep, weights=mode)
    assert "func.func @main" in mod.text
    with torch.no_grad():
        for x in batches:
            close(mod.run(x), model(x))
    check_description(mod, ep, mode)
    assert {i.target for i in mod.weight_inputs} == set(dict(model.named_parameters()))
    assert mod.unused == []
    (out,) = mod.outputs
    assert out.shape == (8, 10)


def test_arguments_mode_replaces_weights_per_call(mlp):
    model, ep, batches = mlp
    mod = export_stablehlo(ep, weights="arguments")
    other = copy.deepcopy(model)
    with torch.no_grad():
        other.net[4].bias.add_(1.0)
        other.net[0].weight.mul_(-0.5)
        replaced = {"net.4.bias": other.net[4].bias.detach(),
                    "net.0.weight": other.net[0].weight.detach().to("tpu")}
        x = batches[1]
        close(mod.run(x, weights=replaced), other(x))
        close(mod.run(x), model(x))  # the held weights are unchanged
    with pytest.raises(KeyError, match="not a weight"):
        mod.run(x, weights={"nope": torch.zeros(1)})
    with pytest.raises(ValueError, match="shape"):
        mod.run(x, weights={"net.4.bias": torch.zeros(3)})


def test_constants_mode_takes_only_user_inputs(mlp):
    model, ep, batches = mlp
    mod = export_stablehlo(ep, weights="constants")
    with pytest.raises(ValueError, match="constants"):
        mod.run(batches[0], weights={"net.4.bias": torch.zeros(10)})
    assert all(i.source != "module" for i in mod.inputs)


def test_bad_inputs_are_refused(mlp):
    _, ep, _ = mlp
    mod = export_stablehlo(ep)
    with pytest.raises(ValueError, match="shape"):
        mod.run(torch.randn(4, 32))
    with pytest.raises(ValueError, match="dtype"):
        mod.run(torch.randn(8, 32, dtype=torch.float64))
    with pytest.raises(TypeError):
        mod.run(torch.randn(8, 32), torch.randn(8, 32))
    with pytest.raises(ValueError, match="weights must be"):
        export_stablehlo(ep, weights="baked")
    with pytest.raises(ValueError, match="shape"):
        mod.run_text(torch.randn(4, 32))
    with pytest.raises(TypeError):
        mod.run_text(torch.randn(8, 32), torch.randn(8, 32))


# ---- buffers, keyword inputs, several outputs ---------------------------------------------


class Counter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("count", torch.zeros(3))
        self.lin = torch.nn.Linear(3, 3)

    def forward(self, x, *, scale):
        self.count.add_(1)
        return self.lin(x) * scale + self.count, x.sum()


@pytest.mark.parametrize("mode", MODES)
def test_buffer_mutation_and_keyword_inputs(mode):
    torch.manual_seed(0)
    model = Counter()
    scale = torch.tensor(2.0)
    ep = torch.export.export(copy.deepcopy(model), (torch.randn(2, 3),), {"scale": scale})
    mod = export_stablehlo(ep, weights=mode)
    kinds = [o.kind for o in mod.outputs]
    assert kinds == ["buffer_mutation", "user_output", "user_output"]
    assert mod.weights["count"].cpu().eq(0).all()  # the capture run does not mutate
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(2, 3, generator=gen)
            y, s = mod.run(x, scale=scale)
            ry, rs = model(x, scale=scale)
            close(y, ry)
            close(s, rs)
            close(mod.weights["count"], model.count)


# ---- scalars, large ops, many inputs ------------------------------------------------------


class Affine(torch.nn.Module):
    def forward(self, x):
        return x * 2.5 + 7


def test_scalars_are_program_constants():
    # a captured graph's Python numbers are constants of its program: the text alone holds them
    x = torch.randn(3, 4)
    mod = export_stablehlo(torch.export.export(Affine(), (x,)))
    check_description(mod, mod.exported_program, "arguments")
    assert mod.scalars == [] and not [i for i in mod.inputs if i.kind == "scalar"]
    assert "dense<2.50000000000000000e+00>" in mod.text
    assert "dense<7" in mod.text
    (user,) = mod.user_inputs
    assert user.index == 0 and user.mlir_type == "tensor<12xf32>"
    with torch.no_grad():
        close(mod.run(x), x * 2.5 + 7)


class CatMany(torch.nn.Module):
    """One cat of N tensors, each from its own user input and parameter."""

    def __init__(self, n):
        super().__init__()
        self.ps = torch.nn.ParameterList(torch.nn.Parameter(torch.randn(3)) for _ in range(n))

    def forward(self, xs):
        return torch.cat([x * p + i for i, (x, p) in enumerate(zip(xs, self.ps))])


@pytest.mark.parametrize("mode", MODES)
def test_large_op_and_many_inputs_round_trip(mode):
    # 64 operands: the most one StableHLO op is emitted with (csrc/hlo/builder.c). Storage ids
    # of six digits (as in a long-running process) make the cat's line of the recorder's
    # pending-graph text longer than its 1024-character cut, where the description used to
    # come from; it now comes from the plan.
    n = 64
    for _ in range(100_000):
        torch.empty(1, device="tpu")
    torch.manual_seed(0)
    model = CatMany(n)
    gen = torch.Generator().manual_seed(4)
    batches = [[torch.randn(3, generator=gen) for _ in range(n)] for _ in range(2)]
    ep = torch.export.export(model, (batches[0],))
    mod = export_stablehlo(ep, weights=mode)
    check_description(mod, ep, mode)
    assert mod.stats["ops"] >= 2 * n + 1
    assert len(mod.user_inputs) == n and len(mod.weight_inputs) == n
    assert {i.target for i in mod.weight_inputs} == {f"ps.{k}" for k in range(n)}
    assert mod.scalars == []  # the added i's are program constants
    (out,) = mod.outputs
    assert (out.shape, out.result) == ((3 * n,), 0)
    with torch.no_grad():
        for xs in batches:
            close(mod.run(xs), model(xs))
        if mode == "arguments":  # one weight replaced: only its slice of the output moves
            got = mod.run(batches[1], weights={"ps.57": torch.zeros(3)}).cpu()
            want = model(batches[1])
            want[3 * 57:3 * 58] = 57.0
            torch.testing.assert_close(got, want, rtol=RTOL, atol=ATOL)


def test_deep_mlp_constants_round_trip():
    """40 layers with the weights as plan constants: each of the 80 weight arguments is named
    (the plan reports constants only as constants; see the module docstring)."""
    torch.manual_seed(0)
    layers = []
    for _ in range(40):
        layers += [torch.nn.Linear(16, 16), torch.nn.Tanh()]
    model = torch.nn.Sequential(*layers).eval()
    x = torch.randn(5, 16)
    ep = torch.export.export(model, (x,))
    mod = export_stablehlo(ep, weights="constants")
    check_description(mod, ep, "constants")
    assert {i.target for i in mod.weight_inputs} == set(dict(model.named_parameters()))
    with torch.no_grad():
        for xs in (x, torch.randn(5, 16)):
            close(mod.run(xs), model(xs))


# ---- refused -------------------------------------------------------------------------------


class Dropout(torch.nn.Module):
    def forward(self, x):
        return torch.nn.functional.dropout(x, 0.5, training=True)


def test_random_ops_are_refused():
    ep = torch.export.export(Dropout(), (torch.randn(4, 4),))
    with pytest.raises(NotImplementedError, match="random ops"):
        export_stablehlo(ep)


def test_dynamic_shapes_are_refused():
    batch = torch.export.Dim("batch")
    ep = torch.export.export(torch.nn.Linear(3, 3), (torch.randn(4, 3),),
                             dynamic_shapes=({0: batch},))
    with pytest.raises(NotImplementedError, match="static-shaped"):
        export_stablehlo(ep)


def test_not_an_exported_program():
    with pytest.raises(TypeError, match="torch.export.export"):
        export_stablehlo(torch.nn.Linear(3, 3))


# ---- weights="inline": the weights inside the text ----------------------------------------

WEIGHT_KINDS = ("parameter", "buffer", "constant")
CONSTANT_LINE = re.compile(r'^  (%[\w.$-]+) = "stablehlo\.constant"\(\) \{value = dense<(.*)> : '
                           r'(tensor<[^{}]*>)\} : \(\) -> (tensor<[^{}]*>)$')


def main_argument_names(text: str) -> list[str]:
    header = text[text.index("func.func @main("):]
    header = header[:header.index(") ->")]
    return re.findall(r"(%[\w.]+): tensor<", header)


def decode_literal(literal: str, mlir_type: str) -> torch.Tensor:
    """The flat tensor a dense<...> literal of a flat tensor<NxT> (or 0-d) holds."""
    et = re.fullmatch(r"tensor<(?:\d+x)?(.*)>", mlir_type).group(1)
    dtype = _TORCH_OF_MLIR[et]
    if literal.startswith('"0x'):
        data = bytearray(bytes.fromhex(literal[3:-1]))
        return torch.frombuffer(data, dtype=torch.uint8).view(dtype)
    assert et == "i1", literal
    if literal in ("true", "false"):  # 0-d
        return torch.tensor([literal == "true"])
    items = literal.strip("[]").split(", ")
    return torch.tensor([{"true": True, "false": False}[v] for v in items])


def inlined_constants(text: str) -> dict[str, tuple[torch.Tensor, str]]:
    """The constant definitions that open @main's body: {ssa name: (value, type)} (the plan's
    own constants, after them, are scalars: dense<1> : tensor<i64>, not hex or lists)."""
    body = text[text.index("{\n", text.index("func.func @main(")) + 2:].split("\n")
    found = {}
    for line in body:
        m = CONSTANT_LINE.match(line)
        if not m or not (m.group(2).startswith(('"0x', "["))
                         or m.group(3) == "tensor<i1>" and m.group(2) in ("true", "false")):
            break
        assert m.group(3) == m.group(4), line
        found[m.group(1)] = (decode_literal(m.group(2), m.group(3)), m.group(3))
    return found


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and torch.equal(a.reshape(-1).view(torch.uint8),
                                              b.reshape(-1).view(torch.uint8))


def check_inline(mod: StableHLOModule, mutated=()) -> None:
    """The inlined text: arguments exactly the user inputs, capture constants and mutated
    buffers, each weight a constant holding its bytes, the rest of the text the plan's."""
    assert mod.weights_mode == "inline"
    assert [i.mlir_type for i in mod.inputs] == main_argument_types(mod.text)
    assert [i.index for i in mod.inputs] == list(range(len(mod.inputs)))
    for i in mod.inputs:
        if i.kind in WEIGHT_KINDS:
            assert i.kind == "buffer" and i.target in mutated and i.source == "module", i
        else:
            assert i.kind in ("user_input", "capture_constant"), i
    assert sorted(i.target for i in mod.inputs if i.kind in WEIGHT_KINDS) == sorted(mutated)
    plan_names = main_argument_names(mod.plan_text)
    plan_types = main_argument_types(mod.plan_text)
    stats = mod.stats
    assert len(plan_names) == stats["params"] + stats["scalars"]
    assert len(mod.inputs) + len(mod.inlined) == len(plan_names)
    # every weight the program reads is inlined (or a mutated buffer argument)
    weight_names = [spec.arg.name for spec in mod.exported_program.graph_signature.input_specs
                    if spec.kind.name in ("PARAMETER", "BUFFER", "CONSTANT_TENSOR")]
    assert sorted([i.name for i in mod.inlined if i.kind in WEIGHT_KINDS]
                  + [i.name for i in mod.inputs if i.kind in WEIGHT_KINDS]
                  + [n for n in mod.unused if n in weight_names]) == sorted(weight_names)
    consts = inlined_constants(mod.text)
    assert len(consts) == len(mod.inlined)
    for i in mod.inlined:
        assert i.source == "text" and i.kind in WEIGHT_KINDS + ("scalar",)
        name = plan_names[i.index]
        assert plan_types[i.index] == i.mlir_type
        value, mlir_type = consts[name]
        assert mlir_type == i.mlir_type
        if i.kind == "scalar":
            assert value.item() == i.value
        else:  # the weight's bytes, as the plan passes them
            assert same_bits(value, mod.weights[i.target].cpu()), i.target
        assert name not in main_argument_names(mod.text)
    kept = [n for k, n in enumerate(plan_names) if k not in {i.index for i in mod.inlined}]
    assert main_argument_names(mod.text) == kept
    # everything after the signature and the constants is the plan's text
    body = mod.text[mod.text.index("{\n", mod.text.index("func.func @main(")) + 2:]
    body = body.split("\n", len(consts))[-1]
    plan_body = mod.plan_text[mod.plan_text.index("{\n",
                                                  mod.plan_text.index("func.func @main(")) + 2:]
    assert body == plan_body
    assert mod.plan_text[mod.plan_text.index(") ->"):mod.plan_text.index("{\n")] == \
        mod.text[mod.text.index(") ->"):mod.text.index("{\n")]  # the same results


def test_tiny_gpt_inline(gpt, gpt_exports):
    model, ep, batches, vocab = gpt
    mod = gpt_exports["inline"]
    check_inline(mod)
    args = gpt_exports["arguments"]
    assert mod.plan_text == args.text
    (user,) = mod.user_inputs
    assert (user.index, user.name, user.shape, user.dtype) == (0, "idx", (4, 32), torch.int64)
    # besides idx, only storages the plan holds (none since fill_ stopped reading the fresh
    # storages of torch.ones/zeros, which made them constants of the plan)
    assert {i.kind for i in mod.inputs[1:]} <= {"capture_constant"}
    assert [i.aliased_result for i in mod.inputs[1:]] == [
        i.aliased_result for i in args.inputs if i.kind == "capture_constant"]
    assert [(i.target, i.mlir_type) for i in mod.inlined] == [
        (i.target, i.mlir_type) for i in args.weight_inputs]
    assert mod.unused == args.unused and mod.outputs == args.outputs
    # the tied embedding / head weight (one placeholder is read, the other unused): its literal
    # decodes to its bytes
    (emb,) = [i for i in mod.inlined if i.shape == (vocab, 64)]
    assert emb.target in ("tok.weight", "head.weight")
    name = main_argument_names(mod.plan_text)[emb.index]
    literal = re.search(re.escape(name) + r' = "stablehlo.constant"\(\) \{value = dense<"0x(\w+)">',
                        mod.text).group(1)
    assert bytes.fromhex(literal) == model.tok.weight.detach().numpy().tobytes()
    with torch.no_grad():
        for x in batches:
            want = model(x)
            got = mod.run_text(x)  # the inlined text, compiled and executed by the runtime
            assert got.device.type == "cpu"
            torch.testing.assert_close(got, want, rtol=RTOL, atol=ATOL)
            close(mod.run(x), want)  # the plan (weights as its constants)
    with pytest.raises(ValueError, match="constants"):
        mod.run(batches[0], weights={emb.target: model.tok.weight})


@pytest.mark.parametrize("mode", MODES)
def test_tiny_gpt_run_text_in_argument_modes(gpt, gpt_exports, mode):
    # run_text executes the module's own text with the held weights as its arguments
    model, _, batches, _ = gpt
    with torch.no_grad():
        torch.testing.assert_close(gpt_exports[mode].run_text(batches[2]), model(batches[2]),
                                   rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mlp_inline(mlp, dtype):
    model, _, batches = mlp
    model = copy.deepcopy(model).to(dtype)
    batches = [x.to(dtype) for x in batches]
    ep = torch.export.export(model, (batches[0],))
    mod = export_stablehlo(ep, weights="inline")
    check_inline(mod)
    assert [(i.kind, i.name, i.mlir_type) for i in mod.inputs] == [
        ("user_input", "x", "tensor<256x" + {torch.float32: "f32", torch.bfloat16: "bf16"}[dtype]
         + ">")]
    assert {i.target for i in mod.inlined} == set(dict(model.named_parameters()))
    tol = {} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 2e-2}
    with torch.no_grad():
        for x in batches:
            want = model(x)
            got = mod.run_text(x)
            assert got.dtype == dtype
            if dtype == torch.float32:
                torch.testing.assert_close(got, want, rtol=RTOL, atol=ATOL)
            else:
                torch.testing.assert_close(got, want, **tol)
            torch.testing.assert_close(got, mod.run(x).cpu(), rtol=RTOL, atol=ATOL)


def test_inline_text_is_what_runs(mlp):
    # editing one literal of the text changes what run_text computes: the weights come from
    # the text, not from the module
    model, ep, batches = mlp
    mod = export_stablehlo(ep, weights="inline")
    (bias,) = [i for i in mod.inlined if i.target == "net.4.bias"]
    name = main_argument_names(mod.plan_text)[bias.index]
    old = model.net[4].bias.detach()
    new = old + torch.arange(10.0)
    hex_old, hex_new = (t.numpy().tobytes().hex().upper() for t in (old, new))
    line = f'{name} = "stablehlo.constant"() {{value = dense<"0x{hex_old}">'
    assert mod.text.count(line) == 1
    mod.text = mod.text.replace(line, line.replace(hex_old, hex_new))
    other = copy.deepcopy(model)
    with torch.no_grad():
        other.net[4].bias.copy_(new)
        x = batches[1]
        torch.testing.assert_close(mod.run_text(x), other(x), rtol=RTOL, atol=ATOL)
        close(mod.run(x), model(x))  # the plan is unchanged


class Buffers(torch.nn.Module):
    """int64 and bool buffers (values needing all 8 bytes) and an f16 parameter."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(16, 4)
        self.register_buffer("ids", torch.tensor([3, 1, 4, 1, 5, 9, 2, 6]) + 2 ** 40)
        self.register_buffer("keep", torch.tensor([True, False, True, True, False, True, False,
                                                   True]))
        self.scale16 = torch.nn.Parameter(torch.randn(8, 4).half())

    def forward(self, x):
        e = self.emb(self.ids - 2 ** 40)
        y = torch.where(self.keep[:, None], e * x, -x)
        return y + self.scale16.float(), self.ids * 3 - 2 ** 62


def test_inline_int64_bool_f16_weights():
    torch.manual_seed(0)
    model = Buffers().eval()
    gen = torch.Generator().manual_seed(5)
    batches = [torch.randn(8, 4, generator=gen) for _ in range(2)]
    mod = export_stablehlo(torch.export.export(model, (batches[0],)), weights="inline")
    check_inline(mod)
    assert [i.kind for i in mod.inputs] == ["user_input"]
    types = {i.target: i.mlir_type for i in mod.inlined}
    assert types == {"ids": "tensor<8xi64>", "keep": "tensor<8xi1>", "emb.weight": "tensor<64xf32>",
                     "scale16": "tensor<32xf16>"}
    assert "dense<[true, false, true, true, false, true, false, true]> : tensor<8xi1>" in mod.text
    with torch.no_grad():
        for x in batches:
            y, ids = mod.run_text(x)
            ry, rids = model(x)
            torch.testing.assert_close(y, ry, rtol=RTOL, atol=ATOL)
            assert ids.dtype == torch.int64 and torch.equal(ids, rids)


def test_inline_mutated_buffer_stays_an_argument():
    torch.manual_seed(0)
    model = Counter()
    scale = torch.tensor(2.0)
    ep = torch.export.export(copy.deepcopy(model), (torch.randn(2, 3),), {"scale": scale})
    mod = export_stablehlo(ep, weights="inline")
    check_inline(mod, mutated=("count",))
    assert sorted((i.kind, i.name) for i in mod.inputs) == [
        ("buffer", "b_count"), ("user_input", "scale"), ("user_input", "x")]
    assert {i.target for i in mod.inlined} == {"lin.weight", "lin.bias"}
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for step in range(4):  # the text and the plan share the module's buffer
            x = torch.randn(2, 3, generator=gen)
            run = mod.run_text if step % 2 == 0 else mod.run
            y, s = run(x, scale=scale)
            ry, rs = model(x, scale=scale)
            torch.testing.assert_close(y.cpu(), ry, rtol=RTOL, atol=ATOL)
            torch.testing.assert_close(s.cpu(), rs, rtol=RTOL, atol=ATOL)
            torch.testing.assert_close(mod.weights["count"].cpu(), model.count)


def literal_value(dtype: torch.dtype) -> torch.Tensor:
    gen = torch.Generator().manual_seed(6)
    if dtype.is_complex:
        return torch.randn(6, generator=gen, dtype=dtype)
    if dtype.is_floating_point:
        v = torch.randn(6, generator=gen, dtype=torch.float64).to(dtype)
        v[4], v[5] = float("inf"), -0.0
        return v
    if dtype == torch.bool:
        return torch.tensor([True, False, False, True, True, False])
    info = torch.iinfo(dtype)
    return torch.tensor([info.min, info.max, 0, 1, 2, info.max // 3], dtype=dtype)


@pytest.mark.parametrize("et", list(_TORCH_OF_MLIR))
def test_dense_literals_round_trip_through_the_runtime(et):
    # every dtype's literal as the runtime's StableHLO parser reads it, 1-D and 0-d: a text
    # returning one inlined argument gives back its exact bytes
    value = literal_value(_TORCH_OF_MLIR[et])
    for v, ty in ((value, f"tensor<{value.numel()}x{et}>"), (value[1], f"tensor<{et}>")):
        text = (f"func.func @main(%v0: {ty}, %v1: tensor<2xf32>) -> ({ty}) {{\n"
                f'  "func.return"(%v0) : ({ty}) -> ()\n}}\n')
        inlined = _inline_arguments(text, {0: v})
        assert main_argument_types(inlined) == ["tensor<2xf32>"]
        (out,) = _TextProgram(inlined, torch.tpu.current_device())([torch.zeros(2)])
        assert same_bits(out, v.reshape(-1)), (ty, out, v)
        (lit,) = inlined_constants(inlined).values()
        assert same_bits(lit[0], v.reshape(-1))


def test_inline_refuses_what_it_cannot_inline():
    text = ("func.func @main(%v0: tensor<2xf32> {tf.aliasing_output = 0 : i32}) -> "
            '(tensor<2xf32>) {\n  "func.return"(%v0) : (tensor<2xf32>) -> ()\n}\n')
    with pytest.raises(RuntimeError, match="written back"):
        _inline_arguments(text, {0: torch.zeros(2)})
    with pytest.raises(RuntimeError, match="not a tensor<2xf32>"):
        _inline_arguments(text.replace(" {tf.aliasing_output = 0 : i32}", ""),
                          {0: torch.zeros(3)})


def test_complex_scalar_argument_round_trip():
    # a complex scalar with an imaginary part stays a program argument; describing it used
    # to raise SystemError (std::complex had no Python conversion in the bindings)
    class Rotate(torch.nn.Module):
        def forward(self, x):
            return x * (1 + 2j)

    x = torch.randn(5, dtype=torch.complex64, generator=torch.Generator().manual_seed(0))
    m = export_stablehlo(torch.export.export(Rotate(), (x,)))
    assert m.scalars == [1 + 2j]
    torch.testing.assert_close(m.run(x.to("tpu")).cpu(), Rotate()(x), rtol=1e-6, atol=1e-6)
