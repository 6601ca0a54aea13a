"""The data-generating side: the language models we train and measure, in one place.

==========  ==========================================================================================
model       a byte-level decoder-only transformer in Flax nnx, with a functional KV cache
decoding    speculative sampling (exact, and greedy) and autoregressive decoding in one jitted loop each;
            per-run statistics (accepted counts, alpha MLE, calls, SDSL FLOPs)
measure     text negative log-likelihood and the exact acceptance 1 - E[TV(p, q)] along text
train       AdamW with a warmup-stable-decay schedule, data-parallel steps over a device mesh,
            checkpoints with exact resume
corpus      the training corpus (Shakespeare and the King James Bible as bytes) and HellaSwag prompts
checkpoint  orbax checkpoints: a synchronous manager, restore the latest
==========  ==========================================================================================

Imported on demand (Flax and orbax are not needed to fit or predict).
"""
