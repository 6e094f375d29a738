"""The input side: every way images reach `model.fit`, each file one concept.

    from keras_vit import data
    train, test = data.load("cifar10", image_size=384, batch_size=512)
    train, validation = data.from_directory("photos", image_size=224, batch_size=32)  # photos/<class>/*.jpg
    model.fit(train, steps_per_epoch=..., epochs=..., validation_data=test)

- `tfds`: TensorFlow Datasets through the paper's pipeline (`load`, `dataset_info`, `dev_splits`);
- `preprocess`: the images' crop, flip, resize and scaling, in TensorFlow and in numpy;
- `stream`: the seeded plan every feed follows (which examples, which process's rows, each pass's order,
  crops and flips from (seed, pass)), so that tf.data and the TensorFlow-free `PyDataset` give the same
  batches and `skip_batches` resumes exactly;
- `folder`: a folder of one's own images scanned and split (`scan`, `ImageFolder`, `read_image`);
- `folder_feed`: a folder as batches (`from_directory`: tf.data, or a `PyDataset` without TensorFlow);
- `folder_read`: each file read checked against its scan, skipped and named when it cannot be read;
- `scan_cache`: what a scan learned of each file, kept so that the next start reads no file again;
- `shards`, `shard_feed`, `shard_writer`: WebDataset-style tar shards (`write_shards` from a folder,
  `from_shards` as batches on both paths);
- `naflex_sequence`, `naflex_plan`, `naflex_feed`: NaFlex batches (one image as patches, the buckets and
  their plan, the tf.data and `PyDataset` feeds);
- the augmentations a training recipe adds, each a file: `augment` (which a feed runs, in timm's order),
  `rand_augment`, `random_erasing`, `repeat_aug`, `mixup`.
"""

from keras_vit.data.folder import ImageFolder
from keras_vit.data.folder_feed import from_directory
from keras_vit.data.preprocess import eval_preprocess, train_preprocess
from keras_vit.data.shard_feed import from_shards
from keras_vit.data.shard_writer import write_shards
from keras_vit.data.tfds import ImageDatasetInfo, dataset_info, dev_splits, load

__all__ = ["ImageDatasetInfo", "ImageFolder", "dataset_info", "load", "from_directory", "from_shards", "write_shards",
           "dev_splits", "train_preprocess", "eval_preprocess"]
