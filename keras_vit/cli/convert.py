"""`keras-vit convert`: a timm file, a Hugging Face folder or a keras-hub preset folder of a ViT-family
image tower into a .keras file (the work is `keras_vit.convert.convert`)."""


def add_parser(sub):
    """`keras-vit convert`'s arguments, a parser of the sub-parsers `sub`."""
    p = sub.add_parser("convert", help="a timm .safetensors/.pth/.bin file, a Hugging Face folder or a keras-hub "
                       "preset folder of a ViT, DeiT, DINOv2, CLIP or SigLIP image tower -> .keras")
    p.add_argument("source", help="timm state dict file, a Hugging Face folder (config.json + model.safetensors), "
                   "a keras-hub preset folder (config.json + model.weights.h5, as save_to_preset writes it), "
                   "or a timm model name in the Hugging Face hub cache (e.g. vit_small_patch14_dinov2.lvd142m)")
    p.add_argument("out", help="output .keras file")
    p.add_argument("--model", default=None, help="variant factory name (timm files do not record the head count)")
    p.add_argument("--num-heads", type=int, default=None, help="head count of a timm file whose width is no "
                   "timm ViT's (default: the variant's, else timm's for the width)")
    p.add_argument("--image-size", type=int, nargs="+", default=None, help="input size (h [w]); default: the file's")
    p.set_defaults(func=run)


def run(args):
    """`keras-vit convert` of the parsed arguments `args`: writes the .keras file and says where."""
    from keras_vit.convert import convert

    size = args.image_size and (args.image_size[0] if len(args.image_size) == 1 else tuple(args.image_size))
    out = convert(args.source, args.out, args.model, args.num_heads, size)
    print(f"wrote {out}")
