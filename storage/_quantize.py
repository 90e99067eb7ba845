"""The default model with int8 arithmetic: its weight products rewritten for ONNX Runtime.

The packaged model stores each weight matrix as int8 plus a scale, and turns it back into float32
inside the graph (``Cast`` then ``Mul``) before every ``MatMul``. ONNX Runtime folds that into
float32 weights when it loads the model, so each text then streams 42 MB of float32 weights
through the CPU. Here each such product becomes ONNX Runtime's ``DynamicQuantizeMatMul``: the
weights stay 8-bit (10.6 MB) and the activations are quantised per call, so the products run in
8-bit integers. Measured on 2 cores: a short query 5.9 -> 3.3 ms, documents ~490 -> ~1000 per
second. The vectors are those of a slightly different model (cosine to the float32 ones ~0.99),
hence their own model id; retrieval quality is measured by ``benchmarks/``.

Every CPU must compute the exact integer products, or the vectors depend on the machine. ONNX
Runtime multiplies uint8 activations by int8 weights with its u8 x s8 kernels, which are exact
with VNNI and on ARM, but on x86 without VNNI (AVX2, AVX-512 before VNNI) add pairs of products in
16-bit registers that saturate: cosine to the exact vectors fell to 0.979 on an AVX2 machine.
There the weights are stored as uint8 around a zero point of 128 (the same numbers, shifted) and
the u8 x u8 kernels run, which widen before adding: exact, 8-12 % slower than the saturating
kernel (a short query 5.2 -> 5.6 ms). With VNNI the int8 weights stay, on the fast exact kernel.

The token and position tables (int8 too) are looked up first and their rows turned into float32
after: the same numbers, but ONNX Runtime no longer folds a 47 MB float32 table when it loads the
model (session creation 135 -> 38 ms). Nodes left without consumers go, with their weights.
"""

from __future__ import annotations

import platform
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import onnx
    from onnx import NodeProto, TensorProto

__all__ = ["int8_products", "signed_products_exact"]

_DOMAIN = "com.microsoft"
_SHIFT = 128  # int8 weights shifted into uint8 (see the module's docstring)
_X86 = {"x86_64", "amd64", "i386", "i686", "x86"}


def signed_products_exact(machine: str | None = None, cpu_flags: str | None = None) -> bool:
    """Whether ONNX Runtime's u8 x s8 products are exact here: any CPU but x86, and x86 with
    VNNI (AVX-512 VNNI with its core subsets, or AVX-VNNI), read from ``/proc/cpuinfo``. Where
    the flags cannot be read (x86 on another system) the answer is no: the unsigned kernels are
    exact everywhere, only slower."""
    if (machine if machine is not None else platform.machine()).lower() not in _X86:
        return True
    if cpu_flags is None:
        try:
            with open("/proc/cpuinfo", encoding="ascii", errors="replace") as info:
                cpu_flags = next((line for line in info if line.startswith("flags")), "")
        except OSError:
            return False
    flags = set(cpu_flags.partition(":")[2].split())
    return "avx_vnni" in flags or {"avx512_vnni", "avx512bw", "avx512dq", "avx512vl"} <= flags


def int8_products(model_path: Path, *, signed: bool) -> tuple[bytes, int]:
    """The model at ``model_path`` with every ``MatMul(x, Mul(Cast(int8 W), scale))`` whose scale
    is per column rewritten, serialised for ``onnxruntime.InferenceSession``; and how many
    products were rewritten. ``signed``: the weights stay int8 (only where
    :func:`signed_products_exact`), else they are shifted into uint8."""
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(model_path))
    graph = model.graph
    initializers = {init.name: init for init in graph.initializer}
    producer = {output: node for node in graph.node for output in node.output}
    nodes = []
    rewritten = 0
    for node in graph.node:
        found = _int8_weight(node, producer, initializers, signed=signed)
        if found is None:
            nodes.append(node)
            continue
        weight, scale = found
        name = f"{node.name or node.output[0]}_int8"
        graph.initializer.extend(
            [
                numpy_helper.from_array(weight, f"{name}_weight"),
                numpy_helper.from_array(scale, f"{name}_scale"),
                numpy_helper.from_array(
                    np.full(scale.shape, 0 if signed else _SHIFT, dtype=weight.dtype), f"{name}_zero"
                ),
            ]
        )
        nodes.append(
            helper.make_node(
                "DynamicQuantizeMatMul",
                [node.input[0], f"{name}_weight", f"{name}_scale", f"{name}_zero"],
                list(node.output),
                name=name,
                domain=_DOMAIN,
            )
        )
        rewritten += 1
    del graph.node[:]
    graph.node.extend(_rows_before_dequantising(nodes, producer, initializers))
    _prune(graph)
    if not any(opset.domain == _DOMAIN for opset in model.opset_import):
        model.opset_import.append(helper.make_opsetid(_DOMAIN, 1))
    return model.SerializeToString(), rewritten


