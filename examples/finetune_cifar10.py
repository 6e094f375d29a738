#!/usr/bin/env python
"""Fine-tune a ViT on CIFAR-10 with the paper's recipe (Table 4 defaults).

    python examples/finetune_cifar10.py --model ViT_B16 --weights imagenet21k --image-size 384 \\
        --batch-size 512 --device-batch-size 32 --output-dir runs/cifar10_b16

Defaults come from keras_vit.recipes.FINETUNE_SETUPS["cifar10"]; see keras_vit/recipes/finetune.py
for the flags, the output folder and resuming. --help lists everything.
"""

from keras_vit.recipes.finetune import main

if __name__ == "__main__":
    main("cifar10")
