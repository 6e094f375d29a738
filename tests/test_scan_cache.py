"""The scan cache (issue 46): a second scan of a folder reads no file, a changed, added or removed file is
noticed, a damaged cache or another folder's is rebuilt with one warning; `verify="header"` reads headers only."""

import os
import shutil
import warnings

import pytest

from conftest import photo_folder
from keras_vit.data import folder as folder_module
from keras_vit.data import scan_cache
from keras_vit.data.folder import scan

pytestmark = pytest.mark.backend_independent


@pytest.fixture
def old_folder(tmp_path, monkeypatch):
    """A photo folder whose files were last modified in 2023, and a scan cache of its own."""
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "keras_home"))
    root = photo_folder(tmp_path / "photos", per_class=4)
    _age(root)
    return root


def _age(root, past=1_700_000_000):
    """Every file's modification time set to one moment of 2023 (so a rewrite of the same size and time
    is possible only in the racy window)."""
    for top, _, files in os.walk(root):
        for f in files:
            os.utime(os.path.join(top, f), (past, past))


@pytest.fixture
def probes(monkeypatch):
    """The files `probe` read, in order."""
    read = []
    real = folder_module.probe

    def counting(path, *args, **kwargs):
        read.append(os.path.basename(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(folder_module, "probe", counting)
    return read


def test_the_second_scan_reads_no_file_and_equals_the_first(old_folder, probes):
    first = scan(old_folder, seed=3)
    assert len(probes) == 12
    assert os.path.isfile(scan_cache.cache_path(old_folder, folder_module.MAX_PIXELS, "header"))
    probes.clear()
    assert scan(old_folder, seed=3) == first
    assert probes == []
    assert scan(old_folder, seed=3, cache=False) == first and len(probes) == 12


def test_changed_added_and_removed_files_are_noticed(old_folder, probes):
    scan(old_folder)
    cut = old_folder / "cat" / "cat_0.jpg"
    cut.write_bytes(cut.read_bytes()[:300])  # truncated: now unusable
    shutil.copy(old_folder / "coffee" / "coffee_0.jpg", old_folder / "coffee" / "coffee_new.jpg")
    os.remove(old_folder / "astronaut" / "astronaut_1.png")
    _age(old_folder)
    probes.clear()
    again = scan(old_folder)
    assert sorted(probes) == ["cat_0.jpg", "coffee_new.jpg"]
    assert dict(again.skipped)["cat/cat_0.jpg"].startswith("not a readable image")
    names = {r[0] for r in again.train + again.validation}
    assert "coffee/coffee_new.jpg" in names and "astronaut/astronaut_1.png" not in names
    assert again == scan(old_folder, cache=False)


def test_a_file_modified_just_before_the_scan_is_read_again(old_folder, probes):
    """Git's racy-index rule: a rewrite of the same size within the clock tick keeps size and mtime."""
    scan(old_folder)
    os.utime(old_folder / "cat" / "cat_1.png")  # modified now
    probes.clear()
    scan(old_folder)
    assert probes == ["cat_1.png"]


@pytest.mark.parametrize("damage", ["truncated", "another folder's"])
def test_a_damaged_or_foreign_cache_is_rebuilt_with_one_warning(old_folder, tmp_path, probes, damage):
    first = scan(old_folder)
    path = scan_cache.cache_path(old_folder, folder_module.MAX_PIXELS, "header")
    if damage == "truncated":
        with open(path, "r+b") as f:
            f.truncate(os.path.getsize(path) // 2)
    else:
        other = photo_folder(tmp_path / "other", per_class=2)
        _age(other)
        scan(other)
        shutil.copy(scan_cache.cache_path(other, folder_module.MAX_PIXELS, "header"), path)
    probes.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert scan(old_folder) == first
    said = [str(w.message) for w in caught if "scan cache" in str(w.message)]
    assert len(said) == 1 and path in said[0] and "rebuilt" in said[0]
    assert len(probes) == 12
    probes.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert scan(old_folder) == first
    assert probes == [] and not [w for w in caught if "scan cache" in str(w.message)]


def test_header_scan_reads_headers_only(old_folder):
    """A truncated JPEG keeps a whole header: the full check skips it, the header check cannot see it;
    the other files get the same facts either way, and the two levels keep two caches."""
    cut = old_folder / "coffee" / "coffee_0.jpg"
    cut.write_bytes(cut.read_bytes()[:-2000])
    _age(old_folder)
    full, header = scan(old_folder, verify="full"), scan(old_folder, verify="header")
    assert dict(full.skipped)["coffee/coffee_0.jpg"].startswith("not a readable image")
    assert header.skipped == ()
    assert set(full.train + full.validation) < set(header.train + header.validation)
    assert os.path.isfile(scan_cache.cache_path(old_folder, folder_module.MAX_PIXELS, "header"))
    with pytest.raises(ValueError, match="verify must be one of header, full; got 'quick'"):
        scan(old_folder, verify="quick")


def test_an_unwritable_cache_is_said_and_the_scan_goes_on(old_folder, monkeypatch):
    blocker = old_folder.parent / "not_a_folder"
    blocker.write_text("a file where the cache's folder would go")
    monkeypatch.setenv("KERAS_HOME", str(blocker))
    with pytest.warns(UserWarning, match="is not cached"):
        found = scan(old_folder)
    assert len(found.train) + len(found.validation) == 12
