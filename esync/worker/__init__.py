"""The worker's runtime: the training loop, one algorithm per sync mode, the KVStore layer, data,
models, timing and round logs, checkpoints, and the evaluator that scores them. MXNet lives here."""
