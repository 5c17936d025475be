"""The shard-holder role: the FAISS index shards as Ray actors (the index itself is the Ray-free ``retrieval``)."""
