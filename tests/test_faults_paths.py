"""A place that cannot be written (issue 47 item 4): a read-only filesystem, a missing folder that cannot be made
there, a folder above the path that is a file, a folder without write permission, the path itself of the other
kind. Each is refused by name, in one line, before anything is read, trained or converted (fileio.check_writable),
through `keras-vit finetune`, `keras-vit convert`, `keras-vit predict --csv`, `keras-vit export` and `export()`,
the examples' recipe, `save_lora` and the keras-hub preset writer."""

import errno
import os
import subprocess

import pytest
from conftest import TINY

import keras_vit
from keras_vit import cli
from keras_vit.fileio import check_writable


@pytest.fixture(params=["read-only filesystem", "no write permission"])
def unwritable(request, tmp_path):
    """(a folder this process cannot write in, the reason the message gives). Root writes through any mode
    bits, so a folder of mode 0o555 stops only another user (or root without CAP_DAC_OVERRIDE); root gets a
    read-only tmpfs instead."""
    folder = tmp_path / "locked"
    folder.mkdir()
    if request.param == "read-only filesystem":
        if os.geteuid() != 0:
            pytest.skip("only root can mount a read-only filesystem here (the mode 0o555 case runs instead)")
        if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,ro", "tmpfs", str(folder)],
                          capture_output=True).returncode:
            pytest.skip("a tmpfs cannot be mounted here")
        yield folder, f"{folder} is on a read-only filesystem (mounted at {folder})"
        subprocess.run(["umount", "-l", str(folder)], capture_output=True)
        return
    folder.chmod(0o555)
    if os.access(folder, os.W_OK):  # root, whose writes mode bits do not stop (unless its capabilities are dropped)
        folder.chmod(0o755)
        pytest.skip("this process writes through mode 0o555 (root): the read-only filesystem case stands for it")
    yield folder, f"no permission to write in the folder {folder}"
    folder.chmod(0o755)


def _cases(tmp_path, unwritable_folder, why):
    """(what the run is given as its output, the words the refusal must hold) of each kind of bad place."""
    (tmp_path / "notes.txt").write_text("a file, not a folder")
    return [(unwritable_folder / "out", why),
            (unwritable_folder / "missing" / "out", why),  # the missing folder cannot be made there
            (tmp_path / "notes.txt" / "out", f"{tmp_path / 'notes.txt'} is a file, not a folder")]


def _refused(argv, capsys, *matches):
    """Runs `keras-vit ARGV`: exit status 2 and one line on stderr holding each of `matches`; returns stdout."""
    assert cli.main([str(a) for a in argv]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"keras-vit {argv[0]}: error: "), captured.err
    assert all(match in lines[0] for match in matches), lines[0]
    return captured.out


def test_finetune_refuses_an_out_it_cannot_write_before_reading_the_folder(unwritable, tmp_path, capsys):
    folder, why = unwritable
    for out, match in [*_cases(tmp_path, folder, why), (tmp_path / "notes.txt", "it is a file (expected a folder")]:
        # the images' folder does not exist: a check made later would name it instead
        said = _refused(["finetune", tmp_path / "no-photos", "--model", "ViT_Ti16", "--weights", "none",
                         "--image-size", "32", "--steps", "2", "--out", out, "--quiet"], capsys,
                        f"cannot write --out {out}: ", match)
        assert "reading" not in said and not os.path.exists(str(out) + ".lock")
    assert sorted(os.listdir(tmp_path)) == ["locked", "notes.txt"] and os.listdir(folder) == []


def test_convert_refuses_an_out_it_cannot_write_before_reading_the_source(unwritable, tmp_path, capsys):
    folder, why = unwritable
    (tmp_path / "model.keras").mkdir()
    cases = [(out.with_suffix(".keras"), match) for out, match in _cases(tmp_path, folder, why)]
    for out, match in [*cases, (tmp_path / "model.keras", "it is a folder (expected a file path)")]:
        # the source does not exist: a check made later would name it instead
        _refused(["convert", tmp_path / "absent.safetensors", out], capsys, match)
    assert os.listdir(folder) == [] and os.listdir(tmp_path / "model.keras") == []


def test_predict_refuses_a_csv_it_cannot_write_before_building_a_model(unwritable, tmp_path, capsys):
    folder, why = unwritable
    for out, match in _cases(tmp_path, folder, why):
        _refused(["predict", tmp_path / "absent.png", "--weights", tmp_path / "absent.keras", "--csv",
                  out.with_suffix(".csv")], capsys, match)
    assert os.listdir(folder) == []


def test_export_refuses_an_out_it_cannot_write_before_building_a_model(unwritable, tmp_path, capsys):
    folder, why = unwritable
    for out, match in _cases(tmp_path, folder, why):
        # the weights do not exist: a check made after building the model would name them instead
        _refused(["export", "--weights", tmp_path / "absent.keras", "--format", "onnx", "--out", out], capsys,
                 f"cannot write --out {out}: ", match)
    assert os.listdir(folder) == []
    model = keras_vit.VisionTransformer(**TINY, approximate_gelu=False)
    with pytest.raises(OSError, match="cannot write the export folder ") as refused:
        keras_vit.export.export(model, folder / "artefact", "onnx")
    assert why in str(refused.value) and os.listdir(folder) == []


def test_the_examples_recipe_refuses_an_output_dir_it_cannot_write(unwritable, tmp_path):
    from keras_vit.recipes import finetune

    folder, why = unwritable
    for out, match in _cases(tmp_path, folder, why):
        with pytest.raises(SystemExit) as refused:
            finetune.main("cifar10", ["--output-dir", str(out), "--steps", "1"])
        assert str(refused.value).startswith(f"error: cannot write --output-dir {out}: ") and match in str(refused.value)
        assert not os.path.exists(str(out) + ".lock")
    assert os.listdir(folder) == []


@pytest.mark.backend_independent
def test_save_lora_and_a_keras_hub_preset_refuse_a_place_they_cannot_write(unwritable, tmp_path):
    from keras_vit.weights.keras_hub_save import save_keras_hub_preset

    folder, why = unwritable
    model = keras_vit.VisionTransformer(**TINY, approximate_gelu=False)
    keras_vit.enable_lora(model, 2)
    for out, match in _cases(tmp_path, folder, why):
        with pytest.raises(OSError, match="cannot write ") as refused:
            keras_vit.save_lora(model, out.with_suffix(".lora"))
        assert match in str(refused.value)
        with pytest.raises(OSError, match="cannot write the keras-hub preset folder ") as refused:
            save_keras_hub_preset(keras_vit.merge_lora(model), out)
        assert match in str(refused.value)
    assert os.listdir(folder) == []


@pytest.mark.backend_independent
def test_check_writable_says_which_error_it_is(unwritable, tmp_path):
    folder, _ = unwritable
    with pytest.raises(OSError) as refused:
        check_writable(folder / "a" / "b.txt", "the report")
    assert refused.value.errno in (errno.EROFS, errno.EACCES)
    assert str(refused.value).count("cannot write the report ") == 1
    (tmp_path / "free").mkdir()
    assert check_writable(tmp_path / "free" / "new" / "x.txt") == str(tmp_path / "free" / "new" / "x.txt")
    assert not (tmp_path / "free" / "new").exists()  # a check only: nothing made
