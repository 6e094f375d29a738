"""Rewrites of exported ONNX graphs: outputs named, Erfc replaced, weights folded, projections made plain MatMul."""

import numpy as np


def _fix_onnx(path, names, dimensions=None):
    """Names the graph outputs `names` (torch's and jax2onnx's exporters number them), and rewrites
    each Erfc node as 1 - Erf: ONNX has no Erfc op, and tf2onnx copies the one of TensorFlow's exact
    GELU, 0.5 x erfc(-x / sqrt 2), so onnxruntime would refuse the file. `dimensions`: None, or
    {input or output name (as named after this): a name or None for each of its dimensions}, the
    names given to those dimensions of unknown size (tf2onnx numbers them, "unk__527")."""
    import onnx

    model = onnx.load(path)
    renames = {} if {o.name for o in model.graph.output} == set(names) else \
        {o.name: name for o, name in zip(model.graph.output, names)}
    for output in model.graph.output:
        output.name = renames.get(output.name, output.name)
    named = _name_dimensions(model.graph, dimensions or {})
    nodes = []
    for node in model.graph.node:
        node.input[:] = [renames.get(i, i) for i in node.input]
        node.output[:] = [renames.get(o, o) for o in node.output]
        if node.op_type != "Erfc":
            nodes.append(node)
            continue
        one, erf = f"{node.name}/one", f"{node.name}/erf"
        model.graph.initializer.append(onnx.numpy_helper.from_array(np.ones((), np.float32), one))
        nodes.append(onnx.helper.make_node("Erf", list(node.input), [erf], name=erf))
        nodes.append(onnx.helper.make_node("Sub", [one, erf], list(node.output), name=node.name))
    if not renames and not named and len(nodes) == len(model.graph.node):
        return
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    onnx.save(model, path)


def _name_dimensions(graph, dimensions):
    """In place: each dimension of unknown size of the graph inputs and outputs in `dimensions` ({name:
    [name or None per dimension]}) takes its name; returns how many were renamed."""
    done = 0
    for value in [*graph.input, *graph.output]:
        for dim, name in zip(value.type.tensor_type.shape.dim, dimensions.get(value.name, ())):
            if name is not None and not dim.HasField("dim_value") and dim.dim_param != name:
                dim.dim_param = name
                done += 1
    return done


# weights folded into initializers up to this many elements (onnxscript's default, 8192, leaves the
# reshaped and concatenated kernels of any real ViT as nodes computed at load time)
FOLD_LIMIT = 1 << 31


def _optimize_onnx(path, served):
    """Rewrites the ONNX file at `path` into a form that runs faster, outputs unchanged.

    1. Every weight computed from constants (the q/k/v kernels concatenated at call time, the
       patch and output kernels reshaped) is folded into one initializer (`_folded`). onnxruntime
       folds them too when it loads a float file, but its int8 quantizer only quantizes a MatMul
       whose weight is an initializer: without this, the q/k/v and output projections of every
       block stayed float32.
    2. `_separate_qkv`: the attention of torch's exporter, one (D, 3D) matmul whose output is
       sliced three times, becomes three matmuls that write q, k^T and v in the layout the
       attention products read, the query scale folded into the query kernel.
    3. `_einsum_to_matmul`: jax2onnx's projections, Einsum nodes of a constant kernel
       ("btd,dnh->btnh"), become MatMul between Reshapes (onnxruntime quantizes MatMul, not
       Einsum, and runs MatMul without Einsum's own transposes).

    The rewritten file is checked against the exporter's in onnxruntime on random inputs of the kind
    `served` (a `keras_vit.export.inputs.ServedInput`) says; where they differ (beyond 1e-5) the
    exporter's file is kept and a warning logged.
    """
    import onnx

    original = onnx.load(path)
    model = _folded(original)
    separated = _separate_qkv(model.graph) + _einsum_to_matmul(model.graph)
    _remove_unused(model.graph)
    if separated:
        error = _max_difference(original, model, served)
        if error is None or error > 1e-5:
            import logging

            logging.getLogger("keras_vit").warning(
                "keras_vit.export: the rewritten projections changed the outputs (%s); "
                "keeping the exporter's graph (its weights folded)", "failed to run" if error is None else f"by {error:.1e}")
            model = _folded(original)
    onnx.save(model, path)


