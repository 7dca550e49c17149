"""The live monitor of a run (``areal monitor``, ``areal train`` on a terminal): a state object
fed by the run's events (:mod:`.state`), a render function (:mod:`.render`), where the events come
from (:mod:`.source`) and the redraw loop (:mod:`.live`)."""
