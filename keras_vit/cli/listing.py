"""`keras-vit list`: the variant table and the registered released weights (of one variant with
--variant)."""

from keras_vit.configs import VARIANTS


def add_parser(sub):
    """`keras-vit list`'s arguments, a parser of the sub-parsers `sub`."""
    p = sub.add_parser("list", help="list the variants and the registered released weights")
    p.add_argument("--variant", default=None, help="only this variant's weights")
    p.set_defaults(func=run)


def run(args):
    """`keras-vit list` of the parsed arguments `args`: prints the variants, then the weights' table."""
    from keras_vit.weights.registry import format_table

    print("Variants (factory, official name, patch, hidden, MLP, heads, layers, ResNet stem):")
    for c in VARIANTS.values():
        stem = "-" if c.resnet is None else str(c.resnet)
        print(f"  {c.name:12s} {c.checkpoint:14s} {c.patch_size:>3d} {c.hidden_size:>5d} {c.mlp_dim:>5d} "
              f"{c.num_heads:>3d} {c.num_layers:>3d}  {stem}")
    print("\nReleased weights (weights=TAG):")
    print(format_table(args.variant))
