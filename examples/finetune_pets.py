#!/usr/bin/env python
"""Fine-tune a ViT on Oxford-IIIT Pets with the paper's recipe (Table 4 defaults).

    python examples/finetune_pets.py --model ViT_B16 --weights imagenet21k --image-size 384 \\
        --batch-size 512 --device-batch-size 32 --output-dir runs/pets_b16

Defaults come from keras_vit.recipes.FINETUNE_SETUPS["oxford_iiit_pet"]; see examples/_finetune.py
for the flags, the output folder and resuming. --help lists everything.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _finetune import main  # noqa: E402

if __name__ == "__main__":
    main("oxford_iiit_pet")