def _folded(model):
    """`model` (an ONNX ModelProto) after one round of onnxscript's optimizer: its constant folding with no
    size limit, its rewrite rules (a reshape's shape materialized, transposes merged) and its clean-up
    passes. The optimizer's default second round found nothing more in the exporters' graphs (a ViT-S/16
    from each backend, fixed, any size and NaFlex) and took half of its time, its rules matched against
    every node again."""
    import onnxscript.optimizer

    return onnxscript.optimizer.optimize(model, num_iterations=1, input_size_limit=FOLD_LIMIT,
                                         output_size_limit=FOLD_LIMIT)


def _consumers(graph):
    uses = {}
    for node in graph.node:
        for name in node.input:
            uses.setdefault(name, []).append(node)
    return uses


def _constant(graph, name):
    """The initializer `name` as a numpy array, or None."""
    import onnx

    for init in graph.initializer:
        if init.name == name:
            return onnx.numpy_helper.to_array(init)
    return None


def _attr(node, name, default=None):
    import onnx

    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def _separate_qkv(graph):
    """In place: each attention of the pattern torch's dynamo exporter writes for keras-vit,

        X = Reshape(MatMul(h, W) + b, [-1, T, 3, heads, head_dim])
        q, k, v = (Transpose(Gather(X, i, axis=2), [0, 2, 1, 3]) for i in 0, 1, 2)
        softmax((q * s) @ (transpose(k, -1, -2) * s)) @ v

    (k^T through Shape, Reshape, Transpose, Reshape), becomes three MatMul + Add + Reshape +
    Transpose, q already scaled (s * s folded into its kernel and bias), k transposed in one step.
    Returns how many attentions were rewritten; anything else is left as it is.
    """
    uses = _consumers(graph)
    producer = {o: n for n in graph.node for o in n.output}
    new_nodes, new_inits, rewritten = {}, [], 0
    for softmax in [n for n in graph.node if n.op_type == "Softmax" and _attr(n, "axis", -1) in (-1, 3)]:
        logits = producer.get(softmax.input[0])
        after = uses.get(softmax.output[0], [])
        if logits is None or logits.op_type != "MatMul" or len(after) != 1 or after[0].op_type != "MatMul" \
                or after[0].input[0] != softmax.output[0]:
            continue
        scaled = _scaled_qkv(graph, producer, logits, after[0])
        fused = None if scaled is None else _fused_qkv_projection(graph, producer, scaled[:3])
        if fused is None:
            continue
        # q replaces the scaled query, k^T the scaled key, v the value: the logits MatMul and the
        # weights-times-values MatMul read them directly
        targets = [(logits, 0, [0, 2, 1, 3]), (logits, 1, [0, 2, 3, 1]), (after[0], 1, [0, 2, 1, 3])]
        matmul, kernel, bias, split = fused
        new_nodes[id(matmul)] = _separated_projections(matmul, kernel, bias, split, scaled[3], targets, new_inits)
        rewritten += 1
    if rewritten:
        nodes = []
        for node in graph.node:  # the new nodes where the fused matmul was: its input is defined there
            nodes += new_nodes.get(id(node), []) + [node]
        del graph.node[:]
        graph.node.extend(nodes)
        graph.initializer.extend(new_inits)
    return rewritten


def _scalar_factor(graph, node, tensor):
    """`node` = Mul(tensor, scalar constant): the scalar, else None."""
    if node is None or node.op_type != "Mul" or tensor not in node.input:
        return None
    other = _constant(graph, node.input[1 - list(node.input).index(tensor)])
    return None if other is None or other.size != 1 else float(other.reshape(()))


