"""Run by tests/test_distribute.py in a fresh process on 8 virtual CPU devices (JAX):
one device vs data parallel over 8 vs model parallel 2x4, shard shapes, ViT-H/14 bytes per
device, refusals and a backup under a distribution. Writes its measurements as JSON to argv[1]."""

import json
import math
import os
import sys

assert os.environ["KERAS_BACKEND"] == "jax" and "device_count=8" in os.environ["XLA_FLAGS"]

import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_vit  # noqa: E402
from keras_vit import distribute, recipes  # noqa: E402

CONFIG = dict(image_size=16, patch_size=8, hidden_size=32, mlp_dim=64, num_heads=4, num_layers=2, classes=8,
              classifier_activation=None, representation_size=16)
BATCH = 16
rng = np.random.default_rng(0)
X = rng.uniform(-1, 1, (4 * BATCH, 16, 16, 3)).astype("float32")
Y = rng.integers(0, 8, 4 * BATCH)
out = {}


class StepLosses(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        self.losses = []

    def on_train_batch_end(self, batch, logs=None):
        self.losses.append(float(logs["loss"]))


def train(setup, step_batch=BATCH, layer_decay=None, **options):
    """4 updates of the fine-tuning recipe (SGD, momentum, clipping) on the same global batches; `options`:
    builder arguments beside CONFIG."""
    keras.distribution.set_distribution(None)
    setup()
    keras.utils.set_random_seed(0)
    model = keras_vit.VisionTransformer(**CONFIG, **options)
    recipes.compile_for_finetuning(model, total_steps=4, base_lr=0.1, warmup_steps=1, batch_size=BATCH,
                                   device_batch_size=step_batch, layer_decay=layer_decay)
    losses = StepLosses()
    model.fit(X, Y, batch_size=step_batch, epochs=1, shuffle=False, verbose=0, callbacks=[losses])
    return model, losses.losses


def bytes_per_device(variables, distribution):
    """Bytes each device holds of `variables` under `distribution`'s layouts (no value needed)."""
    per_device = {}
    for v in variables:
        layout = v._layout if v._layout is not None else distribution.get_variable_layout(v)
        size = np.dtype(v.dtype).itemsize
        for device, index in layout.backend_layout.devices_indices_map(tuple(v.shape)).items():
            n = math.prod(len(range(*s.indices(dim))) for s, dim in zip(index, v.shape))
            per_device[str(device)] = per_device.get(str(device), 0) + n * size
    return per_device


def compare(model, reference, losses, ref_losses):
    diffs = [np.abs(a - b) for a, b in zip(model.get_weights(), reference.get_weights())]
    refs = reference.get_weights()
    return {
        "weights_allclose": all(np.allclose(a, b, rtol=1e-5, atol=1e-7)
                                for a, b in zip(model.get_weights(), refs)),
        "max_abs": max(float(d.max()) for d in diffs),
        # relative to each array's largest entry (arrays with a real scale: the key biases get no
        # gradient at all and hold rounding noise of order 1e-11)
        "max_rel": max(float(d.max() / np.abs(r).max()) for d, r in zip(diffs, refs) if np.abs(r).max() > 1e-6),
        "losses": losses,
        "loss_max_rel": float(np.max(np.abs(np.subtract(losses[-len(ref_losses):], ref_losses)) / ref_losses)),
    }


# 1. one device, data parallel over 8, model parallel 2x4, and one device accumulating 2 x 8
single, single_losses = train(lambda: None)
out["single_losses"] = single_losses
data, data_losses = train(lambda: distribute.data_parallel())
out["data"] = compare(data, single, data_losses, single_losses)
out["data"]["replicas"] = distribute.num_replicas()
accumulated, accumulated_losses = train(lambda: None, step_batch=BATCH // 2)
out["accumulated"] = compare(accumulated, single, accumulated_losses[1::2], single_losses)
model, model_losses = train(lambda: distribute.model_parallel((2, 4)))
out["model"] = compare(model, single, model_losses, single_losses)
out["model"]["replicas"] = distribute.num_replicas()

# 1b. stochastic depth: the same seed draws the same per-image masks on one device and data parallel over 8
dropped, dropped_losses = train(lambda: None, drop_path_rate=0.3)
out["drop_path_effect"] = compare(dropped, single, dropped_losses, single_losses)["max_rel"]
parallel, parallel_losses = train(distribute.data_parallel, drop_path_rate=0.3)
out["drop_path_data"] = compare(parallel, dropped, parallel_losses, dropped_losses)

# 1c. layer-wise learning-rate decay: the same trajectory on one device, data parallel and model parallel
# (model parallel last: sections 2 and 3 read its model and distribution)
decayed, decayed_losses = train(lambda: None, layer_decay=0.5)
out["decay_effect"] = compare(decayed, single, decayed_losses, single_losses)["max_rel"]
for name, setup in (("data", distribute.data_parallel), ("model", lambda: distribute.model_parallel((2, 4)))):
    parallel, parallel_losses = train(setup, layer_decay=0.5)
    out[f"decay_{name}"] = compare(parallel, decayed, parallel_losses, decayed_losses)

# 2. the model-parallel shards, read from the arrays (parameters and their SGD momentum)
dist = keras.distribution.distribution()
shards = {}
for v in [*model.trainable_variables, *model.optimizer.variables]:
    if v.path.endswith(("kernel", "kernel_momentum")) and ("Dense" in v.path or "Attention" in v.path):
        shards[v.path] = {"shape": list(v.shape),
                          "shards": sorted({tuple(s.data.shape) for s in v.value.addressable_shards}),
                          "devices": len(v.value.addressable_shards)}
out["shards"] = shards
real = {}
for v in [*model.variables, *model.optimizer.variables]:
    for s in v.value.addressable_shards:
        real[str(s.device)] = real.get(str(s.device), 0) + s.data.nbytes
out["tiny_real_bytes"] = real
out["tiny_layout_bytes"] = bytes_per_device([*model.variables, *model.optimizer.variables], dist)

# 3. a backup written under model parallel resumes into a fresh model-parallel model
backup = recipes.TrainingBackup(sys.argv[2], delete_on_end=False)
backup.set_model(model)
backup.on_epoch_end(0, {"loss": 1.0})
keras.utils.set_random_seed(1)
resumed = keras_vit.VisionTransformer(**CONFIG)
recipes.compile_for_finetuning(resumed, total_steps=4, base_lr=0.1, warmup_steps=1, batch_size=BATCH)
out["backup_done"] = backup.restore(resumed)
out["backup_equal"] = all(np.array_equal(a, b) for a, b in zip(resumed.get_weights(), model.get_weights()))
out["backup_sharded"] = str(resumed.get_layer("encoderblock_0").mlp_0.kernel.value.sharding.spec)

# 4. refusals, before anything is compiled
errors = {}
for name, make in {
    "mesh": lambda: distribute.model_parallel((3, 2)),
    "heads": lambda: keras_vit.VisionTransformer(**{**CONFIG, "num_heads": 2, "mlp_dim": 64}),
    "mlp": lambda: keras_vit.VisionTransformer(**{**CONFIG, "mlp_dim": 66}),
    "batch": lambda: distribute.check_batch_size(15),
}.items():
    keras.distribution.set_distribution(None)
    distribute.model_parallel((2, 4))
    try:
        make()
        errors[name] = None
    except ValueError as e:
        errors[name] = str(e)
out["errors"] = errors

# 5. ViT-H/14 under 2x4 with AdamW: the variables are declared in a stateless scope and never
# allocated; their layouts are the ones ModelParallel gives them, their shards jax's for that layout
keras.distribution.set_distribution(None)
distribute.model_parallel((2, 4))
optimizer = keras.optimizers.AdamW()
with keras.StatelessScope(initialize_variables=False):
    vit_h = keras_vit.ViT_H14(image_size=224, classes=1000)
    for v in vit_h.variables:
        v._initialize_layout()
    optimizer.build(vit_h.trainable_variables)
    state = [*vit_h.variables, *optimizer.variables]
    out["h14_params"] = int(sum(math.prod(v.shape) for v in vit_h.variables))
    out["h14_total_bytes"] = int(sum(math.prod(v.shape) * np.dtype(v.dtype).itemsize for v in state))
    out["h14_per_device"] = bytes_per_device(state, keras.distribution.distribution())

# 6. every variant (token and gap, pre-logits, hybrids) under the layout, declared only: which
# parameters end up split over the model axis
keras.distribution.set_distribution(None)
out["variants"] = {}
for name, config in keras_vit.VARIANTS.items():
    heads = keras_vit.get_variant(name).num_heads
    split = math.gcd(heads, 8)
    keras.distribution.set_distribution(None)
    distribute.model_parallel((8 // split, split))
    for classifier in ("token", "gap"):
        with keras.StatelessScope(initialize_variables=False):
            vit = getattr(keras_vit, name)(classifier=classifier, representation_size=64, classes=1000)
            layouts = {v.path: keras.distribution.distribution().get_variable_layout(v).axes for v in vit.variables}
        out["variants"][f"{name}/{classifier}"] = {
            "model_axis": split,
            "split": sorted(p for p, axes in layouts.items() if "model" in axes),
            "replicated": sorted(p for p, axes in layouts.items() if "model" not in axes),
            "split_params": int(sum(math.prod(v.shape) for v in vit.variables if "model" in layouts[v.path])),
            "params": int(sum(math.prod(v.shape) for v in vit.variables)),
        }

# 7. the ViT family's options at ViT-S/16's size under the same layout
keras.distribution.set_distribution(None)
distribute.model_parallel((4, 2))
out["families"] = {}
for name, family in {"deit_registers_clip": dict(distillation_token=True, num_register_tokens=4, layer_scale=1e-5,
                                                 prefix_position_embedding=False, pre_norm=True),
                     "siglip": dict(classifier="map", fc_norm=True)}.items():
    with keras.StatelessScope(initialize_variables=False):
        vit = keras_vit.VisionTransformer(**keras_vit.get_variant("ViT_S16").build_args(), classes=1000, **family)
        layouts = {v.path: keras.distribution.distribution().get_variable_layout(v).axes for v in vit.variables}
    out["families"][name] = {"split": sorted(p for p, axes in layouts.items() if "model" in axes),
                             "replicated": sorted(p for p, axes in layouts.items() if "model" not in axes)}

json.dump(out, open(sys.argv[1], "w"), indent=1)
