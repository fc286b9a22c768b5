"""Gradient weighting for unequal shares (ThroughputSampler).

DDP averages gradients: g = (1/W) * sum_r g_r, where g_r is the mean gradient over rank r's
n_r samples. That is the full-batch gradient only when every n_r is equal. The full-batch
mean over N = sum_r n_r samples is

    g = sum_r (n_r / N) * g_r

Two ways to get it (pick one, not both):

- ``weighted_allreduce_hook``: a DDP comm hook that multiplies each gradient bucket by
  n_r / N and all-reduces with SUM (DDP divides by W only without a hook).
- ``loss_scale(sampler)``: multiply the local mean loss by n_r * W / N; DDP's average then
  gives (1/W) * sum_r (n_r * W / N) * g_r = g. Works with any DDP setup, costs nothing.

A rank whose batch is padding (``sampler.local_samples == 0``) gets weight 0 either way.
"""

import time
import warnings

import torch
import torch.distributed as dist


def loss_scale(sampler) -> float:
    """Factor for this rank's mean loss so that DDP's gradient average is the full-batch
    mean: ``local_samples * world_size / global_samples`` of the current step."""
    total = sampler.global_samples
    if total <= 0:
        raise RuntimeError("railshard.loss_scale: the sampler has no current step yet")
    return sampler.local_samples * sampler.num_replicas / total


def weighted_allreduce_hook(
    state, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: sample-count-weighted gradient sum.

    Register with the sampler as state::

        ddp.register_comm_hook(sampler, railshard.weighted_allreduce_hook)

    The all-reduce runs over ``sampler.group``, which must be the group the DDP model was
    built with (both default to the world). Annotations are exactly what DDP's hook check
    accepts, so keep them.
    """
    sampler = state
    # Read the step once: the weights of one bucket must come from one step.
    local, total = sampler.local_samples, sampler.global_samples
    if total <= 0:
        raise RuntimeError("railshard.weighted_allreduce_hook: the sampler has no current step")
    # The last bucket becomes ready when this rank's backward compute is done; the wait for
    # the others comes after. The sampler offers this time for report().
    sampler._grads_ready_at = time.perf_counter()
    _check_one_backward_per_step(sampler, bucket)

    tensor = bucket.buffer() if hasattr(bucket, "buffer") else bucket.get_tensor()
    tensor.mul_(local / total)
    work = dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=sampler.group, async_op=True)

    def _unwrap(fut: torch.futures.Future) -> torch.Tensor:
        # c10d's works complete with a list of tensors; accept a bare tensor too.
        value = fut.value()
        return value[0] if isinstance(value, (list, tuple)) else value

    return work.get_future().then(_unwrap)


def _check_one_backward_per_step(sampler, bucket) -> None:
    # Two backward passes on one step without report() between them: the loop is not
    # reporting, so the sampler cannot know which step the batch belongs to and the
    # weights may be those of an older step.
    is_last = getattr(bucket, "is_last", None)
    if is_last is None or not is_last():
        return
    step = sampler.step
    if getattr(sampler, "_hook_last_step", None) == step and not getattr(
        sampler, "_hook_warned", False
    ):
        sampler._hook_warned = True
        warnings.warn(
            "railshard.weighted_allreduce_hook: a second backward on step "
            f"{step}; call sampler.report() once per step or the gradient weights go stale"
        )
    sampler._hook_last_step = step
