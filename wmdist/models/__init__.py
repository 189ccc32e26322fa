"""The world models every technique is run on, above costs/ and below the course's core.

    world.py        the tiny world model (MLP dynamics, chapters 01-03), its data, flat parameter/gradient buffers
    transformer.py  the tiny transformer world model (chapters 04-09): TransformerConfig, blocks, make_transformer

Import the module you need (`from wmdist.models.world import make_model`); this file imports neither,
so reading one model does not load the other.
"""
