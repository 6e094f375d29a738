"""timm's blocks of another layout than its classic `Block` in that block's key names, which
`keras_vit.weights.timm` reads: ParallelScalingBlock (the attention and the MLP side by side, one fused input
projection) and ParallelThingsBlock (several attentions, then several MLPs, side by side)."""

import re

# timm's ParallelScalingBlock names -> a block's (its fused in_proj and mlp_bias are split by `parallel_as_block`)
_PARALLEL_NAMES = {"in_norm": "norm1", "attn_out_proj": "attn.proj", "mlp_out_proj": "mlp.fc2", "ls": "ls1",
                   "q_norm": "attn.q_norm", "k_norm": "attn.k_norm", "sub_norm": "attn.sub_norm",
                   **{f"lambda_{n}": f"attn.lambda_{n}" for n in ("q1", "k1", "q2", "k2")}}


def parallel_as_block(tensors):
    """`tensors` with timm's ParallelScalingBlock keys (`*_xp_*`, `vit_pwee_*`) as a block's: in_proj's first rows
    as the MLP's fc1 (its width the rows past q, k and v), the rest as the fused qkv, mlp_bias as fc1's bias, a fused
    out_proj (`vit_dpwee_*`) as the attention's projection (its first columns, and the bias) and fc2 (the rest), and
    the names of `_PARALLEL_NAMES`. Such a block has no norm2: how `architecture` reads it as parallel."""
    out = {}
    for key, value in tensors.items():
        part = re.fullmatch(r"(blocks\.\d+\.)(in_proj|out_proj|mlp_bias|" + "|".join(_PARALLEL_NAMES) + r")(\.\w+)?", key)
        if part is None:
            out[key] = value
            continue
        block, name, rest = part.group(1), part.group(2), part.group(3) or ""
        if name == "in_proj":
            hidden = value.shape[0] - 3 * tensors[block + "in_proj.weight"].shape[1]
            out[f"{block}mlp.fc1{rest}"], out[f"{block}attn.qkv{rest}"] = value[:hidden], value[hidden:]
        elif name == "out_proj" and rest == ".weight":  # (D, D + hidden): the attention's columns first
            out[f"{block}attn.proj.weight"], out[f"{block}mlp.fc2.weight"] = value[:, :value.shape[0]], value[:, value.shape[0]:]
        elif name == "out_proj":  # one bias for the sum of the two
            out[f"{block}attn.proj{rest}"] = value
        elif name == "mlp_bias":
            out[f"{block}mlp.fc1.bias"] = value
        else:
            out[block + _PARALLEL_NAMES[name] + rest] = value
    return out


# timm's ParallelThingsBlock branch names -> a block's (`branches_as_blocks`)
_BRANCH_NAMES = {"attns.norm": "norm1", "attns.attn": "attn", "attns.ls": "ls1", "ffns.norm": "norm2",
                 "ffns.mlp": "mlp", "ffns.ls": "ls2"}


def branches_as_blocks(tensors):
    """`tensors` with timm's ParallelThingsBlock keys (`*_18x2_*`: `blocks.N.attns.I.*`, `blocks.N.ffns.I.*`) as
    those of a block of each branch, `blocks.N.branch.I.*` (`to_official` puts them under `branch_I/`)."""
    out = {}
    for key, value in tensors.items():
        part = re.fullmatch(r"(blocks\.\d+\.)(attns|ffns)\.(\d+)\.(norm|attn|mlp|ls)(\..+)", key)
        out[key if part is None else f"{part.group(1)}branch.{part.group(3)}."
            f"{_BRANCH_NAMES[part.group(2) + '.' + part.group(4)]}{part.group(5)}"] = value
    return out


def first_branch(tensors):
    """(branches, tensors): the number of branches a block of `branches_as_blocks` has (1 for a classic block), and
    `tensors` with branch 0's keys also under the block's own names, as a classic block's are read."""
    branches = 1 + max((int(m.group(1)) for k in tensors for m in [re.match(r"blocks\.\d+\.branch\.(\d+)\.", k)] if m),
                       default=0)
    return branches, {**tensors, **{re.sub(r"^(blocks\.\d+\.)branch\.0\.", r"\1", k): v for k, v in tensors.items()}}
