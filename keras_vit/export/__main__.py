"""`python -m keras_vit.export`: the fresh process that writes an artefact from a saved model (see `_main`)."""

from keras_vit.export import _main

_main()
