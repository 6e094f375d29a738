"""examples/ablations.py --quick end to end on the current backend, then its refusal to overwrite the results.
Its `main` runs in this process: the script's own process would only import what this one has (a start of
Keras, its backend and TensorFlow: seconds of CPU), and the refusal is the script's, not the interpreter's."""

import importlib
import json
import pathlib

import pytest
from conftest import backend

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.one_backend
def test_ablations_quick_writes_the_tables(tmp_path, monkeypatch):
    out = tmp_path / "ablations"
    monkeypatch.syspath_prepend(str(ROOT / "examples"))  # as `python examples/ablations.py` has it: _digits beside it
    ablations = importlib.import_module("ablations")
    returned = ablations.main(["--quick", "--out", str(out)])
    results = json.loads((out / "results.json").read_text())
    assert results == json.loads(json.dumps(returned))
    assert results["backend"] == backend() and results["quick"]
    position = results["summary"]["position"]
    assert set(position) == {"none/once", "learned_1d/once", "learned_2d/once", "relative/once",
                             "learned_1d/every_layer_shared", "learned_2d/every_layer_shared"}
    # the variants differ in parameters as D.4 implies: 2-D tables are smaller than 1-D, relative larger
    params = {k: v["params"] for k, v in position.items()}
    assert params["none/once"] < params["learned_2d/once"] < params["learned_1d/once"] < params["relative/once"]
    assert params["learned_1d/every_layer_shared"] == params["learned_1d/once"]
    for section in (position, results["summary"]["classifier"]):
        for value in section.values():
            assert 0.0 <= value["test_accuracy"][0] <= 1.0
    ssl = results["summary"]["ssl"]
    # 10% of each class of the 1347 training digits are labelled for fine-tuning
    assert 125 <= ssl["labelled_images"] <= 145
    assert 0.0 <= ssl["masked_accuracy"][0] <= 1.0
    table = (out / "table.md").read_text()
    assert "| No Pos. Emb. |" in table and "N/A" in table and "masked patch prediction" in table
    assert (out / "ablations.png").stat().st_size > 10_000
    assert (out / "ssl_encoder_seed0.npz").exists()
    # a second run refuses to overwrite without --overwrite (before it trains)
    with pytest.raises(SystemExit, match="already holds ablation results; pass --overwrite"):
        ablations.main(["--quick", "--out", str(out)])
