"""matplotlib figures from formulas and Reports: functions returning a Figure, no widgets."""
