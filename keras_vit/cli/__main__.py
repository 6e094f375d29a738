"""`python -m keras_vit.cli ARGV`: the `keras-vit` command (`keras_vit.cli.main`), its exit status the
process's."""

import sys

from keras_vit.cli import main

if __name__ == "__main__":  # importing this module (as the import checks do) runs nothing
    sys.exit(main())
