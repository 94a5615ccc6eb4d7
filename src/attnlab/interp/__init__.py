"""Change what the model computes and find out which parts matter.

`edits.py` (`Edit`, `Edits`: replace a traced value at a layer, head and position),
`heads.py` (head detectors), `patching.py` (activation and attribution patching), `paths.py`
(path patching), `runs.py` (the runs they share), `lens.py` (logit lens and
direct logit attribution). Each reads what `model.trace` records.
"""

from .edits import Edit, Edits, ablate

__all__ = ["Edit", "Edits", "ablate"]
