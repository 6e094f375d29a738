"""timm, the peer keras-vit is timed beside: importing timm where torchvision is not installed, timm's
VisionTransformer of a keras-vit configuration, and the callable that runs a case on it (a forward
pass, or a training step with AdamW) on the same batch as keras-vit's. benchmark.py's workers and
gpu_workers.py time it; tests and other benchmarks import timm through `import_timm`."""

import contextlib
import sys

from timing import random_batch


def import_timm():
    """Imports timm; without torchvision installed, stands in an empty `torchvision` module.

    timm imports torchvision at module level in a few norm helpers that a ViT never uses; an empty
    stand-in, there while timm imports and gone after (transformers would take it for an installed
    torchvision), avoids installing torchvision (whose wheels pin another torch build).
    """
    import importlib.abc
    import importlib.machinery
    import types

    try:
        import torchvision  # noqa: F401
    except ImportError:
        class _Meta(type):
            def __getattr__(cls, name):
                if name.startswith("__"):
                    raise AttributeError(name)
                return f"{cls.__name__}.{name}"

        class _Stub(types.ModuleType):
            def __getattr__(self, name):
                if name.startswith("__"):
                    raise AttributeError(name)
                return _Meta(name, (), {"__init__": lambda self, *a, **k: None})

        class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
            def find_spec(self, fullname, path, target=None):
                if fullname == "torchvision" or fullname.startswith("torchvision."):
                    return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
                return None

            def create_module(self, spec):
                return _Stub(spec.name)

            def exec_module(self, module):
                module.__path__ = []

        finder = _Finder()
        sys.meta_path.insert(0, finder)
        try:
            import timm
        finally:  # the stand-in lives only while timm imports: transformers must not find a torchvision
            sys.meta_path.remove(finder)
            for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
                del sys.modules[name]
    import timm

    return timm


def timm_model(config):
    """timm's VisionTransformer of the same configuration (tanh-GELU, LayerNorm eps 1e-6, qkv bias)."""
    import functools

    import torch

    import_timm()
    from timm.models.vision_transformer import VisionTransformer

    if config["resnet"]:
        raise ValueError("no timm counterpart is built for hybrids here")
    return VisionTransformer(
        img_size=config["image_size"], patch_size=config["patch_size"], embed_dim=config["hidden_size"],
        depth=config["num_layers"], num_heads=config["num_heads"], mlp_ratio=config["mlp_dim"] / config["hidden_size"],
        num_classes=config["classes"], qkv_bias=True, class_token=True, global_pool="token",
        act_layer=functools.partial(torch.nn.GELU, approximate="tanh"),
        norm_layer=functools.partial(torch.nn.LayerNorm, eps=1e-6),
    )


def timm_callable(case, config):
    """A callable running timm's model for `case` (forward, or a training step), and its info."""
    import torch

    timm = import_timm()
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    torch.manual_seed(0)
    model = timm_model(config).to(device)
    x, y = random_batch(case["batch"], case["image_size"], config["classes"])
    xt = torch.from_numpy(x).permute(0, 3, 1, 2).contiguous().to(device)
    yt = torch.from_numpy(y).long().to(device)
    bf16 = case["dtype"] == "mixed_bfloat16"
    autocast = (lambda: torch.autocast(device, dtype=torch.bfloat16)) if bf16 else contextlib.nullcontext
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    fwd = torch.compile(model) if case.get("torch_compile") else model
    if case["mode"] == "train":
        model.train()
        pretrain = case.get("recipe") == "pretrain"  # as compile_for_pretraining: decay 0.1, clipping at norm 1
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1 if pretrain else 0.004)

        def fn():
            opt.zero_grad(set_to_none=True)
            with autocast():
                loss = torch.nn.functional.cross_entropy(fwd(xt), yt)
            loss.backward()
            if pretrain:
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sync()
            return loss.item()
    else:
        model.eval()

        def fn():
            with torch.inference_mode(), autocast():
                out = fwd(xt)
            sync()
            return out

    return fn, {"library": f"timm {timm.__version__}", "backend": "torch"}
