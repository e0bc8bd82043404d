"""Running a model. `llama` is the only module that imports llama_cpp; on it stand the loaded
model and its cache (runtime), generation (generator), one reply start to finish (reply), and
where a model runs: CPU variants and GPU backends (backends, cpu, placement, kernels), weight
repacking (repack) and RPC workers (rpc)."""
