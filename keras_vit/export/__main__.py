"""`python -m keras_vit.export`: the fresh process that writes an artefact from a saved model (see `_main`)."""

from keras_vit.export.through_tensorflow import _main

if __name__ == "__main__":  # importing this module (as the import checks do) runs nothing
    _main()
