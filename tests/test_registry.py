"""The registry of released ViT checkpoints: contents, look-ups and errors."""

import dataclasses
import re

import pytest

from keras_vit.weights import registry
from keras_vit.weights.registry import WeightsRecord, format_table, get_weights, list_weights

pytestmark = pytest.mark.backend_independent  # tables and names only

ALL_VARIANTS = (
    "ViT_Ti16", "ViT_S16", "ViT_S32", "ViT_B8", "ViT_B16", "ViT_B32", "ViT_L16", "ViT_L32",
    "ViT_H14", "R26_ViT_S32", "R26_ViT_B32", "R50_ViT_B16", "R50_ViT_L32",
)
BUCKET = "https://storage.googleapis.com/vit_models/"
FOLDER_OF_TAG = {
    "imagenet21k": "imagenet21k",
    "imagenet21k+imagenet2012": "imagenet21k+imagenet2012",
    "augreg-imagenet21k": "augreg",
    "augreg-imagenet21k+imagenet2012": "augreg",
}
AUGREG_PRETRAIN = re.compile(
    r"^(Ti|S|B|L|R26_S)_(8|16|32)-i21k-300ep-lr_0\.001-aug_(none|light[01]|medium[12]|strong[12])"
    r"-wd_0\.(03|1)-do_0\.[01]-sd_0\.[01]$"
)
AUGREG_FINETUNE = re.compile(r"^(?P<pretrain>.+)--imagenet2012-steps_20k-lr_0\.0[13]-res_(?P<res>224|384)$")
AUGREG_MODEL = {
    "ViT_Ti16": "Ti_16", "ViT_S16": "S_16", "ViT_S32": "S_32", "ViT_B8": "B_8", "ViT_B16": "B_16",
    "ViT_B32": "B_32", "ViT_L16": "L_16", "R26_ViT_S32": "R26_S_32",
}
ORIGINAL_MODEL = {
    "ViT_B8": "ViT-B_8", "ViT_B16": "ViT-B_16", "ViT_B32": "ViT-B_32", "ViT_L16": "ViT-L_16",
    "ViT_L32": "ViT-L_32", "ViT_H14": "ViT-H_14", "R26_ViT_B32": "R26+ViT-B_32",
    "R50_ViT_B16": "R50+ViT-B_16", "R50_ViT_L32": "R50+ViT-L_32",
}


def _stem(record):
    return record.url.rsplit("/", 1)[1][: -len(".npz")]


def test_every_package_variant_with_a_release_is_registered():
    assert set(registry.VARIANTS_WITH_WEIGHTS) == set(ALL_VARIANTS)
    for variant in ALL_VARIANTS:
        assert list_weights(variant), variant


def test_registry_variants_are_the_package_factories():
    import keras_vit

    assert set(registry.VARIANTS_WITH_WEIGHTS) <= set(keras_vit.VARIANTS)
    for variant in registry.VARIANTS_WITH_WEIGHTS:
        assert callable(getattr(keras_vit, variant))


def test_urls_live_in_the_bucket_folder_of_their_tag():
    for record in list_weights():
        assert record.tag in registry.TAGS
        folder = FOLDER_OF_TAG[record.tag]
        assert record.url.startswith(BUCKET + folder + "/"), record
        assert record.folder == folder
        name = record.url[len(BUCKET + folder + "/"):]
        assert "/" not in name and name.endswith(".npz") and " " not in name, record


def test_records_are_unique():
    records = list_weights()
    assert len({r.url for r in records}) == len(records)
    assert len({r.filename for r in records}) == len(records)
    assert len({(r.variant, r.tag, r.image_size) for r in records}) == len(records)