def _scaled_qkv(graph, producer, logits, attend):
    """(q_t, k_t, v_t, s * s) of the attention whose logits MatMul is `logits` and whose
    weights-times-values MatMul is `attend`: the three Transposes of the heads and the product of the
    query's and the key's scales; None where the query or key side is not torch's pattern."""
    # query side: Mul(Transpose(Gather(X, 0)), s)
    q_mul = producer.get(logits.input[0])
    q_t = producer.get(q_mul.input[0]) if q_mul is not None and q_mul.op_type == "Mul" else None
    s_q = _scalar_factor(graph, q_mul, q_t.output[0]) if q_t is not None else None
    # key side: Mul(Reshape(Transpose[0,2,1](Reshape(Transpose(Gather(X, 1))))), s)
    k_mul = producer.get(logits.input[1])
    chain, node = [], producer.get(k_mul.input[0]) if k_mul is not None and k_mul.op_type == "Mul" else None
    s_k = _scalar_factor(graph, k_mul, node.output[0]) if node is not None else None
    for op in ("Reshape", "Transpose", "Reshape"):
        if node is None or node.op_type != op:
            break
        chain.append(node)
        node = producer.get(node.input[0])
    k_t = node
    v_t = producer.get(attend.input[1])
    if s_q is None or s_k is None or len(chain) != 3 or _attr(chain[1], "perm") != [0, 2, 1]:
        return None
    return q_t, k_t, v_t, s_q * s_k


def _fused_qkv_projection(graph, producer, transposes):
    """(matmul, kernel, bias, (tokens, heads, head_dim)) of the fused projection whose output the
    Transposes (q_t, k_t, v_t) gather heads 0, 1, 2 from, X = Reshape(MatMul(h, W) + b, [-1, T, 3,
    heads, head_dim]); None where the graph is not that pattern."""
    gathers = []
    for t in transposes:
        g = producer.get(t.input[0]) if t is not None and t.op_type == "Transpose" \
            and _attr(t, "perm") == [0, 2, 1, 3] else None
        index = _constant(graph, g.input[1]) if g is not None and g.op_type == "Gather" else None
        if index is None or index.size != 1 or _attr(g, "axis", 0) != 2:
            break
        gathers.append((g, int(index.reshape(()))))
    if len(gathers) != 3 or [i for _, i in gathers] != [0, 1, 2] or len({g.input[0] for g, _ in gathers}) != 1:
        return None
    reshape = producer.get(gathers[0][0].input[0])
    shape = _constant(graph, reshape.input[1]) if reshape is not None and reshape.op_type == "Reshape" else None
    add = producer.get(reshape.input[0]) if shape is not None else None
    if shape is None or shape.size != 5 or shape[2] != 3 or add is None or add.op_type != "Add":
        return None
    matmul = producer.get(add.input[0])
    bias = _constant(graph, add.input[1])
    kernel = _constant(graph, matmul.input[1]) if matmul is not None and matmul.op_type == "MatMul" else None
    tokens, heads, head_dim = int(shape[1]), int(shape[3]), int(shape[4])
    width = heads * head_dim
    if kernel is None or bias is None or kernel.ndim != 2 or kernel.shape[1] != 3 * width \
            or bias.shape != (3 * width,) or tokens <= 0:
        return None
    return matmul, kernel, bias, (tokens, heads, head_dim)


def _separated_projections(matmul, kernel, bias, split, scale, targets, new_inits):
    """The nodes of q, k^T and v computed apart from `matmul`'s input (MatMul + Add + Reshape +
    Transpose each, q's kernel and bias times `scale`); their initializers appended to `new_inits`, and
    each (reader, slot, perm) of `targets` set to read its own."""
    from onnx import helper, numpy_helper

    tokens, heads, head_dim = split
    width = heads * head_dim
    prefix = f"{matmul.name or matmul.output[0]}/separate_qkv"
    kernels = [kernel[:, :width] * np.float32(scale), kernel[:, width:2 * width], kernel[:, 2 * width:]]
    biases = [bias[:width] * np.float32(scale), bias[width:2 * width], bias[2 * width:]]
    split_shape = f"{prefix}/shape"
    new_inits.append(numpy_helper.from_array(np.array([-1, tokens, heads, head_dim], np.int64), split_shape))
    nodes = []
    for (name, w, b), (reader, slot, perm) in zip(zip("qkv", kernels, biases), targets):
        p = f"{prefix}/{name}"
        new_inits += [numpy_helper.from_array(w.astype(kernel.dtype), f"{p}/kernel"),
                      numpy_helper.from_array(b.astype(bias.dtype), f"{p}/bias")]
        nodes += [helper.make_node("MatMul", [matmul.input[0], f"{p}/kernel"], [f"{p}/matmul"], name=f"{p}/matmul"),
                  helper.make_node("Add", [f"{p}/matmul", f"{p}/bias"], [f"{p}/add"], name=f"{p}/add"),
                  helper.make_node("Reshape", [f"{p}/add", split_shape], [f"{p}/heads"], name=f"{p}/heads"),
                  helper.make_node("Transpose", [f"{p}/heads"], [f"{p}/out"], name=f"{p}/out", perm=perm)]
        reader.input[slot] = f"{p}/out"
    return nodes


