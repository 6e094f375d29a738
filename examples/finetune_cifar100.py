#!/usr/bin/env python
"""Fine-tune a ViT on CIFAR-100 with the paper's recipe (Table 4 defaults).

    python examples/finetune_cifar100.py --model ViT_B16 --weights imagenet21k --image-size 384 \\
        --batch-size 512 --device-batch-size 32 --output-dir runs/cifar100_b16

Defaults come from keras_vit.recipes.FINETUNE_SETUPS["cifar100"]; see examples/_finetune.py
for the flags, the output folder and resuming. --help lists everything.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _finetune import main  # noqa: E402

if __name__ == "__main__":
    main("cifar100")