def _rows_before_dequantising(
    nodes: list[NodeProto], producer: dict[str, NodeProto], initializers: dict[str, TensorProto]
) -> list[NodeProto]:
    """``Gather(Mul(Cast(int8 T), per-row scale), ids)`` becomes ``Mul(Cast(Gather(T, ids)),
    Gather(scale, ids))``: only the looked-up rows are dequantised, with the same arithmetic."""
    from onnx import TensorProto, helper

    out: list[NodeProto] = []
    for node in nodes:
        mul = producer.get(node.input[0]) if node.op_type == "Gather" else None
        cast = producer.get(mul.input[0]) if mul is not None and mul.op_type == "Mul" else None
        table = initializers.get(cast.input[0]) if cast is not None and cast.op_type == "Cast" else None
        scale = initializers.get(mul.input[1]) if mul is not None else None
        axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
        if (
            table is None
            or scale is None
            or axis != 0
            or table.data_type != TensorProto.INT8
            or len(table.dims) != 2
            or list(scale.dims) != [table.dims[0], 1]
        ):
            out.append(node)
            continue
        ids, name = node.input[1], node.output[0]
        out += [
            helper.make_node("Gather", [table.name, ids], [f"{name}_int8"], axis=0),
            helper.make_node("Cast", [f"{name}_int8"], [f"{name}_float"], to=TensorProto.FLOAT),
            helper.make_node("Gather", [scale.name, ids], [f"{name}_scale"], axis=0),
            helper.make_node("Mul", [f"{name}_float", f"{name}_scale"], [name]),
        ]
    return out


def _prune(graph: onnx.GraphProto) -> None:
    """Drop the nodes no output depends on, then the weights no node reads."""
    needed = {output.name for output in graph.output}
    kept: list[NodeProto] = []
    for node in reversed(graph.node):  # a graph's nodes are in dependency order
        if any(name in needed for name in node.output):
            kept.append(node)
            needed.update(node.input)
    weights = [init for init in graph.initializer if init.name in needed]
    del graph.node[:]
    graph.node.extend(reversed(kept))
    del graph.initializer[:]
    graph.initializer.extend(weights)


def _int8_weight(
    node: NodeProto, producer: dict[str, NodeProto], initializers: dict[str, TensorProto], *, signed: bool
) -> tuple[np.ndarray, np.ndarray] | None:
    """The int8 weight (shifted into uint8 unless ``signed``) and its per-column scales (1-D
    float32) when ``node`` multiplies by a dequantised int8 weight with one scale per column (or
    one in all), else ``None``."""
    import onnx
    from onnx import numpy_helper

    if node.op_type != "MatMul" or len(node.input) != 2:
        return None
    mul = producer.get(node.input[1])
    if mul is None or mul.op_type != "Mul":
        return None
    cast = producer.get(mul.input[0])
    if cast is None or cast.op_type != "Cast" or mul.input[1] not in initializers:
        return None
    weight = initializers.get(cast.input[0])
    if weight is None or weight.data_type != onnx.TensorProto.INT8 or len(weight.dims) != 2:
        return None
    scale = numpy_helper.to_array(initializers[mul.input[1]]).astype(np.float32)
    columns = int(weight.dims[1])
    if scale.size == 1:
        scale = scale.reshape(())
    elif scale.shape in ((columns,), (1, columns)):
        scale = scale.reshape(columns)
    else:
        return None
    values = numpy_helper.to_array(weight)
    return (values if signed else (values.astype(np.int16) + _SHIFT).astype(np.uint8)), scale
