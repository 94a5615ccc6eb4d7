"""Test-wide settings.

One torch thread: the models in these tests are tiny, where a second thread only adds
synchronisation (several times slower on a busy 2-core machine) and run-to-run noise.
"""

import torch

torch.set_num_threads(1)
