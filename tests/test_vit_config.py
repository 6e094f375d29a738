"""The builder's validated configuration: build_vit's options one for one, checked when made."""

import dataclasses
import inspect

import pytest

from conftest import TINY
from keras_vit.model import build_vit
from keras_vit.vit_config import ViTConfig

pytestmark = pytest.mark.backend_independent


def test_the_config_holds_every_option_of_the_builder_with_its_default():
    builder = [p for p in inspect.signature(build_vit).parameters.values() if p.name not in ("input_tensor", "name")]
    fields = dataclasses.fields(ViTConfig)
    assert [f.name for f in fields] == [p.name for p in builder]
    assert [f.default for f in fields] == [p.default for p in builder]


def test_the_config_is_frozen_and_derives_the_token_layout():
    config = ViTConfig(**TINY, distillation_token=True, num_register_tokens=4)
    assert (config.cls_tokens, config.num_prefix_tokens, config.position_prefix_tokens, config.stride) == (2, 6, 2, 8)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.classes = 3
    gap = ViTConfig(**TINY, classifier="gap", prefix_position_embedding=False, num_register_tokens=1)
    assert (gap.cls_tokens, gap.num_prefix_tokens, gap.position_prefix_tokens) == (0, 1, 0)
    hybrid = ViTConfig(**dict(TINY, patch_size=1), resnet={"num_layers": (3, 4, 9), "width_factor": 1})
    assert hybrid.stride == 16


@pytest.mark.parametrize("bad, match", [
    ({"classifier": "x"}, "unknown classifier 'x'"),
    ({"num_heads": 3}, "hidden_size 32 is not divisible by num_heads 3"),
    ({"pooling": None}, "pooling=None is for include_top=False"),
    ({"num_register_tokens": 2, "position_placement": "every_layer"}, "num_register_tokens=2 does not lay out"),
    ({"input_mode": "clip"}, "input_mode 'clip' must be one of"),
    ({"position_embedding": "x", "classifier": "y"}, "unknown position_embedding 'x'"),  # the builder's order
])
def test_a_bad_option_is_refused_when_the_config_is_made_as_by_the_builder(bad, match):
    with pytest.raises(ValueError, match=match):
        ViTConfig(**{**TINY, **bad})
    with pytest.raises(ValueError, match=match):
        build_vit(**{**TINY, **bad})


def test_only_learned_1d_positions_added_once_take_any_size():
    ViTConfig(**TINY).check_any_size()
    for bad in ({"position_embedding": "learned_2d"}, {"position_placement": "every_layer_shared"}):
        with pytest.raises(ValueError, match="a model of runtime resolution"):
            ViTConfig(**{**TINY, **bad}).check_any_size()
