"""The OpenAI Batch API's work: input files checked line by line (lines.py), files, batches
and line results in the cache's store (store.py), their API objects (objects.py), one line
through the chat pipeline at batch priority (pipeline.py) and the batches run on idle
capacity, resumed after a restart (runner.py). The routes are gateway/api/files.py and
gateway/api/batches.py."""