def _einsum_to_matmul(graph):
    """In place: each Einsum `x . W` of a constant W whose equation contracts the trailing axes of x
    with the leading axes of W, in order ("btd,dnh->btnh", "btnh,nhd->btd"), becomes
    Reshape(x, [0, .., prod K]) @ W (prod K, prod N) -> Reshape([0, .., N...]). Returns how many."""
    from onnx import helper, numpy_helper

    done = 0
    nodes = []
    for node in graph.node:
        kernel = _constant(graph, node.input[1]) if node.op_type == "Einsum" and len(node.input) == 2 else None
        equation = _attr(node, "equation", b"")
        equation = (equation.decode() if isinstance(equation, bytes) else equation).replace(" ", "")
        if kernel is None or "..." in equation or "->" not in equation or equation.count(",") != 1:
            nodes.append(node)
            continue
        (lhs, rhs), out = equation.split("->")[0].split(","), equation.split("->")[1]
        contracted = [c for c in lhs if c not in out]
        batch = lhs[:len(lhs) - len(contracted)]
        kept = rhs[len(contracted):]
        if len(set(lhs)) != len(lhs) or len(set(rhs)) != len(rhs) or lhs[len(batch):] != "".join(contracted) \
                or rhs[:len(contracted)] != "".join(contracted) or out != batch + kept or not contracted \
                or any(c in rhs for c in batch) or kernel.ndim != len(rhs):
            nodes.append(node)
            continue
        k = int(np.prod(kernel.shape[:len(contracted)]))
        p = f"{node.name or node.output[0]}/matmul"
        graph.initializer.extend([
            numpy_helper.from_array(kernel.reshape(k, -1), f"{p}/kernel"),
            numpy_helper.from_array(np.array([0] * len(batch) + [k], np.int64), f"{p}/in_shape"),
            numpy_helper.from_array(np.array([0] * len(batch) + list(kernel.shape[len(contracted):]), np.int64),
                                    f"{p}/out_shape")])
        nodes += [helper.make_node("Reshape", [node.input[0], f"{p}/in_shape"], [f"{p}/x"], name=f"{p}/x"),
                  helper.make_node("MatMul", [f"{p}/x", f"{p}/kernel"], [f"{p}/y"], name=p),
                  helper.make_node("Reshape", [f"{p}/y", f"{p}/out_shape"], list(node.output), name=f"{p}/out")]
        done += 1
    if done:
        del graph.node[:]
        graph.node.extend(nodes)
    return done


def _remove_unused(graph):
    """Drops the nodes and initializers no graph output depends on."""
    needed = {o.name for o in graph.output}
    kept = []
    for node in reversed(graph.node):
        if any(o in needed for o in node.output):
            kept.append(node)
            needed.update(node.input)
    del graph.node[:]
    graph.node.extend(reversed(kept))
    inits = [i for i in graph.initializer if i.name in needed]
    del graph.initializer[:]
    graph.initializer.extend(inits)
    infos = [v for v in graph.value_info if v.name in needed]
    del graph.value_info[:]
    graph.value_info.extend(infos)


def _max_difference(a, b, served, batch=2):
    """Max |difference| of every float output of the ONNX models `a` and `b` (ModelProto) under
    onnxruntime on `batch` random inputs of the kind `served` (`ServedInput.random_inputs`) (integer
    outputs must be equal); None when either fails."""
    import onnxruntime as ort

    try:
        sessions = [ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]) for m in (a, b)]
        inputs = served.random_inputs(sessions[0], batch)
        outputs = [s.run(None, inputs) for s in sessions]
    except Exception:  # noqa: BLE001 - any failure keeps the exporter's file
        return None
    error = 0.0
    for x, y in zip(*outputs):
        if x.dtype.kind == "f":
            error = max(error, float(np.abs(x - y).max()))
        elif not np.array_equal(x, y):
            return float("inf")
    return error
