"""torchrec's prefetch train pipeline on a CPU: the same pipeline, its prefetch stage run without streams.

torchrec 1.8's ``PrefetchTrainPipelineSparseDist`` prefetches through ``prefetch_embeddings``, which returns
at once when there is no data-dist stream (``device.type == "cpu"``), so the pipelined forward then finds no
prefetched input and asserts, for every sharded module. :class:`CpuPrefetchTrainPipelineSparseDist` is that
pipeline with the prefetch stage done on the calling thread when there are no streams: each pipelined
module's input dist is waited for, its ``prefetch()`` hook runs (for Hotline's collection: the look-ahead
fetch of the next batch's cold rows under the claim rule), and the result is handed to the next forward as
torchrec's own code does. On CUDA it is torchrec's pipeline unchanged.
"""

from __future__ import annotations

from torch.profiler import record_function
from torchrec.distributed.train_pipeline import PrefetchTrainPipelineSparseDist


class CpuPrefetchTrainPipelineSparseDist(PrefetchTrainPipelineSparseDist):
    """``PrefetchTrainPipelineSparseDist`` whose prefetch stage also runs without streams (see the module)."""

    def _prefetch(self, context) -> None:
        if self._data_dist_stream is not None:
            return super()._prefetch(context)
        context.module_input_post_prefetch.clear()
        context.module_contexts_post_prefetch.clear()
        for module in self._pipelined_modules:
            name = module.forward._name
            with record_function(f"## sharded_module_prefetch {name}: {context.index} ##"):
                dist_input = context.input_dist_tensors_requests.pop(name).wait()
                ctx = context.module_contexts[name]
                module.prefetch(ctx=ctx, dist_input=dist_input, forward_stream=None)
            context.module_input_post_prefetch[name] = dist_input
            context.module_contexts_post_prefetch[name] = context.module_contexts.pop(name)
        return None
