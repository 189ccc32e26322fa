"""What every chapter's panel and figures share: the panel base (controls -> pure model ->
figure, "run it" with progress), controls built from knobs, a progress bar, and the per-rank
Gantt chart of spans. Imports ipywidgets and matplotlib; nothing below the chapters imports this."""
from wmdist.ui.panel import Panel
from wmdist.ui.ask import Prediction
from wmdist.ui.choose import Choice, ChoiceAnswer
from wmdist.ui.predict import Answer
from wmdist.ui.progress import Progress
from wmdist.ui.timeline import timeline_figure, timelines_figure

__all__ = ["Answer", "Choice", "ChoiceAnswer", "Panel", "Prediction", "Progress", "timeline_figure", "timelines_figure"]
