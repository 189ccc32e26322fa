"""ipywidgets panels: one module per panel, each a thin view over a pure model.

Pattern (docs/widgets.md): the model is a pure function of a frozen params
dataclass (in costs.py or a technique module); the panel builds its controls,
observes their `.value`, recomputes the model and redraws a matplotlib figure
made by wmdist.plots. Tests drive a panel by setting `.value` on its controls.
"""
