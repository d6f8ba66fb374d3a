"""Third-party kernels' tilings, transcribed from their public source and proven by :mod:`attnformal.tiling`.

Each module cites the repository, path and commit its arithmetic was read from, and ships the
wrong variants the prover must refute. ``EXAMPLES`` lists every shipped tiling:
``python -m attnformal.prove --kernel attnformal.tilings:EXAMPLES``.
"""

from attnformal.tilings.ascend import AscendFlashAttentionScore
from attnformal.tilings.attnformal_kernels import TorchTiled, TritonFlash
from attnformal.tilings.fa2 import FA2Forward, FA2SplitKV
from attnformal.tilings.fa3 import FA3Forward, FA3PackGQA, FA3SplitKV
from attnformal.tilings.flash_attn_triton import FlashAttnTriton, FlashAttnTritonAsBottomRight
from attnformal.tilings.triton_tutorial import TritonTutorialForward, TritonTutorialStages, TritonTutorialStages64x128

EXAMPLES = (FA2Forward, FA2SplitKV, FA3Forward, FA3SplitKV, FA3PackGQA, AscendFlashAttentionScore,
            TritonTutorialForward, TritonTutorialStages, TritonTutorialStages64x128, FlashAttnTriton,
            FlashAttnTritonAsBottomRight, TorchTiled, TritonFlash)
