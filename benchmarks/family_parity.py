"""Max abs error of keras-vit against timm and transformers on the ViT family, on this backend.

The models are the tests' (tests/test_families.py, tests/test_families_hf.py): tiny random models
of each family, every parameter moved off its initial value, written to files by the libraries
themselves, loaded with `keras_vit.from_timm` / `from_huggingface`, compared on 2 random images.

    KERAS_BACKEND=jax python benchmarks/family_parity.py    # then tensorflow, torch
"""

import os
import sys
import tempfile
from pathlib import Path

import keras
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import keras_vit  # noqa: E402
import test_families as T  # noqa: E402  timm's families, as the tests build them
import test_families_hf as H  # noqa: E402  transformers' families

torch, transformers = T.torch, H.transformers


def _err(ours, theirs):
    return float(np.abs(keras.ops.convert_to_numpy(ours) - np.asarray(theirs)).max())


def timm_rows(tmp):
    x = T._images(32, 32)
    for family in T.FAMILIES:
        ref = T._timm(family)
        path = T._file(ref, family, Path(tmp))
        with torch.no_grad():
            expected = ref(T._nchw(x)).numpy()
        yield f"timm {family}", _err(keras_vit.from_timm(path, num_heads=2, classifier_activation=None)(x), expected)
    ref = T._timm("dinov2", dynamic_img_size=True)
    path = T._file(ref, "dinov2", Path(tmp))
    x48 = T._images(48, 48)
    with torch.no_grad():
        expected = ref(T._nchw(x48)).numpy()
    model = keras_vit.from_timm(path, num_heads=2, image_size=48, include_top=False)
    yield "timm dinov2 at 48 px (32 px file)", _err(model(x48), expected)


def hf_rows(tmp):
    x = H._images()
    cases = {
        "Dinov2Model pooler": (transformers.Dinov2Model, transformers.Dinov2Config(**H.SIZE, mlp_ratio=2),
                               {"include_top": False}, "pooler_output"),
        "Dinov2WithRegistersModel pooler": (transformers.Dinov2WithRegistersModel, transformers.Dinov2WithRegistersConfig(
            **H.SIZE, mlp_ratio=2, num_register_tokens=3), {"include_top": False}, "pooler_output"),
        "CLIPVisionModelWithProjection embeds": (transformers.CLIPVisionModelWithProjection, transformers.CLIPVisionConfig(
            **H.TOWER, projection_dim=16), {"classifier_activation": None}, "image_embeds"),
        "SiglipVisionModel pooler": (transformers.SiglipVisionModel, transformers.SiglipVisionConfig(**H.TOWER),
                                     {"include_top": False}, "pooler_output"),
        "DeiTForImageClassificationWithTeacher": (transformers.DeiTForImageClassificationWithTeacher,
                                                  transformers.DeiTConfig(**H.TOWER, num_labels=5),
                                                  {"classifier_activation": None}, "logits"),
    }
    for name, (cls, config, kw, field) in cases.items():
        ref, folder = H._save(Path(tmp), cls, config)
        expected = getattr(H._theirs(ref, x), field).numpy()
        yield f"Hugging Face {name}", _err(keras_vit.from_huggingface(folder, **kw)(x), expected)


def main():
    print(f"backend {keras.backend.backend()}, timm {T.timm.__version__}, transformers {transformers.__version__}")
    with tempfile.TemporaryDirectory() as tmp:
        for name, err in (*timm_rows(tmp), *hf_rows(tmp)):
            print(f"| {name} | {err:.1e} |")


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    from keras_vit.startup import run_main

    run_main(main)