def test_records_are_frozen():
    record = list_weights()[0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.url = "https://example.com/x.npz"


def test_original_imagenet21k_release():
    records = [r for r in list_weights() if r.tag == "imagenet21k"]
    assert {r.variant for r in records} == set(ORIGINAL_MODEL)
    for r in records:
        assert _stem(r) == ORIGINAL_MODEL[r.variant]
        assert (r.image_size, r.classes, r.pre_logits, r.accuracy) == (224, 21843, True, None)


def test_original_imagenet2012_fine_tunes():
    records = [r for r in list_weights() if r.tag == "imagenet21k+imagenet2012"]
    names = sorted(_stem(r) for r in records)
    assert names == sorted(["ViT-B_16", "ViT-B_32", "ViT-B_8", "ViT-L_16", "ViT-L_32", "R50+ViT-B_16",
                            "ViT-B_16-224", "ViT-L_16-224"])
    for r in records:
        assert r.classes == 1000 and not r.pre_logits
        assert r.image_size == (224 if _stem(r).endswith("-224") else 384)
        assert _stem(r).removesuffix("-224") == ORIGINAL_MODEL[r.variant]


def test_augreg_fine_tunes_come_from_the_registered_pretraining_run():
    for variant, model in AUGREG_MODEL.items():
        pretrain = get_weights(variant, "augreg-imagenet21k")
        assert pretrain.image_size == 224 and pretrain.classes == 21843 and not pretrain.pre_logits
        assert AUGREG_PRETRAIN.match(_stem(pretrain)), _stem(pretrain)
        assert _stem(pretrain).startswith(model + "-")
        tuned = [r for r in list_weights(variant) if r.tag == "augreg-imagenet21k+imagenet2012"]
        assert tuned, variant
        for r in tuned:
            match = AUGREG_FINETUNE.match(_stem(r))
            assert match, _stem(r)
            assert match["pretrain"] == _stem(pretrain)
            assert int(match["res"]) == r.image_size
            assert r.classes == 1000 and not r.pre_logits
            assert r.filename == r.url.rsplit("/", 1)[1]  # AugReg names are kept as released


def test_known_augreg_names():
    # Names from the google-research/vision_transformer README table of recommended checkpoints.
    b16 = get_weights("ViT_B16", "augreg-imagenet21k+imagenet2012", 384)
    assert b16.url == (BUCKET + "augreg/B_16-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.0-sd_0.0"
                       "--imagenet2012-steps_20k-lr_0.03-res_384.npz")
    assert b16.accuracy.startswith("85.49%")
    ti = get_weights("ViT_Ti16", "augreg-imagenet21k")
    assert ti.url == BUCKET + "augreg/Ti_16-i21k-300ep-lr_0.001-aug_none-wd_0.03-do_0.0-sd_0.0.npz"


def test_get_weights_picks_the_file_of_the_requested_resolution():
    assert get_weights("ViT_B16", "imagenet21k+imagenet2012").url.endswith("/imagenet21k+imagenet2012/ViT-B_16.npz")
    assert get_weights("ViT_B16", "imagenet21k+imagenet2012", 384).image_size == 384
    r224 = get_weights("ViT_B16", "imagenet21k+imagenet2012", 224)
    assert r224.url.endswith("/imagenet21k+imagenet2012/ViT-B_16-224.npz") and r224.image_size == 224
    assert r224.filename == "ViT-B_16--imagenet21k+imagenet2012-224.npz"
    assert get_weights("ViT_L16", "imagenet21k+imagenet2012", 224).url.endswith("/ViT-L_16-224.npz")
    assert get_weights("ViT_S16", "augreg-imagenet21k+imagenet2012", 224).url.endswith("res_224.npz")
    assert get_weights("ViT_S16", "augreg-imagenet21k+imagenet2012").url.endswith("res_384.npz")


def test_get_weights_falls_back_to_the_default_resolution():
    default = get_weights("ViT_B16", "imagenet21k+imagenet2012")
    assert default.image_size == 384
    assert get_weights("ViT_B16", "imagenet21k+imagenet2012", 512) == default
    assert get_weights("ViT_L32", "imagenet21k+imagenet2012", 224) == get_weights("ViT_L32", "imagenet21k+imagenet2012")
    assert get_weights("ViT_B16", "imagenet21k", 384).image_size == 224  # only one file
    # every fine-tuned tag that has a 384 px file defaults to it
    for variant in registry.VARIANTS_WITH_WEIGHTS:
        for tag in ("imagenet21k+imagenet2012", "augreg-imagenet21k+imagenet2012"):
            sizes = {r.image_size for r in list_weights(variant) if r.tag == tag}
            if 384 in sizes:
                assert get_weights(variant, tag).image_size == 384


def test_filename_format_of_the_original_release():
    assert get_weights("ViT_B16", "imagenet21k+imagenet2012").filename == "ViT-B_16--imagenet21k+imagenet2012-384.npz"
    assert get_weights("ViT_B16", "imagenet21k").filename == "ViT-B_16--imagenet21k-224.npz"
    assert get_weights("R50_ViT_B16", "imagenet21k").filename == "R50+ViT-B_16--imagenet21k-224.npz"


def test_unknown_variant_raises_with_the_valid_list():
    with pytest.raises(ValueError) as info:
        get_weights("ViT_B17", "imagenet21k")
    message = str(info.value)
    assert "'ViT_B17'" in message
    for variant in ALL_VARIANTS:
        assert variant in message
    with pytest.raises(ValueError, match="ViT_X"):
        list_weights("ViT_X")


def test_unknown_tag_raises_with_the_valid_list():
    with pytest.raises(ValueError) as info:
        get_weights("ViT_B16", "jft300m")
    message = str(info.value)
    assert "'jft300m'" in message
    for tag in registry.TAGS:
        assert tag in message


def test_tag_without_a_file_for_the_variant_raises_with_its_tags():
    with pytest.raises(ValueError) as info:
        get_weights("ViT_Ti16", "imagenet21k")  # Ti/16 was only released by AugReg
    message = str(info.value)
    assert "'imagenet21k'" in message and "ViT_Ti16" in message
    assert "augreg-imagenet21k+imagenet2012" in message


def test_accuracy_only_for_imagenet1k_heads_and_always_with_a_source():
    for r in list_weights():
        if r.classes == 21843:
            assert r.accuracy is None, r
        elif r.accuracy is not None:
            assert re.match(r"^\d{2}\.\d{1,2}% \(.+\)$", r.accuracy), r.accuracy
    # the paper's Table 5 numbers for the 384 px ImageNet-21k fine-tunes
    expected = {"ViT_B16": "83.97%", "ViT_B32": "81.28%", "ViT_L16": "85.15%", "ViT_L32": "80.99%"}
    for variant, top1 in expected.items():
        accuracy = get_weights(variant, "imagenet21k+imagenet2012").accuracy
        assert accuracy.startswith(top1 + " (") and "Table 5" in accuracy


def test_list_weights_filters_by_variant_in_registry_order():
    everything = list_weights()
    assert len(everything) == len(registry._RECORDS)
    b16 = list_weights("ViT_B16")
    assert b16 == [r for r in everything if r.variant == "ViT_B16"]
    assert {r.tag for r in b16} == set(registry.TAGS)
    assert list_weights() is not list_weights()  # callers may mutate their list


def test_format_table_lists_every_record():
    table = format_table()
    lines = table.splitlines()
    assert lines[0].split()[:2] == ["variant", "tag"]
    for r in list_weights():
        assert r.url.rsplit("/", 1)[1] in table
    assert f"{len(list_weights())} checkpoints" in table
    only_h14 = format_table("ViT_H14")
    assert "ViT-H_14.npz" in only_h14 and "ViT_B16" not in only_h14


def test_record_is_a_plain_dataclass():
    fields = [f.name for f in dataclasses.fields(WeightsRecord)]
    assert fields == ["variant", "tag", "url", "image_size", "classes", "pre_logits", "accuracy"]


def test_weights_readme_table_is_current():
    import importlib.util
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("_registry_table", root / "weights" / "tools" / "registry_table.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    table = tool.markdown_table()
    assert table.count("\n") == len(list_weights()) + 2
    readme = (root / "weights" / "README.md").read_text(encoding="utf-8")
    assert table in readme, "weights/README.md is stale: run weights/tools/registry_table.py and paste its output"
    assert "## Converting a checkpoint to a Keras file" in readme
